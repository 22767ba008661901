"""The padded staging route on the H100 (NOTE [Padded staging for unaligned rows],
evtc/dispatch/staging.py): packed M x N tensors of odd N (C, an aux load; an aux store and D
given packed or allocated by evtc; in place ``out=C``; batched), with the route forced on and
off, each against the float64 reference on fresh random data with NaN-poisoned outputs. The
row-phase split, which takes some of these calls first by default, is switched off here
(``EVTC_PHASE_SPLIT=never``): tests/gpu/test_phase_split_gpu.py tests it."""

import pytest

import evtc
from evtc import bf16, f32

from conftest_gpu import assert_outputs_match


def _assert_allocated_match(gemm, inputs, outputs, what, record_errors):
    """assert_outputs_match for outputs evtc allocated (their row padding is not poisoned)."""
    import torch

    from evtc.testing import check_outputs, failure_report

    torch.cuda.synchronize()
    results = check_outputs(gemm, inputs, outputs, padding=False)
    record_errors(results)
    assert all(r.ok for r in results.values()), failure_report(results, f"{what}:", gemm.graph)

pytestmark = pytest.mark.gpu


@pytest.fixture(autouse=True)
def _no_phase_split(monkeypatch):
    monkeypatch.setenv("EVTC_PHASE_SPLIT", "never")


@evtc.epilogue
def staged_epi(acc, C, R: evtc.Matrix, bias: evtc.RowVector[f32]):
    """A source C, an aux load R and an aux store F."""
    F = acc * R + bias
    return {"D": evtc.gelu(F) + C, "F": F}


@evtc.epilogue
def staged_lin(acc, C, alpha: float, bias: evtc.RowVector[f32]):
    return alpha * acc + C + bias


@evtc.epilogue
def staged_red(acc, bias: evtc.RowVector[f32]):
    """No M x N loads: D and a row max (an atomic reduction beside the packed store)."""
    D = evtc.relu(acc + bias)
    return {"D": D, "row_max": evtc.max(D, dim=1)}


# (M, N, K, L): odd N, enough 128x256 tiles for the ``large`` member in both
SHAPES = [(2048, 2049, 256, 1), (1024, 2049, 256, 2)]
# and for the packed stores: a ragged M (1003) on fewer tiles (another member), N = 37 (a full
# subtile of 32 columns and one of 5) over 3 batches 38258 bytes apart (not a multiple of 16), a
# long-N row
PACKED_SHAPES = [(1003, 2049, 256, 1), (517, 37, 128, 3), (256, 50257, 128, 1)]


@pytest.fixture(scope="module")
def gemms():
    from evtc.compiler import build_many

    import os

    out = {n: evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16)
           for n, ep in (("epi", staged_epi), ("lin", staged_lin), ("red", staged_red))}
    jobs = []
    for g in out.values():
        for shape in SHAPES + PACKED_SHAPES:
            spec = g.choose(*shape)
            jobs.append(g.kernel(spec).job())
            if not spec.config.swap_ab:
                jobs.append(g.kernel(spec.packed_variant()).job())
        jobs.append(g.kernel("unaligned").job())
    build_many(list({j.source: j for j in jobs}.values()), workers=int(os.environ.get("EVTC_BUILD_JOBS", 16)))
    return out


def _packed(ins: dict, outs: dict):
    return ({k: (v.contiguous() if hasattr(v, "dim") and v.dim() >= 2 else v) for k, v in ins.items()},
            {k: v.contiguous() for k, v in outs.items()})


def _staged(g) -> int:
    """Calls the Gemm has sent through the route so far."""
    from evtc.dispatch.staging import StagedLauncher

    return sum(x.staged for x in g.dispatch.family.launchers.values() if isinstance(x, StagedLauncher))


def _packed_calls(g) -> int:
    from evtc.dispatch.staging import StagedLauncher

    return sum(x.packed_calls for x in g.dispatch.family.launchers.values() if isinstance(x, StagedLauncher))


