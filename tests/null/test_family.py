"""Kernel families without a GPU: the default members, the heuristic's choices, swap-AB's
struct, the unaligned variant's checks, the tuner's store."""

import json

import pytest

import evtc
from evtc import bf16, f32
from evtc.family.spec import KernelSpec, Problem, choose, default_family, scheduled_tiles, split_count
from evtc.family.swap_ab import transpose
from evtc.dispatch.tune import TuneStore, candidates, shape_bucket
from evtc.passes import run

from test_runtime_launch import Fake  # noqa: E402


@pytest.fixture
def family():
    return {s.name: s for s in default_family("sm90", bf16, bf16)}


def pick(family, *shape, **kw):
    return choose(family, Problem(*shape, **kw), "sm90", bf16, bf16)


def test_the_default_family_is_few_legal_kernels(family):
    assert list(family) == ["large", "pingpong", "streamk", "kheavy", "small", "pp128", "pp64x256", "pp128x176",
                            "swap", "swap16", "swap16_c4"]
    for s in family.values():
        evtc.plan.validate(s.config, "sm90", bf16, bf16)
    assert family["large"].config == evtc.plan.default_config("sm90", bf16, bf16)
    assert family["streamk"].config.scheduler == "streamk" and family["kheavy"].config.scheduler == "streamk"
    assert family["swap"].config.swap_ab and family["small"].config.schedule == "pingpong"
    assert family["swap16"].config.swap_ab and family["swap16"].config.tile[:2] == (64, 16)
    assert family["swap16_c4"].config == family["swap16"].config.replace(cluster=(4, 1, 1))


def test_heuristic_by_shape(family):
    """The choices bench_shapes.py's problems get (each the fastest or within a few per cent of
    it in benchmarks/explore_small.py's measurements, docs/performance.md)."""
    expect = {
        (8192, 8192, 8192): "pingpong", (4096, 14336, 4096): "pingpong", (16384, 4096, 1024): "pingpong",
        (4096, 4096, 4096): "large", (8192, 4096, 14336): "large", (2048, 2048, 2048, 4): "large",
        # NOTE [Decode tiles in 4x1 clusters]: M <= 16 against N >= 4096, any K
        (1, 4096, 4096): "swap16_c4", (16, 4096, 4096): "swap16_c4", (16, 4096, 14336): "swap16_c4",
        (1, 2048, 4096): "swap16", (32, 28672, 4096): "swap16", (24, 8192, 8192): "swap16",
        (64, 8192, 8192): "swap", (32, 4096, 14336): "swap",  # M of 33-64, or K > 2N: the 32-wide tile
        (128, 14336, 4096): "small", (256, 4096, 14336): "small", (1000, 1000, 1000): "small",
        (768, 768, 3072): "small",  # long K relative to M and N, but too few K tiles to split
        # NOTE [Ping-pong 128x128 tiles below two waves]
        (512, 4096, 4096): "pp128", (2048, 2048, 8192): "pp128", (512, 1024, 4096, 8): "pp128",
        (1024, 4096, 14336): "pp128",
        (1024, 1024, 16384): "kheavy", (512, 512, 32768): "kheavy",
    }
    for shape, name in expect.items():
        assert pick(family, *shape).name == name, shape


