"""The tensor readers refuse what they can't address (issue 37, NOTE [Reading foreign tensors] in
evtc/runtime/tensors.py): every malformed ``__cuda_array_interface__`` or DLPack tensor is an
ArgumentError naming the argument, never a silently wrong view or another exception; a read-only
tensor is never an output. No GPU: the tensors are dicts and ctypes structs at made-up addresses."""

import ctypes
import sys

import numpy as np
import pytest

import evtc
from evtc import f16, f32
from evtc.abi import abi_fields, conv_abi_fields, ctypes_struct
from evtc.errors import ArgumentError
from evtc.runtime import tensors
from evtc.runtime.bind import Binder
from evtc.runtime.conv_bind import ConvBinder
from fakecuda import FakeCuda
from test_runtime_launch import Fake, launcher, lin_args
from test_runtime_launch import lin as lin32

PTR = 1 << 32


class Arr:
    """An object whose ``__cuda_array_interface__`` is exactly ``cai``."""

    def __init__(self, cai):
        self.__cuda_array_interface__ = cai


def cai(**over):
    """A valid v3 description of a (4, 8) f32 array (32-byte rows), with ``over`` replacing fields
    (``drop=...`` removes one)."""
    d = {"shape": (4, 8), "typestr": "<f4", "data": (PTR, False), "strides": (32, 4), "version": 3}
    d.pop(over.pop("drop", None), None)
    d.update(over)
    return d


@evtc.epilogue
def lin(acc, C, alpha: float):
    return alpha * acc + C


def binder_for(ep):
    g = evtc.Gemm(ep, a=f16, b=f16, c=f32, d=f32)
    return Binder(g.graph, f16, f16, ctypes_struct(abi_fields(g.graph, g.arch)))


def ok_args(M=4, N=8, K=16):
    """A, B and lin's arguments: C is a (4, 8) f32 CAI."""
    return FakeCuda((M, K)), FakeCuda((N, K)), {"C": Arr(cai()), "alpha": 1.0}


def readonly(d=None):
    """An object with ``d`` (a valid one by default) marked read-only."""
    d = d or cai()
    return Arr(dict(d, data=(d["data"][0], True)))


# ---- hostile descriptions: each is an ArgumentError that names the argument -------------------------

