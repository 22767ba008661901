"""Each pass's before/after in the IR text form (plus keep_* negatives), the pass manager, and
(hypothesis) that the whole pipeline preserves values.

Before/after graphs are written as IR text (``evtc.parse_ir``) rather than traced, so that a
test of a pass sees exactly the input it names: the tracer already folds Python constants
(``2.0 * 3.0``), which once made a folding test pass without the fold pass.
"""

import textwrap

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import evtc
from evtc import f32
from evtc.ir import Compute, interpret, verify
from evtc.passes import (PIPELINE, Pass, PassManager, PassResult, canonicalize, cse, dce, fold, fuse, lower, pipeline,
                         propagate, run, simplify)


def ir(body: str, params: str = "acc: f32 accumulator") -> evtc.Graph:
    """A graph from IR text: ``params`` and the body's node lines."""
    lines = textwrap.dedent(body).strip().splitlines()
    return evtc.parse_ir(f"epilogue t({params}):\n" + "\n".join("  " + l.strip() for l in lines) + "\n")


def check(p, before: str, after: str, params: str = "acc: f32 accumulator") -> PassResult:
    """Run pass ``p`` on ``before``; the result must print as ``after`` (canonical text) and
    report ``changed`` exactly when the text differs."""
    g = ir(before, params)
    result = p(g)
    assert isinstance(result, PassResult)
    want = ir(after, params)
    assert str(result.graph) == str(want), f"\n--- got\n{result.graph}\n--- want\n{want}"
    assert result.changed == (str(g) != str(want))
    return result


def ops_of(g):
    return [n.op for n in g.nodes if isinstance(n, Compute)]


# ---- fold -------------------------------------------------------------------------------------

def test_fold_constants():
    check(fold, """
        %0 = mul(2.0, 3.0) : f32
        %1 = exp(0.0) : f32
        %2 = add(%0, %1) : f32
        %3 = mul(acc, %2) : f32
        %4 = sqrt(4.0) : f32
        %5 = add(%3, %4) : f32
        D = store(%5) : bf16
    """, """
        %0 = mul(acc, 7.0) : f32
        %1 = add(%0, 2.0) : f32
        D = store(%1) : bf16
    """)


def test_fold_convert_rounds_to_its_dtype_and_saturates():
    check(fold, """
        %0 = convert(0.1) : e4m3
        %1 = convert(1000.0) : e4m3
        %2 = mul(acc, %0) : f32
        %3 = add(%2, %1) : f32
        D = store(%3) : bf16
    """, """
        %0 = mul(acc, 0.1015625) : f32
        %1 = add(%0, 448.0) : f32
        D = store(%1) : bf16
    """)


def test_fold_keeps_first_and_nonconstant_computes():
    r = check(fold, """
        %0 = first(1.0, 2.0) : f32
        %1 = exp(acc) : f32
        %2 = add(%1, %0) : f32
        D = store(%2) : bf16
    """, """
        %0 = first(1.0, 2.0) : f32
        %1 = exp(acc) : f32
        %2 = add(%1, %0) : f32
        D = store(%2) : bf16
    """)
    assert not r.changed


def test_fold_underflow_folds_and_user_infinities_fold_silently():
    check(fold, """
        %0 = mul(1e-30, 1e-30) : f32
        %1 = add(inf, 1.0) : f32
        %2 = add(acc, %0) : f32
        %3 = maximum(%2, %1) : f32
        D = store(%3) : bf16
    """, """
        %0 = add(acc, 0.0) : f32
        %1 = maximum(%0, inf) : f32
        D = store(%1) : bf16
    """)


@pytest.mark.parametrize("expr,what", [
    ("exp(100.0)", "beyond f32's range"),
    ("mul(1e30, 1e30)", "beyond f32's range"),
    ("log(-1.0)", "not a number"),
    ("div(0.0, 0.0)", "not a number"),
    ("div(1.0, 0.0)", "infinite"),
])
def test_fold_refuses_what_f32_cannot_hold(expr, what):
    g = ir(f"""
        %0 = {expr} : f32
        %1 = mul(acc, %0) : f32
        D = store(%1) : bf16
    """)
    with pytest.raises(evtc.errors.ConstantFoldError) as ei:
        fold(g)
    err = ei.value
    assert what in err.message and err.loc is not None and err.loc.line == 2 and err.epilogue == "t"
    assert "#constant-fold" in str(err)


