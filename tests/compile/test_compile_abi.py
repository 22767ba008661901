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
    g.build()
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
    from conftest import HAS_GPU

    if HAS_GPU:
        pytest.skip("a GPU is present")
    g, lib = library
    args = lib.Args()
    args.M = args.N = args.K = args.L = 64
    with pytest.raises(evtc.LaunchError, match="CUDA error"):
        lib.prepare(args, 0, "bias_relu")
