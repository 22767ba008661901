"""Kernel families without a GPU: the default members, the heuristic's choices, swap-AB's
struct, the unaligned variant's checks, the tuner's store."""

import json

import pytest

import evtc
from evtc import bf16
from evtc.family.spec import Problem, default_family, scheduled_tiles, split_count
from evtc.family.swap_ab import transpose
from evtc.dispatch.tune import TuneStore, candidates, shape_bucket
from evtc.passes import run

from test_runtime_launch import Fake  # noqa: E402


@pytest.fixture
def family():
    return {s.name: s for s in default_family("sm90", bf16, bf16)}


def test_the_default_family_is_few_legal_kernels(family):
    assert list(family) == ["large", "pingpong", "streamk", "kheavy", "small", "pp128", "pp64x256", "pp128x176",
                            "swap", "swap16", "swap16_c4", "swapk"]
    for s in family.values():
        evtc.plan.validate(s.config, "sm90", bf16, bf16)
    assert family["large"].config == evtc.plan.default_config("sm90", bf16, bf16)
    assert family["streamk"].config.scheduler == "streamk" and family["kheavy"].config.scheduler == "streamk"
    assert family["swap"].config.swap_ab and family["small"].config.schedule == "pingpong"
    assert family["swap16"].config.swap_ab and family["swap16"].config.tile[:2] == (64, 16)
    assert family["swap16_c4"].config == family["swap16"].config.replace(cluster=(4, 1, 1))
    assert family["swapk"].config.swap_ab and family["swapk"].config.scheduler == "streamk"


def test_the_tile_order_band_never_pads_the_problem(family):
    """NOTE [Swizzle padding]: CUTLASS rounds each tile count up to cluster x band and runs the
    padding; fit_swizzle narrows the band where that would add more than 3 % of tiles."""
    from evtc.family.spec import fit_swizzle

    large = family["large"].config.replace(swizzle=3)
    # 1024 rows are 8 tiles of 128; 2x1 clusters of 8-tile bands round them to 16: twice the work
    assert scheduled_tiles(large, 1024, 14336) == scheduled_tiles(large, 2048, 14336) == 16 * 56
    assert scheduled_tiles(large, 1024, 14336, swizzle=2) == 8 * 56
    for M in (512, 1024, 1536, 3072):
        s = fit_swizzle(family["large"], Problem(M, 14336, 4096))
        assert s.config.swizzle < 3, M
        assert scheduled_tiles(s.config, M, 14336) <= 1.03 * scheduled_tiles(s.config, M, 14336, swizzle=0)
    # no padding at 2048 or 4096 rows: the measured 8-tile band stays (config None = the default)
    assert fit_swizzle(family["large"], Problem(2048, 14336, 4096)).config.swizzle in (None, 3)
    # ping-pong's one-tile order has nothing to narrow
    assert fit_swizzle(family["pingpong"], Problem(8192, 8192, 8192)).config.swizzle in (None, 0)


def test_clustered_members_have_cluster_less_variants(family):
    """NOTE [Cluster padding]: each clustered member's variant without its cluster is a candidate
    (built on demand), unless another member already has that configuration."""
    from evtc.dispatch import space

    c1 = {s.name: s for s in space.cluster_variants(tuple(family.values()))}
    assert sorted(c1) == ["large_c1", "pingpong_c1"]  # swap16_c4 without its cluster is swap16
    assert c1["large_c1"].config == family["large"].config.replace(cluster=(1, 1, 1))
    # an LM head at 128 tokens: one M tile of `large` is scheduled as two in 2x1 clusters
    assert scheduled_tiles(family["large"].config, 128, 50264, swizzle=0) == 2 * scheduled_tiles(
        c1["large_c1"].config, 128, 50264, swizzle=0)


def test_split_count_fills_the_machine_without_tiny_splits():
    assert split_count(132, 1000, 132) == 1
    assert split_count(32, 1000, 132) == 4  # 128 CTAs: one wave
    assert split_count(4, 200, 132) == 2  # at least MIN_SPLIT_K_TILES (96) K tiles per split
    assert split_count(4, 95, 132) == 1
    assert split_count(1, 10000, 132) == 16  # at most 16


