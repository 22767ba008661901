"""Pictures of a plan: the shared-memory map and the DAG coloured by buffer mode.

Input: a Graph and its Plan. Output: an SVG or PNG file (:func:`draw_plan`, matplotlib, with
networkx for the DAG's layout: no graphviz binary needed; ``evtc plan --svg/--png``, ``evtc
demo``, the docs' planner page), or DOT text (:func:`to_dot`, ``evtc plan --dot``).

The picture has three panels:

1. the block's shared memory (the target's capacity, 232448 B on sm90): the epilogue's
   storage, each mainloop stage it leaves, and what is unused;
2. the epilogue's storage, byte for byte: each buffer at its offset with its bytes, and below
   it the tensors that live inside another buffer (D in C's buffer with ``ReuseSmemC``, an aux
   store in an aux load's slot);
3. the DAG, inputs at the top and outputs at the bottom, every tensor coloured by where it
   lives (TMA through shared memory, inside another buffer, register-direct, a shared-memory
   row, registers or the workspace).
"""

from __future__ import annotations

from pathlib import Path

from evtc.ir.graph import Graph
from evtc.ir.nodes import Accumulator, Compute, Immediate, Leaf, Reduction, Store
from evtc.ir.printer import format_float, leaf_kind
from evtc.plan.model import Plan, plan_rows

__all__ = ["COLORS", "MODE_LABELS", "draw_plan", "to_dot"]

#: Fill colour per buffer mode (:attr:`evtc.plan.model.PlanRow.mode`).
COLORS = {"tma": "#9ecae1", "packed": "#6baed6", "direct": "#fdae6b", "smem": "#c7e9c0", "shared": "#bcbddc", "registers": "#fdd0a2",
          "workspace": "#fee391", "atomic": "#fee391", "none": "#ffffff"}

#: The legend's words for each mode.
MODE_LABELS = {
    "tma": "TMA through shared memory", "packed": "shared memory, stored row by row by the threads", "shared": "inside another buffer", "direct": "register-direct",
    "smem": "shared-memory row / buffer", "registers": "registers", "workspace": "workspace / atomics",
}


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


def _node_label(n) -> str:
    if isinstance(n, Accumulator):
        return "acc"
    if isinstance(n, Leaf):
        return f"{n.name}\n{leaf_kind(n)} {n.dtype}"
    if isinstance(n, Immediate):
        return format_float(n.value)
    if isinstance(n, Compute):
        return n.op
    if isinstance(n, Reduction):
        return f"{n.name}\n{n.op.value}(dim={n.dim})"
    return f"{n.name}\nstore {n.dtype}"


def _bar(ax, x0: float, width: float, y: float, h: float, color: str, label: str, *, hatch: str | None = None,
         text_min: float = 0.06, span: float = 1.0) -> None:
    ax.add_patch(_rect((x0, y), width, h, color, hatch))
    if width >= text_min * span:
        ax.text(x0 + width / 2, y + h / 2, label, ha="center", va="center", fontsize=8, clip_on=True)
    else:  # too narrow for its label: put it above, slanted
        ax.text(x0 + width / 2, y + h + 0.08, label.replace("\n", " "), ha="right", va="bottom", fontsize=7)


def _rect(xy, w, h, color, hatch=None):
    from matplotlib.patches import Rectangle

    return Rectangle(xy, w, h, facecolor=color, edgecolor="#333333", linewidth=0.6, hatch=hatch)


def draw_plan(graph: Graph, plan: Plan, path: str | Path) -> Path:
    """Draw the plan's shared-memory map and the DAG into ``path``.

    Args:
        graph: the epilogue after passes (``gemm.graph``).
        plan: its plan (``gemm.plan``).
        path: the file to write; its suffix (``.svg`` or ``.png``) picks the format. SVG text
            stays text (searchable, and what the tests read).

    Returns:
        ``path``.

    Raises:
        ValueError: the suffix is neither ``.svg`` nor ``.png``.
        OSError: the file can't be written.
        ImportError: matplotlib or networkx is missing.
    """
    import matplotlib
    import networkx as nx
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    path = Path(path)
    fmt = path.suffix.lower().lstrip(".")
    if fmt not in ("svg", "png"):
        raise ValueError(f"{path}: draw_plan writes .svg or .png files")
    rows = plan_rows(plan)

    # the DAG: nodes by topological generation, inputs at the top
    g = nx.DiGraph()
    ids = {id(n): k for k, n in enumerate(graph.nodes)}
    for n in graph.nodes:
        g.add_node(ids[id(n)])
    for n in graph.nodes:
        for i in n.inputs:
            g.add_edge(ids[id(i)], ids[id(n)])
    layers = list(nx.topological_generations(g))
    widest = max((len(layer) for layer in layers), default=1)

    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "evtc", "font.family": "DejaVu Sans", "hatch.linewidth": 0.5}):
        fig = Figure(figsize=(max(10.0, 1.5 * widest), 4.2 + 0.8 * len(layers)))
        FigureCanvasAgg(fig)
        gs = fig.add_gridspec(3, 1, height_ratios=[1.0, 1.5, 0.9 * max(len(layers), 2)], hspace=0.55)
        _draw_block(fig.add_subplot(gs[0]), plan)
        _draw_storage(fig.add_subplot(gs[1]), plan, rows)
        _draw_dag(fig.add_subplot(gs[2]), graph, g, ids, layers, rows)
        fig.savefig(path, format=fmt, bbox_inches="tight", dpi=110, metadata={"Date": None} if fmt == "svg" else None)
    return path


