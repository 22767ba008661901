"""Convolution arguments: tensors and a problem -> the implicit GEMM, checked, and its arguments.

Input: the activation and filter tensors of a call (NHWC/NDHWC and KRSC/KTRSC, or torch's logical
NCHW order stored channels-last), a normalized :class:`ConvSpec` (stride, padding, dilation and
the sizes a gradient can't infer), the epilogue's keyword arguments. Output: a
:class:`ConvGeometry` (every extent of the convolution and of its implicit GEMM) and, through
:class:`ConvBinder` (a :class:`~evtc.runtime.bind.Binder`), the checked
:class:`~evtc.runtime.bind.Signature` that :class:`~evtc.runtime.launch.Launcher` launches.

# NOTE [Implicit GEMM of a convolution]
A convolution is a GEMM over implicit matrices (CUTLASS's ``implicit_gemm_problem_size``,
``conv/convolution.h``; ``conv/detail.hpp`` for 3.x):

==========  =======================  ==============  ==============  ==================
kind        computes                 M               N               K
==========  =======================  ==============  ==============  ==================
fprop       y = conv(x, w)           N*Z*P*Q         K               C*T*R*S
dgrad       dx = conv_transpose(dy)  N*D*H*W         C               K*T*R*S
wgrad       dw = grad_w(dy, x)       K               C*T*R*S         N*Z*P*Q
==========  =======================  ==============  ==============  ==================

with x of N x (D) x H x W x C, w of K x (T) x R x S x C and y (or dy) of N x (Z) x P x Q x K,
all packed channels-last. The epilogue's accumulator is the GEMM's M x N output tile, whose
row m is one packed row of the output: an output pixel's K (fprop) or C (dgrad) channels, or an
output channel's T*R*S*C filter taps (wgrad). So the epilogue's tensors are:

* M x N tensors (C, aux loads, outputs): the output's shape, packed rows of N elements (the
  pixel dimensions of an aux input may be strided: any tensor whose rows are M rows of one row
  stride), or a 2-D (M, N) matrix;
* row broadcasts (``RowVector``): length N, one value per output channel (fprop: K, dgrad: C;
  wgrad: one per filter tap and channel, T*R*S*C);
* column broadcasts (``ColVector``): length M, one value per output pixel (wgrad: per output
  channel K);
* reductions: a row reduction is (M,), a column reduction (N,) (e.g. the bias gradient of
  dgrad over pixels is a column reduction), a scalar reduction ().

There is no batch L: the convolution's batch N is part of M.
"""

from __future__ import annotations

import ctypes
import dataclasses
import itertools
import math
from collections.abc import Mapping
from typing import Any

from evtc.abi import AbiField, abi_fields
from evtc.dtypes import DType
from evtc.errors import ArgumentError
from evtc.ir.graph import Graph
from evtc.ir.nodes import Leaf, RowBroadcast, Store
from evtc.runtime import tensors
from evtc.runtime.bind import ALIGN, INT32_MAX, Binder, Extents, Operands, Signature
from evtc.runtime.tensors import TensorView, contiguous_strides

__all__ = [
    "CONV_FIELDS",
    "KINDS",
    "LAYOUTS",
    "OPERANDS",
    "ConvBinder",
    "ConvExtents",
    "ConvGeometry",
    "ConvSpec",
    "check_arch_limits",
    "conv_abi_fields",
    "geometry",
]

KINDS = ("fprop", "dgrad", "wgrad")
LAYOUTS = ("nhwc", "nchw")

#: (A, B, output) of each kind, by their names in messages: the GEMM's A and B operands
#: (CUTLASS's ``ConvProblemShape::set_shape_stride_ABC``: fprop x, w -> y; dgrad dy, w -> dx;
#: wgrad dy, x -> dw)
OPERANDS = {"fprop": ("x", "w", "y"), "dgrad": ("dy", "w", "dx"), "wgrad": ("dy", "x", "dw")}

