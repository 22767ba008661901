"""torch.compile(backend="evtc") on the H100 (evtc/torch_backend.py): Linear + GELU, an MLP block
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

from evtc.torch_backend import make_backend


def compiled(model, *args):
    torch._dynamo.reset()
    gemms = []
    be = make_backend(on_gemm=gemms.append)
    with torch.no_grad():
        out = torch.compile(model, backend=be, fullgraph=True)(*args)
    torch.cuda.synchronize()
    return out, be.fused, gemms


def ulp(x, mant_bits, min_normal_exp):
    """Spacing of a float format with ``mant_bits`` explicit mantissa bits at |x| (float64)."""
    return 2.0 ** (torch.floor(torch.log2(torch.clamp(x.abs(), min=2.0 ** min_normal_exp))) - mant_bits)


def bf16_ulp(x):
    return ulp(x, 7, -126)


def e4m3_ulp(x):
    return ulp(x, 3, -6)


def check(got, ref, ulp_fn, slack, what):
    err = (got.double() - ref).abs()
    bound = 0.5 * ulp_fn(ref) + slack + 1e-300
    bad = err > bound
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.numel()} beyond the bound; worst excess "
                           f"{(err - bound).max().item():.3g} (got {got.double().flatten()[int((err - bound).argmax())]:.6g}, "
                           f"want {ref.flatten()[int((err - bound).argmax())]:.6g})")


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
    check(y, F.gelu(h, approximate="tanh"), bf16_ulp, 1.2 * slack + 2.0 ** -20 * h.abs(), "gelu")


class MLPBlock(nn.Module):
    def __init__(self, d=256, ffn=512):
        super().__init__()
        self.up, self.down = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x)))


def test_mlp_block_with_residual():
    torch.manual_seed(12)
    m = MLPBlock().cuda().bfloat16()
    x = torch.randn(231, 256, device="cuda").bfloat16()
    y, fused, gemms = compiled(m, x)
    assert fused == 2 and "aux" in str(gemms[1].graph)
    h, slack_h = linear64(x, m.up)
    g = F.gelu(h)
    g_bf = g.to(torch.bfloat16).double()  # the kernel stores g in bf16: within half an ulp (+ slack) of g
    dg = 0.5 * bf16_ulp(g) + 1.2 * slack_h  # how far the stored g may be from g
    w2 = m.down.weight.double()
    ref = x.double() + g @ w2.T + m.down.bias.double()
    slack = (512 + 2) * 2.0 ** -23 * (g_bf.abs() @ w2.abs().T + m.down.bias.double().abs()) + dg @ w2.abs().T
    check(y, ref, bf16_ulp, slack + 2.0 ** -20 * ref.abs(), "mlp")


class LayerNormStats(nn.Module):
    def __init__(self, k=256, n=320):
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x):
        h = self.fc(x)
        mu = h.mean(-1, keepdim=True)
        ms = (h * h).mean(-1, keepdim=True)
        return (h - mu) * torch.rsqrt(ms - mu * mu + 1e-5), h, mu, ms


def test_layernorm_statistics():
    torch.manual_seed(13)
    m = LayerNormStats().cuda().bfloat16()
    x = torch.randn(3, 77, 256, device="cuda").bfloat16()
    (y, h, mu, ms), fused, gemms = compiled(m, x)
    assert fused == 1 and str(gemms[0].graph).count("reduce_sum") == 2
    h64, slack = linear64(x, m.fc)
    check(h, h64, bf16_ulp, slack + 2.0 ** -20 * h64.abs(), "h")
    n = h64.shape[-1]
    sum_slack = (n + 2) * 2.0 ** -23 * h64.abs().mean(-1, keepdim=True)
    check(mu, h64.mean(-1, keepdim=True), bf16_ulp, slack.mean(-1, keepdim=True) + sum_slack, "mean")
    check(ms, (h64 * h64).mean(-1, keepdim=True), bf16_ulp,
          (2 * h64.abs() * slack).mean(-1, keepdim=True) + sum_slack * h64.abs().amax(-1, keepdim=True), "mean sq")
    want = (h.double() - mu.double()) * torch.rsqrt(ms.double() - mu.double() ** 2 + 1e-5)  # Inductor's part
    check(y, want, bf16_ulp, 2.0 ** -18 * (want.abs() + 1), "normalized")


class Fp8Out(nn.Module):
    def __init__(self, k=128, n=256):
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x, scale):
        y = torch.relu(self.fc(x))
        return (y * scale).to(torch.float8_e4m3fn), y.abs().amax()


def test_fp8_output_with_amax():
    torch.manual_seed(14)
    m = Fp8Out().cuda().bfloat16()
    x = torch.randn(200, 128, device="cuda").bfloat16() * 4
    scale = torch.tensor(0.75, device="cuda")
    (q, amax), fused, gemms = compiled(m, x, scale)
    assert fused == 1 and "devscalar" in str(gemms[0].graph) and q.dtype == torch.float8_e4m3fn
    h, slack = linear64(x, m.fc)
    r = h.clamp(min=0)
    check(q, 0.75 * r, e4m3_ulp, 0.75 * slack + 2.0 ** -20 * r, "fp8")
    check(amax, r.max(), bf16_ulp, slack.max() + 2.0 ** -20 * r.max(), "amax")
