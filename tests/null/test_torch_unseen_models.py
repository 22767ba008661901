"""torch.compile(backend="evtc") on blocks of model families no issue named (OPT/BLOOM, CLIP,
ConvNeXt, T5, Phi-2, Mixtral-style loops, LM heads...), written as users write them, on the CPU
with evtc's float64 interpreter as each fused op's kernel (tests/null/test_torch_backend.py):
the fused counts, and the outputs as close to float64 as eager bf16's."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from test_torch_backend import GEMMS, compiled, ir  # noqa: E402


def _check(block, *args, fused_expected, fragments=()):
    torch.manual_seed(0)
    with torch.no_grad():
        for p in block.parameters():
            if p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))
        ref = block.double()(*[a.double() for a in args])
        block.to(args[0].dtype)
        eager = block(*args)
    out, fused = compiled(block, *args)
    graphs = [ir(i) for i in range(len(GEMMS))]
    assert fused == fused_expected, (fused, graphs)
    for frag in fragments:
        assert any(frag in g for g in graphs), (frag, graphs)
    outs, eagers, refs = [(t if isinstance(t, tuple) else (t,)) for t in (out, eager, ref)]
    for o, e, r in zip(outs, eagers, refs):
        assert o.shape == e.shape and o.dtype == e.dtype
        e_evtc = (o.double() - r).abs().max().item()
        e_eager = (e.double() - r).abs().max().item()
        assert e_evtc <= e_eager + r.abs().max().item() * 2.0 ** -8, (e_evtc, e_eager)


class _Stats(nn.Module):
    """A projection whose M x N value only its statistics leave: the sum of squares an RMS
    statistic takes, a greedy decode's max logit, the mean of a pooled head."""

    def __init__(self, stat, d=64, n=256):
        super().__init__()
        self.fc, self.stat = nn.Linear(d, n), stat

    def forward(self, x):
        return self.stat(self.fc(x))


@pytest.mark.parametrize("stat, frag", [
    (lambda h: h.float().pow(2).mean(-1, keepdim=True), "reduce_sum("),          # RMS statistic, keepdim
    (lambda h: torch.max(F.gelu(h), -1, keepdim=True).values, "reduce_max("),    # greedy logit of a head
    (lambda h: h.mean(dim=(0, 1)), "reduce_sum("),                               # pooled over every token
    (lambda h: (h.sum(-1, keepdim=True), h.amax(-1)), "reduce_max("),            # two statistics
], ids=["rms_keepdim", "max_keepdim", "mean_over_tokens", "two_stats"])
def test_a_region_of_reductions_only_fuses_with_its_bias(stat, frag):
    # NOTE [A region of reductions only] (evtc/torch/regions.py): sm90's epilogue must store an
    # M x N D; without one the Gemm was refused and the match (bias, activation) went unfused
    x = torch.randn(2, 24, 64).bfloat16()
    _check(_Stats(stat), x, fused_expected=1, fragments=(frag, "add(acc, p0)", "D = store("))


class _ThenRefused(nn.Module):
    """A projection with its bias and activation, then an op the region admits and evtc refuses
    when it builds the epilogue."""

    def __init__(self, tail, d=64, n=256):
        super().__init__()
        self.fc, self.tail = nn.Linear(d, n), tail

    def forward(self, x):
        return self.tail(F.relu(self.fc(x)))


@pytest.mark.parametrize("tail", [
    lambda h: 2.0 ** h,                                    # pow(c, x): refused by evtc's type check
    lambda h: torch.pow(h, h[..., :1].detach() * 0 + 2),   # a tensor exponent (computed from the region: not admitted)
    lambda h: (h * 4).to(torch.int32).to(torch.bfloat16),  # a cast through int32 (no int32 in evtc)
], ids=["scalar_base_pow", "tensor_exponent", "int32_cast"])
def test_a_region_evtc_refuses_shrinks_to_what_it_builds(tail):
    """NOTE [A region evtc refuses shrinks] (evtc/torch/regions.py): the refused op dropped the
    whole match, bias and ReLU with it (0 fused); the region gives it up and keeps the rest."""
    x = torch.randn(2, 24, 64).bfloat16()
    _check(_ThenRefused(tail), x, fused_expected=1, fragments=("add(acc, p0)", "relu("))


class _ScaledScores(nn.Module):
    """Attention scores as BLOOM and others write them: ``baddbmm(bias, q, k^T, alpha=1/sqrt(d))``,
    then an activation."""

    def forward(self, q, k, bias):
        return F.relu(torch.baddbmm(bias, q, k.transpose(1, 2), beta=1.0, alpha=0.125))


@pytest.mark.parametrize("bias_shape, kind", [((4, 24, 32), "aux"), ((32,), "row")], ids=["aux", "row"])
def test_baddbmm_is_an_anchor(bias_shape, kind):
    """torch.baddbmm (beta * input + alpha * (b1 @ b2)) was no anchor: the backend left it, and
    the ops after it, unfused; it is one batched GEMM with its input as C / a row bias now."""
    torch.manual_seed(0)
    q, k = torch.randn(4, 24, 64).bfloat16(), torch.randn(4, 32, 64).bfloat16()
    bias = torch.randn(*bias_shape).bfloat16()
    _check(_ScaledScores(), q, k, bias, fused_expected=1, fragments=(f"p0: bf16 {kind}", "multiply_add(acc, 0.125, p0)",
                                                                      "relu("))
