# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What the kernel tests share, emulated and on a GPU.

The dtype table, the tolerance, the skip, an eager engine at a graph engine's row counts, and
the fp32 rule against the CPU reference.
"""

import pytest
import torch

#: Kernel variant dtype name (also the test id) -> torch dtype.
DTYPES = {'float32': torch.float32, 'bfloat16': torch.bfloat16, 'float16': torch.float16}
#: Output tolerance: the kernels accumulate in fp32 and round the result to the dtype once.
ATOL = {'float32': 2e-5, 'bfloat16': 1.6e-2, 'float16': 2e-3}


def skip_without_cuda_kernels() -> None:
    """Skip the importing test module unless a CUDA GPU and CuPy are there (call at import)."""
    if not torch.cuda.is_available():
        pytest.skip('needs a CUDA GPU', allow_module_level=True)
    pytest.importorskip('cupy', reason='needs CuPy (cupy-cuda12x / cupy-cuda13x)')


def eager_like(engine):
    """Make ``engine`` (built without graphs) run short prefills padded, as a graph engine does.

    Graph-vs-eager comparisons run both sides at the same row counts
    (``prefill_graph.pad_like_graphs``, which ``orin_llm_check`` uses too).
    """
    from orin_llm_node.engine.prefill_graph import pad_like_graphs

    assert not engine.uses_cuda_graph
    pad_like_graphs(engine.runner)
    assert not engine.runner.prefill_graphs.use_graphs
    return engine


def assert_reference_greedy(ref, result):
    """Each greedy token of ``result`` is the CPU reference's choice, up to a near-tie.

    fp32 on a GPU against transformers on the CPU (``ref``, an ``_engine_reference.Reference``):
    the two round differently -- other kernels, other row counts (a cached prefix and a padded
    follow-up here, the whole prompt there) -- so exact tokens are not promised, only that the
    reference, teacher-forced on ``result``'s tokens, scores each within ``FP32_NEAR_TIE`` of
    its own best (``orin_llm_check`` applies the same rule to its fp32 row).
    """
    from orin_llm_node.cli.check import FP32_NEAR_TIE, greedy_gaps

    logits = ref.next_token_logits(result.prompt_token_ids, result.prompt_images,
                                   result.token_ids)
    gaps = greedy_gaps(logits, result.token_ids)
    worst = int(gaps.argmax())
    assert gaps[worst] <= FP32_NEAR_TIE, (
        f'token {worst}: the reference scores it {float(gaps[worst]):.3g} below its best')
