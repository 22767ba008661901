"""A 1x1 convolution's tensors as a GEMM's: conv tensors -> the GEMM's (M, K), (N, K), (M, N) views.

Input: the operands of a convolution fprop call whose problem is pointwise (stride 1, no
padding, dilation 1; :func:`evtc.family.conv.pointwise_problem`) and its M x N tensors, in NHWC
order. Output: :class:`~evtc.runtime.tensors.TensorView` s of the same memory as the GEMM takes
them (:func:`gemm_operands`, :func:`mn_view`), or None where the call is not such a GEMM. The
route that runs such calls on a Gemm is :mod:`evtc.dispatch.conv_gemm` (NOTE [1x1 convolutions
as GEMMs] in :mod:`evtc.family.conv`).

The views, for x of N x (D) x H x W x C, w of K x (1 x) 1 x 1 x C, y of N x (D) x H x W x K (NHWC
order; ``layout="nchw"`` tensors are read in that order through their strides):

========  =================  =====================================  ===================
GEMM      extents            from                                   strides (elements)
========  =================  =====================================  ===================
A         (M, K) = (N*H*W, C)  x, its pixels collapsed                (row stride, 1): C when packed
B         (N, K) = (K, C)      w, its filter taps (all 1) dropped      (C, 1)
C, D...   (M, N) = (N*H*W, K)  y-shaped tensors, pixels collapsed      (row stride, 1): K when packed
========  =================  =====================================  ===================

An (M, N) 2-D tensor is passed as it is, as the conv kernels take it. Outputs evtc allocates are
packed in the Conv's layout (channels-last for ``"nchw"``), as the conv kernel's are.
"""

from __future__ import annotations

import math
from typing import Any

from evtc.errors import ArgumentError
from evtc.runtime import tensors
from evtc.runtime.bind import ALIGN
from evtc.runtime.conv_problem import as_rows, from_nhwc, layout_hint, to_nhwc
from evtc.runtime.tensors import TensorView, contiguous_strides

__all__ = ["gemm_operands", "mn_view"]


def gemm_operands(x: TensorView, w: TensorView, vec: int) -> tuple[TensorView, TensorView] | None:
    """The GEMM's A (M, C) and B (K, C) views of an fprop's x and w (both in NHWC order), or
    None when the call is not a 1x1 GEMM the conv checks would accept: a filter tap count other
    than 1, differing channels, an empty extent, channels not multiples of ``vec`` (16 bytes),
    a base address not 16-byte aligned, or pixels that don't collapse into rows of one stride."""
    if len(x.shape) != len(w.shape) or len(x.shape) < 3 or any(f != 1 for f in w.shape[1:-1]):
        return None
    n, c, k = x.shape[0], x.shape[-1], w.shape[0]
    if w.shape[-1] != c or min(math.prod(x.shape[:-1]), c, k) <= 0 or c % vec or k % vec:
        return None
    if x.ptr % ALIGN or w.ptr % ALIGN or x.device < 0:
        return None
    del n
    A = as_rows(x, math.prod(x.shape[:-1]), c)
    B = as_rows(w, k, c)
    if A is None or B is None:
        return None
    return A, B


def mn_view(obj: Any, name: str, M: int, N: int, out_nhwc: tuple[int, ...], layout: str,
            epilogue: str | None = None) -> TensorView:
    """The (M, N) view of an M x N tensor of the epilogue given shaped like the output (in the
    Conv's ``layout``) or as the (M, N) matrix.

    Raises:
        ArgumentError: another shape, or pixels that don't collapse into rows of one stride (the
            messages of :class:`~evtc.runtime.conv_bind.ConvBinder`).
    """
    v = tensors.view(obj, name, epilogue)
    if len(v.shape) == 2:
        return v
    nv = to_nhwc(v, layout)
    if tuple(nv.shape) == out_nhwc:
        mv = as_rows(nv, M, N)
        if mv is None:
            raise ArgumentError(f"argument '{name}' (shape {tuple(v.shape)}, strides {tuple(v.strides)}) is not M "
                                f"rows of {N} contiguous elements with one row stride", epilogue=epilogue,
                                hint=layout_hint(layout))
        return mv
    want = from_nhwc(out_nhwc, contiguous_strides(out_nhwc), layout)[0]
    raise ArgumentError(f"argument '{name}' has shape {tuple(v.shape)}, expected the output's {want} or the "
                        f"implicit GEMM's ({M}, {N})", epilogue=epilogue)