HOSTILE = [
    # strides: bytes that are not whole elements, wrong length, wrong types, beyond int64
    ("stride not a multiple of the item size", cai(strides=(30, 4)), "not whole multiples of its 4-byte items"),
    ("inner stride of 2 bytes over f32", cai(strides=(32, 2)), "not whole multiples"),
    ("negative stride not a multiple", cai(strides=(-30, 4)), "not whole multiples"),
    ("strides shorter than the shape", cai(strides=(32,)), "strides (32,) have 1 entries for the 2-D shape"),
    ("strides longer than the shape", cai(strides=(128, 32, 4)), "have 3 entries"),
    ("strides not a tuple", cai(strides="32,4"), "strides is a str"),
    ("float stride", cai(strides=(32.0, 4)), "holds 32.0, a float"),
    ("bool stride", cai(typestr="|u1", strides=(8, True)), "holds True, a bool"),
    ("stride beyond int64", cai(strides=(1 << 63, 4)), "a stride beyond int64"),
    # the pointer
    ("negative pointer", cai(data=(-4096, False)), "is not an address"),
    ("pointer 2^64", cai(data=(1 << 64, False)), "is not an address"),
    ("pointer beyond 2^64", cai(data=(1 << 80, False)), "is not an address"),
    ("null pointer with elements", cai(data=(0, False)), "is a null pointer with shape (4, 8)"),
    ("bool pointer", cai(data=(True, False)), "data[0] is True, a bool"),
    ("float pointer", cai(data=(float(PTR), False)), "a float, not an int pointer"),
    ("str pointer", cai(data=(str(PTR), False)), "a str, not an int pointer"),
    ("data not a pair", cai(data=(PTR,)), "is not a 2-tuple"),
    ("data not a tuple", cai(data=PTR), "is not a 2-tuple"),
    ("read-only flag not a bool", cai(data=(PTR, None)), "data[1] (the read-only flag) is None"),
    ("read-only flag an int", cai(data=(PTR, 1)), "the read-only flag) is 1, a int"),
    # the shape
    ("float extent", cai(shape=(4.0, 8)), "holds 4.0, a float"),
    ("str extent", cai(shape=("4", 8)), "holds '4', a str"),
    ("bool extent", cai(shape=(True, 8), strides=None), "holds True, a bool"),
    ("negative extent", cai(shape=(-1, 8)), "has a negative extent"),
    ("shape not a tuple", cai(shape=4), "shape is a int"),
    ("extent beyond int64", cai(shape=(1 << 63, 8), strides=None), "an extent beyond int64"),
    # byte extents past the address space
    ("huge shape overflows 2^64", cai(shape=(1 << 62, 8), strides=None), "outside the 64-bit address space"),
    ("huge stride overflows 2^64", cai(shape=(5, 8), strides=((1 << 62) + 32, 4)), "outside the 64-bit"),
    ("high pointer overflows 2^64", cai(data=((1 << 64) - 64, False)), "outside the 64-bit address space"),
    ("negative stride below address 0", cai(shape=(4,), strides=(-4,), data=(8, False)), "outside the 64-bit"),
    # version
    ("version str", cai(version="3"), "version '3' is not one of the ints"),
    ("version float", cai(version=3.0), "version 3.0"),
    ("version bool", cai(version=True), "version True"),
    ("version None", cai(version=None), "version None"),
    ("version 4", cai(version=4), "version 4"),
    ("version -1", cai(version=-1), "version -1"),
    ("no version", cai(drop="version"), "it has no 'version'"),
    ("no shape", cai(drop="shape"), "it has no 'shape'"),
    ("no data", cai(drop="data"), "it has no 'data'"),
    # typestr
    ("typestr without byte order", cai(typestr="f4"), "typestr 'f4' is not a NumPy type string"),
    ("typestr without size", cai(typestr="<f"), "typestr '<f' is not a NumPy type string"),
    ("typestr unknown kind", cai(typestr="<x4"), "typestr '<x4' is not a NumPy type string"),
    ("typestr not a str", cai(typestr=4), "typestr 4 is not a NumPy type string"),
    ("typestr with trailing text", cai(typestr="<f4 "), "is not a NumPy type string"),
    ("typestr of 0 bytes", cai(typestr="<V0", strides=None), "items of 0 bytes"),
    ("big-endian f4", cai(typestr=">f4"), "is big-endian (typestr '>f4')"),
    ("big-endian f2", cai(typestr=">f2", strides=None), "is big-endian"),
    ("no byte order for f4", cai(typestr="|f4"), "has no byte order"),
    ("descr of a structured type", cai(descr=[("re", "<f2"), ("im", "<f2")]), "not its typestr '<f4'"),
    ("descr of another type", cai(descr=[("", "<f2")]), "descr [('', '<f2')]"),
    # masked arrays, streams, the dict itself
    ("mask", cai(mask=Arr(cai(typestr="|b1", strides=None))), "is a masked array"),
    ("stream 0", cai(stream=0), "stream is 0, which the interface disallows"),
    ("stream str", cai(stream="1"), "stream '1' is a str"),
    ("stream bool", cai(stream=True), "stream True is a bool"),
    ("stream negative", cai(stream=-1), "stream -1 is not a stream handle"),
    ("not a dict", [("shape", (4, 8))], "it is a list, not a dict"),
]


@pytest.mark.parametrize("d, needle", [pytest.param(d, n, id=i) for i, d, n in HOSTILE])
def test_hostile_cuda_array_interfaces_are_argument_errors(d, needle):
    with pytest.raises(ArgumentError) as ei:  # anything else (or nothing) fails the test
        tensors.view(Arr(d), "C", "lin")
    msg = str(ei.value)
    assert msg.startswith("argument 'C' ") and needle in msg, msg
    assert "in epilogue 'lin'" in msg


@pytest.mark.parametrize("d, needle", [pytest.param(d, n, id=i) for i, d, n in HOSTILE])
def test_hostile_cuda_array_interfaces_through_the_binder(d, needle):
    """The same descriptions, as C and as the output, through a Gemm's argument checks."""
    b = binder_for(lin)
    A, B, kw = ok_args()
    with pytest.raises(ArgumentError) as ei:
        b.bind(A, B, {**kw, "C": Arr(d)}, {"D": FakeCuda((4, 8), typestr="<f4")})
    assert "argument 'C' " in str(ei.value) and needle in str(ei.value), str(ei.value)
    with pytest.raises(ArgumentError) as ei:
        b.bind(A, B, kw, {"D": Arr(d)})
    assert "argument 'out['D']' " in str(ei.value) and needle in str(ei.value), str(ei.value)


