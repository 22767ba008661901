"""evtc.Conv without a GPU: the problem mapping (implicit GEMM), the checks and their errors, the
configuration, the sm90 stage plan, the emitted sources, argument binding on fake device tensors.
"""

import itertools
import math
import re

import pytest

import evtc
from evtc import bf16, f16, f32
from evtc.abi import CONV_FIELDS, conv_abi_fields, ctypes_struct
from evtc.plan.conv import ConvPlan, conv_config, sm90_kernel_smem
from evtc.runtime.conv_bind import ConvBinder
from evtc.runtime.conv_problem import check_arch_limits, geometry, output_extent
from fakecuda import FakeCuda


@evtc.epilogue
def bias_relu(acc, C, alpha: float, beta: float, bias: evtc.RowVector[f32]):
    return evtc.relu(alpha * acc + beta * C + bias)


@evtc.epilogue
def dgelu_bgrad(acc, F: evtc.Matrix):
    D = acc * evtc.gelu_grad(F)
    return {"D": D, "dbias": evtc.sum(D, dim=0)}


@evtc.epilogue
def stats(acc, scale: evtc.ColVector[f32]):
    D = acc * scale
    return {"D": D, "row_max": evtc.max(D, dim=1), "amax": evtc.amax(D)}


def spec(dims=2, **kw):
    return evtc.ConvProblem(**kw).normalize(dims)


# ---- ConvProblem -----------------------------------------------------------------------------------


def test_problem_normalizes_ints_and_tuples():
    s = evtc.ConvProblem(stride=2, padding=(1, 0), dilation=1).normalize(2)
    assert (s.stride, s.padding, s.dilation, s.groups) == ((2, 2), (1, 0), (1, 1), 1)
    s3 = evtc.ConvProblem(stride=(1, 2, 2), input_size=(4, 8, 8)).normalize(3)
    assert s3.stride == (1, 2, 2) and s3.input_size == (4, 8, 8) and not s3.unit_stride
    assert evtc.ConvProblem().normalize(3).unit_stride


@pytest.mark.parametrize("kw, needle", [
    ({"stride": 0}, "stride = (0, 0): each must be at least 1"),
    ({"padding": -1}, "padding = (-1, -1): each must be at least 0"),
    ({"padding": (1, 1, 1)}, "padding = (1, 1, 1) needs 2 ints"),
    ({"dilation": "2"}, "dilation = '2' needs 2 ints"),
    ({"stride": 1.5}, "is not an int or a sequence"),
    ({"groups": 2}, "groups = 2: evtc's convolutions are not grouped"),
    ({"stride": True}, "stride = True"),
])
def test_problem_errors_name_the_field(kw, needle):
    with pytest.raises(evtc.ArgumentError) as ei:
        evtc.ConvProblem(**kw).normalize(2)
    assert needle in str(ei.value) and "conv-problem" in str(ei.value)


# ---- the implicit GEMM ------------------------------------------------------------------------------


def brute_output(i, f, p, s, d):
    """Output positions of a correlation, counted the slow way (torch's definition)."""
    return sum(1 for o in range(i + 2 * p) if o * s + d * (f - 1) < i + 2 * p)


@pytest.mark.parametrize("i, f, p, s, d", list(itertools.product((5, 8, 13), (1, 3, 4), (0, 1, 2), (1, 2, 3), (1, 2))))
def test_output_extent_is_torchs(i, f, p, s, d):
    if d * (f - 1) + 1 > i + 2 * p:
        return
    assert output_extent(i, f, p, s, d) == brute_output(i, f, p, s, d)


def test_fprop_mapping_2d_and_3d():
    g = geometry("fprop", 2, (2, 17, 19, 24), (40, 3, 5, 24), spec(stride=(2, 1), padding=(1, 2), dilation=(1, 2)))
    assert g.out == (output_extent(17, 3, 1, 2, 1), output_extent(19, 5, 2, 1, 2)) == (9, 15)
    assert g.gemm == (2 * 9 * 15, 40, 24 * 3 * 5)
    assert g.shape("y") == (2, 9, 15, 40) and g.output == "y"
    v = g.values()
    assert set(v) == set(CONV_FIELDS)
    assert (v["conv_d"], v["conv_t"], v["conv_z"], v["pad_d"], v["stride_d"], v["dilation_d"]) == (1, 1, 1, 0, 1, 1)
    assert (v["pad_h"], v["pad_w"], v["stride_h"], v["dilation_w"]) == (1, 2, 2, 2)
    g3 = geometry("fprop", 3, (1, 6, 9, 9, 16), (8, 3, 3, 3, 16), spec(3, padding=1))
    assert g3.out == (6, 9, 9) and g3.gemm == (6 * 81, 8, 16 * 27)


