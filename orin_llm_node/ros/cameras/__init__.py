# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The node's cameras: everything between an image topic and a prompt's frames.

``intake`` (subscriptions, checks on arrival, the newest frames and synchronised sets),
``camera_sync`` (approximate-time sets), ``frame_ring`` (video rings), ``blind_camera`` (no
frames, and what was seen), ``ros_image`` (messages <-> RGB arrays), ``camera_views`` (what the
cameras give one prompt), ``camera_prompt`` (the frames decoded, the multi-camera prompt text)
and ``camera_report`` (the camera part of ``response/info``).  Only ``intake`` imports rclpy.
"""