def test_the_protocols_own_failures_name_the_argument():
    class Raises:
        @property
        def __cuda_array_interface__(self):
            raise RuntimeError("device gone")

    with pytest.raises(ArgumentError, match="argument 'C' could not be read as a tensor: device gone"):
        tensors.view(Raises(), "C")


# ---- read-only tensors: read, never written --------------------------------------------------------


def test_read_only_tensor_is_an_input_not_an_output():
    v = tensors.view(readonly(), "C")
    assert v.readonly and v.strides == (8, 1) and v.dtype is f32
    with pytest.raises(ArgumentError) as ei:
        tensors.view(readonly(), "out['D']", "lin", writable=True)
    msg = str(ei.value)
    assert "argument 'out['D']' is read-only" in msg and "evtc writes it" in msg and "in epilogue 'lin'" in msg
    assert not tensors.view(Arr(cai()), "out['D']", writable=True).readonly
    own = tensors.view(readonly(), "C")  # a view evtc made (a Conv's route) keeps the flag
    with pytest.raises(ArgumentError, match="argument 'out\\['D'\\]' is read-only"):
        tensors.view(own, "out['D']", writable=True)


def test_binder_refuses_a_read_only_output_and_in_place_target():
    b = binder_for(lin)
    A, B, kw = ok_args()
    b.bind(A, B, {**kw, "C": readonly()}, {"D": FakeCuda((4, 8), typestr="<f4")})  # read-only input: fine
    with pytest.raises(ArgumentError, match=r"argument 'out\['D'\]' is read-only"):
        b.bind(A, B, kw, {"D": readonly()})
    C = readonly()
    with pytest.raises(ArgumentError, match=r"argument 'out\['D'\]' is read-only"):  # in place, D = C
        b.bind(A, B, {**kw, "C": C}, C)


def test_conv_binder_refuses_a_read_only_output():
    @evtc.epilogue
    def scale(acc, alpha: float):
        return alpha * acc

    conv = evtc.Conv(scale, kind="fprop", dims=2, a=f16, c=f16, d=f16)
    sp = evtc.ConvProblem().normalize(2)
    b = ConvBinder(conv.graph, f16, f16, ctypes_struct(conv_abi_fields(conv.graph)), kind="fprop", dims=2,
                   layout="nhwc", spec=sp, arch="sm90", tile=conv.config.tile)
    x, w = FakeCuda((2, 8, 8, 16)), FakeCuda((32, 1, 1, 16))
    y = FakeCuda((2, 8, 8, 32)).__cuda_array_interface__
    b.signature(x, w, {"alpha": 1.0}, Arr(dict(y, strides=None)))
    with pytest.raises(ArgumentError, match=r"argument 'out\['D'\]' is read-only"):
        b.signature(x, w, {"alpha": 1.0}, readonly(dict(y, strides=None)))


# ---- the launch path's cache: a checked key never vouches for a worse tensor ------------------------

def test_fast_path_refuses_what_the_full_path_refuses():
    run, lib, g = launcher(lin32)
    A, B, kw = lin_args()
    D = Fake((64, 32))
    run(A, B, kw, D)  # the signature of this layout is cached now
    C = kw["C"].__cuda_array_interface__
    for bad, needle in [
        (dict(C, data=(-(1 << 32), False)), "is not an address"),
        (dict(C, data=(1 << 64, False)), "is not an address"),
        (dict(C, data=(float(C["data"][0]), False)), "not an int pointer"),
        (dict(C, mask=Arr(dict(C, typestr="|b1"))), "is a masked array"),
    ]:
        with pytest.raises(ArgumentError) as ei:
            run(A, B, {**kw, "C": Arr(bad)}, D)
        assert "argument 'C' " in str(ei.value) and needle in str(ei.value), str(ei.value)
    Dc = D.__cuda_array_interface__
    with pytest.raises(ArgumentError, match=r"argument 'out\['D'\]' is read-only"):
        run(A, B, kw, Arr(dict(Dc, data=(Dc["data"][0], True))))
    assert len(lib.calls) == 1
    run(A, B, {**kw, "C": readonly(C)}, D)  # a read-only input is fine, and now cached too
    assert len(lib.calls) == 2


# ---- what stays accepted ---------------------------------------------------------------------------


