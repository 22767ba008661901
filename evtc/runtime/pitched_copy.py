"""Row-pitched device copies for the padded staging route (:mod:`evtc.dispatch.staging`).

Input: two CUDA torch tensors of one shape (M, N) or (L, M, N) and dtype on the current device,
each with unit column stride and one row pitch over all its L x M rows (a packed tensor, or one
with rows padded to 16 bytes as evtc allocates them). Output: ``dst`` holds ``src``, copied by
one ``cudaMemcpy2DAsync`` on the current torch stream (capturable in a CUDA graph, like
``copy_``).

NOTE [Pitched copies for staging]: torch's ``copy_`` between a packed and a padded tensor (rows
of 50257 bf16 elements into rows of 50264) runs its strided elementwise kernel, without vector
loads: 462 us for a 4096 x 50257 bf16 C (1.78 TB/s of reads and writes) on the H200 of
2026-11-25, where ``cudaMemcpy2DAsync`` of the same rows took 344 us (2.39 TB/s) and a
contiguous ``copy_`` of the same bytes 196 us (``benchmarks/bench_staging_copy.py``). The CUDA runtime is reached through ctypes: the
``libcudart`` torch already loaded (found in ``/proc/self/maps``), else the first of the usual
sonames; no new dependency. Anything this can't do (another layout, no runtime found, an error
from the call, which is cleared so torch's later launch checks don't see it) returns False and
the caller falls back to ``copy_``.

NOTE [Copy kernels for staging]: ``cudaMemcpy2DAsync`` moves rows at 2.1 TB/s on the H100 for
rows of 50257 bf16 elements, and at 1.4-1.5 TB/s for rows of 4097 or 14337
(``benchmarks/micro/copy_rows.cu``, 2026-11-26), against 2.8-3.0 TB/s for a contiguous copy of
the same bytes. Every sm90 GEMM library therefore also exports ``evtc_copy_rows``
(``codegen_templates/include/evtc/copy_rows.hpp``): a kernel in which each thread stores one
16-byte vector of the destination (a padded buffer's row, or a packed output read as one flat
array) and loads its elements from the source one by one: 312 against 384 us at 4096 x 50257,
2.5-2.6 TB/s at the narrower rows, and 2.1-2.2 TB/s the other way. The first evtc library a
process loads that has it registers it here (:func:`register_copy_kernel`); :func:`copy_rows`
uses it when one is registered and the destination qualifies, then ``cudaMemcpy2DAsync``, then
(the caller) ``copy_``. The route's first staged call of a process may run before any such
library is loaded and take ``cudaMemcpy2DAsync``.
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any

__all__ = ["copy_rows", "register_copy_kernel", "row_layout"]

#: cudaMemcpyDeviceToDevice (cuda_runtime_api.h, enum cudaMemcpyKind)
_DEVICE_TO_DEVICE = 3
_SONAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
_LOCK = threading.Lock()
_RUNTIME: list = []  # [] not looked up yet; [None] none found; [(memcpy2d, get_last_error)]
#: the registered evtc_copy_rows (a ctypes function of a loaded kernel library), or None
_COPY_KERNEL: list = [None]
#: copies by way: "kernel", "memcpy2d" (tests, benchmarks)
COUNTS = {"kernel": 0, "memcpy2d": 0}


def register_copy_kernel(fn) -> None:
    """Make ``fn`` (a kernel library's ``evtc_copy_rows``, its argtypes set) the copy kernel of
    :func:`copy_rows` (NOTE [Copy kernels for staging]); the libraries are never unloaded."""
    _COPY_KERNEL[0] = fn


def _element_strides(shape: tuple[int, ...], strides: tuple[int, ...]) -> tuple[int, int] | None:
    """(row stride, batch stride) in elements of a (M, N) or (L, M, N) tensor with unit column
    stride, or None."""
    if len(shape) not in (2, 3) or len(strides) != len(shape) or strides[-1] != 1:
        return None
    return strides[-2], (strides[0] if len(shape) == 3 else 0)


def row_layout(shape: tuple[int, ...], dst_strides: tuple[int, ...], src_strides: tuple[int, ...],
               itemsize: int) -> tuple[int, int, int, int] | None:
    """``(dst_pitch, src_pitch, width, height)`` in bytes, bytes, bytes, rows of the one 2-D copy
    that moves a (M, N) or (L, M, N) tensor between the two layouts (strides in elements), or
    None when a layout is not rows of unit stride under one pitch (a batch stride other than M
    rows, overlapping rows, a 1-D or 4-D tensor)."""
    if len(shape) not in (2, 3) or len(dst_strides) != len(shape) or len(src_strides) != len(shape):
        return None
    if any(d <= 0 for d in shape):
        return None
    m, n = shape[-2], shape[-1]
    pitches = []
    for strides in (dst_strides, src_strides):
        if strides[-1] != 1 or (strides[-2] < n and m > 1):
            return None
        if len(shape) == 3 and shape[0] > 1 and strides[0] != m * strides[-2]:
            return None
        pitches.append(max(strides[-2], n) * itemsize)
    height = m * (shape[0] if len(shape) == 3 else 1)
    return pitches[0], pitches[1], n * itemsize, height


def _runtime():
    """(cudaMemcpy2DAsync, cudaGetLastError) of the process's CUDA runtime, or None."""
    with _LOCK:
        if _RUNTIME:
            return _RUNTIME[0]
        found = None
        paths = []
        try:
            with open("/proc/self/maps") as f:
                paths = sorted({line.split()[-1] for line in f if "libcudart" in line and "/" in line})
        except OSError:
            pass
        for name in (*paths, *_SONAMES):
            try:
                lib = ctypes.CDLL(name)
                fn, err = lib.cudaMemcpy2DAsync, lib.cudaGetLastError
            except (OSError, AttributeError):
                continue
            fn.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_size_t,
                           ctypes.c_size_t, ctypes.c_int, ctypes.c_void_p]
            fn.restype = ctypes.c_int
            err.argtypes, err.restype = [], ctypes.c_int
            found = (fn, err)
            break
        _RUNTIME.append(found)
        return found


