"""Tensors from any framework, seen through one small view, and allocation like them.

Input: torch or cupy tensors, or anything with ``__cuda_array_interface__`` or ``__dlpack__``.
Output: :class:`TensorView` (pointer, shape, strides in elements, dtype, device).

evtc never imports torch: a torch tensor is recognised by its type's module and read through
its own methods (``data_ptr``, ``stride``, ``dtype``, ``device``), which covers the dtypes the
other protocols can't describe (bf16 has no ``__cuda_array_interface__`` typestr; older DLPack
exporters refuse fp8). Other objects go through ``__cuda_array_interface__`` (v2/v3) and then
DLPack (a legacy ``dltensor`` capsule, read with ctypes and left unconsumed).
"""

from __future__ import annotations

import ctypes
import dataclasses
import sys
from typing import Any

from evtc import dtypes
from evtc.dtypes import DType
from evtc.errors import ArgumentError

KDL_CUDA = 2


@dataclasses.dataclass(frozen=True)
class TensorView:
    """What evtc needs to know about a tensor.

    Attributes:
        obj: the original object (kept alive while the view is used).
        ptr: address of element (0, ..., 0).
        shape: extents.
        strides: strides in elements.
        dtype: the evtc dtype, or None if evtc doesn't handle the tensor's type.
        dtype_name: the framework's name for the type (for messages).
        device: the CUDA device ordinal, or -1 for host memory.
        framework: ``torch``, ``cupy`` or ``other``.
    """

    obj: Any
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: DType | None
    dtype_name: str
    device: int
    framework: str


def _torch_view(t) -> TensorView:
    name = str(t.dtype).replace("torch.", "")
    try:
        dt = dtypes.by_name(name)
    except KeyError:
        dt = None
    dev = t.device
    return TensorView(t, int(t.data_ptr()), tuple(t.shape), tuple(t.stride()), dt, name,
                      dev.index if dev.type == "cuda" else -1, "torch")


_TYPESTR = {"<f4": dtypes.f32, "<f2": dtypes.f16}


def _cai_view(obj) -> TensorView:
    cai = obj.__cuda_array_interface__
    shape = tuple(int(s) for s in cai["shape"])
    typestr = cai["typestr"]
    itemsize = int(typestr[2:])
    if cai.get("strides") is None:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    else:
        strides = tuple(int(s) // itemsize for s in cai["strides"])
    device = 0
    try:  # cupy arrays know their device; others default to the current one
        device = int(obj.device.id)
    except Exception:
        pass
    fw = "cupy" if type(obj).__module__.startswith("cupy") else "other"
    return TensorView(obj, int(cai["data"][0]), shape, strides, _TYPESTR.get(typestr), typestr, device, fw)


class _DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class _DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class _DLTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p), ("device", _DLDevice), ("ndim", ctypes.c_int32), ("dtype", _DLDataType),
        ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
        ("byte_offset", ctypes.c_uint64),
    ]


def _dlpack_view(obj) -> TensorView:
    capsule = obj.__dlpack__()
    get_ptr = ctypes.pythonapi.PyCapsule_GetPointer
    get_ptr.restype = ctypes.c_void_p
    get_ptr.argtypes = [ctypes.py_object, ctypes.c_char_p]
    addr = get_ptr(capsule, b"dltensor")
    t = ctypes.cast(addr, ctypes.POINTER(_DLTensor)).contents  # DLManagedTensor starts with DLTensor
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:
        strides = tuple(t.strides[i] for i in range(t.ndim))
    else:
        strides, acc = [], 1
        for s in reversed(shape):
            strides.append(acc)
            acc *= s
        strides = tuple(reversed(strides))
    dt = dtypes.from_dlpack(t.dtype.code, t.dtype.bits)
    device = t.device.device_id if t.device.device_type == KDL_CUDA else -1
    ptr = (t.data or 0) + t.byte_offset
    return TensorView(obj, ptr, shape, strides, dt, f"dlpack({t.dtype.code},{t.dtype.bits})", device, "other")


