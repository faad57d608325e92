# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The command-line tools, one folder.

``orin_llm_chat`` (chat, chat_client, chat_video), ``make demo`` (demo) and
``orin_llm_check`` (check, check_kernels).  The chat tools and the demo talk to a running
node over ROS 2 (the names and QoS of ros/contract.py); ``orin_llm_check`` imports neither
rclpy nor ``ros/``: it reads the parameters with the one table (orin_llm_node/parameters.py)
and checks the engine alone.
"""
