"""Argument checking: user tensors -> a checked problem signature and the kernel's arguments.

Input: the Graph, the operand dtypes, A, B and the epilogue's keyword arguments. Output: a
:class:`Signature` (everything about the call that doesn't depend on the pointers' or the
scalars' values: sizes, strides, the outputs to allocate, the per-call pointer checks), and,
through :meth:`Binder.bind`, a filled ``evtc_args_t`` (ctypes).

A signature is checked once and cached by :mod:`evtc.runtime.launch` under a key made of each
tensor's shape, strides, dtype and device (:func:`evtc.runtime.tensors.probe_for`); what does
depend on the pointers (null pointers, alignment, overlap of outputs with other tensors) and on
the scalars (finite in their dtype) is checked on every call, cheaply, from the signature.

Every check names the argument and says what was expected (CUTLASS's own ``can_implement`` is
only a yes/no). The rules (docs/errors.md#arguments lists the messages):

* A is (M, K) or (L, M, K), B is (N, K) or (L, N, K) (row-major, last stride 1); a 2-D operand
  is shared by every batch;
* M x N inputs (C, aux loads) are (M, N) or (L, M, N) with last stride 1; outputs are
  allocated (L, M, N) when A or B is batched, else (M, N);
* TMA needs every M x N (and A, B) row to start at a 16-byte boundary: the base address, the
  row stride and the batch stride, in bytes, are multiples of 16 (``cute::make_tma_copy``,
  CUDA driver ``cuTensorMapEncodeTiled``), and each stride is below 2^40 bytes. evtc pads the
  rows of the outputs it allocates; for inputs it asks for a padded allocation;
* row broadcasts are (N,) or (L, N), column broadcasts (M,) or (L, M), device scalars () /
  (1,) / (L,), all with unit stride along the vector; their base address is a multiple of the
  element size: the CUTLASS visitors that read them (``Sm90RowBroadcast``,
  ``Sm90ColBroadcast``, ``Sm90ScalarBroadcast`` in ``sm90_visitor_load_tma_warpspecialized.hpp``,
  evtc's ``Sm90RowBroadcastDirect``) load one element at a time, and the sm80 visitors'
  vector accesses are chosen at run time by the kernel variant (``evtc/plan/sm80.py``); the
  reductions (``sm90_visitor_store_tma_warpspecialized.hpp``: element stores, atomics in the
  output type; ``cuMemsetD16/D32Async`` for their identity) need the same;
* no stride is negative, and the row stride of a tensor with more than one row is not 0 (an
  expanded tensor): TMA takes unsigned strides;
* M, N, K and L fit in int32 (CUTLASS's problem shape is ``cute::Shape<int, int, int, int>``;
  ``cutlass::gemm::GemmCoord`` on sm80); strides in int64;
* no pointer of a tensor with elements is null;
* outputs don't overlap themselves (e.g. a batch stride of 0 over L > 1), each other, A, B or a
  vector; an output may be *exactly* an M x N input (same address, shape, strides and dtype):
  in-place ``D = C`` is supported, since every element of C (or of an aux load) is loaded by the
  thread block that then stores the same element of D, and loaded before it is stored;
* by-value scalars are Python numbers, finite in their dtype (``alpha=1e40`` would be inf in
  the f32 epilogue);
* every tensor is on A's device and has the dtype the epilogue declared.

Zero sizes behave like torch: M, N or L = 0 gives empty outputs (reductions over an empty
extent hold the reduction's identity: 0 for sum, -inf for max, +inf for min) without a launch;
K = 0 runs the epilogue on a zero accumulator (the kernel reads a zero-filled scratch A and B of
one 16-byte vector per row).
"""

from __future__ import annotations

import ctypes
import dataclasses
import math
import numbers
from typing import Any, Mapping

from evtc.abi import AbiField, abi_fields, call_fields
from evtc.dtypes import DType
from evtc.errors import ArgumentError, MisalignedError
from evtc.ir.graph import Graph
from evtc.ir.nodes import (
    Accumulator,
    AuxLoad,
    ColBroadcast,
    GroupScale,
    Leaf,
    RowBroadcast,
    ScalarBroadcast,
    Source,
    Store,
    scale_grid_strides,
)
from evtc.runtime import tensors
from evtc.runtime.tensors import TensorView

from evtc.runtime.signature import (ALIGN, INT32_MAX, INT64_MAX, TMA_STRIDE_LIMIT, Alloc, Extents, Fill, Operand,
                                    Operands, Signature, _disjoint, _quoted, _round_up, batch_count,
                                    follows_packed_inputs, self_overlapping)

