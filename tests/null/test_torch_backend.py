"""torch.compile(backend="evtc") without a GPU (evtc/torch/backend.py): which FX patterns fuse,
how many, and that the compiled model computes what eager does, within one rounding of the
float64 value. The fused op's CPU kernel here is evtc's float64 interpreter rounded to the output
dtypes (registered for each Gemm the backend makes), so the numbers check the rewrite: the
operands, the reshapes, the epilogue's expression, the extra outputs and the reductions."""

import copy

import numpy as np
import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from evtc.ir.interpret import interpret
from evtc.ir.nodes import Store
from evtc.torch.backend import make_backend

from torch_models import Fp8Out, LayerNormStats, LinearGelu, MLPBlock, ulp, within_half_ulp  # noqa: E402


def binder_layout(name, v):
    """Assert what the GPU call's binder (evtc/runtime/bind.py) asks of an epilogue tensor that
    the CPU kernel is not bound to check: unit stride along the last dimension, no row stride of
    0 (an expanded tensor), no negative stride, and an M x N tensor's rows starting 16-byte
    aligned (the op's inputs reach the GPU kernel as the rewrite laid them out: NOTE [Epilogue
    tensors in the binder's layout] in evtc/torch/regions.py)."""
    assert all(st >= 0 for st in v.stride()), (name, v.stride())
    if v.dim() and v.shape[-1] > 1:
        assert v.stride(-1) == 1, (name, tuple(v.shape), v.stride())
    if v.dim() >= 2 and v.shape[-2] > 1:
        assert v.stride(-2) >= v.shape[-1], (name, tuple(v.shape), v.stride())
        assert (v.storage_offset() * v.element_size()) % 16 == 0 and (v.stride(-2) * v.element_size()) % 16 == 0, \
            (name, v.storage_offset(), v.stride())


def register(g, on_call=None):
    """A CPU kernel for ``g``'s op: the float64 interpreter rounded to each output's dtype
    (``on_call(A, B)`` first, where given), its epilogue tensors laid out as the GPU call's
    binder takes them (:func:`binder_layout`)."""
    op = g.torch_op()

    def cpu(A, B, *rest):
        if on_call is not None:
            on_call(A, B)
        kw = dict(zip(op.tensor_names + op.scalar_names, rest))
        for k, v in kw.items():
            if torch.is_tensor(v):
                binder_layout(k, v)
        acc = A.double().numpy() @ np.swapaxes(B.double().numpy(), -1, -2)
        res = interpret(g.graph, acc, {k: (v.double().numpy() if torch.is_tensor(v) else v) for k, v in kw.items()})
        outs = []
        for o in g.graph.outputs:
            x = torch.from_numpy(np.asarray(res[o.name])).to(getattr(torch, o.dtype.torch))
            outs.append(x if A.dim() == 3 else x[0])
        return outs[0] if len(outs) == 1 else tuple(outs)

    torch.library.register_kernel(op.qualname, "cpu", cpu)


GEMMS: list = []


def compiled(model, *args, inductor=False, **kw):
    torch._dynamo.reset()
    GEMMS.clear()

    def on_gemm(g):
        GEMMS.append(g)
        register(g)

    be = make_backend(allow_cpu=True, on_gemm=on_gemm, inductor=inductor, **kw)
    with torch.no_grad():
        out = torch.compile(model, backend=be, fullgraph=True)(*args)
    return out, be.fused


def ir(i=0):
    return str(GEMMS[i].graph)


def test_linear_bias_gelu_is_one_op_and_correctly_rounded():
    torch.manual_seed(0)
    m = LinearGelu().to(torch.bfloat16)
    x = torch.randn(3, 5, 32).bfloat16()
    y, fused = compiled(m, x)
    assert fused == 1 and y.shape == (3, 5, 64) and y.dtype == torch.bfloat16
    assert "gelu_tanh(%0)" in ir() and "D = store(%1) : bf16" in ir()
    ref = F.gelu(x.double() @ m.fc.weight.double().T + m.fc.bias.double(), approximate="tanh")
    within_half_ulp(y, ref, "bf16", 2.0 ** -20 * ref.abs())  # one rounding, as the kernel