@pytest.mark.parametrize("how", ["always", "never"])
@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("given_out", [False, True])
@pytest.mark.parametrize("packed", [True, False])
def test_packed_c_aux_load_and_store(gemms, how, shape, given_out, packed, record_errors, monkeypatch):
    import torch

    from evtc.testing import Problem, make_inputs, poisoned_outputs

    if not packed and how != "always":
        pytest.skip("the packed stores only change staged calls")
    monkeypatch.setenv("EVTC_PACKED_STORES", "1" if packed else "0")
    g = gemms["epi"]
    g.set_unaligned_staging(how)
    packed_before = _packed_calls(g)
    p = Problem(*shape)
    ins, outs = _packed(make_inputs(g.graph, g.a, g.b, p, seed=sum(shape) + given_out),
                        poisoned_outputs(g.graph, p))
    assert ins["C"].stride()[-2] == shape[1]  # packed: 4098-byte rows
    kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
    before = {k: v.clone() for k, v in kw.items() if hasattr(v, "clone")}
    count = _staged(g)
    if given_out:
        got = g(ins["A"], ins["B"], out=outs, **kw)
        assert got["D"] is outs["D"] and got["F"] is outs["F"]
    else:
        # the caching allocator's next blocks hold NaN: an element the kernel doesn't write fails
        torch.full((4 * sum(x.numel() for x in outs.values()),), float("nan"), dtype=torch.bfloat16,
                   device="cuda")  # freed at once
        got = g(ins["A"], ins["B"], **kw)
        L, M, N = (shape[3],) if shape[3] > 1 else (), shape[0], shape[1]
        for name in ("D", "F"):
            # packed rows after packed inputs (NOTE [The row layout of the outputs evtc allocates])
            assert got[name].shape == (*L, M, N) and got[name].is_contiguous()
        outs = got
    torch.cuda.synchronize()
    assert (_staged(g) > count) == (how == "always")
    # packed outputs on the route (the caller's, or evtc's after packed inputs): written in place
    # by the packed stores, else copied back
    assert (_packed_calls(g) > packed_before) == (how == "always" and packed)
    for k, v in before.items():  # the caller's inputs are untouched
        assert torch.equal(v, kw[k]), k
    check = assert_outputs_match if given_out else _assert_allocated_match
    check(g, ins, outs, f"staging={how} {shape} out={given_out}", record_errors)


@pytest.mark.parametrize("how", ["always", "never", "auto"])
def test_in_place_out_c(gemms, how, record_errors):
    import torch

    from evtc.testing import Problem, make_inputs

    g = gemms["lin"]
    g.set_unaligned_staging(how)
    p = Problem(*SHAPES[0])
    ins, _ = _packed(make_inputs(g.graph, g.a, g.b, p, seed=31), {})
    C = ins["C"]
    ref = dict(ins, C=C.clone())
    kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
    got = g(ins["A"], ins["B"], out=C, **kw)
    assert got is C
    torch.cuda.synchronize()
    assert_outputs_match(g, ref, {"D": C}, f"in place out=C staging={how}", record_errors)


@pytest.mark.parametrize("explicit", [False, True])
def test_staging_follows_the_call_s_stream(gemms, explicit, record_errors):
    """The copies and the kernel run on the call's stream (the current one, or ``stream=``): the
    inputs hold NaN until a side stream, after a sleep, fills them; a copy on any other stream
    would stage NaN."""
    import torch

    from evtc.testing import Problem, make_inputs, poisoned_outputs

    g = gemms["epi"]
    g.set_unaligned_staging("always")
    p = Problem(*SHAPES[0])
    ins, outs = _packed(make_inputs(g.graph, g.a, g.b, p, seed=41 + explicit), poisoned_outputs(g.graph, p))
    real = {k: v.clone() for k, v in ins.items() if hasattr(v, "clone")}
    for v in ins.values():
        if hasattr(v, "fill_"):
            v.fill_(float("nan"))
    count = _staged(g)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)
        for k, v in real.items():
            ins[k].copy_(v)
        if not explicit:
            g(ins["A"], ins["B"], out=outs, **kw)
    if explicit:
        g(ins["A"], ins["B"], out=outs, stream=s, **kw)
    s.synchronize()
    torch.cuda.synchronize()
    assert _staged(g) > count
    assert_outputs_match(g, ins, outs, f"staging on a side stream (stream= {explicit})", record_errors)


@pytest.mark.parametrize("dtype", ["float8_e4m3fn", "bfloat16", "float32"])
@pytest.mark.parametrize("shape", [(333, 517), (3, 77, 4097), (1, 50257)])
def test_copy_kernel_between_packed_and_padded_rows(gemms, dtype, shape):
    """NOTE [Copy kernels for staging]: a loaded sm90 library's evtc_copy_rows moves a packed
    tensor into padded rows and back, exactly, touching nothing but the L x M x N elements."""
    import torch

    from evtc.runtime import pitched_copy
    from evtc.dispatch.staging import padded_strides

    g = gemms["lin"]
    g.launcher(g.choose(*SHAPES[0][:3]))  # loads an sm90 library, which registers its copy kernel
    assert pitched_copy._COPY_KERNEL[0] is not None, "no sm90 library registered its copy kernel"
    dt = getattr(torch, dtype)
    eb = torch.empty((), dtype=dt).element_size()
    src = torch.randn(shape, device="cuda").to(dt)  # fresh random values, fp8 included
    strides = padded_strides(shape, eb)
    buf = torch.full((shape[0] * strides[0],), -7.0, device="cuda").to(dt)  # poison, padding included
    padded = buf.as_strided(shape, strides)
    assert padded.stride() != src.stride()
    before = pitched_copy.COUNTS["kernel"]
    assert pitched_copy.copy_rows(padded, src)
    back = torch.full(shape, -7.0, device="cuda").to(dt)
    assert pitched_copy.copy_rows(back, padded)
    torch.cuda.synchronize()
    assert pitched_copy.COUNTS["kernel"] == before + 2  # both ways by the kernel, not cudaMemcpy2DAsync
    as_bytes = lambda t: t.contiguous().view(torch.uint8)  # noqa: E731 - bit equality (NaN and -0 included)
    assert torch.equal(as_bytes(padded), as_bytes(src)) and torch.equal(as_bytes(back), as_bytes(src))
    # the padding between the rows is still the poison
    rows = buf.view(-1, strides[-2])[:, shape[-1]:]
    assert torch.equal(as_bytes(rows), as_bytes(torch.full_like(rows, -7.0)))


