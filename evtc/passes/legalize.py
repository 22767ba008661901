"""Per-arch legalization.

Input: a Graph and an arch. Output: the same Graph, or a located :class:`LegalizeError`.

sm90 (``sm90_visitor_*.hpp``):
* the collective stores D: at least one M x N output;
* a scalar reduction (``Sm90ScalarReduction``) only has an atomic implementation, so its
  output is f32 (``atomicAdd``/``atomicMax``/``atomicMin`` on float);
* every M x N tensor (C, aux loads, stores) is f32, f16, bf16, e4m3 or e5m2.

sm80 (``threadblock/fusion/visitor_*.hpp``):
* the same dtype rules; a scalar reduction is f32 (``VisitorScalarReduction`` is atomic too).

Requires: propagate. Guarantees: the graph can be emitted for ``arch``. Preserves: all.
"""

from __future__ import annotations

from evtc import dtypes
from evtc.errors import LegalizeError
from evtc.ir.graph import Graph
from evtc.ir.nodes import Leaf, Reduction, Store


def legalize(graph: Graph, arch: str | None = None) -> Graph:
    if arch is None:
        return graph
    if arch == "sm90" and not any(isinstance(o, Store) for o in graph.outputs):
        raise LegalizeError(
            "on sm90 the collective epilogue stores D: this epilogue has no M x N output",
            loc=graph.loc, epilogue=graph.name,
            hint="return the M x N value the reductions are computed from, e.g. {'D': d, 'row_max': evtc.max(d, dim=1)}",
        )
    for node in graph.nodes:
        if isinstance(node, Reduction) and node.dim is None and node.dtype is not dtypes.f32:
            raise LegalizeError(
                f"scalar reduction '{node.name}' must be f32 (it accumulates with float atomics)",
                loc=node.loc, epilogue=graph.name, hint="drop the .to(...) on the reduction",
            )
        if isinstance(node, (Leaf, Store)) and node.bcast.value == "mn" and node.dtype not in dtypes.TENSOR_DTYPES:
            raise LegalizeError(f"'{node.name}' can't be {node.dtype}", loc=node.loc, epilogue=graph.name)
    return graph
