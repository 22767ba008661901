"""Reading tensors from any framework into one small view.

Input: torch or cupy tensors, or anything with ``__cuda_array_interface__`` or ``__dlpack__``.
Output: :class:`TensorView` (pointer, shape, strides in elements, dtype, device), checked, and
for the per-call fast path a cheap key per tensor (:func:`probe_for`). Allocation and streams
are :mod:`evtc.runtime.device`; :mod:`evtc.runtime.tensors` is the one import path of both.

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
import operator
import re
import sys
from collections.abc import Mapping
from typing import Any

from evtc import dtypes
from evtc.dtypes import DType
from evtc.errors import ArgumentError

__all__ = ["ADDRESS_LIMIT", "CAI_VERSIONS", "DLPACK_READ_ONLY", "INT64_LIMIT", "KDL_CUDA", "TensorView", "cai_probe",
           "contiguous_strides", "probe_for", "view"]

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


def _complaints(name: str, epilogue: str | None, protocol: str, default_hint: str):
    """``(bad, malformed)``: the ArgumentError makers of a reader; ``bad(what)`` names the
    argument, ``malformed(what)`` also says that its ``protocol`` description is malformed."""

    def bad(what: str, hint: str | None = None) -> ArgumentError:
        return ArgumentError(f"argument '{name}' {what}", epilogue=epilogue, hint=hint)

    def malformed(what: str, hint: str | None = None) -> ArgumentError:
        return bad(f"{protocol}: {what}", hint or default_hint)

    return bad, malformed


def _cai_view(obj, name: str = "out", epilogue: str | None = None) -> TensorView:
    """The view of a ``__cuda_array_interface__`` (NOTE [Reading foreign tensors])."""
    bad, malformed = _complaints(
        name, epilogue, "has a malformed __cuda_array_interface__",
        "its producer exports a description that the CUDA Array Interface (v3) does not allow; pass a torch or cupy "
        "tensor")
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
    order, kind, itemsize = _cai_typestr(cai, typestr, bad, malformed)
    data = cai["data"]
    if not isinstance(data, (tuple, list)) or len(data) != 2:
        raise malformed(f"data {data!r} is not a 2-tuple (pointer, read-only flag)")
    ptr, readonly = _int(data[0]), data[1]
    if ptr is None:
        raise malformed(f"data[0] is {data[0]!r}, a {type(data[0]).__name__}, not an int pointer")
    if not isinstance(readonly, bool):
        raise malformed(f"data[1] (the read-only flag) is {readonly!r}, a {type(readonly).__name__}, not a bool")
    shape = _ints(cai["shape"], "shape", malformed)
    strides, byte_strides = _cai_strides(cai, shape, itemsize, typestr, bad, malformed)
    _check_layout(ptr, shape, byte_strides, itemsize, "data[0]", bad, malformed)
    _check_cai_stream(cai.get("stream"), malformed)
    device = 0
    try:  # cupy arrays know their device; others default to the current one
        device = int(obj.device.id)
    except Exception:
        pass
    fw = "cupy" if type(obj).__module__.startswith("cupy") else "other"
    dt = _TYPESTR.get(f"<{kind}{itemsize}") if order in "<|" else None
    return TensorView(obj, ptr, shape, strides, dt, typestr, device, fw, readonly)


def _cai_typestr(cai: Mapping, typestr: Any, bad, malformed) -> tuple[str, str, int]:
    """(byte order, kind, item size) of a CAI ``typestr``, checked with its ``descr``."""
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
    return order, kind, itemsize


def _cai_strides(cai: Mapping, shape: tuple[int, ...], itemsize: int, typestr: str, bad,
                 malformed) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(strides in elements, strides in bytes) of a CAI tensor: C-contiguous without ``strides``."""
    if cai.get("strides") is None:  # C-contiguous
        strides = contiguous_strides(shape)
        return strides, tuple(s * itemsize for s in strides)
    byte_strides = _ints(cai["strides"], "strides", malformed)
    if len(byte_strides) != len(shape):
        raise malformed(f"strides {byte_strides} have {len(byte_strides)} entries for the {len(shape)}-D "
                        f"shape {shape}")
    if any(st % itemsize for st in byte_strides):
        raise bad(f"has strides of {byte_strides} bytes, not whole multiples of its {itemsize}-byte items "
                  f"(typestr {typestr!r}): evtc addresses whole elements",
                  hint="pass a copy with element strides (e.g. cupy.ascontiguousarray(x))")
    return tuple(st // itemsize for st in byte_strides), byte_strides


def _check_cai_stream(stream: Any, malformed) -> None:
    """A v3 ``stream``: None or a nonzero handle (NOTE [Reading foreign tensors])."""
    if stream is None:
        return
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
    bad, malformed = _complaints(name, epilogue, "is a malformed DLPack tensor", "pass a torch or cupy tensor")
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