def test_mlp_block_with_residual_fuses_both_linears_under_inductor():
    torch.manual_seed(1)
    m = MLPBlock().to(torch.bfloat16)
    x = torch.randn(16, 32).bfloat16()
    y, fused = compiled(m, x, inductor=True)
    assert fused == 2
    assert "gelu(%0)" in ir(0) and "p1: bf16 aux" in ir(1) and "add(p1, %0)" in ir(1), (ir(0), ir(1))
    h = F.gelu(x.double() @ m.up.weight.double().T + m.up.bias.double()).to(torch.bfloat16).double()
    ref = x.double() + h @ m.down.weight.double().T + m.down.bias.double()
    assert ((y.double() - ref).abs() <= ulp(ref) + 1e-30).all()


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
    # (a graph that needs gradients fuses its forward and backward graphs: test_torch_training.py)


def test_values_used_outside_the_match_become_extra_outputs():
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
    assert fused == 1 and "D = store" in ir() and "aux1 = store" in ir()  # one kernel, two outputs
    ref = x.double() @ m.fc.weight.double().T + m.fc.bias.double()
    within_half_ulp(a, ref.clamp(min=0), "bf16", 2.0 ** -20 * ref.abs())
    within_half_ulp(b, 2 * ref, "bf16", 2.0 ** -19 * ref.abs())


class Spellings(nn.Module):
    """matmul, addmm and bmm written without nn.Linear, each with an epilogue."""

    def forward(self, x, w, b, a3, b3, y):
        return (torch.relu(x @ w.T + b), torch.addmm(b, x, w.t(), beta=0.5, alpha=2.0) * 2,
                torch.bmm(a3, b3).sigmoid(), torch.matmul(x, y) - 1)


def test_matmul_addmm_bmm_fuse_with_their_epilogues():
    g = torch.Generator().manual_seed(4)
    args = [torch.randn(*s, generator=g).bfloat16() for s in ((16, 32), (64, 32), (64,), (3, 16, 32), (3, 32, 24),
                                                                (32, 40))]
    (r, s2, sg, sub), fused = compiled(Spellings(), *args)
    assert fused == 4
    assert [o.name for o in GEMMS[2].graph.outputs] == ["D"] and "sigmoid(acc)" in ir(2)
    x, w, b, a3, b3, y = (t.double() for t in args)
    h = x @ w.T
    within_half_ulp(r, (h + b).clamp(min=0), "bf16", 2.0 ** -20 * (h.abs() + b.abs()))
    within_half_ulp(s2, 2 * (0.5 * b + 2 * h), "bf16", 2.0 ** -19 * (h.abs() + b.abs()))
    assert sg.shape == (3, 16, 24)
    within_half_ulp(sg, torch.sigmoid(torch.bmm(a3, b3)), "bf16", 2.0 ** -20)
    within_half_ulp(sub, x @ y - 1, "bf16", 2.0 ** -20 * ((x @ y).abs() + 1))  # B: a contiguous copy of y.T


def test_layernorm_statistics_are_extra_outputs_of_the_gemm():
    torch.manual_seed(5)
    m = LayerNormStats().to(torch.bfloat16)
    x = torch.randn(2, 8, 32).bfloat16()
    (y, h, mu, ms), fused = compiled(m, x, inductor=True)
    assert fused == 1
    text = ir()
    assert text.count("reduce_sum(") == 2 and "dim=1" in text and "mul(%0, %0)" in text, text
    assert mu.shape == ms.shape == (2, 8, 1) and mu.dtype == torch.bfloat16
    h64 = x.double() @ m.fc.weight.double().T + m.fc.bias.double()
    within_half_ulp(h, h64, "bf16", 2.0 ** -20 * h64.abs())
    sum_slack = 64 * 2.0 ** -23 * h64.abs().mean(-1, keepdim=True)  # f32 accumulation of 64 terms
    within_half_ulp(mu, h64.mean(-1, keepdim=True), "bf16", sum_slack)
    within_half_ulp(ms, (h64 * h64).mean(-1, keepdim=True), "bf16", sum_slack * h64.abs().max())
    h_, mu_, ms_ = h.double(), mu.double(), ms.double()  # Inductor's part, from the fused outputs
    want = (h_ - mu_) * torch.rsqrt(ms_ - mu_ * mu_ + 1e-5)
    within_half_ulp(y, want, "bf16", 2.0 ** -18 * (want.abs() + 1))  # f32 arithmetic, one rounding


