"""evtc.glu, the one-GEMM gated form, without a GPU: the interpreter against a float64 numpy
reference, the IR text round trip, the verifier's rule glu-store, sm80's refusal, the plan (void
D, the gated store at the root), the configurations and members that can't run it, the emitted
visitor, the binder's M x N/2 output, and the eager forms with interleave_gate_up."""

import numpy as np
import pytest

import evtc
from evtc.errors import ArgumentError, EpilogueTypeError, EvtcError, LegalizeError, PlanError
from evtc.ir.interpret import interpret


def _silu(x):
    return x / (1.0 + np.exp(-x))


def _gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(np.sqrt(2.0 / np.pi) * (x + 0.044715 * x ** 3)))


@evtc.epilogue
def swiglu(acc, bias: evtc.RowVector[evtc.f32]):
    return evtc.glu(acc + bias, act="silu")


@evtc.epilogue(d=evtc.f32)
def geglu_scaled(acc, alpha: float):
    return evtc.glu(alpha * acc, act="gelu_tanh")


def test_interpreter_pairs_interleaved_columns():
    rng = np.random.default_rng(3)
    acc, bias = rng.standard_normal((2, 7, 12)), rng.standard_normal(12)
    out = interpret(swiglu.graph, acc, {"bias": bias})["D"]
    assert out.shape == (2, 7, 6)
    y = acc + bias
    want = _silu(y[..., 0::2]) * y[..., 1::2]
    # D is bf16: within half an ulp of bf16 (2^-9 relative), and not the other pairing
    assert np.all(np.abs(out - want) <= 2.0 ** -8 * np.abs(want) + 1e-30)
    wrong = _silu(y[..., :6]) * y[..., 6:]
    assert not np.allclose(out, wrong, rtol=1e-2)
    out = interpret(geglu_scaled.graph, acc[0], {"alpha": 0.75})["D"]
    assert np.allclose(out[0], _gelu_tanh(0.75 * acc[0][:, 0::2]) * 0.75 * acc[0][:, 1::2], rtol=1e-6, atol=0)


def test_ir_text_round_trips():
    text = str(swiglu.graph)
    assert "glu(%0) {act=silu} : f32" in text
    assert evtc.parse_ir(text) == swiglu.graph


def test_glu_value_is_only_the_one_output():
    def used_inside(acc):
        return evtc.glu(acc) * 2.0

    def beside_another_output(acc):
        return {"D": evtc.glu(acc), "E": acc}

    def stored_twice(acc):
        g = evtc.glu(acc)
        return {"D": g, "E": g}

    def two_glus(acc):
        return {"D": evtc.glu(acc), "E": evtc.glu(acc * 2.0)}

    def converted(acc):
        return evtc.glu(acc).to(evtc.f16)

    for fn in (used_inside, beside_another_output, stored_twice, two_glus, converted):
        with pytest.raises(EpilogueTypeError, match="glu") as e:
            evtc.Gemm(evtc.epilogue(fn))
        assert "evtc.glu" in (e.value.hint or "") or "glu" in str(e.value), fn.__name__


def test_frontend_refuses_bad_arguments():
    for act in ("rleu", "add", "convert", "glu", 3, None):
        with pytest.raises(EvtcError, match="act="):
            evtc.Gemm(evtc.epilogue(lambda acc, act=act: evtc.glu(acc, act=act)))

    @evtc.epilogue
    def row(acc, b: evtc.RowVector):
        return acc + evtc.glu(b)

    with pytest.raises(EpilogueTypeError, match="glu of a row"):
        evtc.Gemm(row)
    with pytest.raises(EvtcError, match="even number of columns"):  # a constant runs eagerly, and is no matrix
        evtc.Gemm(evtc.epilogue(lambda acc: evtc.glu(2.0)))


def test_sm80_refuses_glu():
    with pytest.raises(LegalizeError, match="sm90 only"):
        evtc.Gemm(swiglu, arch="sm80").plan


