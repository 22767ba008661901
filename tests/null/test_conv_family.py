"""The sm90 conv family without a GPU: which problems take the 1x1 GEMM route and the GEMM's
views of NHWC tensors, the heuristic's choices, the members' configurations and plans, their
sources, and the config rules (NOTE [The sm90 conv family], NOTE [1x1 convolutions as GEMMs] in
evtc/family/conv.py)."""

import pytest

import evtc
from evtc import bf16, f16, f32
from evtc.dispatch import conv_gemm
from evtc.family import conv as CF
from evtc.plan.conv import conv_config
from evtc.runtime.conv_problem import to_nhwc
from evtc.runtime.tensors import TensorView, view
from fakecuda import FakeCuda


@evtc.epilogue
def bias_relu(acc, C, alpha: float, beta: float, bias: evtc.RowVector[f32]):
    return evtc.relu(alpha * acc + beta * C + bias)


@evtc.epilogue
def bias_silu(acc, bias: evtc.RowVector[f32]):
    return evtc.silu(acc + bias)


@evtc.epilogue
def stats(acc, scale: evtc.ColVector[f32]):
    D = acc * scale
    return {"D": D, "row_max": evtc.max(D, dim=1), "csum": evtc.sum(D, dim=0), "amax": evtc.amax(D)}


def packed(shape, ptr=None):
    strides, acc = [], 2
    for s in reversed(shape):
        strides.append(acc)
        acc *= s
    return FakeCuda(shape, ptr=ptr, strides=tuple(reversed(strides)))


def channels_last(shape_nchw):
    """A (N, C, H, W) f16 tensor stored NHWC, strides in bytes."""
    n, c, h, w = shape_nchw
    return FakeCuda(shape_nchw, strides=tuple(2 * s for s in (h * w * c, 1, w * c, c)))


# ---- which problems are GEMMs -------------------------------------------------------------------------


@pytest.mark.parametrize("kind, stride, padding, dilation, groups, want", [
    ("fprop", (1, 1), (0, 0), (1, 1), 1, True),
    ("fprop", (1, 1, 1), (0, 0, 0), (1, 1, 1), 1, True),
    ("fprop", (2, 2), (0, 0), (1, 1), 1, False),   # strided 1x1: rows of x are not one stride apart
    ("fprop", (1, 1), (1, 1), (1, 1), 1, False),   # padding: the output is larger than x
    ("fprop", (1, 1), (0, 0), (2, 2), 1, False),   # (a 1x1 filter ignores dilation; kept out anyway)
    ("fprop", (1, 1), (0, 0), (1, 1), 2, False),
    ("dgrad", (1, 1), (0, 0), (1, 1), 1, False),   # B would be N-major (NOTE [1x1 convolutions as GEMMs])
    ("wgrad", (1, 1), (0, 0), (1, 1), 1, False),
])
def test_pointwise_problems(kind, stride, padding, dilation, groups, want):
    assert CF.pointwise_problem(kind, stride, padding, dilation, groups) == want


def test_the_route_exists_only_for_sm90_fprop_families():
    assert evtc.Conv(bias_silu, kind="fprop", a=f16, arch="sm90").gemm_route is not None
    assert evtc.Conv(bias_silu, kind="fprop", a=f16, arch="sm90", config={"tile": (128, 64, 64)}).gemm_route is None
    assert evtc.Conv(bias_silu, kind="fprop", a=f16, arch="sm80").gemm_route is None
    assert evtc.Conv(bias_silu, kind="dgrad", a=f16, arch="sm90").gemm_route is None
    assert evtc.Conv(bias_silu, kind="wgrad", a=f16, arch="sm90").gemm_route is None


def route_views(ep, x, w, kwargs, out, layout="nhwc"):
    conv = evtc.Conv(ep, kind="fprop", dims=len(x.__cuda_array_interface__["shape"]) - 2, a=f16, c=f16, d=f16,
                     arch="sm90", layout=layout)
    return conv.gemm_route.views(x, w, kwargs, out)


def test_gemm_views_of_packed_nhwc():
    x, w = packed((2, 8, 6, 16)), packed((32, 1, 1, 16))
    C, D = packed((2, 8, 6, 32)), packed((2, 8, 6, 32))
    A, B, kw, outs, allocate = route_views(bias_relu, x, w, {"C": C, "alpha": 1.0, "beta": 0.5,
                                                             "bias": FakeCuda((32,), typestr="<f4")}, D)
    M = 2 * 8 * 6
    assert (A.shape, A.strides, A.ptr) == ((M, 16), (16, 1), view(x, "x").ptr)
    assert (B.shape, B.strides, B.ptr) == ((32, 16), (16, 1), view(w, "w").ptr)
    assert (kw["C"].shape, kw["C"].strides, kw["C"].ptr) == ((M, 32), (32, 1), view(C, "C").ptr)
    assert (outs["D"].shape, outs["D"].strides) == ((M, 32), (32, 1)) and allocate == ()
    assert kw["alpha"] == 1.0 and kw["bias"] is not None  # scalars and vectors pass as they are
    # an M x N input may be the (M, N) matrix, as for the conv kernel
    Cm = packed((M, 32))
    _, _, kw, _, _ = route_views(bias_relu, x, w, {"C": Cm, "alpha": 1.0, "beta": 0.5,
                                                   "bias": FakeCuda((32,), typestr="<f4")}, D)
    assert kw["C"].shape == (M, 32)