@pytest.mark.parametrize("scale", [0.5, "tensor"])
def test_fp8_output_with_its_amax_is_one_gemm(scale):
    torch.manual_seed(6)
    m = Fp8Out().to(torch.bfloat16)
    x = torch.randn(24, 32).bfloat16() * 4
    s = torch.tensor(0.75) if scale == "tensor" else scale
    (q, amax), fused = compiled(m, x, s)
    assert fused == 1 and q.dtype == torch.float8_e4m3fn and amax.shape == () and amax.dtype == torch.bfloat16
    text = ir()
    assert "D = store(" in text and ": e4m3" in text and "reduce_max(" in text
    assert ("devscalar" in text) == (scale == "tensor")  # a 0-d tensor is a runtime scalar, a number a constant
    y64 = (x.double() @ m.fc.weight.double().T + m.fc.bias.double()).clamp(min=0)
    sv = float(s)
    within_half_ulp(q.double(), sv * y64, "e4m3", 2.0 ** -20 * sv * y64)
    within_half_ulp(amax, y64.abs().max(), "bf16", 2.0 ** -20 * y64.abs().max())


def test_an_operand_computed_from_the_match_stays_outside():
    class Cycle(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 64)

        def forward(self, x):
            h = self.fc(x)
            return h * h.sum(-1, keepdim=True)  # h * (a reduction of h): can't be one kernel

    torch.manual_seed(7)
    m = Cycle().to(torch.bfloat16)
    x = torch.randn(8, 32).bfloat16()
    y, fused = compiled(m, x)
    assert fused == 1 and [o.name for o in GEMMS[0].graph.outputs] == ["D", "r0"]
    h64 = x.double() @ m.fc.weight.double().T + m.fc.bias.double()
    ref = h64 * h64.sum(-1, keepdim=True)
    # three roundings to bf16 (h, its sum, the product outside) and the sum's f32 accumulation
    slack = 3 * 2.0 ** -8 * ref.abs() + h64.abs() * 64 * 2.0 ** -23 * h64.abs().mean(-1, keepdim=True)
    assert ((y.double() - ref).abs() <= slack).all()


def test_backend_is_registered_under_its_name():
    import torch._dynamo

    assert "evtc" in torch._dynamo.list_backends()


