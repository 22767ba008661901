"""Training with symbolic shapes under ``torch.compile(backend="evtc")`` on the CPU (NOTE [Symbolic
shapes in training], evtc/torch/backend.py): under ``dynamic=True``, or once automatic dynamic
shapes made the token count symbolic, AOTAutograd's symbolic forward and backward graphs are each
fused per concrete shape at call time, the backward's data-gradient GEMM with the activation's
derivative as with static shapes, a repeated shape reuses its compilation, and every gradient
matches float64 as closely as eager bf16's. The fused op's CPU kernel is evtc's float64
interpreter (tests/null/test_torch_backend.py)."""

import copy

import pytest

torch = pytest.importorskip("torch")

import torch_zoo as Z  # noqa: E402
from test_torch_backend import GEMMS, register  # noqa: E402
from test_torch_training import CASES, _grads  # noqa: E402

from evtc.torch.backend import make_backend  # noqa: E402


def _check(name, be, block, compiled, tokens, *, fresh):
    """One training step of ``block`` (``name``'s) at ``tokens`` rows through ``compiled``: the
    gradients against float64 (as close as eager bf16's), and, for a shape seen for the first time
    (``fresh``), the forward and backward fused (the backward's epilogue holds the fragment), or
    else nothing new fused."""
    _, args = Z.make(name, 64, 256, tokens)
    ref = copy.deepcopy(block).double()
    ref64 = _grads(ref, [a.double() for a in args], ref)
    eager = _grads(block, args, block)
    fused, made = be.fused, len(GEMMS)
    got = _grads(block, args, compiled)
    least, fragment = CASES[name]
    if fresh:
        assert be.fused - fused >= least, (name, tokens, be.fused - fused, [str(g.graph) for g in GEMMS[made:]])
        assert any(fragment in str(g.graph) for g in GEMMS[made:]), [str(g.graph) for g in GEMMS[made:]]
    else:  # the shape's specializations are reused
        assert (be.fused, len(GEMMS)) == (fused, made), (name, tokens, be.fused - fused)
    for k, want in ref64.items():
        e_evtc = (got[k] - want).abs().max().item()
        e_eager = (eager[k] - want).abs().max().item()
        assert e_evtc <= 2 * e_eager + 2.0 ** -8 * want.abs().max().item(), (name, tokens, k, e_evtc, e_eager)


def _steps(name, steps, *, dynamic, inductor=False):
    """Train ``name``'s block compiled once, a step at each ``(tokens, fresh)`` of ``steps``."""
    GEMMS.clear()
    torch._dynamo.reset()
    be = make_backend(allow_cpu=True, inductor=inductor, on_gemm=lambda g: (GEMMS.append(g), register(g)))
    block, _ = Z.make(name, 64, 256, 8)
    compiled = torch.compile(block, backend=be, dynamic=dynamic)
    for tokens, fresh in steps:
        _check(name, be, block, compiled, tokens, fresh=fresh)


@pytest.mark.parametrize("name", ["gpt2", "llama"])
def test_dynamic_true_training_fuses_per_shape(name):
    _steps(name, ((48, True), (40, True), (72, True), (40, False)), dynamic=True)


def test_automatic_dynamic_training_fuses_per_shape():
    """The first call compiles static shapes (fused as before); the second token count makes
    Dynamo recompile with a symbolic one, whose shapes are then fused per call."""
    _steps("gpt2", ((48, True), (40, True), (72, True), (72, False), (56, True)), dynamic=None)


def test_dynamic_true_training_through_inductor():
    """Inductor's path: each shape's fused static graph is compiled by compile_fx_inner with the
    keyword arguments AOTAutograd gave the symbolic graph (Inductor's C++ on the CPU: minutes)."""
    _steps("gpt2", ((48, True), (40, True), (40, False)), dynamic=True, inductor=True)