def test_gemm_views_of_channels_last_and_3d():
    x, w = channels_last((2, 16, 8, 8)), channels_last((24, 16, 1, 1))
    D = channels_last((2, 24, 8, 8))
    A, B, _, outs, _ = route_views(bias_silu, x, w, {"bias": FakeCuda((24,), typestr="<f4")}, D, layout="nchw")
    assert (A.shape, A.strides, B.shape, B.strides) == ((128, 16), (16, 1), (24, 16), (16, 1))
    assert (outs["D"].shape, outs["D"].strides) == ((128, 24), (24, 1))
    x3, w3, D3 = packed((2, 3, 4, 5, 8)), packed((16, 1, 1, 1, 8)), packed((2, 3, 4, 5, 16))
    A, B, _, outs, _ = route_views(bias_silu, x3, w3, {"bias": FakeCuda((16,), typestr="<f4")}, D3)
    assert (A.shape, B.shape, outs["D"].shape) == ((120, 8), (16, 8), (120, 16))


def test_later_calls_reuse_the_views_with_their_own_pointers():
    conv = evtc.Conv(stats, kind="fprop", a=f16, d=f16, arch="sm90", layout="nchw")
    route = conv.gemm_route
    scale = FakeCuda((128,), typestr="<f4")
    first = route.views(channels_last((2, 16, 8, 8)), channels_last((32, 16, 1, 1)), {"scale": scale}, None)
    assert len(route._recipes) == 1
    x, w, rmax = channels_last((2, 16, 8, 8)), channels_last((32, 16, 1, 1)), FakeCuda((128,), typestr="<f4")
    again = route.views(x, w, {"scale": scale}, {"row_max": rmax})  # another key: out= differs
    assert len(route._recipes) == 2 and again[3]["row_max"] is rmax
    third = route.views(x, w, {"scale": scale}, None)
    assert len(route._recipes) == 2
    for got, want in zip(third[:2], first[:2]):
        assert (got.shape, got.strides, got.dtype) == (want.shape, want.strides, want.dtype)
    assert third[0].ptr == view(x, "x").ptr and third[1].ptr == view(w, "w").ptr and third[0].obj is x
    # D is allocated channels-last (logical N, K, H, W), its (M, N) view packed
    assert third[4] == (("D", (2, 32, 8, 8), (2048, 1, 256, 32), f16, "other", 0),)
    # a misaligned x with a cached key goes the full way (and is not the GEMM's)
    bad = FakeCuda((2, 16, 8, 8), ptr=(1 << 41) + 8, strides=x.__cuda_array_interface__["strides"])
    assert route.views(bad, w, {"scale": scale}, None) is None


def test_aux_rows_of_a_wider_tensor_keep_their_stride():
    """C a channel slice of a 48-channel tensor: the GEMM reads it with row stride 48, as the conv
    kernel does."""
    x, w = packed((1, 4, 4, 16)), packed((32, 1, 1, 16))
    C = FakeCuda((1, 4, 4, 32), strides=tuple(2 * s for s in (16 * 48, 4 * 48, 48, 1)))
    _, _, kw, _, _ = route_views(bias_relu, x, w, {"C": C, "alpha": 1.0, "beta": 1.0,
                                                   "bias": FakeCuda((32,), typestr="<f4")}, packed((1, 4, 4, 32)))
    assert kw["C"].strides == (48, 1)


@pytest.mark.parametrize("x, w, why", [
    (packed((2, 8, 8, 16)), packed((32, 3, 3, 16)), "3x3 filter"),
    (packed((2, 8, 8, 12)), packed((32, 1, 1, 12)), "channels not 16-byte vectors: the conv checks say so"),
    (packed((2, 8, 8, 16)), packed((36, 1, 1, 16)), "K not a multiple of 8"),
    (packed((2, 8, 8, 16), ptr=(1 << 40) + 8), packed((32, 1, 1, 16)), "x not 16-byte aligned"),
    (FakeCuda((2, 8, 8, 16), strides=(2 * 8 * 9 * 16, 2 * 9 * 16, 2 * 16, 2)), packed((32, 1, 1, 16)),
     "pixels that don't collapse into rows (a padded W)"),
    (packed((0, 8, 8, 16)), packed((32, 1, 1, 16)), "an empty batch: the conv kernel's zero-size rules"),
    (packed((2, 8, 8, 16)), FakeCuda((32, 1, 1, 16), typestr="<f4"), "w's dtype: the conv checks name it"),
])
def test_calls_the_gemm_does_not_take(x, w, why):
    assert route_views(bias_silu, x, w, {"bias": FakeCuda((32,), typestr="<f4")}, None) is None, why


def test_an_mxn_argument_of_a_wrong_shape_is_named():
    x, w = packed((2, 8, 8, 16)), packed((32, 1, 1, 16))
    with pytest.raises(evtc.ArgumentError, match=r"argument 'C' has shape \(2, 8, 8, 24\), expected the output's"):
        route_views(bias_relu, x, w, {"C": packed((2, 8, 8, 24)), "alpha": 1.0, "beta": 1.0,
                                      "bias": FakeCuda((32,), typestr="<f4")}, packed((2, 8, 8, 32)))


class Recorder:
    def __init__(self, result):
        self.calls = []
        self.result = result

    def __call__(self, *args):
        self.calls.append(args)
        return self.result(*args) if callable(self.result) else self.result


