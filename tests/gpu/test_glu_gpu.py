"""evtc.glu on the GPU: the one-GEMM gated form (NOTE [The gated epilogue],
include/evtc/sm90_glu_store.hpp) against the float64 reference elementwise (evtc.testing.check:
fresh random data, NaN-poisoned outputs, row padding checked), on every family member that can
run it and through the family's own choice, at ragged M and N / 2, one token, a batch, under the
stream-K member's decompositions; and end to end against the two separate projections of a
SwiGLU MLP (W_gate, W_up interleaved by evtc.interleave_gate_up)."""

import pytest

import evtc
from evtc import bf16, f32
from evtc.testing import Problem, check

from conftest_gpu import built_fixture

pytestmark = pytest.mark.gpu


@evtc.epilogue
def swiglu(acc, bias: evtc.RowVector[f32]):
    return evtc.glu(acc + bias, act="silu")


@evtc.epilogue
def geglu(acc, alpha: float):
    return evtc.glu(alpha * acc, act="gelu_tanh")


#: (M, N, K, L): ragged M, N / 2 not a multiple of any tile's half, one token, a batch, a
#: Llama-3-8B gate/up projection (N = 2 x 14336)
SHAPES = [(300, 1000, 256, 1), (1, 4096, 512, 1), (7, 304, 128, 1), (129, 640, 192, 2), (1024, 28672, 4096, 1)]


def gemms() -> dict:
    """Every Gemm this file runs (benchmarks/prebuild.py's group ``glu``): swiglu pinned to each
    member the family keeps for it, and both epilogues through the family."""
    table = {}
    fam = evtc.Gemm(swiglu, a=bf16, b=bf16)
    for name, spec in fam.family.items():
        table[("swiglu", name)] = evtc.Gemm(swiglu, a=bf16, b=bf16, config=spec.config)
    table[("swiglu", "family")] = fam
    table[("geglu", "family")] = evtc.Gemm(geglu, a=bf16, b=bf16)
    return table


built = built_fixture(gemms)


