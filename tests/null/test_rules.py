"""Every rewrite rule on its own: both sides evaluated by the reference interpreter.

Each row of the rule tables (``IDENTITIES`` in simplify, ``FUSIONS`` in fuse, ``LOWERINGS`` in
lower) gets its own test: Hypothesis draws a DAG for each of the pattern's variables (over f32
leaves of every broadcast class) and input arrays that include inf, NaN, signed zeros and huge
values; the pattern builds its own left-hand side; only that rule is applied; the test checks
that it fired and that the interpreter's outputs are the same before and after (bit for bit up
to the sign of zero for exact rules, a few float64 ulps for the rest).
"""

from __future__ import annotations

import dataclasses
import numpy as np
import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

from evtc import dtypes
from evtc.dtypes import f32
from evtc.ir import interpret
from evtc.ir.graph import Graph, GraphBuilder
from evtc.ir.nodes import Accumulator, AuxLoad, ColBroadcast, Compute, Node, RowBroadcast, ScalarBroadcast, Store
from evtc.passes.fuse import FUSIONS
from evtc.passes.lower import LOWERINGS
from evtc.passes.manager import PassResult
from evtc.passes.pattern import apply
from evtc.passes.simplify import IDENTITIES

TABLES = {"IDENTITIES": IDENTITIES, "FUSIONS": FUSIONS, "LOWERINGS": LOWERINGS}
ALL_RULES = [(t, r.name) for t, table in TABLES.items() for r in table]

#: rules that are exact in float64 except where noted; others get a float64 ulp tolerance
INEXACT = {"x**3": "powf rounds once, x*x*x twice"}
#: rules that differ at some operand values (documented in the rule's doc): rule -> (operand,
#: the values where they differ, why)
EXCEPTIONS = {
    "x**-0.5": ("x", (-np.inf, -0.0), "pow(-inf, -0.5) is 0 and pow(-0, -0.5) is +inf; rsqrt gives NaN and -inf"),
}

L, M, N = 2, 3, 4
UNARY = ["neg", "relu", "abs", "sigmoid", "exp", "tanh"]
BINARY = ["add", "sub", "mul", "div", "maximum"]

finite_or_special = st.one_of(
    st.floats(-1e3, 1e3, width=64),
    st.sampled_from([0.0, -0.0, 1.0, -1.0, np.inf, -np.inf, np.nan, 3e38, -3e38, 1e-40]),
)


def leaves(b: GraphBuilder) -> list[Node]:
    return [
        b.add(Accumulator(f32, name="acc")),
        b.add(AuxLoad(f32, name="X")),
        b.add(ScalarBroadcast(f32, name="s")),
        b.add(RowBroadcast(f32, name="r")),
        b.add(ColBroadcast(f32, name="c")),
    ]


@st.composite
def operand(draw, b: GraphBuilder, pool: list[Node], depth: int = 2) -> Node:
    """A random DAG over ``pool`` (leaves and earlier operands, so operands may share nodes)."""
    if depth == 0 or draw(st.booleans()):
        return draw(st.sampled_from(pool))
    if draw(st.booleans()):
        x = draw(operand(b, pool, depth - 1))
        return b.add(Compute(f32, op=draw(st.sampled_from(UNARY)), args=(x,)))
    x, y = draw(operand(b, pool, depth - 1)), draw(operand(b, pool, depth - 1))
    return b.add(Compute(f32, op=draw(st.sampled_from(BINARY)), args=(x, y)))


def interior(pat, bound: dict, b: GraphBuilder, dtype) -> list[Node]:
    """The computes a pattern builds below its root (the builder returns the existing nodes)."""
    out: list[Node] = []
    for sub in pat.src or ():
        if sub.op is not None:
            out.append(sub.build(bound, b, dtype=dtype))
        out += interior(sub, bound, b, dtype)
    return out


def _subexpressions(node: Node) -> list[Node]:
    """``node`` and every node it is computed from."""
    seen, stack, out = set(), [node], []
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        out.append(n)
        stack.extend(getattr(n, "args", ()))
    return out


def inputs(draw) -> dict:
    arr = lambda shape: draw(hnp.arrays(np.float64, shape, elements=finite_or_special))  # noqa: E731
    return {"acc": arr((L, M, N)), "X": arr((L, M, N)), "s": draw(finite_or_special), "r": arr((N,)),
            "c": arr((M,))}


