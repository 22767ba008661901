"""Common-subexpression elimination.

Input: a Graph. Output: a Graph without two structurally equal nodes.

:class:`~evtc.ir.graph.GraphBuilder` already merges equal nodes as they are built; this pass
also orders the operands of commutative ops (``add``, ``mul``, ``maximum``, ``eq``...) by their
first position in the graph, so ``a * b`` and ``b * a`` become one node.

Requires: nothing. Guarantees: no duplicates up to commutativity. Preserves: values exactly.
"""

from __future__ import annotations

from evtc import ops
from evtc.ir.graph import Graph, GraphBuilder, rebuild, with_inputs
from evtc.ir.nodes import Compute, Immediate, Leaf, Node


def cse(graph: Graph, arch: str | None = None) -> Graph:
    position: dict[int, int] = {}
    for k, leaf in enumerate(graph.inputs):
        position[id(leaf)] = k

    def key(n: Node) -> tuple:
        if isinstance(n, Immediate):
            return (1, n.value)
        return (0, position.get(id(n), 1 << 30))

    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
        if isinstance(node, Compute) and ops.get(node.op).commutative:
            inputs = tuple(sorted(inputs, key=key))
        new = with_inputs(node, inputs)
        return new

    # positions of rebuilt nodes: record as we go, so operand order depends only on structure
    counter = [len(graph.inputs)]

    def rule_with_positions(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
        new = b.add(rule(node, inputs, b))
        if id(new) not in position:
            position[id(new)] = counter[0]
            counter[0] += 1
        return new

    return rebuild(graph, rule_with_positions)