@pytest.mark.parametrize("d, strides, dtype", [
    pytest.param(cai(strides=None), (8, 1), f32, id="strides None is C-contiguous"),
    pytest.param(cai(strides=None, version=2), (8, 1), f32, id="torch (v2, strides None)"),
    pytest.param(cai(descr=[("", "<f4")], stream=1), (8, 1), f32, id="cupy-like (descr, legacy stream)"),
    pytest.param(cai(stream=2), (8, 1), f32, id="per-thread stream"),
    pytest.param(cai(stream=0x7F0012345678), (8, 1), f32, id="a stream handle"),
    pytest.param(cai(stream=None, version=0), (8, 1), f32, id="version 0"),
    pytest.param(cai(strides=[64, 4], shape=[4, 8]), (16, 1), f32, id="lists, padded rows"),
    pytest.param(cai(shape=(np.int64(4), np.int32(8)), data=(np.uint64(PTR), False), strides=(np.int64(32), 4)),
                 (8, 1), f32, id="numpy ints"),
    pytest.param(cai(typestr="<f2", strides=(16, 2)), (8, 1), f16, id="f16"),
    pytest.param(cai(typestr="=f2", strides=None), (8, 1), f16 if sys.byteorder == "little" else None,
                 id="native byte order"),
    pytest.param(cai(strides=(-32, 4), data=(PTR + 96, False)), (-8, 1), f32, id="negative strides in elements"),
    pytest.param(cai(shape=(0, 8), data=(0, False)), (8, 1), f32, id="no elements at 0"),
    pytest.param(cai(shape=(0, 1 << 40), data=(0, False), strides=None), (1 << 40, 1), f32, id="empty but wide"),
    pytest.param(cai(shape=(), strides=None), (), f32, id="0-d"),
    pytest.param(cai(typestr="<i4"), (8, 1), None, id="a dtype evtc lacks: None, for the binder"),
    pytest.param(cai(typestr="|u1", strides=(8, 1)), (8, 1), None, id="one-byte type, no byte order"),
    pytest.param(cai(typestr=">u1", strides=(8, 1)), (8, 1), None, id="one-byte type, big-endian is moot"),
    pytest.param(cai(data=((1 << 64) - 128, False)), (8, 1), f32, id="the highest pointer that fits"),
])
def test_valid_descriptions_are_read(d, strides, dtype):
    v = tensors.view(Arr(d), "C")
    assert v.strides == strides and v.dtype is dtype and v.ptr == int(d["data"][0])
    assert v.shape == tuple(int(s) for s in d["shape"]) and not v.readonly
    assert all(type(x) is int for x in (v.ptr, *v.shape, *v.strides))


def test_typestrs_evtc_lacks_are_refused_by_the_binder_naming_the_argument():
    b = binder_for(lin)
    A, B, kw = ok_args()
    for typestr in ("<i4", "<f8", "|b1"):
        with pytest.raises(ArgumentError, match=f"argument 'C' has dtype \\{typestr[0]}{typestr[1:]}"):
            b.bind(A, B, {**kw, "C": Arr(cai(typestr=typestr, strides=None))}, {"D": FakeCuda((4, 8), typestr="<f4")})


def test_negative_strides_are_read_and_refused_by_the_binder():
    b = binder_for(lin)
    A, B, kw = ok_args()
    with pytest.raises(ArgumentError, match="argument 'C' has a negative stride"):
        b.bind(A, B, {**kw, "C": Arr(cai(strides=(-32, 4), data=(PTR + 96, False)))},
               {"D": FakeCuda((4, 8), typestr="<f4")})


# ---- DLPack ----------------------------------------------------------------------------------------


def test_numpy_read_only_arrays_through_dlpack():
    """numpy >= 2.1 exports DLPack 1.0 capsules, whose flags say read-only."""
    a = np.zeros((4, 8), np.float32)
    v = tensors.view(a, "C")
    assert (v.shape, v.strides, v.dtype, v.device, v.readonly) == ((4, 8), (8, 1), f32, -1, False)
    a.flags.writeable = False
    assert tensors.view(a, "C").readonly
    with pytest.raises(ArgumentError, match=r"argument 'out\['D'\]' is read-only"):
        tensors.view(a, "out['D']", writable=True)
    t = np.zeros((4, 8), np.float32)[:, ::2]  # strides in elements, read back as such
    assert tensors.view(t, "C").strides == (8, 2)


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


class DLDevice(ctypes.Structure):  # dlpack.h, written out here so the producer doesn't borrow the reader's
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32), ("dtype", DLDataType),
                ("shape", ctypes.POINTER(ctypes.c_int64)), ("strides", ctypes.POINTER(ctypes.c_int64)),
                ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    _fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", ctypes.c_void_p)]


class DLManagedTensorVersioned(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32), ("manager_ctx", ctypes.c_void_p),
                ("deleter", ctypes.c_void_p), ("flags", ctypes.c_uint64), ("dl_tensor", DLTensor)]


