"""The user-facing language table (evtc/language.py): generated from the op table, each spelling
true to what the tracer and the text frontend build."""

import re

import pytest

import evtc
from evtc import ops
from evtc.language import INTERNAL_OPS, OPERATORS, entries


def test_every_op_has_a_spelling():
    es = entries()
    named = {e.op for e in es}
    assert set(ops.OPS) - set(INTERNAL_OPS) <= named
    assert {"clamp(x, lo, hi)", "amax(x, dim=None)", "sum(x, dim=None)"} <= {e.text for e in es}


@pytest.mark.parametrize("op, spelled", sorted(OPERATORS.items()))
def test_operator_traces_to_its_op(op, spelled):
    def sub(b):
        return re.sub(r"\be\b", "2.0", re.sub(r"\bb\b", b, re.sub(r"\ba\b", "acc", spelled)))

    src = sub("X")

    def fn(acc, X: evtc.Matrix):
        return eval(src, {}, {"acc": acc, "X": X})

    text = str(evtc.epilogue(fn, name="probe").graph)
    assert f"= {op}(" in text, (spelled, text)
    # the expression form spells it the same way
    expr = sub("X[m, n]")
    assert f"= {op}(" in str(evtc.from_expr(f"D = {expr}")), expr


@pytest.mark.parametrize("entry", [e for e in entries() if e.kind == "function" and e.functor], ids=lambda e: e.op)
def test_function_spelling_builds_its_op(entry):
    arity = ops.OPS[entry.op].arity
    args = ", ".join(["acc"] + ["X[m, n]"] * (arity - 1))
    if entry.op == "leaky_relu":
        args = "acc, s"
    g = evtc.from_expr(f"D = {entry.op}({args})")
    assert f"= {entry.op}(" in str(g)
    assert entry.python.startswith(f"evtc.{entry.op}(") and callable(getattr(evtc, entry.op))
