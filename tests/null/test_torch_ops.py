"""Gemms as PyTorch custom ops (evtc/torch/ops.py) without a GPU: the schema and name, the fake
implementation's shapes and dtypes, a Gemm call inside torch.compile(fullgraph=True) (one op in
the graph, no break) and torch.export. The op's CUDA implementation is the Gemm itself (GPU
tests: tests/gpu/test_torch_gpu.py); here a CPU kernel computed by evtc's float64 interpreter is
registered for the op so the compiled function runs."""

import subprocess
import sys

import numpy as np
import pytest

import evtc

torch = pytest.importorskip("torch")

import epilogues as E

from evtc.ir.interpret import interpret
from evtc.ir.nodes import Store
from evtc.runtime.bind import follows_packed_inputs
from evtc.dispatch.staging import padded_strides

from test_runtime_launch import Fake  # noqa: E402


def gemm(name="bias_relu", **kw):
    ep = E.REFERENCE[name]
    return evtc.Gemm(ep, a=evtc.bf16, b=evtc.bf16, c=evtc.bf16, d=evtc.bf16, **kw)


_REGISTERED: set = set()


def op_with_cpu_kernel(g):
    """``g``'s op with a CPU kernel (once per op): the float64 interpreter rounded to the output
    dtypes, so that compiled functions run here."""
    op = g.torch_op()
    if op.qualname in _REGISTERED:
        return op

    def cpu(A, B, *rest):
        kw = dict(zip(op.tensor_names + op.scalar_names, rest))
        acc = A.double().numpy() @ np.swapaxes(B.double().numpy(), -1, -2)
        res = interpret(g.graph, acc, {k: (v.double().numpy() if torch.is_tensor(v) else v) for k, v in kw.items()})
        outs = []
        mn = [(tuple(kw[n].shape), kw[n].stride(), eb) for n, eb in g.dispatch.mn_loads]
        packed = follows_packed_inputs(B.shape[-2], mn)
        for o in g.graph.outputs:
            x = torch.from_numpy(np.asarray(res[o.name])).to(getattr(torch, o.dtype.torch))
            x = x if A.dim() == 3 or B.dim() == 3 else x[0]
            if x.dim() >= 2 and isinstance(o, Store) and not packed:  # evtc's padded rows, as the fake says
                x = torch.empty_strided(x.shape, padded_strides(tuple(x.shape), o.dtype.bytes), dtype=x.dtype).copy_(x)
            outs.append(x)
        return outs[0] if len(outs) == 1 else tuple(outs)

    torch.library.register_kernel(op.qualname, "cpu", cpu)
    _REGISTERED.add(op.qualname)
    return op


def test_schema_name_and_one_op_per_distinct_gemm():
    g = gemm()
    op = g.torch_op()
    assert op.schema == "(Tensor A, Tensor B, Tensor C, Tensor bias, float alpha, float beta) -> Tensor"
    assert op.qualname.startswith("evtc::bias_relu_") and len(op.qualname.split("_")[-1]) == 12
    assert gemm().torch_op() is op  # an equal Gemm: the registered op
    pinned = gemm(config=evtc.GemmConfig(tile=(128, 128, 64)))
    assert pinned.torch_op().qualname != op.qualname
    stats = gemm("row_stats").torch_op()
    assert stats.output_names == ("D", "row_max", "row_sum") and stats.schema.endswith("-> (Tensor, Tensor, Tensor)")


def test_fake_outputs_have_the_call_s_shapes_and_dtypes():
    from torch._subclasses.fake_tensor import FakeTensorMode

    op = gemm("row_stats").torch_op()
    with FakeTensorMode():
        for L in (None, 3):
            lead = () if L is None else (L,)
            A = torch.empty(*lead, 300, 64, dtype=torch.bfloat16, device="cuda")
            B = torch.empty(*lead, 200, 64, dtype=torch.bfloat16, device="cuda")
            kw = {n: torch.empty(*lead, 300, 200, dtype=torch.bfloat16, device="cuda") if n == "C" else
                  torch.empty(200, device="cuda") for n in op.tensor_names}
            out = op(A, B, **kw, **{n: 1.0 for n in op.scalar_names})
            assert {k: (tuple(v.shape), v.dtype, v.device.type) for k, v in out.items()} == {
                "D": (lead + (300, 200), torch.bfloat16, "cuda"),
                "row_max": (lead + (300,), torch.float32, "cuda"),
                "row_sum": (lead + (300,), torch.float32, "cuda")}


