"""Argument checking before launch (no GPU needed: fake device tensors through
__cuda_array_interface__). Every error names the argument."""

import pytest

import evtc
from evtc import f16, f32
from evtc.abi import abi_fields, ctypes_struct
from evtc.runtime.bind import Binder
from fakecuda import FakeCuda


def binder_for(ep):
    g = evtc.Gemm(ep, a=f16, b=f16, c=f16, d=f16)
    return Binder(g.graph, f16, f16, ctypes_struct(abi_fields(g.graph, g.arch)))


@evtc.epilogue
def lin(acc, C, alpha: float, bias: evtc.RowVector[evtc.f16]):
    return alpha * acc + C + bias


def ok_args(M=64, N=32, K=16):
    return FakeCuda((M, K)), FakeCuda((N, K)), {"C": FakeCuda((M, N)), "alpha": 1.0, "bias": FakeCuda((N,))}


def test_good_arguments_fill_the_struct():
    b = binder_for(lin)
    A, B, kw = ok_args()
    out = {"D": FakeCuda((64, 32), ptr=1 << 24)}
    args, outs, keep, va = b.bind(A, B, kw, out)
    assert (args.M, args.N, args.K, args.L) == (64, 32, 16, 1)
    assert args.ld_A == 16 and args.ld_C == 32 and args.s_alpha == 1.0 and args.p_D == 1 << 24


@pytest.mark.parametrize("mutate, needle", [
    (lambda kw: kw.pop("C"), "missing argument 'C'"),
    (lambda kw: kw.update(extra=1.0), "unexpected argument 'extra'"),
    (lambda kw: kw.update(C=FakeCuda((64, 31))), "argument 'C' has shape (64, 31)"),
    (lambda kw: kw.update(C=FakeCuda((64, 32), typestr="<f4")), "argument 'C' has dtype <f4"),
    (lambda kw: kw.update(C=FakeCuda((64, 32), ptr=(1 << 40) + 2)), "argument 'C' starts at an address"),
    (lambda kw: kw.update(C=FakeCuda((64, 20), strides=(40, 2))), "has shape (64, 20)"),
    (lambda kw: kw.update(C=FakeCuda((64, 32), device=1)), "argument 'C' is in cuda:1"),
    (lambda kw: kw.update(alpha=FakeCuda(())), "argument 'alpha' must be a Python number"),
    (lambda kw: kw.update(bias=FakeCuda((33,))), "argument 'bias' has shape (33,)"),
])
def test_bad_epilogue_arguments(mutate, needle):
    b = binder_for(lin)
    A, B, kw = ok_args()
    mutate(kw)
    with pytest.raises(evtc.ArgumentError) as ei:
        b.bind(A, B, kw, {"D": FakeCuda((64, 32))})
    assert needle in str(ei.value), str(ei.value)
    assert "in epilogue 'lin'" in str(ei.value)


def test_unaligned_row_stride_suggests_padding():
    b = binder_for(lin)
    A, B, kw = ok_args(N=30)
    kw["C"] = FakeCuda((64, 30))  # 60-byte rows
    kw["bias"] = FakeCuda((30,))
    with pytest.raises(evtc.ArgumentError) as ei:
        b.bind(A, B, kw, {"D": FakeCuda((64, 30), strides=(64, 2))})
    msg = str(ei.value)
    assert "row stride of 60 bytes" in msg and "[..., :30]" in msg and "32)" in msg


def test_operand_shape_mismatch():
    b = binder_for(lin)
    A, B, kw = ok_args()
    with pytest.raises(evtc.ArgumentError, match="K extents differ"):
        b.bind(A, FakeCuda((32, 8)), kw, {"D": FakeCuda((64, 32))})


def test_host_tensor_and_non_tensor():
    b = binder_for(lin)
    A, B, kw = ok_args()
    kw["C"] = [[1.0]]
    with pytest.raises(evtc.ArgumentError, match="argument 'C' is a list, not a device tensor"):
        b.bind(A, B, kw, {"D": FakeCuda((64, 32))})


def test_batched_outputs_need_batch_dimension():
    b = binder_for(lin)
    A, B, kw = FakeCuda((2, 64, 16)), FakeCuda((2, 32, 16)), {"C": FakeCuda((64, 32)), "alpha": 1.0, "bias": FakeCuda((32,))}
    with pytest.raises(evtc.ArgumentError, match=r"out\['D'\]' has shape \(64, 32\), expected \(2, 64, 32\)"):
        b.bind(A, B, kw, {"D": FakeCuda((64, 32))})
    args, *_ = b.bind(A, B, kw, {"D": FakeCuda((2, 64, 32))})
    assert args.L == 2 and args.bs_C == 0 and args.bs_D == 64 * 32


def test_tile_order_is_a_runtime_scheduler_argument():
    """sm90's swizzle and raster order travel in the argument struct; the source doesn't change."""
    a = evtc.Gemm(lin, a=f16, b=f16, c=f16, d=f16)
    b = evtc.Gemm(lin, a=f16, b=f16, c=f16, d=f16, config=evtc.GemmConfig(swizzle=1, raster="along_m"))
    assert a.source == b.source
    A, B, kw = ok_args()
    out = {"D": FakeCuda((64, 32), ptr=1 << 24)}
    args, *_ = b.dispatch.family.primary_binder().bind(A, B, kw, out)
    assert (args.max_swizzle_size, args.raster_order) == (2, 1)
    args, *_ = a.dispatch.family.primary_binder().bind(A, B, kw, out)
    assert (args.max_swizzle_size, args.raster_order) == (8, 0)  # sm90 cooperative default: 8 tiles, heuristic raster
    pp = evtc.Gemm(lin, a=f16, b=f16, config=evtc.GemmConfig(tile=(128, 192, 64), schedule="pingpong"))
    assert pp.config.swizzle == 0  # ping-pong keeps CUTLASS's one-tile default
    assert "max_swizzle_size" not in {f.name for f in abi_fields(a.graph, "sm80")}


@pytest.mark.parametrize("config, needle", [
    (dict(swizzle=4), "swizzle = 4"),
    (dict(raster="along_k"), "raster 'along_k'"),
])
def test_bad_tile_order(config, needle):
    with pytest.raises(evtc.ConfigError, match=needle):
        evtc.Gemm(lin, a=f16, b=f16, config=evtc.GemmConfig(**config))


def test_raster_order_is_sm90_only():
    with pytest.raises(evtc.ConfigError, match="sm80's threadblock swizzle has no raster order"):
        evtc.Gemm(lin, a=f16, b=f16, arch="sm80", config=evtc.GemmConfig(tile=(128, 128, 32), stages=4,
                                                                           raster="along_m"))
