"""The reference quantizers and scale layouts of evtc/testing/quant.py (NOTE [Per-token-group
quantization conventions], NOTE [MX scales]): checked against a second implementation written
here in numpy f32 with its own e4m3 rounding (no torch casts), bit for bit, on fresh random data
at ragged M and N; the conventions' differences; amax = 0, inf and NaN; MX's two roundings on
hand-worked values; the layouts' checks."""

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from evtc.errors import ArgumentError  # noqa: E402
from evtc.testing import quant as Q  # noqa: E402


def _e4m3_table():
    """Every non-negative finite e4m3 value, indexed by its 7-bit code (OCP OFP8 v1.0: bias 7,
    subnormals m * 2^-9, 0x7F NaN)."""
    out = []
    for code in range(0x7F):
        e, m = code >> 3, code & 7
        out.append(m * 2.0 ** -9 if e == 0 else (1 + m / 8) * 2.0 ** (e - 7))
    return np.array(out)


E4M3 = _e4m3_table()


def e4m3_rne(v: np.ndarray) -> np.ndarray:
    """Round f32 values to e4m3 (nearest, ties to the even code; 464 and up -> NaN), as values."""
    a = np.abs(v.astype(np.float64))
    i = np.clip(np.searchsorted(E4M3, a), 1, len(E4M3) - 1)
    lo, hi = E4M3[i - 1], E4M3[i]
    pick_hi = (a - lo > hi - a) | ((a - lo == hi - a) & (i % 2 == 0))
    r = np.where(pick_hi, hi, lo)
    r = np.where(a >= E4M3[-1], E4M3[-1], r)
    r = np.where(a >= 464.0, np.nan, r)
    r = np.where(np.isnan(a), np.nan, r)
    return np.copysign(r, v)


