"""The row-phase split on the H100 (NOTE [Row-phase split], evtc/dispatch/phase_split.py): a
caller's packed M x N tensors (odd and even-but-unaligned N, bases 2-14 bytes past a 16-byte
boundary, in place ``out=C``, under a CUDA graph; outputs evtc allocates after packed inputs)
through two batched
aligned launches, every element against the float64 reference with NaN-poisoned outputs, and
nothing outside the caller's tensors written."""

import pytest

import evtc
from evtc import bf16, f32

from conftest_gpu import assert_outputs_match

pytestmark = pytest.mark.gpu


@evtc.epilogue
def split_epi(acc, C, R: evtc.Matrix, bias: evtc.RowVector[f32], scale: evtc.ColVector[f32], alpha: float):
    """A source C, an aux load R, row and column broadcasts, two outputs."""
    F = alpha * acc * R + bias * scale
    return {"D": evtc.gelu(F) + C, "F": F}


@evtc.epilogue
def split_lin(acc, C, beta: float, bias: evtc.RowVector[f32]):
    return evtc.relu(acc + beta * C + bias)


# (M, N, K): N odd (G = 8 phases), N = 2 mod 8 (G = 4), a long row, a single tile of rows per phase,
# a K long enough for the fringe's split-K (evtc.dispatch.phase_split.members)
SHAPES = [(1024, 2049, 256), (512, 1002, 128), (256, 50257, 64), (64, 515, 96), (128, 1001, 1024),
          (2048, 8193, 256)]
# both tile orders of a main call on the cooperative 128x256 tile with its 2x1 cluster, and the
# fringe on split-K
ORDER_SHAPE = (4096, 4097, 512)
OFFSETS = [0, 3]  # the tensors' first element 0 or 6 bytes past a 16-byte boundary


@pytest.fixture(scope="module")
def gemms():
    import os

    from evtc.compiler import build_many
    from evtc.dispatch import phase_split as ps

    out = {"epi": evtc.Gemm(split_epi, a=bf16, b=bf16, c=bf16, d=bf16),
           "lin": evtc.Gemm(split_lin, a=bf16, b=bf16, c=bf16, d=bf16)}
    jobs = []
    for g in out.values():
        for M, N, K in SHAPES + [ORDER_SHAPE]:
            for off in OFFSETS:
                geom = ps.find_geometry(M, N, [(2 * off, N, 2)], align_bytes=[2])
                for order in (None, True, False):
                    ps.BATCH_INNER = order
                    jobs += [g.kernel(s).job() for s in ps.members(g, geom, K)]
        ps.BATCH_INNER = None
    build_many(list({j.source: j for j in jobs}.values()), workers=int(os.environ.get("EVTC_BUILD_JOBS", 16)))
    return out


def _split_calls(g) -> int:
    from evtc.dispatch.staging import StagedLauncher

    return sum(x.split_calls for x in g.dispatch.family.launchers.values() if isinstance(x, StagedLauncher))


def _packed_like(t, off, fill=True):
    """A packed copy of (M, N) ``t`` starting ``off`` elements into a NaN-filled buffer."""
    import torch

    M, N = t.shape
    buf = torch.full((off + M * N + 16,), float("nan"), dtype=t.dtype, device=t.device)
    x = buf[off:off + M * N].view(M, N)
    if fill:
        x.copy_(t)
    return buf, x


def _inputs(g, shape, off, seed):
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    M, N, K = shape
    p = Problem(M, N, K)
    ins = make_inputs(g.graph, g.a, g.b, p, seed=seed)
    for k in [k for k, v in ins.items() if k not in ("A", "B") and hasattr(v, "dim") and v.dim() == 2]:
        ins[k] = _packed_like(ins[k], off)[1]
    bufs, outs = {}, {}
    for k, v in poisoned_outputs(g.graph, p).items():
        if v.dim() == 2:  # M x N; reductions keep their own (NaN-poisoned) tensors
            bufs[k], outs[k] = _packed_like(v, off, fill=False)
        else:
            outs[k] = v
    return ins, bufs, outs


