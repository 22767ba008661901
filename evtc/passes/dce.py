"""Dead-code elimination.

Input: a Graph. Output: a Graph holding exactly the nodes its outputs reach, interned in a
fresh builder.

A Graph stores its outputs (and its declared inputs) and derives everything else, so dead code
never shows through ``graph.nodes``; what other passes leave behind is unreachable nodes in
their builders. Rebuilding from the outputs with a fresh builder drops them, so the next pass
(and the emitted code, which is keyed by the graph) sees only live nodes. Declared inputs that
no output uses stay declared (the runtime still accepts them) but emit nothing.

Requires: nothing. Guarantees: every node reaches an output. Preserves: values exactly.
"""

from __future__ import annotations

from evtc.ir.graph import Graph, rebuild


def dce(graph: Graph, arch: str | None = None) -> Graph:
    return rebuild(graph)
