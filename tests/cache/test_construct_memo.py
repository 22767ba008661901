"""The construct memo (evtc/pipeline/memo.py): a repeated ``evtc.Gemm(...)`` skips the passes,
planner and emitter, and what it gives is byte for byte what they give; entries that are not
what they claim are recomputed, never trusted."""

from __future__ import annotations

import concurrent.futures
import json
import logging
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import evtc
import evtc.pipeline.kernel
import evtc.gemm
from evtc import bf16, e4m3
from evtc.pipeline import memo

ROOT = Path(__file__).resolve().parents[2]

# Everything a user sees of a Gemm, printed by a fresh process: IR, every member's plan, source
# and kernel cache key, the choice for a few problems, and whether sympy/jinja2/networkx loaded.
PROBE = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {examples!r})
    import evtc, epilogues as E
    from evtc.compiler import kernel_key
    name, arch, a = sys.argv[1], sys.argv[2], sys.argv[3]
    kw = dict(a=a, b=a) if a == "e4m3" else dict(a=a, b=a, c=a, d=a)
    g = evtc.Gemm(E.REFERENCE.get(name, name), arch=arch, **kw)
    # what a hit needn't import: the planner, the lowering (a Plan's tree is read when first used), staging
    constructed_evtc = {{m: m in sys.modules for m in ("evtc.plan.sm90", "evtc.plan.sm80", "evtc.lower",
                                                      "evtc.dispatch.staging")}}
    out = {{"ir": str(g.graph), "repr": repr(g), "describe": g.describe(), "members": {{}}, "choose": []}}
    constructed = {{m: m in sys.modules for m in ("sympy", "jinja2", "networkx", "lark")}}
    for M, N, K in ((256, 256, 256), (1, 4096, 4096), (8192, 8192, 8192), (1024, 1024, 16384)):
        out["choose"].append(repr(g.choose(M, N, K)))
    members = list(g.family) + (["unaligned", "unaligned_pingpong", "unaligned_k"] if arch == "sm90" else [])
    for m in members:
        k = g.kernel(m)
        try:
            key = kernel_key(k.source, arch=k.arch)
        except evtc.EvtcError as e:  # no CUTLASS headers here
            key = type(e).__name__
        out["members"][m] = {{"plan": str(k.plan), "plan_json": k.plan.dumps(), "config": k.config.to_json(),
                              "graph": str(k.graph), "source": k.source, "key": key, "job": k.job_name}}
    out["imported"] = constructed
    out["imported_evtc"] = constructed_evtc
    out["imported_after"] = {{m: m in sys.modules for m in ("sympy", "jinja2", "networkx", "lark")}}
    print(json.dumps(out))