@pytest.mark.parametrize("off", OFFSETS)
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("name", ["epi", "lin"])
def test_packed_tensors_on_the_split(gemms, name, shape, off, record_errors, monkeypatch):
    import torch

    monkeypatch.setenv("EVTC_PHASE_SPLIT", "always")
    g = gemms[name]
    ins, bufs, outs = _inputs(g, shape, off, seed=sum(shape) + off + len(name))
    kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
    before = {k: v.clone() for k, v in kw.items() if hasattr(v, "clone")}
    n = _split_calls(g)
    got = g(ins["A"], ins["B"], out=outs if len(outs) > 1 else outs["D"], **kw)
    torch.cuda.synchronize()
    assert _split_calls(g) == n + 1, "the call did not take the split"
    got = got if isinstance(got, dict) else {"D": got}
    for k, buf in bufs.items():
        assert got[k].data_ptr() == outs[k].data_ptr()
        M, N = outs[k].shape
        assert torch.isnan(buf[:off]).all() and torch.isnan(buf[off + M * N:]).all(), \
            f"{k}: an element outside the tensor was written"
    for k, v in before.items():  # the caller's inputs are untouched
        assert torch.equal(v, kw[k]), k
    assert_outputs_match(g, ins, outs, f"split {name} {shape} +{off}", record_errors)


@pytest.mark.parametrize("order", [True, False])
def test_both_tile_orders_of_the_main_call(gemms, order, record_errors, monkeypatch):
    """NOTE [Batch-inner tile order]: the main call on the 2x1-cluster cooperative member with the
    batch index fastest and with CUTLASS's own order (the fringe on a side stream, and on the
    call's stream first), each against the reference."""
    import torch

    from evtc.dispatch import phase_split as ps

    monkeypatch.setenv("EVTC_PHASE_SPLIT", "always")
    monkeypatch.setattr(ps, "BATCH_INNER", order)
    # NOTE [The fringe in the main call's tail]: beside the main call (True), or before it
    monkeypatch.setattr(ps, "OVERLAP_FRINGE", order)
    g = gemms["epi"]
    ins, _, outs = _inputs(g, ORDER_SHAPE, 0, seed=5 + order)
    geom = ps.find_geometry(*ORDER_SHAPE[:2], [(outs["D"].data_ptr(), ORDER_SHAPE[1], 2)], align_bytes=[2])
    main, fringe = ps.members(g, geom, ORDER_SHAPE[2])
    assert main.config.cluster == (2, 1, 1) and (main.config.scheduler == "batch_inner") == order
    assert fringe.config.split_k > 1
    kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
    n = _split_calls(g)
    g(ins["A"], ins["B"], out=outs, **kw)
    torch.cuda.synchronize()
    assert _split_calls(g) == n + 1
    assert_outputs_match(g, ins, outs, f"split, batch-inner {order}", record_errors)


@pytest.mark.parametrize("shape", SHAPES[:2])
def test_in_place_out_c_and_outputs_evtc_allocates(gemms, shape, record_errors, monkeypatch):
    import torch

    from evtc.testing import check_outputs, failure_report

    monkeypatch.setenv("EVTC_PHASE_SPLIT", "always")
    g = gemms["lin"]
    ins, _, _ = _inputs(g, shape, 3, seed=11 + sum(shape))
    ref = dict(ins, C=ins["C"].clone())
    kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
    n = _split_calls(g)
    got = g(ins["A"], ins["B"], out=ins["C"], **kw)  # in place
    assert got is ins["C"]
    torch.cuda.synchronize()
    assert_outputs_match(g, ref, {"D": ins["C"]}, f"split in place {shape}", record_errors)
    # no out=: after a packed C evtc allocates D packed too (NOTE [The row layout of the outputs
    # evtc allocates], evtc/gemm.py), so the call takes the split where D's fresh (16-byte
    # aligned) base has C's phases: a C whose base is too, not this one 6 bytes past a boundary
    for off, splits in ((0, True), (3, False)):
        C = _packed_like(ref["C"], off)[1]
        n = _split_calls(g)
        got = g(ins["A"], ins["B"], **dict(kw, C=C))
        torch.cuda.synchronize()
        assert _split_calls(g) == n + splits, off
        assert got.shape == shape[:2] and got.stride() == (shape[1], 1)
        results = check_outputs(g, ref, {"D": got}, padding=False)
        record_errors(results)
        assert all(r.ok for r in results.values()), failure_report(results, f"evtc's own output (C {off} in):",
                                                                   g.graph)