def numpy_reference(x: np.ndarray, group: int, convention: str, ue8m0: bool = False):
    """The conventions again, in numpy f32 (every operation rounded to f32 as written)."""
    f = np.float32
    M, N = x.shape
    G = -(-N // group)
    q = np.empty((M, N)), np.empty((M, G), np.float32)
    for gi in range(G):
        y = x[:, gi * group:(gi + 1) * group].astype(f)
        amax = np.max(np.abs(y), axis=1).astype(f)
        amax = np.maximum(amax, f(Q.EPS[convention]))
        if convention == "vllm":
            s = (amax * (f(1) / f(448))).astype(f)
            if ue8m0:
                s = np.exp2(np.ceil(np.log2(s))).astype(f)
            v = np.clip((y / s[:, None]).astype(f), f(-448), f(448))
        elif convention == "sglang":
            s = (amax / f(448)).astype(f)
            v = np.clip((y * (f(1) / s)[:, None]).astype(f), f(-448), f(448))
        else:
            v = (y * (f(448) / amax)[:, None]).astype(f)
            s = (amax / f(448)).astype(f)
        q[0][:, gi * group:(gi + 1) * group] = e4m3_rne(v)
        q[1][:, gi] = s
    return q


def _random(M, N, seed):
    g = torch.Generator().manual_seed(seed)
    # a spread of magnitudes per row, bf16 as a GEMM's 16-bit output would be
    x = torch.randn(M, N, generator=g) * torch.exp(2 * torch.randn(M, 1, generator=g))
    return x.to(torch.bfloat16).float()


@pytest.mark.parametrize("convention, ue8m0", [("vllm", False), ("vllm", True), ("sglang", False),
                                               ("deepgemm", False)])
@pytest.mark.parametrize("M, N, group", [(1, 128, 128), (7, 200, 128), (33, 96, 32), (300, 1000, 64)])
def test_the_reference_matches_a_second_implementation_bit_for_bit(convention, ue8m0, M, N, group):
    x = _random(M, N, seed=M * 131 + N)
    q, s = Q.quantize_per_token_group(x, group, convention=convention, ue8m0=ue8m0)
    want_q, want_s = numpy_reference(x.numpy(), group, convention, ue8m0)
    assert q.dtype == torch.float8_e4m3fn and q.shape == (M, N) and s.shape == (M, -(-N // group))
    np.testing.assert_array_equal(s.numpy().view(np.uint32), want_s.view(np.uint32))
    got = q.float().numpy()
    assert np.array_equal(got, want_q, equal_nan=True), np.argwhere(got != want_q)[:5]


def test_the_conventions_differ_in_the_bits():
    x = _random(4096, 128, seed=5)
    qv, sv = Q.quantize_per_token_group(x, 128, convention="vllm")
    qs, ss = Q.quantize_per_token_group(x, 128, convention="sglang")
    qd, sd = Q.quantize_per_token_group(x, 128, convention="deepgemm")
    # the scales: amax * (1/448) against amax / 448
    assert (sv != ss).any() and torch.equal(ss, sd)
    # the data: y / s, y * (1/s) and y * (448/amax) round differently on some elements
    assert (qv.view(torch.uint8) != qs.view(torch.uint8)).any()
    assert (qs.view(torch.uint8) != qd.view(torch.uint8)).any()
    # and agree on nearly all of them (each is a correct quantization)
    assert (qv.view(torch.uint8) == qd.view(torch.uint8)).float().mean() > 0.99


def test_a_ragged_last_group_is_its_own_group():
    x = _random(5, 200, seed=9)
    q, s = Q.quantize_per_token_group(x, 128)
    q_tail, s_tail = Q.quantize_per_token_group(x[:, 128:].contiguous(), 72)
    assert torch.equal(s[:, 1], s_tail[:, 0])
    assert torch.equal(q[:, 128:].view(torch.uint8), q_tail.view(torch.uint8))


def test_amax_zero_takes_the_epsilon():
    x = torch.zeros(2, 128)
    for conv, eps in (("vllm", 1e-10), ("deepgemm", 1e-4)):
        q, s = Q.quantize_per_token_group(x, 128, convention=conv)
        assert (q.float() == 0).all()
        f = np.float32
        want = f(eps) * (f(1) / f(448)) if conv == "vllm" else f(eps) / f(448)
        assert s[0, 0].item() == float(want)


def test_nan_and_inf_follow_torch():
    x = torch.ones(3, 128)
    x[0, 5] = float("nan")
    x[1, 7] = float("inf")
    q, s = Q.quantize_per_token_group(x, 128)
    assert torch.isnan(s[0, 0]) and torch.isnan(q[0].float()).all()
    assert torch.isinf(s[1, 0]) and torch.isnan(q[1, 7].float()) and (q[1, :7].float() == 0).all()
    assert s[2, 0].item() == pytest.approx(1 / 448, rel=1e-6) and (q[2].float() == 448).all()


def test_mx_floor_and_ceil_on_worked_values():
    x = torch.zeros(2, 32)
    x[0, 0], x[0, 1] = 1.0, 0.5
    x[1, 0] = 1.9
    q, code = Q.quantize_mx(x, "e4m3", rounding="floor")
    # amax 1: X = 2^(0 - 8); 1 -> 256, 0.5 -> 128. amax 1.9: X = 2^-8, 1.9 * 256 = 486.4 -> clamped 448
    assert code.tolist() == [[119], [119]]
    assert q[0, 0].item() == 256 and q[0, 1].item() == 128 and q[1, 0].item() == 448
    q, code = Q.quantize_mx(x, "e4m3", rounding="ceil")
    # ceil(log2(1.9 / 448)) = -7: 1.9 * 128 = 243.2 -> 240 (e4m3 spacing 16 in [128, 256))
    assert code[1, 0].item() == 120 and q[1, 0].item() == 240
    assert torch.equal(Q.e8m0_decode(code)[1], torch.tensor([2.0 ** -7]))


def test_mx_zero_nan_and_inf_blocks():
    x = torch.zeros(3, 64)
    x[1, 3] = float("nan")
    x[2, 40] = float("-inf")
    q, code = Q.quantize_mx(x, "e5m2")
    assert code[0].tolist() == [0, 0] and (q[0].float() == 0).all()
    assert code[1].tolist() == [255, 0] and torch.isnan(q[1, :32].float()).all()
    assert code[2].tolist() == [0, 255] and torch.isnan(q[2, 32:].float()).all()


def test_e8m0_codes_round_trip_and_refuse_what_is_not_a_power_of_two():
    s = torch.tensor([2.0 ** -127, 2.0 ** -3, 1.0, 2.0 ** 127, float("nan")])
    assert torch.equal(Q.e8m0_encode(s), torch.tensor([0, 124, 127, 254, 255], dtype=torch.uint8))
    back = Q.e8m0_decode(Q.e8m0_encode(s))
    assert torch.equal(back[:4], s[:4]) and torch.isnan(back[4])
    with pytest.raises(ArgumentError, match="power of two"):
        Q.e8m0_encode(torch.tensor([3.0]))


@pytest.mark.parametrize("M", [1, 7, 300])
def test_the_column_major_tma_layout_pads_m_to_four(M):
    t = Q.allocate_scales(M, 1000, 128, Q.ScaleLayout.COL_MAJOR_TMA)
    m4 = -(-M // 4) * 4
    assert tuple(t.shape) == (M, 8) and t.stride() == (1, m4)
    Q.check_scales(t, Q.ScaleLayout.COL_MAJOR_TMA, M, 1000, 128)
    r = Q.allocate_scales(M, 1000, 128, Q.ScaleLayout.ROW_MAJOR)
    Q.check_scales(r, Q.ScaleLayout.ROW_MAJOR, M, 1000, 128)


def test_a_scale_tensor_of_the_wrong_layout_names_both():
    r = Q.allocate_scales(7, 1000, 128, Q.ScaleLayout.ROW_MAJOR)
    with pytest.raises(ArgumentError, match=r"laid out as row_major, but the output's scale layout is col_major_tma"):
        Q.check_scales(r, Q.ScaleLayout.COL_MAJOR_TMA, 7, 1000, 128)
    c = torch.empty(8, 7).t()  # column-major without the padding to 4 rows
    with pytest.raises(ArgumentError, match=r"column stride of 7 \(not 8"):
        Q.check_scales(c, Q.ScaleLayout.COL_MAJOR_TMA, 7, 1000, 128)
    with pytest.raises(ArgumentError, match="is uint8; row_major f32 scales are float32"):
        Q.check_scales(r.to(torch.uint8), Q.ScaleLayout.ROW_MAJOR, 7, 1000, 128)
    with pytest.raises(ArgumentError, match=r"shape \(7, 8\); a row_major grid .* is \(7, 16\)"):
        Q.check_scales(r, Q.ScaleLayout.ROW_MAJOR, 7, 1000, 64)
    with pytest.raises(ArgumentError, match="not written or read on sm90"):
        Q.allocate_scales(7, 1000, 32, Q.ScaleLayout.MX_SM100_SWIZZLED)


@pytest.mark.parametrize("kw, match", [({"convention": "tensorrt"}, "convention 'tensorrt'"),
                                       ({"dtype": "int4"}, "dtype 'int4'"),
                                       ({"convention": "sglang", "ue8m0": True}, "only vLLM's"),
                                       ({"group": 0}, "group = 0")])
def test_bad_arguments_are_named(kw, match):
    with pytest.raises(ArgumentError, match=match):
        Q.quantize_per_token_group(torch.zeros(2, 128), **kw)
