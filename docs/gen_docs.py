"""Generate the parts of the documentation that evtc itself can print, so they cannot drift.

Input: the evtc package of this checkout (or the installed one) and the ``docs/*.md`` pages.
Output: ``docs/language.md`` (the language reference, from the op table), ``docs/img/*.svg``
(the planner's pictures, from :func:`evtc.plan.draw.draw_plan`) and every *gen block* of the
pages rewritten with what its expression prints now.

A gen block is an HTML comment naming a Python expression, then its output, then a closing
comment; the expression is evaluated in :data:`NAMESPACE` (evtc, the reference epilogues as
``E``, and the helpers below)::

    <!-- gen: plan("gelu_aux") -->
    ```
    ...what print(gemm.plan) prints...
    ```
    <!-- /gen -->

    the source is <!-- gen: len(gemm("bias_relu").source.splitlines()) -->620<!-- /gen --> lines

Usage::

    python docs/gen_docs.py            # rewrite what is out of date
    python docs/gen_docs.py --check    # exit 1 and list what is out of date (CI, tests)

``tests/null/test_docs.py`` runs the check; ``mkdocs build`` runs it too (``docs/hooks.py``), so
a site is never built from stale figures.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import importlib.util
import os
import re
import sys
from pathlib import Path

DOCS = Path(__file__).resolve().parent
ROOT = DOCS.parent
PAGES = ("OVERVIEW.md", "ir.md", "planner.md", "sm80.md", "performance.md", "errors.md", "index.md", "cli.md")
if __name__ == "__main__":  # a developer's run documents the checkout's evtc
    sys.path.insert(0, str(ROOT))
GEN = re.compile(r"<!-- gen: (?P<expr>.*?) -->(?P<body>.*?)<!-- /gen -->", re.S)

#: The planner page's pictures: file name -> (epilogue, Gemm keyword arguments).
FIGURES = {
    "many_aux_evtc.svg": ("many_aux", {}),
    "many_aux_cutlass_128x128.svg": ("many_aux", {"policy": "cutlass", "tile": (128, 128, 64)}),
    "row_stats_evtc.svg": ("row_stats", {}),
}


def _examples():
    path = ROOT / "examples" / "epilogues.py"
    if not path.exists():  # an installed evtc without the checkout's examples
        from evtc.resources import data_path

        path = data_path("examples", "epilogues.py")
    spec = importlib.util.spec_from_file_location("evtc_doc_examples", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


E = _examples()


def gemm(name: str, *, arch: str = "sm90", policy: str = "evtc", tile: tuple | None = None, **fixed):
    """``evtc.Gemm`` of the reference epilogue ``name`` (fp8 operands for ``fp8_out``); keyword
    arguments other than ``arch``, ``policy`` and ``tile`` are fixed planner decisions."""
    return _gemm(name, arch, policy, tile, tuple(sorted((k, tuple(v) if isinstance(v, list) else v)
                                                        for k, v in fixed.items())))


@functools.lru_cache(maxsize=None)
def _gemm(name, arch, policy, tile, fixed):
    import evtc

    a = evtc.e4m3 if name.startswith("fp8") else evtc.bf16
    config = evtc.GemmConfig(tile=tile) if tile else None
    plan = {"policy": policy, **dict(fixed)} if fixed else policy
    return evtc.Gemm(E.REFERENCE[name], a=a, arch=arch, plan=plan, config=config)


def plan(name: str, **kw) -> str:
    """What ``print(gemm.plan)`` prints."""
    return str(gemm(name, **kw).plan)


def est(name: str, **kw) -> str:
    """The cost model's estimate of the plan, in microseconds, two decimals."""
    return f"{gemm(name, **kw).plan.cost['total_us']:.2f}"


def error(thunk) -> str:
    """``TypeName: message`` of the EvtcError ``thunk()`` raises."""
    import evtc

    try:
        thunk()
    except evtc.EvtcError as e:
        return f"{type(e).__name__}: {e}"
    raise AssertionError("expected an EvtcError")


def usings(source: str) -> str:
    """The visitor tree of an emitted sm90 source: its ``using N...``/``EVT...`` lines."""
    return "\n".join(line for line in source.splitlines()
                     if re.match(r"using (N\d+_\w+|EVT\d+|FusionCallbacks) =", line))


def fusion_callbacks(source: str) -> str:
    """The ``using FusionCallbacks = ...;`` line of an emitted sm90 source, one alias pair a line."""
    line = next(x for x in source.splitlines() if x.startswith("using FusionCallbacks ="))
    return line.replace(", evtc::AliasPair", ",\n    evtc::AliasPair")


def repl(*exprs: str) -> str:
    """An interactive session: ``>>> print(EXPR)`` and what it prints, for each expression."""
    ns = {"evtc": __import__("evtc")}
    return "\n\n".join(f">>> print({e})\n{str(eval(e, ns)).rstrip()}" for e in exprs)  # noqa: S307


