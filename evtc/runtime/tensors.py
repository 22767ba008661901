"""Tensors from any framework, seen through one small view, and allocation like them.

Input: torch or cupy tensors, or anything with ``__cuda_array_interface__`` or ``__dlpack__``.
Output: :class:`TensorView` (pointer, shape, strides in elements, dtype, device).

evtc never imports torch: a torch tensor is recognised by its type's module and read through
its own methods (``data_ptr``, ``stride``, ``dtype``, ``device``), which covers the dtypes the
other protocols can't describe (bf16 has no ``__cuda_array_interface__`` typestr; older DLPack
exporters refuse fp8). Other objects go through ``__cuda_array_interface__`` (v0 to v3) and then
DLPack (a ``dltensor_versioned`` capsule where the producer makes one, else a legacy ``dltensor``
capsule, read with ctypes and left unconsumed).

# NOTE [Reading foreign tensors]
A ``__cuda_array_interface__`` dict (v0-v3, numba's spec) or a DLPack tensor is checked in full
before evtc trusts it, since what it says is what the kernel will address: every field has its
type (ints are ints, not bools or floats), ``0 <= ptr < 2^64``, ``ptr == 0`` only without
elements, ``strides`` as long as ``shape`` and (CAI, in bytes) whole multiples of the item size
(evtc addresses elements: a stride of 6 bytes over 4-byte floats can't be floored to 1), every
extent and stride within int64, and every byte the tensor spans below 2^64. ``mask`` (masked
arrays) is refused; a typestr must be little-endian (the GPU's order); a well-formed typestr
evtc has no dtype for (``<i4``) gives ``dtype`` None, which the binders refuse naming the dtype
they expected. A read-only tensor (CAI ``data[1]``, DLPack's ``DLPACK_FLAG_BITMASK_READ_ONLY``)
may be read, never written: :func:`view` with ``writable=True`` (the binders' outputs) refuses
it. Negative strides are read (in elements) and left to the binders, which refuse them for
tensors with elements. A v3 ``stream`` must be None or a nonzero int (0 is ambiguous, the spec
disallows it); evtc does not synchronise on it (it launches on the caller's current stream).
"""

from __future__ import annotations

import ctypes
import dataclasses
import functools
import operator
import re
import sys
from collections.abc import Mapping
from typing import Any

from evtc import dtypes
from evtc.dtypes import DType
from evtc.errors import ArgumentError