@pytest.mark.parametrize("cfg, epi", [
    (dict(tile=(128, 256, 64), cluster=(2, 1, 1), schedule="cooperative"), (128, 32)),
    (dict(tile=(64, 256, 64), cluster=(1, 1, 1), schedule="pingpong"), (64, 32)),
    (dict(tile=(128, 176, 64), cluster=(1, 1, 1), schedule="pingpong"), (64, 16)),
])
def test_plan_is_void_d_with_the_gated_store_at_the_root(cfg, epi):
    g = evtc.Gemm(swiglu, config=evtc.GemmConfig(**cfg))
    plan = g.plan
    assert plan.d_slot is None and plan.c_slot is None
    assert tuple(plan.epilogue_tile) == epi
    assert not plan.delay_tma_store  # the gated store's TMA follows its reduce() (NOTE [The gated epilogue])
    assert plan.tree.root.op.role.value == "glu_store"
    tm, tn = cfg["tile"][:2]
    assert f"evtc::Sm90GluStore<cutlass::bfloat16_t, cutlass::epilogue::thread::SiLu, {tm}, {tn}, {epi[0]}, {epi[1]}>" \
        in g.source
    assert "#include <evtc/sm90_glu_store.hpp>" in g.source
    assert "using ElementD = void;" in g.source
    assert "silu(gate) * up" in str(plan)


def test_configurations_that_cant_pair_are_refused_before_any_build():
    swap = evtc.GemmConfig(tile=(64, 16, 64), cluster=(1, 1, 1), schedule="pingpong", swap_ab=True)
    unaligned = evtc.GemmConfig(tile=(128, 128, 64), cluster=(1, 1, 1), unaligned=True)
    for cfg, why in ((swap, "swap-AB"), (unaligned, "unaligned")):
        with pytest.raises(PlanError, match=why):
            evtc.Gemm(swiglu, config=cfg).plan
    with pytest.raises(PlanError, match="16-byte"):  # an e4m3 output row of 8 elements is half a TMA vector
        evtc.Gemm(evtc.epilogue(lambda acc: evtc.glu(acc), d=evtc.e4m3),
                  config=evtc.GemmConfig(tile=(128, 128, 64), epilogue_tile=(128, 16))).plan
    with pytest.raises(PlanError, match="one plan"):
        evtc.Gemm(swiglu, config=evtc.GemmConfig(tile=(128, 128, 64)), plan={"stages_d": 1}).plan


def test_family_keeps_only_members_that_can_pair():
    fam = evtc.Gemm(swiglu).family
    plain = evtc.Gemm("D = acc + bias[n]").family
    assert fam and set(fam) < set(plain)
    assert all(not s.config.swap_ab for s in fam.values())
    assert any(s.config.swap_ab for s in plain.values())  # not vacuous: the plain family has swap members