def test_a_mask_used_outside_is_left_to_inductor():
    class Mask(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(32, 64)

        def forward(self, x):
            h = torch.tanh(self.fc(x))
            mask = h > 0  # a bool tensor: the kernel has no bool output
            return torch.where(mask, h, 0.5 * h), mask

    torch.manual_seed(8)
    m = Mask().to(torch.bfloat16)
    x = torch.randn(8, 32).bfloat16()
    (y, mask), fused = compiled(m, x)
    assert fused == 1 and "tanh" in ir() and "where" not in ir() and "gt(" not in ir()
    h64 = torch.tanh(x.double() @ m.fc.weight.double().T + m.fc.bias.double())
    assert torch.equal(mask, h64 > 0)
    within_half_ulp(y, torch.where(h64 > 0, h64, 0.5 * h64), "bf16", 2.0 ** -19 * h64.abs())


def test_symbolic_shapes_are_fused_per_shape():
    """NOTE [Symbolic shapes]: a graph Dynamo made symbolic (dynamic=True, or the default's
    automatic dynamic shapes after the batch changed) is specialized per call signature, so
    every batch size runs fused, as with dynamic=False."""
    m = LinearGelu().to(torch.bfloat16)
    for dynamic, inductor in ((None, False), (True, False), (False, False), (None, True), (True, True)):
        torch._dynamo.reset()
        be = make_backend(allow_cpu=True, on_gemm=register, inductor=inductor)
        cm = torch.compile(m, backend=be, dynamic=dynamic)
        with torch.no_grad():
            for rows in (4, 8, 12, 8):  # Dynamo makes the batch symbolic when it changes (dynamic=None)
                x = torch.randn(rows, 32).bfloat16()
                y = cm(x)
                ref = F.gelu(x.double() @ m.fc.weight.double().T + m.fc.bias.double(), approximate="tanh")
                within_half_ulp(y, ref, "bf16", 2.0 ** -20 * ref.abs())
        assert be.fused == 3, (dynamic, inductor)  # one per distinct batch size (the repeated 8 is cached)


class DecodeStep(nn.Module):
    """One decode step: the projections' M is the batch; only the attention's KV length grows."""

    def __init__(self):
        super().__init__()
        self.q, self.up, self.down = nn.Linear(64, 64), nn.Linear(64, 128), nn.Linear(128, 64)

    def forward(self, x, cache, pos):
        q = F.gelu(self.q(x))
        kv = cache[:, :pos]
        a = torch.softmax((q.unsqueeze(1) * kv).sum(-1), dim=-1)
        return self.down(F.silu(self.up((a.unsqueeze(-1) * kv).sum(1)))) + x


@pytest.mark.parametrize("inductor", [False, True])
def test_a_size_no_gemm_reads_is_fused_in_one_graph(monkeypatch, inductor):
    """NOTE [One fused graph for every shape]: a decode loop's KV length becomes symbolic after
    its second step (automatic dynamic shapes); its GEMMs' shapes don't depend on it, so the
    symbolic graph is fused once and compiled once for every later step (it was one compilation
    per step, and unfused past EVTC_MAX_SPECIALIZATIONS)."""
    import warnings

    from evtc.torch import backend as TB

    compiles = []
    real = TB._compile
    monkeypatch.setattr(TB, "_compile", lambda *a, **k: (compiles.append(a[0]), real(*a, **k))[1])
    torch._dynamo.reset()
    torch.manual_seed(7)
    m = DecodeStep().to(torch.bfloat16)
    be = make_backend(allow_cpu=True, on_gemm=register, inductor=inductor)
    cm = torch.compile(m, backend=be)
    cache = torch.randn(3, 48, 64).bfloat16()
    ref_m = copy.deepcopy(m).double()
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for pos in range(1, 41):  # past the 32 specializations a per-shape graph gets
            x = torch.randn(3, 64).bfloat16()
            ref = ref_m(x.double(), cache.double(), pos)
            got = cm(x, cache, pos).double()
            assert (got - ref).abs().max().item() <= 2 ** -7 * ref.abs().max().item(), pos
    assert len(compiles) == 2 and be.fused == 6, (len(compiles), be.fused)  # the static first step, then one
    assert not [w for w in caught if "EVTC_MAX_SPECIALIZATIONS" in str(w.message)]
    assert sum(str(n.target).startswith("evtc.") for n in compiles[1].graph.nodes) == 3


def test_a_size_a_gemm_reads_is_still_fused_per_shape():
    """Where the varying size is a fused GEMM's M (a batch under dynamic=True), the symbolic
    trace fuses fewer matches than the example's static one, and each shape is specialized."""
    torch._dynamo.reset()
    m = DecodeStep().to(torch.bfloat16)
    be = make_backend(allow_cpu=True, on_gemm=register, inductor=False)
    cm = torch.compile(m, backend=be, dynamic=True)
    cache = torch.randn(4, 48, 64).bfloat16()
    with torch.no_grad():
        for rows in (2, 3, 4):
            cm(torch.randn(rows, 64).bfloat16(), cache[:rows], 10)
    assert be.fused == 9  # the example's, then each batch's own (the first reuses the example's)


def test_shapes_past_the_limit_run_unfused_with_one_warning(monkeypatch):
    """EVTC_MAX_SPECIALIZATIONS bounds the shapes a symbolic graph is fused for; a shape past it
    runs the symbolic graph unfused (correctly), with one warning per graph that says so and what
    to do."""
    import warnings

    from evtc import knobs
    from evtc.torch.backend import MAX_SPECIALIZATIONS

    assert knobs.max_specializations.default == MAX_SPECIALIZATIONS
    monkeypatch.setenv("EVTC_MAX_SPECIALIZATIONS", "2")
    m = LinearGelu().to(torch.bfloat16)
    torch._dynamo.reset()
    be = make_backend(allow_cpu=True, on_gemm=register, inductor=False)
    cm = torch.compile(m, backend=be, dynamic=True)
    with torch.no_grad(), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for rows in (4, 8, 12, 16, 4):
            x = torch.randn(rows, 32).bfloat16()
            ref = F.gelu(x.double() @ m.fc.weight.double().T + m.fc.bias.double(), approximate="tanh")
            within_half_ulp(cm(x), ref, "bf16", 2.0 ** -20 * ref.abs() + 2.0 ** -8 * ref.abs().max())
    assert be.fused == 2
    said = [w for w in caught if "EVTC_MAX_SPECIALIZATIONS" in str(w.message)]
    assert len(said) == 1 and "specialized for 2 shapes" in str(said[0].message), [str(w.message) for w in caught]
    monkeypatch.setenv("EVTC_MAX_SPECIALIZATIONS", "many")
    with pytest.raises(Exception, match="EVTC_MAX_SPECIALIZATIONS='many' is not a whole number"):
        knobs.max_specializations.get()


def test_a_symbolic_graph_without_matches_compiles_once():
    """A symbolic graph that fuses nothing at Dynamo's example sizes is compiled as it is, once
    for every shape: no per-shape specialization (under Inductor, whose symbolic compilation
    needs Dynamo's shape environment, current only while the backend runs)."""
    from evtc.torch import backend as TB

    class Plain(nn.Module):
        def forward(self, x):
            return torch.tanh(x) * 2

    for inductor in (False, True):
        torch._dynamo.reset()
        be = make_backend(allow_cpu=True, on_gemm=register, inductor=inductor)
        made = []
        real = TB._Specializing.__init__

        def spy(self, *a, **k):
            real(self, *a, **k)
            made.append(self)

        TB._Specializing.__init__ = spy
        try:
            cm = torch.compile(Plain(), backend=be, dynamic=True)
            for rows in (3, 5, 7):
                x = torch.randn(rows, 16)
                got, want = cm(x), torch.tanh(x) * 2
                if inductor:  # Inductor's vectorized tanh may round the last bit differently
                    torch.testing.assert_close(got, want)
                else:
                    assert torch.equal(got, want)
        finally:
            TB._Specializing.__init__ = real
        assert be.fused == 0 and made == [], inductor


def _register_grouped(g):
    """A CPU kernel for a GroupedGemm's op: the float64 interpreter per group."""
    op = g.torch_op()

    def cpu(A, B, offs, *rest):
        kw = dict(zip(op.tensor_names + op.scalar_names, rest))
        stores = [o.name for o in g.graph.outputs if isinstance(o, Store)]
        outs = {n: torch.zeros(A.shape[0], g.graph.output(n).columns(B.shape[1]),  # (N / 2 for evtc.glu's)
                               dtype=getattr(torch, g.graph.output(n).dtype.torch)) for n in stores}
        outs.update({o.name: torch.zeros(A.shape[0]) for o in g.graph.outputs if o.name not in outs})  # per token
        lo = 0
        for e, hi in enumerate(offs.tolist()):
            acc = A[lo:hi].double().numpy() @ B[e].double().numpy().T
            ins = {}
            for leaf in g.graph.used_inputs:
                if leaf.name not in kw:
                    continue
                v = kw[leaf.name]
                kind = type(leaf).__name__
                v = v.double().numpy() if torch.is_tensor(v) else v
                ins[leaf.name] = v[lo:hi] if kind in ("AuxLoad", "Source", "ColBroadcast") else v
            res = interpret(g.graph, acc, ins)
            for n in op.output_names:  # (a row reduction's: the group's rows, one value each)
                outs[n][lo:hi] = torch.from_numpy(np.asarray(res[n]).reshape(outs[n][lo:hi].shape)).to(outs[n].dtype)
            lo = hi
        vals = [outs[n] for n in op.output_names]
        return vals[0] if len(vals) == 1 else tuple(vals)

    torch.library.register_kernel(op.qualname, "cpu", cpu)


def compiled_grouped(fn, *args):
    """(fn's output, the backend, the Gemms it made) of ``fn`` compiled with the evtc backend on
    the CPU, each GroupedGemm's op given a float64 CPU kernel (:func:`_register_grouped`)."""
    torch._dynamo.reset()
    made = []

    def on_gemm(g):
        made.append(g)
        _register_grouped(g)

    be = make_backend(allow_cpu=True, on_gemm=on_gemm)
    with torch.no_grad():
        out = torch.compile(fn, backend=be, fullgraph=True)(*args)
    return out, be, made


def test_grouped_mm_with_its_epilogue_is_one_grouped_op():
    """torch._grouped_mm (a mixture-of-experts layer) and the pointwise ops after it become one
    evtc.GroupedGemm, with a row reduction after them (one value a token: the op returns it);
    a column reduction, over every token, stays outside (the kernel's are per expert)."""
    import evtc

    def moe(a, w, offs, bias, weight):
        y = torch._grouped_mm(a, w.transpose(1, 2), offs=offs)
        h = F.silu(y + bias) * weight  # weight: a router weight per token, (T, 1)
        return h, h.float().amax(dim=-1)

    torch.manual_seed(3)
    a = torch.randn(64, 32).bfloat16()
    w = (torch.randn(4, 48, 32) / 4).bfloat16()
    offs = torch.tensor([10, 10, 40, 64], dtype=torch.int32)
    bias, weight = torch.randn(48).bfloat16(), torch.rand(64, 1).bfloat16()
    (h, amax), be, made = compiled_grouped(moe, a, w, offs, bias, weight)
    assert be.fused == 1 and isinstance(made[0], evtc.GroupedGemm)
    assert "silu" in str(made[0].graph) and "reduce_max" in str(made[0].graph)
    y = torch.cat([a[lo:hi].double() @ w[e].double().T for e, (lo, hi) in enumerate(zip([0, 10, 10, 40], offs.tolist()))])
    ref = F.silu(y + bias.double()) * weight.double()
    torch.testing.assert_close(h.double(), ref, rtol=2 ** -7, atol=1e-3)
    # the amax reads the f32 value the kernel stored beside h (one rounding: NOTE in regions.py)
    torch.testing.assert_close(amax, h.float().amax(dim=-1), rtol=2 ** -7, atol=0)

    def column_sum(a, w, offs):
        y = torch._grouped_mm(a, w.transpose(1, 2), offs=offs)
        return F.relu(y), F.relu(y).float().sum(dim=0)

    (r, colsum), be, made = compiled_grouped(column_sum, a, w, offs)
    assert be.fused == 1 and "reduce" not in str(made[0].graph)
    torch.testing.assert_close(colsum, r.float().sum(dim=0), rtol=2 ** -7, atol=1e-3)  # (Inductor's: bf16 or not)


# ---- the fuse gate (NOTE [The fuse gate] in evtc/dispatch/select.py) ----------------------------


def test_a_match_the_gate_refuses_is_left_to_inductor():
    torch.manual_seed(4)
    m = LinearGelu().to(torch.bfloat16)
    x = torch.randn(3, 5, 32).bfloat16()
    asked = []

    def gate(gemm, M, N, K, L, device):
        asked.append((M, N, K, L, device.type))
        return False

    y, fused = compiled(m, x, gate=gate)
    assert fused == 0 and asked == [(15, 64, 32, 1, "cpu")]
    with torch.no_grad():
        torch.testing.assert_close(y, m(x), rtol=0, atol=0)  # the graph as eager runs it
    y, fused = compiled(m, x, fuse_all=True, gate=gate)  # fuse_all: the gate is not asked
    assert fused == 1 and len(asked) == 1
    # nor with batch_invariant: a match the gate left to cuBLAS would run a kernel M chooses
    y, fused = compiled(m, x, gate=gate, gemm_options={"batch_invariant": True})
    assert fused == 1 and len(asked) == 1


def test_a_bare_gemm_stays_torchs_unless_every_match_must_fuse(monkeypatch):
    """NOTE [A bare GEMM stays torch's]: a GEMM with nothing after it but views is left to torch
    (its cuBLAS call; addmm's bias is the call's own), a grouped one too; a cast after it is fused
    (it saves the cast's pass);
    fuse_all and batch_invariant (the option or the knob) fuse it, since there the gate is off."""
    torch.manual_seed(5)
    w = (torch.randn(48, 32) / 4).bfloat16()
    x = torch.randn(3, 5, 32).bfloat16()

    def proj(x):
        return x @ w.T

    y, fused = compiled(proj, x)
    assert fused == 0 and not GEMMS
    torch.testing.assert_close(y, proj(x), rtol=0, atol=0)
    b = torch.randn(48).bfloat16()
    y, fused = compiled(lambda x: F.linear(x, w, b).reshape(15, 48), x)  # addmm's own bias, a view
    assert fused == 0 and not GEMMS
    y, fused = compiled(lambda x: (x @ w.T).float(), x)  # the f32 store is the fusion
    assert fused == 1 and "D = store(acc) : f32" in ir()
    for kw in ({"fuse_all": True}, {"gemm_options": {"batch_invariant": True}}):
        y, fused = compiled(proj, x, **kw)
        assert fused == 1 and "D = store(acc) : bf16" in ir(), kw
        torch.testing.assert_close(y.double(), x.double() @ w.double().T, rtol=2 ** -8, atol=1e-6)
    monkeypatch.setenv("EVTC_BATCH_INVARIANT", "1")
    assert compiled(proj, x)[1] == 1
    monkeypatch.setenv("EVTC_BATCH_INVARIANT", "0")
    a = torch.randn(64, 32).bfloat16()
    wg = (torch.randn(4, 48, 32) / 4).bfloat16()
    offs = torch.tensor([10, 10, 40, 64], dtype=torch.int32)
    out, be, made = compiled_grouped(lambda a, w, offs: torch._grouped_mm(a, w.transpose(1, 2), offs=offs), a, wg, offs)
    assert be.fused == 0 and not made


def test_prebuild_builds_each_matchs_kernel_once_and_together(monkeypatch):
    """NOTE [Kernels built when the graph compiles]: one build_many for the kernels the matches'
    problems choose on this device, each once; CPU matches build nothing; a kernel that fails is
    named in a warning (its call raises the error)."""
    import types

    import evtc
    from evtc.compiler import cache
    from evtc.errors import BuildError
    from evtc.torch.backend import prebuild

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: "NVIDIA H200")
    g1 = evtc.Gemm("D = relu(acc + bias[n])", a="bf16")
    g2 = evtc.Gemm("D = gelu(acc)", a="bf16")
    cuda, cpu = types.SimpleNamespace(type="cuda", index=0), torch.device("cpu")
    calls = []

    def build_many(jobs, **kw):
        calls.append([j.name for j in jobs])
        return [BuildError(f"nvcc failed on {j.name}") for j in jobs]

    monkeypatch.setattr(cache, "build_many", build_many)
    big, one = (4096, 4096, 4096, 1), (1, 4096, 4096, 1)
    with pytest.warns(UserWarning, match="did not build") as w:
        prebuild([(g1, big, cuda), (g1, big, cuda), (g2, big, cuda), (g2, one, cuda), (g1, one, cpu)])
    want = {f"{g.name}[{g.choose(*p, device='NVIDIA H200').name.split(':')[0]}]" for g, p in
            [(g1, big), (g2, big), (g2, one)]}
    failed = [str(x.message) for x in w if "did not build" in str(x.message)]
    assert len(calls) == 1 and sorted(calls[0]) == sorted(want) and len(failed) == len(want), (calls, want, failed)
    prebuild([(g1, big, cpu)])  # nothing on a CUDA device: no build
    assert len(calls) == 1


