"""The ``torch.library`` custom op of an :class:`evtc.GroupedGemm`: grouped calls that
``torch.compile(fullgraph=True)``, ``torch.export`` and CUDA graphs can hold.

One op per distinct GroupedGemm, ``evtc::grouped_<epilogue>_<hash>`` (the hash covers the IR, the
dtypes and the family), with schema ``(Tensor A, Tensor B, Tensor offs, Tensor <each tensor
parameter>..., float <each scalar parameter>...) -> Tensor`` (a tuple of Tensors for several
outputs, in the epilogue's order) and a fake implementation that gives each output's shape and
dtype without running anything (an M x N output (T, N), evtc.glu's (T, N / 2); a row reduction
(T,), a column reduction (E, N), a scalar one (E,), f32): Dynamo puts the op in the graph instead of
breaking on evtc's ctypes call, Inductor sees an opaque functional op. Inside a
``torch.compile``-d function a GroupedGemm call without ``out=`` goes through it by itself; the
op is made when the GroupedGemm is (NOTE [The torch op is made outside torch.compile],
evtc/torch/ops.py).

Raises (when the op is made): :class:`evtc.errors.ArgumentError` for a parameter name the schema
can't hold.
"""

from __future__ import annotations

import hashlib
import json
import threading

from evtc.errors import ArgumentError
from evtc.torch.ops import _NAME, _RESERVED, call_args, k_contiguous, layout_tags, run_op

__all__ = ["GroupedTorchOp", "grouped_torch_op"]

_LOCK = threading.Lock()
_OPS: dict[str, "GroupedTorchOp"] = {}


