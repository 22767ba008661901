"""torch.compile(backend="evtc") on more model families' blocks, as their users write them
(transformers' and peft's modules), on the CPU with evtc's float64 interpreter as each fused op's
kernel (tests/null/test_torch_backend.py): fused counts, and outputs as close to float64 as eager's."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from test_torch_backend import GEMMS, register  # noqa: E402

from evtc.torch.backend import make_backend  # noqa: E402


def _close(out, block, args):
    """``out`` at least as close to the block's float64 value as eager's, plus one spacing of
    the output's dtype (one rounding per output where eager rounds after every op)."""
    with torch.no_grad():
        eager = block(*args)
        ref = block.double()(*[a.double() for a in args])
        block.to(args[0].dtype)
    e_evtc = (out.double() - ref).abs().max().item()
    e_eager = (eager.double() - ref).abs().max().item()
    assert out.shape == eager.shape and out.dtype == eager.dtype
    assert e_evtc <= e_eager + ref.abs().max().item() * 2.0 ** -8, (e_evtc, e_eager)


def _backend():
    torch._dynamo.reset()
    GEMMS.clear()
    return make_backend(allow_cpu=True, inductor=False, on_gemm=lambda g: (GEMMS.append(g), register(g)))


class SamMLP(nn.Module):
    """SAM's ViT MLP on (B, H, W, C) tokens: LayerNorm (a float eps), lin1, GELU, lin2, residual."""

    def __init__(self, d=64, mlp=256):
        super().__init__()
        self.layer_norm2 = nn.LayerNorm(d, eps=1e-6)
        self.lin1, self.lin2, self.act = nn.Linear(d, mlp), nn.Linear(mlp, d), nn.GELU()

    def forward(self, x):
        return x + self.lin2(self.act(self.lin1(self.layer_norm2(x))))


class LoraLinear(nn.Module):
    """peft's LoRA Linear: ``base_layer(x) + lora_B(lora_A(dropout(x))) * scaling`` (a float)."""

    def __init__(self, d=64, n=128, r=16, alpha=32):
        super().__init__()
        self.base_layer = nn.Linear(d, n)
        self.lora_A, self.lora_B = nn.Linear(d, r, bias=False), nn.Linear(r, n, bias=False)
        self.lora_dropout, self.scaling = nn.Identity(), alpha / r

    def forward(self, x):
        result = self.base_layer(x)
        return result + self.lora_B(self.lora_A(self.lora_dropout(x))) * self.scaling


@pytest.mark.parametrize("cls, shapes, per_call", [
    (SamMLP, [(2, 4, 4, 64), (2, 5, 5, 64), (1, 3, 7, 64)], 2),
    # (lora_A's GEMM has nothing after it: torch's, NOTE [A bare GEMM stays torch's])
    (LoraLinear, [(2, 16, 64), (2, 13, 64), (3, 7, 64)], 2),
], ids=["sam_mlp_layernorm_eps", "lora_scaling"])
def test_dynamic_true_fuses_a_graph_that_reads_a_python_float(cls, shapes, per_call):
    """NOTE [Unspecialized floats] (evtc/torch/regions.py): under dynamic=True Dynamo passes each
    float a module reads (LayerNorm's eps, LoRA's scaling) as a 0-d float64 input read by
    .item(); the trace on fake tensors failed there and nothing in the graph fused."""
    torch.manual_seed(0)
    block = cls().bfloat16()
    be = _backend()
    f = torch.compile(block, backend=be, dynamic=True)
    for i, shape in enumerate(shapes):
        x = torch.randn(*shape).bfloat16()
        with torch.no_grad():
            out = f(x)
        assert be.fused == per_call * (i + 1), (shape, be.fused)
        _close(out, block, [x])
    if cls is LoraLinear:  # the scaling is a constant of lora_B's epilogue
        assert any("mul(acc, 2.0)" in str(g.graph) for g in GEMMS), [str(g.graph) for g in GEMMS]


