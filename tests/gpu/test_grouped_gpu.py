"""evtc.GroupedGemm on the GPU (issue 39): every epilogue form the grouped kernel takes (bare,
source C with scalars and a per-expert row vector, per-token column vector with per-expert
scalars, SwiGLU over the gate's output, SwiGLU in one GEMM (evtc.glu), the reference epilogues
with reductions (per token: row max and sum; per expert: a column sum, an fp8 amax), an fp8 output, a saved pre-activation (aux store), two
M x N inputs (one register-direct)), on each family member, with empty groups,
1-token groups, skewed (Zipf) routing and trailing rows no group owns; every element against
the float64 reference of its group (NOTE [The error bound]), outputs poisoned with NaN first.
"""

import numpy as np
import pytest

import evtc
from evtc import bf16, f32
from evtc.grouped import GROUPED_MEMBERS, GroupedGemm
from evtc.ir.nodes import Reduction, Store
from evtc.testing.oracle import _exact_accumulator, accumulator_error, failure_report, to_numpy, verify

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.gpu


@evtc.epilogue
def bare(acc):
    return acc


@evtc.epilogue
def bias_relu(acc, C, alpha: float, beta: float, bias: evtc.RowVector[f32]):
    return evtc.relu(alpha * acc + beta * C + bias)


@evtc.epilogue
def routed(acc, weight: evtc.ColVector[f32], scale: evtc.DeviceScalar[f32], bias: evtc.RowVector[bf16]):
    """A down projection's output scaled by each token's router weight, a per-expert scale."""
    return weight * (scale * acc + bias)


@evtc.epilogue
def swiglu_up(acc, gate: evtc.Matrix):
    """SwiGLU's second half: silu(gate) * up, the gate computed by a grouped GEMM before."""
    return evtc.silu(gate) * acc


@evtc.epilogue
def swiglu(acc, bias: evtc.RowVector[bf16]):
    """SwiGLU in one GEMM (evtc.glu): each expert's [W_gate; W_up] interleaved, N / 2 stored."""
    return evtc.glu(acc + bias, act="silu")


@evtc.epilogue
def fp8_out(acc, scale_d: float, bias: evtc.RowVector[f32]):
    return (scale_d * evtc.gelu(acc + bias)).to(evtc.e4m3)


@evtc.epilogue
def gelu_aux(acc, bias: evtc.RowVector[f32]):
    """A training forward: the pre-activation saved (an aux store beside D)."""
    F = acc + bias
    return {"D": evtc.gelu(F), "F": F}


@evtc.epilogue
def residual_scale(acc, scale: evtc.ColVector[f32], bias: evtc.RowVector[f32], R1: evtc.Matrix, R2: evtc.Matrix):
    """Two M x N inputs: one the collective's C, one register-direct."""
    return (acc * scale + bias) * R1 + R2


import epilogues as _E  # examples/epilogues.py: the reference epilogues with reductions

EPILOGUES = {"bare": bare, "bias_relu": bias_relu, "routed": routed, "swiglu_up": swiglu_up, "swiglu": swiglu,
             "fp8_out": fp8_out,
             # NOTE [Reductions in the grouped kernel]: per token (row_stats: row max and row sum of
             # exp), per expert (dgelu_bgrad's column sum, fp8_out's amax), atomics into the identity
             "row_stats": _E.REFERENCE["row_stats"], "dgelu_bgrad": _E.REFERENCE["dgelu_bgrad"],
             "fp8_amax": _E.REFERENCE["fp8_out"],
             "gelu_aux": gelu_aux, "residual_scale": residual_scale}
#: (tokens per group): empty and 1-token groups, skewed, trailing rows owned by no group
ROUTINGS = {
    "decode": [0, 1, 0, 3, 1, 0, 0, 2],
    "skewed": [700, 0, 130, 1, 0, 45, 9, 290],
    "uneven_tail": [64, 0, 129, 7],  # plus 11 rows after the last group: left untouched
}
N, K = 384, 256


def gemms():
    """Every kernel this file runs (benchmarks/prebuild.py's group ``grouped``)."""
    return {(e, m): GroupedGemm(fn, member=m) for e, fn in EPILOGUES.items() for m in GROUPED_MEMBERS}


