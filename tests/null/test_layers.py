"""The floors of evtc: which folder may import which, read from the source (ast), without
importing anything.

Input: every module under ``evtc/`` and its ``import`` statements, module-level and inside
functions alike (a lazy import is still a dependency; ``if TYPE_CHECKING:`` ones count too: a
lower floor that names a higher floor's types depends on it). Output: assertions.

A module's *folder* is its first level under ``evtc``: ``evtc.compiler.store`` is in
``evtc.compiler``, a top-level module such as ``evtc.gemm`` is its own. The build path is
frontend -> ir -> passes -> lower -> plan -> emit -> compiler, driven by pipeline/; the call path
is dispatch -> runtime; gemm, conv, torch/, cli/, testing/ and plugin/ sit on top. Each rule below
forbids a folder the folders above it; :data:`ALLOWED` lists the imports that break a rule
today, each with its reason, so the test fails on any new one.
"""

import ast
import tomllib
from pathlib import Path

import networkx as nx

import evtc
from evtc import _version

ROOT = Path(__file__).resolve().parents[2]
PKG = ROOT / "evtc"

#: the folders above the build path's stages and the call path (nothing below imports them)
_TOP = {"evtc.gemm", "evtc.conv", "evtc.torch", "evtc.cli", "evtc.testing", "evtc.plugin"}

#: folder -> the folders it must not import
RULES: dict[str, set[str]] = {
    # the compiler stays a compiler: sources and flags in, verified libraries out
    "evtc.compiler": {"evtc.ir", "evtc.plan", "evtc.lower", "evtc.frontend", "evtc.passes", "evtc.emit",
                      "evtc.dispatch", "evtc.pipeline", "evtc.runtime", "evtc.family"} | _TOP,
    # emission reads the tree and the plan; it knows nothing of calls or of the kernel family
    "evtc.emit": {"evtc.runtime", "evtc.dispatch", "evtc.family", "evtc.pipeline"} | _TOP,
    # the runtime is mechanism: views, binding, launch
    "evtc.runtime": {"evtc.dispatch", "evtc.pipeline", "evtc.gemm", "evtc.conv", "evtc.torch", "evtc.cli",
                     "evtc.testing", "evtc.plugin"},
    # the IR and the stages on it import none of the stages above them
    "evtc.ir": {"evtc.frontend", "evtc.passes", "evtc.lower", "evtc.plan", "evtc.emit", "evtc.compiler",
                "evtc.pipeline", "evtc.dispatch", "evtc.runtime", "evtc.family"} | _TOP,
    "evtc.passes": {"evtc.frontend", "evtc.lower", "evtc.plan", "evtc.emit", "evtc.compiler", "evtc.pipeline",
                    "evtc.dispatch", "evtc.runtime", "evtc.family"} | _TOP,
    "evtc.lower": {"evtc.frontend", "evtc.plan", "evtc.emit", "evtc.compiler", "evtc.pipeline", "evtc.dispatch",
                   "evtc.runtime", "evtc.family"} | _TOP,
    "evtc.plan": {"evtc.frontend", "evtc.emit", "evtc.compiler", "evtc.pipeline", "evtc.dispatch", "evtc.runtime",
                  "evtc.family"} | _TOP,
    # dispatch drives the family and the runtime; it never calls back into a facade or the floors
    # on top (the tuner times with evtc.runtime.timing, not evtc.testing)
    "evtc.dispatch": _TOP,
    "evtc.family": {"evtc.dispatch", "evtc.pipeline", "evtc.runtime", "evtc.emit", "evtc.compiler"} | _TOP,
    "evtc.pipeline": {"evtc.dispatch"} | _TOP,
}

#: (importing module, imported module) pairs that break a rule today. Each is to be removed,
#: not added to: empty this list as the imports go (an entry that no longer matches is harmless).
ALLOWED: set[tuple[str, str]] = set()  # (the conv emitters' and the 1x1 route's went on 2026-11-28)


