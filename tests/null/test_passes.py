"""Each pass's before/after, and (hypothesis) that simplify, CSE and DCE preserve values."""

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import evtc
from evtc import bf16, f32
from evtc.ir import Compute, interpret, verify
from evtc.passes import cse, dce, fold, lower, run, simplify


def ops_of(g):
    return [n.op for n in g.nodes if isinstance(n, Compute)]


def test_fold_constants():
    @evtc.epilogue
    def ep(acc):
        return acc * (2.0 * 3.0 + evtc.exp(0.0)) + evtc.sqrt(4.0)

    g = fold(ep.graph)
    assert "mul(acc, 7.0)" in str(g) and "add(%0, 2.0)" in str(g)


def test_simplify_identities():
    @evtc.epilogue
    def ep(acc, x: evtc.Matrix):
        return (acc * 1.0 + 0.0) / 1.0 - 0.0 + -(-x)

    g = simplify(fold(ep.graph))
    assert ops_of(g) == ["add"]


def test_simplify_collects_like_terms_with_sympy():
    @evtc.epilogue
    def ep(acc):
        return 2.0 * (3.0 * acc) + acc

    g = simplify(fold(ep.graph))
    assert ops_of(g) == ["mul"] and "mul(acc, 7.0)" in str(g) or "mul(7.0, acc)" in str(g)


def test_simplify_keeps_nonexact_rewrites_out():
    @evtc.epilogue
    def ep(acc):
        return acc * 0.0

    assert ops_of(simplify(fold(ep.graph))) == ["mul"]  # inf * 0 is NaN: not folded


def test_fma_fusion_and_store_convert():
    @evtc.epilogue
    def ep(acc, C, alpha: float):
        return (alpha * acc + C).to(evtc.e4m3)

    g = simplify(ep.graph)
    assert ops_of(g) == ["multiply_add"]
    assert g.outputs[0].dtype is evtc.e4m3


def test_fma_not_fused_when_product_is_shared():
    @evtc.epilogue
    def ep(acc, C):
        p = acc * acc
        return {"D": p + C, "P": p}

    assert "multiply_add" not in ops_of(simplify(ep.graph))


def test_lower_pow_special_cases():
    @evtc.epilogue
    def ep(acc):
        return acc**2 + acc**0.5 + acc**-1 + acc**1.5

    g = lower(fold(ep.graph))
    ops = ops_of(g)
    assert "pow" in ops and ops.count("pow") == 1 and "sqrt" in ops and "div" in ops


def test_cse_orders_commutative_operands():
    @evtc.epilogue
    def ep(acc, x: evtc.Matrix):
        return acc * x + x * acc

    g = cse(ep.graph)
    assert ops_of(g) == ["mul", "add"]


def test_dce_keeps_declared_inputs():
    @evtc.epilogue
    def ep(acc, unused: float):
        return acc

    g = dce(ep.graph)
    assert [i.name for i in g.inputs] == ["acc", "unused"] and [i.name for i in g.used_inputs] == ["acc"]


def test_pipeline_is_deterministic():
    import epilogues as E

    a = str(run(E.many_aux.graph, "sm90"))
    b = str(run(E.many_aux.trace(), "sm90"))
    assert a == b


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
    for p in (fold, simplify, lower, cse, dce):
        g = p(g, "sm90")
        verify(g)
        got = interpret(g, acc, ins)
        for k in ref:
            np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-5, err_msg=f"after {p.__name__}")
