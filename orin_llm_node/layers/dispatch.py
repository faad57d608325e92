# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Moved to ``orin_llm_node.kernels.dispatch``; this old import path is that same module.

Kept only while ``check.py`` / ``check_kernels.py`` import the old path: an alias in
``sys.modules``, not a copy, so a test that patches one patches the other.
"""

import sys

from orin_llm_node.kernels import dispatch

sys.modules[__name__] = dispatch
