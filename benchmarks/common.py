"""Shared benchmark plumbing: parallel builds, CUDA-event timing, tables and JSON."""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))


def build_all(gemms, label=""):
    """Build every Gemm in parallel (one nvcc per core)."""
    from evtc.compiler import build_many

    t0 = time.perf_counter()
    res = build_many([(g.source, g.target, g.name) for g in gemms], workers=int(os.environ.get("EVTC_BUILD_JOBS", os.cpu_count() or 1)))
    bad = [(g, r) for g, r in zip(gemms, res) if isinstance(r, Exception)]
    for g, r in bad:
        print(f"build failed for {g!r}: {r}", file=sys.stderr)
    print(f"{label} built {len(gemms) - len(bad)}/{len(gemms)} kernels in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return [g for g, r in zip(gemms, res) if not isinstance(r, Exception)]


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
