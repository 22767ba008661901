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


class ReadsAScalar(nn.Module):
    """A block that reads a value of its own in the middle: a statistic with ``.item()`` (a
    logging or clipping scalar), or the rows a mask selects (data-dependent M)."""

    def __init__(self, kind):
        super().__init__()
        self.kind, self.fc1, self.fc2 = kind, nn.Linear(64, 256), nn.Linear(256, 64)

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        if self.kind == "item":
            return x + self.fc2(h) * (1.0 + 0.0 * h.float().amax().item())
        sel = h[h[..., 0] > 0]  # (u0, 256)
        return F.relu(self.fc2(sel))


@pytest.mark.parametrize("kind, fused", [("item", 2), ("mask", 1)])
def test_scalars_read_inside_the_graph_leave_its_gemms_fused(kind, fused):
    """NOTE [Scalars read inside the graph] (evtc/torch/aten.py): under capture_scalar_outputs
    (and capture_dynamic_output_shape_ops) the ATen trace failed at the ``.item()`` (the
    ``nonzero`` of a mask) and none of the graph's GEMMs fused; now every GEMM of static shape
    does (the one on the selected rows stays torch's)."""
    torch.manual_seed(1)
    block = ReadsAScalar(kind)
    x = torch.randn(2, 24, 64).bfloat16()
    with torch.no_grad():
        ref = block.double()(x.double())
        eager = block.bfloat16()(x)
    be = _backend()
    with torch._dynamo.config.patch(capture_scalar_outputs=True, capture_dynamic_output_shape_ops=True), \
            torch.no_grad():
        out = torch.compile(block, backend=be)(x)
    assert be.fused == fused, [str(g.graph) for g in GEMMS]
    assert out.shape == ref.shape and _err(out, ref) <= _err(eager, ref) + 2.0 ** -8 * ref.abs().max().item()
