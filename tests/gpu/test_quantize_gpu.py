"""evtc.quantize on the GPU: the fused per-token-group quantization of D is bitwise equal to the
reference quantizer (evtc.testing.quant) applied to the same f32 values, which the kernel also
stores (``Y``). Data and scales, at ragged M and N, batched, with groups whose amax is 0, inf or
NaN, on every family member that can run it and through the family's own choice, with
NaN-poisoned outputs (an element or scale the kernel does not write stays NaN and fails)."""

import pytest

import evtc
from evtc import bf16, f32
from evtc.testing.inputs import poisoned_outputs
from evtc.testing import Problem
from evtc.testing.quant import quantize_per_token_group

from conftest_gpu import built_fixture

pytestmark = pytest.mark.gpu


def _epilogue(dtype: str, group: int, convention: str, layout: str = "row_major"):
    dt = getattr(evtc, dtype)

    @evtc.epilogue(name=f"quant_{dtype}_{group}_{convention}" + ("" if layout == "row_major" else f"_{layout}"))
    def quant(acc, alpha: float, bias: evtc.RowVector[f32]):
        y = alpha * acc + bias
        q, s = evtc.quantize(y, dt, group=group, convention=convention, scale_layout=layout)
        return {"D": q, "D_scale": s, "Y": y.to(f32)}

    return quant


#: (dtype, group, convention) of each epilogue; the first runs on every member
VARIANTS = [("e4m3", 128, "vllm"), ("e4m3", 128, "sglang"), ("e4m3", 128, "deepgemm"), ("e5m2", 128, "vllm"),
            ("e4m3", 64, "vllm")]
#: (M, N, K, L): ragged M, a last group of 112 and of 48 columns, one token, a batch (a caller's
#: fp8 D needs N % 16 == 0: the TMA store writes whole 16-byte vectors)
SHAPES = [(300, 1008, 256, 1), (1, 4096, 512, 1), (7, 304, 128, 1), (129, 640, 192, 2), (2048, 1536, 1024, 1)]


def gemms() -> dict:
    """Every Gemm this file runs (benchmarks/prebuild.py's group ``quantize``): the first variant
    pinned to each member the family keeps for it, and every variant through the family."""
    table = {}
    first = _epilogue(*VARIANTS[0])
    fam = evtc.Gemm(first, a=bf16, b=bf16)
    for name, spec in fam.family.items():
        table[(VARIANTS[0], name)] = evtc.Gemm(first, a=bf16, b=bf16, config=spec.config)
    for v in VARIANTS:
        table[(v, "family")] = evtc.Gemm(_epilogue(*v), a=bf16, b=bf16)
    table[(VARIANTS[0], "col_major_tma")] = evtc.Gemm(_epilogue(*VARIANTS[0], "col_major_tma"), a=bf16, b=bf16)
    return table


built = built_fixture(gemms)


def _inputs(M, N, K, L, seed):
    import torch

    g = torch.Generator(device="cuda").manual_seed(seed)
    lead = (L,) if L > 1 else ()
    A = torch.randn(lead + (M, K), device="cuda", generator=g).to(torch.bfloat16)
    B = torch.randn(lead + (N, K), device="cuda", generator=g).to(torch.bfloat16)
    bias = torch.randn(N, device="cuda", generator=g)
    # special groups: every row's group 1 holds an inf, group 2 a NaN (when N has them); a row
    # of A of zeros with a zero bias over the last group gives amax = 0 there
    if N > 2 * 64 + 5:
        bias[64 + 3] = float("inf")
    if N > 3 * 64 + 5:
        bias[2 * 64 + 5] = float("nan")
    if M > 3:
        A[..., 3, :] = 0
        bias[(N - 1) // 128 * 128:] = 0
    return A, B, bias


def _bits_equal(got, want) -> tuple[bool, str]:
    """Bitwise equality, NaN where both are NaN (its sign and payload are the conversion's)."""
    import torch

    gf, wf = got.float(), want.float()
    nan = torch.isnan(gf) & torch.isnan(wf)
    word = {1: torch.uint8, 4: torch.int32}[got.element_size()]
    same = (got.contiguous().view(word) == want.contiguous().view(word)) | nan
    if bool(same.all()):
        return True, ""
    bad = (~same).nonzero()
    i = tuple(bad[0].tolist())
    return False, f"{int((~same).sum())} differ, first at {i}: got {gf[i].item()!r}, want {wf[i].item()!r}"


def _check(g, variant, shape, seed, poisoned=True):
    dtype, group, convention = variant
    M, N, K, L = shape
    A, B, bias = _inputs(M, N, K, L, seed)
    out = poisoned_outputs(g.graph, Problem(M, N, K, L)) if poisoned else None
    got = g(A, B, alpha=0.75, bias=bias, out=out)
    Y = got["Y"]
    for b in range(L):
        y = Y[b] if L > 1 else Y
        q_ref, s_ref = quantize_per_token_group(y.float().cpu(), group, dtype, convention=convention)
        q = (got["D"][b] if L > 1 else got["D"]).cpu()
        s = (got["D_scale"][b] if L > 1 else got["D_scale"]).cpu()
        assert s.shape == s_ref.shape, (s.shape, s_ref.shape)
        ok, why = _bits_equal(q, q_ref)
        assert ok, f"{g.name} {shape} batch {b}: quantized D: {why}"
        ok, why = _bits_equal(s, s_ref)
        assert ok, f"{g.name} {shape} batch {b}: scales: {why}"
        # the reference is not vacuous: the special groups are there
        if N > 3 * 64 + 5 and group == 64:
            assert bool(s_ref[:, 2].isnan().all()) and bool(s_ref[:, 1].isinf().all())


@pytest.mark.parametrize("member", ["large", "streamk", "small", "pp128", "pp64x256"])
def test_quantize_on_each_member_is_bitwise_the_reference(built, member):
    key = (VARIANTS[0], member)
    if key not in built:
        pytest.fail(f"the family no longer keeps {member} for evtc.quantize: update this test's list")
    for k, shape in enumerate(SHAPES):
        _check(built[key], VARIANTS[0], shape, seed=17 * k + 1)


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: "-".join(map(str, v)))
def test_quantize_through_the_family_is_bitwise_the_reference(built, variant):
    g = built[(variant, "family")]
    for k, shape in enumerate(SHAPES):
        _check(g, variant, shape, seed=31 * k + 7)


