"""A convolution call's problem: a ConvProblem and operand shapes -> every extent of the
convolution and of its implicit GEMM, checked.

Input: a :class:`ConvProblem` (stride, padding, dilation and the sizes a gradient can't infer),
the NHWC/KRSC shapes of a call's operands (and of a given output), and the kernel that would
run it. Output: a normalized :class:`ConvSpec` (:meth:`ConvProblem.normalize`), a
:class:`ConvGeometry` (:func:`geometry`), the limits of each kernel (:func:`check_arch_limits`),
and the views between the user's layout and NHWC order (:func:`to_nhwc`, :func:`from_nhwc`,
:func:`as_rows`). Every check raises an :class:`~evtc.errors.ArgumentError` naming the argument.

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

import dataclasses
import itertools
import math
import numbers
from collections.abc import Sequence
from typing import Any

from evtc.abi import CONV_OPERANDS
from evtc.dtypes import DType
from evtc.errors import ArgumentError
from evtc.runtime.bind import ALIGN, INT32_MAX
from evtc.runtime.tensors import TensorView, contiguous_strides

__all__ = ["LAYOUTS", "ConvGeometry", "ConvProblem", "ConvSpec", "as_rows", "check_arch_limits", "filters_giving",
           "from_nhwc", "geometry", "is_packed", "layout_hint", "output_extent", "to_nhwc"]

#: the orders a Conv takes and returns its tensors in (NOTE [Implicit GEMM of a convolution])
LAYOUTS = ("nhwc", "nchw")

@dataclasses.dataclass(frozen=True)
class ConvProblem:
    """The parameters of one convolution call (torch's ``conv2d``/``conv3d`` conventions).

    Attributes:
        stride: traversal stride, an int or one per spatial dimension (D, H, W order).
        padding: symmetric zero padding, an int or one per spatial dimension.
        dilation: filter dilation, an int or one per spatial dimension.
        groups: must be 1 (grouped convolutions are not supported).
        input_size: dgrad only: the spatial extents of dx (the forward input), which dy doesn't
            determine when the stride is above 1 (several input sizes give one output size; torch's
            ``conv_transpose`` calls it ``output_padding``). Not needed with ``out=`` given.
        filter_size: wgrad only: the spatial extents of dw, when x and dy don't determine them.

    Example::

        evtc.ConvProblem(stride=2, padding=1)                          # fprop, ResNet downsampling
        evtc.ConvProblem(stride=2, padding=1, input_size=(56, 56))     # its dgrad
    """

    stride: int | Sequence[int] = 1
    padding: int | Sequence[int] = 0
    dilation: int | Sequence[int] = 1
    groups: int = 1
    input_size: Sequence[int] | None = None
    filter_size: Sequence[int] | None = None

    def normalize(self, dims: int, epilogue: str | None = None) -> ConvSpec:
        """The problem for ``dims`` spatial dimensions as tuples of ints.

        Raises:
            ArgumentError: (anchor ``conv-problem``) a value of the wrong type or range, groups != 1.
        """

        def fail(msg: str, hint: str | None = None) -> ArgumentError:
            return ArgumentError(f"problem: {msg}", epilogue=epilogue, hint=hint, anchor="conv-problem")

        def spatial(name: str, value: Any, lo: int, optional: bool = False) -> tuple[int, ...] | None:
            if value is None and optional:
                return None
            # (a numpy integer is an int here too, as torch's conv2d takes it: numbers.Integral)
            if isinstance(value, numbers.Integral) and not isinstance(value, bool):
                value = (value,) * dims
            try:
                t = tuple(value)
            except TypeError:
                raise fail(f"{name} = {value!r} is not an int or a sequence of {dims} ints") from None
            if len(t) != dims or not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in t):
                raise fail(f"{name} = {value!r} needs {dims} ints (one per spatial dimension, "
                           f"{'D, H, W' if dims == 3 else 'H, W'})")
            t = tuple(int(v) for v in t)
            if any(v < lo for v in t):
                raise fail(f"{name} = {t}: each must be at least {lo}")
            if any(v > INT32_MAX for v in t):
                raise fail(f"{name} = {t}: each must be below 2^31 (the conv kernels' int32 problem fields)")
            return t

        if not isinstance(self.groups, numbers.Integral) or isinstance(self.groups, bool) or self.groups != 1:
            raise fail(f"groups = {self.groups!r}: evtc's convolutions are not grouped (groups = 1); CUTLASS's sm90 "
                       "conv collective refuses groups > 1 (sm90_implicit_gemm_gmma_ss_warpspecialized.hpp)",
                       hint="run each group as its own convolution")
        return ConvSpec(spatial("stride", self.stride, 1), spatial("padding", self.padding, 0),
                        spatial("dilation", self.dilation, 1), 1,
                        spatial("input_size", self.input_size, 1, True), spatial("filter_size", self.filter_size, 1, True))


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
        return CONV_OPERANDS[self.kind][2]

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
    an, bn, on = CONV_OPERANDS[kind]
    r = dims + 2
    for name, shape in ((an, a_shape), (bn, b_shape)) + (((on, out_shape),) if out_shape is not None else ()):
        if len(shape) != r:
            raise ArgumentError(f"argument '{name}' has {len(shape)} dimensions; a {dims}-D convolution takes "
                                f"{r}-D tensors", epilogue=epilogue)
    extents = {"fprop": _fprop_extents, "dgrad": _dgrad_extents, "wgrad": _wgrad_extents}[kind]
    n, c, k, act, flt, out = extents(a_shape, b_shape, spec, out_shape, epilogue)
    if len(act) != dims or len(flt) != dims:
        raise _problem_error(f"input_size/filter_size need {dims} extents", epilogue)
    pad, stride, dil = spec.padding, spec.stride, spec.dilation
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


def _fprop_extents(x: tuple[int, ...], w: tuple[int, ...], spec: ConvSpec, out_shape: tuple[int, ...] | None,
                   epilogue: str | None) -> tuple:
    """(n, c, k, act, flt, out) of an fprop from x and w: the output's extents follow."""
    n, *act, c = x
    k, *flt, cw = w
    if cw != c:
        raise ArgumentError(f"x has {c} channels and w {cw}: the filter's last extent is its input channels",
                            epilogue=epilogue, hint="w is K x R x S x C (KRSC)")
    out = tuple(output_extent(i, f, p, s, d)
                for i, f, p, s, d in zip(act, flt, spec.padding, spec.stride, spec.dilation))
    return n, c, k, tuple(act), tuple(flt), out


def _dgrad_extents(dy: tuple[int, ...], w: tuple[int, ...], spec: ConvSpec, out_shape: tuple[int, ...] | None,
                   epilogue: str | None) -> tuple:
    """(n, c, k, act, flt, out) of a dgrad from dy and w: the input's size from the output given,
    ``input_size``, or (unit stride only) dy."""
    n, *out, k = dy
    kw, *flt, c = w
    if kw != k:
        raise ArgumentError(f"dy has {k} channels and w has {kw} filters: they must agree", epilogue=epilogue,
                            hint="w is K x R x S x C (KRSC), dy N x P x Q x K")
    out, flt = tuple(out), tuple(flt)
    if out_shape is not None:
        act = _given_output(out_shape, "dx", "dy and w", ("N", n), c, epilogue)
    elif spec.input_size is not None:
        act = spec.input_size
    else:
        act = tuple((o - 1) * s - 2 * p + d * (f - 1) + 1
                    for o, f, p, s, d in zip(out, flt, spec.padding, spec.stride, spec.dilation))
        if not spec.unit_stride:
            hi = tuple(a + s - 1 for a, s in zip(act, spec.stride))
            raise _problem_error(
                f"dgrad with stride {spec.stride} can't tell the input's size from dy: inputs of {act} to {hi} "
                f"all give dy's {out}", epilogue,
                hint="pass ConvProblem(input_size=...) (the forward input's spatial size) or out=dx")
    return n, c, k, act, flt, out


def _wgrad_extents(dy: tuple[int, ...], x: tuple[int, ...], spec: ConvSpec, out_shape: tuple[int, ...] | None,
                   epilogue: str | None) -> tuple:
    """(n, c, k, act, flt, out) of a wgrad from dy and x: the filter's size from the output given,
    ``filter_size``, or the one filter extent per dimension that maps x's extent to dy's."""
    n, *out, k = dy
    nx, *act, c = x
    if nx != n:
        raise ArgumentError(f"dy has batch {n} and x has batch {nx}: they must agree", epilogue=epilogue)
    out, act = tuple(out), tuple(act)
    if out_shape is not None:
        flt = _given_output(out_shape, "dw", "dy and x", ("K", k), c, epilogue)
    elif spec.filter_size is not None:
        flt = spec.filter_size
    else:
        flt_list = []
        for i, o, p, s, d in zip(act, out, spec.padding, spec.stride, spec.dilation):
            fits = filters_giving(i, o, p, s, d)
            if len(fits) != 1:
                taps = list(fits) if len(fits) <= 16 else f"{fits.start} to {fits.stop - 1}"
                raise _problem_error(
                    f"wgrad can't tell the filter's size from x and dy: filters of {taps or 'no'} taps give "
                    f"{o} outputs from {i} inputs (stride {s}, padding {p}, dilation {d})", epilogue,
                    hint="pass ConvProblem(filter_size=...) or out=dw")
            flt_list.append(fits[0])
        flt = tuple(flt_list)
    return n, c, k, act, flt, out


def _given_output(out_shape: tuple[int, ...], name: str, operands: str, lead: tuple[str, int], c: int,
                  epilogue: str | None) -> tuple[int, ...]:
    """The spatial extents a given gradient output fixes (dgrad's dx, wgrad's dw), whose leading
    and channel extents must be the operands'."""
    if out_shape[0] != lead[1] or out_shape[-1] != c:
        raise ArgumentError(f"output '{name}' has shape {tuple(out_shape)}; {operands} give {lead[0]} = {lead[1]}, "
                            f"C = {c}", epilogue=epilogue)
    return tuple(out_shape[1:-1])


def filters_giving(i: int, o: int, p: int, s: int, d: int) -> range:
    """The filter extents f >= 1 that fit the padded input (``d*(f-1) < i + 2p``) and give ``o``
    outputs from ``i`` inputs (:func:`output_extent`), in increasing order: solved, not searched,
    so a huge padding costs nothing."""
    x = i + 2 * p - 1 - (o - 1) * s  # output_extent == o  <=>  0 <= x - d*(f-1) <= s - 1
    lo = max(1, -(-(x - s + 1) // d) + 1)
    hi = min((i + 2 * p - 1) // d + 1, x // d + 1)
    return range(lo, max(lo, hi + 1))


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
    big = [f"{f} = {v}" for f, v in g.values().items() if v > INT32_MAX]
    if big:
        raise _problem_error(f"{', '.join(big)}: beyond int32, the type of the conv kernels' problem fields", epilogue)
    if arch == "sm90":
        _sm90_limits(g, strided_dgrad, tile, epilogue, persistent)
    else:
        _sm80_limits(g, a, strided_dgrad, epilogue)


def _sm90_limits(g: ConvGeometry, strided_dgrad: bool, tile: tuple[int, int, int] | None, epilogue: str | None,
                 persistent: bool) -> None:
    """:func:`check_arch_limits` of the sm90 kernels: TMA im2col's, the persistent kernels', wgrad's
    tile rule and unit-stride dgrad."""
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


def _sm80_limits(g: ConvGeometry, a: DType, strided_dgrad: bool, epilogue: str | None) -> None:
    """:func:`check_arch_limits` of the sm80 kernels: filter taps, strided dgrad's dilation, 32-bit
    offsets."""
    if g.kind in ("fprop", "dgrad") and max(g.flt) > 32:
        raise _problem_error(f"filter extents {g.flt}: the sm80 kernel's iterators take at most 32 taps per "
                             "dimension (CUTLASS conv2d_fprop_activation_tile_access_iterator_optimized.h)", epilogue)
    if strided_dgrad and any(d > 1 for d in g.dilation):
        raise _problem_error(f"strided dgrad with dilation {g.dilation}: CUTLASS's strided-dgrad kernel takes "
                             "dilation 1 only (conv/device/implicit_gemm_convolution.h can_implement)", epilogue)
    # CUTLASS 2.x device can_implement: every tensor below 2 GiB (32-bit offsets)
    for name in CONV_OPERANDS[g.kind]:
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
