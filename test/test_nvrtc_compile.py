# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""Compile every CUDA kernel variant with NVRTC exactly as CuPy does on a GPU, without one.

The sources and options come from ``orin_llm_node.kernels.kernel_sources``: what the runtime
hands to ``cupy.RawModule`` plus what CuPy adds (``-ftz=true``,
``--device-as-default-execution-space``, ``-arch=sm_<device>``:
``KernelVariant.nvrtc_options``), for Orin (sm_87) and Hopper (sm_90),
to PTX and a cubin, with the CUDA 12 NVRTC of the ``nvidia-cuda-nvrtc-cu12`` wheel through
``cuda.bindings`` (CuPy cannot: its compile asks the driver for the device). A syntax error in
any ``.cu`` file fails this test.
"""

from pathlib import Path
import re

import pytest

from orin_llm_node.kernels import kernel_sources

nvrtc = pytest.importorskip(
    'cuda.bindings.nvrtc', reason='cuda-bindings (requirements/test.txt) is not installed'
)

SMS = kernel_sources.TARGET_SMS
# Kernels that keep everything in registers (no static shared memory).
NO_SMEM_FILES = {'kv_write.cu', 'qk_norm_rope_kv.cu', 'silu_mul.cu', 'quant_linear.cu'}
# Static shared memory above 48 KiB needs an opt-in the kernels do not make.
MAX_STATIC_SMEM = 48 * 1024


class NvrtcError(RuntimeError):
    pass


def _check(result, what):
    err = result[0] if isinstance(result, tuple) else result
    if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
        raise NvrtcError(f'{what} failed: {err}')
    return result[1:] if isinstance(result, tuple) else ()


def compile_variant(source: str, options, name: str = 'kernel.cu') -> tuple[str, int, str]:
    """Compile ``source`` with exactly ``options``: (PTX, cubin bytes, compiler log).

    Raises NvrtcError with the log when it does not compile.
    """
    (prog,) = _check(nvrtc.nvrtcCreateProgram(source.encode(), name.encode(), 0, [], []),
                     'nvrtcCreateProgram')
    try:
        opts = [o.encode() for o in options]
        (err,) = nvrtc.nvrtcCompileProgram(prog, len(opts), opts)
        (log_size,) = _check(nvrtc.nvrtcGetProgramLogSize(prog), 'nvrtcGetProgramLogSize')
        log = b' ' * log_size
        _check(nvrtc.nvrtcGetProgramLog(prog, log), 'nvrtcGetProgramLog')
        log = log.rstrip(b'\0').decode(errors='replace').strip()
        if err != nvrtc.nvrtcResult.NVRTC_SUCCESS:
            raise NvrtcError(f"{name} {' '.join(options)}: {err}\n{log}")
        (ptx_size,) = _check(nvrtc.nvrtcGetPTXSize(prog), 'nvrtcGetPTXSize')
        ptx = b' ' * ptx_size
        _check(nvrtc.nvrtcGetPTX(prog, ptx), 'nvrtcGetPTX')
        (cubin_size,) = _check(nvrtc.nvrtcGetCUBINSize(prog), 'nvrtcGetCUBINSize')
        return ptx.rstrip(b'\0').decode(), cubin_size, log
    finally:
        nvrtc.nvrtcDestroyProgram(prog)


_PTXAS_ENTRY = re.compile(r"Compiling entry function '(\w+)' for 'sm_(\d+)'")
_PTXAS_FIGURES = {
    'stack_bytes': re.compile(r'(\d+) bytes stack frame'),
    'spill_store_bytes': re.compile(r'(\d+) bytes spill stores'),
    'spill_load_bytes': re.compile(r'(\d+) bytes spill loads'),
    'registers': re.compile(r'Used (\d+) registers'),
    'smem_bytes': re.compile(r'(\d+) bytes smem'),
}


def ptxas_resources(var, sm: int) -> dict[str, dict[str, int]]:
    """``{kernel: {registers, smem_bytes, spill_*_bytes, stack_bytes}}`` of ``var`` on ``sm``.

    From ptxas's own report (``--ptxas-options=-v``) of the compile CuPy would run.
    """
    _, _, log = compile_variant(var.source, (*var.nvrtc_options(sm), '--ptxas-options=-v'),
                                var.file)
    kernels = {}
    for block in re.split(r'(?=ptxas info\s+: Compiling entry function)', log):
        entry = _PTXAS_ENTRY.search(block)
        if entry:
            kernels[entry.group(1)] = {
                key: int(m.group(1)) if (m := pattern.search(block)) else 0
                for key, pattern in _PTXAS_FIGURES.items()
            }
    return kernels


def test_nvrtc_library_loads():
    major, minor = _check(nvrtc.nvrtcVersion(), 'nvrtcVersion')
    # CUDA 12 like Jetson's JetPack 6; a CUDA 13 NVRTC would not match cupy-cuda12x.
    assert major == 12, f'expected the CUDA 12 NVRTC, got {major}.{minor}'


def test_every_kernel_file_is_compiled():
    on_disk = {p.name for p in kernel_sources.kernels_dir().glob('*.cu')}
    listed = set(kernel_sources.KERNEL_FILES) | set(kernel_sources.QUANT_KERNEL_FILES)
    assert on_disk == listed, (
        'each cuda_kernels/*.cu must be listed in kernel_sources.KERNEL_FILES or '
        'QUANT_KERNEL_FILES (and vice versa)'
    )


def test_sources_are_self_contained():
    for file in (*kernel_sources.KERNEL_FILES, *kernel_sources.QUANT_KERNEL_FILES):
        src = kernel_sources.kernel_source(file)
        assert '#include "' not in src, f'{file}: local include left after inlining'
        assert '#include <' not in src, f'{file}: system headers break the header-free build'


_VARIANTS = kernel_sources.runtime_variants()


def test_options_are_what_cupy_compiles_with():
    """Ours first, then CuPy's forced flush-to-zero and a cubin for the device's SM."""
    var = kernel_sources.quant_variant('bfloat16')
    assert var.nvrtc_options(87) == (*var.options, '-ftz=true',
                                     '--device-as-default-execution-space', '-arch=sm_87')
    assert not any(o.startswith(('-arch', '--gpu-architecture', '-I')) for o in var.options)


@pytest.mark.parametrize('sm', SMS)
@pytest.mark.parametrize(
    'var', _VARIANTS, ids=[f'{v.file[:-3]}-{v.dtype}-d{v.head_dim}' for v in _VARIANTS]
)
def test_variant_compiles_as_cupy_compiles_it(var, sm):
    """PTX and machine code (ptxas checks inline PTX, registers) for sm, CuPy's options."""
    ptx, cubin_size, log = compile_variant(var.source, var.nvrtc_options(sm), var.file)
    assert not log, f'{var.file} compiled with diagnostics:\n{log}'
    assert f'.target sm_{sm}' in ptx and cubin_size > 0
    entries = set(re.findall(r'\.entry\s+(\w+)', ptx))
    assert entries == set(var.functions), f'{var.file}: entries {entries}'
    smem = sum(int(n) for n in re.findall(r'\.shared\s+\.align\s+\d+\s+\.\w+\s+\w+\[(\d+)\]', ptx))
    assert (smem == 0) == (var.file in NO_SMEM_FILES), f'{var.file}: {smem} bytes of smem'
    assert smem <= MAX_STATIC_SMEM, f'{var.file}: {smem} bytes of static shared memory'


