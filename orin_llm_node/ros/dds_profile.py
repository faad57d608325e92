# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""The Fast DDS profile the node gives itself so that camera frames from any publisher arrive.

Measured with bench/image_delivery.py (two processes, loopback, publishers at their defaults):
Fast DDS moves a sample between processes through the *publisher's* shared-memory segment
(512 KB by default), so a best-effort 640x480 or 1280x720 rgb8 frame is mostly or always lost,
and a larger segment on the subscriber's side does not help.  A node without shared-memory
locators makes the publisher send over UDP instead, into a socket buffer large enough for a
frame; then every frame arrives.  The profile is chosen to match the ROS discovery settings
(``dds_profiles/loopback.xml`` keeps the node's data on 127.0.0.1) and applied only when the
user has not named a profile file of their own.

It must be in the environment before rclpy creates the DDS participant (``rclpy.init``); the
ROS wheels' re-exec of the interpreter happens at start-up, before ``main`` runs, so setting it
in ``main`` is early enough.
"""

from importlib import resources
import os

PROFILE_VARIABLES = ('FASTDDS_DEFAULT_PROFILES_FILE', 'FASTRTPS_DEFAULT_PROFILES_FILE')
FAST_DDS_RMWS = ('', 'rmw_fastrtps_cpp', 'rmw_fastrtps_dynamic_cpp')


def loopback_only(environ):
    """Whether ROS discovery is confined to this machine."""
    return (environ.get('ROS_LOCALHOST_ONLY') == '1'
            or environ.get('ROS_AUTOMATIC_DISCOVERY_RANGE', '').upper() in ('LOCALHOST', 'OFF'))


def profile_path(environ):
    """The installed profile file that matches the discovery settings in ``environ``."""
    name = 'loopback.xml' if loopback_only(environ) else 'network.xml'
    return str(resources.files('orin_llm_node.ros') / 'dds_profiles' / name)


def apply(environ=os.environ):
    """Point Fast DDS at the node's profile unless the user chose one; return what was done.

    Returns the profile path when it was applied, else None (another RMW, or a profile file
    already set: the user's choice wins).
    """
    if environ.get('RMW_IMPLEMENTATION', '') not in FAST_DDS_RMWS:
        return None
    if any(environ.get(var) for var in PROFILE_VARIABLES):
        return None
    path = profile_path(environ)
    environ['FASTDDS_DEFAULT_PROFILES_FILE'] = path
    if environ.get('ROS_DISTRO') == 'humble':
        # Humble's Fast DDS 2.6 reads only the old name; later releases warn when it is set.
        environ['FASTRTPS_DEFAULT_PROFILES_FILE'] = path
    return path
