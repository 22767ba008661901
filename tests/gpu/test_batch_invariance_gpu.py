"""``Gemm(..., batch_invariant=True)`` on the GPU (NOTE [Batch invariance] in
evtc/dispatch/invariance.py): for every epilogue class (a bare GEMM, C and a row broadcast, an
aux store, row reductions with a sum, an aux load with a column sum, fp8 with a scalar amax, fp8
per 1 x 128 group with its scales: evtc.quantize), the
bits of a fixed input row's outputs are the same at M = 1, 7, 64, 300, 2048, 8192 and in a batch
of L = 3 (whichever member the selection picks for each), and every output (column and scalar
reductions too) repeats its bits over 10 runs. The members' results are also checked against
the float64 reference (NaN-poisoned outputs) at one size.

The kernels: ``python benchmarks/prebuild.py invariance`` (the members the selection picks for
these problems on an H200)."""

import pytest

import evtc
from evtc import bf16
from evtc.ir.nodes import Reduction, Store
from evtc.testing import Problem, check, failure_report

pytestmark = pytest.mark.gpu

N, K = 1536, 2048
MS = (1, 7, 64, 300, 2048, 8192)
BATCH = (3, 300)  # L, M of the batched call: the first L*M rows of the M = 8192 inputs
RUNS = 10
DEVICE = "NVIDIA H200"  # the members prebuilt; a call on another GPU builds what its table picks


@evtc.epilogue
def quantize(acc, bias: evtc.RowVector[evtc.f32]):
    """D = e4m3 per 1 x 128 group of acc + bias (vLLM's convention), with its scales."""
    q, s = evtc.quantize(acc + bias, evtc.e4m3, group=128)
    return {"D": q, "D_scale": s}


def epilogues() -> dict:
    """The epilogue classes, by name (examples/epilogues.py, a bare GEMM, a quantizing one)."""
    import epilogues as E

    return {"bare": "D = acc", "bias_relu": E.bias_relu, "gelu_aux": E.gelu_aux, "row_stats": E.row_stats,
            "dgelu_bgrad": E.dgelu_bgrad, "fp8_out": E.fp8_out, "quantize": quantize}


def gemms() -> dict:
    out = {}
    for name, ep in epilogues().items():
        a = evtc.e4m3 if name == "fp8_out" else bf16
        out[name] = evtc.Gemm(ep, a=a, b=a, c=bf16, d=bf16, batch_invariant=True)
    return out


def jobs() -> list:
    """The build jobs of the members these problems run on (benchmarks/prebuild.py's
    ``invariance``)."""
    out = {}
    for g in gemms().values():
        fam = g.dispatch.family
        for M, L in [(m, 1) for m in MS] + [BATCH[::-1]]:
            k = fam.kernel(fam.choose(M, N, K, L, device=DEVICE))
            out.setdefault(k.source, k.job())
    return list(out.values())


@pytest.fixture(scope="module")
def built():
    from evtc.compiler import build_many

    build_many(jobs())
    return gemms()


def _inputs(g, seed):
    from evtc.runtime.timing import random_inputs

    return random_inputs(g.graph, g.a, g.b, Problem(max(MS), N, K, 1), seed=seed)


def _rows(x, M):
    """The first M rows of an M-major input (C, aux loads, column vectors); others as they are."""
    import torch

    return x[:M].contiguous() if isinstance(x, torch.Tensor) and x.dim() >= 1 and x.shape[0] == max(MS) else x


def _batched(x, L, M):
    import torch

    if not isinstance(x, torch.Tensor):
        return x
    if x.dim() >= 1 and x.shape[0] == max(MS):
        return x[:L * M].reshape(L, M, *x.shape[1:]).contiguous()
    return x.unsqueeze(0).expand(L, *x.shape).contiguous()  # B, row vectors, scalars by pointer


def _call(g, inputs, rows=None, batch=None):
    args = {k: (_batched(v, *batch) if batch else _rows(v, rows)) for k, v in inputs.items()}
    A, B = args.pop("A"), args.pop("B")
    got = g(A, B, **args)
    return got if isinstance(got, dict) else {g.graph.outputs[0].name: got}


def _bits(t):
    import torch

    t = t.contiguous()
    return t.view(torch.uint8) if t.dim() else t.reshape(1).view(torch.uint8)


def _row_outputs(g):
    """The outputs whose element for a row depends only on that row: M x N stores, row reductions."""
    return [o.name for o in g.graph.outputs
            if isinstance(o, Store) or (isinstance(o, Reduction) and o.dim == 1)]


@pytest.mark.parametrize("name", list(epilogues()))
def test_a_rows_bits_do_not_depend_on_the_batch(built, name):
    import torch

    g = built[name]
    inputs = _inputs(g, seed=hash(name) % 1000)
    full = _call(g, inputs, rows=max(MS))
    torch.cuda.synchronize()
    rows = _row_outputs(g)
    chosen = {}
    for M in MS[:-1]:
        got = _call(g, inputs, rows=M)
        chosen[M] = g.choose(M, N, K, device=torch.cuda.get_device_name()).name
        for o in rows:
            assert torch.equal(_bits(got[o][:M]), _bits(full[o][:M])), \
                f"{name}: output {o} of the first {M} rows differs from the same rows at M = {max(MS)} " \
                f"(members: {chosen}, M = {max(MS)}: {g.choose(max(MS), N, K, device=torch.cuda.get_device_name()).name})"
    L, M = BATCH
    got = _call(g, inputs, batch=BATCH)
    for o in rows:
        flat = got[o].reshape(L * M, *got[o].shape[2:])
        assert torch.equal(_bits(flat), _bits(full[o][:L * M])), \
            f"{name}: output {o} of a batch of {L} x {M} rows differs from the same rows unbatched"


@pytest.mark.parametrize("name", list(epilogues()))
def test_every_output_repeats_its_bits_over_runs(built, name):
    import torch

    g = built[name]
    inputs = _inputs(g, seed=7 + hash(name) % 1000)
    first = {k: _bits(v).clone() for k, v in _call(g, inputs, rows=2048).items()}
    for run in range(RUNS - 1):
        got = _call(g, inputs, rows=2048)
        for k, v in got.items():
            assert torch.equal(_bits(v), first[k]), f"{name}: output {k} changed bits on run {run + 2}"


# (the quantizing epilogue's numerics: bitwise against the reference quantizer in
# tests/gpu/test_quantize_gpu.py; here its bits' independence of the batch and the run)
@pytest.mark.parametrize("name", [n for n in epilogues() if n != "quantize"])
def test_the_invariant_members_match_the_reference(built, name, record_errors):
    g = built[name]
    for shape in ((300, N, K, 1), (7, N, K, 1)):
        res = check(g, Problem(*shape), seed=11)
        record_errors(res, shape)
        assert all(r.ok for r in res.values()), failure_report(res, f"{name} {shape}:", g.graph)