""")


def _env(cache: Path, **extra: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("EVTC_", "NVCC_"))}
    env.update(PYTHONPATH=str(ROOT), EVTC_CACHE_DIR=str(cache), EVTC_PROGRESS="0", **extra)
    return env


def _probe(cache: Path, name: str = "bias_relu", arch: str = "sm90", a: str = "bf16", **extra: str) -> dict:
    code = PROBE.format(examples=str(ROOT / "examples"))
    p = subprocess.run([sys.executable, "-c", code, name, arch, a], capture_output=True, text=True,
                       env=_env(cache, **extra), timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.splitlines()[-1])


def _same(x: dict, y: dict) -> None:
    for k in ("ir", "repr", "describe", "choose", "members"):
        assert x[k] == y[k], k


@pytest.fixture
def cache(cache_env):
    """An existing private cache (the memo is used only where the cache directory exists)."""
    cache_env.mkdir(mode=0o700, parents=True)
    return cache_env


def _entries(cache: Path) -> list[Path]:
    d = cache / "construct"
    return sorted(p for p in d.rglob("*") if p.is_file()) if d.is_dir() else []


TEXT = "F = acc * scale[m] + bias[n]\nD = gelu(F)\nrow_max = max(D, dim=1)"


@pytest.mark.parametrize("name,arch,a", [("bias_relu", "sm90", "bf16"), ("many_aux", "sm90", "bf16"),
                                         ("fp8_out", "sm90", "e4m3"), ("row_stats", "sm80", "f16"),
                                         (TEXT, "sm90", "bf16")])
def test_a_second_process_skips_sympy_and_sees_the_same_gemm(cache, name, arch, a):
    cold = _probe(cache, name, arch, a)
    assert _entries(cache), "the first construct stored nothing"
    warm = _probe(cache, name, arch, a)
    off = _probe(cache, name, arch, a, EVTC_CONSTRUCT_MEMO="0")
    _same(cold, warm)
    _same(cold, off)
    # the construct of a warm process (and its first kernel) ran no parser, pass, planner or template
    nothing = {"sympy": False, "jinja2": False, "networkx": False, "lark": False}
    assert warm["imported"] == nothing and warm["imported_after"] == nothing
    # nor the planner, the lowering or the staging route (NOTE [The construct memo]: a Plan's tree
    # is read from its entry when an emission first walks it); an sm80 Plan names classes of
    # evtc.plan.sm80, whose unpickling imports the planner and the lowering
    lazy = {"evtc.plan.sm90", "evtc.dispatch.staging"} | ({"evtc.lower", "evtc.plan.sm80"} if arch == "sm90" else set())
    assert not any(warm["imported_evtc"][m] for m in lazy), warm["imported_evtc"]
    assert cold["imported_evtc"]["evtc.lower"]
    assert cold["imported_after"]["sympy"] and off["imported_after"]["jinja2"]


# ---- in-process: count what is recomputed ------------------------------------------------------

@pytest.fixture
def spies(monkeypatch):
    """Counts of the passes, planner and emitter runs of evtc.Gemm."""
    import evtc.passes

    counts = {"passes": 0, "plan": 0, "emit": 0}

    def wrap(owner, attr, key):
        real = getattr(owner, attr)

        def spy(*a, **k):
            counts[key] += 1
            return real(*a, **k)

        monkeypatch.setattr(owner, attr, spy)

    wrap(evtc.passes, "run", "passes")
    wrap(evtc.pipeline.kernel, "make_plan", "plan")
    wrap(evtc.pipeline.kernel, "emit", "emit")
    return counts


def _bias_relu():
    sys.path.insert(0, str(ROOT / "examples"))
    import epilogues

    return epilogues.REFERENCE["bias_relu"]


def _seen(g: evtc.Gemm) -> dict:
    k = g.kernel("swap")
    return {"ir": str(g.graph), "plan": str(g.plan), "json": g.plan.dumps(), "source": g.source, "swap": k.source,
            "swap_plan": str(k.plan), "swap_graph": str(k.graph)}


def test_a_second_construct_recomputes_nothing(cache, spies):
    ep = _bias_relu()
    first = _seen(evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16))
    assert spies == {"passes": 1, "plan": 2, "emit": 2}
    second = _seen(evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16))
    assert spies == {"passes": 1, "plan": 2, "emit": 2}
    assert first == second
    # the swap-AB kernel's nodes are its own graph's, the primary's are the Gemm's graph's
    g = evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16)
    assert g.kernel_graph is g.graph
    tree_nodes = {id(v.node) for v in g.plan.tree.visitors()}
    assert tree_nodes <= {id(n) for n in g.graph.nodes}
    # a memo hit's visitor tree is read when first used (no evtc.lower on a hit), with the same
    # node identities, emits the same source, and pickles and copies as the tree itself
    import copy
    import pickle

    from evtc.pipeline import memo
    from evtc.pipeline import emit
    from evtc.lower import VisitorTree

    k = evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16).kernel("swap")
    assert isinstance(k.plan.tree, memo._LazyTree)
    assert {id(v.node) for v in k.plan.tree.visitors()} <= {id(n) for n in k.graph.nodes}
    assert emit(k.graph, k.plan) == first["swap"]
    assert isinstance(pickle.loads(pickle.dumps(k.plan)).tree, VisitorTree)
    assert isinstance(copy.deepcopy(k.plan).tree, VisitorTree)


def test_memo_off_computes_everything_and_writes_nothing(cache, spies, monkeypatch):
    monkeypatch.setenv("EVTC_CONSTRUCT_MEMO", "0")
    ep = _bias_relu()
    a = _seen(evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16))
    b = _seen(evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16))
    assert a == b and spies == {"passes": 2, "plan": 4, "emit": 4}
    assert not (cache / "construct").exists()


def test_no_cache_directory_no_memo(cache_env, spies):
    ep = _bias_relu()
    evtc.Gemm(ep).source
    evtc.Gemm(ep).source
    assert spies["passes"] == 2 and not cache_env.exists()


def test_a_shared_cache_has_no_memo(tmp_path, cache_env, spies, monkeypatch):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o770)
    monkeypatch.setenv("EVTC_SHARED_CACHE", str(shared))
    evtc.Gemm(_bias_relu()).source
    evtc.Gemm(_bias_relu()).source
    assert spies["passes"] == 2 and not (shared / "construct").exists()


def _corrupt_all(cache: Path, how) -> int:
    n = 0
    for p in _entries(cache):
        data = p.read_bytes()
        new = how(p, data)
        if new is not None:
            p.write_bytes(new)
            n += 1
    return n


def _header(data: bytes) -> tuple[dict, bytes]:
    head, _, payload = data.partition(b"\n")
    return json.loads(head), payload


def _with_header(data: bytes, **changes) -> bytes:
    h, payload = _header(data)
    h.update(changes)
    return json.dumps(h).encode() + b"\n" + payload


def _evil_pickle() -> bytes:
    import pickle

    class Evil:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    return pickle.dumps(Evil())


def _rehash(payload: bytes, data: bytes) -> bytes:
    import hashlib

    h, _ = _header(data)
    h.update(bytes=len(payload), sha256=hashlib.sha256(payload).hexdigest())
    return json.dumps(h).encode() + b"\n" + payload


CORRUPTIONS = {
    "truncated": lambda p, d: d[: len(d) - 7],
    "empty": lambda p, d: b"",
    "flipped byte": lambda p, d: d[:-1] + bytes([d[-1] ^ 1]),
    "other schema": lambda p, d: _with_header(d, schema=memo.SCHEMA + 1),
    "other key": lambda p, d: _with_header(d, key="0" * 64),
    "other kind": lambda p, d: _with_header(d, kind="graph" if p.suffix != ".graph" else "plan"),
    "no header": lambda p, d: _header(d)[1],
    "garbage with a valid hash": lambda p, d: _rehash(b"\x80\x05garbage", d),
    "a pickle of os.system with a valid hash":
        lambda p, d: _rehash(_evil_pickle(), d) if p.suffix != ".source" else None,
    "source not UTF-8 with a valid hash": lambda p, d: _rehash(b"\xff\xfe", d) if p.suffix == ".source" else None,
    "group-writable": lambda p, d: (os.chmod(p, 0o620), None)[1],
}


@pytest.mark.parametrize("what", list(CORRUPTIONS))
def test_a_corrupted_entry_is_recomputed_not_loaded(cache, spies, what, caplog, capfd):
    ep = _bias_relu()
    first = _seen(evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16))
    before = dict(spies)
    changed = _corrupt_all(cache, CORRUPTIONS[what])
    assert changed or what == "group-writable"
    with caplog.at_level(logging.DEBUG, logger="evtc.memo"):
        second = _seen(evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16))
    assert second == first
    recomputed = {k: spies[k] - before[k] for k in spies}
    if what == "source not UTF-8 with a valid hash":
        assert recomputed == {"passes": 0, "plan": 0, "emit": 2}
    elif what == "a pickle of os.system with a valid hash":
        assert recomputed == {"passes": 1, "plan": 2, "emit": 0}
    else:
        assert recomputed == {"passes": 1, "plan": 2, "emit": 2}, recomputed
    assert "pwned" not in capfd.readouterr().out
    assert any("construct memo" in r.getMessage() and "ignored" in r.getMessage() for r in caplog.records)
    if what != "group-writable":
        # the recomputed entries were written again, whole: a third construct recomputes nothing
        before = dict(spies)
        assert _seen(evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16)) == first
        assert spies == before


def test_an_entry_of_another_epilogue_is_not_taken(cache, spies):
    """Entries copied over each other's files (foreign entries: each header names its own key)
    are refused and recomputed."""
    ep = _bias_relu()
    mine = evtc.Gemm(ep).source
    mine_entries = set(_entries(cache))
    theirs = evtc.Gemm("D = relu(acc)").source
    their_entries = set(_entries(cache)) - mine_entries
    assert len(mine_entries) == 3 and len(their_entries) == 4  # a text has a .trace entry too
    by_kind = {}
    for p in sorted(mine_entries | their_entries):
        by_kind.setdefault(p.suffix, []).append(p)
    for x, y in (v for v in by_kind.values() if len(v) == 2):
        dx, dy = x.read_bytes(), y.read_bytes()
        x.write_bytes(dy)
        y.write_bytes(dx)
    before = dict(spies)
    assert evtc.Gemm(ep).source == mine
    assert evtc.Gemm("D = relu(acc)").source == theirs
    assert {k: spies[k] - before[k] for k in spies} == {"passes": 2, "plan": 2, "emit": 2}


def test_errors_are_not_memoised(cache, spies):
    @evtc.epilogue
    def only_reductions(acc):
        return {"m": evtc.max(acc, dim=1)}

    messages = []
    for _ in range(2):
        with pytest.raises(evtc.LegalizeError) as e:
            evtc.Gemm(only_reductions, arch="sm90")
        messages.append(str(e.value))
    assert messages[0] == messages[1] and spies["passes"] == 2
    # a plan error too (stock CUTLASS's rule can't fit many_aux at the large tile)
    sys.path.insert(0, str(ROOT / "examples"))
    import epilogues

    errors = []
    for _ in range(2):
        with pytest.raises(evtc.PlanError) as e:
            evtc.Gemm(epilogues.REFERENCE["many_aux"], plan="cutlass")
        errors.append(str(e.value))
    assert errors[0] == errors[1]


def test_a_bad_verification_setting_fails_the_same_with_a_warm_memo(cache, monkeypatch):
    ep = _bias_relu()
    evtc.Gemm(ep).source
    monkeypatch.setenv("EVTC_VERIFY", "maybe")
    with pytest.raises(evtc.ConfigError, match="EVTC_VERIFY"):
        evtc.Gemm(ep)


def test_the_key_sees_locations_and_number_types():
    from evtc.ir.graph import Graph
    from evtc.ir.nodes import Accumulator, Compute, Immediate, Store
    from evtc.errors import SourceLoc
    from evtc.dtypes import f32

    def g(value, line):
        acc = Accumulator(f32, name="acc")
        c = Compute(f32, op="mul", args=(acc, Immediate(f32, value=value)), loc=SourceLoc("f.py", line))
        return Graph("t", (acc,), (Store(bf16, name="D", value=c),))

    texts = {memo.graph_text(g(2.0, 1)), memo.graph_text(g(2, 1)), memo.graph_text(g(2.0, 2))}
    assert len(texts) == 3
    assert memo.graph_text(g(2.0, 1)) == memo.graph_text(g(2.0, 1))
    assert str(g(2.0, 1)) == str(g(2, 1))  # the IR text alone would not tell them apart


def test_concurrent_constructs_write_whole_entries(cache):
    """Four processes construct the same Gemms at once into an empty memo: every one sees the
    same results, and the entries they leave are whole (a later process recomputes nothing)."""
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        results = list(ex.map(lambda _: _probe(cache, "gelu_aux"), range(4)))
    for r in results[1:]:
        _same(results[0], r)
    warm = _probe(cache, "gelu_aux")
    _same(results[0], warm)
    assert warm["imported_after"] == {"sympy": False, "jinja2": False, "networkx": False, "lark": False}
    assert not [p for p in (cache / "construct").rglob(".*") if p.is_file()], "temporary files left behind"


def test_threads_constructing_at_once(cache):
    ep = _bias_relu()
    with concurrent.futures.ThreadPoolExecutor(4) as ex:
        seen = list(ex.map(lambda _: _seen(evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16)), range(8)))
    assert all(s == seen[0] for s in seen)


def test_prune_all_removes_the_memo(cache):
    from evtc.compiler import store

    evtc.Gemm(_bias_relu()).source
    assert (cache / "construct").is_dir()
    store.prune(store.cache_root(), everything=True)
    assert not (cache / "construct").exists()


def test_fp8_and_sm80_members_through_the_memo(cache, spies):
    sys.path.insert(0, str(ROOT / "examples"))
    import epilogues

    def seen():
        g = evtc.Gemm(epilogues.REFERENCE["fp8_out"], a=e4m3, b=e4m3)
        return [g.kernel(m).source for m in ("large", "kheavy", "unaligned", "unaligned_k")]

    first = seen()
    n = dict(spies)
    assert seen() == first and spies == n


def test_an_op_changed_at_run_time_is_seen(cache, spies, monkeypatch):
    """The op table is key material: a functor changed at run time misses the memo (and fails
    as it fails without one); an op whose code lives outside evtc turns the memo off."""
    import dataclasses

    from evtc import ops

    ep = _bias_relu()
    first = evtc.Gemm(ep).source
    relu = ops.OPS["relu"]
    monkeypatch.setitem(ops.OPS, "relu", dataclasses.replace(relu, functor="my::relu"))
    source = evtc.Gemm(ep).source
    assert "my::relu" in source and source != first
    assert memo.ops_text() is not None
    monkeypatch.setitem(ops.OPS, "relu", dataclasses.replace(ops.OPS["relu"], numpy=lambda x: x))
    assert memo.ops_text() is None and memo.memo_for(evtc.Gemm(ep).pipeline.traced) is None
    monkeypatch.setitem(ops.OPS, "relu", relu)
    n = spies["passes"]
    assert evtc.Gemm(ep).source == first and spies["passes"] == n


def test_prune_older_than_removes_unused_memo_entries(cache):
    import time

    from evtc.compiler import store

    ep = _bias_relu()
    evtc.Gemm(ep).source
    old = time.time() - 10 * 86400
    for p in _entries(cache):
        os.utime(p, (old, old))
    evtc.Gemm("D = relu(acc)").source  # recent entries of another epilogue
    recent = [p for p in _entries(cache) if p.stat().st_mtime > old + 1]
    summary = store.prune(store.cache_root(), older_than_s=86400)
    assert len(summary.other) == 3 and set(_entries(cache)) == set(recent)
    # a read counts as a use
    evtc.Gemm("D = relu(acc)").source
    for p in _entries(cache):
        assert p.stat().st_mtime > time.time() - 60


def test_a_textual_epilogue_through_the_memo(cache, spies, caplog):
    text = "D = relu(alpha*acc + beta*C + bias[n])"
    first = evtc.Gemm(text).source
    assert any(p.suffix == ".trace" for p in _entries(cache))
    assert evtc.Gemm(text).source == first and spies["passes"] == 1
    # other dtypes are another trace
    assert evtc.Gemm(text, c=evtc.f16, d=evtc.f16).source != first
    # a corrupted trace entry is parsed again
    for p in _entries(cache):
        if p.suffix == ".trace":
            p.write_bytes(p.read_bytes()[:-3])
    with caplog.at_level(logging.DEBUG, logger="evtc.memo"):
        assert evtc.Gemm(text).source == first
    assert any("ignored" in r.getMessage() for r in caplog.records)
    # a text that does not parse fails the same way every time (and stores nothing)
    n = len(_entries(cache))
    errors = []
    for _ in range(2):
        with pytest.raises(evtc.GrammarError) as e:
            evtc.Gemm("D = relu(acc) +")
        errors.append(str(e.value))
    assert errors[0] == errors[1] and len(_entries(cache)) == n


def test_a_dependency_upgrade_changes_the_key(cache, spies, monkeypatch):
    """sympy's canonical forms, numpy's folding... may change with their versions: where they are
    installed and their __init__.py's stat are key material (found without importing them)."""
    ep = _bias_relu()
    evtc.Gemm(ep).source
    assert "sympy:none" not in memo.deps_text() and "sympy" in memo.DEPENDENCIES
    real = memo.deps_text()
    monkeypatch.setattr(memo, "deps_text", lambda: real.replace("sympy:", "sympy:upgraded-"))
    evtc.Gemm(ep).source
    assert spies["passes"] == 2
    monkeypatch.setattr(memo, "deps_text", lambda: real)
    evtc.Gemm(ep).source
    assert spies["passes"] == 2


def test_a_construct_leaves_the_cache_directory_alone(cache, spies, recwarn):
    """A group-writable cache: the first build would tighten it with a CacheWarning; a construct
    neither changes it nor warns, and does not use it for the memo."""
    import stat

    os.chmod(cache, 0o770)
    evtc.Gemm(_bias_relu()).source
    evtc.Gemm(_bias_relu()).source
    assert stat.S_IMODE(cache.stat().st_mode) == 0o770 and not recwarn.list
    assert spies["passes"] == 2 and not (cache / "construct").exists()
