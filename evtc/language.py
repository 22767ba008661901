"""The epilogue language as users write it: operators, ``evtc.*`` functions and reductions.

Input: the op table (:data:`evtc.ops.OPS`) and the ``evtc.*`` functions
(:mod:`evtc.frontend.functions`). Output: :func:`entries`, one :class:`Entry` per thing a user
can write, which ``evtc ops`` prints and ``docs/language.md`` is generated from
(``docs/gen_language.py``), so the two cannot disagree with the op table.

Every op of the table appears (except the internal ``first`` and ``convert``, which users write
as ``x.to(dtype)``), under the spelling users write: ``a + b`` rather than ``add``. The
functions that are no op of their own (``clamp``, ``amax``, the reductions, ``to``) appear with
what they lower to.
"""

from __future__ import annotations

import dataclasses
import inspect

__all__ = ["Entry", "OPERATORS", "INTERNAL_OPS", "entries", "plain"]

#: The Python (and ``--expr``) operator of each op that has one (``Value.__add__`` and friends in
#: ``evtc/frontend/trace.py``; tests/null/test_language.py traces each to check it).
OPERATORS = {
    "add": "a + b", "sub": "a - b", "mul": "a * b", "div": "a / b", "neg": "-a", "pow": "a ** e",
    "gt": "a > b", "ge": "a >= b", "lt": "a < b", "le": "a <= b", "eq": "a == b", "ne": "a != b",
    "abs": "abs(a)",
}

#: Ops of the table that users never name: ``convert`` is ``x.to(dtype)``; ``first`` keeps a
#: side-effect-only output inside the visitor tree (inserted by the DAG -> tree lowering);
#: ``group_quant`` is ``evtc.quantize``'s quantized value.
INTERNAL_OPS = ("first", "convert", "group_quant")

#: What the functions that are not ops of their own lower to.
_COMPOSITES = {
    "clamp": ("function", "maximum, then minimum", None),
    "amax": ("reduction", "max reduction of abs", "max(abs(x)) over dim: the amax of fp8 scaling recipes"),
    "sum": ("reduction", "sum reduction", "sum over dim, accumulated in f32"),
    "max": ("reduction", "max reduction", "maximum over dim (evtc.maximum is elementwise)"),
    "min": ("reduction", "min reduction", "minimum over dim (evtc.minimum is elementwise)"),
    "quantize": ("quantization", "group_quant and its scales (a GroupScale output)",
                 "per 1 x group of a row: (q, f32 scales) as vLLM, SGLang or DeepGEMM compute them"),
    "to": ("conversion", "convert (saturating for fp8)",
           "round to dtype (fp8 saturates to its finite range); also evtc.to(x, dtype)"),
}


@dataclasses.dataclass(frozen=True)
class Entry:
    """One thing a user can write in an epilogue.

    Attributes:
        kind: ``operator``, ``function``, ``reduction``, ``quantization`` or ``conversion``.
        python: how it is written in a Python epilogue, e.g. ``a + b``, ``evtc.relu(x)``.
        text: how it is written in the expression form (``evtc emit --expr``), e.g. ``relu(x)``.
        op: the op-table name it becomes (``add``), or what a composite lowers to.
        doc: one line.
        functor: the C++ functor of the op (empty for composites).
    """

    kind: str
    python: str
    text: str
    op: str
    doc: str
    functor: str = ""


def _signature(fn) -> str:
    params = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind is p.VAR_POSITIONAL:
            continue
        params.append(f"{p.name}={p.default}" if p.default is not p.empty else p.name)
    return ", ".join(params)


def plain(doc: str) -> str:
    """A docstring's first sentence without reST markup (for a terminal or a table cell)."""
    import re

    text = " ".join(doc.split("\n\n")[0].split())
    text = re.sub(r":\w+:`~?([^`]+)`", r"\1", text).replace("``", "")
    m = re.match(r"(.+?[.;])(\s|$)", text)
    return (m.group(1) if m else text).rstrip(".;")


def _first_line(fn) -> str:
    return plain(inspect.getdoc(fn) or "")


def entries() -> list[Entry]:
    """Everything a user can write, operators first, then functions, reductions, conversions.

    Raises:
        RuntimeError: an op of the table has neither an operator nor an ``evtc.*`` function (a
            new op was registered without a spelling; add one, or list it in ``INTERNAL_OPS``).
    """
    from evtc import ops
    from evtc.frontend import functions

    out: list[Entry] = []
    covered: set[str] = set()
    for name, spelled in OPERATORS.items():
        op = ops.OPS[name]
        fn_too = f"; also evtc.{name}(...)" if name in functions.__all__ else ""
        doc = name if op.doc == spelled else op.doc  # "a + b" says nothing more than its spelling
        out.append(Entry("operator", spelled, spelled, name, doc + fn_too, op.functor))
        covered.add(name)
    for name in functions.__all__:
        fn = getattr(functions, name)
        sig = _signature(fn)
        if name in _COMPOSITES:
            kind, lowers, doc = _COMPOSITES[name]
            python = "x.to(dtype)" if name == "to" else f"evtc.{name}({sig})"
            text = "(Python epilogues only)" if name == "quantize" else f"{name}({sig})"
            out.append(Entry(kind, python, text, lowers, doc or _first_line(fn)))
            continue
        if name in covered:
            continue
        op = ops.OPS.get(name)
        if op is None:
            raise RuntimeError(f"evtc.{name} is neither an op of evtc/ops.py nor a known composite")
        text = "glu(x) (act silu)" if name == "glu" else f"{name}({sig})"  # (no keywords in expressions)
        out.append(Entry("function", f"evtc.{name}({sig})", text, name, op.doc, op.functor))
        covered.add(name)
    missing = sorted(set(ops.OPS) - covered - set(INTERNAL_OPS))
    if missing:
        raise RuntimeError(f"ops without a spelling users can write: {missing} (evtc/language.py)")
    order = {"operator": 0, "function": 1, "reduction": 2, "quantization": 3, "conversion": 4}
    return sorted(out, key=lambda e: order[e.kind])