def test_ragged_n_with_outputs_evtc_allocates(built):
    """N = 1000 (not a multiple of 16): evtc pads D's rows, so the aligned kernel still runs."""
    g = built[(VARIANTS[0], "family")]
    _check(g, VARIANTS[0], (100, 1000, 256, 1), seed=5, poisoned=False)


def test_a_caller_d_with_ragged_rows_is_refused_before_any_build(built):
    import torch

    g = built[(VARIANTS[0], "family")]
    A, B, bias = _inputs(64, 1000, 64, 1, 3)
    D = torch.empty(64, 1000, device="cuda", dtype=torch.float8_e4m3fn)
    with pytest.raises(evtc.ArgumentError, match="16-byte"):
        g(A, B, alpha=1.0, bias=bias, out={"D": D})


def test_scales_of_the_wrong_layout_are_refused(built):
    import torch

    g = built[(VARIANTS[0], "family")]
    A, B, bias = _inputs(64, 256, 64, 1, 3)
    bad = torch.empty(2, 64, device="cuda").t()  # (64, 2) column-major: DeepGEMM's TMA layout
    with pytest.raises(evtc.ArgumentError, match="row-major.*COL_MAJOR_TMA"):
        g(A, B, alpha=1.0, bias=bias, out={"D_scale": bad})
    with pytest.raises(evtc.ArgumentError, match="D_scale"):
        g(A, B, alpha=1.0, bias=bias, out={"D_scale": torch.empty(64, 2, device="cuda", dtype=torch.float16)})


@pytest.mark.parametrize("decomposition,splits", [("stream_k", 1), ("split_k", 2), ("split_k", 3)])
def test_quantize_under_stream_k_and_split_k_is_bitwise_the_reference(built, decomposition, splits):
    """The scales are whole inside one subtile (no workspace, no atomics: GroupScale.cross_tile),
    so the stream-K member's decompositions run it: the epilogue sees the reduced accumulator
    once per tile (CUTLASS's stream-K fixup before the epilogue)."""
    cfg = built[(VARIANTS[0], "streamk")].config.replace(decomposition=decomposition, split_k=splits)
    g = evtc.Gemm(_epilogue(*VARIANTS[0]), a=bf16, b=bf16, config=cfg)  # the same kernel: run-time fields
    for k, shape in enumerate(SHAPES + [(64, 4096, 4096, 1), (200, 2560, 3072, 1)]):
        _check(g, VARIANTS[0], shape, seed=43 * k + 5)


def test_scales_in_deepgemms_column_major_layout(built):
    """scale_layout="col_major_tma": the scales evtc allocates are DeepGEMM's TMA layout (the
    (M, G) view of a (G, M rounded up to 4) grid), a caller's tensor of that layout is written in
    place, both bitwise the reference; a row-major tensor is refused naming both layouts."""
    import torch

    from evtc.testing.quant import ScaleLayout, allocate_scales, check_scales

    g = built[(VARIANTS[0], "col_major_tma")]
    for k, shape in enumerate(SHAPES):  # poisoned outputs in the declared layout, batched too
        _check(g, VARIANTS[0], shape, seed=59 * k + 3)
    M, N, K = 300, 1008, 256
    A, B, bias = _inputs(M, N, K, 1, 5)
    got = g(A, B, alpha=0.75, bias=bias)
    check_scales(got["D_scale"], ScaleLayout.COL_MAJOR_TMA, M, N, 128)
    mine = allocate_scales(M, N, 128, ScaleLayout.COL_MAJOR_TMA, device="cuda").fill_(float("nan"))
    again = g(A, B, alpha=0.75, bias=bias, out={"D_scale": mine})
    assert again["D_scale"].data_ptr() == mine.data_ptr()
    _, s_ref = quantize_per_token_group(again["Y"].float().cpu(), 128, "e4m3")
    ok, why = _bits_equal(mine.cpu(), s_ref)
    assert ok, f"a caller's column-major scales: {why}"
    with pytest.raises(evtc.ArgumentError, match="COL_MAJOR_TMA.*row-major"):
        g(A, B, alpha=0.75, bias=bias, out={"D_scale": torch.empty(M, 8, device="cuda")})