def test_conv_calls_route_by_problem(monkeypatch):
    """A 1x1 stride-1 unpadded fprop runs on the Gemm (its views), anything else on a conv kernel;
    the outputs come back as the caller's tensors, reductions as the Gemm returns them."""
    conv = evtc.Conv(stats, kind="fprop", a=f16, d=f16, arch="sm90")
    gemm = conv.gemm_route.gemm
    fake_red = {"row_max": object(), "csum": object(), "amax": object()}

    def gemm_run(A, B, kw, outs, stream):
        assert isinstance(A, TensorView) and A.shape == (128, 16) and outs["D"].shape == (128, 32)
        return {"D": outs["D"], **fake_red}

    run = Recorder(gemm_run)
    monkeypatch.setattr(gemm.dispatch, "run", run)  # the route runs the Gemm's dispatch
    launched = []

    def launcher(kernel, spec, call=None):
        launched.append((kernel.member, spec))
        return lambda *a: "conv kernel"

    monkeypatch.setattr(conv.dispatch.family, "launcher", launcher)
    x, w, D = packed((2, 8, 8, 16)), packed((32, 1, 1, 16)), packed((2, 8, 8, 32))
    got = conv(x, w, out={"D": D}, scale=FakeCuda((128,), typestr="<f4"))
    assert len(run.calls) == 1 and not launched
    assert got["D"] is D and got["row_max"] is fake_red["row_max"] and list(got) == ["D", "row_max", "csum", "amax"]
    assert conv(x, w, problem=evtc.ConvProblem(padding=1), out={"D": packed((2, 10, 10, 32))},
                scale=FakeCuda((200,), typestr="<f4")) == "conv kernel"
    assert conv(x, w, problem=evtc.ConvProblem(stride=2), out={"D": packed((2, 4, 4, 32))},
                scale=FakeCuda((32,), typestr="<f4")) == "conv kernel"
    assert conv(x, packed((32, 3, 3, 16)), out={"D": packed((2, 6, 6, 32))},
                scale=FakeCuda((72,), typestr="<f4")) == "conv kernel"
    assert len(run.calls) == 1 and len(launched) == 3
    # a pinned Conv has no route: its one kernel runs 1x1 problems too
    pinned = evtc.Conv(stats, kind="fprop", a=f16, d=f16, arch="sm90", config={"tile": (128, 128, 64)})
    assert pinned.gemm_route is None and pinned.source == conv.source


# ---- the family and its heuristic ---------------------------------------------------------------------


def test_family_members_and_candidates_plan():
    conv = evtc.Conv(bias_silu, kind="fprop", a=bf16, d=bf16, arch="sm90")
    assert list(conv.family) == list(CF.FAMILY) and conv.member("base") is conv._kernels[("sm90", False)]
    seen = set()
    for name, (fields, ctas) in CF.CANDIDATES.items():
        k = conv.member(name)
        cfg = k.config
        persistent = fields.get("schedule") in CF.PERSISTENT_SCHEDULES
        assert cfg.tile[2] == 64 and cfg.schedule == fields.get("schedule", "warpspecialized")
        for f, v in fields.items():
            got = getattr(cfg, f)
            assert (tuple(got)[:len(v)] == tuple(v)) if isinstance(v, tuple) else got == v, (name, f)
        plan = k.plan
        assert plan.mainloop_stages >= 2 and plan.kernel_smem_bound <= plan.smem_capacity
        src = k.source
        if persistent:
            # the GEMM's persistent cooperative kernel with the conv mainloop; the GEMM's stage rule
            pingpong = cfg.schedule == "pingpong"
            kernel = "Pingpong" if pingpong else "Cooperative"
            assert "evtc::Sm90ConvMainloopAsGemm<" in src and f"cutlass::gemm::KernelTmaWarpSpecialized{kernel};" in src
            # consumer warpgroups on one tile: one (ping-pong), two along M (cooperative)
            assert f"cute::Layout<cute::Shape<cute::_{1 if pingpong else 2}, cute::_1, cute::_1>>{{}}" in src
            sched = "StreamKScheduler" if fields["scheduler"] == "streamk" else "PersistentScheduler"
            assert f"CollectiveEpilogue,\n{' ' * 56}cutlass::gemm::{sched}>" in src
            assert "cutlass::conv::kernel::ConvUniversal" not in src and cfg.schedule in str(plan)
            assert plan.epilogue_tile[0] == (64 if pingpong else 128)
            assert plan.mainloop_stages * plan.mainloop_stage_bytes + plan.epilogue_smem_bytes <= plan.smem_capacity
            assert src not in seen
            seen.add(src)
            continue
        assert "Sm90ConvMainloopAsGemm" not in src and "cutlass::conv::kernel::ConvUniversal<" in src
        # the shared memory of `ctas` CTAs (and what the driver reserves for each) fits one SM
        assert ctas * (plan.kernel_smem_bound + CF.CTA_RESERVED_SMEM) <= CF.SM_SMEM_BYTES, name
        if ctas == 1 and name != "epi64" and "cluster" not in fields:
            assert 2 * (plan.kernel_smem_bound + CF.CTA_RESERVED_SMEM) > CF.SM_SMEM_BYTES, name
        assert src not in seen
        seen.add(src)
        assert f"cute::Shape<cute::_{cfg.tile[0]}, cute::_{cfg.tile[1]}, cute::_{cfg.tile[2]}>" in src
        assert f"cutlass::conv::collective::StageCount<{plan.mainloop_stages}>" in src
        cm, cn, _ = cfg.cluster
        assert f"using ClusterShape = cute::Shape<cute::_{cm}, cute::_{cn}, cute::_1>;" in src
    assert conv.member("epi64").plan.epilogue_tile == (64, 64) and conv.plan.epilogue_tile == (64, 32)
    # two CTAs of a 4-stage 64x128 tile would fit an SM's shared memory (not its registers: NOTE
    # [The sm90 conv family])
    m64x2 = evtc.Conv(bias_silu, kind="fprop", a=bf16, d=bf16, arch="sm90", config={"tile": (64, 128, 64), "stages": 4})
    assert 2 * (m64x2.plan.kernel_smem_bound + CF.CTA_RESERVED_SMEM) <= CF.SM_SMEM_BYTES


