"""Shared benchmark plumbing: parallel builds, CUDA-event timing, tables and JSON."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))


def jobs_of(g) -> list:
    """A Gemm's build jobs (its family's kernels; a pinned Gemm: its one kernel), or ``[g]`` for
    a bare job (an object with ``source``, ``target``, ``name``, as the conv cases give)."""
    return g.jobs() if hasattr(g, "jobs") else [g]


def unique_jobs(gemms):
    """The build jobs of every Gemm's family (a pinned Gemm: its one kernel), each source once."""
    jobs = {}
    for g in gemms:
        for j in jobs_of(g):
            jobs.setdefault(j.source, (g, j))
    return list(jobs.values())


def fast_path() -> str:
    """Build (once per machine) and load the torch fast path before anything is timed, so no
    timed call runs while it builds in the background (NOTE [The torch fast path]); returns its
    status line."""
    if "torch" not in sys.modules:
        return "torch not imported"
    from evtc.torch import fast as torch_fast

    try:
        torch_fast.build()
    except Exception as e:  # the Python path serves every call
        print(f"torch fast path unavailable: {e}", file=sys.stderr)
    return torch_fast.status()


def build_all(gemms, label=""):
    """Build every Gemm's family in parallel (one nvcc per core) and the torch fast path; returns
    the Gemms whose kernels all built."""
    from evtc.compiler import build_many

    fast_path()

    t0 = time.perf_counter()
    pairs = unique_jobs(gemms)
    res = build_many([j for _, j in pairs], workers=int(os.environ.get("EVTC_BUILD_JOBS", os.cpu_count() or 1)))
    bad_gemms = set()
    for (g, j), r in zip(pairs, res):
        if isinstance(r, Exception):
            print(f"build failed for {j.name}: {r}", file=sys.stderr)
            bad_gemms.add(id(g))
    print(f"{label} built {sum(not isinstance(r, Exception) for r in res)}/{len(res)} kernels in "
          f"{time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return [g for g in gemms if id(g) not in bad_gemms]


def build_chosen(gemms, shapes, tokens, device: str) -> None:
    """Build, in parallel, the kernel each Gemm's dispatch chooses on ``device`` (a GPU's name)
    for every (M, N, K) of ``tokens`` x ``shapes`` ((..., N, K) tuples: the last two entries),
    each source once; prints what it builds and what built."""
    from evtc.compiler import build_many

    jobs = {}
    for g in gemms:
        for *_, N, K in shapes:
            for M in tokens:
                k = g.kernel(g.choose(M, N, K, device=device))
                jobs.setdefault(k.source, k.job())
    print(f"building {len(jobs)} kernels", flush=True)
    res = build_many(list(jobs.values()))
    print(f"built {sum(not isinstance(r, Exception) for r in res)}/{len(res)}")


def table(rows: list[dict], cols: list[str]) -> str:
    def fmt(v):
        if isinstance(v, float):
            return f"{v:.3f}"
        return str(v)

    widths = [max(len(c), *(len(fmt(r.get(c, ""))) for r in rows)) for c in cols]
    lines = ["  ".join(c.ljust(w) for c, w in zip(cols, widths))]
    for r in rows:
        lines.append("  ".join(fmt(r.get(c, "")).ljust(w) for c, w in zip(cols, widths)))
    return "\n".join(lines)


def write_json(path: str | None, data) -> None:
    out = path or os.path.join(os.environ.get("OUT", "."), "bench.json")
    Path(out).write_text(json.dumps(data, indent=2))
    print(f"wrote {out}", file=sys.stderr)


def device_name() -> str:
    import torch

    return torch.cuda.get_device_name()