def _check(g, shape, seed):
    M, N, K, L = shape
    res = check(g, Problem(M, N, K, L), seed=seed)
    for name, r in res.items():
        assert r.ok, f"{g.name} {shape}: {r.describe()}"
    assert res["D"].total == M * (N // 2) * L  # the gated output: N / 2 columns


@pytest.mark.parametrize("member", ["large", "pingpong", "streamk", "kheavy", "small", "pp128", "pp64x256", "pp128x176"])
def test_glu_on_each_member(built, member):
    key = ("swiglu", member)
    if key not in built:
        pytest.fail(f"the family no longer keeps {member} for evtc.glu: update this test's list")
    for k, shape in enumerate(SHAPES[:4]):
        _check(built[key], shape, seed=13 * k + 1)


@pytest.mark.parametrize("name", ["swiglu", "geglu"])
def test_glu_through_the_family(built, name):
    for k, shape in enumerate(SHAPES):
        _check(built[(name, "family")], shape, seed=29 * k + 3)


@pytest.mark.parametrize("decomposition,splits", [("stream_k", 1), ("split_k", 2), ("split_k", 3)])
def test_glu_under_stream_k_and_split_k(built, decomposition, splits):
    cfg = built[("swiglu", "streamk")].config.replace(decomposition=decomposition, split_k=splits)
    g = evtc.Gemm(swiglu, a=bf16, b=bf16, config=cfg)  # the same kernel: run-time fields
    for k, shape in enumerate([(64, 4096, 4096, 1), (200, 2560, 3072, 1)]):
        _check(g, shape, seed=41 * k + 5)


def test_end_to_end_against_separate_projections(built):
    """What a user runs: x @ [W_gate; W_up]^T interleaved, against silu(x W_gate^T + b_g) *
    (x W_up^T + b_u) in float64 from the same bf16 weights; a caller's out= is written in place."""
    import torch

    g = built[("swiglu", "family")]
    gen = torch.Generator(device="cuda").manual_seed(7)
    T, H, I = 333, 512, 688
    x = torch.randn(T, H, device="cuda", generator=gen).bfloat16()
    wg, wu = (torch.randn(I, H, device="cuda", generator=gen) / H ** 0.5).bfloat16(), \
        (torch.randn(I, H, device="cuda", generator=gen) / H ** 0.5).bfloat16()
    bg, bu = torch.randn(I, device="cuda", generator=gen), torch.randn(I, device="cuda", generator=gen)
    w, b = evtc.interleave_gate_up(wg, wu), evtc.interleave_gate_up(bg, bu)
    out = torch.full((T, I), float("nan"), device="cuda", dtype=torch.bfloat16)
    got = g(x, w, bias=b, out={"D": out})
    assert got.data_ptr() == out.data_ptr()
    xd = x.double()
    want = torch.nn.functional.silu(xd @ wg.double().T + bg.double()) * (xd @ wu.double().T + bu.double())
    err = (out.double() - want).abs()
    # bf16 output (2^-8 relative) of an f32 computation of K = 512 bf16 products
    assert not bool(out.isnan().any())
    assert bool((err <= 2.0 ** -7 * want.abs() + 1e-3).all()), float(err.max())


def test_torch_backend_runs_a_llama_mlp_as_one_glu_gemm():
    """torch.compile(backend="evtc", fuse_all) of a Llama MLP (nn.Linear gate, up, down, SwiGLU)
    on (B, S, H) bf16 tokens: the gate and up projections become one evtc.glu GEMM over the
    interleaved weights (evtc/torch/gated.py), the down projection another, and the block is at
    least as close to float64 as eager bf16; a second call reads the cached interleaved weights,
    and an in-place weight update is seen (NOTE [The interleaved weights' cache])."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from evtc.torch.backend import make_backend

    class LlamaMLP(nn.Module):
        def __init__(self, h=512, i=1376):
            super().__init__()
            self.gate_proj, self.up_proj = nn.Linear(h, i, bias=False), nn.Linear(h, i, bias=False)
            self.down_proj = nn.Linear(i, h, bias=False)

        def forward(self, x):
            return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))

    torch.manual_seed(0)
    m = LlamaMLP().cuda()
    x = torch.randn(3, 111, 512, device="cuda")
    with torch.no_grad():
        ref = m.double()(x.double())
        m.to(torch.bfloat16)
        xb = x.bfloat16()
        eager = m(xb)
        torch._dynamo.reset()
        gemms = []
        be = make_backend(on_gemm=gemms.append, fuse_all=True)
        f = torch.compile(m, backend=be, fullgraph=True)
        out = f(xb)
        torch.cuda.synchronize()
        assert be.fused == 2 and "glu(acc) {act=silu}" in str(gemms[0].graph), [str(g.graph) for g in gemms]
        e_evtc, e_eager = (out.double() - ref).abs().max().item(), (eager.double() - ref).abs().max().item()
        assert e_evtc <= e_eager + ref.abs().max().item() * 2.0 ** -8, (e_evtc, e_eager)
        again = f(xb)
        assert torch.equal(again, out)
        m.up_proj.weight.mul_(2.0)  # an in-place update: a new interleaved copy
        twice = f(xb)
        ref2 = m.double()(x.double())
        assert (twice.double() - ref2).abs().max().item() <= 2 * e_eager + ref2.abs().max().item() * 2.0 ** -7


def test_torch_backend_chunked_gate_up_and_grouped_mm():
    """The chunked forms (evtc/torch/gated.py): Phi-3's gate_up_proj (one nn.Linear of 2I
    columns, chunked) and a mixture-of-experts up projection (torch._grouped_mm over each
    expert's [W_gate; W_up], chunked; an empty expert), each one evtc.glu GEMM over the
    interleaved weight, against float64."""
    import torch
    import torch.nn.functional as F
    from torch import nn

    from evtc.torch.backend import make_backend

    class Phi3MLP(nn.Module):
        def __init__(self, h=512, i=1376):
            super().__init__()
            self.gate_up_proj = nn.Linear(h, 2 * i, bias=False)
            self.down_proj = nn.Linear(i, h, bias=False)

        def forward(self, x):
            gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
            return self.down_proj(up * F.silu(gate))

    def moe(a, w, offs):
        g, u = torch._grouped_mm(a, w.transpose(1, 2), offs=offs).chunk(2, dim=-1)
        return F.silu(g) * u

    torch.manual_seed(1)
    with torch.no_grad():
        m = Phi3MLP().cuda()
        x = torch.randn(2, 77, 512, device="cuda")
        ref = m.double()(x.double())
        m.to(torch.bfloat16)
        eager = m(x.bfloat16())
        torch._dynamo.reset()
        gemms = []
        be = make_backend(on_gemm=gemms.append, fuse_all=True)
        out = torch.compile(m, backend=be, fullgraph=True)(x.bfloat16())
        assert be.fused == 2 and "glu(acc)" in str(gemms[0].graph)
        e_evtc, e_eager = (out.double() - ref).abs().max().item(), (eager.double() - ref).abs().max().item()
        assert e_evtc <= e_eager + ref.abs().max().item() * 2.0 ** -8, (e_evtc, e_eager)

        a = torch.randn(300, 256, device="cuda").bfloat16()
        w = (torch.randn(6, 2 * 384, 256, device="cuda") / 16).bfloat16()
        offs = torch.tensor([40, 40, 150, 151, 260, 300], dtype=torch.int32, device="cuda")
        torch._dynamo.reset()
        gemms = []
        be = make_backend(on_gemm=gemms.append, fuse_all=True)
        h = torch.compile(moe, backend=be, fullgraph=True)(a, w, offs)
        assert be.fused == 1 and "glu(acc)" in str(gemms[0].graph)
        y = torch.zeros(300, 768, dtype=torch.float64, device="cuda")
        lo = 0
        for e, hi in enumerate(offs.tolist()):
            y[lo:hi] = a[lo:hi].double() @ w[e].double().T
            lo = hi
        want = F.silu(y[:, :384]) * y[:, 384:]
        err = (h.double() - want).abs()
        assert bool((err <= 2.0 ** -7 * want.abs() + 2.0 ** -9 * want.abs().max()).all()), float(err.max())