KDL_CUDA = 2
#: addresses, and the end of every byte a tensor spans, are below this
ADDRESS_LIMIT = 1 << 64
#: extents and strides are int64 in CUTLASS's layouts and the kernel's arguments
INT64_LIMIT = 1 << 63
#: the ``__cuda_array_interface__`` versions evtc reads (numba's spec, v3 the current one)
CAI_VERSIONS = (0, 1, 2, 3)
#: DLPack's ``DLPACK_FLAG_BITMASK_READ_ONLY`` (dlpack.h, v1.0)
DLPACK_READ_ONLY = 1


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
        readonly: the producer marked the tensor read-only (evtc may read it, never write it).
    """

    obj: Any
    ptr: int
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: DType | None
    dtype_name: str
    device: int
    framework: str
    readonly: bool = False


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
#: NumPy's type strings: byte order, kind, item size in bytes (``<f2``, ``|u1``)
_TYPESTR_FORM = re.compile(r"([<>|=])([tbiufcmMOSUV])([0-9]+)")
#: DLPack tensors deeper than this are refused before their shape is read (NumPy's own limit)
_MAX_NDIM = 64


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """C-order strides, in elements, of ``shape``: a contiguous tensor's, as torch gives them (an
    extent of 0 counts as 1, so a tensor with no elements still has the strides torch reports).

    Example::

        >>> contiguous_strides((2, 3, 4))
        (12, 4, 1)
    """
    out, want = [], 1
    for extent in reversed(shape):
        out.append(want)
        want *= max(extent, 1)
    return tuple(reversed(out))


def _int(x: Any) -> int | None:
    """``x`` if it is an integer (``int``, ``numpy.int64``: anything with ``__index__``) and not a
    bool, else None."""
    if isinstance(x, bool):
        return None
    try:
        return operator.index(x)
    except TypeError:
        return None


def _ints(x: Any, what: str, malformed) -> tuple[int, ...]:
    if not isinstance(x, (tuple, list)):
        raise malformed(f"{what} is a {type(x).__name__}, not a tuple of ints")
    out = []
    for e in x:
        i = _int(e)
        if i is None:
            raise malformed(f"{what} {tuple(x)!r} holds {e!r}, a {type(e).__name__}, not an int")
        out.append(i)
    return tuple(out)


def _check_layout(ptr: int, shape: tuple[int, ...], byte_strides: tuple[int, ...], itemsize: int,
                  where: str, bad, malformed) -> None:
    """The address and extent rules of NOTE [Reading foreign tensors], shared by both protocols:
    ``byte_strides`` are in bytes, ``where`` names the pointer's field for messages."""
    for s in shape:
        if s < 0:
            raise malformed(f"shape {shape} has a negative extent")
        if s >= INT64_LIMIT:
            raise bad(f"has shape {shape}: an extent beyond int64", hint="split the tensor")
    if len(byte_strides) != len(shape):
        raise malformed(f"strides {byte_strides} have {len(byte_strides)} entries for the {len(shape)}-D shape {shape}")
    for st in byte_strides:
        if not -INT64_LIMIT <= st < INT64_LIMIT:
            raise bad(f"has strides of {byte_strides} bytes: a stride beyond int64")
    if not 0 <= ptr < ADDRESS_LIMIT:
        raise malformed(f"the pointer {where} = {ptr:#x} is not an address (0 <= pointer < 2^64)")
    if 0 in shape:
        return  # no elements: nothing is addressed (the pointer may be 0)
    if ptr == 0:
        raise bad(f"is a null pointer with shape {shape} ({where} is 0, allowed only without elements)",
                  hint="pass an allocated tensor")
    lo = sum((s - 1) * st for s, st in zip(shape, byte_strides) if st < 0)
    hi = sum((s - 1) * st for s, st in zip(shape, byte_strides) if st > 0) + itemsize
    if ptr + lo < 0 or ptr + hi > ADDRESS_LIMIT:
        raise malformed(f"shape {shape} with strides of {byte_strides} bytes from {ptr:#x} spans bytes "
                        f"[{ptr + lo:#x}, {ptr + hi:#x}), outside the 64-bit address space")


