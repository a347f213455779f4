"""A device's achievable peak rates, the roofline's ceilings (:mod:`opcost.model.roofline`).

* matrix-product FLOP/s: a square ``n x n`` by ``n x n`` ``torch.mm`` (``2 n^3`` FLOPs)
  in the given dtype, with TF32 allowed or not for matmuls and cuDNN (both settings
  restored afterwards);
* memory bytes/s: a device-to-device ``copy_`` of ``copy_bytes`` (read + write: twice
  that many bytes cross DRAM).

Each is the best of a few timed repeats after warm-up (CUDA events on a GPU, the wall
clock on the CPU)::

    peaks = measure_peaks("cuda", "float32", tf32=True)
    Peaks.from_dict(peaks)
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

from opcost.spec import dtype_from_name

#: Sizes on a GPU: 8192^3 (1.1 TFLOP) and 1 GiB take a few ms each on an H100.
GPU_MATMUL_N = 8192
GPU_COPY_BYTES = 2**30
#: Sizes on the CPU (tests): well under a second.
CPU_MATMUL_N = 256
CPU_COPY_BYTES = 16 * 2**20


def _best_time_s(
    fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int, inner: int
) -> float:
    """Shortest time of one call of ``fn``, over ``repeats`` timings of ``inner`` calls."""
    for _ in range(warmup):
        fn()
    cuda = device.type == "cuda"
    best = float("inf")
    for _ in range(repeats):
        if cuda:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            torch.cuda.synchronize(device)
            start.record()
            for _ in range(inner):
                fn()
            end.record()
            end.synchronize()
            elapsed_s = start.elapsed_time(end) / 1e3
        else:
            t0 = time.perf_counter()
            for _ in range(inner):
                fn()
            elapsed_s = time.perf_counter() - t0
        best = min(best, elapsed_s / inner)
    return best


def _matmul_time_s(n: int, dtype: torch.dtype, device: torch.device, repeats: int) -> float:
    a = torch.randn(n, n, device=device, dtype=dtype)
    b = torch.randn(n, n, device=device, dtype=dtype)
    c = torch.empty(n, n, device=device, dtype=dtype)
    return _best_time_s(lambda: torch.mm(a, b, out=c), device, repeats, warmup=2, inner=3)


def _copy_time_s(numel: int, device: torch.device, repeats: int) -> float:
    src = torch.ones(numel, device=device, dtype=torch.float32)
    dst = torch.empty_like(src)
    return _best_time_s(lambda: dst.copy_(src), device, repeats, warmup=2, inner=5)


def measure_peaks(
    device: str = "cuda",
    dtype: str = "float32",
    tf32: bool = True,
    *,
    matmul_n: int | None = None,
    copy_bytes: int | None = None,
    repeats: int = 5,
) -> dict[str, Any]:
    """Achievable matmul FLOP/s and memory bytes/s of ``device`` (see the module docstring).

    Returns ``matmul_flops_per_s``, ``memory_bytes_per_s``, ``device_name``, ``tf32``,
    ``dtype``, ``matmul_n`` and ``copy_bytes`` (the size of the copied tensor; twice that
    crosses DRAM). Sizes default by device type.
    """
    dev = torch.device(device)
    cuda = dev.type == "cuda"
    n = matmul_n or (GPU_MATMUL_N if cuda else CPU_MATMUL_N)
    nbytes = copy_bytes or (GPU_COPY_BYTES if cuda else CPU_COPY_BYTES)
    torch_dtype = dtype_from_name(dtype)
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = tf32
    torch.backends.cudnn.allow_tf32 = tf32
    try:
        with torch.no_grad():
            mm_s = _matmul_time_s(n, torch_dtype, dev, repeats)
            numel = nbytes // 4
            copy_s = _copy_time_s(numel, dev, repeats)
        moved = 2 * numel * 4  # read + write
    finally:
        torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved
    name = torch.cuda.get_device_name(dev) if cuda else "cpu"
    return {
        "matmul_flops_per_s": 2.0 * n**3 / mm_s,
        "memory_bytes_per_s": moved / copy_s,
        "device_name": name,
        "tf32": bool(tf32),
        "dtype": dtype,
        "matmul_n": int(n),
        "copy_bytes": int(numel * 4),
    }
