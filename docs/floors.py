"""docs/img/floors.svg: evtc's folders as the floors of its two paths, with the imports between them.

Input: the evtc package's sources (read with ``ast``, nothing imported). Output: an SVG (matplotlib,
deterministic: fixed hash salt, no date) that docs/OVERVIEW.md shows, and the import edges between
floors as data (:func:`floor_edges`), which tests/null/test_layers.py holds to the floors' order.

The build path's floors run left to right (frontend -> ir -> passes -> lower -> plan -> emit ->
compiler, driven by pipeline/), the call path's under them (dispatch -> runtime), and the ways in
(the facades, torch/, cli/, plugin/, testing/) above both. An arrow is "imports": it should point
down or along its path, never up.
"""

from __future__ import annotations

import ast
from pathlib import Path

PKG = Path(__file__).resolve().parent.parent / "evtc"

#: floor -> (column, row) in the picture; row 0 the ways in, 1 the build path, 2 the call path,
#: 3 what every floor may use
FLOORS = {
    "facades": (3.0, 0), "torch": (5.0, 0), "cli": (6.5, 0), "plugin": (1.5, 0), "testing": (8.0, 0),
    "frontend": (0, 1), "ir": (1.3, 1), "passes": (2.6, 1), "lower": (3.9, 1), "plan": (5.2, 1), "emit": (6.5, 1),
    "compiler": (7.8, 1), "pipeline": (3.9, 1.6),
    "dispatch": (3.0, 2.4), "family": (1.5, 2.4), "runtime": (5.2, 2.4),
    "common": (4.0, 3.2),
}
#: top-level modules and the floor they belong to (the rest of evtc/*.py is "common")
TOP = {"gemm": "facades", "conv": "facades", "__main__": "cli"}


def floor_of(module: str) -> str:
    """The floor of a dotted module name inside evtc (``evtc.plan.sm90`` -> ``plan``)."""
    parts = module.split(".")
    if len(parts) < 2:
        return "facades"  # evtc/__init__.py: the public namespace
    head = parts[1]
    if (PKG / head).is_dir():
        return head if head in FLOORS else "common"
    return TOP.get(head, "common")


def _imports(path: Path, module: str) -> set[str]:
    tree = ast.parse(path.read_text())
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("evtc")}
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")[: -node.level if path.name != "__init__.py" else len(module.split(".")) - node.level + 1]
                name = ".".join(base + ([node.module] if node.module else []))
            else:
                name = node.module or ""
            if name.startswith("evtc"):
                subs = {f"{name}.{a.name}" for a in node.names if _is_module(f"{name}.{a.name}")}
                out |= subs
                if len(subs) < len(node.names):  # names defined in the module itself
                    out.add(name)
    return out


def _is_module(name: str) -> bool:
    path = PKG.parent / name.replace(".", "/")
    return path.with_suffix(".py").exists() or (path / "__init__.py").exists()


def module_imports() -> dict[str, set[str]]:
    """evtc module -> the evtc modules it imports (function-level imports included)."""
    out = {}
    for f in sorted(PKG.rglob("*.py")):
        rel = f.relative_to(PKG.parent).with_suffix("")
        mod = ".".join(rel.parts[:-1] if f.name == "__init__.py" else rel.parts)
        out[mod] = _imports(f, mod)
    return out


def floor_edges() -> dict[tuple[str, str], int]:
    """(importing floor, imported floor) -> how many module imports make that edge."""
    edges: dict[tuple[str, str], int] = {}
    for mod, deps in module_imports().items():
        a = floor_of(mod)
        for d in deps:
            b = floor_of(d)
            if a != b and b != "common":
                edges[(a, b)] = edges.get((a, b), 0) + 1
    return edges


def draw(path: Path) -> Path:
    """Write the picture to ``path`` (SVG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    edges = floor_edges()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": "evtc", "font.family": "DejaVu Sans"}):
        fig, ax = plt.subplots(figsize=(11, 4.6))
        ax.set_xlim(-1.6, 8.8)
        ax.set_ylim(3.6, -0.5)
        ax.axis("off")
        for y, label in ((0, "ways in"), (1, "build path"), (2.4, "call path"), (3.2, "shared")):
            ax.text(-1.55, y, label, fontsize=8, color="gray", va="center")
        for (a, b), n in sorted(edges.items()):
            (x0, y0), (x1, y1) = FLOORS[a], FLOORS[b]
            ax.annotate("", xy=(x1, y1), xytext=(x0, y0),
                        arrowprops=dict(arrowstyle="-|>", lw=0.4 + 0.15 * min(n, 10), color="#7a8a9a",
                                        shrinkA=14, shrinkB=14, connectionstyle="arc3,rad=0.08"))
        for name, (x, y) in FLOORS.items():
            ax.text(x, y, name if name != "facades" else "Gemm, Conv", ha="center", va="center", fontsize=9,
                    bbox=dict(boxstyle="round,pad=0.35", fc="#eef3f8" if y in (1, 1.6) else "#f4f1ea", ec="#556"))
        fig.savefig(path, format="svg", bbox_inches="tight", metadata={"Date": None})
        plt.close(fig)
    return path