@pytest.fixture(scope="module")
def built():
    table = gemms()
    jobs = [g.kernel().job() for g in table.values()]
    from evtc.compiler import cache

    for g, art in zip(table.values(), cache.build_many(jobs)):
        if isinstance(art, Exception):
            raise art
        g.kernel().load(art)
    return table


def _inputs(g, tokens, E, T, gen):
    dev = "cuda"
    ins = {}
    for leaf in g.graph.used_inputs:
        n = leaf.name
        dt = getattr(torch, leaf.dtype.torch)
        kind = type(leaf).__name__
        if kind == "Accumulator":
            continue
        if kind in ("Source", "AuxLoad"):
            ins[n] = torch.randn(T, N, generator=gen, device=dev).to(dt)
        elif kind == "RowBroadcast":
            ins[n] = torch.randn(E, N, generator=gen, device=dev).to(dt)
        elif kind == "ColBroadcast":
            ins[n] = torch.rand(T, generator=gen, device=dev).to(dt)
        elif kind == "ScalarBroadcast" and leaf.by_pointer:
            ins[n] = (torch.rand(E, generator=gen, device=dev) + 0.5).to(dt)
        else:
            ins[n] = {"alpha": 0.75, "beta": 1.25, "scale_d": 8.0}.get(n, 0.5)
    return ins


def _group_inputs(g, ins, e, lo, hi):
    out = {}
    for leaf in g.graph.used_inputs:
        n = leaf.name
        kind = type(leaf).__name__
        if kind == "Accumulator":
            continue
        v = ins[n]
        if kind in ("Source", "AuxLoad", "ColBroadcast"):
            out[n] = to_numpy(v[lo:hi])
        elif kind == "RowBroadcast":
            out[n] = to_numpy(v[e])
        elif kind == "ScalarBroadcast" and leaf.by_pointer:
            out[n] = float(v[e])
        else:
            out[n] = v
    return out


@pytest.mark.parametrize("member", list(GROUPED_MEMBERS))
@pytest.mark.parametrize("routing", list(ROUTINGS))
@pytest.mark.parametrize("epi", list(EPILOGUES))
def test_grouped_matches_the_reference(built, epi, routing, member):
    g = built[(epi, member)]
    tokens = ROUTINGS[routing]
    E = len(tokens)
    tail = 11 if routing == "uneven_tail" else 0
    T = sum(tokens) + tail
    gen = torch.Generator(device="cuda").manual_seed(hash((epi, routing, member)) % 10000)
    A = torch.randn(T, K, generator=gen, device="cuda").to(torch.bfloat16)
    B = (torch.randn(E, N, K, generator=gen, device="cuda") / 8).to(torch.bfloat16)
    offs = torch.tensor(np.cumsum(tokens), dtype=torch.int32, device="cuda")
    ins = _inputs(g, tokens, E, T, gen)
    stores = [o for o in g.graph.outputs if isinstance(o, Store)]
    outs = {o.name: torch.full((T, o.columns(N)), float("nan"), device="cuda").to(getattr(torch, o.dtype.torch))
            for o in stores}  # (evtc.glu's output: N / 2 columns)
    single = len(g.graph.outputs) == 1
    got = g(A, B, offs, out=next(iter(outs.values())) if single else outs, **ins)
    torch.cuda.synchronize()
    assert got is next(iter(outs.values())) if single else all(got[n] is outs[n] for n in outs)
    reds = {o.name: o for o in g.graph.outputs if isinstance(o, Reduction)}
    lo = 0
    for e, m in enumerate(tokens):
        hi = lo + m
        if m:
            acc, sq = _exact_accumulator(A[lo:hi], B[e])
            mine = {n: to_numpy(t[lo:hi]) for n, t in outs.items()}
            for n, o in reds.items():  # a token's row, an expert's column row or scalar
                mine[n] = to_numpy(got[n][lo:hi] if o.dim == 1 else got[n][e])
            res = verify(g.graph, mine, acc, accumulator_error(sq, K, g.a), _group_inputs(g, ins, e, lo, hi))
            assert all(r.ok for r in res.values()), failure_report(res, f"{epi} {routing} {member} group {e}", g.graph)
        else:  # an empty expert's reductions stay the identity (nothing added)
            for n, o in reds.items():
                if o.dim != 1:
                    assert bool((got[n][e] == o.op.identity).all()), (epi, n, e)
        lo = hi
    if tail:  # rows no group owns keep their poison (and their row reductions the identity)
        for t in outs.values():
            assert torch.isnan(t[lo:].float()).all()
        for n, o in reds.items():
            if o.dim == 1:
                assert bool((got[n][lo:] == o.op.identity).all())