@pytest.mark.parametrize("layout", ["packed", "gap5", "offset3"])
@pytest.mark.parametrize("shape", SHAPES + PACKED_SHAPES)
@pytest.mark.parametrize("name", ["epi", "lin", "red"])
def test_packed_stores_write_in_place(gemms, name, shape, layout, record_errors, monkeypatch):
    """NOTE [Stores into packed rows]: caller outputs whose rows are only 2-byte aligned (packed, rows
    N + 5 elements apart, or packed from an address 6 bytes past a 16-byte boundary) are written in
    place by the packed-store variant: every element against the float64 reference (NaN
    poison), and not one element of the buffer outside the tensor touched (the gaps between rows,
    the 16 elements before and after it)."""
    _check_packed_in_place(gemms[name], name, shape, layout, record_errors, monkeypatch)


#: 14337 columns: 81 full tiles of 176 and one of 81 columns, the last epilogue subtile of 16 cut at 1
SHAPE_176 = (1024, 14337, 256, 1)


@pytest.fixture(scope="module")
def gemms_176():
    """staged_lin and staged_red on their pick at a long odd N, pp128x176 (NOTE [The 128x176
    ping-pong tile]), and its packed-store variant: only those kernels."""
    import os

    from evtc.compiler import build_many

    out = {n: evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16) for n, ep in (("lin", staged_lin), ("red", staged_red))}
    jobs = []
    for g in out.values():
        spec = g.choose(*SHAPE_176)
        assert spec.name == "pp128x176", spec.name
        jobs += [g.kernel(spec).job(), g.kernel(spec.packed_variant()).job()]
    build_many(jobs, workers=int(os.environ.get("EVTC_BUILD_JOBS", 16)))
    return out


@pytest.mark.parametrize("layout", ["packed", "gap5"])
@pytest.mark.parametrize("name", ["lin", "red"])
def test_packed_stores_on_the_128x176_tile(gemms_176, name, layout, record_errors, monkeypatch):
    """The packed stores on the 176-wide ping-pong tile (epilogue subtiles of 64x16), in place, as
    test_packed_stores_write_in_place checks them."""
    _check_packed_in_place(gemms_176[name], name, SHAPE_176, layout, record_errors, monkeypatch)


def _check_packed_in_place(g, name, shape, layout, record_errors, monkeypatch):
    import torch

    from evtc.testing import Problem, make_inputs, poisoned_outputs

    g.set_unaligned_staging("always")
    # "epi" has two M x N outputs, which EVTC_PACKED_STORES=auto copies back (slower on the
    # packed stores); its kernels are checked here all the same
    monkeypatch.setenv("EVTC_PACKED_STORES", "always" if name == "epi" else "auto")
    M, N, K, L = shape
    p = Problem(*shape)
    ins, _ = _packed(make_inputs(g.graph, g.a, g.b, p, seed=M + N + len(layout) + len(name)), {})
    outs = poisoned_outputs(g.graph, p)
    ld = N + 5 if layout == "gap5" else N
    off = 16 + (3 if layout == "offset3" else 0)
    lead = (L,) if L > 1 else ()
    strides = ((M * ld,) if L > 1 else ()) + (ld, 1)
    bufs = {}
    for o in g.graph.outputs:
        if o.name in ("D", "F"):
            buf = torch.full((off + L * M * ld + 16,), float("nan"), dtype=torch.bfloat16, device="cuda")
            outs[o.name] = buf.as_strided(lead + (M, N), strides, off)
            bufs[o.name] = buf
    kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
    before = _packed_calls(g)
    got = g(ins["A"], ins["B"], out=outs, **kw)
    torch.cuda.synchronize()
    assert _packed_calls(g) == before + 1, "the call did not take the packed stores"
    for n, buf in bufs.items():
        assert (got[n] if isinstance(got, dict) else got).data_ptr() == outs[n].data_ptr()
        outside = torch.ones(buf.shape, dtype=torch.bool, device="cuda")
        outside.as_strided(lead + (M, N), strides, off).fill_(False)
        assert outside.sum().item() == buf.numel() - L * M * N
        assert torch.isnan(buf[outside]).all(), f"{n}: an element outside the tensor was written"
    assert_outputs_match(g, ins, outs, f"packed {name} {shape} {layout}", record_errors)