def test_the_main_kernel_is_the_pinned_default():
    """The family's base member is the kernel a Conv had before families (byte-identical to the
    default configuration pinned)."""
    for ep in (bias_relu, stats):
        fam = evtc.Conv(ep, kind="fprop", a=bf16, d=bf16, arch="sm90")
        assert fam.source == evtc.Conv(ep, kind="fprop", a=bf16, d=bf16, arch="sm90", config={}).source
        assert fam.member("base").source == fam.source


def test_jobs_cover_the_family_and_the_gemm_family():
    conv = evtc.Conv(bias_silu, kind="fprop", a=bf16, d=bf16, arch="sm90")
    jobs = conv.jobs()
    gemm_jobs = conv.gemm_route.gemm.jobs()
    assert len(jobs) == len(CF.FAMILY) + len(gemm_jobs) and len({j.source for j in jobs}) == len(jobs)
    assert [j.name for j in jobs[:3]] == ["bias_silu", "bias_silu[n64]", "bias_silu[m64]"]
    assert len(conv.jobs(gemm=False)) == len(CF.FAMILY)
    dgrad = evtc.Conv(bias_silu, kind="dgrad", a=bf16, d=bf16, arch="sm90")
    assert [j.name for j in dgrad.jobs()] == ["bias_silu"] + [f"bias_silu[{n}]" for n in CF.DGRAD_FAMILY[1:]]
    one = evtc.Conv(bias_silu, kind="wgrad", a=bf16, d=bf16, arch="sm90")
    assert len(one.jobs()) == 1 and one.choose(4096, 256, 2304) == "base"


def test_members_a_conv_cannot_have():
    with pytest.raises(evtc.ConfigError, match="only sm90 fprop and dgrad Convs without config= have a kernel family"):
        evtc.Conv(bias_silu, kind="wgrad", a=bf16, arch="sm90").member("m64")
    with pytest.raises(evtc.ConfigError, match="only sm90 fprop and dgrad Convs without config= have a kernel family"):
        evtc.Conv(bias_silu, kind="dgrad", a=bf16, arch="sm90", config={"tile": (128, 64, 64)}).member("m64")
    with pytest.raises(evtc.ConfigError, match="only sm90 fprop and dgrad Convs without config= have a kernel family"):
        evtc.Conv(bias_silu, kind="dgrad", a=bf16, arch="sm80").member("m64")
    with pytest.raises(evtc.ConfigError, match="no conv family member 'huge'"):
        evtc.Conv(bias_silu, kind="fprop", a=bf16, arch="sm90").member("huge")


#: bench_conv's UNet and ResNet-50 3x3 layers: (M, N, K) of the implicit GEMM -> the heuristic's
#: pick, with what each member measured on the H100 (2026-11-25, explore_conv.py: time / cuDNN +
#: eager in CUDA graphs; docs/performance.md)
# (implicit GEMM, input channels) -> the pick; measured on the H100 (docs/performance.md, 2026-11-26,
# time / (cuDNN + eager) of the pick and of others)
UNET_PICKS = [
    ((8 * 64 * 64, 320, 320 * 9), 320, "coop160"),     # coop160 0.91, base 1.31 (N = 320: two 160 tiles)
    ((8 * 32 * 32, 640, 640 * 9), 640, "coop160"),     # coop160 0.93, base 1.06
    # long-K (NOTE [Long-K conv layers: the filter multicast]): coop192_c2x1 0.92-0.93, pp192_c4x1
    # 0.99, streamk128_c4x1 1.02, coop160 1.12, base 1.56; m64_c4x1 0.87, streamk128_c4x1 0.93-0.97,
    # streamk128 1.22, m64 1.51
    ((8 * 16 * 16, 1280, 1280 * 9), 1280, "coop192_c2x1"),
    ((8 * 8 * 8, 1280, 1280 * 9), 1280, "m64_c4x1"),
    ((8 * 32 * 32, 640, 320 * 9), 320, "coop160"),     # coop160 0.78, base 0.96
    ((8 * 32 * 32, 320, 320 * 9), 320, "coop160"),     # the stride-2 downsampler: coop160 0.74, base 1.26
    ((8 * 16 * 16, 640, 640 * 9), 640, "streamk128_c4x1"),  # long-K: streamk128_c4x1 0.77-0.78, coop128 0.75-0.87
    ((32 * 14 * 14, 256, 256 * 9), 256, "wide"),       # ResNet-50 res4 3x3: wide 0.59, coop128 0.62, base 0.70
    ((32 * 28 * 28, 128, 128 * 9), 128, "coop128"),    # res3 3x3: coop128 0.61, base 0.65
    ((32 * 7 * 7, 512, 512 * 9), 512, "m64_c4x1"),     # res5 3x3 (long-K): m64_c4x1 0.80, m64 0.99, base 1.15
    ((32 * 56 * 56, 64, 64 * 9), 64, "n64"),           # res2 3x3: n64 0.70, coop128 0.92, base 1.05
    ((32 * 28 * 28, 512, 256), 256, "coop"),           # res3's strided 1x1 shortcut: coop 0.27, wide 0.38
    # channels off the persistent kernel's K tile (64): the non-persistent members only
    ((8 * 64 * 64, 320, 40 * 9), 40, "base"),
    ((8 * 16 * 16, 1280, 1000 * 9), 1000, "m64_c4x1"),  # long-K: the one non-persistent long-K member
    ((8 * 8 * 8, 1280, 1000 * 9), 1000, "m64_c4x1"),
]


