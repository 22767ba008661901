"""Row-pitched device copies for the padded staging route (:mod:`evtc.runtime.staging`).

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
"""

from __future__ import annotations

import ctypes
import sys
import threading
from typing import Any

__all__ = ["copy_rows", "row_layout"]

#: cudaMemcpyDeviceToDevice (cuda_runtime_api.h, enum cudaMemcpyKind)
_DEVICE_TO_DEVICE = 3
_SONAMES = ("libcudart.so.13", "libcudart.so.12", "libcudart.so")
_LOCK = threading.Lock()
_RUNTIME: list = []  # [] not looked up yet; [None] none found; [(memcpy2d, get_last_error)]


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
    """Copy torch tensor ``src`` into ``dst`` with one pitched copy on the current stream
    (NOTE [Pitched copies for staging]); False (nothing done) where that does not apply."""
    torch = sys.modules.get("torch")
    if torch is None or not isinstance(dst, torch.Tensor) or not isinstance(src, torch.Tensor):
        return False
    if not (dst.is_cuda and src.is_cuda) or dst.dtype != src.dtype or dst.shape != src.shape:
        return False
    if dst.device != src.device or dst.device.index != torch.cuda.current_device():
        return False
    layout = row_layout(tuple(dst.shape), tuple(dst.stride()), tuple(src.stride()), dst.element_size())
    rt = _runtime() if layout is not None else None
    if rt is None:
        return False
    memcpy2d, get_last_error = rt
    dpitch, spitch, width, height = layout
    stream = torch.cuda.current_stream(dst.device).cuda_stream
    if memcpy2d(dst.data_ptr(), dpitch, src.data_ptr(), spitch, width, height, _DEVICE_TO_DEVICE, stream) != 0:
        get_last_error()  # not sticky: clear it so torch's next launch check does not report it
        return False
    return True