def test_swap_ab_transposes_broadcasts_and_reductions():
    import epilogues as E

    g = run(E.row_stats.trace(), "sm90")
    t = transpose(g)
    assert "shift: f32 row" in str(t) and "dim=0" in str(t)
    assert transpose(t) == g
    # the argument structs agree field by field: the binder only swaps values
    from evtc.abi import abi_fields

    assert [f.name for f in abi_fields(g, "sm90")] == [f.name for f in abi_fields(t, "sm90")]


def test_swap_ab_kernel_gets_n_m_and_b_a():
    import epilogues as E

    g = evtc.Gemm(E.bias_relu, a=evtc.f16, c=evtc.f16, d=evtc.f16,
                  config=evtc.GemmConfig(tile=(128, 32, 64), cluster=(1, 1, 1), scheduler="streamk", swap_ab=True))
    assert "cute::Stride<cute::_1, int64_t, int64_t>" in g.source  # column-major M x N tensors
    assert "Sm90ColBroadcast" in g.source and "Sm90RowBroadcast" not in g.source  # bias[n] along the kernel's M
    A, B = Fake((16, 256), "<f2"), Fake((4096, 256), "<f2")
    C = Fake((16, 4096), "<f2")
    b = g.dispatch.family.primary_binder()
    assert b.swap
    sig, ptrs = b.signature(A, B, {"C": C, "alpha": 1.0, "beta": 1.0, "bias": Fake((4096,), "<f4")})
    assert (sig.M, sig.N) == (16, 4096)  # the user's problem
    assert (sig.values["M"], sig.values["N"]) == (4096, 16)  # the kernel's
    assert sig.values["ld_A"] == 256 and sig.values["ld_C"] == 4096


def test_unaligned_variant_accepts_odd_rows_the_tma_kernel_refuses():
    import epilogues as E

    A, B = Fake((64, 64), "<f2"), Fake((63, 64), "<f2")
    C = Fake((64, 63), "<f2")
    kw = {"C": C, "alpha": 1.0, "beta": 1.0, "bias": Fake((63,), "<f4")}
    tma = evtc.Gemm(E.bias_relu, c=evtc.f16, d=evtc.f16, a=evtc.f16)
    with pytest.raises(evtc.ArgumentError, match="TMA needs a multiple of 16"):
        tma.dispatch.family.primary_binder().signature(A, B, kw)
    un = evtc.Gemm(E.bias_relu, c=evtc.f16, d=evtc.f16, a=evtc.f16, config=evtc.GemmConfig(unaligned=True))
    sig, _ = un.dispatch.family.primary_binder().signature(A, B, kw)
    assert sig.values["ld_C"] == 63
    assert "ElementD = void" in un.source and ", 1>;" in un.source  # void D, one-element accesses


def test_gemm_choose_uses_the_model_and_the_tuned_store(tmp_path, monkeypatch):
    import epilogues as E
    from evtc.dispatch.tune import record_of

    monkeypatch.setenv("EVTC_CACHE_DIR", str(tmp_path / "cache"))
    g = evtc.Gemm(E.bias_relu)
    fam = g.dispatch.family
    model = g.choose(8192, 8192, 8192)
    assert model == fam.ranked(Problem(8192, 8192, 8192))[0]  # the model's first
    store = TuneStore.for_family(fam)
    tuned = fam.members["streamk"].with_runtime(split_k=2, decomposition="split_k")
    store.put(shape_bucket(8192, 8192, 8192), "H100", record_of(tuned))
    s = g.choose(8000, 8000, 8000, device="H100")  # the same bucket
    assert s == tuned
    assert g.choose(8000, 8000, 8000, device="another GPU") == g.choose(8000, 8000, 8000)
    assert json.loads(store.path.read_text())["format"] == 2
    # a record this evtc can't read (an older format's shape) is no choice
    store.put(shape_bucket(8192, 8192, 8192), "H100", {"member": "streamk", "runtime": {"split_k": 2}})
    fam.forget_tuning()
    assert g.choose(8000, 8000, 8000, device="H100") == g.choose(8000, 8000, 8000)
    # a pinned Gemm is a family of one
    p = evtc.Gemm(E.bias_relu, config=evtc.GemmConfig())
    assert list(p.family) == ["pinned"] and p.choose(16, 4096, 4096).name == "pinned"


