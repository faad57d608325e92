# Copyright 2026 orin_llm_node developers
# SPDX-License-Identifier: Apache-2.0
"""``orin_llm_check``'s kernel rows: build every variant, where CuPy keeps them, fused == torch.

Every fused op is compared with its torch body through a :class:`~orin_llm_node.kernels.cuda_ops.
LaunchCounter`: an op whose inputs the kernels cannot take (a device that does not match, a
misaligned row) quietly runs the torch body, and a row that launched nothing fails instead of
comparing torch with torch. CuPy keeps compiled modules in ``CUPY_CACHE_DIR`` (default
``~/.cupy/kernel_cache``), so only the first run on a device pays for the NVRTC compiles of
every variant; the ``kernel cache`` row says where, and warns when nothing can be kept.
"""

import time

from orin_llm_node.cli.check import FAIL, PASS, SKIP, WARN, Check

#: Where CuPy finds the CUDA toolkit on a Jetson (JetPack installs it there).
JETSON_CUDA_PATH = '/usr/local/cuda'


def _cuda_usable(device):
    from orin_llm_node.kernels import cuda_ops

    if device.type != 'cuda':
        return f'device {device} (no CUDA)'
    if not cuda_ops.cupy_available():
        return 'CuPy is not importable'
    return None


def cuda_root_row(root) -> Check:
    """The CUDA toolkit root CuPy found (``cuda_ops.versions()['cuda_root']``), or the fix."""
    if root:
        return Check('cuda root', PASS, f"CuPy's CUDA root {root}")
    return Check('cuda root', WARN, 'CuPy found no CUDA toolkit root',
                 f'export CUDA_PATH={JETSON_CUDA_PATH} (JetPack; elsewhere the CUDA toolkit '
                 'root): CuPy 13 wants one even though the kernels include no headers')


def kernel_cache_row(cache: dict, compiled: int, seconds: float) -> Check:
    """Where CuPy keeps the compiled kernels (``cuda_ops.kernel_cache()``) for the next run.

    ``compiled``: modules this run added to the cache; ``seconds``: what building took.
    """
    again = f'every start compiles the kernels again ({seconds:.1f} s here)'
    if cache['in_memory']:
        return Check('kernel cache', WARN, f'CUPY_CACHE_IN_MEMORY=1: {again}',
                     'unset CUPY_CACHE_IN_MEMORY')
    if not cache['writable']:
        return Check('kernel cache', WARN, f"{cache['dir']} is not writable: {again}",
                     'export CUPY_CACHE_DIR=<a writable directory>, for the node as well '
                     '(its launch environment or systemd unit)')
    done = (f'{compiled} modules compiled and kept for later runs' if compiled
            else 'every module loaded from the cache')
    return Check('kernel cache', PASS, f"{cache['dir']} (CUPY_CACHE_DIR): {done}, "
                 f"{cache['modules']} kept, {seconds:.1f} s")


def kernel_rows(report, device) -> list[Check]:
    """Every kernel variant built for ``device``, then where CuPy keeps them (``report``)."""
    from orin_llm_node.kernels import cuda_ops, kernel_sources
    from orin_llm_node.kernels.dispatch import tensor_device

    why = _cuda_usable(device)
    if why:
        return [Check('kernels compile', SKIP, why)]
    index = tensor_device(device).index
    before, t0 = cuda_ops.kernel_cache(), time.monotonic()
    rows = []
    for dtype in kernel_sources.DTYPE_IDS:
        for head_dim in kernel_sources.HEAD_DIMS:
            try:
                n = len(cuda_ops.load_kernels(dtype, head_dim, index))
                rows.append(Check(f'kernels {dtype} d{head_dim}', PASS, f'{n} functions'))
            except Exception as exc:  # noqa: BLE001 - every failure is a row
                rows.append(Check(f'kernels {dtype} d{head_dim}', FAIL, str(exc).split('\n')[0],
                                  'install the CuPy wheel matching the CUDA toolkit '
                                  '(requirements/jetson-constraints.txt on a Jetson); on a '
                                  f'Jetson export CUDA_PATH={JETSON_CUDA_PATH}'))
    cache = cuda_ops.kernel_cache()
    compiled = max(0, cache['modules'] - before['modules'])
    report['kernel_cache'] = dict(cache, compiled=compiled)
    rows.append(kernel_cache_row(cache, compiled, time.monotonic() - t0))
    return rows