def test_a_constant_beyond_f32_is_refused_at_the_users_line():
    # the tracer evaluates evtc.exp(100.0) itself; the constant it leaves can't be emitted in f32
    # (it crashed the emitter with a raw OverflowError)
    @evtc.epilogue
    def overflow(acc):
        return acc * evtc.exp(100.0)

    with pytest.raises((evtc.EpilogueTypeError, evtc.TraceError), match="f32") as ei:
        evtc.Gemm(overflow)
    assert ei.value.loc is not None and "evtc.exp(100.0)" in ei.value.loc.text


def test_fold_convert_overflow_to_f16_is_refused():
    with pytest.raises(evtc.errors.ConstantFoldError, match=r"\(100000.0\).to\(f16\) is infinite"):
        fold(ir("""
            %0 = convert(100000.0) : f16
            %1 = mul(acc, %0) : f32
            D = store(%1) : bf16
        """))


# ---- simplify ---------------------------------------------------------------------------------

def test_simplify_identities():
    check(simplify, """
        %0 = mul(acc, 1.0) : f32
        %1 = add(%0, 0.0) : f32
        %2 = div(%1, 1.0) : f32
        %3 = sub(%2, 0.0) : f32
        %4 = neg(x) : f32
        %5 = neg(%4) : f32
        %6 = add(%3, %5) : f32
        %7 = mul(-1.0, %6) : f32
        %8 = sub(0.0, %7) : f32
        %9 = relu(%8) : f32
        %10 = relu(%9) : f32
        D = store(%10) : bf16
    """, """
        %0 = add(acc, x) : f32
        %1 = relu(%0) : f32
        D = store(%1) : bf16
    """, params="acc: f32 accumulator, x: bf16 aux")


def test_simplify_reaches_the_fixpoint_of_new_nodes():
    # 0 - (x * -1) builds neg(neg(x)) bottom-up; the --x rule must see it in the same sweep
    check(simplify, """
        %0 = mul(acc, -1.0) : f32
        %1 = neg(%0) : f32
        %2 = relu(%1) : f32
        D = store(%2) : bf16
    """, """
        %0 = relu(acc) : f32
        D = store(%0) : bf16
    """)


def test_keep_x_times_zero_and_x_minus_x():
    # inf * 0 and inf - inf are NaN: neither folds
    r = check(simplify, """
        %0 = mul(acc, 0.0) : f32
        %1 = sub(acc, acc) : f32
        %2 = add(%0, %1) : f32
        D = store(%2) : bf16
    """, """
        %0 = mul(acc, 0.0) : f32
        %1 = sub(acc, acc) : f32
        %2 = add(%0, %1) : f32
        D = store(%2) : bf16
    """)
    assert not r.changed


# ---- canonicalize (sympy) ---------------------------------------------------------------------

def test_canonicalize_collects_like_terms_with_sympy():
    # was `A and B or C` (passed on C alone): now the exact result
    check(canonicalize, """
        %0 = mul(3.0, acc) : f32
        %1 = mul(2.0, %0) : f32
        %2 = add(%1, acc) : f32
        D = store(%2) : bf16
    """, """
        %0 = mul(7.0, acc) : f32
        D = store(%0) : bf16
    """)


def test_canonicalize_keeps_cancellations():
    # x*0 -> 0, x - x -> 0 and x/x -> 1 would hide an inf or NaN
    for body in ("%0 = sub(acc, acc) : f32", "%0 = div(acc, acc) : f32",
                 "%0 = mul(acc, 0.0) : f32"):
        r = check(canonicalize, f"""
            {body}
            %1 = add(%0, C) : f32
            D = store(%1) : bf16
        """, f"""
            {body}
            %1 = add(%0, C) : f32
            D = store(%1) : bf16
        """, params="acc: f32 accumulator, C: bf16 source")
        assert not r.changed


