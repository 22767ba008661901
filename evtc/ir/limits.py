"""The size limits of an epilogue: nodes, nesting depth, outputs, parameters.

Input: the nodes a frontend builds, or a whole Graph. Output: nothing, or a located
:class:`~evtc.errors.GraphTooLargeError` naming the limit and the epilogue.

The frontends check as they build (:class:`evtc.frontend.builder.IRBuilder`), so an epilogue far
beyond a limit (a loop of 20,000 ``relu(x) + 1``, 10,000 outputs) stops at the line that crossed
it, after building no more than the limit; :func:`check` does the same for a Graph built by hand
(``evtc.passes.run`` calls it first).

NOTE [Epilogue size limits]
    Each limit is what a later stage can take, with room to spare for real epilogues (the
    largest of examples/epilogues.py has 14 nodes, depth 8, 3 outputs, 5 parameters):

    * depth 128: CUTLASS nests one visitor type per level (``Sm90EVT<Op, Child>`` is
      ``Sm90TreeVisitor``, whose base ``Sm90VisitorImpl`` -> ``Sm90VisitorImplBase`` needs
      ``Child::SharedStorage``: sm90_visitor_tma_warpspecialized.hpp), at least three nested
      class template instantiations per level, and nvcc's host compiler stops at 900 of them
      (GCC's default ``-ftemplate-depth``; the C++ standard recommends 1024), so about 300
      levels at best; 128 leaves room for the tuples and topological visitors in between.
    * outputs 64, parameters 64: each M x N tensor brings a 128-byte TMA descriptor plus its
      pointer and strides into the kernel's parameters, which CUDA caps at 32,764 bytes (4,096
      before CUDA 12.1); 128 tensors take about 20 KB of them. The DAG -> tree lowering also
      walks the graph once per output (``evtc/lower/to_tree.py``), so outputs multiply its time.
    * nodes 4096: one visitor type (an ``N<k>`` alias) per node in the emitted source, which
      nvcc instantiates one by one; 300 times the largest example.

    A research epilogue may raise them (``evtc.ir.limits.LIMITS = Limits(depth=256)``); nothing
    in evtc itself depends on their values, and each stage stays linear in the graph's size.
"""

from __future__ import annotations

import dataclasses

from evtc.errors import GraphTooLargeError, SourceLoc

__all__ = ["Limits", "LIMITS", "check", "too_large"]


@dataclasses.dataclass(frozen=True)
class Limits:
    """The size limits (NOTE [Epilogue size limits]).

    Attributes:
        nodes: distinct nodes built (inputs, constants, computes, outputs).
        depth: the longest chain of computes and outputs (:attr:`evtc.ir.nodes.Node.depth`).
        outputs: outputs (M x N stores and reductions).
        inputs: parameters.
    """

    nodes: int = 4096
    depth: int = 128
    outputs: int = 64
    inputs: int = 64


#: the limits every frontend and ``evtc.passes.run`` check (read at each check, so a test or a
#: research epilogue may replace it)
LIMITS = Limits()

_WHAT = {
    "nodes": ("nodes", "each node is one visitor type nvcc instantiates"),
    "depth": ("levels of nested operations", "CUTLASS nests one visitor type per level, and C++ compilers stop "
              "near 900 nested template instantiations"),
    "outputs": ("outputs", "each output is a TMA descriptor in the kernel's parameters (32 KB at most)"),
    "inputs": ("parameters", "each tensor parameter is a TMA descriptor in the kernel's parameters (32 KB at most)"),
}


def too_large(limit: str, epilogue: str | None, loc: SourceLoc | None) -> GraphTooLargeError:
    """The error for an epilogue beyond ``LIMITS.<limit>``, located at ``loc`` (the line that
    crossed it)."""
    value = getattr(LIMITS, limit)
    what, why = _WHAT[limit]
    return GraphTooLargeError(
        f"the epilogue is too large: more than {value} {what} (evtc.ir.limits.LIMITS.{limit})",
        loc=loc, epilogue=epilogue,
        hint=f"{why}; split the epilogue into smaller ones, or compute part of it outside the GEMM")


def check(graph) -> None:
    """Check a whole Graph against :data:`LIMITS` (for graphs not built by a frontend).

    Raises:
        GraphTooLargeError: the first limit crossed, located at the node that crossed it.
    """
    if len(graph.inputs) > LIMITS.inputs:
        raise too_large("inputs", graph.name, graph.inputs[LIMITS.inputs].loc or graph.loc)
    if len(graph.outputs) > LIMITS.outputs:
        raise too_large("outputs", graph.name, graph.outputs[LIMITS.outputs].loc or graph.loc)
    deepest = max(graph.outputs, key=lambda o: o.depth, default=None)
    if deepest is not None and deepest.depth > LIMITS.depth:
        node = deepest
        while node.depth > LIMITS.depth + 1:  # down to the node that crossed the limit
            node = max(node.inputs, key=lambda i: i.depth)
        raise too_large("depth", graph.name, node.loc or graph.loc)
    if len(graph.nodes) > LIMITS.nodes:
        raise too_large("nodes", graph.name, graph.nodes[LIMITS.nodes].loc or graph.loc)
