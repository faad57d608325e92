# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""What the kernel tests share, emulated and on a GPU: the dtype table, the tolerance, the skip."""

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