def test_the_64x256_ping_pong_tile_takes_m_up_to_2048_against_a_long_n(family):
    """NOTE [The 64x256 ping-pong tile]: the measured winners take it, the measured losers and
    the problems around them don't."""
    from evtc.family.spec import EpilogueTraits

    for traits in (EpilogueTraits(), EpilogueTraits(aux_stores=True), EpilogueTraits(reductions=True)):
        # (1024 and 2048 x 14336, 1024 x 28672 take 128x176 tiles first: NOTE [The 128x176 ping-pong
        # tile]; without it in the family, this rule decides)
        no176 = {k: v for k, v in family.items() if k != "pp128x176"}
        for shape in ((1024, 14336, 4096), (2048, 14336, 4096), (1024, 28672, 4096)):
            assert choose(no176, Problem(*shape), "sm90", bf16, bf16, traits).name == "pp64x256", (shape, traits)
        assert choose(family, Problem(1024, 8192, 8192), "sm90", bf16, bf16, traits).name == "pp64x256", traits
        for shape in ((1536, 14336, 4096), (3072, 14336, 4096), (8192, 14336, 4096), (2048, 2048, 2048, 4),
                      (2048, 4096, 4096), (1024, 4096, 14336), (2048, 4096, 14336), (512, 14336, 4096),
                      (128, 14336, 4096)):
            assert choose(family, Problem(*shape), "sm90", bf16, bf16, traits).name != "pp64x256", (shape, traits)
    # reductions through the workspace (a sum) were not measured on it
    sums = EpilogueTraits(reductions=True, workspace_reductions=True)
    assert choose(family, Problem(1024, 14336, 4096), "sm90", bf16, bf16, sums).name != "pp64x256"
    # few tiles, long K: split-K fills the SMs (32 tiles of 128x64, 512 K tiles: 4 splits of 128)
    s = pick(family, 512, 512, 32768)
    assert (s.config.split_k, s.config.decomposition) == (4, "split_k")
    # a wave of 128x64 tiles already: no split, and data-parallel (no stream-K workspace)
    s = pick(family, 1024, 1024, 16384)
    assert (s.config.split_k, s.config.decomposition) == (1, "data_parallel")
    sums = EpilogueTraits(reductions=True, workspace_reductions=True)
    s = choose(family, Problem(512, 4096, 4096), "sm90", bf16, bf16, sums)
    assert (s.name, s.config.decomposition) == ("streamk", "data_parallel")
    # alignment
    assert pick(family, 4096, 4095, 4096, aligned_mn=False).config.unaligned
    s = pick(family, 4096, 4096, 4095, aligned_k=False)
    assert s.arch == "sm80"


def test_the_128x176_ping_pong_tile_takes_a_long_n_where_it_fills_the_waves_best(family):
    """NOTE [The 128x176 ping-pong tile]: the measured winners take it whatever the epilogue's
    traits (but reductions through the workspace), the measured losers keep their pick, and an
    epilogue with a column reduction doesn't have the member (its tile N is not a multiple of 64)."""
    import epilogues as E
    from evtc.family.spec import EpilogueTraits, useful_fraction

    spec = family["pp128x176"]
    assert spec.config.schedule == "pingpong" and spec.config.tile[:2] == (128, 176)
    assert tuple(spec.config.cluster) == (1, 1, 1)
    # 14336 columns are 81.5 tiles of 176: 656 tiles at 1024 rows, 5 waves of 132
    assert useful_fraction(Problem(1024, 14336, 4096), (128, 176)) == 1024 * 14336 / (5 * 132 * 128 * 176)
    assert useful_fraction(Problem(128, 128, 64), (128, 128)) == 1 / 132
    for traits in (EpilogueTraits(), EpilogueTraits(aux_stores=True), EpilogueTraits(reductions=True)):
        for shape in ((1024, 14336, 4096), (2048, 14336, 4096), (1024, 28672, 4096), (1024, 11008, 4096),
                      (2048, 11008, 4096), (3072, 14336, 4096)):
            assert choose(family, Problem(*shape), "sm90", bf16, bf16, traits).name == "pp128x176", (shape, traits)
        # another tile fills the waves better (0.94 against pp64x256's 0.97; 0.93 against 128x192's
        # 0.97); past M = 3072; under 3.5 waves; K > 2N; an N below 8192
        expect = {(1024, 8192, 8192): "pp64x256", (1536, 14336, 4096): "pingpong", (8192, 14336, 4096): "pingpong",
                  (4096, 14336, 4096): "pingpong", (512, 14336, 4096): "large", (1024, 4096, 14336): "pp128",
                  (2048, 4096, 4096): "large"}
        for shape, name in expect.items():
            assert choose(family, Problem(*shape), "sm90", bf16, bf16, traits).name == name, (shape, traits)
    # aux stores below K = 4096 stay off ping-pong; reductions through the workspace were not measured
    assert choose(family, Problem(1024, 14336, 2048), "sm90", bf16, bf16,
                  EpilogueTraits(aux_stores=True)).name != "pp128x176"
    sums = EpilogueTraits(reductions=True, workspace_reductions=True)
    assert choose(family, Problem(1024, 14336, 4096), "sm90", bf16, bf16, sums).name != "pp128x176"
    # a column reduction (the bias gradient): the member is not in the family at all
    bgrad = evtc.Gemm(E.REFERENCE["dgelu_bgrad"])
    assert "pp128x176" not in bgrad.family and "pp128x176" in evtc.Gemm(E.bias_relu).family
    assert "pp128x176" in evtc.Gemm(E.REFERENCE["row_stats"]).family  # a row reduction takes any tile N