@pytest.mark.parametrize("mnk, channels, want", UNET_PICKS)
def test_heuristic_picks(mnk, channels, want):
    conv = evtc.Conv(bias_silu, kind="fprop", a=bf16, d=bf16, arch="sm90")
    assert conv.choose(*mnk, channels=channels) == want
    # without the channels, no persistent member
    assert CF.kernel_kind(conv.member(conv.choose(*mnk)).config) == "nonpersistent"


def test_heuristic_model():
    base = conv_config("sm90", bf16, bf16)
    m64 = conv_config("sm90", bf16, bf16, {"tile": (64, 128, 64)})
    # one wave of 128x128 tiles (132 of them) against two half-size tiles per SM: same waves,
    # the bigger tile's better efficiency wins
    assert CF.modeled_time(base, 1, 128 * 132, 128, 4096, 132) < CF.modeled_time(m64, 1, 128 * 132, 128, 4096, 132)
    # 120 tiles: one wave of 128x128 against two waves of 240 64x128 tiles; 60 tiles: one wave
    # either way, of half the work at 0.75 of the efficiency
    assert CF.choose({"base": (base, 1), "m64": (m64, 1)}, 128 * 120, 128, 4096) == "base"
    assert CF.choose({"base": (base, 1), "m64": (m64, 1)}, 128 * 60, 128, 4096) == "m64"
    assert CF.choose({"base": (base, 1), "m64": (m64, 1)}, 0, 128, 4096) == "base"
    assert CF.choose({"only": (m64, 1)}, 100, 100, 100) == "only"


def test_route_picks_the_member_of_the_call(monkeypatch):
    conv = evtc.Conv(bias_silu, kind="fprop", a=f16, d=f16, arch="sm90")
    sp = evtc.ConvProblem(padding=1).normalize(2)
    k = conv._route(sp, packed((8, 8, 8, 1280)), packed((1280, 3, 3, 1280)))
    assert k.member == "m64_c4x1" and k.config.tile == (64, 128, 64) and k.config.cluster == (4, 1, 1)
    k = conv._route(sp, packed((8, 16, 16, 640)), packed((640, 3, 3, 640)))
    assert k.member == "streamk128_c4x1" and k.config.tile == (128, 128, 64) and k.config.scheduler == "streamk"
    assert conv._route(sp, packed((8, 64, 64, 320)), packed((320, 3, 3, 320))).member == "coop160"
    # 40 input channels: not a multiple of the persistent kernel's K tile
    assert conv._route(sp, packed((8, 64, 64, 40)), packed((320, 3, 3, 40))).member == "base"
    assert conv._route(sp) is conv._kernels[("sm90", False)]
    # a malformed call goes to the main kernel, whose binder names the problem
    assert conv._route(sp, packed((8, 8, 8, 16)), packed((32, 3, 3, 24))).member == "base"


# ---- configuration rules --------------------------------------------------------------------------------


@pytest.mark.parametrize("config, needle", [
    ({"tile": (128, 256, 64)}, "256 f32 accumulators per thread (at most 128: the non-persistent kernel"),
    ({"tile": (192, 128, 64)}, "tile M = 192"),
    ({"tile": (128, 72, 64)}, "tile N = 72: needs a multiple of 16"),
    ({"tile": (128, 128, 24)}, "tile K = 24"),
    ({"cluster": (4, 2, 1)}, "cluster (4, 2, 1): each of M, N in (1, 2, 4), K = 1, at most 4 CTAs"),
    ({"cluster": (3, 1, 1)}, "cluster (3, 1, 1)"),
    ({"epilogue_tile": (64, 48)}, "epilogue tile (64, 48)"),
    ({"epilogue_tile": (128, 32)}, "the one-warpgroup epilogue has M = 64"),
    ({"schedule": "sliced"}, "sm90 conv schedule 'sliced' is not one of"),
    ({"schedule": "pingpong", "tile": (256, 128, 64)}, "would hold 256 f32 accumulators per thread"),
    ({"schedule": "pingpong", "tile": (128, 256, 64)}, "would hold 256 f32 accumulators per thread"),
    ({"scheduler": "streamk"}, "the warpspecialized conv kernel is non-persistent"),
    ({"schedule": "cooperative", "scheduler": "nonpersistent"}, "use 'persistent' or 'streamk'"),
    ({"schedule": "cooperative", "tile": (64, 256, 64)}, "the cooperative schedule needs a multiple of 128"),
    ({"schedule": "cooperative", "split_k": 2}, "split-K and stream-K are decompositions of the stream-K tile scheduler"),
    ({"split_k": 2}, "decompositions of the persistent kernel's stream-K tile scheduler"),
])
def test_bad_configs_name_the_limit(config, needle):
    with pytest.raises(evtc.ConfigError) as ei:
        conv_config("sm90", bf16, bf16, config)
    assert needle in str(ei.value), str(ei.value)


def test_good_configs():
    for cfg in ({"tile": (64, 256, 64)}, {"tile": (128, 64, 64), "stages": 4}, {"cluster": (2, 1, 1)},
                {"cluster": (1, 2, 1)}, {"epilogue_tile": (64, 64)}):
        conv_config("sm90", bf16, bf16, cfg)