def softplus_graph():
    """A hand-built graph with an op evtc doesn't have (errors.md#unsupported-op)."""
    from evtc import bf16, f32
    from evtc.ir.graph import Graph, GraphBuilder
    from evtc.ir.nodes import Accumulator, Compute, Store

    b = GraphBuilder()
    acc = b.add(Accumulator(f32, name="acc"))
    x = b.add(Compute(f32, op="softplus", args=(acc,)))
    return Graph("hand", (acc,), (b.add(Store(bf16, name="D", value=x)),))


def _namespace() -> dict:
    import evtc

    return {"evtc": evtc, "E": E, "re": re, "gemm": gemm, "plan": plan, "est": est, "error": error, "usings": usings, "fusion_callbacks": fusion_callbacks,
            "softplus_graph": softplus_graph, "repl": repl,
            "bf16": evtc.bf16, "f32": evtc.f32, "e4m3": evtc.e4m3}


def render_block(expr: str, body: str, ns: dict) -> str:
    value = eval(expr, ns)  # noqa: S307 - the expressions are ours, in our docs
    text = str(value).rstrip("\n")
    m = re.match(r"\s*```(\w*)\n", body)
    if m:
        return f"\n```{m.group(1)}\n{text}\n```\n"
    return text


def render_page(text: str) -> str:
    ns = _namespace()
    return GEN.sub(lambda m: f"<!-- gen: {m['expr']} -->{render_block(m['expr'], m['body'], ns)}<!-- /gen -->", text)


# ---- the language reference ---------------------------------------------------------------------


def _cell(s: str) -> str:
    return s.replace("|", "\\|")


def language_page() -> str:
    """``docs/language.md``: operators, functions, reductions, node kinds and dtypes, from the
    tables evtc itself uses."""
    from evtc import dtypes
    from evtc.ir import nodes
    from evtc.language import INTERNAL_OPS, entries, plain

    out = [
        "# The epilogue language",
        "",
        "<!-- generated by docs/gen_docs.py from evtc/ops.py, evtc/frontend/functions.py, evtc/ir/nodes.py and "
        "evtc/dtypes.py: edit those, then run python docs/gen_docs.py -->",
        "",
        "What an epilogue can use, generated from the op table (`evtc/ops.py`) and the `evtc.*` functions, the",
        "same table `evtc ops` prints. In a Python epilogue the functions are `evtc.NAME(...)`; in the expression",
        "form (`evtc emit --expr`, `evtc.from_expr`, [ir.md](ir.md#text-forms)) they are `NAME(...)`. Every",
        "elementwise op computes in f32 (the compute type); inputs are converted to f32 when read and outputs",
        "rounded to their dtype when written.",
        "",
    ]
    heads = {"operator": "Operators", "function": "Functions", "reduction": "Reductions", "quantization": "Quantization",
             "conversion": "Conversion"}
    notes = {
        "operator": "Comparisons give 1.0 or 0.0 (a mask in the compute type); `evtc.where` selects where its "
                    "condition is non-zero, so masks compose with arithmetic. `a ** e` needs a constant `e`.",
        "reduction": "A reduction is only complete after every tile is done, so it can only be returned as an output "
                     "(in the expression form: the whole right-hand side of an output). `dim=1` (or -1) reduces over "
                     "N, one value per row (a *row reduction*, length M); `dim=0` (or -2) over M (a *column "
                     "reduction*, length N); no `dim`: over both (a *scalar reduction*, one value per batch). "
                     "They accumulate in f32; the output is f32 unless converted with `.to(dtype)`.",
        "quantization": "`q, s = evtc.quantize(y, evtc.e4m3, group=128)` quantizes y per 1 x group of a row "
                        "inside the epilogue; q and its f32 scales s (M x ceil(N / group), laid out as `scale_layout` says: "
                        "`\"row_major\"`, or DeepGEMM's column-major `\"col_major_tma\"`) can only be "
                        "returned as outputs, together. sm90 only; Python epilogues only. See "
                        "[numerics.md](numerics.md#in-the-epilogue).",
        "conversion": "`x.to(dtype)` rounds to nearest even; fp8 saturates to its finite range.",
    }
    es = entries()
    for kind, head in heads.items():
        rows = [e for e in es if e.kind == kind]
        out += [f"## {head}", ""]
        if kind in notes:
            out += [notes[kind], ""]
        out += ["| Python | expression form | meaning | op | C++ functor |", "| --- | --- | --- | --- | --- |"]
        for e in rows:
            out.append(f"| `{_cell(e.python)}` | `{_cell(e.text)}` | {_cell(e.doc)} | {_cell(e.op)} | "
                       f"{'`' + e.functor + '`' if e.functor else ''} |")
        out.append("")
    out += [f"Internal ops, never written by users: {', '.join(f'`{n}`' for n in INTERNAL_OPS)}.", ""]

    out += ["## Node kinds", "",
            "The IR's closed vocabulary (`evtc/ir/nodes.py`); the kind is the word the canonical text form uses.",
            "", "| kind | class | what it is |", "| --- | --- | --- |"]
    for cls in (nodes.Accumulator, nodes.Source, nodes.ScalarBroadcast, nodes.RowBroadcast, nodes.ColBroadcast,
                nodes.AuxLoad, nodes.Immediate, nodes.Compute, nodes.Store, nodes.Reduction, nodes.GroupScale):
        out.append(f"| `{cls.kind}` | `{cls.__name__}` | {_cell(plain(cls.__doc__ or ''))} |")
    out.append("")

    out += ["## Dtypes", "",
            "`evtc/dtypes.py`. A and B take the mainloop dtypes of the arch (both of one width); C, D, aux loads "
            "and stores, broadcasts and reductions any tensor dtype.", "",
            "| dtype | bits | mainloop on | tensor dtype | also accepted as |", "| --- | --- | --- | --- | --- |"]
    aliases: dict[str, list[str]] = {}
    for alias, dt in dtypes._ALIASES.items():
        aliases.setdefault(dt.name, []).append(alias)
    for dt in dtypes.ALL:
        archs = ", ".join(a for a, ds in dtypes.MAINLOOP_DTYPES.items() if dt in ds) or "-"
        tensor = "yes" if dt in dtypes.TENSOR_DTYPES else "no"
        names = ", ".join(f"`{x}`" for x in aliases.get(dt.name, []) if x != dt.name) or "-"
        out.append(f"| `{dt.name}` | {dt.bits} | {archs} | {tensor} | {names} |")
    out.append("")
    return "\n".join(out)


