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


class Block(nn.Module):
    def __init__(self, d=64, h=256):
        super().__init__()
        self.ln, self.fc1, self.fc2 = nn.LayerNorm(d), nn.Linear(d, h), nn.Linear(h, d)

    def forward(self, x):
        return x + self.fc2(F.gelu(self.fc1(self.ln(x))))


class Checkpointed(nn.Module):
    def __init__(self):
        super().__init__()
        self.a, self.b = Block(), Block()

    def forward(self, x):
        from torch.utils.checkpoint import checkpoint

        return checkpoint(self.b, checkpoint(self.a, x, use_reentrant=False), use_reentrant=False)


def _grads(block, x, fn):
    block.zero_grad()
    x = x.detach().clone().requires_grad_(True)
    y = fn(x)
    (y.float() * torch.linspace(-1, 1, y.numel()).reshape(y.shape)).sum().backward()
    return {"x": x.grad.double(), **{n: p.grad.double() for n, p in block.named_parameters() if p.grad is not None}}


def _close_grads(got, eager, ref):
    assert got.keys() == ref.keys()
    for k, want in ref.items():
        e_evtc, e_eager = (got[k] - want).abs().max().item(), (eager[k] - want).abs().max().item()
        assert e_evtc <= 2 * e_eager + 2.0 ** -8 * want.abs().max().item(), (k, e_evtc, e_eager)


@pytest.mark.parametrize("inductor, config", [(False, None), (True, "max-autotune-no-cudagraphs")],
                         ids=["aot", "inductor_max_autotune"])
def test_activation_checkpointing_fuses_forward_and_backward(inductor, config):
    """checkpoint(block, use_reentrant=False) inside a compiled model (and under a mode): the
    forward GEMMs fuse, the backward's recomputation and data gradients too, and every gradient
    is as close to float64 as eager's."""
    torch.manual_seed(2)
    block = Checkpointed()
    x = torch.randn(2, 24, 64)
    ref = _grads(block.double(), x.double(), block)
    block.bfloat16()
    x = x.bfloat16()
    eager = _grads(block, x, block)
    be = _backend(inductor=inductor, inductor_config=mode_config(config))
    got = _grads(block, x, torch.compile(block, backend=be))
    assert be.fused >= (5 if inductor else 8), be.fused
    _close_grads(got, eager, ref)


class Int8Linear(nn.Module):
    """A weight-only int8 linear as serving stacks write it: the weight dequantized per output
    channel (or per group of 32 inputs) in the activations' dtype, then a GEMM, bias, GELU."""

    def __init__(self, group=None, d=64, n=128):
        super().__init__()
        w = torch.randn(n, d)
        self.group = group
        wg = w.view(n, d // group, group) if group else w
        scale = wg.abs().amax(-1) / 127
        self.register_buffer("q", (wg / scale[..., None]).round().to(torch.int8).view(n, d))
        self.register_buffer("scale", scale)
        self.bias = nn.Parameter(0.1 * torch.randn(n))

    def forward(self, x):
        n, d = self.q.shape
        if self.group is None:
            w = self.q.to(x.dtype) * self.scale[:, None].to(x.dtype)
        else:
            g = self.group
            w = (self.q.view(n, d // g, g).to(x.dtype) * self.scale[..., None].to(x.dtype)).view(n, d)
        return F.gelu(x @ w.T + self.bias)


@pytest.mark.parametrize("group", [None, 32], ids=["per_channel", "per_group"])
def test_weight_only_int8_dequant_then_gemm_fuses(group):
    torch.manual_seed(3)
    block = Int8Linear(group)
    x = torch.randn(2, 24, 64)
    with torch.no_grad():
        ref = block.double()(x.double())
        block.bfloat16()
        x = x.bfloat16()
        eager = block(x)
        be = _backend()
        out = torch.compile(block, backend=be)(x)
    assert be.fused == 1 and "gelu(" in str(GEMMS[0].graph), [str(g.graph) for g in GEMMS]
    assert _err(out, ref) <= _err(eager, ref) + 2.0 ** -8 * ref.abs().max().item()


def _train_step(model, opt, x, y, micro):
    """forward, loss, backward over ``micro`` micro-batches (gradient accumulation), then the
    optimizer's step: one torch.compile'd function (Dynamo breaks it at backward())."""
    opt.zero_grad(set_to_none=True)
    for xs, ys in zip(x.chunk(micro), y.chunk(micro)):
        loss = F.mse_loss(model(xs).float(), ys) / micro
        loss.backward()
    opt.step()
    return loss


def test_a_compiled_train_step_with_accumulation_fuses_and_matches_eager():
    torch.manual_seed(4)
    x, y = torch.randn(4, 24, 64), torch.randn(4, 24, 64)
    blocks = [Block() for _ in range(3)]
    for b in blocks[1:]:
        b.load_state_dict(blocks[0].state_dict())
    ref, eager, ours = blocks[0].double(), blocks[1].bfloat16(), blocks[2].bfloat16()
    opts = [torch.optim.AdamW(b.parameters(), lr=1e-3) for b in blocks]
    be = _backend()
    _train_step(ref, opts[0], x.double(), y.double(), 2)
    _train_step(eager, opts[1], x.bfloat16(), y, 2)
    torch.compile(_train_step, backend=be)(ours, opts[2], x.bfloat16(), y, 2)
    assert be.fused >= 3, be.fused  # fc1 + GELU, fc2 + residual, the backward's dGELU
    # the gradients of the last micro-batch's accumulation, before the step (the step moves
    # every weight by about lr, the same in each)
    grads = [{n: p.grad.double() for n, p in b.named_parameters()} for b in blocks]
    _close_grads(grads[2], grads[1], grads[0])