def test_to_nhwc_of_a_view_is_a_view():
    v = view(channels_last((2, 16, 4, 4)), "x")
    nv = to_nhwc(v, "nchw")
    assert nv.shape == (2, 4, 4, 16) and nv.strides == (256, 64, 16, 1)
    assert view(nv, "x") is nv  # TensorViews pass through evtc.runtime.tensors.view
    assert conv_gemm.NOT_ROUTED is not None


# ---- what a call runs on, for the benchmarks' prebuilds ----------------------------------------------


def test_kernel_for_names_the_route_or_the_member():
    conv = evtc.Conv(bias_silu, kind="fprop", a=bf16, d=bf16, arch="sm90")
    label, k = conv.kernel_for((32, 56, 56, 256), (64, 1, 1, 256))
    gemm = conv.gemm_route.gemm
    assert label == f"gemm:{gemm.choose(32 * 56 * 56, 64, 256).name}"
    assert k.job().source in {j.source for j in gemm.jobs()}
    label, k = conv.kernel_for((8, 8, 8, 1280), (1280, 3, 3, 1280), evtc.ConvProblem(padding=1))
    assert (label, k.member) == ("m64_c4x1", "m64_c4x1")
    # 1x1 with stride 2 (ResNet's downsampling shortcut) stays on a conv kernel
    label, _ = conv.kernel_for((32, 56, 56, 256), (512, 1, 1, 256), evtc.ConvProblem(stride=2))
    assert not label.startswith("gemm")
    dgrad = evtc.Conv(bias_silu, kind="dgrad", a=bf16, d=bf16, arch="sm90")
    problem = evtc.ConvProblem(stride=2, padding=1, input_size=(16, 16))
    assert dgrad.kernel_for((2, 8, 8, 32), (32, 3, 3, 16), problem)[0] == "strided"


#: the UNet's unit-stride dgrad layers (dy N x P x Q x K, w K x 3 x 3 x C) -> the pick, with what
#: the kernels measured on the H100 (2026-11-26, benchmarks/explore_conv_dgrad.py: time / cuDNN's
#: dgrad + the eager dReLU in CUDA graphs; docs/performance.md)
UNET_DGRAD_PICKS = [
    ((8, 64, 64, 320), 320, "coop160"),     # coop160 0.418, base 0.497, coop128 0.565
    ((8, 32, 32, 640), 640, "coop160"),     # coop160 0.585, base 0.598
    # long-K: coop192_c2x1 0.601, streamk128_c4x1 0.660, coop160 0.754 (0.767 before), base 1.011
    ((8, 16, 16, 1280), 1280, "coop192_c2x1"),
    # long-K: m64_c4x1 0.621, streamk128_c4x1 0.655, streamk128 0.827 (0.810 before), base 1.086
    ((8, 8, 8, 1280), 1280, "m64_c4x1"),
    ((8, 32, 32, 640), 320, "coop160"),     # coop160 0.391, base 0.558
]


@pytest.mark.parametrize("dy,c,want", UNET_DGRAD_PICKS)
def test_unit_stride_dgrad_is_a_family(dy, c, want):
    """Unit-stride dgrad chooses among DGRAD_FAMILY (no coop128: slower than base on dgrad) with
    dy's channels as the persistent members' channel rule; strided dgrad and dy channels off the
    tile's K keep to the kernels that run them."""
    dgrad = evtc.Conv(bias_silu, kind="dgrad", a=bf16, d=bf16, arch="sm90")
    assert tuple(dgrad.family) == CF.DGRAD_FAMILY and "coop128" not in dgrad.family
    assert dgrad.gemm_route is None
    label, k = dgrad.kernel_for(dy, (dy[-1], 3, 3, c), evtc.ConvProblem(padding=1))
    assert (label, k.member) == (want, want)
    persistent = CF.is_persistent(k.config)
    assert ("evtc::Sm90ConvMainloopAsGemm<" in k.source) == persistent and "cutlass::conv::Operator::kDgrad" in k.source
    assert persistent or want == "m64_c4x1"
    # dy's channels off the tile's K (72): no persistent member, whatever the GEMM's shape
    label, _ = dgrad.kernel_for((8, 16, 16, 72), (72, 3, 3, 1280), evtc.ConvProblem(padding=1))
    assert CF.kernel_kind(dgrad.member(label).config) == "nonpersistent"
    # a 1x1 dgrad stays on a conv kernel (B would be N-major for the GEMM)
    label, _ = dgrad.kernel_for((8, 32, 32, 256), (256, 1, 1, 64), evtc.ConvProblem())
    assert not label.startswith("gemm")


def test_explore_and_bench_prebuild_lists():
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    for d in ("benchmarks", "tests/gpu"):
        if str(root / d) not in sys.path:
            sys.path.insert(0, str(root / d))
    import bench_conv
    import explore_conv

    assert {l.n for l in bench_conv.RESNET50} == {32} and {l.n for l in bench_conv.UNET} == {8}
    table = explore_conv.convs(("unet",))
    assert {name for (_, name) in table} == set(CF.CANDIDATES) | {"family"}
    assert all(isinstance(c, evtc.Conv) for c in table.values())
    jobs = explore_conv.kernels(("unet",))
    # one kernel per candidate (the family's picks are among them; no 1x1 layer in the UNet)
    assert len(jobs) == len(CF.CANDIDATES)
    rn = explore_conv.kernels(("resnet50",), candidates=("base",))
    assert any("[" in j.name and "bias_relu" in j.name for j in rn)  # the 1x1 layers' Gemm members