_PREFILL = [v for v in _VARIANTS if v.file == 'paged_prefill.cu']


@pytest.mark.parametrize('sm', SMS)
@pytest.mark.parametrize('var', _PREFILL, ids=[f'{v.dtype}-d{v.head_dim}' for v in _PREFILL])
def test_paged_prefill_keeps_its_tiles_in_registers(var, sm):
    """No spills and static shared memory <= 48 KiB, from ptxas's report.

    The tensor-core body holds its Q fragments and O accumulators in registers for the whole
    walk over the keys: a spill would put them in local memory on every tile.
    """
    (res,) = ptxas_resources(var, sm).values()
    assert res['registers'] > 0, 'ptxas printed no resource report'
    assert res['spill_store_bytes'] == res['spill_load_bytes'] == res['stack_bytes'] == 0, res
    assert res['smem_bytes'] <= MAX_STATIC_SMEM, res


def test_syntax_error_fails(tmp_path: Path):
    """The harness really reports errors: a planted syntax error must fail to compile."""
    src_dir = kernel_sources.kernels_dir()
    for f in src_dir.glob('*.cu*'):
        (tmp_path / f.name).write_text(f.read_text())
    broken = tmp_path / 'paged_decode.cu'
    broken.write_text(broken.read_text().replace('const int ctx =', 'const int ctx = = ', 1))
    var = kernel_sources.variant('paged_decode.cu', 'bfloat16', 128, directory=tmp_path)
    with pytest.raises(NvrtcError, match='error'):
        compile_variant(var.source, var.nvrtc_options(SMS[0]), var.file)


def test_missing_configuration_fails():
    var = kernel_sources.variant('kv_write.cu', 'float16', 64)
    options = [o for o in var.nvrtc_options(SMS[0]) if not o.startswith('-DHEAD_DIM')]
    with pytest.raises(NvrtcError, match='kernel_sources'):
        compile_variant(var.source, options, var.file)
