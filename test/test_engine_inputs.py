# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Bad input to ``LLMEngine.chat`` is a ``ValueError`` naming the problem, and changes nothing."""

import numpy as np
import pytest

from orin_llm_node.engine import EngineConfig, LLMEngine, SamplingParams


@pytest.fixture(scope='module')
def engine(tiny_ckpt):
    return LLMEngine(EngineConfig(model_path=tiny_ckpt, device='cpu', num_kv_blocks=32))


@pytest.mark.parametrize('text,images,needle', [
    ('\ud800 hi', None, 'not valid Unicode'),
    ('hi \udfff', [], 'at index 3'),
    (b'hi', None, 'must be a str'),
    ('hi', np.zeros((32, 32, 3), np.uint8), 'bare (32, 32, 3) array'),
])
def test_bad_input_is_a_value_error_and_changes_nothing(engine, text, images, needle):
    conv = engine.new_conversation('sys')
    before = engine.stats()
    with pytest.raises(ValueError) as err:
        engine.chat(conv, text, images=images, sampling=SamplingParams(max_tokens=2))
    assert needle in str(err.value)
    after = engine.stats()
    assert (after.used_blocks, after.free_blocks) == (before.used_blocks, before.free_blocks)
    # The conversation still works afterwards.
    assert engine.chat(conv, 'hi', sampling=SamplingParams(max_tokens=2)).finish_reason
    engine.reset(conv)