def test_grouped_no_tokens_and_offsets_checked(built):
    g = built[("bare", "coop128x128")]
    A = torch.zeros(0, K, device="cuda", dtype=torch.bfloat16)
    B = torch.zeros(3, N, K, device="cuda", dtype=torch.bfloat16)
    got = g(A, B, torch.zeros(3, dtype=torch.int32, device="cuda"))
    assert got.shape == (0, N)
    A = torch.zeros(8, K, device="cuda", dtype=torch.bfloat16)
    with pytest.raises(evtc.ArgumentError, match="offs\\[1\\]"):
        g(A, B, torch.tensor([4, 2, 8], dtype=torch.int32, device="cuda"), check_offs=True)


def _bias_relu_problem(seed):
    """(T, A, B, C, bias, offs) of a 4-group bias_relu problem with an empty group, fresh data."""
    E, T = 4, 300
    gen = torch.Generator(device="cuda").manual_seed(seed)
    A = torch.randn(T, K, generator=gen, device="cuda").to(torch.bfloat16)
    B = (torch.randn(E, N, K, generator=gen, device="cuda") / 8).to(torch.bfloat16)
    C = torch.randn(T, N, generator=gen, device="cuda").to(torch.bfloat16)
    bias = torch.randn(E, N, generator=gen, device="cuda")
    offs = torch.tensor([100, 100, 250, 300], dtype=torch.int32, device="cuda")
    return T, A, B, C, bias, offs