def test_dgrad_mapping_infers_or_needs_the_input_size():
    g = geometry("dgrad", 2, (3, 14, 14, 64), (64, 3, 3, 32), spec(padding=1))
    assert g.act == (14, 14) and g.gemm == (3 * 14 * 14, 32, 64 * 9) and g.output == "dx"
    with pytest.raises(evtc.ArgumentError, match=r"can't tell the input's size from dy: inputs of \(55, 55\) to \(56, 56\)"):
        geometry("dgrad", 2, (2, 28, 28, 64), (64, 3, 3, 32), spec(stride=2, padding=1))
    g = geometry("dgrad", 2, (2, 28, 28, 64), (64, 3, 3, 32), spec(stride=2, padding=1, input_size=(56, 55)))
    assert g.act == (56, 55) and g.gemm == (2 * 56 * 55, 32, 64 * 9)
    g = geometry("dgrad", 2, (2, 28, 28, 64), (64, 3, 3, 32), spec(stride=2, padding=1), out_shape=(2, 56, 56, 32))
    assert g.act == (56, 56)
    with pytest.raises(evtc.ArgumentError, match="dy has spatial extents"):
        geometry("dgrad", 2, (2, 28, 28, 64), (64, 3, 3, 32), spec(stride=2, padding=1, input_size=(60, 56)))


def test_wgrad_mapping_infers_or_needs_the_filter_size():
    g = geometry("wgrad", 2, (2, 8, 8, 64), (2, 8, 8, 32), spec(padding=1))
    assert g.flt == (3, 3) and g.gemm == (64, 9 * 32, 2 * 64) and g.output == "dw"
    with pytest.raises(evtc.ArgumentError, match="wgrad can't tell the filter's size"):
        geometry("wgrad", 2, (2, 28, 28, 64), (2, 56, 56, 32), spec(stride=2, padding=1))
    g = geometry("wgrad", 2, (2, 28, 28, 64), (2, 56, 56, 32), spec(stride=2, padding=1, filter_size=(3, 3)))
    assert g.flt == (3, 3) and g.gemm == (64, 288, 2 * 28 * 28)
    g = geometry("wgrad", 3, (1, 4, 8, 8, 16), (1, 4, 8, 8, 8), spec(3, padding=(0, 1, 1)),
                 out_shape=(16, 1, 3, 3, 8))
    assert g.flt == (1, 3, 3) and g.gemm == (16, 72, 256)


@pytest.mark.parametrize("kind, a, b, needle", [
    ("fprop", (2, 8, 8, 16), (8, 3, 3, 24), "x has 16 channels and w 24"),
    ("dgrad", (2, 8, 8, 16), (24, 3, 3, 8), "dy has 16 channels and w has 24 filters"),
    ("wgrad", (2, 8, 8, 16), (3, 8, 8, 8), "dy has batch 2 and x has batch 3"),
    ("fprop", (2, 2, 2, 16), (8, 5, 5, 16), "is larger than the padded input"),
    ("fprop", (2, 8, 8, 8), (8, 3, 3), "has 3 dimensions; a 2-D convolution takes 4-D tensors"),
])
def test_mismatched_operands(kind, a, b, needle):
    with pytest.raises(evtc.ArgumentError) as ei:
        geometry(kind, 2, a, b, spec())
    assert needle in str(ei.value)


