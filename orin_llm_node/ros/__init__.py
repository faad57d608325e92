# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The ROS 2 layer: the ``orin_llm`` node, a thin adapter around one session.

``main`` (entry point, the multi-threaded executor) -> ``node`` (ROS entities, lifecycle,
prompts) -> ``session`` (the one thread that owns the engine), which speaks through the
``replies`` port (``node_replies``: the node's publishers and diagnostics); ``contract`` is
what the node promises on the wire, ``node_parameters`` the parameter table
(orin_llm_node/parameters.py) on rclpy, ``cameras/`` the image side.  Nothing here is
imported by the engine; docs/architecture.md draws the whole picture.
"""
