"""The GPU tests' oracle (evtc/testing/oracle.py) without a GPU: numpy arrays stand in for a kernel's
outputs. Correct f32 results (tests/emulate.py) and correct roundings must pass; a wrong
ragged-tail element, an element two e4m3 ulps off, an unwritten (NaN) element, a wrong
reduction entry and a write past the last column must each fail, with the worst element named."""

import json
import math

import numpy as np
import pytest

import evtc
from evtc import bf16, dtypes, e4m3, e5m2, f16, f32, ops, passes
from evtc import testing as T
from evtc.ir.interpret import interpret

import emulate as EM

RAGGED = (77, 50, 64, 2)  # M, N ragged against every tile; two batches


def _setup(ep, a=bf16, shape=RAGGED, seed=0, arch="sm90", **trace_kw):
    """(graph after the passes, acc, acc_error, inputs, emulated outputs) of an epilogue on a
    host problem."""
    g = passes.run(ep.trace(**trace_kw), arch)
    A, B, ins, acc, sq = EM.host_problem(g, a, shape, seed)
    got = EM.emulate(g, A, B, ins, np.random.default_rng(seed))
    return g, acc, T.accumulator_error(sq, shape[2], a), ins, got


def _verify(setup, got=None, **kw):
    g, acc, acc_err, ins, emulated = setup
    return T.verify(g, emulated if got is None else got, acc, acc_err, ins, **kw)


def _reference(name):
    import epilogues as E

    return E.REFERENCE[name]


# ---- the bound itself ----------------------------------------------------------------------------

@pytest.mark.parametrize("dt,np_dt", [(f32, np.float32), (f16, np.float16)])
def test_ulp_is_the_spacing_of_the_dtype(dt, np_dt):
    x = np.array([0.0, 1e-40, 6e-8, 1e-5, 0.1, 1.0, 1.5, -3.0, 60000.0] + ([1e30] if dt is f32 else []))
    np.testing.assert_array_equal(T.ulp(x, dt), np.spacing(np.abs(x).astype(np_dt)).astype(np.float64))


def test_ulp_of_narrow_dtypes():
    assert T.ulp(1.0, bf16) == 2.0 ** -7 and T.ulp(3.0, bf16) == 2.0 ** -6
    assert T.ulp(1.0, e4m3) == 0.125 and T.ulp(448.0, e4m3) == 32.0
    assert T.ulp(0.0, e4m3) == 2.0 ** -9 and T.ulp(2.0 ** -8, e4m3) == 2.0 ** -9  # subnormals
    assert T.ulp(1.0, e5m2) == 0.25 and T.ulp(0.0, e5m2) == 2.0 ** -16
    assert np.isinf(T.ulp(np.nan, bf16)) and np.isinf(T.ulp(np.inf, bf16))


def test_lipschitz_table_bounds_every_derivative():
    x = np.linspace(-30.0, 30.0, 600_001)
    for op, bound in T.LIPSCHITZ.items():
        y = np.asarray(ops.get(op).numpy(x), dtype=np.float64)
        slope = np.abs(np.diff(y) / np.diff(x)).max()
        assert slope <= bound, f"{op}: |f'| reaches {slope} > {bound}"


def test_every_op_has_an_f32_error_row():
    # group_quant: the oracle refuses evtc.quantize (checked bitwise against evtc.testing.quant);
    # glu: bounded as its act's row, then mul's (evtc.testing.oracle._compute)
    missing = sorted(set(ops.OPS) - set(T.F32_ERROR) - {"convert", "group_quant", "glu"})
    assert not missing, f"add rows to evtc.testing.F32_ERROR for {missing}"


def test_accumulator_error_model():
    sq = np.full((2, 2), 1.0)
    e16 = T.accumulator_error(sq, 4096, bf16)
    assert np.allclose(e16, T.ACC_SAFETY * 2.0 ** -23 * 256)  # 256 steps of K = 16
    assert e16[0, 0] < 0.02 * T.ulp(1.0, bf16)  # a fiftieth of a bf16 ulp of an O(1) result
    # fp8 fast accumulation: 128 steps of K = 32 at 2^-13
    assert np.allclose(T.accumulator_error(sq, 4096, e4m3, fast_accum=True), T.ACC_SAFETY * 2.0 ** -13 * 128)
    # the default: 32 windows of 4 MMAs promoted into f32 (NOTE [fp8 accumulation])
    e8 = T.accumulator_error(sq, 4096, e4m3)
    assert np.allclose(e8, T.ACC_SAFETY * (2.0 ** -13 * 4 * math.sqrt(32) + 2.0 ** -23 * 32))
    assert 0.0110 < e8[0, 0] < 0.0111


