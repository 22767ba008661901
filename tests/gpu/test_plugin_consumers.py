"""The plugin API's two outside consumers on the GPU: the hand-written CUTLASS GEMM of
examples/hopper_gemm (bias_relu; gelu_aux_colsum with an aux store and a column reduction) and
the GEMM cutlass_library generates with evtc's many_aux fragment as its epilogue (an aux load in
the C slot, two aux stores sharing aux-load buffers). Fresh random data, NaN-poisoned outputs
and every element within its bound of the float64 reference (evtc.testing, NOTE [The error
bound]); ragged M, N not a multiple of the tile, batched and unbatched."""

import ctypes
import types
import zlib

import pytest

import evtc
from evtc.testing import Problem, check_outputs, failure_report, make_inputs, poisoned_outputs
from plugin_build import build_cutlass_library_example, build_hopper_example, examples_dir

pytestmark = pytest.mark.gpu

# M anything; N and K multiples of 8 (16-byte rows: CUTLASS's can_implement for TMA); none a
# multiple of the 128 x 128 / 128 x 256 tiles except where the small cases make it so
SHAPES = [(333, 392, 264, 1), (77, 136, 64, 2), (1000, 1048, 1024, 3), (2048, 2048, 512, 1)]


@pytest.fixture(scope="module")
def hopper(tmp_path_factory):
    lib_path, frags = build_hopper_example(examples_dir(tmp_path_factory.getbasetemp() / "plugin-examples"))
    return ctypes.CDLL(str(lib_path)), frags


@pytest.fixture(scope="module")
def cutlass_library(tmp_path_factory):
    lib_path, frag, gen = build_cutlass_library_example(examples_dir(tmp_path_factory.getbasetemp() / "plugin-examples"))
    return ctypes.CDLL(str(lib_path)), frag, gen


def mn(t):
    """(pointer, row stride, batch stride) of an (M, N) or (L, M, N) tensor, in elements."""
    return t.data_ptr(), t.stride(-2), (t.stride(0) if t.dim() == 3 else 0)


def vec(t):
    """(pointer, batch stride) of an (N,) or (L, N) vector."""
    return t.data_ptr(), (t.stride(0) if t.dim() == 2 else 0)


def run_and_check(frag, shape, call, record_errors, what):
    import torch

    M, N, K, L = shape
    p = Problem(M, N, K, L)
    seed = zlib.crc32(f"{what}{shape}".encode())
    ins = make_inputs(frag.graph, evtc.bf16, evtc.bf16, p, seed=seed)
    outs = poisoned_outputs(frag.graph, p)
    status = call(p, ins, outs, torch.cuda.current_stream().cuda_stream)
    torch.cuda.synchronize()
    assert status == 0, f"{what}: the C ABI returned {status}"
    results = check_outputs(types.SimpleNamespace(graph=frag.graph, a=evtc.bf16), ins, outs)
    record_errors(results, shape)
    assert all(r.ok for r in results.values()), failure_report(results, f"{what} {shape}", frag.graph)
    return ins, outs


def operands(p, ins):
    A, B = ins["A"], ins["B"]
    return [p.M, p.N, p.K, p.L, *mn(A), *mn(B)]


I64, F32, PTR, INT = ctypes.c_int64, ctypes.c_float, ctypes.c_void_p, ctypes.c_int


def _argtypes(fn, types_):
    fn.argtypes = types_
    fn.restype = ctypes.c_int
    return fn


def bias_relu_call(lib):
    """A call of hopper_bias_relu on make_inputs' and poisoned_outputs' tensors."""
    fn = _argtypes(lib.hopper_bias_relu, [INT] * 4 + [PTR, I64, I64] * 2 + [PTR, I64, I64, PTR, I64, I64, PTR, I64,
                                                                           F32, F32, PTR])

    def call(p, ins, outs, stream):
        return fn(*operands(p, ins), *mn(ins["C"]), *mn(outs["D"]), *vec(ins["bias"]), ins["alpha"], ins["beta"],
                  stream)

    return call


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_hopper_gemm_bias_relu(hopper, shape, record_errors):
    lib, frags = hopper
    run_and_check(frags["bias_relu_fragment.h"], shape, bias_relu_call(lib), record_errors, "hopper bias_relu")


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_hopper_gemm_gelu_aux_colsum(hopper, shape, record_errors):
    lib, frags = hopper
    frag = frags["gelu_aux_colsum_fragment.h"]
    fn = _argtypes(lib.hopper_gelu_aux_colsum, [INT] * 4 + [PTR, I64, I64] * 2 + [PTR, I64, I64] * 2 +
                   [PTR, I64, PTR, I64, PTR])

    def call(p, ins, outs, stream):
        return fn(*operands(p, ins), *mn(outs["D"]), *mn(outs["F"]), *vec(ins["bias"]), *vec(outs["col_sum"]),
                  stream)

    run_and_check(frag, shape, call, record_errors, "hopper gelu_aux_colsum")


CTYPES = {"int32_t": ctypes.c_int32, "int64_t": ctypes.c_int64, "float": ctypes.c_float, "const void*": ctypes.c_void_p,
          "void*": ctypes.c_void_p}


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_cutlass_library_gemm_many_aux(cutlass_library, shape, record_errors):
    lib, frag, gen = cutlass_library
    fields = gen.abi_fields(frag)
    Args = type("cl_gemm_args_t", (ctypes.Structure,), {"_fields_": [(n, CTYPES[t]) for n, t in fields]})
    lib.cl_gemm_run.argtypes = [ctypes.POINTER(Args), ctypes.c_void_p]
    lib.cl_gemm_run.restype = ctypes.c_int
    assert frag.c_input == "X"  # the plan loads aux load X through the C slot

    def call(p, ins, outs, stream):
        a = Args(M=p.M, N=p.N, K=p.K, L=p.L)
        a.p_A, a.ld_A, a.bs_A = mn(ins["A"])
        a.p_B, a.ld_B, a.bs_B = mn(ins["B"])
        values = {**ins, **outs}
        for ph in frag.placeholders:
            t = values[ph.tensor]
            if ph.what == "value":
                setattr(a, ph.name, float(t))
            elif ph.what == "ptr":
                setattr(a, ph.name, t.data_ptr())
            elif ph.what == "ld":
                setattr(a, ph.name, t.stride(-2))
            else:  # batch stride: of the batch dimension when there is one
                batched = t.dim() == len(frag.parameter(ph.tensor).shape)
                setattr(a, ph.name, t.stride(0) if batched else 0)
        return lib.cl_gemm_run(ctypes.byref(a), stream)

    run_and_check(frag, shape, call, record_errors, "cutlass_library many_aux")


def test_results_depend_on_the_inputs(hopper, record_errors):
    """Two seeds give two different D's, each its own reference's (not a constant or stale
    result)."""
    import torch

    lib, frags = hopper
    frag = frags["bias_relu_fragment.h"]
    got = [run_and_check(frag, (256, 256, 128, 1), bias_relu_call(lib), record_errors, f"seed {k}")[1]["D"]
           for k in range(2)]
    assert not torch.equal(got[0], got[1])