def _cai_view(obj, name: str = "out", epilogue: str | None = None) -> TensorView:
    """The view of a ``__cuda_array_interface__`` (NOTE [Reading foreign tensors])."""

    def bad(what: str, hint: str | None = None) -> ArgumentError:
        return ArgumentError(f"argument '{name}' {what}", epilogue=epilogue, hint=hint)

    def malformed(what: str, hint: str | None = None) -> ArgumentError:
        return bad(f"has a malformed __cuda_array_interface__: {what}",
                   hint or "its producer exports a description that the CUDA Array Interface (v3) does not allow; "
                           "pass a torch or cupy tensor")

    cai = obj.__cuda_array_interface__
    if not isinstance(cai, Mapping):
        raise malformed(f"it is a {type(cai).__name__}, not a dict")
    missing = [k for k in ("shape", "typestr", "data", "version") if k not in cai]
    if missing:
        raise malformed(f"it has no {', '.join(map(repr, missing))} (required in every version)")
    if _int(cai["version"]) not in CAI_VERSIONS:
        raise malformed(f"version {cai['version']!r} is not one of the ints {', '.join(map(str, CAI_VERSIONS))}, "
                        "the versions evtc reads")
    if cai.get("mask") is not None:
        raise bad("is a masked array (its __cuda_array_interface__ has a mask): evtc reads and writes every element",
                  hint="pass an array without a mask (fill the masked elements first)")
    typestr = cai["typestr"]
    form = _TYPESTR_FORM.fullmatch(typestr) if isinstance(typestr, str) else None
    if form is None:
        raise malformed(f"typestr {typestr!r} is not a NumPy type string such as '<f2'")
    order, kind, itemsize = form.group(1), form.group(2), int(form.group(3))
    if itemsize == 0:
        raise malformed(f"typestr {typestr!r} has items of 0 bytes")
    if order == "=":  # native: the host's order
        order = "<" if sys.byteorder == "little" else ">"
    if itemsize > 1 and order == ">":
        raise bad(f"is big-endian (typestr {typestr!r}): CUDA devices and evtc's kernels read little-endian data",
                  hint="pass little-endian data (a '<' typestr), e.g. a byte-swapped copy")
    if itemsize > 1 and order == "|" and kind in "biufcmM":
        raise malformed(f"typestr {typestr!r} has no byte order ('|') for a {itemsize}-byte number")
    descr = cai.get("descr")
    if descr is not None and not (isinstance(descr, (list, tuple)) and len(descr) == 1 and
                                  isinstance(descr[0], (list, tuple)) and len(descr[0]) == 2 and
                                  descr[0][1] == typestr):
        raise bad(f"has a __cuda_array_interface__ descr {descr!r} that is not its typestr {typestr!r}: "
                  "evtc reads arrays of one plain element type, not structured ones",
                  hint="pass an array of plain elements")
    data = cai["data"]
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise malformed(f"data {data!r} is not a 2-tuple (pointer, read-only flag)")
    ptr, readonly = _int(data[0]), data[1]
    if ptr is None:
        raise malformed(f"data[0] is {data[0]!r}, a {type(data[0]).__name__}, not an int pointer")
    if not isinstance(readonly, bool):
        raise malformed(f"data[1] (the read-only flag) is {readonly!r}, a {type(readonly).__name__}, not a bool")
    shape = _ints(cai["shape"], "shape", malformed)
    if cai.get("strides") is None:  # C-contiguous
        strides = contiguous_strides(shape)
        byte_strides = tuple(s * itemsize for s in strides)
    else:
        byte_strides = _ints(cai["strides"], "strides", malformed)
        if len(byte_strides) != len(shape):
            raise malformed(f"strides {byte_strides} have {len(byte_strides)} entries for the {len(shape)}-D "
                            f"shape {shape}")
        if any(st % itemsize for st in byte_strides):
            raise bad(f"has strides of {byte_strides} bytes, not whole multiples of its {itemsize}-byte items "
                      f"(typestr {typestr!r}): evtc addresses whole elements",
                      hint="pass a copy with element strides (e.g. cupy.ascontiguousarray(x))")
        strides = tuple(st // itemsize for st in byte_strides)
    _check_layout(ptr, shape, byte_strides, itemsize, "data[0]", bad, malformed)
    stream = cai.get("stream")
    if stream is not None:
        handle = _int(stream)
        if handle is None:
            raise malformed(f"stream {stream!r} is a {type(stream).__name__}, not an int or None")
        if handle == 0:
            raise malformed("stream is 0, which the interface disallows (it is ambiguous between the legacy and "
                            "the per-thread default stream)",
                            hint="its producer should export 1 (legacy default), 2 (per-thread default), "
                                 "a stream handle, or None")
        if not 0 < handle < ADDRESS_LIMIT:
            raise malformed(f"stream {handle} is not a stream handle")
    device = 0
    try:  # cupy arrays know their device; others default to the current one
        device = int(obj.device.id)
    except Exception:
        pass
    fw = "cupy" if type(obj).__module__.startswith("cupy") else "other"
    dt = _TYPESTR.get(f"<{kind}{itemsize}") if order in "<|" else None
    return TensorView(obj, ptr, shape, strides, dt, typestr, device, fw, readonly)


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


class _DLPackVersion(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _DLManagedTensorVersioned(ctypes.Structure):
    # dlpack.h v1.0: the versioned capsule ("dltensor_versioned") carries the read-only flag
    _fields_ = [("version", _DLPackVersion), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p),
                ("flags", ctypes.c_uint64), ("dl_tensor", _DLTensor)]


def _capsule_pointer(capsule, name: bytes) -> int | None:
    """The pointer in a PyCapsule named ``name``, or None if ``capsule`` is not one."""
    api = ctypes.pythonapi
    api.PyCapsule_IsValid.restype = ctypes.c_int
    api.PyCapsule_IsValid.argtypes = [ctypes.py_object, ctypes.c_char_p]
    if not api.PyCapsule_IsValid(capsule, name):
        return None
    api.PyCapsule_GetPointer.restype = ctypes.c_void_p
    api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
    return api.PyCapsule_GetPointer(capsule, name)


def _dlpack_view(obj, name: str = "out", epilogue: str | None = None) -> TensorView:
    """The view of a DLPack tensor (NOTE [Reading foreign tensors]): a versioned capsule where the
    producer makes one (DLPack 1.0: it says whether the tensor is read-only), else a legacy one."""

    def bad(what: str, hint: str | None = None) -> ArgumentError:
        return ArgumentError(f"argument '{name}' {what}", epilogue=epilogue, hint=hint)

    def malformed(what: str, hint: str | None = None) -> ArgumentError:
        return bad(f"is a malformed DLPack tensor: {what}", hint or "pass a torch or cupy tensor")

    try:
        capsule = obj.__dlpack__(max_version=(1, 0))
    except TypeError:  # a producer older than DLPack 1.0's protocol
        capsule = obj.__dlpack__()
    flags = 0
    addr = _capsule_pointer(capsule, b"dltensor_versioned")
    if addr:
        managed = ctypes.cast(addr, ctypes.POINTER(_DLManagedTensorVersioned)).contents
        if managed.version.major != 1:
            raise bad(f"is a DLPack {managed.version.major}.{managed.version.minor} tensor; evtc reads DLPack 0.x "
                      "and 1.x", hint="pass a torch or cupy tensor")
        flags, t = managed.flags, managed.dl_tensor
    else:
        addr = _capsule_pointer(capsule, b"dltensor")
        if not addr:
            raise bad(f"has a __dlpack__() that returned a {type(capsule).__name__}, not a DLPack capsule")
        t = ctypes.cast(addr, ctypes.POINTER(_DLTensor)).contents  # DLManagedTensor starts with DLTensor
    if not 0 <= t.ndim <= _MAX_NDIM:
        raise malformed(f"ndim is {t.ndim} (evtc reads 0 to {_MAX_NDIM} dimensions)")
    if t.ndim and not t.shape:
        raise malformed(f"a NULL shape for {t.ndim} dimensions")
    code, bits, lanes = t.dtype.code, t.dtype.bits, t.dtype.lanes
    if lanes != 1:
        raise bad(f"has a vector element type ({lanes} lanes of {bits} bits): evtc reads one value per element",
                  hint="pass a tensor of scalar elements")
    if bits == 0:
        raise malformed("its element type has 0 bits")
    itemsize = (bits + 7) // 8
    shape = tuple(t.shape[i] for i in range(t.ndim))
    if t.strides:  # in elements
        strides = tuple(t.strides[i] for i in range(t.ndim))
    else:  # NULL strides: C-contiguous (DLPack)
        strides = contiguous_strides(tuple(max(s, 0) for s in shape))
    base = t.data or 0
    ptr = base + t.byte_offset if base else 0
    _check_layout(ptr, shape, tuple(st * itemsize for st in strides), itemsize, "data + byte_offset", bad, malformed)
    dt = dtypes.from_dlpack(code, bits)
    device = t.device.device_id if t.device.device_type == KDL_CUDA else -1
    return TensorView(obj, ptr, shape, strides, dt, f"dlpack({code},{bits})", device, "other",
                      bool(flags & DLPACK_READ_ONLY))


def view(obj: Any, name: str, epilogue: str | None = None, *, writable: bool = False) -> TensorView:
    """A :class:`TensorView` of ``obj``, checked (NOTE [Reading foreign tensors]).

    Args:
        obj: a torch tensor, an object with ``__cuda_array_interface__`` or ``__dlpack__``, or a
            :class:`TensorView`.
        name: the argument, as messages name it (``C``, ``out['D']``).
        epilogue: the epilogue's name, for messages.
        writable: evtc will write the tensor (an output, or an in-place target): a read-only one
            is refused.

    Returns:
        The view (pointer, shape, strides in elements, dtype, device).

    Raises:
        ArgumentError: ``obj`` is not a tensor evtc can read, its description is malformed, or
            it is read-only and ``writable`` is set; the message names the argument.

    Example::

        >>> class Arr:  # strides in bytes, as the interface gives them
        ...     __cuda_array_interface__ = {"shape": (2, 3), "typestr": "<f4", "data": (1 << 20, False),
        ...                                 "strides": (16, 4), "version": 3}
        >>> view(Arr(), "C").strides
        (4, 1)
    """
    if type(obj) is TensorView:  # a view evtc made itself (a Conv's GEMM operands)
        v = obj
    else:
        v = _read(obj, name, epilogue)
    if writable and v.readonly:
        raise ArgumentError(f"argument '{name}' is read-only (its producer says so), and evtc writes it",
                            epilogue=epilogue, hint="pass a writable tensor, or leave it out and evtc allocates it")
    return v


def _read(obj: Any, name: str, epilogue: str | None) -> TensorView:
    mod = type(obj).__module__
    try:
        if mod.startswith("torch") and hasattr(obj, "data_ptr"):
            return _torch_view(obj)
        if hasattr(obj, "__cuda_array_interface__"):
            return _cai_view(obj, name, epilogue)
        if hasattr(obj, "__dlpack__"):
            return _dlpack_view(obj, name, epilogue)
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


# ---- the per-call fast path: one cheap key per tensor -------------------------------------------


def _torch_probe(t) -> tuple[tuple, int]:
    # Everything a TensorView holds but the pointer; get_device() is -1 for host memory.
    return (t.shape, t.stride(), t.dtype, t.get_device()), t.data_ptr()


def _view_probe(v: TensorView) -> tuple[tuple, int]:
    return (v.shape, v.strides, v.dtype_name, v.device, v.framework), v.ptr


def cai_probe(obj) -> tuple[tuple, int]:
    # The key holds the fields as given (so a key equal to a checked one describes the same
    # tensor) and the read-only flag (a read-only output never finds a writable one's signature).
    # What the key can't vouch for sends the call to the full path, whose view() names the
    # problem: a mask, a pointer that is not an int in (0, 2^64) (0 included: a tensor without
    # elements is rare, one with elements is refused).
    cai = obj.__cuda_array_interface__
    ptr, readonly = cai["data"]
    if type(ptr) is not int or not 0 < ptr < ADDRESS_LIMIT or cai.get("mask") is not None:
        raise ValueError("not for the fast path")
    device = getattr(getattr(obj, "device", None), "id", 0)
    return (tuple(cai["shape"]), cai.get("strides"), cai["typestr"], device, readonly), ptr


_PROBES: dict[type, Any] = {TensorView: _view_probe}


def probe_for(cls: type):
    """The fast prober of tensors of type ``cls``: ``probe(x) -> (key, pointer)``, where ``key``
    determines everything :func:`view` returns but the pointer (shape, strides, dtype, device),
    so a cached check of one key holds for every tensor with that key. None for types without
    one (DLPack-only objects): their calls take the full path."""
    try:
        return _PROBES[cls]
    except KeyError:
        pass
    if cls.__module__.startswith("torch") and hasattr(cls, "data_ptr"):
        probe = _torch_probe
    elif hasattr(cls, "__cuda_array_interface__"):
        probe = cai_probe
    else:
        probe = None
    _PROBES[cls] = probe
    return probe


# ---- streams ------------------------------------------------------------------------------------

#: Raw handles accepted as ints: the legacy default stream (0), ``cudaStreamLegacy`` (1) and
#: ``cudaStreamPerThread`` (2), which the CUDA runtime defines as constants. Any other int is
#: refused: the driver dereferences a stream handle without validating it (a bogus one crashes
#: the process), and no driver query fails cleanly on one.
SPECIAL_STREAMS = (0, 1, 2)


def current_stream_getter(framework: str):
    """``get(device) -> int``: the framework's current raw stream on a device, cheaply (torch:
    ``torch._C._cuda_getCurrentRawStream``; cupy: its current stream; others: 0)."""
    if framework == "torch":
        torch = sys.modules["torch"]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return raw
        return lambda device: int(torch.cuda.current_stream(device).cuda_stream)
    if framework == "cupy":
        cupy = sys.modules["cupy"]

        def get(device: int) -> int:
            with cupy.cuda.Device(device):
                return int(cupy.cuda.get_current_stream().ptr)

        return get
    return lambda device: 0


def current_stream(like: TensorView) -> int:
    """The caller's current CUDA stream for ``like``'s framework and device (0 otherwise)."""
    return current_stream_getter(like.framework)(like.device)


def stream_handle(stream: Any, device: int | None = None, epilogue: str | None = None) -> int:
    """A raw ``cudaStream_t`` from a stream object, checked.

    Accepted: torch streams (``torch.cuda.Stream``, ``torch.cuda.ExternalStream``), cupy streams,
    objects with CUDA Python's ``__cuda_stream__`` protocol or a ``cuda_stream`` attribute,
    ``cuda.bindings`` ``CUstream``/``cudaStream_t`` objects, and the ints 0, 1 and 2
    (:data:`SPECIAL_STREAMS`). A stream object that says its device must be on ``device``.

    Raises:
        ArgumentError: any other int (a raw handle evtc can't validate: wrap it in
            ``torch.cuda.ExternalStream``), a stream on another device, or an object that is not
            a stream; the message names the argument ``stream``.
    """
    def bad(msg: str, hint: str | None = None) -> ArgumentError:
        return ArgumentError(msg, epilogue=epilogue, hint=hint)

    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise bad("argument 'stream' is a bool, not a CUDA stream")
    if isinstance(stream, int):
        if stream in SPECIAL_STREAMS:
            return stream
        raise bad(f"argument 'stream' is the raw handle {stream:#x}: evtc accepts only stream objects and the "
                  "special handles 0, 1 (cudaStreamLegacy) and 2 (cudaStreamPerThread)",
                  hint="pass a torch.cuda.Stream or cupy stream; for a handle you own, torch.cuda.ExternalStream(handle) "
                       "(a bogus raw handle would crash the process inside the CUDA driver)")
    stream_device = None
    cls = type(stream)
    try:
        # the frameworks' own attributes first: they also say the stream's device
        if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream / ExternalStream
            handle = int(stream.cuda_stream)
            stream_device = getattr(stream, "device_index", None)
        elif cls.__module__.startswith("cupy") and hasattr(stream, "ptr"):
            handle = int(stream.ptr)
            stream_device = getattr(stream, "device_id", None)
        elif hasattr(stream, "__cuda_stream__"):  # CUDA Python's stream protocol: (version, handle)
            handle = int(stream.__cuda_stream__()[1])
        elif cls.__module__.startswith("cuda.") and cls.__name__ in ("CUstream", "cudaStream_t"):
            handle = int(stream)
        else:
            raise bad(f"argument 'stream' is a {cls.__name__}, not a CUDA stream",
                      hint="pass a torch.cuda.Stream, a cupy stream, or 0 for the default stream")
    except ArgumentError:
        raise
    except Exception as e:
        raise bad(f"argument 'stream' could not be read as a CUDA stream: {e}") from None
    if stream_device is not None and device is not None and int(stream_device) != device:
        raise bad(f"argument 'stream' is a stream of cuda:{stream_device}, the tensors are on cuda:{device}",
                  hint=f"pass a stream of cuda:{device}")
    return handle


# ---- allocation on the fast path ---------------------------------------------------------------


def strided_allocator(framework: str, device: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: DType):
    """``make() -> (object, pointer)``: a new uninitialised tensor of ``shape`` and ``strides``
    (elements) on ``device``, from the framework's allocator (so it is stream-ordered and can be
    captured in a CUDA graph). For torch, one ``torch.empty_strided`` call."""
    if framework == "torch":
        torch = sys.modules["torch"]
        tdt = getattr(torch, dtype.torch)
        dev = torch.device("cuda", device)
        empty_strided = torch.empty_strided

        def make():
            t = empty_strided(shape, strides, dtype=tdt, device=dev)
            return t, t.data_ptr()

        return make
    if framework == "cupy":
        cupy = sys.modules["cupy"]
        if dtype.torch not in ("float32", "float16"):
            raise ArgumentError(f"cupy has no {dtype} arrays", hint="pass out= tensors, or use torch")
        span = 1 + sum((s - 1) * st for s, st in zip(shape, strides)) if all(shape) else 0
        itemsize = dtype.bytes

        def make():
            with cupy.cuda.Device(device):
                mem = cupy.cuda.alloc(max(1, span) * itemsize)
                arr = cupy.ndarray(shape, dtype=dtype.torch, memptr=mem,
                                   strides=tuple(st * itemsize for st in strides))
            return arr, int(arr.data.ptr)

        return make
    raise ArgumentError("evtc can only allocate outputs with torch or cupy",
                        hint="pass preallocated outputs with out={'name': tensor, ...}")


def bytes_allocator(framework: str, device: int):
    """``make(nbytes) -> (object, pointer)``: a device buffer (workspace, scratch) from the
    framework's allocator; other frameworks fall back to ``cudaMalloc`` (which synchronises and
    can't be captured in a CUDA graph)."""
    if framework == "torch":
        torch = sys.modules["torch"]
        dev = torch.device("cuda", device)
        empty, u8 = torch.empty, torch.uint8

        def make(nbytes: int):
            t = empty((nbytes,), dtype=u8, device=dev)
            return t, t.data_ptr()

        return make
    like = TensorView(None, 0, (), (), None, "", device, framework)
    return lambda nbytes: empty_bytes(like, nbytes)


# ---- device memory fills through the driver (rare paths: zero sizes, K = 0) ---------------------


def memset_async(ptr: int, pattern: int, element_bytes: int, count: int, stream: int, device: int) -> None:
    """Fill ``count`` elements of ``element_bytes`` (1, 2 or 4) at ``ptr`` with the bit pattern
    ``pattern`` on ``stream`` (``cuMemsetD{8,16,32}Async``; capturable in a CUDA graph).

    Raises:
        LaunchError: the driver refused.
    """
    from cuda.bindings import driver as cu  # type: ignore[import-not-found]

    from evtc.errors import LaunchError

    def ok(res):
        err = res[0] if isinstance(res, tuple) else res
        if int(err) != 0:
            raise LaunchError(f"CUDA driver error {err} while filling an output")
        return res[1] if isinstance(res, tuple) and len(res) > 1 else None

    if count <= 0:
        return
    try:
        _memset(cu, ok, ptr, pattern, element_bytes, count, stream, device)
    except LaunchError:
        raise
    except Exception as e:  # no driver library, a binding that changed
        raise LaunchError(f"can't fill an output through the CUDA driver: {e}") from None


def _memset(cu, ok, ptr: int, pattern: int, element_bytes: int, count: int, stream: int, device: int) -> None:
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(device))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxPushCurrent(ctx))
    try:
        fn = {1: cu.cuMemsetD8Async, 2: cu.cuMemsetD16Async, 4: cu.cuMemsetD32Async}[element_bytes]
        ok(fn(ptr, pattern, count, stream))
    finally:
        cu.cuCtxPopCurrent()
        cu.cuDevicePrimaryCtxRelease(dev)


@functools.lru_cache(maxsize=None)
def device_name(device: int) -> str:
    """The name of CUDA device ``device`` (``NVIDIA H100 80GB HBM3``), through torch when it is
    loaded, else the CUDA runtime of cuda-python; ``cuda:N`` if neither can tell."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None:
            return str(torch.cuda.get_device_name(device))
        from cuda.bindings import runtime as cudart  # type: ignore[import-not-found]

        err, prop = cudart.cudaGetDeviceProperties(device)
        if int(err) == 0:
            return prop.name.decode(errors="replace").rstrip("\x00")
    except Exception:  # noqa: BLE001 - a name is only a key for the tuner's store
        pass
    return f"cuda:{device}"
