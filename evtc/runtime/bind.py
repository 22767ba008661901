"""Argument checking and packing: user tensors -> the kernel's flat argument struct.

Input: the Graph, the operand dtypes, A, B and the epilogue's keyword arguments. Output: a
filled ``evtc_args_t`` (ctypes), the output tensors (allocated or given with ``out=``), and the
objects that must stay alive until the launch is enqueued.

Every check names the argument and says what was expected (CUTLASS's own ``can_implement`` is
only a yes/no). The rules:

* A is (M, K) or (L, M, K), B is (N, K) or (L, N, K) (row-major, last stride 1); a 2-D operand
  is shared by every batch;
* M x N inputs (C, aux loads) are (M, N) or (L, M, N) with last stride 1; outputs are
  allocated (L, M, N) when A or B is batched, else (M, N);
* TMA needs every M x N (and A, B) row to start at a 16-byte boundary: the base address, the
  row stride and the batch stride, in bytes, are multiples of 16 (``cute::make_tma_copy``,
  CUDA driver ``cuTensorMapEncodeTiled``). evtc pads the rows of the outputs it allocates;
  for inputs it asks for a padded allocation;
* row broadcasts are (N,) or (L, N), column broadcasts (M,) or (L, M), device scalars () /
  (1,) / (L,), all with unit stride along the vector;
* by-value scalars are Python numbers;
* every tensor is on A's device and has the dtype the epilogue declared.
"""

from __future__ import annotations

import ctypes
import numbers
from typing import Any, Mapping

from evtc.dtypes import DType
from evtc.errors import ArgumentError
from evtc.ir.graph import Graph
from evtc.ir.nodes import (
    Accumulator,
    AuxLoad,
    ColBroadcast,
    Reduction,
    RowBroadcast,
    ScalarBroadcast,
    Source,
    Store,
)
from evtc.runtime import tensors
from evtc.runtime.tensors import TensorView

ALIGN = 16