def test_the_backend_gate_asks_the_selection_model_on_an_h200(monkeypatch):
    """fuse_gate on a CUDA device: the shipped gate's answer for the H200, counted when it leaves
    a match; CPU tensors and other GPUs (no table of their own) always fuse."""
    import types

    import evtc
    from evtc.torch.backend import fuse_gate

    be = make_backend()
    gate = fuse_gate(be)
    names = {"h200": "NVIDIA H200", "h100": "NVIDIA H100 80GB HBM3"}
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda d=None: names[d.index])
    reduce_ = evtc.Gemm("D = acc + bias[n]; m = max(D, dim=1); s = sum(D, dim=0)", a="bf16")
    pointwise = evtc.Gemm("D = relu(alpha*acc + beta*C + bias[n])", a="bf16", c="bf16", d="bf16")
    h200, h100 = types.SimpleNamespace(type="cuda", index="h200"), types.SimpleNamespace(type="cuda", index="h100")
    # measured on the H200 (benchmarks/ground_truth/H200.json): 1 x 768 x 768 with a column sum is
    # 2x slower fused; 16384 x 6144 x 1536 bias_relu is faster fused
    assert gate(reduce_, 1, 768, 768, 1, h200) is False and be.left_unfused == 1
    assert gate(pointwise, 16384, 6144, 1536, 1, h200) is True and be.left_unfused == 1
    assert gate(reduce_, 1, 768, 768, 1, h100) is True
    assert gate(reduce_, 1, 768, 768, 1, types.SimpleNamespace(type="cpu", index=None)) is True
    assert be.left_unfused == 1


