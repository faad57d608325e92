# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Compile every CUDA kernel variant to PTX with NVRTC, without a GPU.

The sources and options come from ``orin_llm_node.kernel_sources`` -- exactly what the runtime
hands to ``cupy.RawModule`` -- and are compiled for Orin (compute_87) and Hopper (compute_90)
with the CUDA 12 NVRTC of the ``nvidia-cuda-nvrtc-cu12`` wheel through ``cuda.bindings``
(CuPy cannot: its compile asks the driver for the device). A syntax error in any ``.cu`` file
fails this test.
"""

from pathlib import Path
import re

import pytest

from orin_llm_node import kernel_sources

nvrtc = pytest.importorskip(
    "cuda.bindings.nvrtc", reason="cuda-bindings (requirements/test.txt) is not installed"
)

ARCHS = ("compute_87", "compute_90")
# Kernels that keep everything in registers (no static shared memory).
NO_SMEM_FILES = {"kv_write.cu", "qk_norm_rope_kv.cu", "silu_mul.cu", "quant_linear.cu"}
# Static shared memory above 48 KiB needs an opt-in the kernels do not make.
MAX_STATIC_SMEM = 48 * 1024


class NvrtcError(RuntimeError):
    pass


def _check(result, what):
    err = result[0] if isinstance(result, tuple) else result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(f"{what} failed: {err}")
    return result[1:] if isinstance(result, tuple) else ()


def compile_ptx(source: str, options, arch: str, name: str = "kernel.cu") -> tuple[str, str]:
    """Compile ``source`` to PTX; returns (ptx, compiler log) or raises NvrtcError with the log."""
    (prog,) = _check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []),
                     "nvrtcCreateProgram")
    try:
        opts = [o.encode() for o in (*options, f"--gpu-architecture={arch}")]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        (log_size,) = _check(nvrtc.nvrtcGetProgramLogSize(prog), "nvrtcGetProgramLogSize")
        log = b" " * log_size
        _check(nvrtc.nvrtcGetProgramLog(prog, log), "nvrtcGetProgramLog")
        log = log.rstrip(b"\0").decode(errors="replace").strip()
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(f"{name} [{arch}] {' '.join(options)}: {err}\n{log}")
        (ptx_size,) = _check(nvrtc.nvrtcGetPTXSize(prog), "nvrtcGetPTXSize")
        ptx = b" " * ptx_size
        _check(nvrtc.nvrtcGetPTX(prog, ptx), "nvrtcGetPTX")
        return ptx.rstrip(b"\0").decode(), log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def test_nvrtc_library_loads():
    major, minor = _check(nvrtc.nvrtcVersion(), "nvrtcVersion")
    # CUDA 12 like Jetson's JetPack 6; a CUDA 13 NVRTC would not match cupy-cuda12x.
    assert major == 12, f"expected the CUDA 12 NVRTC, got {major}.{minor}"


def test_every_kernel_file_is_compiled():
    on_disk = {p.name for p in kernel_sources.kernels_dir().glob("*.cu")}
    listed = set(kernel_sources.KERNEL_FILES) | set(kernel_sources.QUANT_KERNEL_FILES)
    assert on_disk == listed, (
        "each cuda_kernels/*.cu must be listed in kernel_sources.KERNEL_FILES or "
        "QUANT_KERNEL_FILES (and vice versa)"
    )


def test_sources_are_self_contained():
    for file in (*kernel_sources.KERNEL_FILES, *kernel_sources.QUANT_KERNEL_FILES):
        src = kernel_sources.kernel_source(file)
        assert '#include "' not in src, f"{file}: local include left after inlining"
        assert "#include <" not in src, f"{file}: system headers break the header-free build"


_VARIANTS = kernel_sources.runtime_variants()


@pytest.mark.parametrize("arch", ARCHS)
@pytest.mark.parametrize(
    "var", _VARIANTS, ids=[f"{v.file[:-3]}-{v.dtype}-d{v.head_dim}" for v in _VARIANTS]
)
def test_variant_compiles_to_ptx(var, arch):
    ptx, log = compile_ptx(var.source, var.options, arch, var.file)
    assert not log, f"{var.file} compiled with diagnostics:\n{log}"
    assert f".target sm_{arch.split('_')[1]}" in ptx
    entries = set(re.findall(r"\.entry\s+(\w+)", ptx))
    assert entries == set(var.functions), f"{var.file}: entries {entries}"
    smem = sum(int(n) for n in re.findall(r"\.shared\s+\.align\s+\d+\s+\.\w+\s+\w+\[(\d+)\]", ptx))
    assert (smem == 0) == (var.file in NO_SMEM_FILES), f"{var.file}: {smem} bytes of smem"
    assert smem <= MAX_STATIC_SMEM, f"{var.file}: {smem} bytes of static shared memory"


@pytest.mark.parametrize(
    "var", _VARIANTS, ids=[f"{v.file[:-3]}-{v.dtype}-d{v.head_dim}" for v in _VARIANTS]
)
def test_variant_assembles_for_orin(var):
    """Assemble to sm_87 machine code too (ptxas checks inline PTX, registers), as CuPy does."""
    opts = [o.encode() for o in (*var.options, "--gpu-architecture=sm_87")]
    (prog,) = _check(nvrtc.nvrtcCreateProgram(var.source.encode(), var.file.encode(), 0, [],
                                              []), "nvrtcCreateProgram")
    try:
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        assert err == nvrtc.nvrtcResult.NVRTC_SUCCESS, f"{var.file}: {err}"
        (size,) = _check(nvrtc.nvrtcGetCUBINSize(prog), "nvrtcGetCUBINSize")
        assert size > 0
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


def test_syntax_error_fails(tmp_path: Path):
    """The harness really reports errors: a planted syntax error must fail to compile."""
    src_dir = kernel_sources.kernels_dir()
    for f in src_dir.glob("*.cu*"):
        (tmp_path / f.name).write_text(f.read_text())
    broken = tmp_path / "paged_decode.cu"
    broken.write_text(broken.read_text().replace("const int ctx =", "const int ctx = = ", 1))
    var = kernel_sources.variant("paged_decode.cu", "bfloat16", 128, directory=tmp_path)
    with pytest.raises(NvrtcError, match="error"):
        compile_ptx(var.source, var.options, ARCHS[0], var.file)


def test_missing_configuration_fails():
    var = kernel_sources.variant("kv_write.cu", "float16", 64)
    options = [o for o in var.options if not o.startswith("-DHEAD_DIM")]
    with pytest.raises(NvrtcError, match="kernel_sources"):
        compile_ptx(var.source, options, ARCHS[0], var.file)