def test_canonicalize_keeps_division_by_zero():
    # issue 9: (acc / 0.0) * 2.0 is zoo*acc in sympy; it escaped as NotImplementedError(ComplexInfinity)
    r = check(canonicalize, """
        %0 = div(acc, 0.0) : f32
        %1 = mul(%0, 2.0) : f32
        D = store(%1) : bf16
    """, """
        %0 = div(acc, 0.0) : f32
        %1 = mul(%0, 2.0) : f32
        D = store(%1) : bf16
    """)
    assert not r.changed


def test_canonicalize_only_touches_single_use_arithmetic_trees():
    # %0 has two uses: it stays a node of its own, so 2*(3*acc) can't merge through it
    check(canonicalize, """
        %0 = mul(3.0, acc) : f32
        %1 = mul(2.0, %0) : f32
        %2 = exp(%0) : f32
        %3 = add(%1, %2) : f32
        D = store(%3) : bf16
    """, """
        %0 = mul(3.0, acc) : f32
        %1 = mul(2.0, %0) : f32
        %2 = exp(%0) : f32
        %3 = add(%1, %2) : f32
        D = store(%3) : bf16
    """)


# ---- fuse -------------------------------------------------------------------------------------

def test_fma_fusion_and_store_convert():
    check(fuse, """
        %0 = mul(alpha, acc) : f32
        %1 = add(%0, C) : f32
        %2 = convert(%1) : e4m3
        D = store(%2) : e4m3
    """, """
        %0 = multiply_add(alpha, acc, C) : f32
        D = store(%0) : e4m3
    """, params="acc: f32 accumulator, C: bf16 source, alpha: f32 scalar")


def test_fma_with_the_product_second():
    check(fuse, """
        %0 = mul(alpha, acc) : f32
        %1 = add(C, %0) : f32
        D = store(%1) : bf16
    """, """
        %0 = multiply_add(alpha, acc, C) : f32
        D = store(%0) : bf16
    """, params="acc: f32 accumulator, C: bf16 source, alpha: f32 scalar")


def test_keep_fma_when_the_product_is_shared_and_convert_of_another_dtype():
    r = check(fuse, """
        %0 = mul(acc, acc) : f32
        %1 = add(%0, C) : f32
        %2 = convert(%1) : e4m3
        D = store(%2) : bf16
        P = store(%0) : bf16
    """, """
        %0 = mul(acc, acc) : f32
        %1 = add(%0, C) : f32
        %2 = convert(%1) : e4m3
        D = store(%2) : bf16
        P = store(%0) : bf16
    """, params="acc: f32 accumulator, C: bf16 source")
    assert not r.changed


def test_fma_takes_the_second_product_when_the_first_is_shared():
    check(fuse, """
        %0 = mul(acc, acc) : f32
        %1 = mul(C, C) : f32
        %2 = add(%0, %1) : f32
        D = store(%2) : bf16
        P = store(%0) : bf16
    """, """
        %0 = mul(acc, acc) : f32
        %1 = multiply_add(C, C, %0) : f32
        D = store(%1) : bf16
        P = store(%0) : bf16
    """, params="acc: f32 accumulator, C: bf16 source")


# ---- lower ------------------------------------------------------------------------------------

