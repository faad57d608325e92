# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What the kernel tests share, emulated and on a GPU.

The dtype table, the tolerance, the skip, and an eager engine at a graph engine's row counts.
"""

import pytest
import torch

#: Kernel variant dtype name (also the test id) -> torch dtype.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
#: Output tolerance: the kernels accumulate in fp32 and round the result to the dtype once.
ATOL = {"float32": 2e-5, "bfloat16": 1.6e-2, "float16": 2e-3}


def skip_without_cuda_kernels() -> None:
    """Skip the importing test module unless a CUDA GPU and CuPy are there (call at import)."""
    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA GPU", allow_module_level=True)
    pytest.importorskip("cupy", reason="needs CuPy (cupy-cuda12x / cupy-cuda13x)")


def eager_like(engine):
    """Make ``engine`` (built without graphs) run short prefills padded, as a graph engine does.

    Graph-vs-eager comparisons must run both sides at the same row counts: cuBLAS does not
    promise identical rows for different row counts, so an unpadded eager prefill may differ in
    the last bits from a padded graph one and flip a later token. At equal shapes both run the
    same kernels and agree token for token.
    """
    from orin_llm_node.engine.prefill_graph import DEFAULT_BUCKETS, PrefillGraphs

    assert not engine.uses_cuda_graph
    engine.runner.prefill_graphs = PrefillGraphs(engine.runner, DEFAULT_BUCKETS)
    assert not engine.runner.prefill_graphs.use_graphs
    return engine