# ---- driver -------------------------------------------------------------------------------------


def knobs_page() -> str:
    """docs/knobs.md: every environment variable, from evtc/knobs.py."""
    from evtc import knobs

    out = ["<!-- generated by docs/gen_docs.py from evtc/knobs.py: edit that, then run it -->", "",
           "# Environment variables", "",
           "Every variable evtc reads is declared once, in `evtc/knobs.py`, with its type, default and parser;",
           "`evtc knobs` prints this table with the current values. On/off variables follow one rule: `1`, `true`,",
           "`yes`, `on` are on; `0`, `false`, `no`, `off` and the empty string are off; anything else is an error",
           "naming the variable. An unset variable takes its default.", "",
           "| variable | type | default | what it does |", "| --- | --- | --- | --- |"]
    for k in knobs.KNOBS:
        kind = k.kind + (f" ({', '.join(k.choices)})" if k.choices else "")
        default = "" if k.default is None else f"`{k.default}`"
        out.append(f"| `{k.name}` | {kind} | {default} | {_cell(k.doc)} |")
    return "\n".join(out) + "\n"


@contextlib.contextmanager
def _as_users_see_it():
    """Render as a user's default run would: without the IR verifier after every pass (tests
    switch it on, and an error then surfaces from the verifier instead of the pass that users
    meet)."""
    import evtc.passes as passes

    old_env = os.environ.get("EVTC_VERIFY")
    old_fn = getattr(passes, "_verify_default", None)
    os.environ["EVTC_VERIFY"] = "0"
    if old_fn is not None:  # today's default also switches on under pytest
        passes._verify_default = lambda: False
    try:
        yield
    finally:
        if old_env is None:
            os.environ.pop("EVTC_VERIFY", None)
        else:
            os.environ["EVTC_VERIFY"] = old_env
        if old_fn is not None:
            passes._verify_default = old_fn


def outputs() -> dict[Path, str | bytes]:
    """Every generated file with its current content."""
    _gemm.cache_clear()
    with _as_users_see_it():
        return _outputs()


def _outputs() -> dict[Path, str | bytes]:
    files: dict[Path, str | bytes] = {DOCS / "language.md": language_page(), DOCS / "knobs.md": knobs_page()}
    for page in PAGES:
        path = DOCS / page
        if path.exists():
            files[path] = render_page(path.read_text())
    import tempfile

    from evtc.plan.draw import draw_plan

    spec = importlib.util.spec_from_file_location("evtc_docs_floors", DOCS / "floors.py")
    floors = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(floors)

    with tempfile.TemporaryDirectory() as tmp:
        files[DOCS / "img" / "floors.svg"] = floors.draw(Path(tmp) / "floors.svg").read_text()
        for fname, (name, kw) in FIGURES.items():
            g = gemm(name, **kw)
            files[DOCS / "img" / fname] = draw_plan(g.graph, g.plan, Path(tmp) / fname).read_text()
    return files


def stale() -> list[Path]:
    """The generated files whose content differs from what evtc generates now."""
    out = []
    for path, content in outputs().items():
        if not path.exists() or path.read_text() != content:
            out.append(path)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--check", action="store_true", help="only report stale files (exit 1 if any)")
    args = ap.parse_args(argv)
    if args.check:
        bad = stale()
        for p in bad:
            print(f"out of date: {p.relative_to(ROOT)}")
        if bad:
            print("run: python docs/gen_docs.py")
        return 1 if bad else 0
    for path, content in outputs().items():
        if not path.exists() or path.read_text() != content:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(content)
            print(f"wrote {path.relative_to(ROOT)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
