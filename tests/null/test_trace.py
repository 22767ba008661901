"""The tracer: parameter kinds, ops, outputs, and the text form it produces."""

import numpy as np
import pytest

import evtc
from evtc import bf16, e4m3, f16, f32
from evtc.ir import Accumulator, AuxLoad, ColBroadcast, Compute, Immediate, Reduction, RowBroadcast, ScalarBroadcast, Source, Store, verify
from evtc.passes.legalize import ARCH_RULES, legalize


def test_parameter_kinds_and_dtypes():
    @evtc.epilogue
    def ep(acc, C, alpha: float, s: evtc.DeviceScalar[f32], bias: evtc.RowVector[bf16], scale: evtc.ColVector[f32],
           R: evtc.Matrix[f16], Q: evtc.Matrix):
        return acc * alpha * s + C + bias + scale + R + Q

    g = ep.trace(c=f16, d=bf16)
    kinds = [(type(i), i.name, i.dtype) for i in g.inputs]
    assert kinds == [
        (Accumulator, "acc", f32), (Source, "C", f16), (ScalarBroadcast, "alpha", f32), (ScalarBroadcast, "s", f32),
        (RowBroadcast, "bias", bf16), (ColBroadcast, "scale", f32), (AuxLoad, "R", f16), (AuxLoad, "Q", bf16),
    ]
    assert g.input("s").by_pointer and not g.input("alpha").by_pointer
    (out,) = g.outputs
    assert isinstance(out, Store) and out.name == "D" and out.dtype is bf16
    verify(g)
    legalize(g, ARCH_RULES["sm90"])  # the sm90 rules (verify's old arch argument)


def test_operand_order_lives_in_nodes_x_times_x():
    @evtc.epilogue
    def sq(acc, x: evtc.Matrix):
        return x * x - acc

    g = sq.graph
    mul = next(n for n in g.nodes if isinstance(n, Compute) and n.op == "mul")
    assert mul.args[0] is mul.args[1] is g.input("x")
    sub = next(n for n in g.nodes if isinstance(n, Compute) and n.op == "sub")
    assert sub.args == (mul, g.input("acc"))
    nx = g.to_networkx()
    assert nx.edges[id(g.input("x")), id(mul)]["uses"] == 2


def test_hash_consing_merges_repeated_subexpressions():
    @evtc.epilogue
    def ep(acc, bias: evtc.RowVector[f32]):
        a = acc + bias
        b = acc + bias
        return a * b

    g = ep.graph
    adds = [n for n in g.nodes if isinstance(n, Compute) and n.op == "add"]
    assert len(adds) == 1


def test_reflected_ops_and_constants():
    @evtc.epilogue
    def ep(acc):
        return 2.0 - acc / 4 + (1 - acc) * 3

    g = ep.graph
    text = str(g)
    assert "= div(acc, 4.0)" in text and "= sub(2.0, %0)" in text and "= sub(1.0, acc)" in text and "mul(%2, 3.0)" in text
    consts = {n.value for n in g.nodes if isinstance(n, Immediate)}
    assert consts == {1.0, 2.0, 3.0, 4.0}


def test_multiple_outputs_reductions_and_dtypes():
    @evtc.epilogue
    def fwd(acc, bias: evtc.RowVector[f32]):
        F = acc + bias
        D = evtc.gelu(F)
        return {"D": D, "F": F.to(f16), "row_max": evtc.max(D, dim=1), "col_sum": evtc.sum(D, dim=0).to(bf16),
                "amax": evtc.amax(D)}

    g = fwd.graph
    names = [(o.name, type(o).__name__, o.dtype, getattr(o, "dim", "-")) for o in g.outputs]
    assert names == [("D", "Store", bf16, "-"), ("F", "Store", f16, "-"), ("row_max", "Reduction", f32, 1),
                     ("col_sum", "Reduction", bf16, 0), ("amax", "Reduction", f32, None)]
    amax = g.output("amax")
    assert isinstance(amax.value, Compute) and amax.value.op == "abs"
    verify(g)


def test_comparisons_where_and_conversion():
    @evtc.epilogue
    def ep(acc, x: evtc.Matrix):
        m = acc > x
        return evtc.where(m, acc, 0.0).to(e4m3)

    g = ep.graph
    ops = [n.op for n in g.nodes if isinstance(n, Compute)]
    assert ops == ["gt", "where", "convert"]
    assert g.outputs[0].dtype is e4m3


def test_eager_call_matches_interpreter():
    """The function called on arrays (eagerly) and the traced graph agree."""
    rng = np.random.default_rng(1)
    import epilogues as E
    from evtc.ir import interpret

    acc = rng.standard_normal((2, 5, 7))
    ins = {"C": rng.standard_normal((2, 5, 7)), "alpha": 0.7, "beta": -1.3, "bias": rng.standard_normal(7)}
    ref = interpret(E.bias_relu.trace(c=f32, d=f32), acc, ins)["D"]
    eager = E.bias_relu(acc, **ins)
    np.testing.assert_allclose(ref, np.float32(eager), rtol=1e-6)


def test_graph_equality_is_structural():
    import epilogues as E

    assert E.bias_relu.trace() == E.bias_relu.trace()
    assert E.bias_relu.trace() != E.linear_combination.trace()
    assert E.bias_relu.trace(d=f16) != E.bias_relu.trace(d=bf16)


def test_reduction_dim_aliases():
    @evtc.epilogue
    def ep(acc):
        return {"D": acc, "a": evtc.sum(acc, dim=-1), "b": evtc.sum(acc, dim=-2)}

    g = ep.graph
    assert g.output("a").dim == 1 and g.output("b").dim == 0
