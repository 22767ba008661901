"""``Gemm(..., batch_invariant=True)`` without a GPU (NOTE [Batch invariance] in
evtc/dispatch/invariance.py): over the corpus's N and K and every M from 1 to 16384, every member
the selection picks keeps one K order (no split-K, stream-K or swap-AB, one tile K) and, with a
row reduction, one tile N, schedule and epilogue tile; reductions whose order is the run's are
refused before any build; the flag reaches the Gemms of the torch backend. The bits themselves
are checked on the GPU (tests/gpu/test_batch_invariance_gpu.py)."""

import itertools
import json

import pytest

import evtc
from evtc import bf16
from evtc.dispatch.invariance import Invariance, pinned_order
from evtc.errors import ArgumentError, ConfigError
from evtc.family.spec import KernelSpec

import epilogues as E

MS = (1, 2, 7, 16, 63, 64, 65, 127, 300, 511, 1024, 2048, 4097, 8192, 16384)
DEVICE = "NVIDIA H200"


def _corpus_nk(count=12):
    """(N, K) pairs of the selection corpus (benchmarks/corpus), spread over its range."""
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "corpus" / "problems.json"
    rows = json.loads(path.read_text())
    rows = rows["problems"] if isinstance(rows, dict) else rows
    pairs = sorted({(int(r["N"]), int(r["K"])) for r in rows if int(r["N"]) % 8 == 0 and int(r["K"]) % 8 == 0})
    step = max(1, len(pairs) // count)
    return pairs[::step][:count]


def _order(spec: KernelSpec):
    c = spec.config
    return (c.tile[2], c.split_k, c.swap_ab, c.decomposition if c.scheduler == "streamk" else None)


@pytest.mark.parametrize("name", ["bias_relu", "gelu_aux", "row_stats", "dgelu_bgrad", "fp8_out"])
def test_every_choice_keeps_one_k_order(name):
    a = evtc.e4m3 if name == "fp8_out" else bf16
    g = evtc.Gemm(E.REFERENCE[name], a=a, b=a, c=bf16, d=bf16, batch_invariant=True)
    fam = g.dispatch.family
    row_keyed = any(getattr(o, "dim", None) == 1 for o in g.graph.outputs if o.kind == "reduce")
    assert fam.invariance.row_keyed == row_keyed
    default = evtc.Gemm(E.REFERENCE[name], a=a, b=a, c=bf16, d=bf16)
    differ = 0
    for (N, K), L in itertools.product(_corpus_nk(), (1, 4)):
        seen = set()
        for M in MS:
            s = fam.choose(M, N, K, L, device=DEVICE)
            c = s.config
            assert not c.swap_ab and c.split_k == 1, (name, M, N, K, s.name)
            assert c.scheduler != "streamk" or c.decomposition == "data_parallel", (name, M, N, K, s.name)
            key = (c.tile[2],) + ((c.tile[1], c.schedule, fam._epilogue_tile(s)) if row_keyed else ())
            seen.add(key)
            differ += s.name != default.dispatch.family.choose(M, N, K, L, device=DEVICE).name
        assert len(seen) == 1, (name, N, K, seen)
    assert differ, "the invariant family never chose differently from the default one: the test checks nothing"


def test_the_members_keep_their_variety_without_a_row_reduction():
    g = evtc.Gemm(E.REFERENCE["bias_relu"], batch_invariant=True)
    names = {g.dispatch.family.choose(M, 4096, 4096, device=DEVICE).name for M in MS}
    assert len(names) >= 3, names  # small M, mid and large M take different tiles
    assert not any(n.startswith("swap") for n in g.family)


@pytest.mark.parametrize("aligned_mn, aligned_k, want", [(False, True, "unaligned"), (True, False, "unaligned_k")])
def test_rows_tma_cannot_address_take_one_kernel_for_every_m(aligned_mn, aligned_k, want):
    g = evtc.Gemm(E.REFERENCE["row_stats"], batch_invariant=True)
    got = {g.dispatch.family.choose(M, 50257, 4096, aligned_mn=aligned_mn, aligned_k=aligned_k).name for M in MS}
    assert got == {want}


@pytest.mark.parametrize("text, arch", [("D = acc; s = sum(acc)", "sm90"),
                                        ("D = acc; r = sum(acc, dim=1)", "sm80"),
                                        ("D = acc; c = sum(acc, dim=0)", "sm80")])
def test_sums_added_with_atomics_are_refused_before_a_build(text, arch):
    with pytest.raises(ConfigError, match="batch_invariant=True: the sum reduction") as e:
        evtc.Gemm(text, arch=arch, batch_invariant=True)
    assert e.value.hint


@pytest.mark.parametrize("text", ["D = acc; s = amax(acc)", "D = acc; r = max(acc, dim=1)",
                                  "D = acc; c = sum(acc, dim=0)", "D = acc; r = sum(acc, dim=1)"])
def test_order_free_and_ordered_reductions_are_accepted(text):
    g = evtc.Gemm(text, batch_invariant=True)
    assert g.dispatch.family.invariance is not None


def test_max_reductions_on_sm80_are_accepted():
    assert evtc.Gemm("D = acc; r = max(acc, dim=1)", arch="sm80", batch_invariant=True).family


def test_a_pinned_configuration_that_splits_k_is_refused():
    with pytest.raises(ConfigError, match="batch_invariant"):
        evtc.Gemm("D = acc", config=evtc.GemmConfig(tile=(128, 128, 64), cluster=(1, 1, 1), scheduler="streamk",
                                                  split_k=2), batch_invariant=True)
    with pytest.raises(ConfigError, match="batch_invariant"):
        evtc.Gemm("D = acc", config=evtc.GemmConfig(tile=(64, 32, 64), cluster=(1, 1, 1), schedule="pingpong",
                                                  swap_ab=True), batch_invariant=True)


def test_a_pinned_stream_k_scheduler_runs_data_parallel():
    g = evtc.Gemm("D = acc", config=evtc.GemmConfig(tile=(128, 128, 64), cluster=(1, 1, 1), scheduler="streamk"),
                  batch_invariant=True)
    assert g.choose(8, 4096, 65536).config.decomposition == "data_parallel"
    assert evtc.Gemm("D = acc", config=g.choose(8, 4096, 65536).config).choose(8, 4096, 65536).config.split_k == 1


def test_pinned_order():
    base = evtc.GemmConfig(tile=(128, 128, 64), cluster=(1, 1, 1), scheduler="streamk")
    spec = KernelSpec("s", base, "sm90")
    assert pinned_order(spec).config.decomposition == "data_parallel"
    assert pinned_order(spec.with_runtime(decomposition="stream_k")) is None
    assert pinned_order(spec.with_runtime(split_k=4, decomposition="split_k")) is None
    assert pinned_order(KernelSpec("p", evtc.GemmConfig(), "sm90")).config == evtc.GemmConfig()


def test_candidates_outside_the_key_are_not_admitted():
    g = evtc.Gemm(E.REFERENCE["row_stats"], batch_invariant=True)
    fam = g.dispatch.family
    key_n = fam.invariance.key[2]
    other = next(s for s in evtc.Gemm(E.REFERENCE["row_stats"]).family.values()
                 if s.config.tile[1] != key_n and not s.config.swap_ab)
    assert not fam.admits(other)
    assert all(fam.admits(s) for s in fam.members.values())
    assert isinstance(fam.invariance, Invariance)


def test_the_knob_sets_the_default(monkeypatch):
    monkeypatch.setenv("EVTC_BATCH_INVARIANT", "1")
    assert evtc.Gemm("D = acc").dispatch.family.invariance is not None
    assert evtc.Gemm("D = acc", batch_invariant=False).dispatch.family.invariance is None
    monkeypatch.delenv("EVTC_BATCH_INVARIANT")
    assert evtc.Gemm("D = acc").dispatch.family.invariance is None


def test_the_torch_backend_passes_the_flag_on():
    torch = pytest.importorskip("torch")
    from test_torch_backend import register

    from evtc.torch.backend import make_backend

    made = []
    be = make_backend(allow_cpu=True, on_gemm=lambda g: (made.append(g), register(g)), inductor=False,
                      gemm_options={"batch_invariant": True})
    lin = torch.nn.Linear(64, 48).to(torch.bfloat16)
    f = torch.compile(lambda x: torch.relu(lin(x)), backend=be)
    x = torch.randn(32, 64, dtype=torch.bfloat16)
    with torch.no_grad():
        got = f(x)
        want = torch.relu(lin(x))
    assert made and all(g.dispatch.family.invariance is not None for g in made)
    assert (got.float() - want.float()).abs().max().item() <= 2 ** -6 * want.float().abs().max().item()


@pytest.mark.parametrize("kw, match", [({"options": {"batch_invariant": 1}}, "a bool is expected"),
                                       ({"options": {"tile": True}}, "unknown option"),
                                       ({"mode": "fastest"}, "not one of torch.compile's modes")])
def test_the_backend_refuses_unknown_options(kw, match):
    pytest.importorskip("torch")
    from evtc.torch.backend import evtc_backend

    with pytest.raises(ArgumentError, match=match):
        evtc_backend(None, [], **kw)


def test_plan_options_that_change_a_row_reductions_epilogue_tile_are_refused():
    key_tile = evtc.Gemm(E.REFERENCE["row_stats"], batch_invariant=True).dispatch.family.invariance.key[-1]
    other = (key_tile[0], key_tile[1] // 2)
    with pytest.raises(ConfigError, match="another epilogue tile"):
        evtc.Gemm(E.REFERENCE["row_stats"], batch_invariant=True, plan={"epilogue_tile": other})
    assert evtc.Gemm(E.REFERENCE["row_stats"], batch_invariant=True, plan={"epilogue_tile": key_tile}).family
    # without a row reduction the plan's choices decide no bits
    assert evtc.Gemm(E.REFERENCE["bias_relu"], batch_invariant=True, plan_rank=1).family


def test_the_grouped_family_is_batch_invariant_by_construction(monkeypatch):
    """GroupedGemm takes ``batch_invariant`` as Gemm does: every member shares one K order (tile
    K, no split-K or swap-AB), checked when it is made; a non-bool is refused; the knob sets
    the default."""
    g = evtc.GroupedGemm("D = relu(acc)", batch_invariant=True)
    assert g.batch_invariant
    orders = {(m.spec.config.tile[2], m.spec.config.split_k, m.spec.config.swap_ab) for m in g._members.values()}
    assert len(orders) == 1
    with pytest.raises(ConfigError, match="batch_invariant='yes'"):
        evtc.GroupedGemm("D = acc", batch_invariant="yes")
    monkeypatch.setenv("EVTC_BATCH_INVARIANT", "1")
    assert evtc.GroupedGemm("D = acc").batch_invariant
    assert not evtc.GroupedGemm("D = acc", batch_invariant=False).batch_invariant


def test_a_grouped_family_with_two_k_orders_is_refused(monkeypatch):
    import evtc.grouped as G

    members = dict(G.GROUPED_MEMBERS)
    members["pp64x128"] = members["pp64x128"].replace(tile=(64, 128, 128))
    monkeypatch.setattr(G, "GROUPED_MEMBERS", members)
    with pytest.raises(ConfigError, match="K orders differ"):
        evtc.GroupedGemm("D = acc", batch_invariant=True)
    assert evtc.GroupedGemm("D = acc").members


def test_the_torch_backend_passes_the_flag_to_grouped_gemms():
    torch = pytest.importorskip("torch")
    from test_torch_backend import _register_grouped

    from evtc.torch.backend import make_backend

    made = []
    be = make_backend(allow_cpu=True, on_gemm=lambda g: (made.append(g), _register_grouped(g)), inductor=False,
                      gemm_options={"batch_invariant": True})
    torch.manual_seed(5)
    w = (torch.randn(4, 48, 64) / 8).bfloat16()
    offs = torch.tensor([8, 16, 30, 40], dtype=torch.int32)
    x = torch.randn(40, 64).bfloat16()

    def f(x):
        return torch.relu(torch._grouped_mm(x, w.transpose(-2, -1), offs=offs))

    torch._dynamo.reset()
    with torch.no_grad():
        got = torch.compile(f, backend=be, fullgraph=True)(x)
    assert len(made) == 1 and isinstance(made[0], evtc.GroupedGemm) and made[0].batch_invariant
    want = torch.cat([torch.relu(x[lo:hi].double() @ w[e].double().T)
                      for e, (lo, hi) in enumerate(zip([0, 8, 16, 30], offs.tolist()))])
    torch.testing.assert_close(got.double(), want, rtol=2 ** -7, atol=2 ** -7)
