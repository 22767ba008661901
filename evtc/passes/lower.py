"""Lowering of ops CUTLASS lacks into ones it has (or into evtc's own functors).

Input: a Graph. Output: a Graph whose computes all have a functor on every arch.

* ``pow(x, c)`` for c in {0, 0.5, 1, 2, 3, -0.5, -1} becomes ``1``, ``sqrt``, ``x``, ``x*x``,
  ``x*x*x``, ``rsqrt``, ``1/x``; other exponents stay ``pow`` (``evtc::Pow``, ``powf``).
* Every other op of the table has a functor (``cutlass::`` or ``evtc::``); an op without one
  raises :class:`UnsupportedOpError` naming the op.

Requires: fold. Guarantees: every compute maps to a functor. Preserves: values (x*x vs powf
differs by f32 rounding only).
"""

from __future__ import annotations

from evtc import ops
from evtc.dtypes import f32
from evtc.errors import UnsupportedOpError
from evtc.ir.graph import Graph, GraphBuilder, rebuild, with_inputs
from evtc.ir.nodes import Compute, Immediate, Node


def _pow(node: Compute, b: GraphBuilder) -> Node:
    x, e = node.args
    assert isinstance(e, Immediate)
    v = e.value

    def c(op, *args):
        return b.add(Compute(f32, op=op, args=args, loc=node.loc))

    if v == 0.0:
        return b.add(Immediate(f32, value=1.0, loc=node.loc))
    if v == 1.0:
        return x
    if v == 2.0:
        return c("mul", x, x)
    if v == 3.0:
        return c("mul", c("mul", x, x), x)
    if v == 0.5:
        return c("sqrt", x)
    if v == -0.5:
        return c("rsqrt", x)
    if v == -1.0:
        return c("div", b.add(Immediate(f32, value=1.0, loc=node.loc)), x)
    return node


def lower(graph: Graph, arch: str | None = None) -> Graph:
    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
        new = with_inputs(node, inputs)
        if isinstance(new, Compute):
            if new.op == "pow" and isinstance(new.args[1], Immediate):
                return _pow(new, b)
            if not ops.get(new.op).functor:
                raise UnsupportedOpError(f"op '{new.op}' has no CUTLASS or evtc functor", loc=new.loc,
                                         epilogue=graph.name)
        return new

    return rebuild(graph, rule)
