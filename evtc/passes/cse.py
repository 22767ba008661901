"""Common-subexpression elimination.

Input: a Graph. Output: a Graph without two structurally equal nodes, up to commutativity.

:class:`~evtc.ir.graph.GraphBuilder` already merges equal nodes as they are built; this pass
also orders the operands of commutative ops (``add``, ``mul``, ``maximum``, ``eq``...) by their
first position in the graph (parameters in signature order, then rebuilt nodes in order,
immediates last), so ``a * b`` and ``b * a`` become one node.

Requires: nothing. Ensures: no two nodes are equal up to the operand order of commutative ops.
Preserves: values exactly.
"""

from __future__ import annotations

from evtc import ops
from evtc.ir.graph import Graph, GraphBuilder, with_inputs
from evtc.ir.nodes import Compute, Immediate, Node, const_identity
from evtc.ir.verify import Violation
from evtc.passes.manager import Pass, PassResult, rewrite

__all__ = ["CSE", "cse"]


def _commutative(n: Node) -> bool:
    return isinstance(n, Compute) and ops.get(n.op).commutative


def cse(graph: Graph) -> PassResult:
    """Order commutative operands canonically and merge equal nodes (module docs).

    Args:
        graph: any Graph.

    Returns:
        The graph with duplicates merged.

    Example::

        cse(g).graph    # add(mul(acc, x), mul(x, acc))  ->  %0 = mul(acc, x); add(%0, %0)
    """
    position: dict[int, int] = {id(leaf): k for k, leaf in enumerate(graph.inputs)}
    counter = [len(graph.inputs)]

    def key(n: Node) -> tuple:
        if isinstance(n, Immediate):
            return (1, const_identity(n.value))
        return (0, position.get(id(n), 1 << 30))

    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
        if _commutative(node):
            inputs = tuple(sorted(inputs, key=key))
        new = b.add(with_inputs(node, inputs))
        # positions of rebuilt nodes, recorded as we go, so operand order depends only on structure
        if id(new) not in position:
            position[id(new)] = counter[0]
            counter[0] += 1
        return new

    return PassResult.of(graph, rewrite(graph, rule))


def no_duplicates(graph: Graph) -> Violation | None:
    """What :func:`cse` ensures: no two nodes equal up to commutative operand order."""
    seen: dict[tuple, Node] = {}
    for n in graph.nodes:
        k = n.key()
        if _commutative(n):
            k = ("Compute", n.op, n.dtype, n.attrs, tuple(sorted(id(a) for a in n.args)))
        if k in seen:
            return Violation("no-duplicates", "two nodes compute the same value", n)
        seen[k] = n
    return None


CSE = Pass("cse", cse, ensures=no_duplicates)
