"""The model zoo of issue 38: the blocks of eleven model families as their reference code writes
them in PyTorch (nn.Linear / F.linear / matmul / addmm; bias or not), at any width. The CPU tests
(tests/null/test_torch_zoo.py) count what ``torch.compile(backend="evtc")`` fuses in each and
compare it with eager; ``benchmarks/bench_models.py`` times them on the GPU.

Attention's own batched matmuls are not GEMM epilogues, so the attention blocks take the
attention's context (the output of softmax(QK^T)V, flattened over heads) as an input and keep the
projections around it. Dimensions are arguments (the benchmark uses each family's real ones:
``REAL``); every block is ``forward(x)`` over (tokens, d) or (batch, seq, d) and its parameters.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn


class GPT2MLP(nn.Module):
    """GPT-2's MLP (transformers' GPT2MLP): Conv1D = addmm, tanh GELU ("gelu_new"), residual."""

    def __init__(self, d=64, ffn=256):
        super().__init__()
        self.c_fc_w, self.c_fc_b = nn.Parameter(torch.randn(d, ffn) * d ** -0.5), nn.Parameter(torch.zeros(ffn))
        self.c_proj_w, self.c_proj_b = nn.Parameter(torch.randn(ffn, d) * ffn ** -0.5), nn.Parameter(torch.zeros(d))

    def forward(self, x):
        h = torch.addmm(self.c_fc_b, x, self.c_fc_w)
        h = F.gelu(h, approximate="tanh")
        return x + torch.addmm(self.c_proj_b, h, self.c_proj_w)


class ParallelBlock(nn.Module):
    """GPT-J / GPT-NeoX / Falcon: attention and MLP side by side on one LayerNorm, summed with the
    residual (``x + attn_out(ctx) + fc_out(gelu(fc_in(ln(x))))``)."""

    def __init__(self, d=64, ffn=256, bias=True, approximate="none"):
        super().__init__()
        self.ln = nn.LayerNorm(d)
        self.out_proj = nn.Linear(d, d, bias=False)
        self.fc_in, self.fc_out = nn.Linear(d, ffn, bias=bias), nn.Linear(ffn, d, bias=bias)
        self.approximate = approximate

    def forward(self, x, ctx):
        h = self.ln(x)
        mlp = self.fc_out(F.gelu(self.fc_in(h), approximate=self.approximate))
        return x + self.out_proj(ctx) + mlp


class GatedMLP(nn.Module):
    """Llama / Mistral / Mixtral and Qwen-MoE experts (SwiGLU), Gemma (GeGLU, tanh), T5 v1.1
    (gated "gelu_new"): ``down(act(gate(x)) * up(x))``, no biases."""

    def __init__(self, d=64, ffn=256, act="silu"):
        super().__init__()
        self.gate, self.up, self.down = nn.Linear(d, ffn, bias=False), nn.Linear(d, ffn, bias=False), \
            nn.Linear(ffn, d, bias=False)
        self.act = {"silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"), "relu": F.relu}[act]

    def forward(self, x):
        return self.down(self.act(self.gate(x)) * self.up(x))


class BertFFN(nn.Module):
    """BERT's intermediate + output: ``LayerNorm(x + dense2(gelu(dense1(x))))`` (erf GELU, post-LN)."""

    def __init__(self, d=64, ffn=256):
        super().__init__()
        self.dense1, self.dense2 = nn.Linear(d, ffn), nn.Linear(ffn, d)
        self.ln = nn.LayerNorm(d, eps=1e-12)

    def forward(self, x):
        return self.ln(x + self.dense2(F.gelu(self.dense1(x))))


class ViTMLP(nn.Module):
    """ViT's pre-LN MLP: ``x + fc2(gelu(fc1(ln(x))))``."""

    def __init__(self, d=64, ffn=256):
        super().__init__()
        self.ln = nn.LayerNorm(d, eps=1e-6)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class PrimerMLP(nn.Module):
    """Primer's squared-ReLU MLP: ``x + fc2(relu(fc1(x)) ** 2)``."""

    def __init__(self, d=64, ffn=256):
        super().__init__()
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x):
        return x + self.fc2(torch.relu(self.fc1(x)) ** 2)