def test_lower_pow_special_cases():
    check(lower, """
        %0 = pow(acc, 2.0) : f32
        %1 = pow(acc, 0.5) : f32
        %2 = pow(acc, -1.0) : f32
        %3 = pow(acc, 1.5) : f32
        %4 = pow(acc, 3.0) : f32
        %5 = pow(acc, -0.5) : f32
        %6 = pow(acc, 0.0) : f32
        %7 = pow(acc, 1.0) : f32
        %8 = add(%0, %1) : f32
        %9 = add(%8, %2) : f32
        %10 = add(%9, %3) : f32
        %11 = add(%10, %4) : f32
        %12 = add(%11, %5) : f32
        %13 = add(%12, %6) : f32
        %14 = add(%13, %7) : f32
        D = store(%14) : bf16
    """, """
        %0 = mul(acc, acc) : f32
        %1 = sqrt(acc) : f32
        %2 = add(%0, %1) : f32
        %3 = div(1.0, acc) : f32
        %4 = add(%2, %3) : f32
        %5 = pow(acc, 1.5) : f32
        %6 = add(%4, %5) : f32
        %7 = mul(%0, acc) : f32
        %8 = add(%6, %7) : f32
        %9 = rsqrt(acc) : f32
        %10 = add(%8, %9) : f32
        %11 = add(%10, 1.0) : f32
        %12 = add(%11, acc) : f32
        D = store(%12) : bf16
    """)


def test_lower_names_an_op_without_a_functor(monkeypatch):
    import dataclasses

    from evtc import ops

    monkeypatch.setitem(ops.OPS, "tanh", dataclasses.replace(ops.OPS["tanh"], functor=""))
    with pytest.raises(evtc.UnsupportedOpError, match="'tanh' has no CUTLASS or evtc functor") as ei:
        lower(ir("""
            %0 = tanh(acc) : f32
            D = store(%0) : bf16
        """))
    assert ei.value.loc.line == 2


# ---- cse, dce -----------------------------------------------------------------------------------

def test_cse_orders_commutative_operands():
    check(cse, """
        %0 = mul(acc, x) : f32
        %1 = mul(x, acc) : f32
        %2 = add(%0, %1) : f32
        D = store(%2) : bf16
    """, """
        %0 = mul(acc, x) : f32
        %1 = add(%0, %0) : f32
        D = store(%1) : bf16
    """, params="acc: f32 accumulator, x: bf16 aux")


def test_keep_cse_of_noncommutative_operands():
    r = check(cse, """
        %0 = sub(acc, x) : f32
        %1 = sub(x, acc) : f32
        %2 = add(%0, %1) : f32
        D = store(%2) : bf16
    """, """
        %0 = sub(acc, x) : f32
        %1 = sub(x, acc) : f32
        %2 = add(%0, %1) : f32
        D = store(%2) : bf16
    """, params="acc: f32 accumulator, x: bf16 aux")
    assert not r.changed


def test_dce_keeps_declared_inputs():
    r = check(dce, """
        D = store(acc) : bf16
    """, """
        D = store(acc) : bf16
    """, params="acc: f32 accumulator, unused: f32 scalar")
    assert [i.name for i in r.graph.inputs] == ["acc", "unused"]
    assert [i.name for i in r.graph.used_inputs] == ["acc"] and not r.changed


def test_propagate_and_legalize_change_nothing():
    g = ir("D = store(acc) : bf16")
    assert propagate(g) == PassResult(g, False)
    from evtc.passes.legalize import ARCH_RULES, legalize

    assert legalize(g, ARCH_RULES["sm90"]) == PassResult(g, False)


# ---- the manager ----------------------------------------------------------------------------------

def test_pipeline_order_and_requires():
    names = [p.name for p in pipeline("sm90")]
    assert names == ["propagate", "fold", "simplify", "canonicalize", "fuse", "lower", "cse", "dce", "legalize"]
    assert [p.name for p in pipeline(None)] == names[:-1] and pipeline(None) == PIPELINE
    PassManager(pipeline("sm80"))  # the declared order is consistent
    with pytest.raises(ValueError, match="'simplify' requires \\['fold'\\]"):
        PassManager([p for p in PIPELINE if p.name != "fold"])
    with pytest.raises(ValueError, match="appears twice"):
        PassManager(PIPELINE + PIPELINE[-1:])