def test_ping_pong_128x128_takes_most_of_a_wave_to_two(family):
    """NOTE [Ping-pong 128x128 tiles below two waves]: the problems that went to ``streamk``
    data-parallel take ``pp128`` from K = 4096 on, except epilogues whose reductions go through
    the workspace; around them nothing changes."""
    from evtc.family.spec import EpilogueTraits

    assert family["pp128"].config.schedule == "pingpong" and family["pp128"].config.tile[:2] == (128, 128)
    assert tuple(family["pp128"].config.cluster) == (1, 1, 1)
    fc2 = Problem(1024, 4096, 14336)
    for traits in (EpilogueTraits(), EpilogueTraits(reductions=True), EpilogueTraits(aux_stores=True)):
        assert choose(family, fc2, "sm90", bf16, bf16, traits).name == "pp128", traits
    sums = EpilogueTraits(reductions=True, workspace_reductions=True)
    assert choose(family, fc2, "sm90", bf16, bf16, sums).name == "streamk"
    # K below 4096 (none measured): streamk, whatever the epilogue
    for traits in (EpilogueTraits(), EpilogueTraits(aux_stores=True)):
        assert choose(family, Problem(2048, 2048, 2048), "sm90", bf16, bf16, traits).name == "streamk"
    assert choose(family, Problem(2048, 2048, 4096), "sm90", bf16, bf16).name == "pp128"
    # a wave of 128x256 tiles, few tiles (M <= 256) or under 3/4 of a wave of 128x128: not this rule
    assert pick(family, 2048, 4096, 14336).name == "large"
    assert pick(family, 256, 4096, 14336).name == "small"
    assert pick(family, 384, 2048, 4096).name == "small"