class GroupedTorchOp:
    """A GroupedGemm behind a ``torch.library`` custom op (see the module docstring).

    Attributes:
        qualname: ``"evtc::grouped_<name>_<hash>"``. schema: the op's schema string.
        tensor_names, scalar_names: the epilogue's parameters in schema order.
    """

    def __init__(self, gg) -> None:
        import torch

        from evtc.emit.sm90_grouped import reduction_shape
        from evtc.ir.nodes import Accumulator, ScalarBroadcast, Store

        graph = gg.graph
        self.gg = gg
        leaves = [x for x in graph.used_inputs if not isinstance(x, Accumulator)]
        self.scalar_names = tuple(x.name for x in leaves if isinstance(x, ScalarBroadcast) and not x.by_pointer)
        self.tensor_names = tuple(x.name for x in leaves if x.name not in self.scalar_names)
        for n in self.tensor_names + self.scalar_names:
            if not _NAME.match(n) or n in _RESERVED or n in ("A", "B", "offs"):
                raise ArgumentError(f"parameter {n!r} can't be named in a torch op schema", epilogue=graph.name,
                                    hint="rename the parameter")
        self.qualname = grouped_qualname(gg)
        args = ["Tensor A", "Tensor B", "Tensor offs"] + [f"Tensor {n}" for n in self.tensor_names] + \
               [f"float {n}" for n in self.scalar_names]
        # every output in the epilogue's order: M x N stores (T, N) (evtc.glu's (T, N / 2)) and
        # f32 reductions (NOTE [Reductions in the grouped kernel]): per token (T,), per group
        # (E, N) for a column reduction, (E,) for a scalar one
        self.output_names = tuple(o.name for o in graph.outputs)
        single = len(self.output_names) == 1
        self.schema = "(" + ", ".join(args) + ") -> " + (
            "Tensor" if single else "(" + ", ".join(["Tensor"] * len(self.output_names)) + ")")
        names = self.tensor_names + self.scalar_names
        shapes = []  # (T, E, N) -> the output's shape
        for o in graph.outputs:
            if isinstance(o, Store):
                shapes.append(lambda T, E, N, o=o: (T, o.columns(N)))
            else:
                shapes.append(lambda T, E, N, o=o: reduction_shape(o, T, E, N))
        dtypes = [getattr(torch, o.dtype.torch) for o in graph.outputs]
        out_names = self.output_names

        def run(A, B, offs, *rest):
            got = gg.run_eager(k_contiguous(A), k_contiguous(B), offs, **dict(zip(names, rest)))
            return got if single else tuple(got[n] for n in out_names)

        def fake(A, B, offs, *rest):
            # (the call's first checks, evtc/grouped.py: an operand it would refuse fails the trace)
            if A.dim() != 2 or B.dim() != 3 or A.shape[1] != B.shape[2]:
                raise ArgumentError(f"A is {tuple(A.shape)} and B {tuple(B.shape)}: the grouped GEMM takes A (T, K) "
                                    "and B (E, N, K)", epilogue=graph.name)
            if offs.dtype != torch.int32 or tuple(offs.shape) != (B.shape[0],):
                raise ArgumentError(f"offs is {offs.dtype} {tuple(offs.shape)}: the grouped GEMM takes E = "
                                    f"{B.shape[0]} int32 cumulative row counts", epilogue=graph.name,
                                    hint="offs = torch.cumsum(tokens_per_expert, 0).to(torch.int32)")
            T, (E, N) = A.shape[0], B.shape[:2]
            outs = [A.new_empty(shape(T, E, N), dtype=dt) for shape, dt in zip(shapes, dtypes)]
            return outs[0] if single else tuple(outs)

        self.op = torch.library.custom_op(self.qualname, run, mutates_args=(), device_types="cuda",
                                          schema=self.schema, tags=layout_tags(torch))
        self.op.register_fake(fake)

    @property
    def overload(self):
        """The op's ``OpOverload`` (the target FX graphs call: evtc/torch/regions.py)."""
        import torch

        ns, name = self.qualname.split("::")
        return getattr(getattr(torch.ops, ns), name).default

    def __call__(self, A, B, offs, **kwargs):
        """Run the GroupedGemm through the op (the arguments of :meth:`evtc.GroupedGemm.__call__`
        without ``out=``, ``member=`` and ``check_offs=``)."""
        missing = [n for n in self.tensor_names + self.scalar_names if n not in kwargs]
        extra = [n for n in kwargs if n not in self.tensor_names + self.scalar_names]
        if missing or extra:
            raise ArgumentError(f"{'missing ' + ', '.join(missing) if missing else ''}"
                                f"{'; ' if missing and extra else ''}{'unknown ' + ', '.join(extra) if extra else ''}",
                                epilogue=self.gg.name, hint="pass the epilogue's parameters by name: "
                                + ", ".join(self.tensor_names + self.scalar_names))
        operands = {"A": A, "B": B, "offs": offs}
        args = call_args(self.gg.name, operands, kwargs, self.tensor_names, self.scalar_names)
        got = run_op(self.op, self.gg.name, operands, args, self.tensor_names + self.scalar_names)
        return got if len(self.output_names) == 1 else dict(zip(self.output_names, got))


def grouped_qualname(gg) -> str:
    """``"evtc::grouped_<epilogue>_<12 hex digits>"``: the hash of the IR, dtypes and family."""
    from evtc.ir.printer import print_graph

    key = json.dumps({"ir": print_graph(gg.graph), "a": gg.a.name, "b": gg.b.name,
                      "family": {n: repr(m.spec.config) for n, m in gg._members.items()}}, sort_keys=True)
    return f"evtc::grouped_{gg.graph.name}_{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def grouped_torch_op(gg) -> GroupedTorchOp:
    """The :class:`GroupedTorchOp` of ``gg``, made once per distinct GroupedGemm and kept.

    Raises:
        ArgumentError: a parameter name the schema can't hold.
    """
    with _LOCK:
        qual = grouped_qualname(gg)
        op = _OPS.get(qual)
        if op is None:
            op = _OPS[qual] = GroupedTorchOp(gg)
    return op