@pytest.mark.parametrize("arch, kind, a, b, kw, tile, needle", [
    ("sm90", "fprop", (1, 8, 8, 12), (16, 3, 3, 12), {}, None, "C (input channels) = 12 is not a multiple of 8"),
    ("sm80", "fprop", (1, 8, 8, 16), (12, 3, 3, 16), {}, None, "K (output channels) = 12 is not a multiple of 8"),
    ("sm90", "fprop", (1, 600, 8, 16), (16, 3, 3, 16), {"padding": (300, 1)}, None, "padding 300 exceeds 256"),
    ("sm90", "fprop", (1, 300, 300, 16), (16, 3, 3, 16), {"dilation": 128}, None, "(taps - 1) x dilation = 256"),
    ("sm90", "fprop", (1, 300, 300, 16), (16, 3, 3, 16), {"padding": 200}, None, "im2col box corners"),
    ("sm90", "wgrad", (1, 8, 8, 64), (1, 8, 8, 96), {"padding": 1}, (128, 64, 64), "C = 96 is not a multiple of the tile's N = 64"),
    ("sm80", "fprop", (1, 40, 40, 16), (16, 33, 3, 16), {}, None, "at most 32 taps"),
])
def test_kernel_limits_name_their_source(arch, kind, a, b, kw, tile, needle):
    g = geometry(kind, 2, a, b, spec(**kw))
    with pytest.raises(evtc.ArgumentError) as ei:
        check_arch_limits(g, arch, f16, tile=tile)
    assert needle in str(ei.value), str(ei.value)
    assert "CUTLASS" in str(ei.value) or "wgrad" in str(ei.value)


def test_strided_dgrad_limits():
    g = geometry("dgrad", 2, (1, 8, 8, 16), (16, 3, 3, 16), spec(stride=2, padding=1, input_size=(16, 16)))
    with pytest.raises(evtc.ArgumentError, match="CUTLASS 3.x's sm90 conv kernels compute unit-stride dgrad only"):
        check_arch_limits(g, "sm90", bf16)
    check_arch_limits(g, "sm80", bf16, strided_dgrad=True)
    g = geometry("dgrad", 2, (1, 8, 8, 16), (16, 3, 3, 16), spec(stride=2, padding=2, dilation=2, input_size=(16, 16)))
    with pytest.raises(evtc.ArgumentError, match="strided dgrad with dilation"):
        check_arch_limits(g, "sm80", bf16, strided_dgrad=True)


def test_huge_tensors_on_sm80():
    g = geometry("fprop", 2, (64, 512, 512, 128), (128, 3, 3, 128), spec(padding=1))
    with pytest.raises(evtc.ArgumentError, match="32-bit offsets"):
        check_arch_limits(g, "sm80", bf16)


# ---- configuration -----------------------------------------------------------------------------------


def test_conv_config_defaults_and_fields():
    c = conv_config("sm90", bf16, bf16)
    assert (c.tile, c.cluster, c.schedule, c.scheduler) == ((128, 128, 64), (1, 1, 1), "warpspecialized", "nonpersistent")
    assert conv_config("sm90", bf16, bf16, kind="wgrad").tile == (128, 64, 64)
    assert conv_config("sm90", bf16, bf16, {"tile": (64, 128, 64), "stages": 4}).tile == (64, 128, 64)
    assert conv_config("sm90", bf16, bf16, evtc.GemmConfig(tile=(128, 64, 64))).tile == (128, 64, 64)
    # the persistent ping-pong kernel (NOTE [Persistent conv kernels]): 128x128 by default
    pp = conv_config("sm90", bf16, bf16, {"schedule": "pingpong"})
    assert (pp.tile, pp.schedule, pp.scheduler) == ((128, 128, 64), "pingpong", "persistent")
    assert conv_config("sm90", bf16, bf16, {"schedule": "pingpong", "tile": (64, 256, 64)}).tile == (64, 256, 64)
    with pytest.raises(evtc.ConfigError, match="not wgrad"):
        conv_config("sm90", bf16, bf16, {"schedule": "pingpong"}, kind="wgrad")
    c80 = conv_config("sm80", f16, f16, {"tile": (128, 64, 32), "warp_tile": (64, 32, 32), "stages": 3})
    assert (c80.tile, c80.warp_tile, c80.stages) == ((128, 64, 32), (64, 32, 32), 3)


