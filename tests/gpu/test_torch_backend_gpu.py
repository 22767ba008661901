"""torch.compile(backend="evtc") on the H100 (evtc/torch/backend.py): Linear + GELU, an MLP block
with a residual, the LayerNorm statistics and an fp8 output with its amax, compiled with Inductor
for the rest, each fused GEMM a real evtc kernel. Every output against the float64 reference:
within half an ulp of its dtype, plus the f32 accumulation bound of the GEMM (K * 2**-23 *
|x| @ |w|.T) carried through the epilogue. Ragged M (not a multiple of the tile), fresh random
inputs, match counts asserted. The kernels build on first use (one per test: run the tests in
parallel processes, ``-k``, to build them at once)."""

import pytest

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from evtc.torch.backend import make_backend

from torch_models import Fp8Out, LayerNormStats, MLPBlock, ulp, within_half_ulp  # noqa: E402


def compiled(model, *args):
    torch._dynamo.reset()
    gemms = []
    be = make_backend(on_gemm=gemms.append)
    with torch.no_grad():
        out = torch.compile(model, backend=be, fullgraph=True)(*args)
    torch.cuda.synchronize()
    return out, be.fused, gemms


def linear64(x, fc):
    """The float64 value of fc(x) and the f32 accumulation bound of the kernel's GEMM."""
    x64, w64 = x.double(), fc.weight.double()
    h = x64 @ w64.T + fc.bias.double()
    K = x.shape[-1]
    slack = (K + 2) * 2.0 ** -23 * (x64.abs() @ w64.abs().T + fc.bias.double().abs())
    return h, slack


def test_linear_gelu():
    torch.manual_seed(11)
    fc = nn.Linear(256, 320).cuda().bfloat16()

    def f(x):
        return F.gelu(fc(x), approximate="tanh")

    x = torch.randn(3, 77, 256, device="cuda").bfloat16()
    y, fused, gemms = compiled(f, x)
    assert fused == 1 and "gelu_tanh" in str(gemms[0].graph)
    h, slack = linear64(x, fc)
    within_half_ulp(y, F.gelu(h, approximate="tanh"), "bf16", 1.2 * slack + 2.0 ** -20 * h.abs(), "gelu")


def test_mlp_block_with_residual():
    torch.manual_seed(12)
    m = MLPBlock(256, 512).cuda().bfloat16()
    x = torch.randn(231, 256, device="cuda").bfloat16()
    y, fused, gemms = compiled(m, x)
    assert fused == 2 and "aux" in str(gemms[1].graph)
    h, slack_h = linear64(x, m.up)
    g = F.gelu(h)
    g_bf = g.to(torch.bfloat16).double()  # the kernel stores g in bf16: within half an ulp (+ slack) of g
    dg = 0.5 * ulp(g) + 1.2 * slack_h  # how far the stored g may be from g
    w2 = m.down.weight.double()
    ref = x.double() + g @ w2.T + m.down.bias.double()
    slack = (512 + 2) * 2.0 ** -23 * (g_bf.abs() @ w2.abs().T + m.down.bias.double().abs()) + dg @ w2.abs().T
    within_half_ulp(y, ref, "bf16", slack + 2.0 ** -20 * ref.abs(), "mlp")


def test_layernorm_statistics():
    torch.manual_seed(13)
    m = LayerNormStats(256, 320).cuda().bfloat16()
    x = torch.randn(3, 77, 256, device="cuda").bfloat16()
    (y, h, mu, ms), fused, gemms = compiled(m, x)
    assert fused == 1 and str(gemms[0].graph).count("reduce_sum") == 2
    h64, slack = linear64(x, m.fc)
    within_half_ulp(h, h64, "bf16", slack + 2.0 ** -20 * h64.abs(), "h")
    n = h64.shape[-1]
    sum_slack = (n + 2) * 2.0 ** -23 * h64.abs().mean(-1, keepdim=True)
    within_half_ulp(mu, h64.mean(-1, keepdim=True), "bf16", slack.mean(-1, keepdim=True) + sum_slack, "mean")
    within_half_ulp(ms, (h64 * h64).mean(-1, keepdim=True), "bf16",
                    (2 * h64.abs() * slack).mean(-1, keepdim=True) + sum_slack * h64.abs().amax(-1, keepdim=True), "mean sq")
    want = (h.double() - mu.double()) * torch.rsqrt(ms.double() - mu.double() ** 2 + 1e-5)  # Inductor's part
    within_half_ulp(y, want, "bf16", 2.0 ** -18 * (want.abs() + 1), "normalized")


def test_fp8_output_with_amax():
    torch.manual_seed(14)
    m = Fp8Out(128, 256).cuda().bfloat16()
    x = torch.randn(200, 128, device="cuda").bfloat16() * 4
    scale = torch.tensor(0.75, device="cuda")
    (q, amax), fused, gemms = compiled(m, x, scale)
    assert fused == 1 and "devscalar" in str(gemms[0].graph) and q.dtype == torch.float8_e4m3fn
    h, slack = linear64(x, m.fc)
    r = h.clamp(min=0)
    within_half_ulp(q, 0.75 * r, "e4m3", 0.75 * slack + 2.0 ** -20 * r, "fp8")
    within_half_ulp(amax, r.max(), "bf16", slack.max() + 2.0 ** -20 * r.max(), "amax")