def test_the_tile_order_band_never_pads_the_problem(family):
    """NOTE [Swizzle padding]: CUTLASS rounds each tile count up to cluster x band and runs the
    padding; the choice narrows the band where that would add more than 3 % of tiles."""
    large = family["large"].config.replace(swizzle=3)
    # 1024 rows are 8 tiles of 128; 2x1 clusters of 8-tile bands round them to 16: twice the work
    assert scheduled_tiles(large, 1024, 14336) == scheduled_tiles(large, 2048, 14336) == 16 * 56
    assert scheduled_tiles(large, 1024, 14336, swizzle=2) == 8 * 56
    s = pick(family, 512, 14336, 4096)
    assert s.name == "large" and s.config.swizzle < 3
    # (1536 rows take ping-pong: NOTE [Wave quantisation between large and ping-pong];
    # 1024, 2048 and 3072 the 128x176 ping-pong tile: NOTE [The 128x176 ping-pong tile])
    assert pick(family, 1536, 14336, 4096).name == "pingpong"
    assert all(pick(family, M, 14336, 4096).name == "pp128x176" for M in (1024, 2048, 3072))
    assert scheduled_tiles(s.config, 512, 14336) <= 1.03 * scheduled_tiles(s.config, 512, 14336, swizzle=0)
    # a heavy epilogue keeps the large kernel there, with the band narrowed
    import epilogues as E

    heavy = evtc.Gemm(E.REFERENCE["gelu_aux"])
    assert heavy.choose(1024, 14336, 4096).name == "pp128x176"  # NOTE [The 128x176 ping-pong tile]
    for M in (1536, 3072):  # K = 2048: an epilogue with aux stores stays off ping-pong
        s = heavy.choose(M, 14336, 2048)
        assert s.name == "large" and s.config.swizzle < 3, M
        assert scheduled_tiles(s.config, M, 14336) <= 1.03 * scheduled_tiles(s.config, M, 14336, swizzle=0)
    # no padding at 2048 or 4096 rows: the measured 8-tile band stays (config None = the default)
    assert pick(family, 2048, 14336, 4096).config.swizzle in (None, 3)
    assert pick(family, 4096, 4096, 4096).config.swizzle in (None, 3)
    # ping-pong's one-tile order has nothing to narrow; swap-AB counts the kernel's own M (the call's N)
    assert pick(family, 8192, 8192, 8192).config.swizzle in (None, 0)


def test_a_cluster_that_pads_the_tiles_is_dropped(family):
    """NOTE [Cluster padding]: a 2x1 cluster over an odd number of M tiles schedules a tile row
    of padding; above 10 % of the tiles the member runs without its cluster (``_c1``)."""
    # an LM head at 128 tokens: one M tile of `large` scheduled as two
    s = pick(family, 128, 50264, 4096)
    assert s.name == "large_c1" and tuple(s.config.cluster) == (1, 1, 1)
    assert s.config.replace(cluster=family["large"].config.cluster) == family["large"].config.replace(
        swizzle=s.config.swizzle)
    # 9 tiles of 128 rows scheduled as 10 (11 %): dropped; 11 as 12 (9 %): kept
    assert pick(family, 1152, 50264, 4096).name == "pingpong_c1"
    assert pick(family, 1408, 50264, 4096).name == "pingpong"
    # batched: the rounding is per batch (8 batches of 3 tiles scheduled as 4)
    assert pick(family, 384, 8192, 4096, 8).name == "large_c1"
    assert scheduled_tiles(family["large"].config, 384, 8192, 8, swizzle=0) == 4 * 32 * 8
    # nothing padded: the cluster stays
    for shape in ((4096, 50264, 4096), (2048, 14336, 4096), (8192, 8192, 8192), (1024, 14336, 4096)):
        assert not pick(family, *shape).name.endswith("_c1"), shape
    # a pinned Gemm keeps its configuration whatever it pads
    pinned = evtc.Gemm("D = acc", a=bf16, b=bf16, config=family["large"].config)
    assert pinned.choose(128, 50264, 4096).config.cluster == family["large"].config.cluster


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


def test_gemm_choose_uses_the_family_and_the_tuned_store(tmp_path, monkeypatch):
    import epilogues as E

    monkeypatch.setenv("EVTC_CACHE_DIR", str(tmp_path / "cache"))
    g = evtc.Gemm(E.bias_relu)
    assert g.choose(8192, 8192, 8192).name == "pingpong"
    assert g.choose(16, 4096, 4096).name == "swap16_c4"
    store = TuneStore.for_family(g.dispatch.family)
    store.put(shape_bucket(8192, 8192, 8192), "H100", {"member": "streamk",
                                                       "runtime": {"split_k": 2, "decomposition": "split_k"}})
    s = g.choose(8000, 8000, 8000, device="H100")  # the same bucket
    assert s.name == "streamk" and s.config.split_k == 2
    assert g.choose(8000, 8000, 8000, device="another GPU").name == "pingpong"
    assert json.loads(store.path.read_text())["format"] == 1
    # a pinned Gemm is a family of one
    p = evtc.Gemm(E.bias_relu, config=evtc.GemmConfig())
    assert list(p.family) == ["pinned"] and p.choose(16, 4096, 4096).name == "pinned"