@pytest.mark.parametrize("arch, config, needle", [
    ("sm90", {"schedule": "sliced"}, "sm90 conv schedule 'sliced' is not one of"),
    ("sm90", {"schedule": "pingpong", "scheduler": "streamk"}, "the stream-K scheduler needs the cooperative schedule"),
    ("sm90", {"schedule": "pingpong", "scheduler": "nonpersistent"}, "scheduler 'nonpersistent' with schedule='pingpong'"),
    ("sm90", {"split_k": 2}, "decompositions of the persistent kernel's stream-K tile scheduler"),
    ("sm90", {"raster": "along_m"}, "has no raster to choose"),
    ("sm90", {"tile": (256, 128, 64)}, "tile M = 256"),
    ("sm90", {"tile": (128, 256, 64)}, "256 f32 accumulators per thread"),
    ("sm90", {"epilogue_tile": (128, 32)}, "the one-warpgroup epilogue has M = 64"),
    ("sm90", {"tiles": (128, 128, 64)}, "unknown config field"),
    ("sm80", {"cluster": (2, 1, 1)}, "has no cluster to choose"),
    ("sm80", {"tile": (128, 128, 32), "warp_tile": (48, 64, 32)}, "don't divide"),
    ("sm90", 42, "is not a GemmConfig or a dict"),
])
def test_conv_config_errors(arch, config, needle):
    with pytest.raises(evtc.ConfigError) as ei:
        conv_config(arch, bf16 if arch == "sm90" else f16, bf16 if arch == "sm90" else f16, config)
    assert needle in str(ei.value), str(ei.value)


@pytest.mark.parametrize("kw, needle", [
    ({"kind": "bprop"}, "kind = 'bprop' is not one of"),
    ({"dims": 1}, "dims = 1"),
    ({"layout": "NHWC"}, "layout = 'NHWC'"),
    ({"a": evtc.e4m3}, "evtc's conv kernels take f16 or bf16 operands"),
    ({"a": f16, "b": bf16}, "a is f16 and b is bf16"),
    ({"fast_divmod": True}, "fast_divmod = True"),
    ({"arch": "sm70"}, "unknown arch 'sm70'"),
])
def test_conv_construction_errors(kw, needle):
    with pytest.raises(evtc.ConfigError) as ei:
        evtc.Conv(bias_relu, **kw)
    assert needle in str(ei.value), str(ei.value)


def test_reserved_parameter_names():
    @evtc.epilogue
    def uses_problem(acc, problem: float):
        return acc * problem

    with pytest.raises(evtc.ConfigError, match="'problem' can't be passed"):
        evtc.Conv(uses_problem)


# ---- plans and sources ---------------------------------------------------------------------------------


def test_sm90_stages_share_the_epilogue_union():
    conv = evtc.Conv(dgelu_bgrad, kind="fprop", a=bf16, d=bf16, arch="sm90")
    plan = conv.plan
    assert isinstance(plan, ConvPlan)
    # 128x128x64 bf16: 32 KiB a stage; the epilogue's buffers don't take from the mainloop, so
    # 7 stages fit (the carveout rule of StageCountAutoCarveout would leave 6)
    assert plan.mainloop_stages == 7
    assert sm90_kernel_smem(plan.config, bf16, bf16, plan, 7) == plan.kernel_smem_bound <= plan.smem_capacity
    assert sm90_kernel_smem(plan.config, bf16, bf16, plan, 8) > plan.smem_capacity
    text = str(plan)
    assert "shared with 7 stages" in text and max(len(line) for line in text.splitlines()) <= 80
    assert plan.epilogue_tile[0] == 64 and plan.fragment_size == 64 * plan.epilogue_tile[1] // 128
    pinned = evtc.Conv(dgelu_bgrad, kind="fprop", arch="sm90", config={"stages": 4})
    assert pinned.plan.mainloop_stages == 4 and "StageCount<4>" in pinned.source
    with pytest.raises(evtc.PlanError, match="9 mainloop stages"):
        evtc.Conv(dgelu_bgrad, kind="fprop", arch="sm90", config={"stages": 9})


CASES = [(arch, kind, dims) for arch in ("sm90", "sm80") for kind in ("fprop", "dgrad", "wgrad") for dims in (2, 3)]


