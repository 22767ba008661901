"""torch.compile(backend="evtc") without a GPU (evtc/torch_backend.py): which FX patterns fuse,
how many, and that the compiled model computes what eager does. The fused op's CPU kernel here is
evtc's float64 interpreter rounded to the output dtype (registered for each Gemm the backend
makes), so the numbers check the rewrite: the arguments, the reshapes, the epilogue's expression."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from evtc.ir.interpret import interpret
from evtc.torch_backend import make_backend


def register(g):
    op = g.torch_op()

    def cpu(A, B, *rest):
        kw = dict(zip(op.tensor_names + op.scalar_names, rest))
        acc = A.double().numpy() @ B.double().numpy().T
        res = interpret(g.graph, acc, {k: (v.double().numpy() if torch.is_tensor(v) else v) for k, v in kw.items()})
        o = g.graph.outputs[0]
        return torch.from_numpy(np.asarray(res[o.name])[0]).to(getattr(torch, o.dtype.torch))

    torch.library.register_kernel(op.qualname, "cpu", cpu)


def compiled(model, *args, inductor=False, **kw):
    torch._dynamo.reset()
    be = make_backend(allow_cpu=True, on_gemm=register, inductor=inductor, **kw)
    with torch.no_grad():
        out = torch.compile(model, backend=be, fullgraph=True)(*args)
    return out, be.fused


def ulp_bf16(x):
    return torch.finfo(torch.bfloat16).eps * torch.clamp(x.abs(), min=2.0 ** -126)


class LinearGelu(nn.Module):
    def __init__(self, k=32, n=64):
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x):
        return F.gelu(self.fc(x), approximate="tanh")


class MLPBlock(nn.Module):
    def __init__(self, d=32, ffn=64):
        super().__init__()
        self.up, self.down = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x)))


def test_linear_bias_gelu_is_one_op_and_correctly_rounded():
    torch.manual_seed(0)
    m = LinearGelu().to(torch.bfloat16)
    x = torch.randn(3, 5, 32).bfloat16()
    y, fused = compiled(m, x)
    assert fused == 1 and y.shape == (3, 5, 64) and y.dtype == torch.bfloat16
    ref = F.gelu(x.double() @ m.fc.weight.double().T + m.fc.bias.double(), approximate="tanh")
    assert ((y.double() - ref).abs() <= 0.5 * ulp_bf16(ref) + 1e-30).all()  # one rounding, as the kernel


def test_mlp_block_with_residual_fuses_both_linears_under_inductor():
    torch.manual_seed(1)
    m = MLPBlock().to(torch.bfloat16)
    x = torch.randn(16, 32).bfloat16()
    y, fused = compiled(m, x, inductor=True)
    assert fused == 2
    h = F.gelu(x.double() @ m.up.weight.double().T + m.up.bias.double()).to(torch.bfloat16).double()
    ref = x.double() + h @ m.down.weight.double().T + m.down.bias.double()
    assert ((y.double() - ref).abs() <= ulp_bf16(ref) + 1e-30).all()


def test_what_evtc_cannot_run_stays_unfused():
    m = LinearGelu(k=30, n=64).to(torch.bfloat16)  # K not a multiple of 8
    x = torch.randn(4, 30).bfloat16()
    y, fused = compiled(m, x)
    assert fused == 0
    with torch.no_grad():
        assert torch.equal(y, m(x))
    m = LinearGelu().float()  # f32 operands
    assert compiled(m, torch.randn(4, 32))[1] == 0
    m = LinearGelu().to(torch.bfloat16)  # CPU tensors without allow_cpu
    torch._dynamo.reset()
    be = make_backend(inductor=False)
    with torch.no_grad():
        torch.compile(m, backend=be)(torch.randn(4, 32).bfloat16())
    assert be.fused == 0
    torch._dynamo.reset()  # a graph that needs gradients: the op has no autograd formula
    be = make_backend(allow_cpu=True, on_gemm=register, inductor=False)
    torch.compile(m, backend=be)(torch.randn(4, 32).bfloat16())
    assert be.fused == 0


def test_a_chain_value_used_elsewhere_ends_the_match():
    class TwoUsers(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 64)

        def forward(self, x):
            t = self.fc(x)
            return torch.relu(t), t * 2.0

    m = TwoUsers().to(torch.bfloat16)
    x = torch.randn(8, 32).bfloat16()
    (a, b), fused = compiled(m, x)
    assert fused == 1  # the bare linear (with its bias); relu and * 2 stay outside
    ref = x.double() @ m.fc.weight.double().T + m.fc.bias.double()
    assert ((b.double() - 2 * ref).abs() <= 2 * ulp_bf16(2 * ref) + 1e-30).all()
    assert ((a.double() - ref.clamp(min=0)).abs() <= ulp_bf16(ref) + 1e-30).all()


def test_backend_is_registered_under_its_name():
    import torch._dynamo

    assert "evtc" in torch._dynamo.list_backends()
