"""Building: the one nvcc command line, what the key covers, a bounded nvcc (time limit, process
group killed), kept failures, bounded lock waits, two processes building one kernel, the
progress bar."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from cache_helpers import (REAL_NVCC, copy_prebuilt, copying_nvcc, fake_nvcc, loaded_tag, needs_nvcc,
                           prebuilt_library, process_state, tiny_source)
from evtc.compiler import BuildJob, CacheError, build, build_many, fingerprint, kernel_key, key_material, lookup, nvcc
from evtc.compiler import store
from evtc.compiler.progress import BuildProgress
from evtc.errors import BuildError, NoDeviceError

ROOT = Path(__file__).resolve().parents[2]


# ---- the nvcc command line -----------------------------------------------------------------

def test_nvcc_command_per_arch():
    base = ["nvcc", "-std=c++17", "-O3", "-DNDEBUG", "--expt-relaxed-constexpr", "-Xcompiler=-fPIC",
            "-Xcompiler=-fvisibility=hidden", "-shared", "-lineinfo"]
    assert nvcc.nvcc_command("sm90", includes=False) == base + ["-gencode=arch=compute_90a,code=sm_90a", "-o", "k.so",
                                                                  "k.cu"]
    assert nvcc.nvcc_command("sm80", "x.cu", "x.so", includes=False, extra_flags=["-G"]) == \
        base + ["-gencode=arch=compute_80,code=[sm_80,compute_80]", "-G", "-o", "x.so", "x.cu"]
    with pytest.raises(BuildError, match="no nvcc flags for arch 'sm70'"):
        nvcc.nvcc_command("sm70")


def test_nvcc_command_includes_evtc_then_cutlass(monkeypatch, tmp_path):
    own = tmp_path / "include"
    (own / "evtc").mkdir(parents=True)
    monkeypatch.setattr(nvcc, "evtc_include_dir", lambda: own)
    incs = [f for f in nvcc.nvcc_command("sm90") if f.startswith("-I")]
    assert incs[0] == f"-I{own}"
    assert incs[1:] == [f"-I{d}" for d in nvcc.cutlass_include_dirs()]


def test_builder_runs_the_printed_command(cache_env, prebuilt):
    copy_prebuilt(prebuilt, cache_env)
    a = lookup(tiny_source("a"), "sm80", name="a")
    cmd = a.meta["command"]
    expected = nvcc.nvcc_command("sm80", "S", "O", nvcc="N")
    assert cmd[1:-3] == expected[1:-3] and cmd[-3] == "-o"
    assert shlex.split(a.log.read_text().splitlines()[0])[1:-3] == expected[1:-3]


# ---- the key -------------------------------------------------------------------------------

def test_key_covers_flags_environment_and_source(cache_env, monkeypatch):
    src = tiny_source("k")
    k0 = kernel_key(src, arch="sm80")
    assert kernel_key(src, arch="sm80") == k0
    assert kernel_key(src + " ", arch="sm80") != k0
    assert kernel_key(src, arch="sm90") != k0
    assert kernel_key(src, arch="sm80", extra_flags=["-G"]) != k0
    monkeypatch.setattr(nvcc, "BASE_FLAGS", nvcc.BASE_FLAGS + ("-Xptxas=-v",))
    assert kernel_key(src, arch="sm80") != k0
    monkeypatch.undo()
    for var in ("NVCC_APPEND_FLAGS", "NVCC_PREPEND_FLAGS"):
        monkeypatch.setenv(var, "-maxrregcount=64")
        assert kernel_key(src, arch="sm80") != k0, var
        monkeypatch.delenv(var)
    assert kernel_key(src, arch="sm80") == k0


def test_key_does_not_depend_on_the_toolchain(cache_env, monkeypatch):
    """The key needs no compiler (portable); the toolchain is recorded in the entry instead."""
    src = tiny_source("k")
    k0 = kernel_key(src, arch="sm80")
    monkeypatch.setenv("EVTC_NVCC", "none")
    monkeypatch.setenv("PATH", "/nonexistent")
    assert kernel_key(src, arch="sm80") == k0


def fake_cutlass(root: Path) -> Path:
    for sub in ("include/cutlass", "tools/util/include/cutlass/util"):
        (root / sub).mkdir(parents=True)
    (root / "include/cutlass/cutlass.h").write_text("#pragma once\n")
    (root / "include/cutlass/version.h").write_text("#define CUTLASS_MAJOR 9\n#define CUTLASS_MINOR 9\n#define CUTLASS_PATCH 9\n")
    (root / "tools/util/include/cutlass/util/helper.h").write_text("#pragma once\n")
    return root


def test_key_covers_cutlass_header_contents(cache_env, monkeypatch, tmp_path):
    cutlass = fake_cutlass(tmp_path / "cutlass")
    monkeypatch.setenv("CUTLASS_PATH", str(cutlass))
    src = tiny_source("k")
    k0 = kernel_key(src, arch="sm80")
    header = cutlass / "include/cutlass/cutlass.h"
    header.write_text("#pragma once\n#define CHANGED 1\n")  # edited in place
    fingerprint.clear()  # a new process
    k1 = kernel_key(src, arch="sm80")
    assert k1 != k0
    (cutlass / "tools/util/include/cutlass/util/new.h").write_text("// new\n")
    fingerprint.clear()
    assert kernel_key(src, arch="sm80") not in (k0, k1)
    monkeypatch.delenv("CUTLASS_PATH")
    assert kernel_key(src, arch="sm80") not in (k0, k1)


def test_key_covers_evtc_header_contents(cache_env, monkeypatch, tmp_path):
    own = tmp_path / "include"
    (own / "evtc").mkdir(parents=True)
    hdr = own / "evtc" / "visitors.hpp"
    hdr.write_text("#pragma once\n")
    (own / "evtc" / "inner.hpp").write_text("#pragma once\n")
    other = own / "evtc" / "conv_only.hpp"
    other.write_text("#pragma once\n")
    hdr.write_text('#pragma once\n#include "evtc/inner.hpp"\n')
    monkeypatch.setattr(nvcc, "evtc_include_dir", lambda: own)
    src = "#include <evtc/visitors.hpp>\n" + tiny_source("k")
    k0 = kernel_key(src, arch="sm80")
    hdr.write_text('#pragma once\n#include "evtc/inner.hpp"\n// changed\n')
    fingerprint.clear()
    k1 = kernel_key(src, arch="sm80")
    assert k1 != k0
    # a header included through another one counts too
    (own / "evtc" / "inner.hpp").write_text("#pragma once\n// changed\n")
    k2 = kernel_key(src, arch="sm80")
    assert k2 != k1
    # a header this source does not include does not change its key
    other.write_text("#pragma once\n// a conv-only change\n")
    assert kernel_key(src, arch="sm80") == k2
    assert kernel_key(tiny_source("k"), arch="sm80") != k2  # nothing included: a different key
    (own / "evtc" / "inner.hpp").unlink()
    with pytest.raises(BuildError, match="headers"):
        kernel_key(src, arch="sm80")


def test_header_hash_survives_processes_through_the_snapshot(cache_env, monkeypatch, tmp_path):
    """A second process reuses the stored hash when the snapshot is unchanged, and rehashes
    when a header was edited in place (same size, new mtime)."""
    cutlass = fake_cutlass(tmp_path / "cutlass")
    memo = tmp_path / "memo"
    inc = cutlass / "include"
    h0 = fingerprint.tree_hash(inc, memo)
    assert len(list(memo.iterdir())) == 1
    calls = []
    real = fingerprint.tree_hash_uncached
    monkeypatch.setattr(fingerprint, "tree_hash_uncached", lambda r: calls.append(r) or real(r))
    fingerprint.clear()
    assert fingerprint.tree_hash(inc, memo) == h0 and calls == []
    hdr = inc / "cutlass/cutlass.h"
    hdr.write_text("#pragma twice\n")  # same length
    os.utime(hdr, ns=(time.time_ns(), time.time_ns() + 10**9))
    fingerprint.clear()
    assert fingerprint.tree_hash(inc, memo) != h0 and len(calls) == 1


def test_folder_snapshot_of_the_wheel_sees_added_and_replaced_headers(monkeypatch, tmp_path):
    """watch_files=False (the nvidia-cutlass wheel): the stored folder list is stat'ed, no
    listing; a header added or replaced (rename over it, as pip does) is seen."""
    inc = fake_cutlass(tmp_path / "cutlass") / "include"
    memo = tmp_path / "memo"
    h0 = fingerprint.tree_hash(inc, memo, watch_files=False)
    stored = json.loads(next(memo.iterdir()).read_text())
    assert stored["folders"] == [".", "cutlass"]
    calls = []
    real = fingerprint.tree_hash_uncached
    monkeypatch.setattr(fingerprint, "tree_hash_uncached", lambda r: calls.append(r) or real(r))
    monkeypatch.setattr(fingerprint, "_walk", lambda r: pytest.fail("a stored hash was checked with a listing"))
    fingerprint.clear()
    assert fingerprint.tree_hash(inc, memo, watch_files=False) == h0 and calls == []
    monkeypatch.undo()
    monkeypatch.setattr(fingerprint, "tree_hash_uncached", lambda r: calls.append(r) or real(r))
    time.sleep(0.01)
    new = inc / "cutlass" / "cutlass.h.new"
    new.write_text("#pragma once // replaced\n")
    os.replace(new, inc / "cutlass" / "cutlass.h")
    fingerprint.clear()
    h1 = fingerprint.tree_hash(inc, memo, watch_files=False)
    assert h1 != h0 and len(calls) == 1
    assert h1 == fingerprint.tree_hash_uncached(inc)


def test_toolchain_records_host_compiler(monkeypatch):
    if REAL_NVCC is None:
        pytest.skip("needs nvcc")
    t0 = nvcc.toolchain()
    assert t0.nvcc.startswith("cuda_") and t0.ccbin == "gcc" and t0.host_compiler
    monkeypatch.setenv("NVCC_CCBIN", "g++")
    t1 = nvcc.toolchain()
    assert t1.ccbin == "g++" and t1.id != t0.id
    assert nvcc.toolchain(["-ccbin", "clang++"]).ccbin == "clang++"


# ---- building --------------------------------------------------------------------------------

@needs_nvcc
def test_build_then_hit(cache_env):
    a = build(tiny_source("hit"), "sm80", name="hit")
    assert not a.cached and a.seconds > 0
    b = build(tiny_source("hit"), "sm80", name="hit")
    assert b.cached and b.library == a.library and b.seconds == 0
    assert loaded_tag(b.verified_library_path()) == "hit"
    meta = a.meta
    assert meta["toolchain"] == nvcc.toolchain().to_json() and meta["name"] == "hit" and meta["arch"] == "sm80"


@needs_nvcc
def test_old_call_forms_still_work(cache_env, prebuilt):
    """build(source, Target) and build_many([(source, Target, name)]) as gemm.py, cli.py and the
    benchmarks call them."""
    from evtc.plan.target import SM80

    copy_prebuilt(prebuilt, cache_env)
    assert build(tiny_source("a"), SM80, name="a").cached
    (res,) = build_many([(tiny_source("b"), SM80, "b")], workers=1)
    assert res.cached and loaded_tag(res.verified_library_path()) == "b"


@needs_nvcc
def test_failed_build_keeps_source_and_log(cache_env):
    src = tiny_source("bad") + "\nthis is not C++;\n"
    with pytest.raises(BuildError) as e:
        build(src, "sm80", name="bad")
    text = str(e.value)
    assert "nvcc failed" in text and "kernel bad (sm80)" in text and "error" in text
    key = kernel_key(src, arch="sm80")
    failed = cache_env / "failed" / key
    assert f"source: {failed / 'kernel.cu'}" in text and f"log:    {failed / 'build.log'}" in text
    assert (failed / "kernel.cu").read_text() == src
    assert "this is not C++" in (failed / "build.log").read_text()
    assert not (cache_env / "kernels" / key[:2] / key).exists()


def test_nvcc_timeout_kills_the_process_group(cache_env, tmp_path, monkeypatch):
    pids = tmp_path / "pids"
    fake = fake_nvcc(tmp_path, f'sleep 300 & echo $! >> {pids}\nsh -c "sleep 300" & echo $! >> {pids}\n'
                               f'echo $$ >> {pids}\nwait')
    monkeypatch.setenv("EVTC_NVCC", str(fake))
    t0 = time.monotonic()
    with pytest.raises(BuildError, match=r"nvcc timed out after 1 s .*killed") as e:
        build(tiny_source("hang"), "sm80", name="hang", timeout=1)
    assert time.monotonic() - t0 < 30
    assert "EVTC_NVCC_TIMEOUT" in str(e.value) and "build.log" in str(e.value)
    children = [int(x) for x in pids.read_text().split()]
    assert len(children) == 3
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and any(process_state(p) not in (None, "Z") for p in children):
        time.sleep(0.1)
    assert all(process_state(p) in (None, "Z") for p in children), [(p, process_state(p)) for p in children]


def test_default_timeout_is_configurable(monkeypatch):
    assert nvcc.default_timeout() == 600
    monkeypatch.setenv("EVTC_NVCC_TIMEOUT", "12.5")
    assert nvcc.default_timeout() == 12.5
    monkeypatch.setenv("EVTC_NVCC_TIMEOUT", "soon")
    with pytest.raises(BuildError, match="EVTC_NVCC_TIMEOUT"):
        nvcc.default_timeout()


def test_no_nvcc_and_not_cached_names_the_way_out(cache_env, monkeypatch):
    monkeypatch.setenv("EVTC_NVCC", "none")
    with pytest.raises(NoDeviceError) as e:
        build(tiny_source("nowhere"), "sm80", name="nowhere")
    text = str(e.value)
    assert "kernel nowhere (sm80" in text and str(cache_env) in text and "evtc cache import" in text


@needs_nvcc
def test_lock_wait_is_bounded(cache_env, monkeypatch):
    src = tiny_source("locked")
    root = store.cache_root()
    key = kernel_key(src, arch="sm80")
    held = store.key_lock(root, key, 5)
    monkeypatch.setenv("EVTC_LOCK_TIMEOUT", "1")
    result = {}

    def other():  # another thread: a lock file descriptor of its own, as another process would have
        try:
            build(src, "sm80", name="locked")
        except CacheError as e:
            result["err"] = e

    try:
        t = threading.Thread(target=other)
        t0 = time.monotonic()
        t.start()
        t.join(30)
    finally:
        held.release()
    assert 0.9 < time.monotonic() - t0 < 20
    assert "waited 1 s for the build lock" in str(result["err"]) and "locked" in str(result["err"])


CHILD = textwrap.dedent("""
    import json, os, sys, time
    from pathlib import Path
    from evtc.compiler import build
    barrier = Path(sys.argv[2])
    (barrier / str(os.getpid())).touch()
    deadline = time.time() + 120
    while len(list(barrier.iterdir())) < 2 and time.time() < deadline:  # start together
        time.sleep(0.01)
    t0 = time.time()
    a = build(open(sys.argv[1]).read(), "sm80", name="twice")
    print(json.dumps({"cached": a.cached, "library": str(a.library), "start": t0, "end": time.time()}))
