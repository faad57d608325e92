# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Kernel plumbing: CUDA sources, CuPy builds, the layers' dispatch, the backend factory.

* ``kernel_sources``: where ``cuda_kernels/`` is and how each variant compiles (no CuPy);
* ``cuda_ops``: the one module that imports CuPy: builds, launches, the fused layer ops;
* ``dispatch``: which implementation a layer runs (torch body, or the installed fused ops);
* ``backend_factory``: the attention backend an engine runs, and its fused layer ops.

Nothing is imported here: the layers import ``dispatch`` alone, without CuPy or the builds.
"""