def test_binder_allocates_and_checks_m_by_n_half():
    from test_runtime_launch import Fake

    M, N, K = 7, 48, 64
    binder = evtc.Gemm(swiglu, a=evtc.f16, d=evtc.f16).dispatch.family.primary_binder()
    sig, _ = binder.signature(Fake((M, K)), Fake((N, K)), {"bias": Fake((N,), "<f4")}, None)
    alloc = next(a for a in sig.allocs if a.name == "D")
    assert alloc.shape == (M, N // 2) and alloc.strides == (N // 2, 1)
    sig, _ = binder.signature(Fake((3, M, K)), Fake((3, N, K)), {"bias": Fake((N,), "<f4")}, None)
    alloc = next(a for a in sig.allocs if a.name == "D")
    assert alloc.shape == (3, M, N // 2)
    args, *_ = binder.bind(Fake((M, K)), Fake((N, K)), {"bias": Fake((N,), "<f4")}, {"D": Fake((M, N // 2), "<f2")})
    assert args.ld_D == N // 2
    with pytest.raises(ArgumentError, match=r"shape \(7, 48\), expected \(7, 24\)"):
        binder.bind(Fake((M, K)), Fake((N, K)), {"bias": Fake((N,), "<f4")}, {"D": Fake((M, N), "<f2")})
    # a caller's D whose rows end mid-vector: the TMA store would write past them (the GPU run of
    # 2026-11-29 found 4 of 504 padding columns written at N / 2 = 500)
    with pytest.raises(evtc.MisalignedError, match=r"N / 2 = 500 \(evtc.glu's\)"):
        binder.bind(Fake((M, K)), Fake((1000, K)), {"bias": Fake((1000,), "<f4")},
                    {"D": Fake((M, 500), "<f2", strides=(504, 1))})
    args, *_ = binder.bind(Fake((M, K)), Fake((1000, K)), {"bias": Fake((1000,), "<f4")}, None)
    assert args.ld_D == 504  # evtc's own allocation: rows padded to 16 bytes
    with pytest.raises(ArgumentError, match="must be even"):
        binder.bind(Fake((M, K)), Fake((N - 8 + 1, K)), {"bias": Fake((N - 7,), "<f4")}, None)


def test_eager_glu_and_interleave():
    rng = np.random.default_rng(5)
    wg, wu = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    w = evtc.interleave_gate_up(wg, wu)
    assert w.shape == (6, 4) and np.array_equal(w[0::2], wg) and np.array_equal(w[1::2], wu)
    x = rng.standard_normal((5, 4))
    y = x @ w.T
    assert np.allclose(evtc.glu(y, "silu"), _silu(x @ wg.T) * (x @ wu.T), rtol=1e-12, atol=0)
    bg, bu = rng.standard_normal(3), rng.standard_normal(3)
    assert np.array_equal(evtc.interleave_gate_up(bg, bu)[1::2], bu)
    ge, ue = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 3, 4))
    we = evtc.interleave_gate_up(ge, ue)
    assert we.shape == (2, 6, 4) and np.array_equal(we[:, 0::2], ge)
    be = evtc.interleave_gate_up(rng.standard_normal((2, 3)), rng.standard_normal((2, 3)), dim=-1)
    assert be.shape == (2, 6)
    for bad in ((wg, wu[:2]), (wg, wu.astype(np.float32)), (wg, list(wu))):
        with pytest.raises(ArgumentError):
            evtc.interleave_gate_up(*bad)
    with pytest.raises(ArgumentError, match="even"):
        evtc.glu(np.ones((2, 3)))
    with pytest.raises(ArgumentError, match="act="):
        evtc.glu(np.ones((2, 4)), act="nope")


def test_eager_glu_on_torch_matches_torch():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 10, dtype=torch.float64)
    want = torch.nn.functional.silu(x[:, 0::2]) * x[:, 1::2]
    assert torch.equal(evtc.glu(x), want)
    wg, wu = torch.randn(5, 3), torch.randn(5, 3)
    w = evtc.interleave_gate_up(wg, wu)
    assert w.is_contiguous() and torch.equal(w[0::2], wg) and torch.equal(w[1::2], wu)


def test_oracle_reference_is_the_interpreters_and_bounds_the_pair():
    from evtc.testing.oracle import reference_and_bounds

    rng = np.random.default_rng(9)
    acc, bias = rng.standard_normal((2, 5, 16)), rng.standard_normal(16)
    ref, bound = reference_and_bounds(swiglu.graph, acc, 1e-6, {"bias": bias})
    assert ref["D"].shape == bound["D"].shape == (2, 5, 8)
    assert np.array_equal(ref["D"], interpret(swiglu.graph, acc, {"bias": bias})["D"])
    # the bound covers a perturbation of the accumulator by its error, and is not vacuous
    y = acc + bias
    moved = _silu(y[..., 0::2] + 1e-6) * (y[..., 1::2] + 1e-6 * np.sign(y[..., 1::2]))
    assert np.all(np.abs(moved - _silu(y[..., 0::2]) * y[..., 1::2]) <= bound["D"])
    assert np.all(bound["D"] < 1e-4 * (1 + np.abs(ref["D"])))


def test_grouped_gemm_pairs_columns_through_the_group_table():
    """evtc.GroupedGemm with evtc.glu: void C and D, the gated store register-direct through a
    per-group pointer of the (T, N / 2) output, on every member."""
    gg = evtc.GroupedGemm(swiglu)
    for m in gg.members:
        plan = gg.kernel(m).plan
        assert plan.d_slot is None and plan.config.grouped
        src = gg.source(m)
        assert "evtc::Sm90GluStoreGrouped<cutlass::bfloat16_t, cutlass::epilogue::thread::SiLu" in src
        assert "t.ptr_D[e] = nullptr;" in src and "args.p_D) + start * args.ld_D;" in src
        assert "register-direct per group" in str(plan)


def test_grouped_torch_op_gives_n_half_columns():
    torch = pytest.importorskip("torch")
    gg = evtc.GroupedGemm(swiglu)
    op = gg.torch_op()
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        A, B = torch.empty(10, 64, dtype=torch.bfloat16), torch.empty(3, 48, 64, dtype=torch.bfloat16)
        offs, bias = torch.empty(3, dtype=torch.int32), torch.empty(3, 48)
        out = op.op(A, B, offs, bias)
    assert tuple(out.shape) == (10, 24)
