"""Issue 12's build-time benchmark: a cold kernel build, its phases, a cold family, a cache hit.

On the GPU machine (16 cores; nothing else running):

    python benchmarks/bench_build.py --json $OUT/build.json

What it measures, for bias_relu (bf16, the default family):

* ``cold``: one nvcc of the primary kernel (the exact command :func:`evtc.compiler.nvcc.nvcc_command`
  gives, plus ``--time``) into a temporary folder: wall seconds and nvcc's own phase times
  (``--time``: cudafe++, the host compiler, cicc, ptxas, fatbinary; ms).
* ``split``: the build evtc's cache runs (NOTE [Split builds] in evtc/compiler/nvcc.py): the
  device half (``-cubin``) and the host half (``-c``) at once, then the image and the link; wall
  seconds, and both halves' phases summed.
* ``variants`` (``--variants``): the one-command build with host-side or debug-info flags that
  leave the device code alone (``-Xcompiler=-O1`` for the host code, no ``-lineinfo``).
* ``family``: ``Gemm(...).build()`` of the whole default family into an empty cache with
  ``EVTC_BUILD_JOBS`` workers (default: every core), in a fresh process: wall seconds.

The single builds and the family's run at the same time (the one command, the split's two halves
and the family's 6 kernels x 2 halves: 15 processes on the GPU machine's 16 cores): each number is
an upper bound of that build run alone. ``--alone`` first runs the split build and then the one
command with nothing else running.
* ``hit``: a fresh process with that cache: ``import evtc`` (ms), then construct the Gemm and make
  its first call (build lookup, load, checks, launch, synchronise; ms).

Issue 12's goals on the H100 machine: one sm90 kernel cold <= 30 s, the family <= 45 s wall,
a cache hit (construct + first call) <= 50 ms.

``--construct`` measures only the host side of a hit, needs no nvcc or GPU, and runs on any
machine (each figure in a fresh process, ``--repeat`` times; ms):

* ``import_evtc_ms``: ``import evtc``;
* ``construct_cold_ms``: the first ``Gemm(...)`` with an empty construct memo (an empty cache
  directory): tracing, passes, planning the primary kernel, storing the memo;
* ``construct_warm_ms``: ``Gemm(...)`` in a fresh process with the memo the cold run left
  (:mod:`evtc.pipeline.memo`);
* ``construct_off_ms``: the same with ``EVTC_CONSTRUCT_MEMO=0`` (what every construct cost
  before the memo);
* ``choose_lookup_ms``: then ``choose(256, 256, 256)``, its kernel and source, and the kernel
  cache lookup of that source (:func:`evtc.compiler.lookup`: the key, header hashes, the
  entry's folder; the first call's host work before loading a library);
* which of sympy, jinja2, networkx and numpy the warm process imported.

Where ``PYTHONDONTWRITEBYTECODE`` is set (it is on the machines here) every module of a checkout
is compiled from source in every process; ``--bytecode`` measures with ``.pyc`` files, as an
installed evtc has them.

    python benchmarks/bench_build.py --construct --json $OUT/construct.json
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import common

import evtc
from evtc import bf16
from evtc.compiler import nvcc


def _flags_without(flags: list[str], drop: str) -> list[str]:
    return [f for f in flags if f != drop]


def primary_source() -> str:
    import epilogues as E

    g = evtc.Gemm(E.REFERENCE["bias_relu"], a=bf16, b=bf16, c=bf16, d=bf16)
    return g.jobs()[0].source


def phases(csv_path: Path) -> dict[str, float]:
    """nvcc ``--time`` CSV -> ms per phase (summed over rows of the same phase)."""
    out: dict[str, float] = {}
    if not csv_path.exists():
        return out
    with csv_path.open() as f:
        rows = list(csv.reader(f))
    if not rows:
        return out
    header = [h.strip().lower() for h in rows[0]]
    try:
        pi = header.index("phase name")
        mi = header.index("metric")
    except ValueError:
        return out
    for r in rows[1:]:
        if len(r) <= max(pi, mi):
            continue
        try:
            ms = float(r[mi])
        except ValueError:
            continue
        name = r[pi].strip()
        out[name] = round(out.get(name, 0.0) + ms, 1)
    return out


def nvcc_build(source: str, workdir: Path, label: str, drop: str | None = None, extra: tuple[str, ...] = ()) -> dict:
    """One nvcc of ``source`` with evtc's command line (``drop``: a flag removed, ``extra``: flags
    added) and ``--time``; wall seconds and phases."""
    d = workdir / label
    d.mkdir(parents=True, exist_ok=True)
    cu = d / "k.cu"
    cu.write_text(source)
    cmd = nvcc.nvcc_command("sm90", cu, d / "k.so", extra_flags=(*extra, "--time", str(d / "time.csv")),
                            nvcc=nvcc.require_nvcc())
    if drop:
        cmd = _flags_without(cmd, drop)
    t0 = time.perf_counter()
    p = subprocess.run(cmd, check=False, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    return {"label": label, "wall_s": round(wall, 1), "ok": p.returncode == 0, "phases_ms": phases(d / "time.csv"),
            "so_bytes": (d / "k.so").stat().st_size if (d / "k.so").exists() else 0,
            "log_tail": (p.stderr or "")[-400:] if p.returncode else ""}


def split_build(source: str, workdir: Path, label: str = "split") -> dict:
    """The build evtc's cache runs for ``source``: its device and host halves at once, then the
    image and the link (NOTE [Split builds] in evtc/compiler/nvcc.py); wall seconds and each
    half's nvcc phases (``--time``)."""
    d = workdir / label
    d.mkdir(parents=True, exist_ok=True)
    cu = d / "k.cu"
    cu.write_text(source)
    out = {"label": label, "ok": False, "phases_ms": {}, "so_bytes": 0, "log_tail": ""}
    t0 = time.perf_counter()
    try:
        # --time in each half: the flag takes a file, so the halves write one each
        nvcc.compile_shared(cu, d / "k.so", "sm90", d / "build.log", split=True,
                            extra_flags=("--time", str(d / "time.csv")))
        out["ok"] = True
    except Exception as e:  # noqa: BLE001 - reported, not raised: the other builds go on
        out["log_tail"] = str(e)[-400:]
    out["wall_s"] = round(time.perf_counter() - t0, 1)
    out["phases_ms"] = phases(d / "time.csv")
    out["so_bytes"] = (d / "k.so").stat().st_size if (d / "k.so").exists() else 0
    return out