def test_the_split_in_a_cuda_graph_then_eagerly(gemms, record_errors, monkeypatch):
    """Captured (its fringe indices are made inside the capture and not kept), replayed on new
    inputs, then called eagerly: each result against the reference."""
    import torch

    monkeypatch.setenv("EVTC_PHASE_SPLIT", "always")
    from evtc.dispatch import phase_split as ps

    ps._INDEX.clear()
    g = gemms["epi"]
    shape = SHAPES[0]
    ins, _, outs = _inputs(g, shape, 0, seed=99)
    kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, stream=s):
        g(ins["A"], ins["B"], out=outs, **kw)
    assert not ps._INDEX, "indices made during a capture were cached"
    fresh, _, _ = _inputs(g, shape, 0, seed=100)
    for k, v in fresh.items():
        if hasattr(v, "copy_"):
            ins[k].copy_(v)
    for v in outs.values():
        v.fill_(float("nan"))
    graph.replay()
    torch.cuda.synchronize()
    assert_outputs_match(g, ins, outs, "split replayed", record_errors)
    for v in outs.values():
        v.fill_(float("nan"))
    g(ins["A"], ins["B"], out=outs, **kw)
    torch.cuda.synchronize()
    assert_outputs_match(g, ins, outs, "split eager after a capture", record_errors)


REFERENCE_SHAPE = (1024, 2049, 256)


@pytest.fixture(scope="module")
def reference_gemms():
    import os

    import epilogues as E

    from evtc.compiler import build_many
    from evtc.dispatch import phase_split as ps

    out = {n: evtc.Gemm(ep, a=bf16, b=bf16) for n, ep in E.REFERENCE.items()}
    M, N, K = REFERENCE_SHAPE
    geom = ps.find_geometry(M, N, [(0, N, 2)], align_bytes=[2])
    jobs = []
    for g in out.values():
        if ps.packed_geometry(g, M, N, K) is not None:
            jobs += [g.kernel(s).job() for s in ps.members(g, geom, K)]
        else:  # the routes the epilogues with reductions keep
            spec = g.choose(M, N, K)
            jobs += [g.kernel("unaligned").job(), g.kernel(spec).job()]
            if not spec.config.swap_ab:
                jobs.append(g.kernel(spec.packed_variant()).job())
    build_many(list({j.source: j for j in jobs}.values()), workers=int(os.environ.get("EVTC_BUILD_JOBS", 16)))
    return out


@pytest.mark.parametrize("name", ["linear_combination", "bias_relu", "gelu_aux", "residual_scale", "many_aux",
                                  "dgelu_bgrad", "row_stats", "fp8_out"])
def test_every_reference_epilogue_with_packed_tensors(reference_gemms, name, record_errors, monkeypatch):
    """Each reference epilogue with the caller's packed tensors under EVTC_PHASE_SPLIT=always:
    those without reductions on the split, those with reductions (and fp8's amax) on the routes
    they had before; every output against the float64 reference."""
    import torch

    from evtc.ir.nodes import Store

    monkeypatch.setenv("EVTC_PHASE_SPLIT", "always")
    g = reference_gemms[name]
    ins, _, outs = _inputs(g, REFERENCE_SHAPE, 0, seed=len(name))
    kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
    n = _split_calls(g)
    g(ins["A"], ins["B"], out=outs, **kw)
    torch.cuda.synchronize()
    splits = all(isinstance(o, Store) and o.dtype.bytes >= 2 for o in g.graph.outputs)
    assert (_split_calls(g) == n + 1) == splits
    assert_outputs_match(g, ins, outs, f"{name} with packed tensors", record_errors)
    # the outputs evtc allocates: packed after packed M x N inputs (the same route), else padded
    packed_in = any(hasattr(v, "dim") and v.dim() == 2 and v.shape == REFERENCE_SHAPE[:2] for v in kw.values())
    got = g(ins["A"], ins["B"], **kw)
    got = got if isinstance(got, dict) else {g.graph.outputs[0].name: got}
    torch.cuda.synchronize()
    assert (_split_calls(g) == n + 2) == (splits and packed_in)
    N = REFERENCE_SHAPE[1]
    for o in g.graph.outputs:
        if isinstance(o, Store):
            ld = N if packed_in else -(-N * o.dtype.bytes // 16) * 16 // o.dtype.bytes
            assert got[o.name].stride() == (ld, 1), o.name
    from evtc.testing import check_outputs, failure_report

    results = check_outputs(g, ins, got, padding=False)  # evtc's padding holds nothing to check
    record_errors(results)
    assert all(r.ok for r in results.values()), failure_report(results, f"{name}, outputs evtc allocates:", g.graph)
