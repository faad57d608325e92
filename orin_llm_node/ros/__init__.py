# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The ROS 2 layer: the ``orin_llm`` node and its tools (see docs/architecture.md).

``main`` (entry point) -> ``node`` (ROS entities, lifecycle) -> ``intake`` (images and prompts
in) and ``worker`` (the one thread that owns the engine); ``parameters`` is the one parameter
table; ``ros_image``, ``diagnostics``, ``dds_profile``, ``chat_client`` and ``demo`` hold what
their names say.  Nothing here is imported by the engine.
"""