@pytest.mark.parametrize("arch, kind, dims", CASES)
def test_sources(arch, kind, dims):
    ep = dgelu_bgrad if kind != "wgrad" else bias_relu
    conv = evtc.Conv(ep, kind=kind, dims=dims, a=f16, d=f16, arch=arch)
    src = conv.source
    assert src == evtc.Conv(ep, kind=kind, dims=dims, a=f16, d=f16, arch=arch).source  # deterministic
    op = {"fprop": "kFprop", "dgrad": "kDgrad", "wgrad": "kWgrad"}[kind]
    assert f"cutlass::conv::Operator::{op}" in src
    assert ("TensorNDHWC" if dims == 3 else "TensorNHWC") in src
    for f in CONV_FIELDS:
        assert f"int32_t {f};" in src
    if arch == "sm90":
        assert "using CollectiveEpilogue = evtc::Sm90ConvEpilogue<StockEpilogue>;" in src
        assert f"cutlass::conv::collective::StageCount<{conv.plan.mainloop_stages}>" in src
        assert f"sizeof(typename CollectiveEpilogue::SharedStorage) == {conv.plan.epilogue_smem_bytes}" in src
        assert "#include <evtc/sm90_conv.hpp>" in src
        nested_n = re.search(r"using MainloopTileShape = cute::Shape<cute::_\d+, cute::Shape<cute::_\d+>", src)
        assert bool(nested_n) == (kind == "wgrad")
    else:
        d = "3d" if dims == 3 else "2d"
        assert f"cutlass::conv::kernel::DefaultConv{d.capitalize()}{kind.capitalize()}<" in src
        assert "evtc::conv::ImplicitGemmConvolutionWithVisitor<" in src
        assert f"Conv{d[0]}dProblemSize" in src
        assert "cutlass::conv::Mode::kCrossCorrelation" in src
        assert "StrideSupport::kUnity" in src if kind != "wgrad" else "StrideSupport::kStrided" in src


def test_abi_fields_put_the_conv_after_the_gemm_extents():
    conv = evtc.Conv(bias_relu, kind="fprop", arch="sm90")
    names = [f.name for f in conv_abi_fields(conv.graph)]
    assert names[:4] == ["M", "N", "K", "L"] and tuple(names[4:4 + len(CONV_FIELDS)]) == CONV_FIELDS
    assert "max_swizzle_size" not in names and names.index("p_A") > names.index("dilation_w")


# ---- binding on fake device tensors ------------------------------------------------------------------


def nhwc(shape, ptr=None):
    return FakeCuda(shape, ptr=ptr)


def channels_last(shape_nchw, ptr=None):
    """A (N, C, H, W) f16 tensor stored NHWC (torch.channels_last), strides in bytes."""
    _, c, h, w = shape_nchw
    return FakeCuda(shape_nchw, ptr=ptr, strides=tuple(2 * s for s in (h * w * c, 1, w * c, c)))


def binder(ep, kind="fprop", layout="nhwc", arch="sm90", dims=2, **problem):
    conv = evtc.Conv(ep, kind=kind, dims=dims, a=f16, c=f16, d=f16, arch=arch, layout=layout)
    sp = evtc.ConvProblem(**problem).normalize(dims)
    Args = ctypes_struct(conv_abi_fields(conv.graph))
    return ConvBinder(conv.graph, f16, f16, Args, kind=kind, dims=dims, layout=layout, spec=sp, arch=arch,
                      tile=conv.config.tile)


def test_fprop_binding_fills_the_struct():
    b = binder(bias_relu, padding=1, stride=2)
    x, w = nhwc((2, 15, 17, 16)), nhwc((24, 3, 3, 16))
    y_shape = (2, 8, 9, 24)
    kw = {"C": nhwc(y_shape), "alpha": 1.0, "beta": 0.5, "bias": FakeCuda((24,), typestr="<f4")}
    sig, ptrs = b.signature(x, w, kw)
    assert (sig.M, sig.N, sig.K, sig.mode) == (2 * 8 * 9, 24, 16 * 9, "launch")
    v = sig.values
    assert (v["conv_n"], v["conv_h"], v["conv_w"], v["conv_c"], v["conv_k"], v["conv_p"], v["conv_q"]) == \
        (2, 15, 17, 16, 24, 8, 9)
    assert (v["pad_h"], v["stride_w"], v["ld_C"], v["ld_D"], v["L"]) == (1, 2, 24, 24, 1)
    [alloc] = sig.allocs
    assert (alloc.name, alloc.shape, alloc.strides) == ("D", y_shape, (8 * 9 * 24, 9 * 24, 24, 1))
    args = b.fill_args(sig, ptrs, {"alpha": 1.0, "beta": 0.5})
    assert (args.M, args.conv_q, args.ld_C) == (144, 9, 24)


