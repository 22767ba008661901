"""torch.compile(backend="evtc") on how users drive a model rather than on its blocks: vmap over
stacked models, scalars read inside the graph, activation checkpointing, weight-only quantized
linears, a compiled train step, modes in training; on the CPU with evtc's float64 interpreter as
each fused op's kernel (tests/null/test_torch_backend.py): fused counts, and outputs and
gradients as close to float64 as eager bf16's."""

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from test_torch_backend import GEMMS, register  # noqa: E402

from evtc.torch.backend import make_backend, mode_config  # noqa: E402


def _backend(**kw):
    torch._dynamo.reset()
    GEMMS.clear()
    kw.setdefault("inductor", False)
    return make_backend(allow_cpu=True, on_gemm=lambda g: (GEMMS.append(g), register(g)), **kw)


def _err(got, ref):
    return (got.double() - ref.double()).abs().max().item()


class Small(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = nn.Linear(64, 128), nn.Linear(128, 64)

    def forward(self, x):
        return self.b(F.relu(self.a(x)))


@pytest.mark.parametrize("grad", [False, True], ids=["inference", "training"])
def test_vmap_over_stacked_models_compiles(grad):
    """NOTE [A failed trace restores functorch's stack] (evtc/torch/aten.py): the ATen trace of
    a torch.func.vmap graph failed with vmap's layer pushed, and torch.compile raised "Guard
    failed on the same frame it was created"; it runs now (unfused: per-model biases are
    per-batch row vectors)."""
    from torch.func import functional_call, stack_module_state, vmap

    torch.manual_seed(0)
    models = [Small().bfloat16() for _ in range(4)]
    params, _ = stack_module_state(models)
    params = {k: v.detach().requires_grad_(grad) for k, v in params.items()}
    base = Small().to("meta")

    def ensemble(p, x):
        return vmap(lambda p, x: functional_call(base, (p, {}), (x,)), in_dims=(0, None))(p, x)

    x = torch.randn(24, 64).bfloat16()
    be = _backend()
    with torch.set_grad_enabled(grad):
        y = torch.compile(ensemble, backend=be)(params, x)
    with torch.no_grad():
        ref = torch.stack([m.double()(x.double()) for m in models])
        eager = torch.stack([m.bfloat16()(x) for m in models])
    assert y.shape == (4, 24, 64) and _err(y, ref) <= _err(eager, ref) + 2.0 ** -8 * ref.abs().max().item()
    if grad:
        y.float().sum().backward()
        assert all(p.grad is not None for p in params.values())