#: The convolution's fields of ``evtc_args_t`` (after M, N, K, L): the activation's extents
#: (n, d, h, w, c), the filter's (k, t, r, s), the output's (z, p, q), symmetric padding,
#: traversal stride and dilation per spatial dimension (2-D problems: d = t = z = 1, pad_d = 0,
#: stride_d = dilation_d = 1).
CONV_FIELDS = ("conv_n", "conv_d", "conv_h", "conv_w", "conv_c", "conv_k", "conv_t", "conv_r", "conv_s",
               "conv_z", "conv_p", "conv_q", "pad_d", "pad_h", "pad_w", "stride_d", "stride_h", "stride_w",
               "dilation_d", "dilation_h", "dilation_w")


def conv_abi_fields(graph: Graph) -> tuple[AbiField, ...]:
    """The fields of a convolution kernel's ``evtc_args_t``: the GEMM's (:func:`evtc.abi.abi_fields`
    without the sm90 tile-scheduler arguments: the conv kernels take none) with
    :data:`CONV_FIELDS` after M, N, K, L. ``ld_A``/``bs_A``/``ld_B``/``bs_B`` are unused (0): the
    operands are packed and described by the conv fields."""
    base = abi_fields(graph, "sm80")
    conv = tuple(AbiField(n, "int32_t", None, "conv") for n in CONV_FIELDS)
    return base[:4] + conv + base[4:]


@dataclasses.dataclass(frozen=True)
class ConvSpec:
    """A :class:`evtc.ConvProblem` normalized for ``dims`` spatial dimensions (tuples of ints in
    D, H, W order, or H, W)."""

    stride: tuple[int, ...]
    padding: tuple[int, ...]
    dilation: tuple[int, ...]
    groups: int
    input_size: tuple[int, ...] | None
    filter_size: tuple[int, ...] | None

    @property
    def unit_stride(self) -> bool:
        return all(s == 1 for s in self.stride)


def output_extent(i: int, f: int, p: int, s: int, d: int) -> int:
    """Output extent of a convolution of extent ``i`` with a filter of ``f`` taps (torch's and
    CUTLASS's ``(i + 2p - d*(f-1) - 1) / s + 1``, rounded down)."""
    return (i + 2 * p - d * (f - 1) - 1) // s + 1


@dataclasses.dataclass(frozen=True)
class ConvGeometry:
    """Every extent of one convolution (NOTE [Implicit GEMM of a convolution]).

    Attributes:
        kind: ``fprop``, ``dgrad`` or ``wgrad``.
        dims: spatial dimensions, 2 or 3.
        n, c, k: batch, input channels, output channels.
        act: the activation's spatial extents (D, H, W or H, W).
        flt: the filter's (T, R, S or R, S).
        out: the output's (Z, P, Q or P, Q).
        padding, stride, dilation: per spatial dimension.
    """

    kind: str
    dims: int
    n: int
    c: int
    k: int
    act: tuple[int, ...]
    flt: tuple[int, ...]
    out: tuple[int, ...]
    padding: tuple[int, ...]
    stride: tuple[int, ...]
    dilation: tuple[int, ...]

    def shape(self, tensor: str) -> tuple[int, ...]:
        """The NHWC/KRSC shape of ``x`` (and dx), ``w`` (and dw) or ``y`` (and dy)."""
        t = tensor.lstrip("d") or tensor
        if t == "x":
            return (self.n, *self.act, self.c)
        if t == "w":
            return (self.k, *self.flt, self.c)
        return (self.n, *self.out, self.k)

    @property
    def gemm(self) -> tuple[int, int, int]:
        """(M, N, K) of the implicit GEMM."""
        pix_in, pix_out, taps = math.prod(self.act), math.prod(self.out), math.prod(self.flt)
        if self.kind == "fprop":
            return self.n * pix_out, self.k, self.c * taps
        if self.kind == "dgrad":
            return self.n * pix_in, self.c, self.k * taps
        return self.k, self.c * taps, self.n * pix_out

    @property
    def output(self) -> str:
        return OPERANDS[self.kind][2]

    def values(self) -> dict[str, int]:
        """The :data:`CONV_FIELDS` of ``evtc_args_t``."""
        pad = lambda t, v: ((v,) * (3 - self.dims)) + t
        d, h, w = pad(self.act, 1)
        t, r, s = pad(self.flt, 1)
        z, p, q = pad(self.out, 1)
        pd, ph, pw = pad(self.padding, 0)
        sd, sh, sw = pad(self.stride, 1)
        dd, dh, dw = pad(self.dilation, 1)
        return {"conv_n": self.n, "conv_d": d, "conv_h": h, "conv_w": w, "conv_c": self.c, "conv_k": self.k,
                "conv_t": t, "conv_r": r, "conv_s": s, "conv_z": z, "conv_p": p, "conv_q": q,
                "pad_d": pd, "pad_h": ph, "pad_w": pw, "stride_d": sd, "stride_h": sh, "stride_w": sw,
                "dilation_d": dd, "dilation_h": dh, "dilation_w": dw}