def test_channels_last_layout_and_strided_aux_rows():
    b = binder(bias_relu, layout="nchw", padding=1)
    x, w = channels_last((2, 16, 8, 8)), channels_last((32, 16, 3, 3))
    # C's rows (pixels) are 48 channels apart: a channel slice of a wider tensor
    C = FakeCuda((2, 32, 8, 8), strides=tuple(2 * s for s in (64 * 48, 1, 8 * 48, 48)))
    sig, _ = b.signature(x, w, {"C": C, "alpha": 1.0, "beta": 1.0, "bias": FakeCuda((32,), typestr="<f4")})
    assert (sig.M, sig.N, sig.values["ld_C"]) == (128, 32, 48)
    [alloc] = sig.allocs
    assert alloc.shape == (2, 32, 8, 8) and alloc.strides == (64 * 32, 1, 8 * 32, 32)  # channels_last


@pytest.mark.parametrize("mutate, needle", [
    (lambda a: a.update(x=FakeCuda((2, 8, 8, 16), strides=(2 * 8 * 8 * 32, 2 * 8 * 32, 2 * 32, 2))),
     "argument 'x' is not packed NHWC"),
    (lambda a: a.update(x=FakeCuda((2, 8, 8, 16), ptr=(1 << 40) + 8)), "argument 'x' starts at an address"),
    (lambda a: a.update(w=FakeCuda((32, 3, 3, 16), typestr="<f4")), "argument 'w' has dtype <f4"),
    (lambda a: a["kw"].update(C=nhwc((2, 8, 8, 24))), "argument 'C' has shape (2, 8, 8, 24), expected the output's (2, 8, 8, 32)"),
    (lambda a: a["kw"].update(C=FakeCuda((2, 8, 8, 32), strides=(2 * 8 * 8 * 32, 2 * 9 * 32, 2 * 32, 2))),
     "is not M rows of 32 contiguous elements"),
    (lambda a: a["kw"].update(bias=FakeCuda((16,), typestr="<f4")), "argument 'bias' has shape (16,)"),
    (lambda a: a["kw"].pop("alpha"), "missing argument 'alpha'"),
])
def test_binding_errors_name_the_argument(mutate, needle):
    b = binder(bias_relu, padding=1)
    a = {"x": nhwc((2, 8, 8, 16)), "w": nhwc((32, 3, 3, 16)),
         "kw": {"C": nhwc((2, 8, 8, 32)), "alpha": 1.0, "beta": 1.0, "bias": FakeCuda((32,), typestr="<f4")}}
    mutate(a)
    with pytest.raises(evtc.ArgumentError) as ei:
        b.signature(a["x"], a["w"], a["kw"])
    assert needle in str(ei.value), str(ei.value)


def test_matrix_form_and_reductions():
    b = binder(stats, padding=1)
    x, w = nhwc((2, 8, 8, 16)), nhwc((32, 3, 3, 16))
    sig, _ = b.signature(x, w, {"scale": FakeCuda((128,), typestr="<f4")})
    shapes = {a.name: a.shape for a in sig.allocs}
    assert shapes == {"D": (2, 8, 8, 32), "row_max": (128,), "amax": ()}
    # an M x N input may be given as the implicit GEMM's (M, N) matrix
    b2 = binder(bias_relu, padding=1)
    sig, _ = b2.signature(x, w, {"C": nhwc((128, 32)), "alpha": 1.0, "beta": 1.0, "bias": FakeCuda((32,), typestr="<f4")})
    assert sig.values["ld_C"] == 32


def test_dgrad_and_wgrad_binding():
    b = binder(dgelu_bgrad, kind="dgrad", padding=1)
    dy, w = nhwc((2, 8, 8, 32)), nhwc((32, 3, 3, 16))
    sig, _ = b.signature(dy, w, {"F": nhwc((2, 8, 8, 16))})
    assert (sig.M, sig.N, sig.K) == (128, 16, 288)
    assert {a.name: a.shape for a in sig.allocs} == {"D": (2, 8, 8, 16), "dbias": (16,)}
    bw = binder(bias_relu, kind="wgrad", padding=1, arch="sm80")
    dy, x = nhwc((2, 8, 8, 32)), nhwc((2, 8, 8, 16))
    sig, _ = bw.signature(dy, x, {"C": nhwc((32, 3, 3, 16)), "alpha": 1.0, "beta": 1.0,
                                  "bias": FakeCuda((144,), typestr="<f4")})
    assert (sig.M, sig.N, sig.K) == (32, 144, 128) and sig.allocs[0].shape == (32, 3, 3, 16)