def view(obj: Any, name: str, epilogue: str | None = None) -> TensorView:
    """A :class:`TensorView` of ``obj``.

    Raises:
        ArgumentError: ``obj`` is not a tensor evtc can read; the message names the argument.
    """
    mod = type(obj).__module__
    try:
        if mod.startswith("torch") and hasattr(obj, "data_ptr"):
            return _torch_view(obj)
        if hasattr(obj, "__cuda_array_interface__"):
            return _cai_view(obj)
        if hasattr(obj, "__dlpack__"):
            return _dlpack_view(obj)
    except ArgumentError:
        raise
    except Exception as e:  # a protocol that failed: say which argument
        raise ArgumentError(f"argument '{name}' could not be read as a tensor: {e}", epilogue=epilogue) from None
    raise ArgumentError(
        f"argument '{name}' is a {type(obj).__name__}, not a device tensor",
        epilogue=epilogue,
        hint="pass a CUDA tensor (torch, cupy, or anything with __cuda_array_interface__ or __dlpack__)",
    )


# ---- allocation ---------------------------------------------------------------------------------


def empty(like: TensorView, shape: tuple[int, ...], dtype: DType, *, pad_last_to_bytes: int = 16) -> tuple[Any, TensorView]:
    """Allocate an uninitialised tensor with the framework and device of ``like``.

    The last dimension's storage is padded so each row starts at a multiple of
    ``pad_last_to_bytes`` bytes (TMA needs 16-byte row strides); the returned object is a view
    of exactly ``shape``.

    Raises:
        ArgumentError: ``like`` comes from a framework evtc can't allocate with; pass ``out=``.
    """
    per = max(1, pad_last_to_bytes // max(1, dtype.bytes))
    padded = shape[:-1] + (((shape[-1] + per - 1) // per) * per,)
    if like.framework == "torch":
        torch = sys.modules["torch"]
        tdt = getattr(torch, dtype.torch)
        buf = torch.empty(padded, dtype=tdt, device=f"cuda:{like.device}")
        obj = buf[..., : shape[-1]]
        return obj, _torch_view(obj)
    if like.framework == "cupy":
        cupy = sys.modules["cupy"]
        if dtype.torch not in ("float32", "float16"):
            raise ArgumentError(f"cupy has no {dtype} arrays", hint="pass out= tensors, or use torch")
        with cupy.cuda.Device(like.device):
            buf = cupy.empty(padded, dtype=dtype.torch)
        obj = buf[..., : shape[-1]]
        return obj, _cai_view(obj)
    raise ArgumentError("evtc can only allocate outputs with torch or cupy",
                        hint="pass preallocated outputs with out={'name': tensor, ...}")


def empty_bytes(like: TensorView, nbytes: int) -> tuple[Any, int]:
    """A device buffer of ``nbytes`` bytes (for the kernel's workspace): (object, address)."""
    if nbytes == 0:
        return None, 0
    if like.framework == "torch":
        torch = sys.modules["torch"]
        buf = torch.empty((nbytes,), dtype=torch.uint8, device=f"cuda:{like.device}")
        return buf, int(buf.data_ptr())
    if like.framework == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(like.device):
            buf = cupy.empty((nbytes,), dtype="uint8")
        return buf, int(buf.data.ptr)
    from cuda.bindings import runtime as cudart  # type: ignore[import-not-found]

    err, ptr = cudart.cudaMalloc(nbytes)
    if int(err) != 0:
        raise ArgumentError(f"cudaMalloc({nbytes}) for the workspace failed: {err}")
    return _CudaFree(ptr), int(ptr)


class _CudaFree:
    def __init__(self, ptr) -> None:
        self.ptr = ptr

    def __del__(self) -> None:
        try:
            from cuda.bindings import runtime as cudart  # type: ignore[import-not-found]

            cudart.cudaFree(self.ptr)
        except Exception:
            pass


def current_stream(like: TensorView) -> int:
    """The caller's current CUDA stream for ``like``'s framework and device (0 otherwise)."""
    if like.framework == "torch":
        torch = sys.modules["torch"]
        return int(torch.cuda.current_stream(like.device).cuda_stream)
    if like.framework == "cupy":
        cupy = sys.modules["cupy"]
        return int(cupy.cuda.get_current_stream().ptr)
    return 0


def stream_handle(stream: Any) -> int:
    """A raw ``cudaStream_t`` from an int, a torch/cupy stream or anything with ``cuda_stream``/``ptr``."""
    if stream is None:
        return 0
    if isinstance(stream, int):
        return stream
    for attr in ("cuda_stream", "ptr", "handle"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    raise ArgumentError(f"can't use {stream!r} as a CUDA stream", hint="pass an int handle or a torch/cupy stream")