@pytest.mark.parametrize("table,name", ALL_RULES, ids=[f"{t}:{n}" for t, n in ALL_RULES])
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_rule_preserves_values(table, name, data):
    rule = TABLES[table][name]
    b = GraphBuilder()
    pool = leaves(b)
    bound: dict[str, Node] = {}
    for v in rule.pattern.variables:
        bound[v] = data.draw(operand(b, pool), label=v)
        pool.append(bound[v])
    t = data.draw(st.sampled_from(dtypes.TENSOR_DTYPES), label="dtype")

    def output(pat, value):
        return b.add(Store(t, name="D", value=value))

    lhs = rule.pattern.build(bound, b, dtype=t, output=output)
    # the builder shares equal nodes: a variable drawn equal to one of the pattern's own computes,
    # or containing one (c = a*b, or c = (acc+acc) + a*b, for a*b+c), gives that compute a second
    # use, and fusions rightly don't fire then
    within = {id(n) for v in bound.values() for n in _subexpressions(v)}
    assume(not any(id(n) in within for n in interior(rule.pattern, bound, b, t)))
    if rule.pattern.commutative and data.draw(st.booleans(), label="operands swapped"):
        lhs = b.add(dataclasses.replace(lhs, args=lhs.args[::-1]))  # c + a*b, 0 + x, 1 * x ...
    outs = [lhs] if isinstance(lhs, Store) else [b.add(Store(f32, name="D", value=lhs))]
    # probes: each variable's own value, to locate the documented exceptions
    outs += [b.add(Store(f32, name=f"probe_{v}", value=n)) for v, n in bound.items()]
    before = Graph("rule", tuple(pool[:5]), tuple(outs))

    after = apply(before, TABLES[table].only(name))
    assert PassResult.of(before, after).changed, f"rule '{name}' did not fire on its own pattern:\n{before}"

    ins = inputs(data.draw)
    want = interpret(before, ins["acc"], ins)
    got = interpret(after, ins["acc"], ins)
    keep = np.ones(want["D"].shape, dtype=bool)
    if name in EXCEPTIONS:
        var, values, _why = EXCEPTIONS[name]
        probe = np.broadcast_to(want[f"probe_{var}"], keep.shape)
        for value in values:  # -0.0 by its sign bit: +0.0 is not an exception
            keep &= ~((probe == value) & (np.signbit(probe) == np.signbit(value)))
    if name in INEXACT:
        np.testing.assert_allclose(got["D"][keep], want["D"][keep], rtol=8 * np.finfo(np.float64).eps, atol=0,
                                   equal_nan=True, err_msg=f"rule '{name}'")
    else:
        np.testing.assert_array_equal(got["D"][keep], want["D"][keep], err_msg=f"rule '{name}'")


def test_every_rule_is_tested():
    names = [n for _, n in ALL_RULES]
    assert len(names) == len(set(names)), "rule names must be unique across tables (tests are keyed by name)"
    assert set(EXCEPTIONS) | set(INEXACT) <= set(names)
    assert len(ALL_RULES) == len(IDENTITIES.rules) + len(FUSIONS.rules) + len(LOWERINGS.rules) >= 17


@pytest.mark.parametrize("name", sorted(EXCEPTIONS))
def test_documented_exceptions_are_real(name):
    """The values excluded above really are where the two sides differ (so the exclusion is
    no wider than it says), and the rule's doc names the difference."""
    rule = LOWERINGS[name]
    var, values, _ = EXCEPTIONS[name]
    b = GraphBuilder()
    acc = b.add(Accumulator(f32, name="acc"))
    before = Graph("e", (acc,), (b.add(Store(f32, name="D", value=rule.pattern.build({var: acc}, b))),))
    after = apply(before, LOWERINGS.only(name))
    for value in values:
        assert ("-0" if value == 0 else "-inf") in rule.doc
        x = np.array([[[value, 4.0, 0.25, np.inf, 0.0]]])
        want, got = interpret(before, x, {})["D"], interpret(after, x, {})["D"]
        assert not np.array_equal(want[..., 0], got[..., 0], equal_nan=True)
        np.testing.assert_array_equal(want[..., 1:], got[..., 1:])