def test_tuning_candidates_cover_splits_and_stream_k():
    import epilogues as E

    g = evtc.Gemm(E.bias_relu)
    cands = candidates(g.dispatch.family, Problem(512, 512, 32768))
    names = {(c.name, c.config.split_k, c.config.decomposition) for c in cands}
    assert ("large", 1, "heuristic") in names and ("streamk", 1, "stream_k") in names
    assert ("streamk", 8, "split_k") in names
    assert not any(c.config.swap_ab for c in candidates(g.dispatch.family, Problem(4096, 4096, 4096)))


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
    assert not any(c.config.decomposition == "stream_k" for c in candidates(g.dispatch.family, Problem(512, 512, 32768)))
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


def test_epilogue_aware_choices():
    """NOTE [Epilogue-aware choices]: reductions avoid swap-AB above M = 16 and ping-pong (and take the
    ping-pong unaligned kernel), aux stores avoid ping-pong, light epilogues keep both."""
    import epilogues as E
    from evtc.family.spec import EpilogueTraits

    light = evtc.Gemm(E.bias_relu)
    stats = evtc.Gemm(E.REFERENCE["row_stats"])
    aux = evtc.Gemm(E.REFERENCE["gelu_aux"])
    assert EpilogueTraits.of(light.graph) == EpilogueTraits()
    assert EpilogueTraits.of(stats.graph).reductions and EpilogueTraits.of(aux.graph).aux_stores
    assert not EpilogueTraits.of(evtc.Gemm(E.REFERENCE["fp8_out"], a=evtc.e4m3, b=evtc.e4m3).graph).reductions  # amax: a scalar
    # row_stats reduces through the workspace: the 4x1 clusters were not measured with it
    assert light.choose(16, 4096, 4096).name == "swap16_c4" and stats.choose(16, 4096, 4096).name == "swap16"
    assert light.choose(32, 28672, 4096).name == "swap16" and stats.choose(32, 28672, 4096).name == "small"
    assert light.choose(48, 28672, 4096).name == "swap" and stats.choose(48, 28672, 4096).name == "small"
    assert light.choose(16384, 4096, 1024).name == "pingpong"
    assert stats.choose(16384, 4096, 1024).name == "large" and aux.choose(16384, 4096, 1024).name == "large"
    # an f32 row max alone reduces with atomics (NOTE [Atomic row and column max]): ping-pong at any K

    @evtc.epilogue
    def rowmax(acc, bias: evtc.RowVector[evtc.f32]):
        D = acc + bias
        return {"D": D, "row_max": evtc.max(D, dim=1)}

    rm = evtc.Gemm(rowmax)
    t = EpilogueTraits.of(rm.graph)
    assert t.reductions and not t.workspace_reductions and t.takes_pingpong(1024)
    assert EpilogueTraits.of(stats.graph).workspace_reductions  # row_stats has a row sum
    assert rm.choose(16384, 4096, 1024).name == "pingpong"
    assert light.choose(4096, 50257, 4096, aligned_mn=False).name == "unaligned"
    assert aux.choose(4096, 50257, 4096, aligned_mn=False).name == "unaligned"
    assert stats.choose(4096, 50257, 4096, aligned_mn=False).name == "unaligned_pingpong"


