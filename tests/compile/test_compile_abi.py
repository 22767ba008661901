"""The C ABI of a built library, without a GPU: the sizes of both argument structs agree with
Python's, a stale handle is refused before CUDA is touched, and a launch without a device is a
clear LaunchError (not a crash)."""

import ctypes

import pytest

import evtc
from evtc import bf16
from evtc.runtime.launch import STALE, KernelLibrary

pytestmark = pytest.mark.compile


@pytest.fixture(scope="module")
def library():
    import epilogues as E

    g = evtc.Gemm(E.REFERENCE["bias_relu"], a=bf16, b=bf16, d=bf16, plan="evtc")  # shared with test_compile_sm90
    g.build(family=False)
    return g, g.library


def test_struct_sizes_and_info(library):
    g, lib = library
    assert lib.info["call_size"] == lib.call_layout.size == lib.lib.evtc_call_size()
    assert lib.info["args_size"] == ctypes.sizeof(lib.Args)
    assert lib.call_layout.pointers == ("p_A", "p_B", "p_C", "p_bias", "p_D")


def test_stale_handle_is_refused_without_touching_cuda(library):
    g, lib = library
    buf = ctypes.create_string_buffer(lib.call_layout.size)
    lib.call_layout.packer.pack_into(buf, 0, (7 << 16) | 5, 0, 0, 0, 1 << 20, 2 << 20, 3 << 20, 4 << 20, 5 << 20, 1.0, 1.0)
    assert lib.lib.evtc_launch(ctypes.addressof(buf)) == STALE
    assert "stale handle" in lib.lib.evtc_last_error().decode()


def test_prepare_without_a_device_is_a_launch_error(library):
    from devices import HAS_GPU

    if HAS_GPU:
        pytest.skip("a GPU is present")
    g, lib = library
    args = lib.Args()
    args.M = args.N = args.K = args.L = 64
    with pytest.raises(evtc.LaunchError, match="CUDA error"):
        lib.prepare(args, 0, "bias_relu")


def test_a_call_reaches_the_library_and_fails_cleanly_without_a_device(library, monkeypatch):
    """Gemm.__call__ through the real library, with stand-ins for torch tensors (bf16 has no
    __cuda_array_interface__ typestr): the call is checked, packed and prepared, and without a
    GPU evtc_prepare's CUDA error is a LaunchError (no crash)."""
    import sys
    import types

    from devices import HAS_GPU

    if HAS_GPU:
        pytest.skip("a GPU is present")
    g, lib = library
    if "torch" not in sys.modules:
        try:
            import torch  # noqa: F401
        except ImportError:  # bytes_allocator only names these until a workspace is needed
            monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(
                device=lambda *a: None, empty=None, empty_strided=None, uint8=None, _C=None))

    class DType:
        def __init__(self, name):
            self.name = name

        def __str__(self):
            return f"torch.{self.name}"

    class Tensor:  # what evtc reads of a torch tensor
        __module__ = "torch.standin"
        _next = 1 << 32

        def __init__(self, shape, dtype="bfloat16"):
            Tensor._next += 1 << 30
            self.shape, self.dtype, self._ptr = tuple(shape), DType(dtype), Tensor._next
            self.device = types.SimpleNamespace(type="cuda", index=0)

        def data_ptr(self):
            return self._ptr

        def stride(self):
            out, acc = [], 1
            for s in reversed(self.shape):
                out.append(acc)
                acc *= s
            return tuple(reversed(out))

        def get_device(self):
            return 0

    A, B, C, D = Tensor((64, 32)), Tensor((48, 32)), Tensor((64, 48)), Tensor((64, 48))
    bias = Tensor((48,), "float32")
    with pytest.raises(evtc.LaunchError, match="CUDA error"):
        g(A, B, C=C, alpha=1.0, beta=0.5, bias=bias, out=D, stream=0)
    with pytest.raises(evtc.ArgumentError, match="argument 'alpha'"):
        g(A, B, C=C, alpha=1e40, beta=0.5, bias=bias, out=D, stream=0)


def test_the_row_copy_kernel_is_exported_and_fails_cleanly_without_a_device(library):
    """NOTE [Copy kernels for staging]: every sm90 GEMM library exports evtc_copy_rows; without a
    GPU it reports a CUDA error (status 5) instead of crashing."""
    import ctypes

    _, lib = library
    fn = lib.lib.evtc_copy_rows
    assert fn.restype is ctypes.c_int and len(fn.argtypes) == 12  # bound by KernelLibrary
    assert fn(16, 8, 0, 32, 7, 0, 1, 2, 7, 2, None, 0) == 5
    assert "CUDA error" in lib._error()
