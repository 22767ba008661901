"""The torch fast path on the GPU (NOTE [The torch fast path], evtc/torch/fast.py): after
a call on the Python path registers its key, later calls with torch tensors go through the C++
extension; each is checked elementwise against the float64 reference on fresh random data, with
the scalars changed between calls, outputs allocated over NaN-filled memory, a pinned Gemm (one
output; several outputs with reductions and a workspace), a family's swap-AB and small members,
a call that must still fail on the Python path, and CUDA-graph capture and replay."""

import math

import pytest

import evtc
from evtc import bf16
from evtc.testing import Problem, make_inputs

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module", autouse=True)
def fast_path_sync():
    mp = pytest.MonkeyPatch()
    mp.setenv("EVTC_TORCH_FASTPATH", "sync")
    from evtc.torch import fast as torch_fast

    torch_fast.build()
    yield
    mp.undo()


@pytest.fixture(scope="module")
def gemms():
    import epilogues as E
    import runtime_kernels as RK
    from conftest_gpu import prebuild

    table = RK.gemms()
    table["family"] = evtc.Gemm(E.REFERENCE["bias_relu"], a=bf16, b=bf16, c=bf16, d=bf16)
    prebuild([table["bias_relu"], table["stats"]])
    return table


def split(ins):
    return ins["A"], ins["B"], {k: v for k, v in ins.items() if k not in ("A", "B")}


def nan_pool(nbytes: int) -> None:
    """Fill and free a block of the caching allocator, so the next outputs of that size start
    as NaN (outputs evtc allocates itself can't be poisoned by the test directly)."""
    import torch

    x = torch.full((nbytes // 2 + 64,), float("nan"), dtype=torch.bfloat16, device="cuda")
    del x


def no_python_path(monkeypatch, gemm):
    """Make the Python launch path fail loudly, so a call that succeeds took the fast path."""
    from evtc.runtime.launch import Launcher

    def refuse(*a, **k):
        raise AssertionError("the call took the Python path")

    monkeypatch.setattr(Launcher, "run", refuse)
    monkeypatch.setattr(Launcher, "__call__", refuse)


@pytest.mark.parametrize("name, shape", [("bias_relu", (256, 128, 64)), ("stats", (192, 136, 96)),
                                         ("family", (256, 256, 256)), ("family", (16, 512, 256))])
def test_fast_calls_match_the_reference(gemms, name, shape, monkeypatch):
    from conftest_gpu import assert_outputs_match

    g = gemms[name]
    p = Problem(*shape)
    A, B, kw = split(make_inputs(g.graph, g.a, g.b, p, seed=10))
    g(A, B, **kw)  # the Python path: checks, prepares, registers the key
    assert g.dispatch.fast.table is not None and len(g.dispatch.fast.table) >= 1
    with monkeypatch.context() as m:
        no_python_path(m, g)
        for seed in range(11, 15):
            ins = make_inputs(g.graph, g.a, g.b, p, seed=seed)
            A, B, kw = split(ins)
            for k in ("alpha", "beta"):
                if k in kw:
                    kw[k] = ins[k] = float(seed) / 7 - 1.0
            nan_pool(math.prod(shape[:2]) * 2)
            out = g(A, B, **kw)
            outs = out if isinstance(out, dict) else {g.graph.outputs[0].name: out}
            assert_outputs_match(g, ins, outs, f"{name} fast call seed {seed}")


def test_bad_call_after_registration_still_raises(gemms):
    import torch

    g = gemms["bias_relu"]
    A, B, kw = split(make_inputs(g.graph, g.a, g.b, Problem(256, 128, 64), seed=20))
    g(A, B, **kw)
    g(A, B, **kw)
    kw["C"] = kw["C"].to(torch.float16)
    with pytest.raises(evtc.ArgumentError, match="C"):
        g(A, B, **kw)
    kw["C"] = kw["C"].to(torch.bfloat16)
    kw["alpha"] = "1"
    with pytest.raises(evtc.ArgumentError, match="alpha"):
        g(A, B, **kw)


def test_fast_calls_in_a_cuda_graph(gemms):
    import torch

    from conftest_gpu import assert_outputs_match

    g = gemms["stats"]
    p = Problem(256, 128, 64)
    ins = make_inputs(g.graph, g.a, g.b, p, seed=30)
    A, B, kw = split(ins)
    g(A, B, **kw)
    g(A, B, **kw)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        g(A, B, **kw)
    torch.cuda.current_stream().wait_stream(s)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = g(A, B, **kw)
    for seed in (31, 32, 33):
        fresh = make_inputs(g.graph, g.a, g.b, p, seed=seed)
        for k, v in fresh.items():
            if isinstance(v, torch.Tensor):
                (A if k == "A" else B if k == "B" else kw[k]).copy_(v)
        for o in out.values():
            o.fill_(float("nan"))
        graph.replay()
        fresh = {k: (v if isinstance(v, torch.Tensor) else kw[k]) for k, v in fresh.items()}
        assert_outputs_match(g, fresh, out, f"stats replay seed {seed}")
