"""The size limits of an epilogue (issue 37, evtc/ir/limits.py): an epilogue beyond them stops at
the line that crossed the limit, quickly and with bounded memory, in every frontend; what is
built within them grows linearly (never with the square of the depth)."""

from __future__ import annotations

import tracemalloc

import pytest

import evtc
from evtc import bf16, f32, passes
from evtc.errors import GraphTooLargeError
from evtc.frontend.text import from_expr, parse_ir
from evtc.frontend.trace import trace
from evtc.ir import limits
from evtc.ir.graph import Graph, GraphBuilder
from evtc.ir.nodes import Accumulator, Compute, Store

THIS = __file__
LIMITS = limits.Limits()


def _chain(n: int):
    def chain(acc):
        x = acc
        for _ in range(n):
            x = evtc.relu(x) + 1  # the loop's line
        return x

    return chain


def _peak(fn) -> tuple[float, object]:
    """(peak traced memory in MB, what fn returned or raised)."""
    tracemalloc.start()
    try:
        try:
            out = fn()
        except evtc.EvtcError as e:
            out = e
        return tracemalloc.get_traced_memory()[1] / 1e6, out
    finally:
        tracemalloc.stop()


def test_the_defaults_are_what_the_note_justifies():
    assert (LIMITS.nodes, LIMITS.depth, LIMITS.outputs, LIMITS.inputs) == (4096, 128, 64, 64)
    assert limits.LIMITS == LIMITS


def test_a_20000_deep_chain_stops_at_the_limit_with_bounded_memory():
    """It took 1.6 GB at 8000 and a MemoryError at 20,000; now it stops after 128 levels."""
    mb, err = _peak(lambda: trace(_chain(20_000)))
    assert isinstance(err, GraphTooLargeError), err
    assert mb < 5, f"{mb:.1f} MB"  # the limit's worth of nodes, not 20,000 levels
    assert "more than 128 levels of nested operations" in err.message and "LIMITS.depth" in err.message
    assert err.epilogue == "chain" and err.loc.file == THIS and "evtc.relu(x) + 1" in err.loc.text
    assert "#too-large" in str(err)
    with pytest.raises(GraphTooLargeError):
        evtc.Gemm(_chain(20_000))


def test_the_expression_form_stops_at_the_limit():
    text = "D = " + "relu(" * 20_000 + "acc" + ")" * 20_000
    with pytest.raises(GraphTooLargeError) as ei:
        from_expr(text)
    err = ei.value
    assert err.loc.file == "<expr>" and text[err.loc.col:].startswith("relu(")
    assert text[:err.loc.col].count("relu(") == 20_000 - 129  # the 129th call from the inside
    assert len(err.loc.excerpt().splitlines()[0]) < 200  # a window of the 100 KB line


def test_ten_thousand_outputs_stop_at_the_limit():
    def many(acc):
        r = evtc.relu(acc)
        return {f"D{i}": r for i in range(10_000)}

    mb, err = _peak(lambda: trace(many))
    assert isinstance(err, GraphTooLargeError) and "more than 64 outputs" in err.message and mb < 5
    text = "; ".join(f"D{i} = relu(acc)" for i in range(65))
    with pytest.raises(GraphTooLargeError, match="more than 64 outputs") as ei:
        from_expr(text)
    assert text[ei.value.loc.col:].startswith("D64 = ")


def test_too_many_nodes_and_parameters():
    def wide(acc):  # 5000 distinct leaves summed pairwise: 13 levels, 10,000 nodes
        xs = [acc + i for i in range(5000)]
        while len(xs) > 1:
            xs = [a + b for a, b in zip(xs[::2], xs[1::2])] + xs[len(xs) // 2 * 2:]
        return xs[0]

    with pytest.raises(GraphTooLargeError, match="more than 4096 nodes") as ei:
        trace(wide)
    assert ei.value.loc.file == THIS
    with pytest.raises(GraphTooLargeError, match="more than 64 parameters") as ei:
        from_expr("D = acc" + "".join(f" + p{i}" for i in range(70)))
    assert ei.value.loc.text[ei.value.loc.col:].startswith("p63 ")  # acc and 63 scalars fit


def test_ir_text_and_hand_built_graphs_are_checked_too():
    lines = ["epilogue deep(acc: f32 accumulator):", "  %0 = relu(acc) : f32"]
    lines += [f"  %{i} = relu(%{i - 1}) : f32" for i in range(1, 200)] + ["  D = store(%199) : bf16"]
    with pytest.raises(GraphTooLargeError) as ei:
        parse_ir("\n".join(lines) + "\n")
    assert ei.value.loc.file == "<ir>" and ei.value.loc.line == 2 + 128

    b = GraphBuilder()
    acc = b.add(Accumulator(f32, name="acc"))
    x = acc
    for _ in range(300):
        x = b.add(Compute(f32, op="relu", args=(x,)))
    g = Graph("hand", (acc,), (b.add(Store(bf16, name="D", value=x)),))
    with pytest.raises(GraphTooLargeError, match="128 levels") as ei:
        passes.run(g, "sm90")
    assert ei.value.epilogue == "hand"


def test_at_the_limits_everything_still_compiles_to_source():
    def deepest(acc):  # 127 computes and the store: depth 128
        x = acc
        for _ in range(63):
            x = evtc.relu(x) + 1
        return evtc.relu(x)

    g = trace(deepest)
    assert max(o.depth for o in g.outputs) == LIMITS.depth
    assert "Sm90EVT" in evtc.Gemm(deepest).source
    outputs = "; ".join(f"D{i} = relu(acc + {i})" for i in range(LIMITS.outputs))
    assert len(from_expr(outputs).outputs) == LIMITS.outputs


def test_the_emitted_source_grows_linearly_with_depth(monkeypatch):
    """The visitor tree's initializer was indented by its depth: 750 KB at 200 levels of relu(x) + 1,
    quadratic. Sizes, not times (the machine running the tests may be loaded)."""
    monkeypatch.setattr(limits, "LIMITS", limits.Limits(depth=10_000, nodes=10**6))
    small, large = (len(evtc.Gemm(_chain(n)).source) for n in (50, 200))
    assert large < 4.5 * small, (small, large)


def test_tracing_memory_grows_linearly_with_depth(monkeypatch):
    monkeypatch.setattr(limits, "LIMITS", limits.Limits(depth=10**6, nodes=10**6))
    small, _ = _peak(lambda: trace(_chain(1000)))
    large, g = _peak(lambda: trace(_chain(4000)))
    assert isinstance(g, Graph) and large < 6 * small, (small, large)