def test_the_gemm_sees_the_conv_kernels_problem():
    """The Gemm's checks of the route's views give the implicit GEMM's M, N, K, the output's row
    stride, and the same reduction outputs (shapes, identities for an empty call) as the conv
    kernel's binder of the same call."""
    from evtc.abi import ctypes_struct
    from evtc.abi import conv_abi_fields
    from evtc.runtime.conv_bind import ConvBinder

    conv = evtc.Conv(stats, kind="fprop", a=f16, d=f16, arch="sm90")
    x, w, D = packed((2, 8, 8, 16)), packed((32, 1, 1, 16)), packed((2, 8, 8, 32))
    kw = {"scale": FakeCuda((128,), typestr="<f4")}
    A, B, gkw, outs, _ = conv.gemm_route.views(x, w, kw, {"D": D})
    gsig, _ = conv.gemm_route.gemm.dispatch.prober.signature(A, B, gkw, outs)
    sp = evtc.ConvProblem().normalize(2)
    cb = ConvBinder(conv.graph, f16, f16, ctypes_struct(conv_abi_fields(conv.graph)), kind="fprop", dims=2,
                    layout="nhwc", spec=sp, arch="sm90", tile=conv.config.tile)
    csig, _ = cb.signature(x, w, kw, {"D": D})
    assert (gsig.M, gsig.N, gsig.K, gsig.L) == (csig.M, csig.N, csig.K, csig.L) == (128, 32, 16, 1)
    assert gsig.values["ld_D"] == csig.values["ld_D"] == 32
    assert [(a.name, a.shape) for a in gsig.allocs] == [(a.name, a.shape) for a in csig.allocs] == \
        [("row_max", (128,)), ("csum", (32,)), ("amax", ())]


def test_a_column_reduction_keeps_tile_n_a_multiple_of_64():
    """CUTLASS's column reduction (Sm90RowReduction) can't divide a 160-wide tile's row among its
    lanes (a static_assert deep in a template): a Conv pinned to such a tile is a PlanError naming
    the rule, and a family Conv of such an epilogue leaves those members out."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
    import epilogues as E

    with pytest.raises(evtc.PlanError, match="tile N = 160: a column reduction"):
        evtc.Conv(E.REFERENCE["dgelu_bgrad"], kind="fprop", a=bf16, d=bf16, arch="sm90",
                  config={"schedule": "cooperative", "tile": (128, 160, 64)})
    fam = evtc.Conv(E.REFERENCE["dgelu_bgrad"], kind="fprop", a=bf16, d=bf16, arch="sm90")
    assert "coop160" not in fam.family and "streamk160" not in fam.family and "coop128" in fam.family
    assert fam.choose(8 * 64 * 64, 320, 320 * 9, channels=320) == "coop128"
    # a row reduction (per row, over N) takes the 160-wide tile
    rows = evtc.Conv(E.REFERENCE["row_stats"], kind="fprop", a=bf16, d=bf16, arch="sm90")
    assert "coop160" in rows.family


def test_stream_k_decomposition_is_fixed_in_the_source():
    """A stream-K conv member's decomposition and splits are compile-time (the conv ABI has no
    scheduler arguments): the source sets them; the heuristic member sets CUTLASS's defaults."""
    split = evtc.Conv(bias_silu, kind="fprop", a=bf16, d=bf16, arch="sm90",
                      config={"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 160, 64), "split_k": 4,
                              "decomposition": "split_k"})
    assert "arguments.scheduler.splits = 4;" in split.source
    assert "decomposition_mode)>(2);" in split.source  # DecompositionMode::SplitK
    sk = evtc.Conv(bias_silu, kind="fprop", a=bf16, d=bf16, arch="sm90",
                   config=dict(CF.member_configs(bf16, ["streamk128"])["streamk128"].fields))
    assert "arguments.scheduler.splits = 1;" in sk.source and "decomposition_mode)>(0);" in sk.source
    coop = evtc.Conv(bias_silu, kind="fprop", a=bf16, d=bf16, arch="sm90", config={"schedule": "cooperative"})
    assert "arguments.scheduler.splits" not in coop.source and coop.config.tile == (128, 256, 64)
    with pytest.raises(evtc.ConfigError, match="decompositions of the stream-K tile scheduler"):
        conv_config("sm90", bf16, bf16, {"schedule": "cooperative", "split_k": 2, "decomposition": "split_k"})


def test_unit_stride_dgrad_runs_on_the_persistent_kernel_when_pinned():
    """dgrad pinned to the persistent kernel: the GEMM's K is dy's channels x filter taps, so the
    channel rule is on K (dy's channels); wgrad is refused (its B is the im2col operand)."""
    from evtc.runtime.conv_problem import check_arch_limits, geometry

    conv = evtc.Conv(bias_silu, kind="dgrad", a=bf16, d=bf16, arch="sm90",
                     config={"schedule": "cooperative", "tile": (128, 160, 64)})
    assert "evtc::Sm90ConvMainloopAsGemm<" in conv.source and "cutlass::conv::Operator::kDgrad" in conv.source
    assert conv.family == {"pinned": CF.ConvMember("pinned", {}, 1)}
    spec = evtc.ConvProblem(padding=1, input_size=(8, 8)).normalize(2)
    g = geometry("dgrad", 2, (2, 8, 8, 128), (128, 3, 3, 72), spec, None, "t")  # dy, w: K = 128, C = 72
    check_arch_limits(g, "sm90", bf16, tile=(128, 160, 64), persistent=True)
    g = geometry("dgrad", 2, (2, 8, 8, 72), (72, 3, 3, 128), spec, None, "t")   # K = 72
    with pytest.raises(evtc.ArgumentError, match="K = 72 is not a multiple of 64, the tile's K"):
        check_arch_limits(g, "sm90", bf16, tile=(128, 160, 64), persistent=True)
    with pytest.raises(evtc.ConfigError, match="not wgrad"):
        conv_config("sm90", bf16, bf16, {"schedule": "cooperative"}, kind="wgrad")