def test_zero_batch_is_empty_with_identity_fills():
    b = binder(stats, padding=1)
    sig, _ = b.signature(nhwc((0, 8, 8, 16)), nhwc((32, 3, 3, 16)), {"scale": FakeCuda((0,), typestr="<f4")})
    assert sig.mode == "empty"
    assert [(f.count, f.value) for f in sig.fills] == [(1, -math.inf)]  # amax over nothing; row_max has no rows


def test_zero_input_channels_are_refused():
    b = binder(stats)
    with pytest.raises(evtc.ArgumentError, match="no reduction extent"):
        b.signature(nhwc((1, 8, 8, 0)), nhwc((8, 1, 1, 0)), {"scale": FakeCuda((64,), typestr="<f4")})


def test_strided_dgrad_routes_to_the_sm80_kernel():
    conv = evtc.Conv(dgelu_bgrad, kind="dgrad", arch="sm90")
    assert conv._route(evtc.ConvProblem().normalize(2)).arch == "sm90"
    k = conv._route(evtc.ConvProblem(stride=2).normalize(2))
    assert (k.arch, k.strided) == ("sm80", True)


# ---- strided dgrad ----------------------------------------------------------------------------------


def row_map(n, h, w, sh, sw, ph, pw, kM):
    """A transcription of evtc::conv::StridedDgradRows and the kernel's phase selection
    (include/evtc/sm80_conv.hpp; CUTLASS's strided_dgrad_tile_m_per_filter and
    strided_dgrad_starting_coords for cross-correlation): {GEMM row: dx row} of every valid row
    of every CTA tile that runs its epilogue."""
    tile_m_per_filter = -(-(n * -(-h // sh) * -(-w // sw)) // kM)
    out = {}
    for tile_m in range(tile_m_per_filter * sh * sw):
        filter_tile_m = tile_m // tile_m_per_filter
        start_r, start_s = filter_tile_m // sw, filter_tile_m % sw
        start_h = abs(sh - (ph % sh - start_r)) % sh
        start_w = abs(sw - (pw % sw - start_s)) % sw
        if start_h >= h or start_w >= w:
            continue  # the kernel returns before the epilogue
        p, q = -(-(h - start_h) // sh), -(-(w - start_w) // sw)
        base, rows = filter_tile_m * tile_m_per_filter * kM, n * p * q
        for m in range(tile_m * kM, (tile_m + 1) * kM):
            if m - base < rows:
                nn, pq = divmod(m - base, p * q)
                pp, qq = divmod(pq, q)
                out[m] = nn * h * w + (start_h + pp * sh) * w + (start_w + qq * sw)
                # the pixel's phase: the taps start_r + j * sh reach it
                assert (start_h + pp * sh + ph - start_r) % sh == 0 and (start_w + qq * sw + pw - start_s) % sw == 0
    return out


@pytest.mark.parametrize("n, h, w, sh, sw, ph, pw, kM", [
    (2, 14, 12, 2, 2, 1, 1, 128), (3, 13, 11, 2, 2, 1, 1, 64), (2, 12, 9, 3, 3, 0, 0, 128),
    (1, 16, 16, 2, 2, 1, 1, 128), (2, 7, 9, 2, 3, 2, 1, 32), (1, 5, 5, 4, 4, 0, 0, 16),
])
def test_strided_dgrad_rows_cover_every_pixel_once(n, h, w, sh, sw, ph, pw, kM):
    rows = row_map(n, h, w, sh, sw, ph, pw, kM)
    assert sorted(rows.values()) == list(range(n * h * w))


def test_strided_dgrad_sources():
    @evtc.epilogue
    def everything(acc, C, F: evtc.Matrix, scale: evtc.ColVector[f32], bias: evtc.RowVector[f32]):
        D = acc * scale + bias + C
        G = D * evtc.gelu_grad(F)
        return {"D": G, "P": D, "rmax": evtc.max(G, dim=1), "csum": evtc.sum(G, dim=0), "amax": evtc.amax(G)}

    conv = evtc.Conv(everything, kind="dgrad", a=f16, arch="sm80", fast_divmod=(False, True))
    src = conv.source_for(strided=True)
    assert src == evtc.Conv(everything, kind="dgrad", a=f16, arch="sm80", fast_divmod=(False, True)).source_for(strided=True)
    assert "evtc::conv::ImplicitGemmConvolutionStridedDgradWithVisitor<" in src
    assert "StridedDgradIdentityThreadblockSwizzle<1>" in src and "StrideSupport::kStrided" in src
    assert src.count("evtc::conv::StridedDgradAuxLoad<") == 2 and ", cute::_1, int64_t>, false>;" in src
    assert src.count("evtc::conv::StridedDgradAuxStore<") == 2
    assert re.search(r"StridedDgradAuxStore<[^;]*, true>;", src) and re.search(r"StridedDgradColBroadcast<[^;]*, false>;", src)
    assert re.search(r"StridedDgradColReduction<[^;]*, true>;", src)
    assert src.count("evtc::conv::StridedDgradMasked<") == 2
    assert "evtc::conv::StridedDgradGeometry geometry = ConvKernel::geometry(arguments.problem_size);" in src
    # the FastDivmod choice changes the source; the unit-stride kernel is another source
    other = evtc.Conv(everything, kind="dgrad", a=f16, arch="sm80", fast_divmod=(True, True)).source_for(strided=True)
    assert other != src and conv.source != src and "StridedDgrad" not in conv.source
    # 3-D: the analytic strided mainloop, rows in dx's order: the ordinary visitor epilogue
    src3 = evtc.Conv(everything, kind="dgrad", dims=3, a=f16, arch="sm80").source_for(strided=True)
    assert "IteratorAlgorithm::kAnalytic, cutlass::conv::StrideSupport::kStrided" in src3
    assert "StridedDgrad" not in src3 and "ImplicitGemmConvolutionWithVisitor<" in src3


def test_cli_emits_a_conv():
    from click.testing import CliRunner

    from evtc.cli import main

    r = CliRunner().invoke(main, ["emit", "examples/epilogues.py:bias_relu", "--conv", "dgrad", "--dims", "3",
                                  "--arch", "sm80"])
    assert r.exit_code == 0, r.output
    assert "cutlass::conv::kernel::DefaultConv3dDgrad<" in r.output and "Operator::kDgrad" in r.output


def test_cli_conv_takes_every_config_option_or_refuses_it():
    """`evtc emit --conv` passes the tile, cluster, schedule, scheduler, stages, epilogue tile and
    plan to the Conv (they were dropped silently before, except tile and stages), and a value the
    conv kernel doesn't take is a ConfigError, not ignored."""
    from click.testing import CliRunner

    from evtc.cli import main

    base = ["emit", "examples/epilogues.py:bias_relu", "--conv", "fprop", "--arch", "sm90"]
    r = CliRunner().invoke(main, base + ["--schedule", "cooperative", "--scheduler", "streamk", "--tile", "128x128x64"])
    assert r.exit_code == 0, r.output
    assert "cutlass::gemm::StreamKScheduler>" in r.output and "evtc::Sm90ConvMainloopAsGemm<" in r.output
    r = CliRunner().invoke(main, base + ["--cluster", "2x1", "--epilogue-tile", "64x64"])
    assert r.exit_code == 0, r.output
    assert "using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;" in r.output
    assert "using EpilogueTile = cute::Shape<cute::_64, cute::_64>;" in r.output
    r = CliRunner().invoke(main, base + ["--schedule", "pingpong", "--tile", "128x192x64", "--cluster", "2x1"])
    assert r.exit_code == 0, r.output
    assert "using KernelSchedule = cutlass::gemm::KernelTmaWarpSpecializedPingpong;" in r.output
    assert "cute::Layout<cute::Shape<cute::_1, cute::_1, cute::_1>>{}" in r.output
    r = CliRunner().invoke(main, base + ["--schedule", "pingpong", "--scheduler", "streamk"])
    assert r.exit_code != 0 and "the stream-K scheduler needs the cooperative schedule" in r.output
    r = CliRunner().invoke(main, base[:-1] + ["sm80", "--cluster", "2x1"])
    assert r.exit_code != 0 and "the sm80 conv kernel has no cluster to choose" in r.output