FAMILY = """
import os, sys, time
sys.path.insert(0, {examples!r})
t0 = time.perf_counter()
import evtc, epilogues as E
from evtc import bf16
g = evtc.Gemm(E.REFERENCE["bias_relu"], a=bf16, b=bf16, c=bf16, d=bf16)
t1 = time.perf_counter()
g.build()
t2 = time.perf_counter()
print("RESULT", len(g.kernels()), round(t1 - t0, 3), round(t2 - t1, 2))
"""

HIT = """
import sys, time
sys.path.insert(0, {examples!r})
t0 = time.perf_counter()
import torch
t1 = time.perf_counter()
import evtc, epilogues as E
from evtc import bf16
t2 = time.perf_counter()
A = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
B = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
C = torch.randn(256, 256, device="cuda", dtype=torch.bfloat16)
bias = torch.randn(256, device="cuda", dtype=torch.float32)
torch.cuda.synchronize()
t3 = time.perf_counter()
g = evtc.Gemm(E.REFERENCE["bias_relu"], a=bf16, b=bf16, c=bf16, d=bf16)
t4 = time.perf_counter()
D = g(A, B, C=C, bias=bias, alpha=0.5, beta=1.5)
torch.cuda.synchronize()
t5 = time.perf_counter()
D = g(A, B, C=C, bias=bias, alpha=0.5, beta=1.5)
torch.cuda.synchronize()
t6 = time.perf_counter()
print("RESULT", round((t1 - t0) * 1e3, 1), round((t2 - t1) * 1e3, 1), round((t4 - t3) * 1e3, 2),
      round((t5 - t4) * 1e3, 2), round((t6 - t5) * 1e3, 3))
"""


CONSTRUCT = """
import sys, time
t0 = time.perf_counter()
import evtc
t1 = time.perf_counter()
sys.path.insert(0, {examples!r})
import epilogues as E
from evtc import bf16
ep = E.REFERENCE[{epilogue!r}]
t2 = time.perf_counter()
g = evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16, arch="sm90")
t3 = time.perf_counter()
k = g.kernel(g.choose(256, 256, 256))
src = k.source
try:
    from evtc.compiler import lookup
    lookup(src, k.arch, name=k.job_name)
    looked = 1
except evtc.EvtcError:
    looked = 0
t4 = time.perf_counter()
mods = "".join("1" if m in sys.modules else "0" for m in ("sympy", "jinja2", "networkx", "numpy"))
print("RESULT", round((t1 - t0) * 1e3, 2), round((t3 - t2) * 1e3, 2), round((t4 - t3) * 1e3, 2), mods, looked)
"""