def test_backend_options_take_fuse_all():
    from evtc.errors import ArgumentError
    from evtc.torch.backend import evtc_backend

    with pytest.raises(ArgumentError, match="a bool"):
        evtc_backend(None, [], options={"fuse_all": 1})
    with pytest.raises(ArgumentError, match="fuse_all is make_backend's own"):
        make_backend(gemm_options={"fuse_all": True})


@pytest.mark.parametrize("inductor", [False, True])
def test_epilogue_tensors_reach_the_op_in_the_binders_layout(inductor):
    """NOTE [Epilogue tensors in the binder's layout]: a residual read through a transpose, a
    bias that is a column of a matrix, an aux tensor that starts off a 16-byte boundary or has a
    row stride of 0: each reaches the op as the GPU call's binder takes it (a contiguous copy
    where its own layout isn't), and the results match float64."""
    class Odd(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(64, 48)
            self.table = nn.Parameter(torch.randn(48, 5))

        def forward(self, x, r, big, s):
            h = self.fc(x) + self.table[:, 1]            # a row vector of stride 5
            h = F.gelu(h) + r.t()                        # an M x N residual, column-major
            h = h * big[:, 3:51]                         # rows starting 6 bytes in
            return h + s.expand(x.shape[0], 48)          # a row stride of 0

    torch.manual_seed(11)
    m = Odd().to(torch.bfloat16)
    x, r = torch.randn(32, 64).bfloat16(), torch.randn(48, 32).bfloat16()
    big, s = torch.randn(32, 60).bfloat16(), torch.randn(1, 48).bfloat16()
    out, fused = compiled(m, x, r, big, s, inductor=inductor)
    assert fused == 1
    md = copy.deepcopy(m).double()
    want = md(x.double(), r.double(), big.double(), s.double())
    assert (out.double() - want).abs().max().item() <= 2 ** -7 * want.abs().max().item()
