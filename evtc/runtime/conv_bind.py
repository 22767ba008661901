"""Convolution arguments: tensors and a problem -> the implicit GEMM's checked signature.

Input: the activation and filter tensors of a call (NHWC/NDHWC and KRSC/KTRSC, or torch's logical
NCHW order stored channels-last), a normalized :class:`~evtc.runtime.conv_problem.ConvSpec`, the
epilogue's keyword arguments and outputs. Output: through :class:`ConvBinder` (a
:class:`~evtc.runtime.bind.Binder` on the same core: names, inputs, outputs, pointer checks), the
checked :class:`~evtc.runtime.bind.Signature` that :class:`~evtc.runtime.launch.Launcher`
launches, with the call's :class:`~evtc.runtime.conv_problem.ConvGeometry` (NOTE [Implicit GEMM
of a convolution] in :mod:`evtc.runtime.conv_problem`).
"""

from __future__ import annotations

import ctypes
import dataclasses
from collections.abc import Mapping
from typing import Any

from evtc.abi import CONV_OPERANDS, conv_abi_fields
from evtc.dtypes import DType
from evtc.ir.graph import Graph
from evtc.ir.nodes import Leaf, RowBroadcast, Store
from evtc.runtime import tensors
from evtc.runtime.bind import ALIGN, Binder, Extents, Operands, Signature
from evtc.runtime.conv_problem import (
    ConvGeometry,
    ConvSpec,
    as_rows,
    check_arch_limits,
    from_nhwc,
    geometry,
    is_packed,
    layout_hint,
    to_nhwc,
)
from evtc.runtime.tensors import TensorView, contiguous_strides

__all__ = ["ConvBinder", "ConvExtents"]


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
        self.names_ab = CONV_OPERANDS[kind][:2]

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