def test_grouped_under_cuda_graph(built):
    """The setup kernel and the GEMM are captured together; replays follow new offsets."""
    g = built[("bias_relu", "coop128x128")]
    T, A, B, C, bias, offs = _bias_relu_problem(7)
    kw = dict(C=C, alpha=1.0, beta=0.5, bias=bias)
    g(A, B, offs, **kw)  # load and warm up outside the capture
    out = torch.empty(T, N, device="cuda", dtype=torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        g(A, B, offs, out=out, **kw)
    offs.copy_(torch.tensor([10, 200, 200, 300], dtype=torch.int32))
    graph.replay()
    torch.cuda.synchronize()
    want = g(A, B, offs, **kw)
    torch.cuda.synchronize()
    assert torch.equal(out, want)


def test_grouped_under_torch_compile(built):
    """torch.compile(fullgraph=True) holds a GroupedGemm call (its torch op) and the ops around it."""
    g = built[("bias_relu", "coop128x128")]
    T, A, B, C, bias, offs = _bias_relu_problem(11)

    def layer(A, C, bias):
        return g(A * 2, B, offs, C=C, alpha=0.5, beta=1.0, bias=bias).float() * 3  # pointwise: exact either way

    got = torch.compile(layer, fullgraph=True)(A, C, bias)
    want = layer(A, C, bias)
    torch.cuda.synchronize()
    assert torch.equal(got, want)


def test_grouped_reductions_under_torch_compile(built):
    """A GroupedGemm with reductions through its torch op (every output in the epilogue's order,
    the reductions' shapes from the fake implementation): the same D and row maxima as the eager
    call bit for bit, the row sums (float atomics across N tiles) within f32 rounding."""
    g = built[("row_stats", "coop128x128")]
    tokens = ROUTINGS["skewed"]
    E, T = len(tokens), sum(tokens)
    gen = torch.Generator(device="cuda").manual_seed(7)
    A = torch.randn(T, K, generator=gen, device="cuda").to(torch.bfloat16)
    B = (torch.randn(E, N, K, generator=gen, device="cuda") / 8).to(torch.bfloat16)
    offs = torch.tensor(np.cumsum(tokens), dtype=torch.int32, device="cuda")
    ins = _inputs(g, tokens, E, T, gen)

    def layer(A):
        return g(A, B, offs, **ins)

    got = torch.compile(layer, fullgraph=True)(A)
    want = layer(A)
    torch.cuda.synchronize()
    assert set(got) == set(want) == {"D", "row_max", "row_sum"}
    assert torch.equal(got["D"], want["D"]) and torch.equal(got["row_max"], want["row_max"])
    torch.testing.assert_close(got["row_sum"], want["row_sum"], rtol=1e-5, atol=0)


def test_backend_fuses_grouped_mm_and_its_epilogue():
    """torch.compile(backend="evtc") turns torch._grouped_mm + bias + SiLU + router weight, and the
    row max of the result (one value a token), into one GroupedGemm (built on first call) and
    computes what eager does within bf16 rounding; the row max exactly that of the rounded h."""
    import torch.nn.functional as F

    from evtc.torch.backend import make_backend

    def moe(a, w, offs, bias, weight):
        y = torch._grouped_mm(a, w.transpose(1, 2), offs=offs)
        h = F.silu(y + bias) * weight
        return h, h.float().amax(dim=-1)

    gen = torch.Generator(device="cuda").manual_seed(5)
    T, E = 700, 8
    a = torch.randn(T, K, generator=gen, device="cuda").to(torch.bfloat16)
    w = (torch.randn(E, N, K, generator=gen, device="cuda") / 8).to(torch.bfloat16)
    offs = torch.tensor([0, 90, 90, 300, 301, 500, 640, 700], dtype=torch.int32, device="cuda")
    bias = torch.randn(N, generator=gen, device="cuda").to(torch.bfloat16)
    weight = torch.rand(T, 1, generator=gen, device="cuda").to(torch.bfloat16)
    torch._dynamo.reset()
    be = make_backend()
    got, amax = torch.compile(moe, backend=be, fullgraph=True)(a, w, offs, bias, weight)
    torch.cuda.synchronize()
    assert be.fused == 1
    assert torch.equal(amax, got.float().amax(dim=-1))
    y = torch.cat([a[lo:hi].double() @ w[e].double().T
                   for e, (lo, hi) in enumerate(zip([0] + offs.tolist()[:-1], offs.tolist()))])
    want = F.silu(y + bias.double()) * weight.double()
    torch.testing.assert_close(got.double(), want, rtol=2 ** -7, atol=2 ** -10)


def test_list_of_problems_form(built):
    """run_list packs per-group tensors, runs one grouped call, and splits D back."""
    g = built[("residual_scale", "pp64x128")]
    gen = torch.Generator(device="cuda").manual_seed(13)
    sizes = [5, 0, 70, 1]
    As = [torch.randn(m, K, generator=gen, device="cuda").to(torch.bfloat16) for m in sizes]
    Bs = [(torch.randn(N, K, generator=gen, device="cuda") / 8).to(torch.bfloat16) for _ in sizes]
    R1 = [torch.randn(m, N, generator=gen, device="cuda").to(torch.bfloat16) for m in sizes]
    R2 = [torch.randn(m, N, generator=gen, device="cuda").to(torch.bfloat16) for m in sizes]
    scale = [torch.rand(m, generator=gen, device="cuda") for m in sizes]
    bias = torch.randn(len(sizes), N, generator=gen, device="cuda")
    got = g.run_list(As, Bs, R1=R1, R2=R2, scale=scale, bias=bias)
    packed = g(torch.cat(As), torch.stack(Bs), torch.tensor([5, 5, 75, 76], dtype=torch.int32, device="cuda"),
               R1=torch.cat(R1), R2=torch.cat(R2), scale=torch.cat(scale), bias=bias)
    torch.cuda.synchronize()
    assert [tuple(d.shape) for d in got] == [(m, N) for m in sizes]
    assert torch.equal(torch.cat(got), packed)
