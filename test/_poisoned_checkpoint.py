# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""A real tiny checkpoint whose logits hold a NaN.

Shared by test_sampling_non_finite.py (the engine) and test_node_non_finite.py (the node).
"""

import shutil

from safetensors.torch import load_file, save_file

#: The token whose lm_head row the poisoned checkpoint sets to NaN.
POISONED_ID = 100


def poisoned_checkpoint(make_ckpt, dst):
    """A real checkpoint whose lm_head row ``POISONED_ID`` is NaN (untied: prompts embed fine)."""
    shutil.copytree(make_ckpt('untied', tie_word_embeddings=False), dst)
    weights = load_file(str(dst / 'model.safetensors'))
    weights['lm_head.weight'][POISONED_ID] = float('nan')
    save_file(weights, str(dst / 'model.safetensors'), metadata={'format': 'pt'})
    return dst
