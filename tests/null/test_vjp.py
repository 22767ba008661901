"""Backward epilogues (evtc/frontend/vjp.py): every derivative rule and the backward epilogue of
epilogues users write, against torch.autograd in float64 on fresh random data (the forward run
eagerly with torch ops, evtc.testing.bench.torch_eval; the backward by evtc's float64 interpreter)."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import evtc  # noqa: E402
from evtc import f32  # noqa: E402
from evtc.testing.bench import torch_eval  # noqa: E402
from evtc.errors import EvtcError, UnsupportedOpError  # noqa: E402
from evtc.frontend.vjp import ACC_FWD, RULES, backward  # noqa: E402
from evtc.ir.interpret import interpret  # noqa: E402
from evtc.ir.nodes import AuxLoad, ColBroadcast, RowBroadcast, ScalarBroadcast, Source  # noqa: E402

M, N = 7, 11


def inputs_of(graph, rng):
    vals = {}
    for leaf in graph.inputs:
        if isinstance(leaf, (Source, AuxLoad)):  # representable in the input's dtype (bf16)
            x = rng.uniform(0.3, 1.7, (M, N)) * rng.choice([-1, 1], (M, N))
            vals[leaf.name] = torch.tensor(x).to(getattr(torch, leaf.dtype.torch)).double().numpy()
        elif isinstance(leaf, RowBroadcast):
            vals[leaf.name] = rng.normal(size=N)
        elif isinstance(leaf, ColBroadcast):
            vals[leaf.name] = rng.uniform(0.5, 1.5, M)
        elif isinstance(leaf, ScalarBroadcast):
            vals[leaf.name] = float(rng.uniform(0.5, 1.5))
    return vals


def autograd(graph, acc, vals, dD):
    """Gradients of the forward's one M x N output (before its rounding to the output dtype),
    by torch.autograd in float64."""
    from evtc.ir.graph import Graph

    t = {k: torch.tensor(v, dtype=torch.float64, requires_grad=not isinstance(v, float)) for k, v in vals.items()}
    a = torch.tensor(acc, dtype=torch.float64, requires_grad=True)
    (store,) = graph.outputs
    unrounded = Graph(graph.name, graph.inputs, (type(store)(f32, name=store.name, value=store.value),), graph.loc)
    torch_eval(unrounded, a, t)[store.name].backward(torch.tensor(dD))  # (torch_eval broadcasts columns itself)
    grads = {"D": a.grad.numpy()}
    grads.update({f"d_{k}": v.grad.numpy() for k, v in t.items() if v.requires_grad and v.grad is not None})
    return grads


def check(graph, seed=0, rtol=1e-5):
    rng = np.random.default_rng(seed)
    vals = inputs_of(graph, rng)
    acc = rng.normal(size=(M, N)) * 1.3
    dD = rng.normal(size=(M, N))
    bwd = backward(graph, grad_dtype=f32)
    got = interpret(bwd.graph, dD, {**vals, ACC_FWD: acc})
    want = autograd(graph, acc, vals, dD)
    assert set(got) == set(want), (sorted(got), sorted(want))
    for k in want:
        np.testing.assert_allclose(np.asarray(got[k]).reshape(np.shape(want[k])), want[k], rtol=rtol, atol=rtol * (1 + np.abs(want[k]).max()), err_msg=k)
    return bwd


ACTIVATIONS = ["relu", "gelu", "gelu_tanh", "silu", "sigmoid", "tanh", "hardswish", "abs", "exp", "erf"]


@pytest.mark.parametrize("act", ACTIVATIONS)
def test_activation_with_a_bias_matches_autograd(act):
    """``act(alpha * acc + bias[n])``: dZ = dD * act' * alpha, dbias = sum over M."""
    g = evtc.Gemm(f"D = {act}(alpha*acc + bias[n])").graph
    bwd = check(g)
    assert bwd.saves and bwd.wrt == ("bias",)


@pytest.mark.parametrize("expr", [
    "D = acc / (1 + X[m, n] * X[m, n])",
    "D = sqrt(acc * acc + 1) * scale[m] + log(X[m, n] * X[m, n] + 0.5)",
    "D = rsqrt(acc * acc + 2.0) - exp(-acc) * bias[n]",
    "D = maximum(acc, X[m, n]) + minimum(acc, bias[n])",
    "D = where(acc > 0, acc * X[m, n], acc * 0.01)",
    "D = leaky_relu(acc + bias[n], 0.1) + (acc * X[m, n]) ** 2",
    "D = relu(acc) ** 2",
    "D = alpha * acc + beta * C",
])
def test_expressions_match_autograd(expr):
    check(evtc.Gemm(expr).graph)


def test_the_reference_epilogues_with_one_output():
    import epilogues as E

    for name in ("linear_combination", "bias_relu", "residual_scale"):
        bwd = check(E.REFERENCE[name].trace(d=evtc.bf16))
        # a linear epilogue needs no saved accumulator; relu' does, and so does R1's gradient
        # in residual_scale (dD * (acc * scale + bias))
        assert bwd.saves == (name != "linear_combination"), name


def test_a_linear_epilogue_saves_nothing_and_its_bias_gradient_is_a_column_sum():
    bwd = backward(evtc.Gemm("D = acc + bias[n]").graph)
    assert not bwd.saves
    text = str(bwd.graph)
    assert "d_bias = reduce_sum(" in text.replace(" ", "") or "sum" in text, text
    assert any(getattr(o, "dim", None) == 0 for o in bwd.graph.outputs[1:])


def test_the_backward_epilogue_plans_and_emits_for_sm90_and_sm80():
    """dgelu_bgrad derived: the forward's GELU + bias gives acc * gelu_grad(acc_fwd + bias) and
    its column sum; it goes through the passes, the planner and the emitters like any epilogue."""
    bwd = backward(evtc.Gemm("D = gelu(acc + bias[n])").graph)
    for arch in ("sm90", "sm80"):
        g = evtc.Gemm(bwd.graph, arch=arch)
        assert "gelu_grad" in str(g.graph) and g.source


def test_what_is_not_differentiated_is_refused_by_name():
    with pytest.raises(EvtcError, match="one M x N output"):
        backward(evtc.Gemm("D = acc; F = acc * 2.0").graph)
    with pytest.raises(EvtcError, match="one M x N output"):
        backward(evtc.Gemm("D = acc; r = max(acc, dim=1)").graph)
    g = evtc.Gemm("D = gelu_grad(acc)").graph
    with pytest.raises(UnsupportedOpError, match="gelu_grad"):
        backward(g)


def test_every_op_with_a_rule_is_in_the_table():
    from evtc import ops

    assert set(RULES) <= set(ops.OPS) | {"multiply_add"}