def test_tuning_candidates_are_the_models_first_or_the_whole_space():
    import epilogues as E

    g = evtc.Gemm(E.bias_relu)
    fam = g.dispatch.family
    p = Problem(512, 512, 32768)
    every = candidates(fam, p, top=None)
    names = {(c.name, c.config.split_k, c.config.decomposition) for c in every}
    assert ("large", 1, "heuristic") in names and ("streamk", 1, "stream_k") in names
    assert ("streamk", 8, "split_k") in names and ("large_c1", 1, "heuristic") in names
    assert candidates(fam, p) == every[:4] == fam.ranked(p)[:4]
    assert not any(c.config.swap_ab for c in candidates(fam, Problem(4096, 4096, 4096), top=None))


def test_scalar_reductions_never_run_stream_k():
    """NOTE [Scalar reductions and stream-K]: fp8_out's amax was wrong under the stream-K
    decomposition on the H100; an explicit stream_k is refused, CUTLASS's heuristic (which may
    pick it) runs data-parallel or split-K, the tuner does not time it, and the kernel always
    initialises the amax (CUTLASS fills it in initialize_workspace, even without a workspace)."""
    import epilogues as E
    from evtc.dispatch.family import scheduler_args as _scheduler_args
    from evtc.plan.config import DECOMPOSITIONS

    ep = E.REFERENCE["fp8_out"]
    with pytest.raises(evtc.ConfigError, match="stream_k"):
        evtc.Gemm(ep, a=evtc.e4m3, b=evtc.e4m3, config=evtc.GemmConfig(scheduler="streamk", decomposition="stream_k"))
    g = evtc.Gemm(ep, a=evtc.e4m3, b=evtc.e4m3)
    cfg = evtc.GemmConfig(scheduler="streamk", tile=(128, 128, 64), cluster=(1, 1, 1), swizzle=1, raster="heuristic")
    assert _scheduler_args(cfg, "sm90", g.graph)["decomposition_mode"] == DECOMPOSITIONS.index("data_parallel")
    split = cfg.replace(split_k=3)
    assert _scheduler_args(split, "sm90", g.graph)["decomposition_mode"] == DECOMPOSITIONS.index("split_k")
    # an epilogue without one keeps CUTLASS's heuristic and may be tuned with stream-K
    b = evtc.Gemm(E.bias_relu)
    assert _scheduler_args(cfg, "sm90", b.graph)["decomposition_mode"] == DECOMPOSITIONS.index("heuristic")
    assert not any(c.config.decomposition == "stream_k" for c in candidates(g.dispatch.family, Problem(512, 512, 32768),
                                                                             top=None))
    for spec in g.family.values():
        src = g.kernel(spec).source
        assert "with or without a workspace:\n  // always call it" in src and "if (workspace != nullptr)" not in src
    assert "if (workspace != nullptr)" in b.source


def test_every_reference_epilogue_plans_every_family_member():
    import epilogues as E

    for name, ep in E.REFERENCE.items():
        a = evtc.e4m3 if name == "fp8_out" else bf16
        g = evtc.Gemm(ep, a=a, b=a)
        for k in g.kernels():
            assert k.plan.mainloop_stages >= 2, (name, k.spec.name)
        assert g.kernel("unaligned").plan.config.unaligned