def _problem_error(msg: str, epilogue: str | None, hint: str | None = None) -> ArgumentError:
    return ArgumentError(msg, epilogue=epilogue, hint=hint, anchor="conv-problem")


def geometry(kind: str, dims: int, a_shape: tuple[int, ...], b_shape: tuple[int, ...], spec: ConvSpec,
             out_shape: tuple[int, ...] | None = None, epilogue: str | None = None) -> ConvGeometry:
    """The geometry of a call from the NHWC shapes of its two operands (and of its output, when
    the caller passed one).

    Args:
        kind, dims: the Conv's.
        a_shape, b_shape: NHWC/KRSC shapes of the operands (fprop x, w; dgrad dy, w; wgrad dy, x).
        spec: the normalized problem.
        out_shape: NHWC/KRSC shape of a given output, which fixes dgrad's input size and wgrad's
            filter size.

    Raises:
        ArgumentError: mismatched extents, a filter larger than the padded input, or a size
            that the operands don't determine (anchor ``conv-problem``).
    """
    an, bn, on = OPERANDS[kind]
    r = dims + 2
    for name, shape in ((an, a_shape), (bn, b_shape)) + (((on, out_shape),) if out_shape is not None else ()):
        if len(shape) != r:
            raise ArgumentError(f"argument '{name}' has {len(shape)} dimensions; a {dims}-D convolution takes "
                                f"{r}-D tensors", epilogue=epilogue)
    pad, stride, dil = spec.padding, spec.stride, spec.dilation

    def outs(act, flt):
        return tuple(output_extent(i, f, p, s, d) for i, f, p, s, d in zip(act, flt, pad, stride, dil))

    if kind == "fprop":
        n, *act, c = a_shape
        k, *flt, cw = b_shape
        if cw != c:
            raise ArgumentError(f"x has {c} channels and w {cw}: the filter's last extent is its input channels",
                                epilogue=epilogue, hint="w is K x R x S x C (KRSC)")
        act, flt = tuple(act), tuple(flt)
        out = outs(act, flt)
    elif kind == "dgrad":
        n, *out, k = a_shape
        kw, *flt, c = b_shape
        if kw != k:
            raise ArgumentError(f"dy has {k} channels and w has {kw} filters: they must agree", epilogue=epilogue,
                                hint="w is K x R x S x C (KRSC), dy N x P x Q x K")
        out, flt = tuple(out), tuple(flt)
        if out_shape is not None:
            act = tuple(out_shape[1:-1])
            if out_shape[0] != n or out_shape[-1] != c:
                raise ArgumentError(f"output 'dx' has shape {tuple(out_shape)}; dy and w give N = {n}, C = {c}",
                                    epilogue=epilogue)
        elif spec.input_size is not None:
            act = spec.input_size
        else:
            act = tuple((o - 1) * s - 2 * p + d * (f - 1) + 1 for o, f, p, s, d in zip(out, flt, pad, stride, dil))
            if not spec.unit_stride:
                lo = act
                hi = tuple(a + s - 1 for a, s in zip(act, stride))
                raise _problem_error(
                    f"dgrad with stride {spec.stride} can't tell the input's size from dy: inputs of {lo} to {hi} "
                    f"all give dy's {out}", epilogue,
                    hint="pass ConvProblem(input_size=...) (the forward input's spatial size) or out=dx")
    else:  # wgrad
        n, *out, k = a_shape
        nx, *act, c = b_shape
        if nx != n:
            raise ArgumentError(f"dy has batch {n} and x has batch {nx}: they must agree", epilogue=epilogue)
        out, act = tuple(out), tuple(act)
        if out_shape is not None:
            flt = tuple(out_shape[1:-1])
            if out_shape[0] != k or out_shape[-1] != c:
                raise ArgumentError(f"output 'dw' has shape {tuple(out_shape)}; dy and x give K = {k}, C = {c}",
                                    epilogue=epilogue)
        elif spec.filter_size is not None:
            flt = spec.filter_size
        else:
            flt_list = []
            for i, o, p, s, d in zip(act, out, pad, stride, dil):
                fits = [f for f in range(1, (i + 2 * p - 1) // d + 2) if output_extent(i, f, p, s, d) == o]
                if len(fits) != 1:
                    raise _problem_error(
                        f"wgrad can't tell the filter's size from x and dy: filters of {fits or 'no'} taps give "
                        f"{o} outputs from {i} inputs (stride {s}, padding {p}, dilation {d})", epilogue,
                        hint="pass ConvProblem(filter_size=...) or out=dw")
                flt_list.append(fits[0])
            flt = tuple(flt_list)
    if len(act) != dims or len(flt) != dims:
        raise _problem_error(f"input_size/filter_size need {dims} extents", epilogue)
    g = ConvGeometry(kind, dims, n, c, k, tuple(act), tuple(flt), tuple(out), pad, stride, dil)
    for i, f, p, s, d, o in zip(g.act, g.flt, pad, stride, dil, g.out):
        if min(i, f) < 1:
            raise _problem_error(f"a {kind} convolution with spatial extents {g.act} and filter {g.flt} is empty",
                                 epilogue)
        if d * (f - 1) + 1 > i + 2 * p:
            raise _problem_error(f"the filter ({g.flt}, dilation {dil}) is larger than the padded input "
                                 f"({g.act} + 2 x {pad})", epilogue)
        if output_extent(i, f, p, s, d) != o:
            have = "dy" if kind != "fprop" else "y"
            raise _problem_error(f"{have} has spatial extents {g.out}; x of {g.act} with filter {g.flt}, stride "
                                 f"{stride}, padding {pad}, dilation {dil} gives "
                                 f"{tuple(output_extent(*t) for t in zip(g.act, g.flt, pad, stride, dil))}", epilogue,
                                 hint="check the ConvProblem's stride, padding, dilation and input_size")
    return g


# ---- what each kernel can run -----------------------------------------------------------------------


def check_arch_limits(g: ConvGeometry, arch: str, a: DType, *, strided_dgrad: bool = False,
                      tile: tuple[int, int, int] | None = None, epilogue: str | None = None,
                      persistent: bool = False) -> None:
    """The limits of the kernel that runs ``g`` on ``arch`` (with CTA ``tile``; ``persistent``: on
    the persistent cooperative kernel), with where each comes from.

    Raises:
        ArgumentError: (anchor ``conv-problem``) the first limit the problem breaks.
    """
    vec = ALIGN // a.bytes
    for what, ch in (("C (input channels)", g.c), ("K (output channels)", g.k)):
        if ch % vec:
            raise _problem_error(
                f"{what} = {ch} is not a multiple of {vec}: every channel row must start on a 16-byte boundary "
                f"({vec} {a.name} elements)", epilogue,
                hint=("sm90's TMA im2col loads need 16-byte aligned channel rows (CUTLASS "
                      "sm90_implicit_gemm_gmma_ss_warpspecialized.hpp can_implement)" if arch == "sm90" else
                      "the sm80 kernel's iterators load 16-byte vectors along the channels (CUTLASS "
                      "conv2d_*_tile_access_iterator_optimized.h can_implement)") + "; pad the channels with zeros")
    m, n, k = g.gemm
    if max(m, n, k) > INT32_MAX:
        raise _problem_error(f"the implicit GEMM (M, N, K) = {(m, n, k)} has an extent beyond int32", epilogue,
                             hint="split the batch")
    if arch == "sm90":
        s_dims = g.dims
        pad_limit = 256 if s_dims == 2 else 16
        corner = 1 << (16 // s_dims - 1)
        offset = (1 << (16 // s_dims)) - 1
        src = "TMA im2col limits, CUTLASS sm90_implicit_gemm_gmma_ss_warpspecialized.hpp can_implement"
        for i in range(s_dims):
            p, f, d = g.padding[i], g.flt[i], g.dilation[i]
            if p > pad_limit:
                raise _problem_error(f"padding {p} exceeds {pad_limit} for a {s_dims}-D convolution ({src})", epilogue)
            if (f - 1) * d >= offset:
                raise _problem_error(f"the dilated filter extent (taps - 1) x dilation = {(f - 1) * d} must be below "
                                     f"{offset} for a {s_dims}-D convolution ({src})", epilogue)
            if g.kind in ("fprop", "wgrad"):
                lower, upper = -p, p - (f - 1) * d
            else:
                lower = p - (f - 1) * d
                upper = p - (f - 1) * d + g.act[i] - g.out[i]
            if not (-corner <= lower <= corner - 1 and -corner <= upper <= corner - 1):
                raise _problem_error(f"the im2col box corners ({lower}, {upper}) of spatial dimension {i} are outside "
                                     f"[{-corner}, {corner - 1}] ({src})", epilogue,
                                     hint="use less padding or dilation, or arch='sm80'")
        # the GEMM's K: fprop's C x filter taps, dgrad's K x filter taps (channels innermost)
        k_channels, k_name = (g.k, "K") if g.kind == "dgrad" else (g.c, "C")
        if persistent and tile is not None and k_channels % tile[2]:
            raise _problem_error(
                f"{k_name} = {k_channels} is not a multiple of {tile[2]}, the tile's K: the persistent conv kernel's "
                f"tile scheduler counts K tiles of the flat K = {k_name} x filter taps, the mainloop per filter tap "
                "(NOTE [Persistent conv kernels] in evtc/sm90_conv.hpp)", epilogue,
                hint="a Conv without config= runs such problems on the non-persistent kernel; or pin "
                     "config={'tile': (128, 128, 64)}")
        if g.kind == "wgrad" and tile is not None and g.c % tile[1]:
            raise _problem_error(
                f"C = {g.c} is not a multiple of the tile's N = {tile[1]}: the sm90 wgrad kernel tiles N = (C,S,R,T) "
                "mode by mode (CUTLASS's local_tile of the nested mode), which evtc's flat epilogue matches only "
                "when whole tiles of channels fit each filter tap", epilogue,
                hint="build the Conv with config={'tile': (128, n, 64)}, n a multiple of 16 dividing C, or use "
                     "arch='sm80'")
        if g.kind == "dgrad" and not all(s == 1 for s in g.stride) and not strided_dgrad:
            raise _problem_error(f"dgrad with stride {g.stride} on sm90: CUTLASS 3.x's sm90 conv kernels compute "
                                 "unit-stride dgrad only (its can_implement doesn't reject strides; evtc does)",
                                 epilogue, hint="use arch='sm80', whose strided-dgrad kernel also runs on Hopper")
    else:
        if g.kind in ("fprop", "dgrad") and max(g.flt) > 32:
            raise _problem_error(f"filter extents {g.flt}: the sm80 kernel's iterators take at most 32 taps per "
                                 "dimension (CUTLASS conv2d_fprop_activation_tile_access_iterator_optimized.h)", epilogue)
        if strided_dgrad and any(d > 1 for d in g.dilation):
            raise _problem_error(f"strided dgrad with dilation {g.dilation}: CUTLASS's strided-dgrad kernel takes "
                                 "dilation 1 only (conv/device/implicit_gemm_convolution.h can_implement)", epilogue)
        # CUTLASS 2.x device can_implement: every tensor below 2 GiB (32-bit offsets)
        for name in OPERANDS[g.kind]:
            nbytes = math.prod(g.shape(name)) * a.bytes
            if nbytes >= 1 << 31:
                raise _problem_error(f"'{name}' takes {nbytes} bytes: the sm80 conv kernels address each tensor with "
                                     "32-bit offsets (below 2 GiB; conv/device/implicit_gemm_convolution.h)", epilogue,
                                     hint="split the batch")


# ---- layouts ---------------------------------------------------------------------------------------


def to_nhwc(v: TensorView, layout: str) -> TensorView:
    """``v`` with its dimensions in NHWC (KRSC) order: unchanged for ``layout="nhwc"``; for
    ``"nchw"`` (torch's logical order), dimension 1 (channels) moved last."""
    if layout == "nchw" and len(v.shape) >= 3:
        order = (0, *range(2, len(v.shape)), 1)
        return dataclasses.replace(v, shape=tuple(v.shape[i] for i in order), strides=tuple(v.strides[i] for i in order))
    return v


def from_nhwc(shape: tuple[int, ...], strides: tuple[int, ...], layout: str) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Shape and strides of an NHWC-ordered tensor in the user's ``layout``."""
    if layout == "nchw" and len(shape) >= 3:
        order = (0, len(shape) - 1, *range(1, len(shape) - 1))
        return tuple(shape[i] for i in order), tuple(strides[i] for i in order)
    return shape, strides


def layout_hint(layout: str) -> str:
    """How to pass a tensor in ``layout`` whose memory is not the packed order it needs."""
    if layout == "nhwc":
        return ("pass a .contiguous() NHWC tensor; a torch tensor of logical shape N x C x H x W in "
                "channels_last memory needs Conv(..., layout='nchw')")
    return "pass x.contiguous(memory_format=torch.channels_last) (channels_last_3d for 3-D)"


def is_packed(v: TensorView) -> bool:
    """Row-major packed in the view's order, ignoring the strides of extent-1 dimensions."""
    return all(s == 1 or st == ps for s, st, ps in zip(v.shape, v.strides, contiguous_strides(v.shape)))


def as_rows(v: TensorView, rows: int, cols: int, col_dims: int = 1) -> TensorView | None:
    """The (rows, cols) matrix view of an NHWC-ordered tensor whose last ``col_dims`` dimensions
    hold ``cols`` contiguous elements (one output row: fprop/dgrad its channels, wgrad its taps
    and channels) and whose other dimensions collapse into ``rows`` rows of one row stride (each
    stride the next one times its extent; extent-1 dimensions ignored); None if they don't."""
    shape, strides = tuple(v.shape), tuple(v.strides)
    split = len(shape) - col_dims
    if math.prod(shape[:split]) != rows or math.prod(shape[split:]) != cols:
        return None

    def collapsible(dims):
        dims = [(s, st) for s, st in dims if s != 1]
        return all(st0 == st1 * s1 for (_, st0), (s1, st1) in itertools.pairwise(dims)), dims

    ok, col = collapsible(list(zip(shape[split:], strides[split:])))
    if not ok or (col and col[-1][1] != 1):
        return None
    ok, lead = collapsible(list(zip(shape[:split], strides[:split])))
    if not ok:
        return None
    ld = lead[-1][1] if lead and rows > 1 else max(cols, 1)
    return dataclasses.replace(v, shape=(rows, cols), strides=(ld, 1))


# ---- the binder ------------------------------------------------------------------------------------------


@dataclasses.dataclass
class ConvExtents(Extents):
    """:class:`~evtc.runtime.bind.Extents` of a convolution's implicit GEMM, with the output's
    NHWC (KRSC) shape, which its M x N tensors may take instead of (M, N)."""

    out_nhwc: tuple[int, ...] = ()


class ConvBinder(Binder):
    """Checks the arguments of one Conv call shape family (one :class:`ConvSpec`) and builds
    their :class:`~evtc.runtime.bind.Signature` (NOTE [Implicit GEMM of a convolution]).

    Args:
        graph: the epilogue after passes.
        a, b: operand dtypes (the GEMM's A and B).
        Args: the ctypes mirror of the kernel's ``evtc_args_t``.
        kind, dims, layout: the Conv's.
        spec: the normalized problem.
        arch: the arch of the kernel that runs the calls.
        strided_dgrad: the kernel is the strided-dgrad one.
        tile: the kernel's CTA tile (sm90 wgrad needs C a multiple of its N).
        persistent: the kernel is the persistent cooperative one (C a multiple of the tile's K).
    """

    # the implicit GEMM has no batch L and its M x N tensors are packed rows (the channels are
    # 16-byte multiples); a given output's ragged N (NOTE [Ragged N and TMA stores]) was never a
    # conv rule: only an e4m3 output of channels not a multiple of 16, in rows padded by the caller,
    # gets past the row-stride check
    batch_dims = False
    pad_rows = False
    refuse_ragged_stores = False

    def __init__(self, graph: Graph, a: DType, b: DType, Args: type[ctypes.Structure], *, kind: str, dims: int,
                 layout: str, spec: ConvSpec, arch: str, strided_dgrad: bool = False,
                 tile: tuple[int, int, int] | None = None, persistent: bool = False) -> None:
        super().__init__(graph, a, b, Args, arch="sm80", mn_tma=True)
        self.persistent = persistent
        self.arch = arch
        self.fields = conv_abi_fields(graph)
        self.kind = kind
        self.dims = dims
        self.layout = layout
        self.spec = spec
        self.strided_dgrad = strided_dgrad
        self.tile = tile
        self.names_ab = OPERANDS[kind][:2]

    def _nhwc(self, obj: Any, name: str) -> TensorView:
        return to_nhwc(tensors.view(obj, name, self.graph.name), self.layout)

    def signature(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any = None) -> tuple[Signature, list[int]]:
        """Check a call and build its Signature (see :meth:`Binder.signature`; the operands are the
        convolution's, named by their roles: x, w, dy).

        Raises:
            ArgumentError: the first problem, naming the argument.
        """
        self.check_names(kwargs, "the operands")
        an, bn = self.names_ab
        va, vb = self._nhwc(A, an), self._nhwc(B, bn)
        dev = self.device_of(va, an, "move the operands to a CUDA device")
        given = self._given_outputs(out)
        geo = self.geometry(va, vb, given, dev)
        M, N, K = geo.gemm
        x = ConvExtents(M, N, K, 1, False, dev, va.framework, "empty" if M == 0 or N == 0 else "launch",
                        geo.shape(geo.output))
        values: dict[str, int] = {"M": M, "N": N, "K": K, "L": 1, **geo.values(),
                                  "ld_A": 0, "bs_A": 0, "ld_B": 0, "bs_B": 0}
        ops = Operands(x.launches)
        ops.add(va, an, "p_A", self.a, output=False, mask=ALIGN - 1, mn=False, inplace=False)
        ops.add(vb, bn, "p_B", self.b, output=False, mask=ALIGN - 1, mn=False, inplace=False)
        self.bind_inputs(kwargs, x, ops, values)
        allocs, fills = self.bind_outputs(given, x, ops, values)
        sig, ptrs = self.finish(x, ops, values, allocs, fills)
        sig.geometry = geo  # type: ignore[attr-defined]
        return sig, ptrs

    def geometry(self, va: TensorView, vb: TensorView, given: Mapping[str, Any], dev: int) -> ConvGeometry:
        """The call's geometry (from the operands and a given output), with the operands checked
        and the kernel's limits.

        Raises:
            ArgumentError: the first problem, naming the argument or the problem's field.
        """
        out_shape = None
        for o in self.graph.outputs:
            if isinstance(o, Store) and o.name in given:
                ov = self._nhwc(given[o.name], f"out['{o.name}']")
                if len(ov.shape) == self.dims + 2:
                    out_shape = tuple(ov.shape)
                    break
        geo = geometry(self.kind, self.dims, tuple(va.shape), tuple(vb.shape), self.spec, out_shape, self.graph.name)
        for name, v, dt in ((self.names_ab[0], va, self.a), (self.names_ab[1], vb, self.b)):
            self._check(v, name, dt, [geo.shape(name)], dev, False)
            if any(s == 0 for s in v.shape):
                continue
            if not is_packed(v):
                raise self.error(f"argument '{name}' is not packed {'NHWC' if self.layout == 'nhwc' else 'channels-last'} "
                                 f"(shape {tuple(v.shape)}, strides {tuple(v.strides)} in NHWC order)",
                                 hint=layout_hint(self.layout))
            if v.ptr % ALIGN:
                raise self.error(f"argument '{name}' starts at an address that is not 16-byte aligned",
                                 hint="pass a fresh allocation, not an offset view")
        M, N, K = geo.gemm
        if K == 0 and M * N > 0:
            raise self.error("the convolution has no reduction extent (C, K or N is 0: the implicit GEMM's K = 0)",
                             hint="a convolution over zero channels has no accumulator; skip the call")
        if M and N:
            check_arch_limits(geo, self.arch, self.a, strided_dgrad=self.strided_dgrad, tile=self.tile,
                              epilogue=self.graph.name, persistent=self.persistent)
        return geo

    # ---- the binder core's hooks: M x N tensors are the output's shape or the (M, N) matrix --------

    def matrix(self, obj: Any, name: str, x: ConvExtents, *, output: bool) -> TensorView:  # type: ignore[override]
        """The (M, N) view of an M x N tensor given shaped like the output (in the Conv's layout)
        or as the implicit GEMM's (M, N) matrix.

        Raises:
            ArgumentError: another shape, or rows that are not M rows of one stride.
        """
        M, N = x.M, x.N
        v = tensors.view(obj, name, self.graph.name, writable=output)
        if len(v.shape) == 2:
            return v
        nv = to_nhwc(v, self.layout)
        out_nhwc = x.out_nhwc
        if tuple(nv.shape) == out_nhwc:
            mv = (as_rows(nv, M, N, self.dims + 1 if self.kind == "wgrad" else 1) if M * N else
                  dataclasses.replace(nv, shape=(M, N), strides=(N, 1)))
            if mv is None:
                raise self.error(f"argument '{name}' (shape {tuple(v.shape)}, strides {tuple(v.strides)}) is not M "
                                 f"rows of {N} contiguous elements with one row stride", hint=layout_hint(self.layout))
            return mv
        want = from_nhwc(out_nhwc, contiguous_strides(out_nhwc), self.layout)[0]
        raise self.error(f"argument '{name}' has shape {tuple(v.shape)}, expected the output's {want} or "
                         f"the implicit GEMM's ({M}, {N})")

    def allocation(self, out: Store, x: ConvExtents) -> tuple[tuple[int, ...], tuple[int, ...]]:  # type: ignore[override]
        """The output's packed NHWC (or channels-last) shape and strides.

        Raises:
            ArgumentError: rows that are not 16-byte multiples.
        """
        eb = out.dtype.bytes
        if (x.N * eb) % ALIGN and x.M > 1 and x.launches:
            raise self.error(f"output '{out.name}' would have rows of {x.N} x {eb} bytes: its packed "
                             f"{'NHWC' if self.layout == 'nhwc' else 'channels-last'} rows must be "
                             "multiples of 16 bytes", hint="use a wider dtype for it, or pad the channels")
        return from_nhwc(x.out_nhwc, contiguous_strides(x.out_nhwc), self.layout)

    def vector_mask(self, leaf: Leaf) -> int:
        """sm80's ``VisitorRowBroadcast`` loads whole vectors of the epilogue's access width."""
        if self.arch == "sm80" and isinstance(leaf, RowBroadcast):
            return ALIGN - 1
        return leaf.dtype.bytes - 1