def copy_rows(dst: Any, src: Any) -> bool:
    """Copy torch tensor ``src`` into ``dst`` on the current stream: evtc's copy kernel (NOTE [Copy
    kernels for staging]) where one is registered and ``dst`` has 16-byte aligned rows or is
    packed, else one pitched copy (NOTE [Pitched copies for staging]); False (nothing done)
    where neither applies."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(dst, torch.Tensor) or not isinstance(src, torch.Tensor):
        return False
    if not (dst.is_cuda and src.is_cuda) or dst.dtype != src.dtype or dst.shape != src.shape:
        return False
    if dst.device != src.device or dst.device.index != torch.cuda.current_device():
        return False
    shape = tuple(dst.shape)
    kernel = _COPY_KERNEL[0]
    if kernel is not None and dst.element_size() in (1, 2, 4) and all(d > 0 for d in shape):
        d, s = _element_strides(shape, tuple(dst.stride())), _element_strides(shape, tuple(src.stride()))
        if d is not None and s is not None:
            L, M, N = (shape[0] if len(shape) == 3 else 1), shape[-2], shape[-1]
            stream = torch.cuda.current_stream(dst.device).cuda_stream
            if kernel(dst.data_ptr(), d[0], d[1], src.data_ptr(), s[0], s[1], L, M, N, dst.element_size(), stream,
                      dst.device.index) == 0:
                COUNTS["kernel"] += 1
                return True
    layout = row_layout(shape, tuple(dst.stride()), tuple(src.stride()), dst.element_size())
    rt = _runtime() if layout is not None else None
    if rt is None:
        return False
    memcpy2d, get_last_error = rt
    dpitch, spitch, width, height = layout
    stream = torch.cuda.current_stream(dst.device).cuda_stream
    if memcpy2d(dst.data_ptr(), dpitch, src.data_ptr(), spitch, width, height, _DEVICE_TO_DEVICE, stream) != 0:
        get_last_error()  # not sticky: clear it so torch's next launch check does not report it
        return False
    COUNTS["memcpy2d"] += 1
    return True