def test_atomic_reductions_in_the_stream_k_members():
    """NOTE [Atomic reductions in the stream-K members]: an epilogue whose row/column reductions
    are all f32 max/min gets atomic ones in streamk and kheavy too, which then never run the
    stream-K decomposition; an epilogue with a sum keeps the workspace there."""
    import epilogues as E
    from evtc.dispatch.family import check_decomposition
    from evtc.dispatch.family import scheduler_args as _scheduler_args
    from evtc.plan.config import DECOMPOSITIONS

    @evtc.epilogue
    def rowmax(acc, bias: evtc.RowVector[evtc.f32]):
        D = acc + bias
        return {"D": D, "row_max": evtc.max(D, dim=1)}

    rm = evtc.Gemm(rowmax)
    for name in ("streamk", "kheavy"):
        cfg = rm.family[name].config
        assert cfg.atomic_reductions is True
        assert "Sm90ColReductionAtomic" in rm.kernel(name).source
        assert _scheduler_args(cfg.replace(swizzle=1), "sm90", rm.graph)["decomposition_mode"] == DECOMPOSITIONS.index("data_parallel")
    assert rm.family["large"].config.atomic_reductions is None  # atomic by default there
    # neither the model nor the tuner runs stream-K for them
    assert not any(c.config.decomposition == "stream_k" for c in candidates(rm.dispatch.family, Problem(2048, 2048, 8192),
                                                                             top=None))
    assert rm.choose(1024, 1024, 16384).config.decomposition != "stream_k"
    # row_stats has a row sum: its stream-K members are unchanged (workspace, stream-K allowed)
    stats = evtc.Gemm(E.REFERENCE["row_stats"])
    assert stats.family["streamk"].config.atomic_reductions is None
    assert "Sm90ColReductionParallel<cutlass::maximum" in stats.kernel("streamk").source
    # pinned: stream-K with the default (None) keeps the workspace and runs; True refuses it
    sk = evtc.GemmConfig(scheduler="streamk", tile=(128, 128, 64), cluster=(1, 1, 1), decomposition="stream_k")
    check_decomposition(rm.graph, sk)
    assert evtc.Gemm(rowmax, config=sk).plan.buffer("row_max").mode == "workspace"
    with pytest.raises(evtc.ConfigError, match="atomic_reductions=False"):
        evtc.Gemm(rowmax, config=sk.replace(atomic_reductions=True))
    # False keeps even a persistent member on the workspace
    assert evtc.Gemm(rowmax, config=evtc.GemmConfig(atomic_reductions=False)).plan.buffer("row_max").mode == "workspace"


def test_atomic_reductions_config_field():
    cfg = evtc.GemmConfig()
    assert "atomic_reductions" not in cfg.to_json()  # left out while None: old sources unchanged
    assert cfg.replace(atomic_reductions=True).to_json()["atomic_reductions"] is True
    assert evtc.GemmConfig.from_json(cfg.replace(atomic_reductions=False).to_json()).atomic_reductions is False
    with pytest.raises(evtc.ConfigError, match="atomic_reductions"):
        evtc.Gemm(E_bias_relu(), config=evtc.GemmConfig(atomic_reductions="yes"))
    with pytest.raises(evtc.ConfigError, match="atomic_reductions"):
        evtc.Gemm(E_bias_relu(), config=evtc.GemmConfig(atomic_reductions=1))


def E_bias_relu():
    import epilogues as E

    return E.bias_relu




def test_stream_k_is_not_a_candidate_over_a_short_k():
    """NOTE [Stream-K over a short K]: at <= 4 K tiles a tile the stream-K decomposition is not
    offered (data-parallel is); over a long K it is."""
    import epilogues as E
    from evtc.dispatch.space import MIN_K_TILES_FOR_STREAM_K

    fam = evtc.Gemm(E.bias_relu).dispatch.family

    def stream_k(K):
        return [c for c in candidates(fam, Problem(16384, 3072, K), top=None) if c.config.decomposition == "stream_k"]

    assert MIN_K_TILES_FOR_STREAM_K == 5
    assert not stream_k(64) and not stream_k(4 * 64)
    assert stream_k(5 * 64) and stream_k(4096)


def test_quantize_scales_are_not_a_cross_tile_reduction():
    """evtc.quantize's GroupScale is whole inside one subtile: no atomics, so the stream-K
    decomposition is a candidate, the stream-K member keeps its workspace setting, and the
    selection ranks the epilogue as pointwise; a row max beside it still counts."""
    from evtc.dispatch.family import atomic_reductions
    from evtc.dispatch.select import epilogue_class
    from evtc.family.spec import EpilogueTraits

    @evtc.epilogue
    def quant(acc):
        q, s = evtc.quantize(acc, evtc.e4m3, group=128)
        return {"D": q, "D_scale": s}

    @evtc.epilogue
    def quant_rowmax(acc):
        q, s = evtc.quantize(acc, evtc.e4m3, group=128)
        return {"D": q, "D_scale": s, "m": evtc.max(acc, dim=1)}

    g = evtc.Gemm(quant)
    fam = g.dispatch.family
    assert epilogue_class(fam.graph) == "pointwise" and not EpilogueTraits.of(fam.graph).reductions
    assert not any(atomic_reductions(fam.graph, s.config) for s in fam.members.values())
    assert fam.members["streamk"].config.atomic_reductions is None
    sk = [c for c in candidates(fam, Problem(16, 36864, 7168), top=None) if c.config.decomposition == "stream_k"]
    assert sk and all(c.name == "streamk" for c in sk)
    h = evtc.Gemm(quant_rowmax).dispatch.family
    assert epilogue_class(h.graph) == "reduce" and EpilogueTraits.of(h.graph).reductions