def test_the_strided_dgrad_kernel_takes_its_measured_tile_unless_configured():
    """NOTE [The strided-dgrad kernel's tile]: 128x128 of 128-byte K, 3 stages, on either arch's
    Conv, unless an sm80 Conv was given a configuration (then that one)."""
    from evtc.plan.conv import strided_dgrad_fields

    for arch in ("sm90", "sm80"):
        for config in (None, {}):
            conv = evtc.Conv(bias_silu, kind="dgrad", a=bf16, d=bf16, arch=arch, config=config)
            k = conv._kernel("sm80", True)
            assert (k.config.tile, k.config.warp_tile, k.config.stages) == ((128, 128, 64), (64, 64, 64), 3)
            assert "cutlass::gemm::GemmShape<128, 128, 64>" in k.source
    assert strided_dgrad_fields(f16)["tile"] == (128, 128, 64)
    pinned = evtc.Conv(bias_silu, kind="dgrad", a=bf16, d=bf16, arch="sm80",
                       config={"tile": (128, 64, 32), "warp_tile": (64, 32, 32), "stages": 4})
    k = pinned._kernel("sm80", True)
    assert (k.config.tile, k.config.stages) == ((128, 64, 32), 4) and "GemmShape<128, 64, 32>" in k.source


def test_stream_k_members_are_modelled_data_parallel_where_cutlass_runs_them_so():
    """CUTLASS's heuristic decomposition is data-parallel when the last wave is at least half full
    (tile_scheduler_params.h, get_num_sk_tiles): a stream-K member is then modelled as the
    persistent kernel of its tile; below half a wave, or with stream-K forced, as stream-K."""
    cfg = conv_config("sm90", bf16, bf16, {"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 160, 64)})
    coop = conv_config("sm90", bf16, bf16, {"schedule": "cooperative", "tile": (128, 160, 64)})
    forced = conv_config("sm90", bf16, bf16, {"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 160, 64),
                                                "decomposition": "stream_k"})
    M, N, K = 2048, 1280, 11520                      # 128 tiles of 128x160: DP on 132 SMs
    assert CF.modeled_time(cfg, 1, M, N, K, 132) == CF.modeled_time(coop, 1, M, N, K, 132)
    assert CF.modeled_time(forced, 1, M, N, K, 132) > CF.modeled_time(coop, 1, M, N, K, 132)  # 0.97 + 0.35 waves
    M = 512                                          # 32 tiles: stream-K
    assert CF.modeled_time(cfg, 1, M, N, K, 132) < CF.modeled_time(coop, 1, M, N, K, 132)


def test_long_k_members_only_on_long_k_problems():
    """NOTE [Long-K conv layers: the filter multicast]: K >= 2.5 max(M, N) chooses between the
    clusters along M only, by the wave model; no other problem takes them; fprop and dgrad alike."""
    conv = evtc.Conv(bias_silu, kind="fprop", a=bf16, d=bf16, arch="sm90")
    assert CF.long_k(2048, 1280, 11520) and CF.long_k(512, 1280, 11520) and not CF.long_k(2048, 1280, 5119)
    # one wave of 112 128x192 tiles (160 128x128 tiles: not stream-K; three waves of 64x128) /
    # one wave of 80 64x128 tiles / 80 128x128 tiles, data-parallel
    assert conv.choose(2048, 1280, 11520, channels=1280) == "coop192_c2x1"
    assert conv.choose(512, 1280, 11520, channels=1280) == "m64_c4x1"
    assert conv.choose(1568, 512, 4608, channels=512) == "m64_c4x1"
    assert conv.choose(2048, 640, 5760, channels=640) == "streamk128_c4x1"
    # a small long-K problem: stream-K over every SM
    assert conv.choose(128, 200, 4608, channels=512) == "streamk128_c4x1"
    # every other 3x3 layer of both sets: K < 4 max(M, N)
    for M, N, K in [(32768, 320, 2880), (8192, 640, 5760), (8192, 640, 2880), (8192, 320, 2880), (6272, 256, 2304),
                    (25088, 128, 1152), (100352, 64, 576)]:
        assert not CF.long_k(M, N, K) and conv.choose(M, N, K, channels=K // 9) not in CF.LONG_K_MEMBERS
    # channels off the persistent kernel's K tile: the non-persistent long-K member
    assert conv.choose(2048, 1280, 9000, channels=1000) == "m64_c4x1"
    # dgrad's family has them too (the UNet's 1280-channel dgrad layers, H100: coop192_c2x1 0.60
    # against coop160's 0.75, m64_c4x1 0.62 against streamk128's 0.83 of cuDNN + eager)
    dgrad = evtc.Conv(bias_silu, kind="dgrad", a=bf16, d=bf16, arch="sm90")
    assert set(CF.LONG_K_MEMBERS) <= set(dgrad.family) and "coop128" not in dgrad.family
    assert dgrad.choose(2048, 1280, 11520, channels=1280) == "coop192_c2x1"
    assert dgrad.choose(512, 1280, 11520, channels=1280) == "m64_c4x1"