def test_wave_quantisation_between_large_and_pingpong():
    """NOTE [Wave quantisation between large and ping-pong]: below 15 waves a light epilogue takes
    ping-pong where its last wave is fuller by more than 3 % (and it has 2 waves or more)."""
    import epilogues as E
    from evtc.family.spec import wave_efficiency

    assert wave_efficiency(132, 132) == 1.0 and abs(wave_efficiency(448, 132) - 448 / 528) < 1e-12
    light = evtc.Gemm(E.bias_relu)
    # (1024 and 2048 x 14336 x 4096 take the 128x176 ping-pong tile first: NOTE [The 128x176
    # ping-pong tile]; without it and the 64x256 one in the family, the rule decides)
    fam = {k: v for k, v in light.family.items() if k not in ("pp64x256", "pp128x176")}
    rule = lambda *shape: choose(fam, Problem(*shape), "sm90", bf16, bf16, light.dispatch.family.traits).name  # noqa: E731
    assert rule(1024, 14336, 4096) == "pingpong"  # 0.91 against 0.85
    assert rule(2048, 14336, 4096) == "large"  # 0.91 against 0.97
    assert light.choose(1024, 14336, 4096).name == light.choose(2048, 14336, 4096).name == "pp128x176"
    assert light.choose(4096, 4096, 4096).name == "large"  # 0.89 against 0.97
    assert light.choose(8192, 4096, 14336).name == "large"  # 0.97 both
    assert light.choose(1536, 4096, 14336).name == "pingpong"  # fc2 at 1536 tokens: 1.00 against 0.73
    assert light.choose(2048, 4096, 14336).name == "large"  # 0.89 against 0.97
    assert light.choose(512, 14336, 4096).name == "large"  # 3 ping-pong waves 0.76 full, 2 large ones 0.85
    # an epilogue with aux stores: the large kernel below K = 4096, the rule from there on (NOTE
    # [Aux stores on ping-pong over a long K])
    heavy = evtc.Gemm(E.REFERENCE["gelu_aux"])
    assert heavy.choose(1536, 14336, 2048).name == "large"
    assert heavy.choose(1536, 14336, 4096).name == "pingpong"
    assert heavy.choose(4096, 4096, 4096).name == "large" and heavy.choose(8192, 4096, 14336).name == "large"
    assert heavy.choose(4096, 14336, 4096).name == "pingpong"  # 15 waves or more
    assert heavy.choose(16384, 4096, 1024).name == "large"



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
    s = rm.choose(1024, 1024, 16384)
    assert s.name == "kheavy" and s.config.decomposition in ("data_parallel", "split_k")
    # the tuner doesn't time stream-K for them
    assert not any(c.config.decomposition == "stream_k" for c in candidates(rm.dispatch.family, Problem(2048, 2048, 8192)))
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


def test_one_wave_of_pingpong_tiles_over_a_long_k(family):
    """NOTE [One wave of ping-pong tiles over a long K]: one to two waves of 128x128 tiles, K of
    4 max(M, N) or more, ping-pong's tiles in one wave: ping-pong (measured 1.0-1.19 of cuBLAS
    against stream-K's 1.41-1.62; heavy epilogues too: 1.24-1.38 against 1.56-1.75); over a wave
    of ping-pong tiles the 128x128 rule applies; shorter K, the rules before."""
    import epilogues as E

    for shape in ((2048, 1280, 11520), (1536, 1536, 12288), (1280, 2048, 12288)):
        assert pick(family, *shape).name == "pingpong", shape
    # 140 ping-pong tiles, more than a wave: not the 128x192 tile but 200 of 128x128 (NOTE [Ping-pong
    # 128x128 tiles below two waves]; ``streamk`` before)
    assert pick(family, 2560, 1280, 10240).name == "pp128"
    assert pick(family, 2048, 1280, 4096).name != "pingpong"  # K < 4 max(M, N)
    assert pick(family, 1024, 1024, 16384).name == "kheavy"   # under a wave of 128x128 tiles
    heavy = evtc.Gemm(E.REFERENCE["gelu_aux"])
    assert heavy.choose(2048, 1280, 11520).name == "pingpong"
    assert heavy.choose(2560, 1280, 10240).name == "pp128"