class DiTBlock(nn.Module):
    """DiT's adaLN-Zero MLP half: ``c`` (one conditioning vector a sequence) gives shift, scale and
    gate through ``Linear(SiLU(c))``; ``x + gate * fc2(gelu_tanh(fc1(modulate(ln(x)))))`` with
    ``modulate(h) = h * (1 + scale) + shift``."""

    def __init__(self, d=64, ffn=256):
        super().__init__()
        self.ln = nn.LayerNorm(d, elementwise_affine=False, eps=1e-6)
        self.ada = nn.Linear(d, 3 * d)
        self.fc1, self.fc2 = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x, c):
        shift, scale, gate = self.ada(F.silu(c)).chunk(3, dim=-1)
        h = self.ln(x) * (1 + scale.unsqueeze(1)) + shift.unsqueeze(1)
        return x + gate.unsqueeze(1) * self.fc2(F.gelu(self.fc1(h), approximate="tanh"))


class AttnProjResidualLN(nn.Module):
    """An attention output projection, residual and LayerNorm (BERT's self-output):
    ``LayerNorm(x + dense(ctx))``."""

    def __init__(self, d=64):
        super().__init__()
        self.dense = nn.Linear(d, d)
        self.ln = nn.LayerNorm(d, eps=1e-12)

    def forward(self, x, ctx):
        return self.ln(x + self.dense(ctx))


#: name -> (constructor, its keyword arguments, the extra inputs' kinds: "ctx" a (tokens, d)
#: context, "cond" a (batch, d) conditioning vector), the blocks of eleven families
ZOO = {
    "gpt2": (GPT2MLP, {}, ()),
    "gptj": (ParallelBlock, {"approximate": "tanh"}, ("ctx",)),
    "neox": (ParallelBlock, {}, ("ctx",)),
    "falcon": (ParallelBlock, {"bias": False}, ("ctx",)),
    "llama": (GatedMLP, {"act": "silu"}, ()),
    "mixtral_expert": (GatedMLP, {"act": "silu"}, ()),
    "gemma": (GatedMLP, {"act": "gelu_tanh"}, ()),
    "t5v11": (GatedMLP, {"act": "gelu_tanh"}, ()),
    "bert": (BertFFN, {}, ()),
    "bert_attn_out": (AttnProjResidualLN, {}, ("ctx",)),
    "vit": (ViTMLP, {}, ()),
    "primer": (PrimerMLP, {}, ()),
    "dit": (DiTBlock, {}, ("cond",)),
}

#: the real widths (d_model, ffn) the benchmark uses, from each model's config
REAL = {"gpt2": (1600, 6400), "gptj": (4096, 16384), "neox": (6144, 24576), "falcon": (4544, 18176),
        "llama": (4096, 14336), "mixtral_expert": (4096, 14336), "gemma": (3072, 24576), "t5v11": (2048, 5120),
        "bert": (1024, 4096), "bert_attn_out": (1024, 4096), "vit": (1024, 4096), "primer": (2048, 8192),
        "dit": (1152, 4608)}


def make(name: str, d: int, ffn: int, tokens: int, *, dtype=torch.bfloat16, device="cpu", seed=0):
    """(block, its inputs) for ``name`` at widths ``d``, ``ffn`` and ``tokens`` rows (DiT: one
    sequence of ``tokens`` under one conditioning vector)."""
    cls, kw, extra = ZOO[name]
    torch.manual_seed(seed)
    block = (cls(d, **kw) if cls is AttnProjResidualLN else cls(d, ffn, **kw)).to(dtype=dtype, device=device)
    for p in block.parameters():  # weights O(1/sqrt(fan-in)), biases O(0.1)
        with torch.no_grad():
            if p.dim() == 1:
                p.copy_(0.1 * torch.randn_like(p))
    x = torch.randn(tokens, d, dtype=dtype, device=device)
    args = [x]
    for e in extra:
        if e == "ctx":
            args.append(torch.randn(tokens, d, dtype=dtype, device=device))
        else:
            args[0] = x.unsqueeze(0)
            args.append(torch.randn(1, d, dtype=dtype, device=device))
    return block, args
