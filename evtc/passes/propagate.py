"""Dtype and broadcast propagation.

Input: a Graph from a frontend. Output: the same Graph, with every node's dtype and broadcast
class checked against the op table's rules, or a located :class:`EpilogueTypeError`.

Rules: computes take operands of any float dtype and produce f32 (the compute type) except
``convert``, which produces its target dtype; an output's value must vary along M and N (an
M x N store or reduction of a vector is an error: broadcast it against ``acc`` first); the
exponent of ``pow`` must be a constant; the condition of ``where`` may have any broadcast class.
The broadcast class of a compute is the join of its operands' (a property of the node, so
"propagation" here is checking that every join is legal).

Requires: nothing. Guarantees: dtypes and broadcast classes are consistent. Preserves: all.
"""

from __future__ import annotations

from evtc import dtypes, ops
from evtc.errors import EpilogueTypeError
from evtc.ir.graph import Graph
from evtc.ir.nodes import Bcast, Compute, Immediate, Output


def propagate(graph: Graph, arch: str | None = None) -> Graph:
    for node in graph.nodes:
        if isinstance(node, Compute):
            op = ops.get(node.op)
            if len(node.args) != op.arity:
                raise EpilogueTypeError(f"{node.op} takes {op.arity} operands, got {len(node.args)}",
                                        loc=node.loc, epilogue=graph.name)
            if node.op == "pow" and not isinstance(node.args[1], Immediate):
                raise EpilogueTypeError("pow needs a constant exponent", loc=node.loc, epilogue=graph.name,
                                        hint="write the exponent as a number, or use exp(y * log(x))")
            if node.op == "convert" and node.dtype not in dtypes.TENSOR_DTYPES:
                raise EpilogueTypeError(f"can't convert to {node.dtype}", loc=node.loc, epilogue=graph.name)
            if node.op != "convert" and node.dtype is not dtypes.f32:
                raise EpilogueTypeError(f"{node.op} computes in f32, not {node.dtype}", loc=node.loc,
                                        epilogue=graph.name)
        elif isinstance(node, Output):
            if node.value is None or node.value.bcast is not Bcast.MN:
                got = node.value.bcast.value if node.value is not None else "nothing"
                raise EpilogueTypeError(
                    f"output '{node.name}' needs an M x N value, got a {got} value",
                    loc=node.loc, epilogue=graph.name,
                    hint="combine it with acc, C or an M x N input first",
                )
    return graph