def test_the_unaligned_members_rule():
    """NOTE [The unaligned members' rule]: ping-pong at M <= 128 without reductions, else
    cooperative."""
    import epilogues as E

    g = evtc.Gemm(E.bias_relu)
    r = evtc.Gemm(E.REFERENCE["row_stats"])

    def name(gemm, M, N=50257, K=1024):
        return gemm.choose(M, N, K, aligned_mn=False).name

    assert name(g, 1) == name(g, 128) == "unaligned_pingpong"
    assert name(g, 129) == name(g, 8192) == "unaligned"
    assert name(r, 8) == name(r, 8192) == "unaligned"


def test_atomic_row_and_column_sums_only_where_asked():
    """NOTE [Atomic row and column sums]: atomic_reductions=True adds row and column sums into f32
    with float atomics (cutlass::atomic_add through the same visitors as max and min); by default
    (None, False) sums stay on the workspace, and batch_invariant=True refuses the atomic ones."""
    import epilogues as E

    atomic = evtc.GemmConfig(tile=(128, 128, 64), atomic_reductions=True)
    stats = evtc.Gemm(E.REFERENCE["row_stats"], config=atomic)
    assert {b.name: b.mode for b in stats.plan.buffers if b.role == "row_reduction"} == \
        {"row_max": "atomic", "row_sum": "atomic"}
    assert "Sm90ColReductionAtomic<cutlass::plus, cutlass::plus, cutlass::atomic_add" in stats.source
    bgrad = evtc.Gemm(E.REFERENCE["dgelu_bgrad"], config=atomic)
    assert bgrad.plan.buffer("dbias").mode == "atomic"
    assert "Sm90RowReductionAtomic<cutlass::plus, cutlass::plus, cutlass::atomic_add" in bgrad.source
    for cfg in (evtc.GemmConfig(tile=(128, 128, 64)), atomic.replace(atomic_reductions=False)):
        assert evtc.Gemm(E.REFERENCE["row_stats"], config=cfg).plan.buffer("row_sum").mode == "workspace"
    with pytest.raises(evtc.ConfigError, match="row_sum"):
        evtc.Gemm(E.REFERENCE["row_stats"], config=atomic, batch_invariant=True)
    # a sum into a 16-bit output has no float atomic: the workspace, whatever is asked
    @evtc.epilogue
    def half_sum(acc):
        return {"D": acc, "s": evtc.sum(acc, dim=1).to(evtc.bf16)}

    assert evtc.Gemm(half_sum, config=atomic).plan.buffer("s").mode == "workspace"


def test_atomic_sums_on_every_member():
    """Gemm(atomic_sums=True): every member adds its row and column sums with float atomics
    (atomic_reductions=True where unset), so no member runs the stream-K decomposition with
    them; refused with batch_invariant; a backend option too."""
    import epilogues as E

    g = evtc.Gemm(E.REFERENCE["dgelu_bgrad"], atomic_sums=True)
    assert all(s.config.atomic_reductions is True for s in g.family.values())
    assert g.plan.buffer("dbias").mode == "atomic" and "cutlass::atomic_add" in g.source
    plain = evtc.Gemm(E.REFERENCE["dgelu_bgrad"])
    assert plain.plan.buffer("dbias").mode == "workspace"
    assert not any(c.config.decomposition == "stream_k"
                   for c in candidates(g.dispatch.family, Problem(1024, 1024, 16384), top=None))
    with pytest.raises(evtc.ConfigError, match="atomic_sums=True with batch_invariant=True"):
        evtc.Gemm(E.REFERENCE["dgelu_bgrad"], atomic_sums=True, batch_invariant=True)
    with pytest.raises(evtc.EvtcError, match="atomic_sums"):
        evtc.Gemm(E.REFERENCE["dgelu_bgrad"], atomic_sums="yes")
    from evtc.torch.backend import GEMM_OPTIONS

    assert "atomic_sums" in GEMM_OPTIONS
