"""One constant-folding rule for every fold (issue 37): finite constants that give inf or NaN are
a located ConstantFoldError, whether the fold pass, the expression form or an ``evtc.*``
function called on numbers folds them (NOTE [Constant folding refuses what f32 can't hold])."""

from __future__ import annotations

import math

import numpy as np
import pytest

import evtc
from evtc.errors import ConstantFoldError
from evtc.frontend.text import from_expr, parse_ir
from evtc.passes import fold

THIS = __file__

#: (call, what the message says): each gave inf or NaN silently in the expression form
NON_FINITE = [
    ("exp(1000)", "is infinite (inf)"),
    ("log(0)", "is infinite (-inf)"),
    ("sqrt(-1)", "is not a number"),
    ("rsqrt(0)", "is infinite (inf)"),
    ("log(-1.0)", "is not a number"),
]


@pytest.mark.parametrize("call,what", NON_FINITE)
def test_the_expression_form_refuses_a_non_finite_fold_at_the_call(call, what):
    text = f"D = acc * {call}"
    with pytest.raises(ConstantFoldError) as ei:
        from_expr(text)
    err = ei.value
    assert err.message == f"the constant expression {call} {what}"
    assert err.loc.file == "<expr>" and text[err.loc.col:err.loc.end_col] == call and err.epilogue == "expr"
    assert "#constant-fold" in str(err)


@pytest.mark.parametrize("call,what", NON_FINITE)
def test_the_fold_pass_says_the_same(call, what):
    name, arg = call[:-1].split("(")
    g = parse_ir(f"epilogue t(acc: f32 accumulator):\n  %0 = {name}({float(arg)!r}) : f32\n"
                 "  %1 = mul(acc, %0) : f32\n  D = store(%1) : bf16\n")
    with pytest.raises(ConstantFoldError) as ei:
        fold(g)
    assert ei.value.message.endswith(what) and ei.value.loc.line == 2


@pytest.mark.parametrize("call,what", NON_FINITE)
def test_an_evtc_function_on_numbers_in_a_python_epilogue(call, what):
    name, arg = call[:-1].split("(")
    fn = getattr(evtc, name)

    def folds(acc):
        return acc * fn(float(arg))  # the offending line

    with pytest.raises(ConstantFoldError) as ei:
        evtc.epilogue(folds).graph
    err = ei.value
    assert err.message.endswith(what) and f"evtc.{name}(" in err.message and err.epilogue == "folds"
    assert err.loc.file == THIS and "fn(float(arg))" in err.loc.text


def test_arithmetic_folds_follow_the_same_rule():
    for text in ("D = acc * (1e300 * 1e300)", "D = acc * (-1e300 * 1e300)", "D = acc * to(1e39, f32)",
                 "D = acc * 10.0 ** 400"):
        with pytest.raises(evtc.EvtcError) as ei:
            from_expr(text)
        assert ei.value.loc is not None and ei.value.loc.file == "<expr>", text
    with pytest.raises(ConstantFoldError, match=r"1e\+300 \* 1e\+300 is infinite"):
        from_expr("D = acc * (1e300 * 1e300)")


def test_what_the_user_wrote_as_inf_or_nan_still_folds():
    g = from_expr("D = acc * (inf * 0) + acc * (inf - 1) + acc * exp(inf) + acc * log(nan)")
    consts = [n.value for n in g.nodes if n.kind == "const"]
    assert any(math.isnan(v) for v in consts) and math.inf in consts


def test_finite_intermediates_follow_python():
    # float64 as Python computes: 1e60 is no f32, but only the final constant must be one
    g = from_expr("D = acc * (1e30 * 1e30 / 1e30)")
    assert [n.value for n in g.nodes if n.kind == "const"] == [1e30 * 1e30 / 1e30]
    with pytest.raises(evtc.EvtcError, match="not representable"):  # beyond f32, finite: at its use
        from_expr("D = acc * exp(100.0)")


def test_eager_calls_on_arrays_keep_numpy_semantics():
    with np.errstate(all="ignore"):
        assert np.isinf(evtc.exp(np.array([1000.0]))).all()  # an oracle computing on data
    with pytest.raises(ConstantFoldError):
        evtc.exp(1000.0)  # a number: as math.exp(1000) raises
