"""Dead-code elimination.

Input: a Graph. Output: a Graph holding exactly the nodes its outputs reach, interned in a
fresh builder.

A Graph stores its outputs (and its declared inputs) and derives everything else, so dead code
never shows through ``graph.nodes``; what other passes leave behind is unreachable nodes in
their builders. Rebuilding from the outputs with a fresh builder drops them, so the next pass
(and the emitted code, which is keyed by the graph) sees only live nodes. Declared inputs that
no output uses stay declared (the runtime still accepts them) but emit nothing.

Requires: nothing. Ensures: every node reaches an output (by construction of ``graph.nodes``,
so there is nothing to check after it). Preserves: values exactly.
"""

from __future__ import annotations

from evtc.ir.graph import Graph
from evtc.passes.manager import Pass, PassResult, rewrite

__all__ = ["DCE", "dce"]


def dce(graph: Graph) -> PassResult:
    """Re-intern ``graph`` from its outputs in a fresh builder.

    Args:
        graph: any Graph.

    Returns:
        The same graph, holding only live nodes (``changed`` only when equal nodes merged).
    """
    return PassResult.of(graph, rewrite(graph))


DCE = Pass("dce", dce)
