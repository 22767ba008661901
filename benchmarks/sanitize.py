"""compute-sanitizer over the GPU tests' ragged and batched cases (issue 10): every reference
epilogue on sm90 (bf16; fp8_out in e4m3) and on sm80 (bf16, both schedulers), on small ragged
shapes, under memcheck, racecheck and synccheck. Prints errors per tool per case and writes JSON;
exits 1 on any sanitizer error, any output outside the oracle's bound, a crash or a time-out.

    python benchmarks/prebuild.py tests sm80          # here: the kernels it runs, then pack_cache.py
    python benchmarks/sanitize.py --json $OUT/sanitize.json    # on the GPU machine (or gpu_suite.sh sanitize)

How: the kernels are built (or found in the cache) first, outside the sanitizer. Then one child
process per tool runs every case under ``compute-sanitizer --tool TOOL`` (one process per case
would pay the sanitized start-up of torch and CUDA 100 times); the child prints a marker before
and after each case and runs with ``CUDA_LAUNCH_BLOCKING=1`` (the sanitizer's report of a kernel
comes before the kernel's launch returns), so every report lands between its case's markers.
``PYTORCH_NO_CUDA_MEMORY_CACHING=1`` gives each tensor its own allocation, so memcheck sees an
access past any tensor (the caching allocator would hide it inside a larger block); writes into
a row's padding, inside the allocation, are the oracle's to catch (evtc.testing checks the
padding stays NaN). The reference is computed on the host, so the sanitizers see evtc's kernels
and torch's fill/copy kernels only. Sanitizers slow kernels 10-100x: the shapes are small
(``SHAPES``), the whole run takes a few minutes.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
for p in (ROOT, ROOT / "examples", ROOT / "tests", ROOT / "tests" / "gpu"):
    if str(p) not in sys.path:
        sys.path.insert(0, str(p))

TOOLS = ("memcheck", "racecheck", "synccheck")
#: (M, N, K, L): ragged M and N for every tile, K not a multiple of the K tile; ragged and batched
SHAPES = [(200, 136, 72, 1), (77, 264, 64, 2)]
REFERENCE = ["linear_combination", "bias_relu", "gelu_aux", "dgelu_bgrad", "residual_scale", "row_stats", "fp8_out",
             "many_aux"]
MARK = "EVTC-SANITIZE"
SANITIZER_FLAGS = {
    "memcheck": ["--leak-check", "no", "--report-api-errors", "no"],
    "racecheck": [],
    "synccheck": [],
}


@dataclasses.dataclass(frozen=True)
class Case:
    """One kernel on one shape."""

    arch: str
    epilogue: str
    dtype: str
    scheduler: str
    shape: tuple[int, int, int, int]

    @property
    def id(self) -> str:
        return f"{self.arch}/{self.epilogue}/{self.dtype}/{self.scheduler}/{'x'.join(map(str, self.shape))}"

    def gemm(self):
        if self.arch == "sm90":
            import test_sm90_language as T

            return T.make_reference_gemm(self.epilogue, self.dtype)
        import test_sm80_reference as T

        return T.make_gemm(self.epilogue, self.dtype, self.scheduler)


def all_cases(archs=("sm90", "sm80"), only: str | None = None) -> list[Case]:
    """sm90: each reference epilogue in bf16 (fp8_out: e4m3); sm80: each in bf16 with the
    persistent and the stream-K scheduler; every one on every shape of ``SHAPES``."""
    out = []
    for name in REFERENCE:
        if only and name != only:
            continue
        for shape in SHAPES:
            if "sm90" in archs:
                out.append(Case("sm90", name, "e4m3" if name == "fp8_out" else "bf16", "persistent", shape))
            if "sm80" in archs:
                out += [Case("sm80", name, "bf16", s, shape) for s in ("persistent", "streamk")]
    return out


# ---- the child: runs the cases, under the sanitizer ---------------------------------------------

def run_child(ids: list[str]) -> int:
    import torch

    from evtc.testing import Problem, check_outputs, make_inputs, poisoned_outputs

    by_id = {c.id: c for c in all_cases()}
    failed = 0
    for cid in ids:
        case = by_id[cid]
        print(f"{MARK} BEGIN {cid}", flush=True)
        try:
            g = case.gemm()
            p = Problem(*case.shape)
            ins = make_inputs(g.graph, g.a, g.b, p, seed=sum(case.shape))
            outs = poisoned_outputs(g.graph, p)
            g(ins["A"], ins["B"], out=outs, **{k: v for k, v in ins.items() if k not in ("A", "B")})
            torch.cuda.synchronize()
            host = {k: v.cpu() if hasattr(v, "cpu") else v for k, v in ins.items()}
            res = check_outputs(g, host, outs)
            ok = all(r.ok for r in res.values())
            failed += not ok
            detail = "; ".join(r.describe() for r in res.values() if not r.ok)
            print(f"{MARK} RESULT {cid} {'ok' if ok else 'FAILED ' + detail}", flush=True)
        except Exception as e:  # noqa: BLE001 - reported per case, the other cases still run
            failed += 1
            print(f"{MARK} RESULT {cid} FAILED {type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}",
                  flush=True)
        print(f"{MARK} END {cid}", flush=True)
    return 1 if failed else 0


# ---- the parent: runs the tools, parses their reports -------------------------------------------------

# top-level sanitizer lines that are not reports
_NOT_REPORTS = ("COMPUTE-SANITIZER", "ERROR SUMMARY", "RACECHECK SUMMARY", "LEAK SUMMARY", "Target application returned",
                "Error: process didn't terminate", "Note:", "This can happen", "Saved host backtrace")
_REPORT = re.compile(r"^========= (\S.*)$")
_SUMMARY = re.compile(r"^========= (?:ERROR SUMMARY: (\d+) error|RACECHECK SUMMARY: \d+ hazards? displayed \((\d+) error)")


def parse(tool: str, text: str, ids: list[str]) -> dict:
    """Count a tool's reports per case from the interleaved output of the child and the sanitizer.

    Returns:
        {"cases": {id: {"errors", "warnings", "oracle", "first"}}, "outside": errors outside any
        case, "summary": the tool's own total (None if it printed none), "missing": cases that
        never finished (a crash or a time-out)}.
    """
    cases = {i: {"errors": 0, "warnings": 0, "oracle": None, "first": None, "finished": False} for i in ids}
    current = None
    outside = 0
    summary = None
    for line in text.splitlines():
        if line.startswith(f"{MARK} "):
            word, _, rest = line[len(MARK) + 1:].partition(" ")
            cid, _, detail = rest.partition(" ")
            if word == "BEGIN" and cid in cases:
                current = cid
            elif word == "RESULT" and cid in cases:
                cases[cid]["oracle"] = detail
            elif word == "END" and cid in cases:
                cases[cid]["finished"] = True
                current = None
            continue
        m = _SUMMARY.match(line)
        if m:
            summary = int(m.group(1) or m.group(2))
            continue
        m = _REPORT.match(line)
        if not m or m.group(1).startswith(_NOT_REPORTS):
            continue
        report = m.group(1)
        warning = tool == "racecheck" and report.startswith("Warning")
        if current is None:
            outside += not warning
            continue
        entry = cases[current]
        entry["warnings" if warning else "errors"] += 1
        if not warning and entry["first"] is None:
            entry["first"] = report
    missing = [i for i, c in cases.items() if not c["finished"]]
    for c in cases.values():
        del c["finished"]
    return {"cases": cases, "outside": outside, "summary": summary, "missing": missing}


def sanitizer_path(given: str | None) -> str:
    for p in (given, shutil.which("compute-sanitizer"), "/usr/local/cuda/bin/compute-sanitizer"):
        if p and Path(p).exists():
            return p
    raise SystemExit("compute-sanitizer not found (pass --sanitizer PATH; it is in /usr/local/cuda/bin on the GPU machine)")


def run_tool(sanitizer: str, tool: str, ids: list[str], timeout: float) -> tuple[str, int | None, float]:
    env = dict(os.environ, CUDA_LAUNCH_BLOCKING="1", PYTORCH_NO_CUDA_MEMORY_CACHING="1", PYTHONUNBUFFERED="1",
               PYTHONPATH=os.pathsep.join([str(ROOT)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]))
    cmd = [sanitizer, "--tool", tool, *SANITIZER_FLAGS[tool], "--print-limit", "20", sys.executable, __file__,
           "--child", *ids]
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, timeout=timeout,
                           start_new_session=True)
        return p.stdout, p.returncode, time.perf_counter() - t0
    except subprocess.TimeoutExpired as e:
        out = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
        return out, None, time.perf_counter() - t0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--tools", default=",".join(TOOLS), help="comma-separated subset of " + ", ".join(TOOLS))
    ap.add_argument("--arch", default="sm90,sm80", help="comma-separated: sm90, sm80")
    ap.add_argument("--only", help="one reference epilogue")
    ap.add_argument("--timeout", type=float, default=600, help="seconds per tool")
    ap.add_argument("--sanitizer", help="path of compute-sanitizer")
    ap.add_argument("--json", help="output path (default $OUT/sanitize.json, ./ without OUT)")
    ap.add_argument("--log-dir", help="where each tool's full output goes (default: beside the JSON)")
    ap.add_argument("--no-build", action="store_true", help="don't build first (the kernels are in the cache)")
    ap.add_argument("--child", nargs="*", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child is not None:
        return run_child(args.child)

    tools = [t for t in args.tools.split(",") if t]
    bad = [t for t in tools if t not in TOOLS]
    if bad:
        raise SystemExit(f"unknown tool(s) {bad}: use {', '.join(TOOLS)}")
    sanitizer = sanitizer_path(args.sanitizer)
    cases = all_cases(tuple(args.arch.split(",")), args.only)
    ids = [c.id for c in cases]
    json_path = Path(args.json or Path(os.environ.get("OUT", ".")) / "sanitize.json")
    log_dir = Path(args.log_dir or json_path.parent)
    log_dir.mkdir(parents=True, exist_ok=True)

    if not args.no_build:
        import common

        gemms = {}
        for c in cases:
            g = c.gemm()
            gemms.setdefault(g.source, g)
        built = common.build_all(list(gemms.values()), "sanitize")
        if len(built) != len(gemms):
            print("some kernels failed to build: their cases fail", file=sys.stderr)

    report = {"sanitizer": sanitizer, "shapes": SHAPES, "tools": {}, "cases": ids}
    failed = False
    for tool in tools:
        print(f"=== {tool}: {len(ids)} cases", file=sys.stderr, flush=True)
        out, rc, secs = run_tool(sanitizer, tool, ids, args.timeout)
        (log_dir / f"sanitize_{tool}.log").write_text(out)
        parsed = parse(tool, out, ids)
        parsed.update(returncode=rc, seconds=round(secs, 1), timed_out=rc is None)
        report["tools"][tool] = parsed
        errors = sum(c["errors"] for c in parsed["cases"].values()) + parsed["outside"]
        oracle_bad = [i for i, c in parsed["cases"].items() if c["oracle"] is not None and c["oracle"] != "ok"]
        failed |= bool(errors or oracle_bad or parsed["missing"] or rc is None
                       or (parsed["summary"] or 0) > 0 or parsed["summary"] is None)
        print(f"    {errors} errors ({parsed['summary']} by the tool's summary), {len(oracle_bad)} oracle failures, "
              f"{len(parsed['missing'])} unfinished, {secs:.0f} s", file=sys.stderr, flush=True)

    width = max(len(i) for i in ids)
    print(f"{'case':<{width}}  " + "  ".join(f"{t:>10}" for t in tools) + "  oracle")
    for cid in ids:
        cells, oracle = [], "ok"
        for t in tools:
            c = report["tools"][t]["cases"][cid]
            cells.append("unfinished" if cid in report["tools"][t]["missing"] else str(c["errors"]))
            if c["oracle"] not in (None, "ok"):
                oracle = c["oracle"][:60]
        print(f"{cid:<{width}}  " + "  ".join(f"{x:>10}" for x in cells) + f"  {oracle}")
    for t in tools:
        r = report["tools"][t]
        if r["outside"]:
            print(f"{t}: {r['outside']} errors outside any case (see {log_dir / f'sanitize_{t}.log'})")
        for cid, c in r["cases"].items():
            if c["first"]:
                print(f"{t} {cid}: {c['first']}")
    report["ok"] = not failed
    json_path.write_text(json.dumps(report, indent=1))
    print(f"{'OK' if not failed else 'FAILED'}: wrote {json_path}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
