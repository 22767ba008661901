"""Compile time of the passes is linear in the epilogue's size and nothing recurses with it
(issue 10): the work of every pass (verification on) on a residual chain doubles when the chain
doubles (500 nodes against 250), and 2000-node chains, of activations or of arithmetic, raise no
RecursionError and take four times the work of chains a quarter their size.

Work is counted, not timed: the Python function calls the pass manager makes (cProfile's count:
the same on every run, whatever else the machine is doing), so a loaded CI machine can't fail
these tests and a quadratic pass (4x the calls for 2x the nodes) or a walk over paths (2^levels)
can't pass them. The one timing test compares CPU times of two sizes in the same process.

The graphs are built through :class:`evtc.ir.graph.GraphBuilder` directly: tracing them needs
the tracer's memoised broadcast classes (issue 10, ``Compute.bcast`` in ``evtc/ir/nodes.py``,
the frontend's part), which these tests don't depend on.
"""

from __future__ import annotations

import cProfile
import pstats
import sys
import time

import numpy as np
import pytest

from evtc import bf16, f32, passes
from evtc.ir import interpret
from evtc.ir.graph import Graph, GraphBuilder
from evtc.ir.nodes import Accumulator, AuxLoad, Compute, Immediate, Store
from evtc.passes import PassManager, pipeline


def residual_chain(levels: int) -> Graph:
    """``x = x + gelu(x)`` repeated: every x is used twice, so a walk over paths would take
    2**levels steps."""
    b = GraphBuilder()
    acc = b.add(Accumulator(f32, name="acc"))
    x = acc
    for _ in range(levels):
        x = b.add(Compute(f32, op="add", args=(x, b.add(Compute(f32, op="gelu", args=(x,))))))
    return Graph("residual", (acc,), (b.add(Store(bf16, name="D", value=x)),))


def activation_chain(n: int) -> Graph:
    b = GraphBuilder()
    acc = b.add(Accumulator(f32, name="acc"))
    x = acc
    for i in range(n):
        x = b.add(Compute(f32, op="relu" if i % 2 else "sigmoid", args=(x,)))
    return Graph("chain", (acc,), (b.add(Store(bf16, name="D", value=x)),))


def arithmetic_chain(n: int) -> Graph:
    """``x = x * 0.5 + X`` repeated: one arithmetic tree of 2n single-use ops, the canonicalize
    pass's worst case (it cuts trees at MAX_TREE_OPS ops)."""
    b = GraphBuilder()
    acc = b.add(Accumulator(f32, name="acc"))
    X = b.add(AuxLoad(f32, name="X"))
    half = b.add(Immediate(f32, value=0.5))
    x = acc
    for _ in range(n):
        x = b.add(Compute(f32, op="add", args=(b.add(Compute(f32, op="mul", args=(x, half))), X)))
    return Graph("arith", (acc, X), (b.add(Store(f32, name="D", value=x)),))


def _timed(graph: Graph) -> tuple[Graph, float]:
    """The passes' result and the CPU time this process spent on them."""
    t0 = time.process_time()
    out = PassManager(pipeline("sm90"), verify=True)(graph).graph
    return out, time.process_time() - t0


def _work(graph: Graph) -> tuple[Graph, int]:
    """The passes' result and the number of Python function calls they made."""
    profile = cProfile.Profile()
    profile.enable()
    try:
        out = PassManager(pipeline("sm90"), verify=True)(graph).graph
    finally:
        profile.disable()
    return out, pstats.Stats(profile).total_calls


def _work_ratio(make, n: int, factor: int) -> tuple[Graph, float]:
    """The result for ``make(n * factor)`` and its work over ``make(n)``'s (after a warm-up, so
    sympy's caches are as full for both)."""
    _work(make(max(1, n // 2)))
    _, small = _work(make(n))
    out, large = _work(make(n * factor))
    return out, large / small


def test_a_500_node_residual_chain_takes_twice_the_work_of_250_nodes():
    """Every node is used twice: a pass that walked paths would take 2^250 steps, one that
    compared every pair of nodes four times the work."""
    g = residual_chain(250)
    assert len(g.nodes) == 502
    out, ratio = _work_ratio(residual_chain, 125, 2)
    assert ratio < 2.2, f"twice the nodes took {ratio:.2f}x the calls"  # 2.00 when linear
    assert [n.op for n in out.nodes if isinstance(n, Compute)].count("gelu") == 250


def test_pass_time_grows_linearly():
    """CPU time, not only calls (a call that got slower with the graph's size), compared between
    two sizes in the same process."""
    _timed(residual_chain(50))  # warm up (sympy's caches)
    small = min(_timed(residual_chain(100))[1] for _ in range(2))
    large = min(_timed(residual_chain(400))[1] for _ in range(2))
    assert large < 8 * small + 0.05, f"4x the nodes took {large / small:.1f}x the time"


@pytest.mark.parametrize("make", [activation_chain, arithmetic_chain])
def test_a_2000_node_chain_raises_no_recursion_error(make):
    n = 2000 if make is activation_chain else 1000
    assert len(make(n).nodes) >= 2001
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(1000)  # the interpreter's default, whatever the test runner set
    try:
        _, ratio = _work_ratio(make, n // 4, 4)
    finally:
        sys.setrecursionlimit(limit)
    assert ratio < 4.4, f"4x the nodes took {ratio:.2f}x the calls"  # 3.98 and 3.94 here (linear)


def test_the_cut_arithmetic_chain_keeps_its_values(monkeypatch):
    from evtc.ir import limits

    monkeypatch.setattr(limits, "LIMITS", limits.Limits(depth=10**4))  # 600 deep: beyond evtc's limit
    g = arithmetic_chain(300)
    out = passes.run(g, "sm90")
    assert len(out.nodes) < len(g.nodes) / 4  # sympy collected each piece
    rng = np.random.default_rng(0)
    acc, X = rng.standard_normal((1, 3, 4)), rng.standard_normal((1, 3, 4))
    want, got = interpret(g, acc, {"X": X})["D"], interpret(out, acc, {"X": X})["D"]
    np.testing.assert_allclose(got, want, rtol=1e-12)
