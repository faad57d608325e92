# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
