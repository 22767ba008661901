"""A picture of the epilogue DAG with each buffer's placement (graphviz DOT).

Input: a Graph and its Plan. Output: DOT text (``evtc plan --dot/--png``).
"""

from __future__ import annotations

from evtc.ir.graph import Graph
from evtc.ir.nodes import Accumulator, Compute, Immediate, Leaf, Reduction, Store
from evtc.ir.printer import format_float, leaf_kind
from evtc.plan.plan import Plan

COLORS = {"tma": "#9ecae1", "direct": "#fdae6b", "smem": "#c7e9c0", "shared": "#dadaeb", "none": "#ffffff"}


def _q(s: str) -> str:
    return '"' + s.replace('"', '\\"') + '"'


def to_dot(graph: Graph, plan: Plan) -> str:
    """DOT text: inputs at the top, outputs at the bottom; M x N tensors and row broadcasts are
    coloured by placement (TMA through smem, register-direct, smem row, shared with another
    buffer) and labelled with stages, bytes and offset."""
    title = (f"{graph.name}: {plan.policy} plan, epilogue smem {plan.epilogue_smem_bytes} B, "
             f"{plan.mainloop_stages} mainloop stages")
    lines = [f"digraph {_q(graph.name)} {{", "  rankdir=TB;", '  node [fontname="Helvetica", fontsize=10];',
             f"  label={_q(title)};"]
    ids = {id(n): f"n{k}" for k, n in enumerate(graph.nodes)}
    for n in graph.nodes:
        nid = ids[id(n)]
        buf = plan.buffer(getattr(n, "name", "")) if isinstance(n, (Leaf, Store)) else None
        if isinstance(n, Accumulator):
            label, shape, color = "acc", "box", COLORS["none"]
        elif isinstance(n, Leaf):
            label, shape = f"{n.name}: {n.dtype} {leaf_kind(n)}", "box"
            color = COLORS[buf.mode] if buf else COLORS["none"]
        elif isinstance(n, Immediate):
            label, shape, color = format_float(n.value), "plaintext", COLORS["none"]
        elif isinstance(n, Compute):
            label, shape, color = n.op, "ellipse", COLORS["none"]
        elif isinstance(n, Reduction):
            label, shape, color = f"{n.name}: {n.op.value} dim={n.dim}", "invhouse", COLORS["none"]
        else:
            label, shape = f"{n.name}: {n.dtype} store", "invhouse"
            color = COLORS[buf.mode] if buf else COLORS["none"]
        if buf is not None:
            label += f"\\n{buf.role}, {buf.mode}, {buf.stages} st, {buf.bytes} B"
            if buf.offset >= 0:
                label += f" @ {buf.offset}"
            if buf.shares_with:
                label += f"\\nshares with {', '.join(buf.shares_with)}"
        lines.append(f"  {nid} [label={_q(label)}, shape={shape}, style=filled, fillcolor={_q(color)}];")
    for n in graph.nodes:
        for k, i in enumerate(n.inputs):
            lines.append(f"  {ids[id(i)]} -> {ids[id(n)]} [label={_q(str(k))}, fontsize=8];")
    lines.append("}")
    return "\n".join(lines) + "\n"