@pytest.mark.parametrize("c_rows", ["padded", "packed"])
def test_fake_outputs_have_the_strides_evtc_allocates(monkeypatch, c_rows):
    """An M x N output's rows are padded to 16 bytes (N = 201 bf16: row stride 208), as the
    binder allocates them, except after packed M x N inputs (NOTE [The row layout of the outputs
    evtc allocates], evtc/gemm.py), where they are contiguous as the Gemm's call allocates them;
    the fake must say so, or Inductor would read the real output with the wrong strides."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from evtc.ir.nodes import ColBroadcast
    from evtc.runtime import tensors

    g = gemm("row_stats")
    op = g.torch_op()
    f16 = evtc.Gemm(E.REFERENCE["row_stats"], a=evtc.f16, b=evtc.f16, c=evtc.f16, d=evtc.f16)
    made = {}

    def strided_allocator(framework, device, shape, strides, dtype):
        return lambda: (made.setdefault("D", (tuple(shape), tuple(strides))), 0)

    monkeypatch.setattr(tensors, "strided_allocator", strided_allocator)
    for L in (None, 3):
        lead = () if L is None else (L,)
        shapes = {"A": lead + (300, 64), "B": lead + (201, 64)}
        c_strides = (300 * 208, 208, 1)[-len(lead) - 2:] if c_rows == "padded" else (300 * 201, 201, 1)[-len(lead) - 2:]
        with FakeTensorMode():
            A = torch.empty(*shapes["A"], dtype=torch.bfloat16, device="cuda")
            B = torch.empty(*shapes["B"], dtype=torch.bfloat16, device="cuda")
            kw = {n: torch.empty_strided(lead + (300, 201), c_strides, dtype=torch.bfloat16, device="cuda")
                  if n == "C" else torch.empty(201, device="cuda") for n in op.tensor_names}
            out = op(A, B, **kw, **{n: 1.0 for n in op.scalar_names})
            D = out["D"]
            if c_rows == "padded":
                assert D.stride() == ((300 * 208, 208, 1) if L else (208, 1))
            else:
                assert D.stride() == ((300 * 201, 201, 1) if L else (201, 1))
            assert out["row_max"].stride() == ((300, 1) if L else (1,))
        # the eager call allocates the same: the binder's padded rows, or packed ones first
        cols = {n.name for n in f16.graph.inputs if isinstance(n, ColBroadcast)}
        args = {n: (Fake(lead + (300, 201), "<f2", strides=c_strides) if n == "C" else
                    Fake((300,) if n in cols else (201,), "<f4")) for n in op.tensor_names}
        args |= {n: 1.0 for n in op.scalar_names}
        made.clear()
        a, b = Fake(shapes["A"], "<f2"), Fake(shapes["B"], "<f2")
        got = f16.dispatch.packed_outputs(a, b, args, None)
        if c_rows == "padded":
            assert got is None and not made
            sig, _ = f16.dispatch.family.primary_binder().signature(a, b, args)
            assert {a.name: a.strides for a in sig.allocs}["D"] == tuple(D.stride())
        else:
            assert set(got) == {"D"} and made["D"] == (tuple(D.shape), tuple(D.stride()))


@pytest.mark.parametrize("c_rows", ["packed", "padded"])
def test_odd_n_call_under_inductor_reads_the_output(c_rows):
    """N = 61 bf16: the op returns rows padded to 64 elements after a padded C and packed rows
    after a packed one (the CPU kernel as evtc's allocation, the fake the same); Inductor's code
    after the op reads them right."""
    g = gemm()
    op_with_cpu_kernel(g)

    def f(A, B, C, bias):
        return g(A, B, C=C, bias=bias, alpha=0.5, beta=1.5) * 2 + 1

    gen = torch.Generator().manual_seed(3)
    A = torch.randn(40, 32, generator=gen).bfloat16()
    B = torch.randn(61, 32, generator=gen).bfloat16()
    C = torch.randn(40, 61, generator=gen).bfloat16()
    if c_rows == "padded":
        C = torch.empty_strided((40, 61), (64, 1), dtype=torch.bfloat16).copy_(C)
    bias = torch.randn(61, generator=gen)
    torch._dynamo.reset()
    y = torch.compile(f, fullgraph=True)(A, B, C, bias)
    d = torch.relu(0.5 * (A.double() @ B.double().T) + 1.5 * C.double() + bias.double()).bfloat16()
    assert y.shape == (40, 61)
    torch.testing.assert_close(y, d * 2 + 1, rtol=2 ** -7, atol=0)


def test_a_gemm_call_compiles_with_fullgraph_into_one_op():
    g = gemm()
    op = op_with_cpu_kernel(g)
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(A, B, C, bias):
        return g(A, B, C=C, bias=bias, alpha=0.5, beta=1.5) * 2

    gen = torch.Generator().manual_seed(1)
    A = torch.randn(64, 32, generator=gen).bfloat16()
    B = torch.randn(48, 32, generator=gen).bfloat16()
    C = torch.randn(64, 48, generator=gen).bfloat16()
    bias = torch.randn(48, generator=gen)
    y = torch.compile(f, fullgraph=True, backend=backend)(A, B, C, bias)
    want = torch.relu(0.5 * (A.double() @ B.double().T) + 1.5 * C.double() + bias.double())
    want = want.to(torch.bfloat16).double() * 2
    assert y.shape == (64, 48) and y.dtype == torch.bfloat16
    assert torch.equal(y.double(), want.to(torch.bfloat16).double())
    targets = [str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function"]
    assert sum(op.qualname.replace("::", ".") in t for t in targets) == 1, targets


def test_a_new_gemm_compiles_without_calling_torch_op_first():
    """The GPU machine's failure: a Gemm whose op was never asked for, called inside
    torch.compile(fullgraph=True), broke on the op's registration (a lock Dynamo can't enter).
    Made after torch is imported, a Gemm has its op from the start."""
    op_with_cpu_kernel(gemm())  # the op's CPU kernel, registered through another, equal Gemm
    g = gemm()
    assert g._torch_op is not None

    def f(A, B, C, bias):
        return g(A, B, C=C, bias=bias, alpha=1.0, beta=0.0)

    A, B, C = torch.randn(32, 16).bfloat16(), torch.randn(24, 16).bfloat16(), torch.randn(32, 24).bfloat16()
    bias = torch.randn(24)
    y = torch.compile(f, fullgraph=True, backend="eager")(A, B, C, bias)
    want = torch.relu(A.double() @ B.double().T + bias.double()).to(torch.bfloat16)
    assert torch.equal(y, want)
    torch._dynamo.reset()
    g._torch_op = None  # as if made before torch was imported: the reason reaches the user
    with pytest.raises(Exception, match=r"call gemm.torch_op\(\) once before compiling"):
        torch.compile(f, fullgraph=True, backend="eager")(A, B, C, bias)


def test_torch_export_holds_the_op():
    g = gemm("row_stats")
    op = op_with_cpu_kernel(g)

    class M(torch.nn.Module):
        def forward(self, A, B, C, shift):
            out = g.torch_op()(A, B, C=C, shift=shift, alpha=1.0, beta=0.5)
            return out["D"], out["row_max"]

    A, B = torch.randn(16, 8).bfloat16(), torch.randn(24, 8).bfloat16()
    ep = torch.export.export(M(), (A, B, torch.randn(16, 24).bfloat16(), torch.randn(24)))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert any(op.qualname.replace("::", ".") in t for t in targets), targets


def test_op_arguments_are_checked_by_name():
    op = gemm().torch_op()
    A = torch.empty(4, 8)
    with pytest.raises(evtc.ArgumentError, match="missing bias"):
        op(A, A, C=A, alpha=1.0, beta=1.0)
    with pytest.raises(evtc.ArgumentError, match="unknown gamma"):
        op(A, A, C=A, bias=A, alpha=1.0, beta=1.0, gamma=2.0)


def test_import_evtc_does_not_import_torch():
    code = "import sys, evtc; g = evtc.Gemm('D = relu(acc)'); print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