def _name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_name(p): p for p in sorted(PKG.rglob("*.py"))}


def folder(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _resolve(name: str) -> str:
    """The evtc module an import names (``evtc.x.y`` for ``from evtc.x import y`` when y is a
    module, else ``evtc.x``)."""
    while name not in MODULES:
        name = name.rsplit(".", 1)[0]
    return name


def imports(module: str) -> list[tuple[int, str, ast.stmt]]:
    """(line, imported evtc module, statement) of every import in ``module``."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join(up + ([node.module] if node.module else []))
            names = [f"{base}.{a.name}" if f"{base}.{a.name}" in MODULES else base for a in node.names]
        else:
            continue
        out += [(node.lineno, _resolve(n), node) for n in names if n == "evtc" or n.startswith("evtc.")]
    return out


def _edges() -> list[tuple[str, str, int]]:
    """(importer, imported, line) of every import between evtc modules of different folders."""
    return [(m, t, line) for m in MODULES for line, t, _ in imports(m) if folder(t) != folder(m)]


def test_the_module_map_is_whole():
    assert {"evtc", "evtc.compiler.cache", "evtc.pipeline.memo", "evtc.torch.fast", "evtc.cli.commands",
            "evtc.testing.oracle"} <= set(MODULES)
    assert _resolve("evtc.compiler.cache.build") == "evtc.compiler.cache"


def test_no_folder_imports_a_floor_above_it():
    new = [f"{MODULES[m].relative_to(ROOT)}:{line}: {m} imports {t} ({folder(m)} must not import {folder(t)})"
           for m, t, line in _edges()
           if folder(t) in RULES.get(folder(m), ()) and (m, t) not in ALLOWED]
    assert not new, "layering rules broken (tests/null/test_layers.py):\n" + "\n".join(new)


def test_the_compiler_reads_no_public_names_of_evtc():
    """``from evtc import __version__`` would run and pin ``evtc/__init__.py`` (the tracer, the
    IR) under the compiler: it reads the version from ``evtc._version``."""
    bad = []
    for m in MODULES:
        if folder(m) != "evtc.compiler":
            continue
        for line, t, stmt in imports(m):
            if t == "evtc":
                bad.append(f"{MODULES[m].relative_to(ROOT)}:{line}: {ast.unparse(stmt)}")
    assert not bad, "\n".join(bad)


def test_no_circles_across_folders():
    """The folders' import graph has no cycle (the allowed imports aside). The package root is
    left out: it is the public namespace, which re-exports the stages and which the floors on
    top (torch/, cli/) and the frontend's error messages read by name."""
    g = nx.DiGraph()
    why: dict[tuple[str, str], list[str]] = {}
    for m, t, _ in _edges():
        if (m, t) in ALLOWED or "evtc" in (m, t):
            continue
        g.add_edge(folder(m), folder(t))
        why.setdefault((folder(m), folder(t)), []).append(f"{m} -> {t}")
    cycles = list(nx.simple_cycles(g))
    shown = [" -> ".join(c + c[:1]) + "\n    " + "\n    ".join(
        w for i, a in enumerate(c) for w in why[(a, c[(i + 1) % len(c)])][:2]) for c in cycles[:5]]
    assert not cycles, f"{len(cycles)} import cycles across folders, e.g.:\n" + "\n".join(shown)


def test_the_packages_import_absolutely():
    """No relative imports: inside ``evtc/torch/``, ``import torch`` is PyTorch, never the
    package itself."""
    rel = [f"{MODULES[m].relative_to(ROOT)}:{n.lineno}" for m in MODULES
           for n in ast.walk(ast.parse(MODULES[m].read_text())) if isinstance(n, ast.ImportFrom) and n.level]
    assert not rel, rel


def test_one_version():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert evtc.__version__ == _version.__version__ == project["version"]
