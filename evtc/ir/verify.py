"""The IR verifier.

Input: a Graph (and optionally the arch it is meant for). Output: nothing, or an
:class:`~evtc.errors.IRVerificationError` that shows a window of IR text around the bad node.

Checked: every value is defined before use and every leaf is a declared input; parameter and
output names are unique; outputs are terminal; each compute names a registered op with the
right arity; dtypes follow the rules (acc and computes are f32 except conversions; immediates
f32; stores and reductions have output dtypes evtc can write); M x N outputs have M x N values;
on sm90 the collective stores one M x N output (so there must be at least one).
"""

from __future__ import annotations

from evtc import dtypes, ops
from evtc.errors import IRVerificationError
from evtc.ir.graph import Graph
from evtc.ir.nodes import Accumulator, Bcast, Compute, Immediate, Leaf, Node, Output, Reduction, Store
from evtc.ir.printer import window

REDUCTION_DTYPES = (dtypes.f32, dtypes.f16, dtypes.bf16)


def verify(graph: Graph, arch: str | None = None, *, after: str | None = None) -> None:
    """Check the invariants of ``graph``.

    Args:
        graph: the graph to check.
        arch: also check the per-arch rules for ``"sm90"`` or ``"sm80"``.
        after: the name of the pass that produced ``graph``, named in the error.

    Raises:
        IRVerificationError: the first broken invariant, with an IR window around the node.
    """

    def fail(msg: str, node: Node | None = None) -> IRVerificationError:
        text = msg
        if after:
            text = f"after pass '{after}': {msg}"
        if node is not None:
            w = window(graph, node)
            if w:
                text += "\n" + w
        return IRVerificationError(text, loc=getattr(node, "loc", None), epilogue=graph.name)

    declared = {id(i) for i in graph.inputs}
    names: set[str] = set()
    for leaf in graph.inputs:
        if not isinstance(leaf, Leaf):
            raise fail(f"declared input {leaf!r} is not a leaf")
        if leaf.name in names:
            raise fail(f"parameter name '{leaf.name}' is declared twice")
        names.add(leaf.name)
    n_acc = sum(isinstance(i, Accumulator) for i in graph.inputs)
    if n_acc > 1:
        raise fail("more than one accumulator")

    position: dict[int, int] = {}
    out_ids = {id(o) for o in graph.outputs}
    for k, node in enumerate(graph.nodes):
        for i in node.inputs:
            if id(i) not in position:
                raise fail("a value is used before it is defined (or the graph has a cycle)", node)
            if isinstance(i, Output):
                raise fail(f"output '{i.name}' is used as an input of another node", node)
        position[id(node)] = k
        if isinstance(node, Leaf):
            if id(node) not in declared:
                raise fail(f"leaf '{node.name}' is not a declared input", node)
            if isinstance(node, Accumulator) and node.dtype is not dtypes.f32:
                raise fail("the accumulator must be f32", node)
        elif isinstance(node, Immediate):
            if node.dtype is not dtypes.f32:
                raise fail("constants are f32", node)
        elif isinstance(node, Compute):
            if node.op not in ops.OPS:
                raise fail(f"unknown op '{node.op}'", node)
            arity = ops.OPS[node.op].arity
            if len(node.args) != arity:
                raise fail(f"op '{node.op}' takes {arity} operands, got {len(node.args)}", node)
            if node.op == "convert":
                if node.dtype not in dtypes.TENSOR_DTYPES:
                    raise fail(f"can't convert to {node.dtype}", node)
            elif node.dtype is not dtypes.f32:
                raise fail(f"'{node.op}' computes in f32, not {node.dtype}", node)
        elif isinstance(node, Output):
            if id(node) not in out_ids:
                raise fail(f"output '{node.name}' is not in the graph's outputs", node)
            if node.name in names:
                raise fail(f"output name '{node.name}' is already used", node)
            names.add(node.name)
            if node.value is None or node.value.bcast is not Bcast.MN:
                raise fail(f"output '{node.name}' needs an M x N value", node)
            if isinstance(node, Store) and node.dtype not in dtypes.TENSOR_DTYPES:
                raise fail(f"M x N outputs can't be {node.dtype}", node)
            if isinstance(node, Reduction):
                if node.dtype not in REDUCTION_DTYPES:
                    raise fail(f"reduction outputs are f32, f16 or bf16, not {node.dtype}", node)
                if node.dim is not None and (type(node.dim) is not int or node.dim not in (0, 1)):
                    raise fail(f"reduction dim {node.dim!r} is not 0, 1 or None", node)
        else:
            raise fail(f"unknown node kind {type(node).__name__}", node)

    if not graph.outputs:
        raise fail("the epilogue has no outputs")
    if arch == "sm90" and not any(isinstance(o, Store) for o in graph.outputs):
        raise fail("on sm90 the collective epilogue stores D: the epilogue needs at least one M x N output")
