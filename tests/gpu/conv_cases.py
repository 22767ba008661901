"""The convolution GPU tests' kernels and problems, and the float64 reference of a conv call.

Imported by tests/gpu/test_conv_gpu.py and benchmarks/prebuild.py (its ``conv`` group builds every
kernel listed here, so a GPU session finds them in the cache). torch is imported only by the
functions that run on the GPU.
"""

from __future__ import annotations

import dataclasses
import math
import sys
from pathlib import Path

import evtc
from evtc import bf16, f16
from evtc.compiler import BuildJob
from evtc.family import conv as CF

ROOT = Path(__file__).resolve().parents[2]
if str(ROOT / "examples") not in sys.path:
    sys.path.insert(0, str(ROOT / "examples"))

import epilogues as E

#: the reference epilogues (examples/epilogues.py) that make sense on each kind: all of them on
#: fprop (fp8_out with 16-bit operands and an e4m3 output: the conv kernels take no fp8
#: operands); dgrad: the backward epilogues and the aux/residual ones; wgrad: scaling and
#: accumulating into a previous gradient (C), a bias-like row vector, aux loads and stores
EPILOGUES = {
    "fprop": ("linear_combination", "bias_relu", "gelu_aux", "dgelu_bgrad", "residual_scale", "row_stats", "fp8_out",
              "many_aux"),
    "dgrad": ("linear_combination", "bias_relu", "dgelu_bgrad", "residual_scale", "row_stats", "many_aux"),
    "wgrad": ("linear_combination", "bias_relu", "gelu_aux", "residual_scale", "many_aux"),
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One problem: NHWC extents of the activation (n, *spatial, c), the filter's spatial
    extents, the output channels k, and the ConvProblem's fields."""

    name: str
    n: int
    act: tuple[int, ...]
    c: int
    k: int
    flt: tuple[int, ...]
    stride: int | tuple = 1
    padding: int | tuple = 0
    dilation: int | tuple = 1

    @property
    def dims(self) -> int:
        return len(self.act)

    def problem(self, kind: str) -> evtc.ConvProblem:
        kw = {}
        if kind == "dgrad":
            kw["input_size"] = self.act
        if kind == "wgrad":
            kw["filter_size"] = self.flt
        return evtc.ConvProblem(stride=self.stride, padding=self.padding, dilation=self.dilation, **kw)


# Ragged channel counts (not multiples of the 128-wide tiles, multiples of 8 as the kernels need),
# odd spatial extents (M not a multiple of the tile), batch > 1.
CASES_2D = [
    Case("3x3_pad1", 2, (13, 11), 40, 72, (3, 3), padding=1),
    Case("3x3_stride2", 3, (16, 15), 24, 136, (3, 3), stride=2, padding=1),
    Case("3x3_dil2", 2, (12, 13), 16, 24, (3, 3), padding=2, dilation=2),
    Case("1x1", 4, (9, 7), 64, 40, (1, 1)),
    Case("5x3_asym", 2, (10, 9), 32, 48, (5, 3), stride=(1, 2), padding=(2, 1)),
]
CASES_3D = [
    Case("3x3x3_pad1", 2, (5, 7, 6), 16, 24, (3, 3, 3), padding=1),
    Case("1x3x3_stride", 2, (4, 9, 8), 32, 40, (1, 3, 3), stride=(1, 2, 2), padding=(0, 1, 1)),
]
# sm90 wgrad tiles N = (C,S,R,T) by channel blocks of the tile's N (64): C a multiple of 64
CASES_WGRAD_SM90 = [
    Case("3x3_pad1_c64", 2, (13, 11), 64, 72, (3, 3), padding=1),
    Case("3x3_stride2_c128", 2, (14, 15), 128, 40, (3, 3), stride=2, padding=1),
]
CASES_WGRAD_SM90_3D = [Case("3x3x3_c64", 2, (4, 6, 5), 64, 24, (3, 3, 3), padding=1)]
# dgrad with stride > 1 (the sm80 strided-dgrad kernel, on either arch): dx sizes that stride 2
# reaches exactly and with a remainder (torch's output_padding)
CASES_STRIDED_DGRAD = [
    Case("s2_even", 2, (14, 12), 40, 72, (3, 3), stride=2, padding=1),
    Case("s2_odd", 3, (13, 11), 24, 32, (3, 3), stride=2, padding=1),
    Case("s3_1x1", 2, (12, 9), 16, 24, (1, 1), stride=3),
    Case("s2_4x4", 1, (16, 16), 32, 48, (4, 4), stride=2, padding=1),
]
CASES_STRIDED_DGRAD_3D = [Case("s2_3d", 2, (6, 8, 7), 16, 24, (3, 3, 3), stride=2, padding=1)]


def cases(kind: str, dims: int, arch: str) -> list[Case]:
    if kind == "wgrad" and arch == "sm90":
        return CASES_WGRAD_SM90 if dims == 2 else CASES_WGRAD_SM90_3D
    base = CASES_2D if dims == 2 else CASES_3D
    if kind == "dgrad":  # unit-stride here; strided dgrad has its own cases
        base = [c for c in base if all(s == 1 for s in ((c.stride,) * dims if isinstance(c.stride, int) else c.stride))]
    return base


def conv_for(name: str, kind: str, dims: int, arch: str, dtype=bf16, layout: str = "nhwc", *,
             family: bool = False) -> evtc.Conv:
    """The Conv of a reference epilogue: operands, C and D of ``dtype`` (fp8_out: e4m3 D).

    ``family=False`` pins the default configuration (``config={}``: the kernel a Conv had before
    families, byte-identical), so that the matrix tests each kind's one kernel; ``family=True``
    is a user's Conv (sm90 fprop: members chosen per problem, 1x1 problems on a Gemm)."""
    ep = E.REFERENCE[name]
    d = evtc.e4m3 if name == "fp8_out" else dtype
    return evtc.Conv(ep, kind=kind, dims=dims, a=dtype, b=dtype, c=dtype, d=d, arch=arch, layout=layout,
                     config=None if family else {})


#: the kernels of the default GPU run: (epilogue, kind, dims, arch, dtype)
MATRIX = (
    [(n, "fprop", 2, arch, bf16) for n in EPILOGUES["fprop"] for arch in ("sm90", "sm80")]
    + [(n, "dgrad", 2, arch, bf16) for n in EPILOGUES["dgrad"] for arch in ("sm90", "sm80")]
    + [(n, "wgrad", 2, arch, bf16) for n in EPILOGUES["wgrad"] for arch in ("sm90", "sm80")]
    + [(n, kind, 3, arch, bf16) for kind, n in (("fprop", "bias_relu"), ("dgrad", "dgelu_bgrad"),
                                                ("wgrad", "linear_combination")) for arch in ("sm90", "sm80")]
    + [("bias_relu", "fprop", 2, arch, f16) for arch in ("sm90", "sm80")]
)
#: strided dgrad: (epilogue, dims) on the sm80 strided kernel (a dgrad Conv of either arch uses it)
STRIDED = [("dgelu_bgrad", 2), ("residual_scale", 2), ("row_stats", 2), ("many_aux", 2), ("linear_combination", 3)]


def kernels(convs) -> list:
    """The :class:`evtc.compiler.BuildJob` of every kernel of ``convs`` (strided dgrad's included), for
    evtc.compiler.build_many / benchmarks/common.build_all."""
    out = []
    for conv, strided in convs:
        if strided:
            k = conv._kernel("sm80", True)
        else:
            k = conv._kernels[(conv.arch, False)]
        out.append(BuildJob(k.source, k.arch, conv.name))
    return out


#: the other compile-time choices of strided dgrad's row arithmetic (FastDivmod or division, for
#: loads and stores; STRIDED's kernels take the default (True, True)), on an epilogue with aux
#: loads, a column broadcast and a store
DIVMOD_VARIANTS = [(False, False), (True, False), (False, True)]
DIVMOD_EPILOGUE = "residual_scale"


def divmod_conv(fast: tuple[bool, bool]) -> evtc.Conv:
    return evtc.Conv(E.REFERENCE[DIVMOD_EPILOGUE], kind="dgrad", a=bf16, c=bf16, d=bf16, arch="sm80", fast_divmod=fast)


def all_convs() -> list:
    """(Conv, strided) of every kernel the GPU tests build."""
    out = [(conv_for(*m[:4], dtype=m[4]), False) for m in MATRIX]
    out += [(conv_for(n, "dgrad", dims, "sm80"), True) for n, dims in STRIDED]
    out += [(divmod_conv(f), True) for f in DIVMOD_VARIANTS]
    out.append((conv_for("bias_relu", "fprop", 2, "sm90", layout="nchw"), False))
    return out


# ---- the sm90 fprop family: the 1x1 GEMM route and the members ------------------------------------------

#: 1x1 problems (stride 1, no padding) that family Convs run on their Gemm (NOTE [1x1 convolutions
#: as GEMMs]): ragged M, channel counts not multiples of the tiles, batch > 1
CASES_1X1 = [
    Case("1x1_route", 4, (9, 7), 64, 48, (1, 1)),
    Case("1x1_route_wide", 2, (24, 20), 40, 136, (1, 1)),
    Case("1x1_route_big", 8, (32, 32), 64, 256, (1, 1)),   # most of a wave: the Gemm's streamk member
]
CASES_1X1_3D = [Case("1x1x1_route", 2, (3, 5, 6), 32, 24, (1, 1, 1))]
#: epilogues on the route: every role (C, aux loads and stores, row and column broadcasts, row,
#: column and scalar reductions, an fp8 output)
ROUTE_EPILOGUES = ("bias_relu", "gelu_aux", "dgelu_bgrad", "residual_scale", "row_stats", "fp8_out", "many_aux")
#: (epilogue, dims, layout) of the route's tests
ROUTE = [(n, 2, "nhwc") for n in ROUTE_EPILOGUES] + [("bias_relu", 3, "nhwc"), ("bias_relu", 2, "nchw")]
#: a family member other than the default: what the heuristic picks for the small CASES_2D
#: (fprop, unit or any stride) is checked to be this one, then run
MEMBER = "m64"
MEMBER_EPILOGUES = ("bias_relu", "row_stats", "many_aux")


#: the members on the persistent cooperative kernel (NOTE [Persistent conv kernels]) and the
#: problems they are checked on: the channels of the GEMM's K (fprop's C, dgrad's K) multiples of
#: the tile's K (64), ragged GEMM N (fprop's K, dgrad's C: below, between and above the 128- and
#: 256-wide tiles), M not a multiple of the tile, batch > 1, stride (fprop), dilation, and a long
#: K over two output tiles (the stream-K members split it)
PERSISTENT_MEMBERS = ("coop", "coop128", "coop160", "coop_c2x1", "streamk", "streamk128", "streamk160", "splitk4_160",
                      # the long-K members (clusters along M: the filter multicast) and the ping-pong kernel
                      "coop192_c2x1", "streamk128_c4x1", "pp128", "pp192_c2x1")
PERSISTENT_EPILOGUES = ("bias_relu", "row_stats", "many_aux", "dgelu_bgrad")
CASES_PERSISTENT = [
    Case("p_3x3_pad1", 2, (13, 11), 64, 72, (3, 3), padding=1),
    Case("p_3x3_stride2", 3, (16, 15), 128, 136, (3, 3), stride=2, padding=1),
    Case("p_3x3_dil2", 2, (12, 13), 64, 264, (3, 3), padding=2, dilation=2),
    Case("p_long_k", 2, (8, 8), 512, 200, (3, 3), padding=1),
]
#: fp8_out (an e4m3 D and its amax) on the persistent and the stream-K kernel: e4m3 rows need N a
#: multiple of 16; a long K over few tiles for the stream-K member's partial tiles
PERSISTENT_FP8_MEMBERS = ("coop128", "streamk128")
CASES_PERSISTENT_FP8 = [
    Case("p_fp8_pad1", 2, (13, 11), 64, 144, (3, 3), padding=1),
    Case("p_fp8_long_k", 2, (8, 8), 512, 160, (3, 3), padding=1),
]
#: unit-stride dgrad: every member of its family (NOTE [The sm90 conv family]) but ``base`` (the
#: matrix's dgrad kernel), pinned, on the epilogues with reductions and aux tensors
PERSISTENT_DGRAD_MEMBERS = tuple(m for m in CF.DGRAD_FAMILY if m != "base")
PERSISTENT_DGRAD_EPILOGUES = ("row_stats", "many_aux", "dgelu_bgrad")
CASES_PERSISTENT_DGRAD = [
    Case("pd_3x3_pad1", 2, (13, 11), 72, 64, (3, 3), padding=1),
    Case("pd_3x3_dil2", 2, (12, 13), 264, 128, (3, 3), padding=2, dilation=2),
    Case("pd_long_k", 2, (8, 8), 200, 512, (3, 3), padding=1),
]


def persistent_conv(name: str, member: str, kind: str = "fprop") -> evtc.Conv:
    """A Conv of reference epilogue ``name`` pinned to the family member ``member``."""
    fields = dict(CF.member_configs(bf16, [member])[member].fields)
    d = evtc.e4m3 if name == "fp8_out" else bf16
    return evtc.Conv(E.REFERENCE[name], kind=kind, a=bf16, b=bf16, c=bf16, d=d, arch="sm90", config=fields)


#: pairs a Conv refuses (a PlanError: dgelu_bgrad's column reduction needs a tile N that is a multiple of 64)
PERSISTENT_REFUSED = {("dgelu_bgrad", "coop160"), ("dgelu_bgrad", "streamk160"), ("dgelu_bgrad", "splitk4_160")}


def persistent_pairs() -> list[tuple[str, str, str]]:
    """(epilogue, member, kind) of the persistent tests."""
    return ([(n, m, "fprop") for n in PERSISTENT_EPILOGUES for m in PERSISTENT_MEMBERS if (n, m) not in PERSISTENT_REFUSED]
            + [("fp8_out", m, "fprop") for m in PERSISTENT_FP8_MEMBERS]
            + [(n, m, "dgrad") for n in PERSISTENT_DGRAD_EPILOGUES for m in PERSISTENT_DGRAD_MEMBERS
               if (n, m) not in PERSISTENT_REFUSED])


def persistent_convs() -> dict:
    return {(n, m, k): persistent_conv(n, m, k) for n, m, k in persistent_pairs()}


def persistent_kernels() -> list[BuildJob]:
    return [BuildJob(c.source, "sm90", f"{c.name}[{m}]") for (_, m, _), c in persistent_convs().items()]


def route_cases(dims: int) -> list[Case]:
    return CASES_1X1 if dims == 2 else CASES_1X1_3D


def chosen_job(conv: evtc.Conv, case: Case) -> BuildJob:
    """The build job of the kernel a family Conv runs ``case`` (fprop) on: its Gemm's member for a
    1x1 problem, else the conv member its heuristic picks (:meth:`evtc.Conv.kernel_for`)."""
    a_shape, b_shape, _ = operand_shapes(conv.kind, case)
    return conv.kernel_for(a_shape, b_shape, case.problem(conv.kind))[1].job()


#: long-K problems (NOTE [Long-K conv layers: the filter multicast]) a family Conv runs on a long-K
#: member: the UNet's two 1280-channel 3x3 layers (coop192_c2x1, m64_c4x1), ResNet-50's res5 3x3
#: (m64_c4x1) and a small one (streamk128_c4x1, one M tile in a cluster of four)
LONG_K_EPILOGUES = ("row_stats", "many_aux")
CASES_LONG_K = [
    Case("lk_unet_1280_16", 8, (16, 16), 1280, 1280, (3, 3), padding=1),
    Case("lk_unet_1280_8", 8, (8, 8), 1280, 1280, (3, 3), padding=1),
    Case("lk_small", 2, (8, 8), 512, 200, (3, 3), padding=1),
    Case("lk_res5", 32, (7, 7), 512, 512, (3, 3), padding=1),  # ResNet-50's res5 3x3: 25 M tiles in clusters of 4
]


def family_convs() -> list[tuple[evtc.Conv, list[Case]]]:
    """(family Conv, its cases) of the route's, the member's and the long-K GPU tests."""
    out = [(conv_for(n, "fprop", dims, "sm90", layout=layout, family=True), route_cases(dims))
           for n, dims, layout in ROUTE]
    out += [(conv_for(n, "fprop", 2, "sm90", family=True), CASES_2D) for n in MEMBER_EPILOGUES]
    out += [(conv_for(n, "fprop", 2, "sm90", family=True), CASES_LONG_K) for n in LONG_K_EPILOGUES]
    return out


#: the dgrad family's GPU test: a user's dgrad Conv (no config) on cases its heuristic sends to a
#: stream-K member, the 64x128 tile and (stride 2) the strided-dgrad kernel
DGRAD_FAMILY_EPILOGUES = ("row_stats", "many_aux")
CASES_DGRAD_FAMILY = CASES_PERSISTENT_DGRAD + CASES_2D


def dgrad_family_convs() -> dict[str, evtc.Conv]:
    return {n: conv_for(n, "dgrad", 2, "sm90", family=True) for n in DGRAD_FAMILY_EPILOGUES}


def dgrad_family_kernels() -> list[BuildJob]:
    """Every kernel the dgrad family's test runs (one job per distinct source)."""
    return chosen_jobs((conv, CASES_DGRAD_FAMILY) for conv in dgrad_family_convs().values())


def chosen_jobs(pairs) -> list[BuildJob]:
    """The build jobs of the kernels family Convs run their cases on, each source once
    (``pairs``: (family Conv, its cases))."""
    jobs = {}
    for conv, cs in pairs:
        for case in cs:
            j = chosen_job(conv, case)
            jobs.setdefault(j.source, j)
    return list(jobs.values())


def family_kernels() -> list[BuildJob]:
    """Every kernel the route's and the member's tests run (one job per distinct source)."""
    return chosen_jobs(family_convs())


# ---- the reference ----------------------------------------------------------------------------------


def _nchw(t):
    """NHWC-ordered tensor -> NCHW-ordered (a view)."""
    return t.permute(0, t.dim() - 1, *range(1, t.dim() - 1))


def _nhwc(t):
    return t.permute(0, *range(2, t.dim()), 1)


def exact_accumulator(kind: str, a, b, geo):
    """(acc, sum of squared products) of the implicit GEMM in float64, (M, N) numpy arrays: torch's
    conv (fprop), the input gradient (dgrad, ``torch.nn.grad.conv{2,3}d_input``) and the weight
    gradient (wgrad, ``conv{2,3}d_weight``) of the NHWC operands ``a``, ``b``, on the CPU in
    float64."""
    import torch
    import torch.nn.functional as F
    import torch.nn.grad as G

    dims = geo.dims
    conv = F.conv2d if dims == 2 else F.conv3d
    conv_input = G.conv2d_input if dims == 2 else G.conv3d_input
    conv_weight = G.conv2d_weight if dims == 2 else G.conv3d_weight
    kw = {"stride": geo.stride, "padding": geo.padding, "dilation": geo.dilation}
    M, N, _ = geo.gemm

    def run(a64, b64):
        if kind == "fprop":
            y = conv(_nchw(a64), _nchw(b64), **kw)
            return _nhwc(y).reshape(M, N)
        if kind == "dgrad":
            dx = conv_input((geo.n, geo.c, *geo.act), _nchw(b64), _nchw(a64), **kw)
            return _nhwc(dx).reshape(M, N)
        dw = conv_weight(_nchw(b64), (geo.k, geo.c, *geo.flt), _nchw(a64), **kw)
        return _nhwc(dw).reshape(M, N)

    a64 = a.detach().to("cpu", torch.float64)
    b64 = b.detach().to("cpu", torch.float64)
    acc = run(a64, b64).numpy()
    sq = run(a64 * a64, b64 * b64).numpy()
    return acc, sq


def operand_shapes(kind: str, case: Case) -> tuple[tuple, tuple, object]:
    """NHWC shapes of the two operands of ``kind`` and the geometry."""
    from evtc.runtime.conv_problem import geometry

    x = (case.n, *case.act, case.c)
    w = (case.k, *case.flt, case.c)
    sp = case.problem(kind).normalize(case.dims)
    g = geometry("fprop", case.dims, x, w, dataclasses.replace(sp, input_size=None, filter_size=None))
    y = (case.n, *g.out, case.k)
    a, b = {"fprop": (x, w), "dgrad": (y, w), "wgrad": (y, x)}[kind]
    return a, b, geometry(kind, case.dims, a, b, sp)


def scale_for(K: int) -> float:
    return K ** -0.25  # acc = O(1) (as evtc.testing.make_inputs)


def ceil8(x: int) -> int:
    return -(-x // 8) * 8


__all__ = [
    "CASES_1X1",
    "CASES_2D",
    "CASES_3D",
    "EPILOGUES",
    "MATRIX",
    "STRIDED",
    "Case",
    "all_convs",
    "cases",
    "chosen_job",
    "family_convs",
    "family_kernels",
    "conv_for",
    "exact_accumulator",
    "kernels",
    "math",
    "operand_shapes",
    "scale_for",
]