#: the signature's names, re-exported: binders and their callers import them from here
__all__ = ["ALIGN", "INT32_MAX", "INT64_MAX", "TMA_STRIDE_LIMIT", "Alloc", "Binder", "Extents", "Fill", "Operand",
           "Operands", "Signature", "batch_count", "follows_packed_inputs", "self_overlapping"]


class Binder:
    """Checks the arguments of one Gemm and builds their :class:`Signature`.

    Args:
        graph: the epilogue after passes.
        a, b: operand dtypes.
        Args: the ctypes mirror of ``evtc_args_t``.
        direct: M x N tensors the plan accesses register-direct. Their accesses are 16-byte
            vectors predicated per vector, so N must be a multiple of a vector's elements.
        scheduler: the sm90 tile scheduler's run-time arguments, name -> value
            (``max_swizzle_size``, ``raster_order``; see :mod:`evtc.abi`).
        arch: ``sm90`` or ``sm80`` (default: sm90 if ``Args`` has scheduler fields).
        swap: the kernel computes ``D^T = B A^T`` (swap-AB, :mod:`evtc.family.swap_ab`): the
            call's tensors are checked as the user sees them and the struct gets M and N, A and
            B (their pointers, row and batch strides) exchanged.
        mn_tma: M x N tensors (C, aux loads and stores, D) go through TMA, so their rows must be
            16-byte aligned; False for kernels that access them register-direct one element at
            a time (sm80, sm90's unaligned variant). Default: the arch's (True on sm90).
        packed_stores: the M x N outputs go through sm90's packed stores (NOTE [Stores into
            packed rows] in evtc/plan/sm90_buffers.py): their base address, rows and batches need only be
            element-aligned, whatever ``mn_tma`` says of the loads.
    """

    def __init__(self, graph: Graph, a: DType, b: DType, Args: type[ctypes.Structure],
                 direct: frozenset[str] = frozenset(), scheduler: Mapping[str, int] | None = None,
                 arch: str | None = None, *, swap: bool = False, mn_tma: bool | None = None,
                 packed_stores: bool = False) -> None:
        self.graph = graph
        self.packed_stores = packed_stores
        self.direct = direct
        self.swap = swap
        self.scheduler = dict(scheduler or {})
        self.a = a
        self.b = b
        self.Args = Args
        names = {n for n, _ in Args._fields_}
        self.arch = arch or ("sm90" if "max_swizzle_size" in names else "sm80")
        self.mn_tma = (self.arch == "sm90") if mn_tma is None else mn_tma
        self.fields: tuple[AbiField, ...] = abi_fields(graph, self.arch)
        self.names = [i.name for i in graph.inputs if not isinstance(i, Accumulator)]
        self.used = {i.name for i in graph.used_inputs}
        self.leaves = {i.name: i for i in graph.used_inputs if not isinstance(i, Accumulator)}
        self.outputs = {o.name: o for o in graph.outputs}
        per_call = call_fields(self.fields)
        pointer_owners = [f.tensor for f in per_call if f.what == "ptr"]
        #: used tensor inputs in the ABI's pointer order (after A and B, before the outputs)
        self.tensor_names = tuple(n for n in pointer_owners[2:] if n in self.leaves)
        #: by-value scalars in the ABI's order
        self.scalar_names = tuple(f.tensor for f in per_call if f.what == "value")
        self.scalar_limits = tuple(self.leaves[n].dtype.max for n in self.scalar_names)
        self.output_names = tuple(o.name for o in graph.outputs)
        self.unused_names = tuple(n for n in self.names if n not in self.used)
        self.n_kwargs = len(self.names)
        self.single = len(graph.outputs) == 1
        #: the names a call must pass besides the tensors (scalars, unused inputs)
        self.other_names = self.unused_names + self.scalar_names
        #: the pointers of the outputs evtc allocates, before it does
        self.no_outputs = [0] * len(self.output_names)

    def error(self, msg: str, hint: str | None = None) -> ArgumentError:
        return ArgumentError(msg, epilogue=self.graph.name, hint=hint)

    # ---- checks of one tensor ---------------------------------------------------------------------

    def _check(self, v: TensorView, name: str, dtype: DType, shapes: list[tuple[int, ...]], device: int,
               rows_16b: bool, *, tma: bool = False, output: bool = False, align16: bool = True,
               strided: bool = False) -> None:
        """Dtype, device, shape, strides and (for the base address) alignment of one tensor.
        ``rows_16b``: a matrix whose rows are checked (and, with ``align16``, 16-byte aligned);
        ``strided``: its strides were checked already (a quantization's scales: either layout)."""
        if v.dtype is not dtype:
            raise self.error(f"argument '{name}' has dtype {v.dtype_name}, the epilogue declares {dtype.name}",
                             hint=f"convert it with .to({dtype.torch})" if dtype.torch else None)
        if v.device != device:
            where = "host memory" if v.device < 0 else f"cuda:{v.device}"
            raise self.error(f"argument '{name}' is in {where}, A is on cuda:{device}",
                             hint="move it to A's device")
        if v.shape not in shapes:
            want = " or ".join(str(tuple(s)) for s in shapes)
            raise self.error(f"argument '{name}' has shape {tuple(v.shape)}, expected {want}")
        if any(s == 0 for s in v.shape):
            return  # no elements: nothing is read or written
        if any(st < 0 for st in v.strides):
            raise self.error(f"argument '{name}' has a negative stride {tuple(v.strides)}",
                             hint="pass a .contiguous() copy (TMA and the visitors take unsigned strides)")
        if any(st > INT64_MAX for st in v.strides):
            raise self.error(f"argument '{name}' has a stride beyond int64 {tuple(v.strides)}")
        if v.shape and v.shape[-1] > 1 and v.strides[-1] != 1 and not strided:
            raise self.error(f"argument '{name}' must be contiguous along its last dimension (stride {v.strides[-1]})",
                             hint="pass a .contiguous() tensor")
        eb = dtype.bytes
        if rows_16b and len(v.shape) >= 2 and v.shape[-2] > 1:  # a matrix (A, B, M x N): its rows
            ld = v.strides[-2]
            if ld == 0:
                raise self.error(f"argument '{name}' has a row stride of 0 (every row is the same memory, "
                                 "an expanded tensor)",
                                 hint="pass a .contiguous() copy; a value per column is a RowVector input")
            if ld < v.shape[-1]:
                raise self.error(f"argument '{name}' has a row stride of {ld} elements, less than its "
                                 f"{v.shape[-1]} columns: its rows overlap", hint="pass a .contiguous() copy")
        if output and self_overlapping(v.shape, v.strides):
            raise self.error(f"output '{name}' overlaps itself (shape {tuple(v.shape)}, strides {tuple(v.strides)}): "
                             "several results would be written to the same memory",
                             hint="pass a tensor with distinct memory for every element, e.g. torch.empty(...)")
        if rows_16b and align16:
            if v.ptr % ALIGN:
                raise self.error(f"argument '{name}' starts at an address that is not 16-byte aligned",
                                 hint="TMA needs 16-byte aligned tensors; pass a fresh allocation, not an offset view")
            if len(v.shape) >= 2 and v.shape[-2] > 1 and (v.strides[-2] * eb) % ALIGN:
                per = ALIGN // eb
                n = v.shape[-1]
                padded = (n + per - 1) // per * per
                hint = (f"pass a .contiguous() copy ({n} x {eb} bytes is a multiple of 16)" if n % per == 0 else
                        f"allocate it with rows padded to a multiple of {per} elements, e.g. "
                        f"torch.empty(..., {padded})[..., :{n}]")
                raise self.error(
                    f"argument '{name}' has a row stride of {v.strides[-2] * eb} bytes; TMA needs a multiple of 16",
                    hint=hint,
                )
            if len(v.shape) == 3 and v.shape[0] > 1 and (v.strides[0] * eb) % ALIGN:
                raise self.error(f"argument '{name}' has a batch stride of {v.strides[0] * eb} bytes; TMA needs a multiple of 16")
            if tma:
                for st in v.strides[:-1]:
                    if st * eb >= TMA_STRIDE_LIMIT:
                        raise self.error(f"argument '{name}' has a stride of {st * eb} bytes; TMA needs less than 2^40")
        elif v.ptr % eb:
            raise self.error(f"argument '{name}' starts at an address that is not a multiple of its element size "
                             f"({eb} bytes)", hint="pass a fresh allocation or a .clone(), not a byte-offset view")

    # ---- the signature ---------------------------------------------------------------------------

    def signature(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any = None) -> tuple[Signature, list[int]]:
        """Check everything about a call and build its :class:`Signature`.

        Returns:
            (signature, the pointers of the given tensors in ``evtc_call_t`` order, 0 for the
            outputs to allocate).

        Raises:
            ArgumentError: the first problem, naming the argument.
        """
        g = self.graph
        self.check_names(kwargs, "A and B")
        va = tensors.view(A, "A", g.name)
        vb = tensors.view(B, "B", g.name)
        x = self._gemm_extents(va, vb)
        M, N, K, L = x.M, x.N, x.K, x.L
        values: dict[str, int] = {"M": M, "N": N, "K": K, "L": L, **self.scheduler}
        ops = Operands(x.launches)
        tma = self.arch == "sm90"
        # A and B (replaced by a zero scratch when K = 0)
        for op, v in (("A", va), ("B", vb)):
            eb = v.dtype.bytes
            per = ALIGN // eb
            values[f"ld_{op}"] = v.strides[-2] if v.shape[-2] > 1 else _round_up(max(K, 1), per)
            values[f"bs_{op}"] = v.strides[0] if len(v.shape) == 3 and v.shape[0] > 1 else 0
            ops.add(v, op, f"p_{op}", v.dtype, output=False, mask=(ALIGN - 1) if tma else eb - 1, mn=False,
                    inplace=False)
        kpad = 0
        if x.mode == "k0":
            kpad = ALIGN // self.a.bytes
            values.update(K=kpad, ld_A=kpad, ld_B=kpad, bs_A=0, bs_B=0)
            for i in (0, 1):
                ops.ops[i] = dataclasses.replace(ops.ops[i], needed=False, span=(0, 0))
        self.bind_inputs(kwargs, x, ops, values)
        allocs, fills = self.bind_outputs(self._given_outputs(out), x, ops, values)
        if self.swap:  # the kernel's problem is the transposed one: N x M, A' = B, B' = A
            values["M"], values["N"] = values["N"], values["M"]
            for f in ("ld", "bs"):
                values[f"{f}_A"], values[f"{f}_B"] = values[f"{f}_B"], values[f"{f}_A"]
        return self.finish(x, ops, values, allocs, fills, kpad)

    def _gemm_extents(self, va: TensorView, vb: TensorView) -> Extents:
        """The problem of A and B, with A and B checked (and the register-direct accesses' N)."""
        g = self.graph
        dev = self.device_of(va, "A", "move A and B to a CUDA device")
        if len(va.shape) not in (2, 3) or len(vb.shape) not in (2, 3):
            raise self.error(f"A and B must be 2-D or 3-D, got A {tuple(va.shape)} and B {tuple(vb.shape)}")
        M, K = va.shape[-2:]
        N, Kb = vb.shape[-2:]
        if K != Kb:
            raise self.error(f"A is {tuple(va.shape)} and B is {tuple(vb.shape)}: their K extents differ",
                             hint="B is given as N x K (the GEMM computes A @ B.T)")
        La = va.shape[0] if len(va.shape) == 3 else 1
        Lb = vb.shape[0] if len(vb.shape) == 3 else 1
        if La != Lb and 1 not in (La, Lb):
            raise self.error(f"A has batch {La} and B has batch {Lb}")
        L = max(La, Lb)
        for what, x in (("M", M), ("N", N), ("K", K), ("L", L)):
            if x > INT32_MAX:
                raise self.error(f"{what} = {x} does not fit in int32, the type of CUTLASS's problem shape "
                                 "(cute::Shape<int, int, int, int>)", hint="split the problem into smaller GEMMs")
        mode = "empty" if 0 in (M, N, L) else ("k0" if K == 0 else "launch")
        if mode == "launch":
            for name in sorted(self.direct):
                dt = next(x.dtype for x in (*g.inputs, *g.outputs) if x.name == name)
                if N % (ALIGN // dt.bytes):
                    raise self.error(
                        f"N = {N} is not a multiple of {ALIGN // dt.bytes}, which the register-direct access of "
                        f"'{name}' needs", hint="pad N, or build with plan='cutlass' (TMA for every aux tensor)")
        tma = self.arch == "sm90"
        # sm90's mainloop reads A and B with TMA (16-byte aligned rows); sm80's kernel variants take
        # any alignment (NOTE [Ragged shapes on sm80])
        self._check(va, "A", self.a, [(M, K), (L, M, K)] if La == L else [(M, K)], dev, True, tma=tma, align16=tma)
        self._check(vb, "B", self.b, [(N, K), (L, N, K)] if Lb == L else [(N, K)], dev, True, tma=tma, align16=tma)
        return Extents(M, N, K, L, len(va.shape) == 3 or len(vb.shape) == 3, dev, va.framework, mode)

    # ---- the binder core: what a GEMM's and a convolution's signatures share ---------------------

    #: inputs and outputs may carry the batch L ((L, M, N) matrices, (L, n) vectors); a
    #: convolution's have none
    batch_dims = True
    #: rows of M x N tensors evtc allocates (and of one-row tensors) are padded to 16 bytes
    pad_rows = True
    #: a given M x N output whose rows don't end on a 16-byte vector is refused (NOTE [Ragged N
    #: and TMA stores])
    refuse_ragged_stores = True

    def check_names(self, kwargs: Mapping[str, Any], operands: str) -> None:
        """Every epilogue argument is passed, and nothing else.

        Raises:
            ArgumentError: the unexpected or missing names.
        """
        g = self.graph
        unknown = sorted(set(kwargs) - set(self.names))
        if unknown:
            raise self.error(f"unexpected argument{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}",
                             hint=f"'{g.name}' takes {', '.join(self.names) or f'no arguments besides {operands}'}")
        missing = [n for n in self.names if n not in kwargs]
        if missing:
            raise self.error(f"missing argument{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}",
                             hint=f"'{g.name}' takes {', '.join(self.names)}")

    def device_of(self, v: TensorView, name: str, hint: str) -> int:
        """The CUDA ordinal of the first operand ``v``, which every tensor of the call shares.

        Raises:
            ArgumentError: ``v`` is in host memory.
        """
        if v.device < 0:
            raise self.error(f"argument '{name}' is in host memory", hint=hint)
        return v.device

    def matrix(self, obj: Any, name: str, x: Extents, *, output: bool) -> TensorView:
        """The view of an M x N tensor (an input, or a given output) as (M, N) or (L, M, N), before
        :meth:`_check` (a convolution's binder reads the output's shape)."""
        return tensors.view(obj, name, self.graph.name, writable=output)

    def allocation(self, out: Store, x: Extents) -> tuple[tuple[int, ...], tuple[int, ...]]:
        """Shape and strides (elements) of an M x N output evtc allocates (M x N/2 for a gated
        output, :meth:`evtc.ir.nodes.Store.columns`): rows padded to 16 bytes."""
        cols = out.columns(x.N)  # N, or N / 2 for evtc.glu's output
        padded = _round_up(cols, ALIGN // out.dtype.bytes)
        if x.batched:
            return (x.L, x.M, cols), (x.M * padded, padded, 1)
        return (x.M, cols), (padded, 1)

    def vector_mask(self, leaf: Leaf) -> int:
        """The alignment mask of a vector's or device scalar's base address: its element's."""
        return leaf.dtype.bytes - 1

    def row_pitch(self, N: int, eb: int) -> int:
        """The row stride (elements) of an M x N tensor of one row, and of those evtc allocates."""
        return _round_up(N, ALIGN // eb) if self.pad_rows else N

    def bind_inputs(self, kwargs: Mapping[str, Any], x: Extents, ops: Operands, values: dict[str, int]) -> None:
        """Check the epilogue's tensors and scalars and add their pointers and strides, in the
        ABI's order.

        Raises:
            ArgumentError: the first problem, naming the argument.
        """
        tma = self.arch == "sm90"
        lead = ((x.L,),) if self.batch_dims else ()
        for n in self.tensor_names + self.scalar_names:
            leaf = self.leaves[n]
            obj = kwargs[n]
            if isinstance(leaf, ScalarBroadcast) and not leaf.by_pointer:
                self.scalar_value(n, obj)
                continue
            eb = leaf.dtype.bytes
            if isinstance(leaf, (Source, AuxLoad)):
                v = self.matrix(obj, n, x, output=False)
                self._check(v, n, leaf.dtype, [(x.M, x.N)] + [(*t, x.M, x.N) for t in lead], x.device, True,
                            tma=tma, align16=self.mn_tma)
                values[f"ld_{n}"] = v.strides[-2] if x.M > 1 else self.row_pitch(x.N, eb)
                values[f"bs_{n}"] = v.strides[0] if len(v.shape) == 3 and x.L > 1 else 0
                ops.add(v, n, f"p_{n}", leaf.dtype, output=False, mask=(ALIGN - 1) if self.mn_tma else eb - 1, mn=True,
                        inplace=True)
                continue
            v = tensors.view(obj, n, self.graph.name)
            mask = self.vector_mask(leaf)
            if isinstance(leaf, (RowBroadcast, ColBroadcast)):
                ext = x.N if isinstance(leaf, RowBroadcast) else x.M
                self._check(v, n, leaf.dtype, [(ext,)] + [(*t, ext) for t in lead], x.device, False)
                if mask > eb - 1 and v.ptr & mask and ext:  # wider than an element (sm80 conv's vectors)
                    raise self.error(f"argument '{n}' starts at an address that is not {mask + 1}-byte aligned",
                                     hint="pass a fresh allocation, not an offset view")
                values[f"bs_{n}"] = v.strides[0] if len(v.shape) == 2 and x.L > 1 else 0
            else:  # device scalar
                self._check(v, n, leaf.dtype, [(), (1,)] + list(lead), x.device, False)
                values[f"bs_{n}"] = v.strides[0] if v.shape == (x.L,) and x.L > 1 else 0
            ops.add(v, n, f"p_{n}", leaf.dtype, output=False, mask=mask, mn=False, inplace=False)

    def bind_outputs(self, given: Mapping[str, Any], x: Extents, ops: Operands,
                     values: dict[str, int]) -> tuple[list[Alloc], list[Fill]]:
        """Check the given outputs and plan the others: their pointers and strides, the outputs to
        allocate and, for an empty problem, the reductions to fill with their identity.

        Raises:
            ArgumentError: the first problem, naming the output.
        """
        allocs: list[Alloc] = []
        fills: list[Fill] = []
        for o in self.graph.outputs:
            n = o.name
            index = len(ops.ops)
            if isinstance(o, Store):
                self._bind_store(o, given.get(n), x, ops, values, allocs)
                continue
            label = f"out['{n}']"
            scales = isinstance(o, GroupScale)
            ext = (x.M, o.groups(x.N)) if scales else o.axis.shape(x.M, x.N)
            shape = ((x.L,) + ext) if x.batched else ext
            strides = o.tensor_strides(x.M, x.N, x.batched) if scales else _packed_strides(shape)
            if n in given:
                v = tensors.view(given[n], label, self.graph.name, writable=True)
                if scales and tuple(v.shape) == shape:  # its layout named first
                    _check_scale_layout(v, label, o, x, self.graph.name)
                self._check(v, label, o.dtype, [shape], x.device, False, tma=self.arch == "sm90", output=True,
                            align16=self.mn_tma, strided=scales)
                ops.add(v, label, f"p_{n}", o.dtype, output=True, mask=o.dtype.bytes - 1, mn=False, inplace=False)
                shape, strides = tuple(v.shape), tuple(v.strides)
            else:
                allocs.append(Alloc(n, shape, strides, o.dtype, index))
                ops.allocated(label, f"p_{n}")
            values[f"bs_{n}"] = strides[0] if x.batched and shape and x.L > 1 else 0
            if scales:  # the grid's row and group strides (the kernel writes either layout)
                values[f"ld_{n}"], values[f"gs_{n}"] = strides[-2], strides[-1]
            count = math.prod(shape[1:] if x.batched else shape)
            if x.mode == "empty" and x.L > 0 and count > 0:
                fills.append(Fill(index, count, x.L if x.batched else 1,
                                  strides[0] if x.batched and len(shape) > 1 else count, o.dtype, o.op.identity))
                if n in given:
                    ops.need(index)
        return allocs, fills

    def _bind_store(self, o: Store, obj: Any, x: Extents, ops: Operands, values: dict[str, int],
                    allocs: list[Alloc]) -> None:
        """An M x N output: the given tensor checked, or its allocation planned."""
        n, eb = o.name, o.dtype.bytes
        label = f"out['{n}']"
        cols = o.columns(x.N)  # N, or N / 2 for evtc.glu's output
        if cols != x.N and x.N % 2:
            raise self.error(f"output {label} is evtc.glu's: its GEMM pairs the N = {x.N} columns of B (gate and up "
                             "interleaved), so N must be even", hint="build B with evtc.interleave_gate_up(W_gate, W_up)")
        if obj is not None:
            v = self.matrix(obj, label, x, output=True)
            store_tma = self.mn_tma and not self.packed_stores
            self._check(v, label, o.dtype, [(x.L, x.M, cols) if x.batched else (x.M, cols)], x.device, True,
                        tma=self.arch == "sm90", output=True, align16=store_tma)
            if self.refuse_ragged_stores and store_tma and cols % (ALIGN // eb) and x.M and x.L:
                # NOTE [Ragged N and TMA stores]: the TMA store (and the 16-byte register-direct
                # store) writes the last 16-byte vector of each row whole, measured on the H100:
                # with N = 1031 bf16 it writes column 1031 too. CUTLASS's can_implement refuses
                # such an N; in evtc's own allocations that element is row padding, in a
                # caller's tensor it may be someone's data. (evtc.glu's output has N / 2 columns,
                # stored by TMA too: 500 bf16 columns wrote 4 more, H200 2026-11-29.)
                what = f"N = {x.N}" if cols == x.N else f"N / 2 = {cols} (evtc.glu's)"
                raise MisalignedError(
                    f"output {label} has {what} columns, not a multiple of {ALIGN // eb} ({eb}-byte elements): "
                    f"this kernel stores whole 16-byte vectors and would also write the {(-cols) % (ALIGN // eb)} "
                    "element(s) after each row",
                    epilogue=self.graph.name,
                    hint="let evtc allocate the output (it pads the rows)" + (
                        ", or use a family Gemm (no config) or GemmConfig(unaligned=True), which store element by "
                        "element" if cols == x.N else ""))
            ops.add(v, label, f"p_{n}", o.dtype, output=True, mask=(ALIGN - 1) if store_tma else eb - 1, mn=True,
                    inplace=True)
            shape, strides = tuple(v.shape), tuple(v.strides)
            values[f"ld_{n}"] = strides[-2] if x.M > 1 else self.row_pitch(cols, eb)
        else:
            shape, strides = self.allocation(o, x)
            allocs.append(Alloc(n, shape, strides, o.dtype, len(ops.ops)))
            ops.allocated(label, f"p_{n}")
            values[f"ld_{n}"] = self.row_pitch(cols, eb)
        values[f"bs_{n}"] = strides[0] if len(shape) == 3 and x.L > 1 else 0

    def finish(self, x: Extents, ops: Operands, values: dict[str, int], allocs: list[Alloc], fills: list[Fill],
               kpad: int = 0) -> tuple[Signature, list[int]]:
        """The :class:`Signature` of a bound call, its pointer checks run on this call's pointers."""
        sig = Signature(x.M, x.N, x.K, x.L, x.batched, x.device, x.framework, x.mode, tuple(ops.ops), values,
                        ops.checks(), ops.overlaps(), tuple(allocs), tuple(fills), kpad)
        self.check_pointers(sig, ops.ptrs)
        return sig, ops.ptrs

    def _given_outputs(self, out: Any) -> dict[str, Any]:
        g = self.graph
        if out is None:
            return {}
        if isinstance(out, Mapping):
            given = {k: v for k, v in out.items() if v is not None}
        elif self.single:
            given = {g.outputs[0].name: out}
        else:
            raise self.error("out= must be a dict of output name -> tensor for an epilogue with several outputs",
                             hint=f"outputs: {', '.join(o.name for o in g.outputs)}")
        unknown = sorted(set(given) - set(self.output_names))
        if unknown:
            raise self.error(f"out= names unknown output{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}",
                             hint=f"outputs: {', '.join(self.output_names)}")
        return given

    # ---- per-call checks (pointers and scalars) ---------------------------------------------------

    def scalar_value(self, name: str, x: Any) -> float:
        """A by-value scalar as a float, checked: a real number (not a bool), finite and within
        the range of its dtype (f32 for the epilogue's scalars unless declared otherwise).

        Raises:
            ArgumentError: naming the argument.
        """
        leaf = self.leaves[name]
        if not isinstance(x, numbers.Real) or isinstance(x, bool):
            raise self.error(f"argument '{name}' must be a Python number (it is a by-value scalar), got {type(x).__name__}",
                             hint="declare it evtc.DeviceScalar[f32] to pass a device tensor instead")
        try:
            v = float(x)
        except (OverflowError, ValueError, TypeError):
            v = math.inf
        if not math.isfinite(v) or abs(v) > leaf.dtype.max:
            raise self.error(f"argument '{name}' = {x!r} is not a finite {leaf.dtype.name} (the epilogue computes in "
                             f"{leaf.dtype.name}, whose largest value is {leaf.dtype.max:.6g})",
                             hint="pass a finite value within the dtype's range")
        return v

    def check_pointers(self, sig: Signature, ptrs: list[int]) -> None:
        """Null pointers, alignment and overlap on this call's pointers.

        Raises:
            ArgumentError: naming the argument.
        """
        for i, mask in sig.checks:
            p = ptrs[i]
            if not p or p & mask:
                self.pointer_error(sig, i, p)
        for i, j, lo_i, hi_i, lo_j, hi_j, exact_ok in sig.spans:  # byte spans first: the full test is rare
            pi, pj = ptrs[i], ptrs[j]
            if pi + lo_i < pj + hi_j and pj + lo_j < pi + hi_i:
                self.check_overlap(sig, ptrs, i, j, exact_ok)

    def pointer_error(self, sig: Signature, i: int, p: int) -> None:
        op = sig.operands[i]
        if not p:
            raise self.error(f"argument '{op.name}' is a null pointer", hint="pass an allocated tensor")
        if op.mask == ALIGN - 1:
            raise MisalignedError(f"argument '{op.name}' starts at an address that is not 16-byte aligned",
                                  epilogue=self.graph.name,
                                  hint="TMA needs 16-byte aligned tensors; pass a fresh allocation, not an offset view")
        raise self.error(f"argument '{op.name}' starts at an address that is not a multiple of its element size "
                         f"({op.mask + 1} bytes)", hint="pass a fresh allocation or a .clone(), not a byte-offset view")

    def check_overlap(self, sig: Signature, ptrs: list[int], i: int, j: int, exact_ok: bool) -> None:
        a, b = sig.operands[i], sig.operands[j]
        pa, pb = ptrs[i], ptrs[j]
        if not (pa + a.span[0] < pb + b.span[1] and pb + b.span[0] < pa + a.span[1]):
            return
        if exact_ok and pa == pb:
            return
        if _disjoint(pa, a, pb, b):
            return
        what = "output" if b.output else "input"
        hint = ("an output may be exactly an M x N input (in place, e.g. out=C), but not part of one"
                if b.inplace and a.inplace and not b.output else "pass a separate tensor for each output")
        if b.name in ("A", "B"):
            hint = "the mainloop reads A and B while the epilogue writes: pass a separate output tensor"
        raise self.error(f"output {_quoted(a.name)} overlaps {what} {_quoted(b.name)} in memory", hint=hint)

    # ---- the full arguments (prepare, and the tests) ------------------------------------------

    def fill_args(self, sig: Signature, ptrs: list[int], scalars: Mapping[str, float]):
        """A ctypes ``evtc_args_t`` with the signature's values, ``ptrs`` and ``scalars``."""
        args = self.Args()
        for field, value in sig.values.items():
            setattr(args, field, value)
        for op, p in zip(sig.operands, ptrs):
            setattr(args, op.field, p)
        for n, v in scalars.items():
            setattr(args, f"s_{n}", v)
        return args

    def bind(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any = None):
        """Check everything and fill the struct (the full path, without a library: outputs
        that evtc would allocate are left null).

        Returns:
            (args struct, outputs dict name -> given tensor or None, keepalive list, A's
            TensorView)

        Raises:
            ArgumentError: the first problem, naming the argument.
        """
        sig, ptrs = self.signature(A, B, kwargs, out)
        scalars = {n: self.scalar_value(n, kwargs[n]) for n in self.scalar_names}
        given = self._given_outputs(out)
        args = self.fill_args(sig, ptrs, scalars)
        outputs = {o: given.get(o) for o in self.output_names}
        return args, outputs, [A, B, *kwargs.values(), *given.values()], tensors.view(A, "A", self.graph.name)


def _packed_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """Row-major strides (elements) of a packed ``shape``."""
    out, step = [], 1
    for extent in reversed(shape):
        out.append(step)
        step *= max(extent, 1)
    return tuple(reversed(out))


_LAYOUT_NAMES = {"row_major": "row-major (ScaleLayout.ROW_MAJOR)",
                 "col_major_tma": "column-major with M padded to 4 (ScaleLayout.COL_MAJOR_TMA, DeepGEMM's TMA layout)"}


def _check_scale_layout(v, label: str, o: GroupScale, x, epilogue: str) -> None:
    """A caller's scales of ``evtc.quantize`` must be laid out as the output declares
    (``scale_layout``): the kernel writes scale (m, g) at ``m * ld + g * gs`` with the layout's
    strides (:meth:`~evtc.ir.nodes.GroupScale.strides`); a dimension of extent 1 may have any
    stride, and batches may lie anywhere that does not overlap (checked after).

    Raises:
        ArgumentError: naming the layout the output declares and the one given.
    """
    M, G = x.M, o.groups(x.N)
    got = tuple(v.strides[-2:])

    def fits(layout: str) -> bool:
        return all(e <= 1 or w == g for e, w, g in zip((M, G), scale_grid_strides(layout, M, G), got))

    want = scale_grid_strides(o.layout, M, G)
    if fits(o.layout):
        return
    others = [lay for lay in _LAYOUT_NAMES if lay != o.layout and fits(lay)]
    what = _LAYOUT_NAMES[others[0]] if others else f"strides {got}"
    raise ArgumentError(f"output {label}: this quantization's scales are {_LAYOUT_NAMES[o.layout]}: (M, G) strides "
                        f"{want}; the tensor given is {what}", epilogue=epilogue,
                        hint=f"allocate it with evtc.testing.quant.allocate_scales(M, N, {o.group}, "
                             f"ScaleLayout.{o.layout.upper()})" + (f", declare evtc.quantize(..., scale_layout="
                             f"{others[0]!r}) to match it" if others else "") + ", or let evtc allocate it")