# ---- fp8: the bound follows the kernel's accumulation ---------------------------------------------

def _keep_14_bits(v):
    """``v`` truncated to 14 significant bits (relative error below 2^-13): the sum an fp8 WGMMA
    keeps (NOTE [fp8 accumulation])."""
    m, e = np.frexp(v)
    return np.ldexp(np.trunc(m * 2.0 ** 14) / 2.0 ** 14, e)


def _fp8_kernel_accumulator(A, B, *, fast_accum):
    """The accumulator of an sm90 fp8 kernel, emulated: each MMA adds 32 exact products into a
    sum kept to 14 bits; without fast accumulation that sum starts from zero every 4 MMAs and is
    added to an f32 accumulator (CUTLASS's GmmaFP8Accumulation), with it the whole K stays in the
    14-bit sum."""
    L, M, K = A.shape
    N = B.shape[1]
    blocks = np.einsum("lmsk,lnsk->lmns", A.reshape(L, M, K // 32, 32), B.reshape(L, N, K // 32, 32))
    main = np.zeros((L, M, N), np.float32)
    part = np.zeros((L, M, N))
    for s in range(K // 32):
        part = _keep_14_bits(part + blocks[..., s])
        if not fast_accum and (s + 1) % T.FP8_PROMOTION_INTERVAL == 0:
            main, part = (main + part.astype(np.float32)).astype(np.float32), np.zeros_like(part)
    return (main + part.astype(np.float32)).astype(np.float32)


@evtc.epilogue
def acc_and_amax(acc):
    return {"D": acc, "amax": evtc.amax(acc)}


def _fp8_amax_problem(seed=0):
    """An fp8 GEMM (64 x 64, K = 4096) whose epilogue stores acc in bf16 and its f32 amax."""
    g = passes.run(acc_and_amax.trace(d=bf16), "sm90")
    A, B, ins, acc, sq = EM.host_problem(g, e4m3, (64, 64, 4096, 1), seed)
    assert g.output("amax").dtype is f32
    return g, A, B, ins, acc, sq


def _outputs(acc32):
    return {"D": dtypes.round_to(acc32.astype(np.float64), bf16), "amax": np.float64(np.abs(acc32).max())}


@pytest.mark.parametrize("fast_accum", [False, True])
def test_fp8_kernel_accumulation_passes_its_bound(fast_accum):
    """The emulated accumulator of each fp8 schedule, truncating at every MMA, is inside the bound
    the oracle grants that schedule."""
    g, A, B, ins, acc, sq = _fp8_amax_problem()
    got = _outputs(_fp8_kernel_accumulator(A, B, fast_accum=fast_accum))
    res = T.verify(g, got, acc, T.accumulator_error(sq, 4096, e4m3, fast_accum=fast_accum), ins)
    assert all(r.ok for r in res.values()), {k: r.describe() for k, r in res.items()}


def test_an_fp8_amax_off_by_1_2_percent_fails_without_fast_accumulation():
    """The old oracle granted every fp8 GEMM fast accumulation's bound (2^-13 over all 128 MMAs of
    K = 4096: 6 % of an O(1) accumulator), so an f32 amax 1.2 % too large passed; the kernels
    promote every 4 MMAs into f32 unless fast_accum is set, and now it fails."""
    g, A, B, ins, acc, sq = _fp8_amax_problem()
    got = _outputs(_fp8_kernel_accumulator(A, B, fast_accum=False))
    got["amax"] = got["amax"] * 1.012
    promoted = T.verify(g, got, acc, T.accumulator_error(sq, 4096, e4m3), ins)
    assert promoted["D"].ok and not promoted["amax"].ok, promoted["amax"].describe()
    fast = T.verify(g, got, acc, T.accumulator_error(sq, 4096, e4m3, fast_accum=True), ins)
    assert fast["amax"].ok  # what the old oracle said of every fp8 kernel


def test_the_oracle_reads_fast_accumulation_off_the_gemm():
    assert not T.fast_accumulation(evtc.Gemm(acc_and_amax, a=e4m3, d=bf16))  # the default family
    cfg = evtc.plan.default_config("sm90", e4m3, e4m3).replace(fast_accum=True)
    assert T.fast_accumulation(evtc.Gemm(acc_and_amax, a=e4m3, d=bf16, config=cfg))
    assert not T.fast_accumulation(evtc.Gemm(acc_and_amax, a=bf16, d=bf16))


def test_compare_grants_one_ulp_for_the_two_roundings():
    # e4m3 values in [1, 2) are 0.125 apart; 1.0625 is the tie between 1.0 and 1.125
    exp = np.array([1.0, 1.0, 1.0, 1.0])
    got = np.array([1.0, 1.125, 1.25, 0.875])
    r = T.compare("D", got, exp, e4m3)
    assert r.bad == 2  # 1.25: two ulps above; 0.875: two ulps below (0.0625 apart there)
    assert [T.compare("D", got[i:i + 1], exp[i:i + 1], e4m3).ok for i in range(4)] == [True, True, False, False]


def test_summary_states_the_worst_error_and_its_bound():
    """What `evtc run` and `evtc demo` print: the worst element's error and its allowed bound, as
    numbers and in ulps (not their ratio against a bound of 1)."""
    r = T.compare("D", np.array([1.0, 1.25]), np.array([1.0, 1.0]), e4m3)
    assert r.summary() == ("D: FAILED: 1 of 2 elements outside their bound; worst element (1,): error 2.50e-01 "
                           "(2 ulps of e4m3), allowed 1.25e-01 (1 ulps)")
    assert r.error == 0.25 and r.allowed == 0.125 and r.to_json()["worst"]["allowed"] == 0.125
    ok = T.compare("D", np.array([1.0, 1.125]), np.array([1.0, 1.0]), e4m3)
    assert ok.summary().startswith("D: ok; worst element (1,): error 1.25e-01 (1 ulps of e4m3), allowed 1.25e-01")


def test_compare_adds_the_propagated_bound():
    exp = np.array([0.0, 0.0])
    got = np.array([1e-3, -1e-3])
    assert not T.compare("D", got, exp, bf16).ok
    assert T.compare("D", got, exp, bf16, bound=1e-3).ok
    assert not T.compare("D", got, exp, bf16, bound=5e-4).ok


def test_nan_never_passes():
    exp = np.array([1.0, 2.0, 3.0])
    for got in ([np.nan, 2.0, 3.0], [1.0, np.inf, 3.0]):
        r = T.compare("D", np.array(got), exp, bf16, bound=10.0)
        assert not r.ok and r.bad == 1 and math.isinf(r.excess)
    r = T.compare("D", exp, np.array([1.0, np.nan, 3.0]), bf16)  # the reference itself is NaN
    assert not r.ok and r.index == (1,)
    assert T.compare("D", exp, exp, bf16, bound=np.array([0.0, np.inf, 0.0])).bad == 1  # an unbounded element
    assert T.compare("D", np.array([np.inf, -1.0]), np.array([np.inf, -1.0]), f16).ok  # the same overflow


# ---- correct results pass -----------------------------------------------------------------------------

REFERENCE = ["linear_combination", "bias_relu", "gelu_aux", "dgelu_bgrad", "residual_scale", "row_stats", "fp8_out",
             "many_aux"]


@pytest.mark.parametrize("name", REFERENCE)
@pytest.mark.parametrize("shape", [RAGGED, (33, 136, 1000, 1)], ids=["ragged-batched", "long-K"])
def test_correct_f32_results_pass(name, shape):
    a = e4m3 if name == "fp8_out" else bf16
    s = _setup(_reference(name), a=a, shape=shape, d=None if name == "fp8_out" else bf16)
    res = _verify(s)
    assert all(r.ok for r in res.values()), T.failure_report(res, name, s[0])


@pytest.mark.parametrize("name", ["bias_relu", "row_stats", "dgelu_bgrad"])
def test_correct_f32_results_pass_on_sm80(name):
    s = _setup(_reference(name), arch="sm80", shape=(40, 72, 48, 1), d=f16)
    res = _verify(s)
    assert all(r.ok for r in res.values()), T.failure_report(res, name, s[0])


def test_the_fuzz_epilogues_pass_f32_emulation_sample():
    """The first fuzz epilogues of each arch; the whole list is the slow test below."""
    import strategies as S

    for arch, n in (("sm90", 6), ("sm80", 3)):
        for seed, ep in S.fuzz_epilogues(arch, n):
            s = _setup(ep, shape=(37, 72, 64, 2), seed=seed, arch=arch, d=bf16)
            res = _verify(s)
            assert all(r.ok for r in res.values()), T.failure_report(res, f"fuzz {arch} seed {seed}", s[0])


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_every_fuzz_epilogue_passes_f32_emulation(arch):
    """The oracle must not fail a correct f32 computation of any GPU fuzz epilogue: otherwise the
    GPU fuzz reports false mismatches."""
    import strategies as S

    for seed, ep in S.fuzz_epilogues(arch):
        for shape in ((77, 136, 64, 2), (33, 57, 512, 1)):
            s = _setup(ep, shape=shape, seed=seed, arch=arch, d=bf16)
            res = _verify(s)
            assert all(r.ok for r in res.values()), T.failure_report(res, f"fuzz {arch} seed {seed} {shape}", s[0])


def test_a_where_that_flips_at_its_threshold_passes():
    """acc > C decided differently by the f32 kernel and the float64 reference, where the two are
    within the accumulator's error: the difference of the branches is allowed there, not elsewhere."""

    @evtc.epilogue
    def pick(acc, C):
        return evtc.where(acc > C, acc, C * 0.5)

    g = pick.trace(d=f32)
    acc = np.array([[1.0, 2.0, -1.0]])
    C = np.array([[1.0 + 1e-9, 0.5, 3.0]])
    ins = {"C": C}
    err = np.full_like(acc, 1e-6)
    ref = interpret(g, acc, ins)["D"]
    flipped = ref.copy()
    flipped[0, 0, 0] = 1.0  # the kernel's acc came out a hair above C: it picked acc
    assert T.verify(g, {"D": flipped}, acc, err, ins)["D"].ok
    wrong = ref.copy()
    wrong[0, 0, 1] = 0.25  # picked C * 0.5 although acc is far above C
    r = T.verify(g, {"D": wrong}, acc, err, ins)["D"]
    assert not r.ok and r.index == (0, 0, 1)


# ---- wrong results fail -----------------------------------------------------------------------------

def test_a_wrong_ragged_tail_element_fails():
    s = _setup(_reference("bias_relu"), d=bf16)
    got = {k: v.copy() for k, v in s[4].items()}
    D = got["D"]
    D[1, -1, -1] = D[1, -1, -2]  # the last element of the ragged corner repeats its neighbour
    res = _verify(s, got)
    assert not res["D"].ok and res["D"].bad == 1 and res["D"].index == (1, 76, 49)
    msg = res["D"].describe()
    assert "(1, 76, 49)" in msg and "ulps" in msg and f"got {float(D[1, -1, -1])!r}" in msg
    # the norm-wide bound this oracle replaces let it through
    ref = interpret(s[0], s[1], s[3])["D"]
    assert T.relative_error(D, ref) <= 4 * bf16.eps + 1e-4


def test_a_wrong_ragged_tail_column_fails():
    s = _setup(_reference("gelu_aux"), d=bf16)
    got = {k: v.copy() for k, v in s[4].items()}
    got["F"][:, :, -1] = 0.0  # the last (ragged) column never written properly
    res = _verify(s, got)
    assert res["D"].ok and not res["F"].ok and res["F"].index[2] == 49


def test_two_e4m3_ulps_off_fails_and_one_rounding_apart_passes():
    s = _setup(_reference("fp8_out"), a=e4m3)
    D = s[4]["D"]
    ref = interpret(s[0], s[1], s[3])["D"]
    i = tuple(np.argwhere((np.abs(ref) >= 1.0) & (np.abs(ref) < 2.0))[0])
    assert T.ulp(ref[i], e4m3) == 0.125
    for delta, ok in ((0.125, True), (-0.125, True), (0.25, False), (-0.25, False)):
        got = D.copy()
        got[i] = ref[i] + delta
        r = _verify(s, {**s[4], "D": got})["D"]
        assert r.ok is ok, (delta, r.describe())
        if not ok:
            assert r.index == i and r.ulps == 2.0 and r.bad == 1
    # the norm-wide bound this oracle replaces allowed 25 % for e4m3
    assert 4 * e4m3.eps + 1e-4 > 0.25


def test_an_unwritten_element_fails():
    s = _setup(_reference("many_aux"), d=bf16)
    for out in ("D", "P", "Q"):
        got = {k: v.copy() for k, v in s[4].items()}
        got[out][0, 40, 7] = np.nan  # still NaN-poisoned: never written
        res = _verify(s, got)
        assert [n for n, r in res.items() if not r.ok] == [out]
        assert res[out].nan == 1 and res[out].index == (0, 40, 7) and "NaN" in res[out].describe()
    got = {k: np.full_like(v, np.nan) for k, v in s[4].items()}  # the kernel never ran
    assert all(r.bad == r.total for r in _verify(s, got).values())


def test_a_wrong_reduction_entry_fails():
    s = _setup(_reference("row_stats"), d=bf16)
    g, acc, _, ins, emulated = s
    # row_sum of row 76 without its last (ragged) column's term
    got = {k: v.copy() for k, v in emulated.items()}
    got["row_sum"][1, 76] -= np.exp(emulated["D"][1, 76, -1] - ins["shift"][1, 76])
    res = _verify(s, got)
    assert not res["row_sum"].ok and res["row_sum"].index == (1, 76) and res["row_sum"].bad == 1
    # row_max of a row whose maximum is in its last (ragged) column, from all but that column
    g32 = passes.run(_reference("row_stats").trace(d=f32), "sm90")
    D32 = interpret(g32, acc, ins)["D"]
    row = int(np.flatnonzero(np.argmax(D32[0], axis=1) == D32.shape[2] - 1)[0])
    got = {k: v.copy() for k, v in emulated.items()}
    got["row_max"][0, row] = D32[0, row, :-1].max()
    res = _verify(s, got)
    assert not res["row_max"].ok and res["row_max"].index == (0, row)


@pytest.mark.parametrize("name,out,index", [("dgelu_bgrad", "dbias", (1, 49)), ("fp8_out", "amax", (0,))])
def test_a_wrong_column_or_scalar_reduction_fails(name, out, index):
    a = e4m3 if name == "fp8_out" else bf16
    s = _setup(_reference(name), a=a, d=None if name == "fp8_out" else bf16)
    got = {k: v.copy() for k, v in s[4].items()}
    got[out][index] *= 1.01
    res = _verify(s, got)
    assert not res[out].ok and res[out].index == index
    assert all(r.ok for n, r in res.items() if n != out)


def test_a_dropped_tail_row_in_a_column_sum_fails():
    s = _setup(_reference("dgelu_bgrad"), d=bf16)
    g, acc, _, ins, emulated = s
    got = {k: v.copy() for k, v in emulated.items()}
    got["dbias"] -= emulated["D"][:, -1, :]  # the last (ragged) row left out of every column sum
    res = _verify(s, got)
    assert not res["dbias"].ok and res["dbias"].bad > 0.9 * res["dbias"].total


def test_writes_past_the_last_column_fail():
    s = _setup(_reference("bias_relu"), d=bf16)
    pad = np.full((2, 77, 6), np.nan)
    assert _verify(s, padding={"D": pad})["D"].ok
    pad[1, 10, 0] = 0.5
    r = _verify(s, padding={"D": pad})["D"]
    assert not r.ok and r.padding_written == 1 and "past the last column" in r.describe()


def test_results_unpack_as_the_old_pairs_and_report_as_json():
    s = _setup(_reference("row_stats"), d=bf16)
    res = _verify(s)
    for name, (err, tol) in res.items():  # how evtc.cli and evtc.cli.demo read them
        assert err <= tol
    got = {k: v.copy() for k, v in s[4].items()}
    got["D"][0, 0, 0] = np.nan
    bad = _verify(s, got)
    err, tol = bad["D"]
    assert not err <= tol
    doc = json.loads(json.dumps([r.to_json() for r in bad.values()]))
    assert doc[0]["ok"] is False and doc[0]["worst"]["index"] == [0, 0, 0] and doc[0]["excess"] == "inf"
    assert doc[1]["ok"] is True and doc[1]["max_ulps"] >= 0


def test_the_reference_is_the_interpreters_to_the_bit():
    """verify() takes its reference from reference_and_bounds() (one pass over the graph instead of
    two): it must be exactly evtc.ir.interpret's."""
    import strategies as S

    eps = [(name, _reference(name), e4m3 if name == "fp8_out" else bf16) for name in REFERENCE]
    eps += [(f"fuzz{seed}", ep, bf16) for seed, ep in S.fuzz_epilogues("sm90", 12)]
    for name, ep, a in eps:
        g = passes.run(ep.trace(d=bf16) if a is bf16 else ep.trace(), "sm90")
        _, _, ins, acc, sq = EM.host_problem(g, a, (23, 40, 32, 2), 7)
        ref, bounds = T.reference_and_bounds(g, acc, T.accumulator_error(sq, 32, a), ins)
        want = interpret(g, acc, ins)
        assert ref.keys() == want.keys() == bounds.keys()
        for k in want:
            np.testing.assert_array_equal(ref[k], want[k], err_msg=f"{name}.{k}")
            assert bounds[k].shape == want[k].shape and np.all(bounds[k] >= 0), f"{name}.{k}"