class ScaledHead(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 128)

    def forward(self, x, scale: float):
        return F.relu(self.fc(x)) * scale


@pytest.mark.parametrize("dynamic", [None, True], ids=["automatic", "dynamic"])
def test_a_float_argument_traced_as_a_constant_is_part_of_the_signature(dynamic):
    """A float argument that changes between calls (Dynamo unspecializes it after the first
    change, or at once under dynamic=True) is traced as its value: each value is compiled once
    and every call computes with its own value (NOTE [Unspecialized floats])."""
    torch.manual_seed(1)
    block = ScaledHead().bfloat16()
    be = _backend()
    f = torch.compile(block, backend=be, dynamic=dynamic)
    x = torch.randn(8, 64).bfloat16()
    ref = F.relu(x.double() @ block.fc.weight.double().T + block.fc.bias.double())
    for scale in (0.5, 2.0, 3.0, 0.5, 2.0):
        with torch.no_grad():
            y = f(x, scale)
        want = ref * scale
        assert ((y.double() - want).abs() <= 2.0 ** -8 * want.abs() + 1e-30).all(), scale  # one bf16 rounding
    assert be.fused >= 3  # (0.5, 2.0 and 3.0 each fused once; the repeats reuse them)
    consts = {str(g.graph).split("mul(%1, ")[1].split(")")[0] for g in GEMMS if "mul(%1, " in str(g.graph)}
    assert {"2.0", "3.0"} <= consts, [str(g.graph) for g in GEMMS]


class GEGLU(nn.Module):
    """diffusers' GEGLU (Stable Diffusion's feed-forward): ``h, gate = proj(x).chunk(2, -1);
    h * gelu(gate)``, the act on the second half, with a bias."""

    def __init__(self, d=64, inner=128):
        super().__init__()
        self.proj, self.out = nn.Linear(d, 2 * inner), nn.Linear(inner, d)

    def forward(self, x):
        hidden_states, gate = self.proj(x).chunk(2, dim=-1)
        return x + self.out(hidden_states * F.gelu(gate))


class SplitSiluGate(nn.Module):
    """A Mamba-style gate written with ``split([I, I])``: ``x, z = in_proj(h).split(...); x *
    silu(z)`` (no bias)."""

    def __init__(self, d=64, inner=128):
        super().__init__()
        self.in_proj, self.out_proj = nn.Linear(d, 2 * inner, bias=False), nn.Linear(inner, d, bias=False)

    def forward(self, h):
        xz = self.in_proj(h)
        x, z = xz.split([xz.shape[-1] // 2, xz.shape[-1] // 2], dim=-1)
        return self.out_proj(x * F.silu(z))


@pytest.mark.parametrize("cls, act", [(GEGLU, "gelu"), (SplitSiluGate, "silu")], ids=["diffusers_geglu", "split_silu"])
def test_the_act_on_the_second_half_is_one_glu_gemm(cls, act):
    """NOTE [The act on either half] (evtc/torch/gated.py): a gate on the projection's second
    half (and a split([I, I]) for chunk(2)) was no gated pair: the projection ran alone and the
    product went to Inductor. It is one GEMM with evtc.glu now, its weights' (and bias's) halves
    taken in the act's order."""
    torch.manual_seed(2)
    block = cls()
    with torch.no_grad():
        for p in block.parameters():
            if p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))
    block = block.bfloat16()
    x = torch.randn(2, 24, 64).bfloat16()
    be = _backend()
    with torch.no_grad():
        out = torch.compile(block, backend=be, fullgraph=True)(x)
    graphs = [str(g.graph) for g in GEMMS]
    # GEGLU's out projection adds the residual; SplitSiluGate's has nothing after it (torch's)
    assert be.fused == (2 if cls is GEGLU else 1) and f"{{act={act}}}" in graphs[0] and "glu(" in graphs[0], graphs
    _close(out, block, [x])
