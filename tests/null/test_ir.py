"""The IR: verifier, interpreter, networkx view."""

import dataclasses

import numpy as np
import pytest

import evtc
from evtc import bf16, e4m3, f32
from evtc.dtypes import round_to
from evtc.errors import IRVerificationError
from evtc.ir import Compute, Graph, Immediate, Store, interpret, verify
from evtc.ir.nodes import Accumulator


def test_verifier_rejects_undeclared_leaf():
    import epilogues as E

    g = E.bias_relu.graph
    bad = Graph(g.name, tuple(i for i in g.inputs if i.name != "bias"), g.outputs)
    with pytest.raises(IRVerificationError, match="'bias' is not a declared input"):
        verify(bad)


def test_verifier_rejects_bad_dtype_and_arity_with_window():
    acc = Accumulator(f32, name="acc")
    bad = Compute(bf16, op="relu", args=(acc,))
    g = Graph("g", (acc,), (Store(bf16, name="D", value=bad),))
    with pytest.raises(IRVerificationError) as ei:
        verify(g)
    assert "computes in f32" in str(ei.value) and "> %0 = relu(acc) : bf16" in str(ei.value)
    bad2 = Compute(f32, op="add", args=(acc,))
    with pytest.raises(IRVerificationError, match="takes 2 operands"):
        verify(Graph("g", (acc,), (Store(bf16, name="D", value=bad2),)))


def test_verifier_names_the_pass():
    acc = Accumulator(f32, name="acc")
    g = Graph("g", (acc,), (Store(bf16, name="D", value=Immediate(f32, value=1.0)),))
    with pytest.raises(IRVerificationError, match="after pass 'fold'"):
        verify(g, after="fold")


def test_interpreter_models_conversions_and_reductions():
    @evtc.epilogue
    def ep(acc, scale: evtc.ColVector[f32]):
        y = acc * scale
        return {"D": y.to(e4m3), "rmax": evtc.max(y, dim=1), "csum": evtc.sum(y, dim=0), "tot": evtc.min(y)}

    g = ep.graph
    rng = np.random.default_rng(0)
    acc = rng.standard_normal((3, 4, 5)) * 100
    scale = round_to(rng.standard_normal(4), f32)  # inputs are rounded to their declared dtype
    r = interpret(g, acc, {"scale": scale})
    y = acc * scale[None, :, None]
    np.testing.assert_array_equal(r["D"], round_to(y, e4m3))
    assert np.abs(r["D"]).max() <= 448.0  # saturating conversion
    np.testing.assert_allclose(r["rmax"], y.max(axis=2))
    np.testing.assert_allclose(r["csum"], round_to(y.sum(axis=1), f32))
    assert r["tot"].shape == (3,)


def test_round_to_matches_torch_style_rounding():
    x = np.array([1.0 + 2**-8, 1.0 + 3 * 2**-9, 300.0, 1000.0, -1e-9, 0.0])
    r = round_to(x, bf16)
    assert r[0] == 1.0  # ties to even
    assert r[1] == 1.0 + 2**-7
    e = round_to(x, e4m3)
    assert e[3] == 448.0 and e[2] == 288.0


def test_networkx_view_is_acyclic_and_complete():
    import networkx as nx

    import epilogues as E

    g = E.many_aux.graph
    nxg = g.to_networkx()
    assert nx.is_directed_acyclic_graph(nxg)
    assert nxg.number_of_nodes() == len(g.nodes)


def test_frozen_nodes():
    acc = Accumulator(f32, name="acc")
    with pytest.raises(dataclasses.FrozenInstanceError):
        acc.name = "x"


def test_bf16_rounding_matches_the_exact_rounding_and_overflows_like_the_kernel():
    """round_to(bf16) rounds float32 bits (as __float2bfloat16_rn does); away from double-rounding
    ties it equals exact rounding of the float64 value, and beyond bf16's range it gives inf."""
    import numpy as np

    from evtc import dtypes as D

    rng = np.random.default_rng(7)
    x = rng.standard_normal(100_000) * 10.0 ** rng.integers(-30, 30, 100_000)
    fast, exact = D.round_to(x, D.bf16), D._round_mantissa(x, D.bf16)
    assert np.mean(fast != exact) < 1e-3
    assert np.all(np.abs(fast - exact) <= np.abs(exact) * 2.0 ** -7)
    assert D.round_to(np.array([3.4e38, -1e300, np.nan]), D.bf16).tolist()[:2] == [np.inf, -np.inf]
    assert np.isnan(D.round_to(np.array(np.nan), D.bf16))
    assert D.round_to(np.asarray(0.1), D.bf16).shape == ()