def test_pass_manager_returns_pass_result_and_changed():
    g = ir("""
        %0 = mul(acc, 1.0) : f32
        D = store(%0) : bf16
    """)
    r = PassManager(pipeline("sm90"))(g)
    assert isinstance(r, PassResult) and r.changed and str(r.graph) == str(ir("D = store(acc) : bf16"))
    again = PassManager(pipeline("sm90"))(r.graph)
    assert not again.changed and str(again.graph) == str(r.graph)


def test_run_keeps_its_signature():
    import epilogues as E

    g = run(E.bias_relu.graph, "sm90")
    assert isinstance(g, evtc.Graph) and "multiply_add" in ops_of(g)
    assert str(run(E.bias_relu.graph, "sm90", verify=False)) == str(g)
    assert str(run(E.bias_relu.graph, pipeline=PIPELINE)) == str(g)


def test_pipeline_is_deterministic():
    import epilogues as E

    a = str(run(E.many_aux.graph, "sm90"))
    b = str(run(E.many_aux.trace(), "sm90"))
    assert a == b


def test_ensures_of_each_pass_hold_on_the_reference_epilogues():
    import epilogues as E

    for ep in E.REFERENCE.values():
        g = ep.graph
        for p in pipeline("sm90"):
            g = p(g).graph
            if p.ensures is not None:
                assert p.ensures(g) is None, (p.name, ep.name)


# ---- property tests -------------------------------------------------------------------------------

UNARY = ["relu", "sigmoid", "tanh", "neg", "abs", "silu", "gelu"]
BINARY = ["add", "sub", "mul", "maximum", "minimum"]


@st.composite
def random_epilogue(draw):
    """A random epilogue of up to 12 computes over acc, C, a scalar, a row and a column vector."""
    n_ops = draw(st.integers(1, 12))
    plan = []
    for _ in range(n_ops):
        if draw(st.booleans()):
            plan.append(("u", draw(st.sampled_from(UNARY)), draw(st.integers(0, 100))))
        else:
            plan.append(("b", draw(st.sampled_from(BINARY)), draw(st.integers(0, 100)), draw(st.integers(0, 100)),
                         draw(st.sampled_from([None, 0.0, 1.0, 2.0, -1.0, 0.5]))))

    def fn(acc, C, s: float, r: evtc.RowVector[f32], c: evtc.ColVector[f32]):
        vals = [acc, C, s, r, c]
        for step in plan:
            if step[0] == "u":
                _, op, i = step
                x = vals[i % len(vals)]
                vals.append(-x if op == "neg" else (abs(x) if op == "abs" else getattr(evtc, op)(x)))
            else:
                _, op, i, j, k = step
                x, y = vals[i % len(vals)], vals[j % len(vals)] if k is None else k
                vals.append({"add": lambda: x + y, "sub": lambda: x - y, "mul": lambda: x * y,
                             "maximum": lambda: evtc.maximum(x, y), "minimum": lambda: evtc.minimum(x, y)}[op]())
        return {"D": acc + vals[-1], "E": vals[-1] * acc + vals[len(vals) // 2]}

    return evtc.epilogue(fn, name="rand")


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(random_epilogue(), st.integers(0, 2**31 - 1))
def test_passes_preserve_values(ep, seed):
    g0 = ep.trace(d=f32)
    rng = np.random.default_rng(seed)
    acc = rng.standard_normal((2, 3, 4))
    ins = {"C": rng.standard_normal((2, 3, 4)), "s": 0.75, "r": rng.standard_normal(4), "c": rng.standard_normal(3)}
    ref = interpret(g0, acc, ins)
    g = g0
    for p in pipeline("sm90"):
        g = p(g).graph
        verify(g)
        if p.ensures is not None:
            assert p.ensures(g) is None, p.name
        got = interpret(g, acc, ins)
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-5, err_msg=f"after {p.name}")


def test_a_pass_is_a_graph_to_pass_result_function():
    # passes take the Graph only: the target reaches legalize through pipeline(arch)
    import inspect

    for p in pipeline("sm90"):
        assert isinstance(p, Pass)
        params = [q for q in inspect.signature(p.fn).parameters.values() if q.default is inspect.Parameter.empty]
        assert len(params) == 1, p.name
