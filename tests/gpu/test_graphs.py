"""Gemm calls captured in CUDA graphs (torch.cuda.graph and cupy's stream capture) and replayed
with new input values: every element of each replay is compared with the float64 reference
(evtc.testing, NOTE [The error bound]). Outputs are NaN-poisoned before capture and before every
replay, so a replay that skips an output (or a reduction whose identity is not re-initialised
inside the graph) fails."""

import numpy as np
import pytest

from evtc.testing import (
    Problem,
    accumulator_error,
    check_outputs,
    failure_report,
    fast_accumulation,
    make_inputs,
    poisoned_outputs,
    verify,
)

pytestmark = pytest.mark.gpu
REPLAYS = 100


@pytest.fixture(scope="module")
def gemms():
    import runtime_kernels as RK
    from conftest_gpu import prebuild

    table = RK.gemms()
    prebuild(list(table.values()))
    return table


def _capture_and_replay(g, p, *, allocate_inside, record_errors, label):
    import torch

    ins = make_inputs(g.graph, g.a, g.b, p, seed=1)
    kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
    outs = poisoned_outputs(g.graph, p)
    single = len(g.graph.outputs) == 1
    given = None if allocate_inside else (outs["D"] if single else outs)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # warm-up: build, check and prepare outside the capture
        g(ins["A"], ins["B"], out=given, **kw)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    for t in outs.values():
        t.fill_(float("nan"))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        result = g(ins["A"], ins["B"], out=given, **kw)
    result = {"D": result} if single else result
    tensors = {k: v for k, v in ins.items() if hasattr(v, "copy_")}
    worst = {}
    for i in range(REPLAYS):
        fresh = make_inputs(g.graph, g.a, g.b, p, seed=1000 + i)
        for k, t in tensors.items():
            t.copy_(fresh[k])
        for t in result.values():
            t.fill_(float("nan"))
        graph.replay()
        torch.cuda.synchronize()
        # outputs evtc allocated inside the capture have row padding that was never poisoned
        results = check_outputs(g, ins, result, padding=not allocate_inside)
        assert all(r.ok for r in results.values()), failure_report(results, f"{label} replay {i}:", g.graph)
        for name, r in results.items():
            if name not in worst or r.excess > worst[name].excess:
                worst[name] = r
    record_errors(worst, (p.M, p.N, p.K, p.L))


@pytest.mark.parametrize("allocate_inside", [False, True], ids=["out", "allocated"])
def test_torch_graph_bias_relu(gemms, allocate_inside, record_errors):
    _capture_and_replay(gemms["bias_relu"], Problem(300, 264, 128), allocate_inside=allocate_inside,
                        record_errors=record_errors, label="bias_relu")


@pytest.mark.parametrize("name", ["stats", "stats_sm80"])
def test_torch_graph_reinitialises_reductions(gemms, name, record_errors):
    """Row, column and scalar reductions (atomics on sm80 and for the scalar on sm90) get their
    identity inside the captured work on every replay."""
    _capture_and_replay(gemms[name], Problem(300, 264, 128), allocate_inside=False, record_errors=record_errors,
                        label=name)


def test_torch_graph_batched_with_workspace(gemms, record_errors):
    """Batched, with the sm90 reductions' workspace allocated inside the capture."""
    _capture_and_replay(gemms["stats"], Problem(200, 136, 64, 3), allocate_inside=True, record_errors=record_errors,
                        label="stats batched")


def test_cupy_graph(gemms):
    cupy = pytest.importorskip("cupy")

    g = gemms["bias_relu_f16"]
    M, N, K = 256, 192, 128
    rng = np.random.default_rng(0)

    def fresh(shape, dtype, scale=1.0):
        return cupy.asarray((rng.standard_normal(shape) * scale).astype(dtype))

    A, B = fresh((M, K), np.float16, K ** -0.25), fresh((N, K), np.float16, K ** -0.25)
    C, bias = fresh((M, N), np.float16), fresh((N,), np.float32)
    D = cupy.full((M, N), np.nan, dtype=np.float16)
    kw = dict(C=C, alpha=0.75, beta=1.25, bias=bias)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        g(A, B, out=D, **kw)  # warm-up outside the capture
        stream.synchronize()
        stream.begin_capture()
        g(A, B, out=D, **kw)
        graph = stream.end_capture()
    for i in range(REPLAYS):
        with stream:
            for t, dt, s in ((A, np.float16, K ** -0.25), (B, np.float16, K ** -0.25), (C, np.float16, 1.0),
                             (bias, np.float32, 1.0)):
                t[...] = fresh(t.shape, dt, s)
            D.fill(np.nan)
        graph.launch(stream)
        stream.synchronize()
        host = {k: cupy.asnumpy(v).astype(np.float64) for k, v in (("A", A), ("B", B), ("C", C), ("bias", bias))}
        a64, b64 = host.pop("A"), host.pop("B")
        acc, sq = a64 @ b64.T, (a64 * a64) @ (b64 * b64).T
        results = verify(g.graph, {"D": cupy.asnumpy(D).astype(np.float64)}, acc,
                         accumulator_error(sq, K, g.a, fast_accum=fast_accumulation(g)),
                         {**host, "alpha": 0.75, "beta": 1.25})
        assert results["D"].ok, failure_report(results, f"cupy replay {i}:", g.graph)