def _draw_block(ax, plan: Plan) -> None:
    """Panel 1: the block's shared memory (epilogue, mainloop stages, unused)."""
    cap = plan.smem_capacity
    epi = plan.epilogue_smem_bytes
    stage = plan.mainloop_stage_bytes
    # 1. the block's shared memory
    used = epi + plan.mainloop_stages * stage
    ax.set_title(f"shared memory of one block: {cap} B = epilogue {epi} B + {plan.mainloop_stages} mainloop "
                 f"stages x {stage} B + {cap - used} B unused", fontsize=10, loc="left")
    _bar(ax, 0, epi, 0, 1, "#6baed6", f"epilogue\n{epi} B", span=cap)
    x = epi
    for k in range(plan.mainloop_stages):
        _bar(ax, x, stage, 0, 1, "#e5e5e5", f"mainloop stage {k + 1}\n{stage} B", span=cap)
        x += stage
    if cap > x:
        _bar(ax, x, cap - x, 0, 1, "#ffffff", f"unused {cap - x} B", hatch="//", span=cap)
    ax.set_xlim(0, cap)
    ax.set_ylim(0, 1.6)
    ax.set_yticks([])
    ax.set_xlabel("bytes", fontsize=8)
    ax.tick_params(labelsize=7)


def _draw_storage(ax, plan: Plan, rows) -> None:
    """Panel 2: the epilogue's storage, byte for byte (tensors inside another buffer below)."""
    epi = plan.epilogue_smem_bytes
    # 2. the epilogue's storage, byte for byte
    cfg = plan.config
    ax.set_title(f"epilogue storage ({plan.arch}, {plan.policy} plan, tile {'x'.join(map(str, cfg.tile))}, "
                 f"epilogue tile {plan.epilogue_tile[0]}x{plan.epilogue_tile[1]}): "
                 f"{epi} B; below: tensors inside another buffer", fontsize=10, loc="left")
    span = max(epi, 1)
    owners = sorted((r for r in rows if r.bytes > 0 and r.offset >= 0), key=lambda r: r.offset)
    x = 0
    for r in owners:
        if r.offset > x:
            _bar(ax, x, r.offset - x, 1, 1, "#f0f0f0", f"padding {r.offset - x} B", span=span)
        _bar(ax, r.offset, r.bytes, 1, 1, COLORS.get(r.mode, "#ffffff"),
             f"{r.name}: {r.where}\n{r.bytes} B @ {r.offset}" + (f", {r.stages} st" if r.stages else ""), span=span)
        x = max(x, r.offset + r.bytes)
    if epi > x:
        _bar(ax, x, epi - x, 1, 1, "#f0f0f0", f"barriers, alignment: {epi - x} B", span=span)
    host_rows = {r.name: r for r in owners}
    for r in rows:
        if r.mode == "shared" and r.host in host_rows:
            h = host_rows[r.host]
            _bar(ax, h.offset, h.bytes, 0, 0.8, COLORS["shared"], f"{r.name} in {r.host}'s buffer", hatch="..",
                 span=span)
    if not owners:
        ax.text(span / 2, 1.5, "no epilogue buffers in shared memory", ha="center", va="center", fontsize=9)
    ax.set_xlim(0, span)
    ax.set_ylim(0, 2.6)
    ax.set_yticks([])
    ax.tick_params(labelsize=7)


def _draw_dag(ax, graph: Graph, g, ids: dict, layers: list, rows) -> None:
    """Panel 3: the DAG, each tensor coloured by where it lives (``g``: its networkx view,
    ``ids``: node id -> index, ``layers``: its topological generations)."""
    from matplotlib.patches import Patch

    mode_of = {r.name: r.mode for r in rows}
    # 3. the DAG coloured by buffer mode: layers are topological generations, each layer
    # ordered by the mean position of its inputs (fewer crossings)
    ax.set_title(f"{graph.name}: the epilogue DAG, each tensor coloured by where it lives", fontsize=10, loc="left")
    pos: dict[int, tuple[float, float]] = {}
    for depth, layer in enumerate(layers):
        def key(nid):
            xs = [pos[p][0] for p in g.predecessors(nid) if p in pos]
            return (sum(xs) / len(xs) if xs else 0.5, nid)

        for k, nid in enumerate(sorted(layer, key=key)):
            pos[nid] = ((k + 0.5) / len(layer), -depth)
    where_of = {r.name: r.where for r in rows}
    for n in graph.nodes:
        for i in n.inputs:
            ax.annotate("", xy=pos[ids[id(n)]], xytext=pos[ids[id(i)]],
                        arrowprops=dict(arrowstyle="-|>", color="#555555", lw=0.8, shrinkA=16, shrinkB=16))
    for n in graph.nodes:
        name = getattr(n, "name", "") if isinstance(n, (Leaf, Store, Reduction)) else ""
        mode = mode_of.get(name, "none") if name else "none"
        label = _node_label(n) + (f"\n{where_of[name]}" if mode != "none" else "")
        ax.text(*pos[ids[id(n)]], label, ha="center", va="center", fontsize=7, zorder=3,
                bbox=dict(boxstyle="round,pad=0.4", facecolor=COLORS.get(mode, "#ffffff"), edgecolor="#333333",
                          linewidth=0.6))
    ax.set_xlim(-0.02, 1.02)
    ax.set_ylim(-len(layers) + 0.5, 0.5)
    ax.axis("off")
    shown = [m for m in MODE_LABELS if m in set(mode_of.values()) | {"tma", "direct", "shared"}]
    ax.legend(handles=[Patch(facecolor=COLORS[m], edgecolor="#333333", label=MODE_LABELS[m]) for m in shown],
              loc="upper left", bbox_to_anchor=(1.0, 1.0), fontsize=8, frameon=False)
