"""Training under ``torch.compile(backend="evtc")`` on the CPU (NOTE [Fusion in training],
evtc/torch/backend.py): AOTAutograd's forward and backward graphs are both fused (the forward
keeps what the backward reads as aux stores; the backward's data-gradient GEMM takes the
activation's derivative and the bias gradient's column sum), and the gradients match eager's
as closely as eager's match float64. The fused op's CPU kernel is evtc's float64 interpreter
(tests/null/test_torch_backend.py)."""

import pytest

torch = pytest.importorskip("torch")

import torch_zoo as Z  # noqa: E402
from test_torch_backend import GEMMS, register  # noqa: E402

from evtc.torch.backend import make_backend  # noqa: E402


def _grads(block, args, fn):
    block.zero_grad()
    x = args[0].detach().clone().requires_grad_(True)
    y = fn(x, *args[1:])
    (y.float() * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
    return {"x": x.grad.double(), **{n: p.grad.double() for n, p in block.named_parameters()}}


#: block -> (fused GEMMs at least: forward + backward; a fragment a backward epilogue holds: the
#: bias gradient's column sum beside the activation's derivative, or SiLU's derivative). The
#: weight-gradient GEMMs and the other GEMMs with nothing after them stay torch's (NOTE [A bare
#: GEMM stays torch's]); under Inductor the test fuses every GEMM (``fuse_all``): ALL of them.
CASES = {"gpt2": (4, "reduce_sum("), "llama": (3, "sigmoid("), "bert": (4, "reduce_sum(")}
ALL = {"gpt2": 5, "llama": 6, "bert": 5}


@pytest.mark.parametrize("inductor", [False, True], ids=["aot", "inductor"])
@pytest.mark.parametrize("name", list(CASES))
def test_forward_and_backward_fuse_and_match_eager(name, inductor):
    if inductor and name != "gpt2":
        pytest.skip("one block through Inductor's C++ on the CPU is enough (minutes each)")
    block, args = Z.make(name, 64, 256, 48)
    ref64 = _grads(block.double(), [a.double() for a in args], block)
    block.to(torch.bfloat16)
    eager = _grads(block, args, block)
    torch._dynamo.reset()
    if inductor:  # compiled by default Inductor first, as a benchmark does: its caches must not serve evtc's
        _grads(block, args, torch.compile(block))
        torch._dynamo.reset()
    GEMMS.clear()
    strides = []  # each call's operands' strides: K-contiguous, as the rewrite's copies made them
    # under Inductor every GEMM fuses, so that the weight gradients' transposed operands (dY^T)
    # reach the op through the rewrite's copies too
    be = make_backend(allow_cpu=True, inductor=inductor, fuse_all=inductor,
                      on_gemm=lambda g: (GEMMS.append(g),
                                         register(g, lambda A, B: strides.append((A.stride(), B.stride())))))
    got = _grads(block, args, torch.compile(block, backend=be))
    least, fragment = CASES[name]
    least = ALL[name] if inductor else least
    assert be.fused >= least, (name, be.fused, [str(g.graph) for g in GEMMS])
    # NOTE [New nodes carry their fake values]: under Inductor the copies before the op were laid
    # out as their transposed sources (the op's own eager copy ran instead, at 0.3 TB/s)
    assert len(strides) >= least and all(a[-1] == 1 and b[-1] == 1 for a, b in strides), strides
    assert any(fragment in str(g.graph) for g in GEMMS), [str(g.graph) for g in GEMMS]
    for k, want in ref64.items():
        e_evtc = (got[k] - want).abs().max().item()
        e_eager = (eager[k] - want).abs().max().item()
        assert e_evtc <= 2 * e_eager + 2.0 ** -8 * want.abs().max().item(), (name, k, e_evtc, e_eager)


_KEPT = ("gelu", "silu", "sigmoid", "tanh", "threshold")


@pytest.mark.parametrize("mode", ["fake", "symbolic"])
def test_backward_ops_no_region_took_are_decomposed(mode):
    """NOTE [Backward ops no region took]: each activation's ``*_backward`` op left in a graph is
    replaced by Inductor's decomposition of it, with static and symbolic sizes alike: only ops
    Inductor lowers remain, and the graph computes what it did."""
    from torch._inductor.decomposition import select_decomp_table
    from torch._inductor.lowering import lowerings
    from torch.fx.experimental.proxy_tensor import make_fx

    from evtc.torch.backend import _decompose

    aten = torch.ops.aten

    def f(g, x, y):
        a = aten.gelu_backward(g, x, approximate="tanh") + aten.gelu_backward(g, y)
        b = aten.threshold_backward(a, y, 0.0)
        c = aten.silu_backward(b, x)
        return aten.sigmoid_backward(c, y) * aten.tanh_backward(c, x)

    xs = [torch.randn(5, 7, dtype=torch.bfloat16) for _ in range(3)]
    gm = make_fx(f, tracing_mode=mode)(*xs)
    kept = {getattr(aten, f"{n}_backward").default for n in _KEPT}
    assert _decompose(gm, kept, select_decomp_table()) == 6
    left = {n.target for n in gm.graph.nodes if n.op == "call_function"}
    assert left and all(t in lowerings for t in left), left - set(lowerings)
    torch.testing.assert_close(gm(*xs), f(*xs), rtol=0, atol=0)


def test_activation_after_no_gemm_trains_under_inductor_in_ci(monkeypatch):
    """An activation no GEMM region takes (float64, which no evtc kernel computes: nothing fuses)
    leaves its ``gelu_backward`` in the backward graph; with ``CI`` set Inductor asserted on it
    instead of running it (NOTE [Backward ops no region took]). It compiles, and its gradients
    match float64 eager's."""
    monkeypatch.setenv("CI", "1")

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.scale = torch.nn.Parameter(torch.rand(64) + 0.5)
            self.proj = torch.nn.Linear(64, 32)

        def forward(self, x):
            return self.proj(torch.nn.functional.gelu(x * self.scale))

    torch.manual_seed(0)
    block, x = Block(), torch.randn(48, 64)
    ref64 = _grads(block.double(), [x.double()], block)
    torch._dynamo.reset()
    be = make_backend(allow_cpu=True, inductor=True, on_gemm=register)
    got = _grads(block, [x.double()], torch.compile(block, backend=be))
    assert be.fused == 0
    for k, want in ref64.items():
        torch.testing.assert_close(got[k], want, rtol=1e-9, atol=1e-9, msg=k)