class Binder:
    """Checks and packs the arguments of one Gemm.

    Args:
        graph: the epilogue after passes.
        a, b: operand dtypes.
        Args: the ctypes mirror of ``evtc_args_t``.
        direct: M x N tensors the plan accesses register-direct. Their accesses are 16-byte
            vectors predicated per vector, so N must be a multiple of a vector's elements.
        scheduler: the sm90 tile scheduler's run-time arguments, name -> value
            (``max_swizzle_size``, ``raster_order``; see :mod:`evtc.abi`).
    """

    def __init__(self, graph: Graph, a: DType, b: DType, Args: type[ctypes.Structure],
                 direct: frozenset[str] = frozenset(), scheduler: Mapping[str, int] | None = None) -> None:
        self.graph = graph
        self.direct = direct
        self.scheduler = dict(scheduler or {})
        self.a = a
        self.b = b
        self.Args = Args
        self.names = [i.name for i in graph.inputs if not isinstance(i, Accumulator)]
        self.used = {i.name for i in graph.used_inputs}

    def error(self, msg: str, hint: str | None = None) -> ArgumentError:
        return ArgumentError(msg, epilogue=self.graph.name, hint=hint)

    # ---- checks -----------------------------------------------------------------------------------

    def _check(self, v: TensorView, name: str, dtype: DType, shapes: list[tuple[int, ...]], device: int,
               rows_16b: bool) -> None:
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
        if v.shape and v.shape[-1] > 1 and v.strides[-1] != 1:
            raise self.error(f"argument '{name}' must be contiguous along its last dimension (stride {v.strides[-1]})",
                             hint="pass a .contiguous() tensor")
        if rows_16b:
            eb = dtype.bytes
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

    # ---- binding --------------------------------------------------------------------------------

    def bind(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any = None):
        """Check everything and fill the struct.

        Returns:
            (args struct, outputs dict name -> tensor, keepalive list, A's TensorView)

        Raises:
            ArgumentError: the first problem, naming the argument.
        """
        g = self.graph
        unknown = sorted(set(kwargs) - set(self.names))
        if unknown:
            raise self.error(f"unexpected argument{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}",
                             hint=f"'{g.name}' takes {', '.join(self.names) or 'no arguments besides A and B'}")
        missing = [n for n in self.names if n not in kwargs]
        if missing:
            raise self.error(f"missing argument{'s' if len(missing) > 1 else ''} {', '.join(map(repr, missing))}",
                             hint=f"'{g.name}' takes {', '.join(self.names)}")
        va = tensors.view(A, "A", g.name)
        vb = tensors.view(B, "B", g.name)
        if va.device < 0:
            raise self.error("argument 'A' is in host memory", hint="move A and B to a CUDA device")
        dev = va.device
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
        for name in sorted(self.direct):
            dt = next(x.dtype for x in (*g.inputs, *g.outputs) if x.name == name)
            if N % (ALIGN // dt.bytes):
                raise self.error(
                    f"N = {N} is not a multiple of {ALIGN // dt.bytes}, which the register-direct access of '{name}' needs",
                    hint="pad N, or build with plan='cutlass' (TMA for every aux tensor)",
                )
        batched = len(va.shape) == 3 or len(vb.shape) == 3
        self._check(va, "A", self.a, [(M, K), (L, M, K)] if La == L else [(M, K)], dev, True)
        self._check(vb, "B", self.b, [(N, K), (L, N, K)] if Lb == L else [(N, K)], dev, True)

        args = self.Args()
        keep: list[Any] = [A, B]
        args.M, args.N, args.K, args.L = M, N, K, L
        for field, value in self.scheduler.items():
            setattr(args, field, value)
        for op, v in (("A", va), ("B", vb)):
            setattr(args, f"p_{op}", v.ptr)
            setattr(args, f"ld_{op}", v.strides[-2] if v.shape[-2] > 1 else v.shape[-1])
            setattr(args, f"bs_{op}", v.strides[0] if len(v.shape) == 3 and v.shape[0] > 1 else 0)

        for leaf in g.used_inputs:
            n = leaf.name
            if isinstance(leaf, Accumulator):
                continue
            x = kwargs[n]
            if isinstance(leaf, ScalarBroadcast) and not leaf.by_pointer:
                if not isinstance(x, numbers.Real) or isinstance(x, bool):
                    raise self.error(f"argument '{n}' must be a Python number (it is a by-value scalar), got {type(x).__name__}",
                                     hint="declare it evtc.DeviceScalar[f32] to pass a device tensor instead")
                setattr(args, f"s_{n}", float(x))
                continue
            v = tensors.view(x, n, g.name)
            keep.append(x)
            if isinstance(leaf, (Source, AuxLoad)):
                self._check(v, n, leaf.dtype, [(M, N), (L, M, N)], dev, True)
                args_ld = v.strides[-2] if M > 1 else N
                setattr(args, f"p_{n}", v.ptr)
                setattr(args, f"ld_{n}", args_ld)
                setattr(args, f"bs_{n}", v.strides[0] if len(v.shape) == 3 and L > 1 else 0)
            elif isinstance(leaf, (RowBroadcast, ColBroadcast)):
                ext = N if isinstance(leaf, RowBroadcast) else M
                self._check(v, n, leaf.dtype, [(ext,), (L, ext)], dev, False)
                setattr(args, f"p_{n}", v.ptr)
                setattr(args, f"bs_{n}", v.strides[0] if len(v.shape) == 2 and L > 1 else 0)
            else:  # device scalar
                self._check(v, n, leaf.dtype, [(), (1,), (L,)], dev, False)
                setattr(args, f"p_{n}", v.ptr)
                setattr(args, f"bs_{n}", 1 if v.shape == (L,) and L > 1 else 0)

        outputs = self._outputs(out, va, M, N, L, batched, dev)
        for o in g.outputs:
            obj, v = outputs[o.name]
            keep.append(obj)
            setattr(args, f"p_{o.name}", v.ptr)
            if isinstance(o, Store):
                setattr(args, f"ld_{o.name}", v.strides[-2] if M > 1 else N)
                setattr(args, f"bs_{o.name}", v.strides[0] if len(v.shape) == 3 and L > 1 else 0)
            else:
                setattr(args, f"bs_{o.name}", v.strides[0] if len(v.shape) >= 1 and batched and v.shape and L > 1 else 0)
        return args, {k: obj for k, (obj, _) in outputs.items()}, keep, va

    def _outputs(self, out, va: TensorView, M: int, N: int, L: int, batched: bool, dev: int):
        g = self.graph
        given: dict[str, Any] = {}
        if out is not None:
            if isinstance(out, Mapping):
                given = dict(out)
            elif len(g.outputs) == 1:
                given = {g.outputs[0].name: out}
            else:
                raise self.error("out= must be a dict of output name -> tensor for an epilogue with several outputs",
                                 hint=f"outputs: {', '.join(o.name for o in g.outputs)}")
            unknown = sorted(set(given) - {o.name for o in g.outputs})
            if unknown:
                raise self.error(f"out= names unknown output{'s' if len(unknown) > 1 else ''} {', '.join(map(repr, unknown))}",
                                 hint=f"outputs: {', '.join(o.name for o in g.outputs)}")
        result: dict[str, tuple[Any, TensorView]] = {}
        for o in g.outputs:
            if isinstance(o, Store):
                shape = (L, M, N) if batched else (M, N)
                rows16 = True
            else:
                ext = {1: (M,), 0: (N,), None: ()}[o.dim]
                shape = ((L,) + ext) if batched else ext
                rows16 = False
            if o.name in given:
                v = tensors.view(given[o.name], f"out['{o.name}']", g.name)
                self._check(v, f"out['{o.name}']", o.dtype, [shape], dev, rows16)
                result[o.name] = (given[o.name], v)
            else:
                alloc_shape = shape if shape else (1,)
                obj, v = tensors.empty(va, alloc_shape, o.dtype)
                if not shape:
                    obj = obj[0] if va.framework in ("torch", "cupy") else obj
                result[o.name] = (obj, v)
        return result
