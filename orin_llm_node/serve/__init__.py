# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""orin_llm_serve: the engine behind the OpenAI chat-completions API (needs FastAPI, uvicorn)."""