class DL:
    """A DLPack producer of a device tensor described field by field (nothing is allocated).

    ``versioned``: answers ``__dlpack__(max_version=...)`` with a DLPack 1.0 capsule (``major`` its
    version, ``flags`` its flags); else a legacy producer that takes no ``max_version``."""

    def __init__(self, shape=(4, 8), strides=None, data=PTR, byte_offset=0, code=2, bits=32, lanes=1,
                 ndim=None, device=(2, 0), versioned=True, flags=0, major=1):
        n = len(shape)
        self.shape = (ctypes.c_int64 * max(n, 1))(*shape)
        self.strides = None if strides is None else (ctypes.c_int64 * max(n, 1))(*strides)
        t = DLTensor(data, DLDevice(*device), n if ndim is None else ndim, DLDataType(code, bits, lanes),
                     ctypes.cast(self.shape, ctypes.POINTER(ctypes.c_int64)),
                     None if self.strides is None else ctypes.cast(self.strides, ctypes.POINTER(ctypes.c_int64)),
                     byte_offset)
        if versioned:
            self.managed = DLManagedTensorVersioned(major, 0, None, None, flags, t)
            self.name = b"dltensor_versioned"
        else:
            self.managed = DLManagedTensor(t, None, None)
            self.name = b"dltensor"
        self.versioned = versioned

    def __dlpack__(self, **kw):
        if kw and not self.versioned:
            raise TypeError("__dlpack__() got an unexpected keyword argument 'max_version'")
        return _PyCapsule_New(ctypes.addressof(self.managed), self.name, None)


@pytest.mark.parametrize("versioned", [True, False])
def test_dlpack_tensors_are_read(versioned):
    v = tensors.view(DL(versioned=versioned), "C")
    assert (v.ptr, v.shape, v.strides, v.dtype, v.device, v.readonly) == (PTR, (4, 8), (8, 1), f32, 0, False)
    v = tensors.view(DL(strides=(16, 1), byte_offset=64, versioned=versioned), "C")  # strides in elements
    assert (v.ptr, v.strides) == (PTR + 64, (16, 1))
    assert tensors.view(DL(shape=(0, 8), data=None, versioned=versioned), "C").shape == (0, 8)
    assert tensors.view(DL(flags=1), "C").readonly


DL_HOSTILE = [
    ("read-only output", dict(flags=1), "is read-only"),
    ("vector lanes", dict(lanes=2), "has a vector element type (2 lanes of 32 bits)"),
    ("negative ndim", dict(ndim=-1), "is a malformed DLPack tensor: ndim is -1"),
    ("huge ndim", dict(ndim=1 << 20), "ndim is 1048576"),
    ("null data with elements", dict(data=None), "is a null pointer with shape (4, 8)"),
    ("null data with an offset", dict(data=None, byte_offset=4096), "is a null pointer"),
    ("offset past 2^64", dict(data=(1 << 64) - 64, byte_offset=128), "is not an address"),
    ("extent past 2^64", dict(data=(1 << 64) - 64), "outside the 64-bit address space"),
    ("negative extent", dict(shape=(-1, 8)), "has a negative extent"),
    ("stride beyond int64 in bytes", dict(strides=((1 << 62) + 1, 1)), "a stride beyond int64"),
    ("0-bit type", dict(bits=0), "0 bits"),
    ("DLPack 2", dict(major=2), "is a DLPack 2.0 tensor"),
]


@pytest.mark.parametrize("kw, needle, versioned", [
    pytest.param(k, n, v, id=f"{i}, {'1.0' if v else 'legacy'}") for i, k, n in DL_HOSTILE for v in (True, False)
    if v or not ("flags" in k or "major" in k)])  # a legacy capsule has no flags and no version
def test_hostile_dlpack_tensors_are_argument_errors(kw, needle, versioned):
    with pytest.raises(ArgumentError) as ei:
        tensors.view(DL(**kw, versioned=versioned), "out['D']", "lin", writable=True)
    msg = str(ei.value)
    assert msg.startswith("argument 'out['D']' ") and needle in msg, msg


def test_a_dlpack_capsule_of_another_kind_is_refused():
    class Odd:
        def __dlpack__(self, **kw):
            return _PyCapsule_New(PTR, b"something_else", None)

    with pytest.raises(ArgumentError, match="argument 'C' has a __dlpack__\\(\\) that returned a PyCapsule"):
        tensors.view(Odd(), "C")