""")


def test_two_processes_build_one_kernel_once(cache_env, tmp_path, prebuilt):
    """One process compiles; the other waits on the lock and loads the result. The compiler
    logs each run, takes 2 s (so the two overlap) and copies kernel a's prebuilt library."""
    log = tmp_path / "nvcc.log"
    lib = prebuilt_library(prebuilt, "a")
    fake = fake_nvcc(tmp_path, textwrap.dedent(f"""\
        echo "start $(date +%s.%N)" >> {log}
        sleep 2
        out=""
        while [ $# -gt 0 ]; do [ "$1" = "-o" ] && out="$2"; shift; done
        cp {lib} "$out"
        echo "end $(date +%s.%N)" >> {log}
        """), real_version=True)
    barrier = tmp_path / "barrier"
    barrier.mkdir()
    src = tmp_path / "k.cu"
    src.write_text(tiny_source("a"))
    env = dict(os.environ, EVTC_NVCC=str(fake), PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", CHILD, str(src), str(barrier)], env=env, cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (out, err) in zip(procs, outs):
        assert p.returncode == 0, err
    results = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    assert sorted(r["cached"] for r in results) == [False, True]
    assert results[0]["library"] == results[1]["library"]
    runs = dict(line.split() for line in log.read_text().splitlines())
    assert len(runs) == 2  # the compiler ran once: one start, one end
    waiter = next(r for r in results if r["cached"])
    assert waiter["start"] < float(runs["end"]) < waiter["end"]  # it asked while the build ran, and waited
    assert loaded_tag(results[0]["library"]) == "a"


def test_strict_toolchain_mode_rebuilds_foreign_builds(cache_env, prebuilt, monkeypatch, tmp_path):
    if REAL_NVCC is None:
        pytest.skip("needs nvcc")
    copy_prebuilt(prebuilt, cache_env)
    # pretend the local toolchain is another one: an nvcc that reports another release
    fake = copying_nvcc(tmp_path, prebuilt_library(prebuilt, "a"), real_version=False)
    monkeypatch.setenv("EVTC_NVCC", str(fake))
    a = build(tiny_source("a"), "sm80", name="a")
    assert a.cached  # prefer (default): another toolchain's build is fine
    monkeypatch.setenv("EVTC_CACHE_TOOLCHAIN", "strict")
    b = build(tiny_source("a"), "sm80", name="a")
    assert not b.cached and b.toolchain_id == nvcc.toolchain().id != a.toolchain_id
    assert b.meta["toolchain"]["nvcc"] == "cuda_99.0.fake"
    monkeypatch.setenv("EVTC_CACHE_TOOLCHAIN", "prefer")
    assert build(tiny_source("a"), "sm80", name="a").toolchain_id == b.toolchain_id  # the local one is preferred
    monkeypatch.setenv("EVTC_CACHE_TOOLCHAIN", "sloppy")
    with pytest.raises(CacheError, match="EVTC_CACHE_TOOLCHAIN"):
        build(tiny_source("a"), "sm80", name="a")


# ---- progress ----------------------------------------------------------------------------------

def test_progress_bar_appears_only_for_slow_builds(capsys):
    with BuildProgress(2, enabled=True, delay=0.2) as bar:
        bar.advance("fast")
        bar.advance("fast")
    assert not bar.shown
    with BuildProgress(2, enabled=True, delay=0.05) as bar:
        time.sleep(0.3)
        bar.advance("k1")
        bar.advance("k2", ok=False)
    assert bar.shown and bar.done == 2 and bar.last == "k2 (failed)"
    err = capsys.readouterr().err
    assert "2/2" in err and "kernels" in err


def test_build_many_reports_each_job(cache_env, prebuilt):
    copy_prebuilt(prebuilt, cache_env)
    seen = []
    res = build_many([BuildJob(tiny_source("a"), "sm80", "a"), BuildJob(tiny_source("b"), "sm80", "b")],
                     on_done=lambda i, r: seen.append(i), workers=2)
    assert sorted(seen) == [0, 1] and all(r.cached for r in res)
    assert [loaded_tag(r.verified_library_path()) for r in res] == ["a", "b"]
