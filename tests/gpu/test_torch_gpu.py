"""Gemms as PyTorch custom ops on the H100 (evtc/torch/ops.py): a call inside
torch.compile(fullgraph=True), the op captured in a CUDA graph and replayed with new inputs, and a
torch.export-ed module run; every output against the float64 reference (evtc.testing's oracle),
fresh random inputs. The kernels are the runtime tests' (benchmarks/prebuild.py group
``runtime``)."""

import pytest

from evtc.testing import Problem, make_inputs

from conftest_gpu import assert_outputs_match

pytestmark = pytest.mark.gpu
torch = pytest.importorskip("torch")

from torch_models import ulp  # noqa: E402


@pytest.fixture(scope="module")
def gemms():
    import runtime_kernels as RK
    from conftest_gpu import prebuild

    table = RK.gemms()
    prebuild([table["bias_relu"], table["stats"]])
    return table


def _split(ins):
    return ins["A"], ins["B"], {k: v for k, v in ins.items() if k not in ("A", "B")}


@pytest.mark.parametrize("name", ["bias_relu", "stats"])
def test_compiled_call_is_one_graph(gemms, name, record_errors):
    g = gemms[name]
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def f(A, B, kw):
        return g(A, B, **kw)

    ins = make_inputs(g.graph, g.a, g.b, Problem(300, 264, 128), seed=5)
    A, B, kw = _split(ins)
    got = torch.compile(f, fullgraph=True, backend=backend)(A, B, kw)
    got = got if isinstance(got, dict) else {"D": got}
    assert_outputs_match(g, ins, got, f"compiled {name}", record_errors)
    qual = g.torch_op().qualname.replace("::", ".")
    assert sum(qual in str(n.target) for n in graphs[0].graph.nodes if n.op == "call_function") == 1


def test_op_in_a_cuda_graph_replays_with_new_inputs(gemms, record_errors):
    g = gemms["stats"]
    op = g.torch_op()
    p = Problem(300, 264, 128)
    ins = make_inputs(g.graph, g.a, g.b, p, seed=1)
    A, B, kw = _split(ins)
    op(A, B, **kw)  # warm: build, load, prepare outside the capture
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = op(A, B, **kw)
    tensors = {k: v for k, v in ins.items() if hasattr(v, "copy_")}
    for i in range(10):
        fresh = make_inputs(g.graph, g.a, g.b, p, seed=100 + i)
        for k, t in tensors.items():
            t.copy_(fresh[k])
        for t in out.values():
            t.fill_(float("nan"))
        graph.replay()
        assert_outputs_match(g, ins, out, f"replay {i}", record_errors)


def test_exported_module_runs(gemms, record_errors):
    g = gemms["bias_relu"]
    ins = make_inputs(g.graph, g.a, g.b, Problem(128, 256, 64), seed=9)
    A, B, kw = _split(ins)
    names = sorted(k for k, v in kw.items() if torch.is_tensor(v))
    scalars = {k: v for k, v in kw.items() if k not in names}

    class M(torch.nn.Module):
        def forward(self, A, B, *vals):
            return g.torch_op()(A, B, **dict(zip(names, vals)), **scalars)

    ep = torch.export.export(M(), (A, B, *[kw[n] for n in names]))
    got = ep.module()(A, B, *[kw[n] for n in names])
    assert_outputs_match(g, ins, {"D": got}, "exported", record_errors)


# ---- torch.compile(backend="evtc") on the GPU (kernels: benchmarks/prebuild.py group ``torch``) ----


def _staged_reference(model, x):
    """The MLP block in float64 with the bf16 roundings the fused kernels also make: after fc1 +
    GELU (a bf16 tensor in both) and at the output."""
    W1, b1 = model.fc1.weight.double(), model.fc1.bias.double()
    W2, b2 = model.fc2.weight.double(), model.fc2.bias.double()
    h = torch.nn.functional.gelu(x.double() @ W1.T + b1).to(torch.bfloat16).double()
    return (x.double() + h @ W2.T + b2).to(torch.bfloat16).double(), h


@pytest.mark.parametrize("tokens", [1, 300, 2048])
def test_backend_fuses_an_mlp_block_on_the_gpu(tokens):
    """torch.compile(model, backend="evtc") on an MLP block (fc1 + bias + GELU, fc2 + bias +
    residual): both matches fused, the output within one bf16 ulp (plus f32 accumulation's share)
    of the float64 reference rounded where the kernels round."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
    import bench_torch

    from evtc.torch.backend import make_backend

    from conftest_gpu import prebuild

    prebuild(bench_torch.gemms())
    model = bench_torch.block(256, 512)
    backend = make_backend()
    x = torch.randn(tokens, 256, device="cuda", dtype=torch.bfloat16)
    with torch.inference_mode():
        got = torch.compile(model, backend=backend, dynamic=False)(x).double()
    torch._dynamo.reset()
    assert backend.fused == 2
    want, h = _staged_reference(model, x)
    assert got.shape == want.shape and not torch.isnan(got).any()
    # one ulp of the output, and room for f32 accumulation to round a few intermediate bf16 h to
    # the neighbour of float64's choice: each such flip moves an output by <= max|W2| * ulp(h)
    slack = 4 * ulp(h).amax(1, keepdim=True) * model.fc2.weight.double().abs().amax(1)
    err = (got - want).abs()
    bound = ulp(want) + slack
    assert (err <= bound).all(), f"max err {err.max().item():.3e}, worst excess {(err - bound).max().item():.3e}"
