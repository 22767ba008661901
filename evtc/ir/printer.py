"""The canonical text form of a Graph.

Input: :class:`~evtc.ir.graph.Graph`. Output: text that ``grammar/epilogue.lark`` reads back
(:func:`evtc.frontend.text.parse_ir`), so ``parse_ir(print_graph(g)) == g``.

Example::

    epilogue bias_relu(acc: f32 accumulator, C: bf16 source, alpha: f32 scalar, beta: f32 scalar, bias: f32 row):
      %0 = mul(alpha, acc) : f32
      %1 = mul(beta, C) : f32
      %2 = add(%0, %1) : f32
      %3 = add(%2, bias) : f32
      %4 = relu(%3) : f32
      D = store(%4) : bf16

One node per line in the graph's topological order; inputs by parameter name, intermediate
values as ``%k`` numbered in that order, outputs by name. Constants are written inline as
float literals (``repr`` of the float64, which round-trips exactly). A reduction prints as
``reduce_<op>(value, dim=1)``, a quantization's scales ``group_scale(q)`` (its group and
convention are q's attributes); a device-pointer scalar's kind is ``devscalar``.
"""

from __future__ import annotations

import math

from evtc.ir.graph import Graph
from evtc.ir.nodes import Compute, GroupScale, Immediate, Leaf, Node, Reduction, ScalarBroadcast, Store


def leaf_kind(leaf: Leaf) -> str:
    if isinstance(leaf, ScalarBroadcast) and leaf.by_pointer:
        return "devscalar"
    return leaf.kind


def format_float(v: float) -> str:
    if math.isnan(v):
        return "nan"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    return repr(float(v))


def _attr(v) -> str:
    if isinstance(v, float):
        return format_float(v)
    if isinstance(v, str) and not v.isidentifier():
        return '"' + v.replace('\\', '\\\\').replace('"', '\\"') + '"'
    return str(v)


def value_names(graph: Graph) -> dict[int, str]:
    """The printed name of every value: parameter names, ``%k`` for computes, output names."""
    names: dict[int, str] = {}
    for leaf in graph.inputs:
        names[id(leaf)] = leaf.name
    k = 0
    for n in graph.nodes:
        if id(n) in names:
            continue
        if isinstance(n, Leaf):
            names[id(n)] = n.name
        elif isinstance(n, Compute):
            names[id(n)] = f"%{k}"
            k += 1
        elif isinstance(n, (Store, Reduction)):
            names[id(n)] = n.name
    return names


def _operand(node: Node, names: dict[int, str]) -> str:
    if isinstance(node, Immediate):
        return format_float(node.value)
    return names[id(node)]


def format_node(node: Node, names: dict[int, str]) -> str | None:
    """One line of the text form for ``node`` (None for leaves and immediates)."""
    if isinstance(node, Compute):
        args = ", ".join(_operand(a, names) for a in node.args)
        attrs = ""
        if node.attrs:
            attrs = " {" + ", ".join(f"{k}={_attr(v)}" for k, v in node.attrs) + "}"
        return f"{names[id(node)]} = {node.op}({args}){attrs} : {node.dtype}"
    if isinstance(node, GroupScale):
        return f"{node.name} = group_scale({_operand(node.value, names)}) : {node.dtype}"
    if isinstance(node, Reduction):
        dim = "" if node.dim is None else f", dim={node.dim}"
        return f"{node.name} = reduce_{node.op.value}({_operand(node.value, names)}{dim}) : {node.dtype}"
    if isinstance(node, Store):
        return f"{node.name} = store({_operand(node.value, names)}) : {node.dtype}"
    return None


def print_graph(graph: Graph, *, locs: bool = False) -> str:
    """The canonical text of ``graph``; with ``locs=True`` each line ends with the user's
    ``# file:line`` (not part of the canonical form)."""
    names = value_names(graph)
    params = ", ".join(f"{leaf.name}: {leaf.dtype} {leaf_kind(leaf)}" for leaf in graph.inputs)
    lines = [f"epilogue {graph.name}({params}):"]
    for n in graph.nodes:
        text = format_node(n, names)
        if text is None:
            continue
        if locs and n.loc is not None:
            text = f"{text:<48} # {n.loc}"
        lines.append("  " + text)
    return "\n".join(lines) + "\n"


def window(graph: Graph, node: Node, radius: int = 3) -> str:
    """A few lines of IR text around ``node``, the node's line marked with ``>``; used by
    verifier errors."""
    names = value_names(graph)
    rows = [(n, format_node(n, names)) for n in graph.nodes]
    rows = [(n, t) for n, t in rows if t is not None]
    idx = next((i for i, (n, _) in enumerate(rows) if n is node), None)
    if idx is None:
        return ""
    lo, hi = max(0, idx - radius), min(len(rows), idx + radius + 1)
    return "\n".join(("> " if i == idx else "  ") + rows[i][1] for i in range(lo, hi))
