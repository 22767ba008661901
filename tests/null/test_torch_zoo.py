"""torch.compile(backend="evtc") on the model zoo of issue 38 (tests/torch_zoo.py), on the CPU:
how many GEMMs each block's fusion makes, what their epilogues hold, and that the compiled block
computes what the block computes in float64 at least as closely as eager bf16 does (the fused
op's CPU kernel is evtc's float64 interpreter rounded to the output dtype: tests/null/
test_torch_backend.py)."""

import pytest

torch = pytest.importorskip("torch")

import torch_zoo as Z  # noqa: E402
from test_torch_backend import GEMMS, compiled, ir  # noqa: E402

#: block -> (fused GEMMs, a fragment each epilogue's IR must hold, in the order the backend makes them)
EXPECTED = {
    "gpt2": ["gelu_tanh(", "add(p1, %0)"],                    # fc + bias + tanh GELU; proj + bias + residual
    "gptj": ["gelu_tanh(", "add(p1, %0)", "add(acc, p0)"],     # the parallel residual sums into fc_out
    "neox": ["gelu(", "add(p1, %0)", "add(acc, p0)"],
    "falcon": ["gelu(acc)", "add(acc, p0)", "add(acc, p0)"],
    # gate and up in one GEMM over the interleaved weights (evtc.glu: evtc/torch/gated.py); the
    # down projection has nothing after it and stays torch's (NOTE [A bare GEMM stays torch's])
    "llama": ["glu(acc) {act=silu}"],
    "mixtral_expert": ["glu(acc) {act=silu}"],
    "gemma": ["glu(acc) {act=gelu_tanh}"],
    "t5v11": ["glu(acc) {act=gelu_tanh}"],
    "bert": ["gelu(", "add(p1, %0)"],                         # LayerNorm stays Inductor's
    "bert_attn_out": ["add(p1, %0)"],
    "vit": ["gelu(", "add(p1, %0)"],
    "primer": ["mul(%1, %1)", "add(p1, %0)"],                 # relu(x) ** 2 is one multiply
    # x + gate * fc2(...) in fc2's epilogue; the adaLN projection (a bias, then chunks) stays torch's
    "dit": ["gelu_tanh(", "multiply_add("],
}


@pytest.mark.parametrize("name", list(Z.ZOO))
def test_each_zoo_block_fuses_and_matches_float64(name):
    block, args = Z.make(name, 64, 256, 48)
    with torch.no_grad():
        eager = block(*args)
        ref = block.double()(*[a.double() for a in args])
        block.to(torch.bfloat16)
    out, fused = compiled(block, *args)
    assert fused == len(EXPECTED[name]) == len(GEMMS), (name, fused, [ir(i) for i in range(len(GEMMS))])
    for i, frag in enumerate(EXPECTED[name]):
        assert frag in ir(i), (name, i, ir(i))
    # the fused block is at least as close to float64 as eager bf16 (one rounding per output, not
    # one per op), plus one bf16 spacing of slack for the reductions Inductor runs after it
    e_evtc = (out.double() - ref).abs().max().item()
    e_eager = (eager.double() - ref).abs().max().item()
    spacing = ref.abs().max().item() * 2.0 ** -8
    assert e_evtc <= e_eager + spacing, (name, e_evtc, e_eager)


def test_the_zoo_has_eleven_families():
    families = {"gpt2", "gptj", "neox", "llama", "mixtral_expert", "gemma", "t5v11", "bert", "vit", "primer",
                "falcon", "dit"}
    assert families <= set(Z.ZOO) and set(Z.REAL) == set(Z.ZOO)