def fused_rows(device, launcher=None) -> list[Check]:
    """Each fused kernel against its torch body at small shapes, counting its launches.

    ``launcher(dtype name) -> launch`` replaces the CuPy build (tests: the CPU kernel emulator).
    An op whose inputs the kernels cannot take runs its torch body: a row that launched no
    kernel compared the torch body with itself, and fails.
    """
    import torch

    from orin_llm_node.kernels.cuda_ops import FusedOps, LaunchCounter, kernel_launcher

    why = _cuda_usable(device) if launcher is None else None
    if why:
        return [Check('fused kernels', SKIP, why)]
    rows = []
    gen = torch.Generator(device='cpu').manual_seed(0)
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        # Half precision: a few units in the last place of bf16; fp32: summation order only.
        tol = ({'atol': 2e-2, 'rtol': 2e-2} if dtype != torch.float32
               else {'atol': 1e-4, 'rtol': 1e-4})
        name = str(dtype).replace('torch.', '')
        launch = LaunchCounter(launcher(name) if launcher
                               else kernel_launcher(dtype, 128, device))
        ops = FusedOps(dtype, 128, device, launch=launch)  # inputs go to ops.device
        for case, (fused, body) in _cases(ops, gen).items():
            rows.append(_fused_row(f'{case} {name}', launch, fused, body, tol, ops.device))
    return rows


def _cases(ops, gen) -> dict:
    """Case -> (the fused op, its torch body) on inputs of ``ops``' device and dtype."""
    import torch

    from orin_llm_node.layers.activation import silu_and_mul
    from orin_llm_node.layers.layernorm import add_rms_norm, rms_norm
    from orin_llm_node.quantization import AT_LOAD_FORMATS

    device, dtype = ops.device, ops.dtype
    x, res = (torch.randn(5, 1024, generator=gen).to(device, dtype) for _ in range(2))
    w = torch.randn(1024, generator=gen).to(device, dtype)
    gate_up = torch.randn(5, 2048, generator=gen).to(device, dtype)
    cases = {'rms_norm': (lambda: ops.rms_norm(x, w, 1e-6), lambda: rms_norm(x, w, 1e-6)),
             'add_rms_norm': (lambda: ops.add_rms_norm(x, res.clone(), w, 1e-6),
                              lambda: add_rms_norm(x, res.clone(), w, 1e-6)),
             'silu_and_mul': (lambda: ops.silu_and_mul(gate_up), lambda: silu_and_mul(gate_up))}
    # Quantized GEMV (one row: the decode path) against the layer's torch body.
    for fmt, (cls, asym) in AT_LOAD_FORMATS.items():
        layer = cls(1024, 256, group_size=128, asymmetric=asym, device=device)
        layer.quantize_from(torch.randn(256, 1024, generator=gen).to(device) / 32)
        cases[f'quant_linear {fmt}'] = (lambda q=layer: ops.quant_linear(q, x[:1]),
                                        lambda q=layer: q.torch_forward(x[:1]))
    return cases


def _fused_row(label, launch, fused, body, tol, device) -> Check:
    import torch

    before = launch.total
    got = fused()
    launched = launch.total - before
    if not launched:
        return Check(label, FAIL, f'launched no kernel on {device}: the torch body ran and '
                     'was compared with itself', 'report it with this output')
    try:
        torch.testing.assert_close(got, body(), **tol)
    except AssertionError as exc:
        return Check(label, FAIL, ' '.join(str(exc).split())[:200],
                     'report it with this output (attention_backend torch avoids the kernels)')
    return Check(label, PASS, f'{launched} kernel launch{"es" if launched > 1 else ""}, '
                 f"equals the torch body (atol {tol['atol']:g}, rtol {tol['rtol']:g})")
