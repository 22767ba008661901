"""The torch backend's one-GEMM gated form (evtc/torch/gated.py) without a GPU: which gated MLPs
become one GEMM with evtc.glu over the interleaved weights (2-D and 3-D inputs, biases, each
activation, under Inductor too), which products stay two GEMMs, and the interleaved weights'
cache (NOTE [The interleaved weights' cache]). The fused op's CPU kernel is evtc's float64
interpreter rounded to bf16 (tests/null/test_torch_backend.py)."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from test_torch_backend import GEMMS, compiled, ir  # noqa: E402

ACT = {"silu": F.silu, "gelu": F.gelu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu,
       "sigmoid": torch.sigmoid}


class Gated(nn.Module):
    def __init__(self, d=64, ffn=96, act="silu", bias=False, swap=False):
        super().__init__()
        self.gate, self.up = nn.Linear(d, ffn, bias=bias), nn.Linear(d, ffn, bias=bias)
        self.down = nn.Linear(ffn, d, bias=False)
        self.act, self.swap = ACT[act], swap

    def forward(self, x):
        g, u = self.act(self.gate(x)), self.up(x)
        return self.down(u * g if self.swap else g * u)


def _run(m, x, **kw):
    torch.manual_seed(0)
    with torch.no_grad():
        ref = m.double()(x.double())
        m.to(torch.bfloat16)
        eager = m(x)
    out, fused = compiled(m, x, **kw)
    e_evtc = (out.double() - ref).abs().max().item()
    e_eager = (eager.double() - ref).abs().max().item()
    return fused, e_evtc, e_eager, ref


@pytest.mark.parametrize("act", list(ACT))
@pytest.mark.parametrize("shape", [(40, 64), (2, 20, 64)], ids=["2d", "3d"])
def test_gated_mlp_is_one_glu_gemm_and_the_bare_down_projection_stays_torchs(act, shape):
    torch.manual_seed(1)
    x = torch.randn(*shape).bfloat16()
    fused, e_evtc, e_eager, ref = _run(Gated(act=act), x)
    # the down projection has nothing after it (NOTE [A bare GEMM stays torch's])
    assert fused == 1 and len(GEMMS) == 1, [ir(i) for i in range(len(GEMMS))]
    assert f"glu(acc) {{act={act}}}" in ir(0) and "D = store(%0) : bf16" in ir(0)
    # one rounding of silu(g) * u instead of eager's three: at least as close to float64
    assert e_evtc <= e_eager + ref.abs().max().item() * 2.0 ** -8, (e_evtc, e_eager)


def test_biases_and_either_operand_order():
    torch.manual_seed(2)
    x = torch.randn(3, 8, 64).bfloat16()
    fused, e_evtc, e_eager, ref = _run(Gated(act="silu", bias=True, swap=True), x, inductor=True)
    assert fused == 1 and "glu(%0) {act=silu}" in ir(0) and "add(acc, bias)" in ir(0), ir(0)
    assert e_evtc <= e_eager + ref.abs().max().item() * 2.0 ** -8


class NotGated(nn.Module):
    """Products the gated form must not take: gate and up of different inputs; a gate whose
    value is used twice; an activation without a glu act (tanh)."""

    def __init__(self, d=64, ffn=96, case="two_inputs"):
        super().__init__()
        self.gate, self.up = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False)
        self.case = case

    def forward(self, x):
        if self.case == "two_inputs":
            return F.silu(self.gate(x)) * self.up(x * 2)
        if self.case == "gate_used_twice":
            g = self.gate(x)
            return F.silu(g) * self.up(x) + g
        return torch.tanh(self.gate(x)) * self.up(x)


@pytest.mark.parametrize("case", ["two_inputs", "gate_used_twice", "tanh"])
def test_products_that_are_not_gated_pairs_stay_two_gemms(case):
    torch.manual_seed(3)
    x = torch.randn(40, 64).bfloat16()
    fused, e_evtc, e_eager, ref = _run(NotGated(case=case), x)
    assert all("glu" not in ir(i) for i in range(len(GEMMS))), [ir(i) for i in range(len(GEMMS))]
    # one GEMM takes the other's output as an aux load; that one and the down projection have
    # nothing after them and stay torch's (NOTE [A bare GEMM stays torch's])
    assert fused == 1
    assert e_evtc <= e_eager + ref.abs().max().item() * 2.0 ** -8


def test_interleaved_weights_are_cached_per_version():
    from evtc.torch.gated import clear_interleaved_cache, interleaved as op

    clear_interleaved_cache()
    wg, wu = torch.randn(6, 8), torch.randn(6, 8)
    a = op(wg, wu)
    assert torch.equal(a[0::2], wg) and torch.equal(a[1::2], wu)
    assert op(wg, wu) is a  # a hit: no copy
    with torch.no_grad():
        wg.add_(1.0)  # an in-place update bumps the version: a new copy
    b = op(wg, wu)
    assert b is not a and torch.equal(b[0::2], wg)
    clear_interleaved_cache()
    assert op(wg, wu) is not b
    bias = op(torch.arange(3.0), -torch.arange(3.0))
    assert bias.tolist() == [0.0, -0.0, 1.0, -1.0, 2.0, -2.0]


class Phi3MLP(nn.Module):
    """Phi-3's MLP: one gate_up_proj, chunked in two (transformers' Phi3MLP)."""

    def __init__(self, d=64, ffn=96, bias=False):
        super().__init__()
        self.gate_up_proj = nn.Linear(d, 2 * ffn, bias=bias)
        self.down_proj = nn.Linear(ffn, d, bias=False)

    def forward(self, x):
        gate, up = self.gate_up_proj(x).chunk(2, dim=-1)
        return self.down_proj(up * F.silu(gate))


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("shape", [(40, 64), (2, 20, 64)], ids=["2d", "3d"])
def test_a_chunked_gate_up_projection_is_one_glu_gemm(bias, shape):
    """The two halves of one projection (Phi-3's gate_up_proj): its weight's halves interleaved
    (slices of the parameter, one cached copy), the bias's too."""
    torch.manual_seed(4)
    x = torch.randn(*shape).bfloat16()
    fused, e_evtc, e_eager, ref = _run(Phi3MLP(bias=bias), x)
    # (the bare down projection stays torch's)
    assert fused == 1 and "glu(" in ir(0) and ("add(acc, bias)" in ir(0)) == bias, [ir(i) for i in range(len(GEMMS))]
    assert e_evtc <= e_eager + ref.abs().max().item() * 2.0 ** -8, (e_evtc, e_eager)


def test_a_grouped_mm_chunked_in_two_is_one_grouped_glu_gemm():
    """A mixture-of-experts layer's up projection as torch._grouped_mm over each expert's
    [W_gate; W_up] (E, 2I, H), chunked, silu(g) * u: one evtc.GroupedGemm with evtc.glu over
    the interleaved weights; empty experts included."""
    import evtc
    from test_torch_backend import compiled_grouped

    def moe(a, w, offs):
        g, u = torch._grouped_mm(a, w.transpose(1, 2), offs=offs).chunk(2, dim=-1)
        return F.silu(g) * u

    torch.manual_seed(5)
    a = torch.randn(64, 32).bfloat16()
    w = (torch.randn(4, 96, 32) / 4).bfloat16()
    offs = torch.tensor([10, 10, 40, 64], dtype=torch.int32)
    h, be, made = compiled_grouped(moe, a, w, offs)
    assert be.fused == 1 and isinstance(made[0], evtc.GroupedGemm) and "glu(acc) {act=silu}" in str(made[0].graph)
    assert h.shape == (64, 48)
    y = torch.zeros(64, 96, dtype=torch.float64)
    lo = 0
    for e, hi in enumerate(offs.tolist()):
        y[lo:hi] = a[lo:hi].double() @ w[e].double().T
        lo = hi
    want = F.silu(y[:, :48]) * y[:, 48:]
    assert ((h.double() - want).abs() <= 2.0 ** -8 * want.abs() + 1e-6).all()


def test_the_gated_gemm_is_among_the_kernels_built_with_the_graph(monkeypatch):
    """NOTE [Kernels built when the graph compiles]: the gated GEMM's problem (M, 2I, K) goes to
    the backend's prebuild with the other matches'."""
    from evtc.torch import backend as B

    seen = []
    monkeypatch.setattr(B, "prebuild", seen.extend)
    fused, *_ = _run(Gated(), torch.randn(40, 64).bfloat16())
    assert fused == 1 and [(g.name, p) for g, p, _ in seen] == [(GEMMS[0].name, (40, 192, 64, 1))]


class GluLinear(nn.Module):
    """``F.glu(proj(x), dim=-1)`` (``a * sigmoid(b)`` of the projection's halves), then an output
    projection with a residual."""

    def __init__(self, d=64, inner=128, bias=False):
        super().__init__()
        self.proj, self.out = nn.Linear(d, 2 * inner, bias=bias), nn.Linear(inner, d)

    def forward(self, x):
        return x + self.out(F.glu(self.proj(x), dim=-1))


@pytest.mark.parametrize("bias", [False, True])
def test_f_glu_is_one_glu_gemm(bias):
    """aten.glu has no row in the importer's table: the projection fused alone (its bias) and
    F.glu ran after it. It is the pair of the projection's halves with sigmoid on the second
    (NOTE [The act on either half])."""
    torch.manual_seed(6)
    fused, e_evtc, e_eager, ref = _run(GluLinear(bias=bias), torch.randn(2, 24, 64).bfloat16())
    assert fused == 2 and "glu(" in ir(0) and "{act=sigmoid}" in ir(0) and ("add(acc, bias)" in ir(0)) == bias, \
        [ir(i) for i in range(len(GEMMS))]
    assert e_evtc <= e_eager + ref.abs().max().item() * 2.0 ** -8, (e_evtc, e_eager)