def _stats(xs: list[float]) -> dict:
    s = sorted(xs)
    return {"median": s[len(s) // 2], "min": s[0], "max": s[-1], "runs": xs}


def construct_bench(epilogue: str, repeat: int, bytecode: bool = False) -> dict:
    """The host side of a cache hit, each figure in a fresh process (see the module docstring).

    Args:
        epilogue: a name in examples/epilogues.py.
        repeat: fresh processes per figure (the import figure gets two per repeat).
        bytecode: let the processes write and read ``.pyc`` files (in a temporary
            ``PYTHONPYCACHEPREFIX``, filled by a discarded first run) even where
            ``PYTHONDONTWRITEBYTECODE`` is set, as it is on the machines here: without, every evtc
            module is compiled from source in every process.
    """
    code = CONSTRUCT.format(examples=str(common.ROOT / "examples"), epilogue=epilogue)
    base = {k: v for k, v in os.environ.items() if k not in ("EVTC_CONSTRUCT_MEMO", "EVTC_SHARED_CACHE")}
    runs: dict[str, list[float]] = {k: [] for k in ("import_evtc_ms", "construct_cold_ms", "construct_warm_ms",
                                                     "construct_off_ms", "choose_lookup_ms", "choose_lookup_cold_ms")}
    mods, looked = "", "0"
    with tempfile.TemporaryDirectory() as tmp:
        if bytecode:
            base.pop("PYTHONDONTWRITEBYTECODE", None)
            base["PYTHONPYCACHEPREFIX"] = str(Path(tmp) / "pyc")
            warm_up = Path(tmp) / "warm-up"
            warm_up.mkdir(mode=0o700)
            for memo in ("1", "1", "0"):  # compiles what the cold, warm and memo-off runs import
                _run_py(code, dict(base, EVTC_CACHE_DIR=str(warm_up), EVTC_CONSTRUCT_MEMO=memo))
        for i in range(repeat):
            cache = Path(tmp) / f"cache{i}"
            cache.mkdir(mode=0o700)
            env = dict(base, EVTC_CACHE_DIR=str(cache), EVTC_PROGRESS="0")
            imp, cold, cold_lookup, _, _ = _run_py(code, env)  # empty memo: computes and stores
            imp2, warm, warm_lookup, mods, looked = _run_py(code, env)
            _, off, _, _, _ = _run_py(code, dict(env, EVTC_CONSTRUCT_MEMO="0"))
            runs["import_evtc_ms"] += [float(imp), float(imp2)]
            runs["construct_cold_ms"].append(float(cold))
            runs["choose_lookup_cold_ms"].append(float(cold_lookup))
            runs["construct_warm_ms"].append(float(warm))
            runs["choose_lookup_ms"].append(float(warm_lookup))
            runs["construct_off_ms"].append(float(off))
    res = {k: _stats(v) for k, v in runs.items()}
    res["warm_hit_ms"] = _stats([c + l for c, l in zip(runs["construct_warm_ms"], runs["choose_lookup_ms"])])
    res["warm_imported"] = dict(zip(("sympy", "jinja2", "networkx", "numpy"), (m == "1" for m in mods)))
    res["lookup_ran"] = looked == "1"
    res["epilogue"], res["repeat"], res["cores"] = epilogue, repeat, os.cpu_count()
    res["bytecode"] = bytecode or not os.environ.get("PYTHONDONTWRITEBYTECODE")
    return res


def _run_py(code: str, env: dict) -> list[str]:
    p = subprocess.run([sys.executable, "-c", code], check=False, capture_output=True, text=True, env=env)
    for line in p.stdout.splitlines():
        if line.startswith("RESULT"):
            return line.split()[1:]
    raise RuntimeError(f"subprocess failed (rc {p.returncode}): {p.stderr[-2000:]}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json")
    ap.add_argument("--hit", type=int, metavar="N", help="only the cache hit, N fresh processes (bias_relu's family "
                                                          "in the cache already: prebuild.py shapes)")
    ap.add_argument("--variants", action="store_true", help="also the flag variants (4 more builds at once)")
    ap.add_argument("--alone", action="store_true",
                    help="first the split build and the one-command build alone, one after the other")
    ap.add_argument("--no-family", action="store_true")
    ap.add_argument("--construct", action="store_true",
                    help="only the host side of a cache hit (import, construct with a cold and a warm memo, "
                         "choose and look up); no nvcc or GPU needed")
    ap.add_argument("--epilogue", default="bias_relu", help="with --construct: a name in examples/epilogues.py")
    ap.add_argument("--repeat", type=int, default=5, help="with --construct: fresh processes per figure")
    ap.add_argument("--bytecode", action="store_true",
                    help="with --construct: let the processes cache bytecode even under PYTHONDONTWRITEBYTECODE")
    args = ap.parse_args()
    if args.hit:
        examples = str(common.ROOT / "examples")
        keys = ("import_torch_ms", "import_evtc_ms", "construct_ms", "first_call_ms", "second_call_ms")
        hits = [dict(zip(keys, map(float, _run_py(HIT.format(examples=examples), dict(os.environ)))))
                for _ in range(args.hit)]
        for h in hits:
            print("cache hit: " + ", ".join(f"{k} {v}" for k, v in h.items()))
        common.write_json(args.json, {"hit": hits})
        return
    if args.construct:
        res = construct_bench(args.epilogue, args.repeat, args.bytecode)
        for k, v in res.items():
            if isinstance(v, dict) and "median" in v:
                print(f"{k:24s} median {v['median']:8.1f} ms  (min {v['min']:.1f}, max {v['max']:.1f}, "
                      f"{len(v['runs'])} runs)")
        print(f"imported by a warm construct + lookup: {res['warm_imported']}; cache lookup ran: {res['lookup_ran']}; "
              f".pyc files used: {res['bytecode']}")
        common.write_json(args.json, {"construct": res})
        return
    res: dict = {"cores": os.cpu_count(), "nvcc": nvcc.nvcc_version(), "cutlass": nvcc.cutlass_version()}
    src = primary_source()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        cache = work / "cache"
        env = dict(os.environ, EVTC_CACHE_DIR=str(cache), EVTC_PROGRESS="0")
        env.setdefault("EVTC_BUILD_JOBS", str(os.cpu_count() or 1))
        examples = str(common.ROOT / "examples")
        # Everything at once, each nvcc on its own core (16 on the GPU machine: 4 single builds
        # and the family's 6): the numbers are upper bounds of builds run alone.
        specs = [("cold", None, ())]
        if args.variants:
            specs += [("host_O1", None, ("-Xcompiler=-O1",)), ("no_lineinfo", "-lineinfo", ()),
                      ("host_O1_no_lineinfo", "-lineinfo", ("-Xcompiler=-O1",))]
        if args.alone:  # one after the other, nothing else running: the split, the one command, the family
            res["split_alone"] = split_build(src, work, "split_alone")
            res["cold_alone"] = nvcc_build(src, work, "cold_alone")
            print(f"alone: split {res['split_alone']['wall_s']} s ok={res['split_alone']['ok']}, one command "
                  f"{res['cold_alone']['wall_s']} s ok={res['cold_alone']['ok']} (split / one command "
                  f"{res['split_alone']['wall_s'] / max(res['cold_alone']['wall_s'], 1e-9):.2f})")
        with concurrent.futures.ThreadPoolExecutor(len(specs) + 1) as ex:
            futs = [ex.submit(nvcc_build, src, work, n, drop, extra) for n, drop, extra in specs]
            split_fut = ex.submit(split_build, src, work)
            fam = None
            if not args.no_family:
                t0 = time.perf_counter()
                fam = ex.submit(_run_py, FAMILY.format(examples=examples), env)
            builds = [f.result() for f in futs]
            if fam is not None:
                n, construct_s, build_s = fam.result()
                res["family"] = {"kernels": int(n), "construct_s": float(construct_s), "build_s": float(build_s),
                                 "process_wall_s": round(time.perf_counter() - t0, 1), "jobs": env["EVTC_BUILD_JOBS"]}
        res["cold"], res["variants"] = builds[0], builds[1:]
        res["split"] = split_fut.result()
        print(f"cold sm90 build (bias_relu's primary kernel), one nvcc command: {res['cold']['wall_s']} s "
              f"ok={res['cold']['ok']}")
        for k, v in sorted(res["cold"]["phases_ms"].items(), key=lambda kv: -kv[1])[:10]:
            print(f"  {k:40s} {v / 1e3:7.1f} s")
        s = res["split"]
        print(f"cold sm90 build, split (evtc's builds: both halves at once): {s['wall_s']} s ok={s['ok']} "
              f"({s['wall_s'] / max(res['cold']['wall_s'], 1e-9):.2f}x the one command) {s['log_tail']}")
        for v in res["variants"]:
            top = sorted(v["phases_ms"].items(), key=lambda kv: -kv[1])[:4]
            print(f"  variant {v['label']:20s} {v['wall_s']:6.1f} s ok={v['ok']} so={v['so_bytes']} B "
                  + " ".join(f"{k}={ms / 1e3:.1f}s" for k, ms in top))
        if "family" in res:
            f = res["family"]
            print(f"family of bias_relu, cold: {f['kernels']} kernels with {f['jobs']} jobs in {f['build_s']} s "
                  f"(construct {f['construct_s']} s)")
            hits = [_run_py(HIT.format(examples=examples), env) for _ in range(3)]
            keys = ("import_torch_ms", "import_evtc_ms", "construct_ms", "first_call_ms", "second_call_ms")
            res["hit"] = [dict(zip(keys, map(float, h))) for h in hits]
            for h in res["hit"]:
                print("cache hit: " + ", ".join(f"{k} {v}" for k, v in h.items()))
    common.write_json(args.json, res)


if __name__ == "__main__":
    main()
