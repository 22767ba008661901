"""Tensors from any framework, seen through one small view, and allocation like them.

Input: torch or cupy tensors, or anything with ``__cuda_array_interface__`` or ``__dlpack__``.
Output: :class:`TensorView` (pointer, shape, strides in elements, dtype, device); new device
memory, fills and streams like a given tensor.

The work is in two modules: :mod:`evtc.runtime.tensor_read` (the readers, NOTE [Reading
foreign tensors], the fast path's keys) and :mod:`evtc.runtime.device` (allocation, fills,
streams); this module is the one import path of both.
"""

from __future__ import annotations

from evtc.runtime.device import (SPECIAL_STREAMS, bytes_allocator, current_stream, current_stream_getter, device_name,
                                 empty, empty_bytes, memset_async, stream_handle, strided_allocator)
from evtc.runtime.tensor_read import _PROBES, _torch_probe  # noqa: F401  (the launchers' fast path reads them)
from evtc.runtime.tensor_read import (ADDRESS_LIMIT, CAI_VERSIONS, DLPACK_READ_ONLY, INT64_LIMIT, KDL_CUDA, TensorView,
                                      cai_probe, contiguous_strides, probe_for, view)

__all__ = [
    "ADDRESS_LIMIT", "CAI_VERSIONS", "DLPACK_READ_ONLY", "INT64_LIMIT", "KDL_CUDA", "SPECIAL_STREAMS", "TensorView",
    "bytes_allocator", "cai_probe", "contiguous_strides", "current_stream", "current_stream_getter", "device_name",
    "empty", "empty_bytes", "memset_async", "probe_for", "stream_handle", "strided_allocator", "view",
]
