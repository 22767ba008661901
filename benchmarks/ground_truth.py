"""Ground truth for the selection model (issue 36): every candidate kernel of the sm90 family, with
its run-time variants, timed on every problem of the corpus (benchmarks/corpus), for three
epilogue classes, beside cuBLAS's plain GEMM, the epilogue run eagerly after it (unfused) and
torch.compile (default mode) of the same, in one run per device.

    python benchmarks/ground_truth.py build -j 64                       # every kernel, in parallel
    python benchmarks/ground_truth.py time --shard 0/4 --out gt0.json   # one process per GPU
    python benchmarks/ground_truth.py merge gt*.json --out benchmarks/ground_truth/H200.json

``--recheck H200.json`` times only a first run's two fastest candidates and the model's choice
(benchmarks/validate_call.sh, recheck_call.sh); ``--epilogues pointwise,aux`` runs some classes
only; ``--budget-s`` stops (after saving) part way, the problems taken in the order of their
hashed ids, so that what was timed is a random subset.

The epilogue classes (bf16 operands and outputs):

* ``pointwise``: ``relu(alpha*acc + beta*C + bias[n])`` (examples/epilogues.py's bias_relu);
* ``aux``: an aux load and two stores, ``F = acc + bias[n]``, ``D = gelu(F) * R`` and ``F``;
* ``reduce``: ``D = acc + bias[n]`` with its row max and column sum.

The candidates are :func:`evtc.dispatch.space.candidates` over :data:`evtc.dispatch.space.
MEMBERS` (the default family, the cluster-less variants and the members on trial), each run as a
pinned Gemm (so what is timed is that kernel with those run-time arguments, nothing else), plus the
family Gemm's own call (``evtc``: what a user gets today). Times are the kernels' own, in CUDA
graphs (:func:`evtc.testing.bench.time_graphs`: candidates alternate, median of replays), with a number of
calls per replay and of replays that keeps each candidate near a fixed budget of GPU time. A
candidate's first call is checked against the float64 reference on a small ragged problem before
anything is timed (``verify``).

The output is one compact JSON per device: the problems, the candidates' labels, and per
(problem, epilogue) the median ms of each candidate and of the baselines.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from pathlib import Path

import common  # noqa: F401  (sys.path: examples/)

import evtc
from evtc import bf16, f32

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


@evtc.epilogue
def pointwise(acc, C, alpha: float, beta: float, bias: evtc.RowVector[f32]):
    return evtc.relu(alpha * acc + beta * C + bias)


@evtc.epilogue
def aux(acc, bias: evtc.RowVector[f32], R: evtc.Matrix):
    F = acc + bias
    return {"D": evtc.gelu(F) * R, "F": F}


@evtc.epilogue
def reduce(acc, bias: evtc.RowVector[f32]):
    D = acc + bias
    return {"D": D, "row_max": evtc.max(D, dim=1), "col_sum": evtc.sum(D, dim=0)}


EPILOGUES = {"pointwise": pointwise, "aux": aux, "reduce": reduce}


def torch_epilogue(name):
    """The same epilogue in torch ops, on an accumulator computed by ``torch.matmul`` (the unfused
    baseline, and what torch.compile compiles)."""
    import torch
    import torch.nn.functional as Fn

    if name == "pointwise":
        def fn(acc, C, alpha, beta, bias):
            return torch.relu(alpha * acc.float() + beta * C.float() + bias).to(torch.bfloat16)
    elif name == "aux":
        def fn(acc, bias, R):
            F = acc.float() + bias
            return (Fn.gelu(F) * R.float()).to(torch.bfloat16), F.to(torch.bfloat16)
    else:
        def fn(acc, bias):
            D = acc.float() + bias
            return D.to(torch.bfloat16), D.amax(dim=-1), D.sum(dim=-2)
    return fn


def problems(args) -> list[dict]:
    """The corpus's problems (``--split``), or ``--problems MxNxK[xL],...``."""
    if args.problems:
        out = []
        for s in args.problems.split(","):
            d = [int(x) for x in s.split("x")] + [1]
            M, N, K, L = d[:4]
            out.append({"id": s, "M": M, "N": N, "K": K, "L": L, "split": "adhoc"})
        return out
    from benchmarks import corpus

    ps = corpus.load(None if args.split == "all" else args.split)
    if not args.unaligned_k:  # one candidate (the sm80 kernel, JIT-compiled on first use): nothing to choose
        ps = [p for p in ps if p["K"] % 8 == 0]
    if args.max_gflop:
        ps = [p for p in ps if 2 * p["M"] * p["N"] * p["K"] * p["L"] <= args.max_gflop * 1e9]
    return ps


def aligned(p) -> tuple[bool, bool]:
    """(M x N rows, A/B rows) 16-byte aligned for packed bf16 tensors."""
    return p["N"] % 8 == 0, p["K"] % 8 == 0


#: the epilogue classes run (``--epilogues``: a comma list of EPILOGUES' names)
ONLY_EPILOGUES: tuple[str, ...] | None = None


def family_gemms() -> dict:
    return {n: evtc.Gemm(e, a=bf16, b=bf16, c=bf16, d=bf16) for n, e in EPILOGUES.items()
            if ONLY_EPILOGUES is None or n in ONLY_EPILOGUES}


def candidate_specs(g, p, sms):
    """The candidates of Gemm ``g`` on problem ``p`` (label -> KernelSpec)."""
    from evtc.dispatch import space
    from evtc.family.spec import EpilogueTraits, Problem

    amn, ak = aligned(p)
    fp = Problem(p["M"], p["N"], p["K"], p["L"], amn, ak, sms)
    out = {space.label(s): s for s in space.candidates(fp, EpilogueTraits.of(g.graph), g.graph, bf16, bf16,
                                                        members=space.MEMBERS_ON_TRIAL)}
    if ONLY_STREAMK:
        out = {k: s for k, s in out.items() if s.config.scheduler == "streamk"}
    if RECHECK is not None:  # the earlier run's two fastest and the model's choice
        keep = set(RECHECK.get((p["id"], g.name), ()))
        keep.add(space.label(g.choose(p["M"], p["N"], p["K"], p["L"], aligned_mn=amn, aligned_k=ak, sm_count=sms)))
        out = {k: s for k, s in out.items() if k in keep}
    return out


#: ``--recheck``: (problem id, epilogue) -> the labels of an earlier run's two fastest candidates
RECHECK: dict | None = None


#: time (and build) only the stream-K-scheduler members' variants (``--only-streamk``)
ONLY_STREAMK = False


_pinned: dict = {}


def pinned(g, spec):
    # the whole configuration, run-time fields too: a pinned Gemm runs its config's split-K,
    # decomposition and tile order (its kernel, shared by the variants, is built once)
    key = (g.name, json.dumps(spec.config.to_json(), sort_keys=True), spec.arch)
    if key not in _pinned:
        _pinned[key] = evtc.Gemm(g.pipeline.traced, a=bf16, b=bf16, c=bf16, d=bf16, arch=spec.arch, config=spec.config)
    return _pinned[key]


def cmd_build(args) -> None:
    from evtc.compiler import build_many

    fams = family_gemms()
    sms = 132
    jobs = {}
    for name, g in fams.items():
        for p in problems(args):
            for spec in candidate_specs(g, p, sms).values():
                k = g.kernel(spec)
                jobs.setdefault(k.source, k.job())
            for job in ([] if ONLY_STREAMK else route_jobs(g, p, sms)):
                jobs.setdefault(job.source, job)
    t0 = time.perf_counter()
    print(f"building {len(jobs)} kernels with {args.jobs} workers", flush=True)
    res = build_many(list(jobs.values()), workers=args.jobs)
    bad = [(j.name, r) for j, r in zip(jobs.values(), res) if isinstance(r, Exception)]
    for n, r in bad:
        print(f"FAILED {n}: {str(r)[:2000]}", flush=True)
    print(f"built {len(jobs) - len(bad)}/{len(jobs)} in {time.perf_counter() - t0:.0f} s", flush=True)


def built(g, spec) -> bool:
    """Whether the kernel of ``spec`` is in the cache (a timed call must never build one)."""
    from evtc.compiler import cache

    k = g.kernel(spec)
    return k.library is not None or cache.lookup(k.source, k.arch, name=k.job_name) is not None


def route_specs(g, p, sms) -> list:
    """The specs the family Gemm's own call of ``p`` runs (see :func:`route_jobs`)."""
    from evtc.dispatch import phase_split

    M, N, K, L = p["M"], p["N"], p["K"], p["L"]
    amn, ak = aligned(p)
    specs = [g.choose(M, N, K, L, aligned_mn=amn, aligned_k=ak, sm_count=sms)]
    if not amn and ak:
        base = g.choose(M, N, K, L, sm_count=sms)
        specs.append(base)
        if not base.config.swap_ab:
            specs.append(base.packed_variant())
        geom = phase_split.packed_geometry(g.dispatch, M, N, K) if L == 1 else None
        if geom is not None:
            specs += list(phase_split.members(g.dispatch, geom, K))
    return specs


def route_jobs(g, p, sms) -> list:
    """The kernels the family Gemm's own call of ``p`` runs besides its members: on packed rows
    that TMA can't address, the packed-store variant and the row-phase split's members
    (bench_shapes.prebuild_gemms), so that no timed call builds one."""
    return [g.kernel(s).job() for s in route_specs(g, p, sms)]


#: GPU time per candidate, ms (``--recheck`` takes 3x)
BUDGET_MS = 25.0


def _budget(p) -> tuple[int, int]:
    """(calls per replay, replays) that keep one candidate near BUDGET_MS of GPU time: a rough
    time estimate from FLOPs and bytes at H200 rates."""
    M, N, K, L = p["M"], p["N"], p["K"], p["L"]
    est_ms = max(2 * M * N * K * L / 6.5e14, 2 * (M * K + N * K + 3 * M * N) * L / 3.5e12) * 1e3 + 0.006
    calls = max(1, min(20, round(0.25 / est_ms)))
    iters = max(3, min(15 * round(BUDGET_MS / 25), round(BUDGET_MS / (est_ms * calls))))
    return calls, iters


def verify_kernels(fams, specs_by_fam, log) -> set:
    """Check each distinct (epilogue, kernel) on a small ragged problem against the float64
    reference; returns the labels that failed."""
    from evtc.testing import Problem, check

    bad = set()
    for name, g in fams.items():
        seen = set()
        for label, spec in specs_by_fam[name].items():
            base = label.split(":")[0]
            if base in seen:
                continue
            seen.add(base)
            if not built(g, spec):
                continue
            M = 200 if not spec.config.swap_ab else 24
            variants = [(spec, Problem(M, 392, 136, 1))]
            if spec.config.scheduler == "streamk":  # split-K, shallow and deep, over a long K
                variants += [(spec.with_runtime(split_k=s, decomposition="split_k"), Problem(M, 392, 4096, 1))
                             for s in (4, 32)]
            for v, p in variants:
                try:
                    res = check(pinned(g, v), p, seed=7)
                    failed = [k for k, r in res.items() if not r.ok]
                except Exception as e:  # noqa: BLE001 - recorded, the candidate is dropped
                    failed = [f"{type(e).__name__}: {str(e)[:300]}"]
                if failed:
                    bad.add((name, base))
                    log(f"VERIFY FAILED {name} {base} split_k={v.config.split_k}: {failed}")
                else:
                    log(f"verified {name} {base} split_k={v.config.split_k} on {p}")
    return bad


def cmd_time(args) -> None:
    import torch

    from evtc.testing.bench import time_graphs
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    shard, nshards = (int(x) for x in args.shard.split("/"))
    ps = problems(args)
    ps = [p for i, p in enumerate(ps) if i % nshards == shard]
    ps.sort(key=lambda p: p["id"])  # ids are hashes: a run cut by --budget-s times a random subset
    out_path = Path(args.out)
    done = {}
    if out_path.exists():
        prev = json.loads(out_path.read_text())
        done = {(r["id"], r["epilogue"]): r for r in prev.get("rows", [])}
    fams = family_gemms()
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    device = torch.cuda.get_device_name()
    t_start = time.perf_counter()
    logf = open(str(out_path) + ".log", "a")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    from evtc.family.spec import EpilogueTraits  # noqa: F401

    compiled = {} if ONLY_STREAMK else {n: torch.compile(torch_epilogue(n), dynamic=True) for n in EPILOGUES}
    eager = {n: torch_epilogue(n) for n in EPILOGUES}
    bad = set()
    if args.verify:
        probe = {"id": "verify", "M": 1024, "N": 4096, "K": 4096, "L": 1}
        bad = verify_kernels(fams, {n: candidate_specs(g, probe, sms) | candidate_specs(
            g, {"id": "v2", "M": 8, "N": 4096, "K": 4096, "L": 1}, sms) for n, g in fams.items()}, log)
    rows = list(done.values())

    def save():
        out_path.write_text(json.dumps({"device": device, "sm_count": sms, "rows": rows}, separators=(",", ":")))

    for p in ps:
        for name, g in fams.items():
            if (p["id"], name) in done:
                continue
            if args.budget_s and time.perf_counter() - t_start > args.budget_s:
                log(f"budget spent: stopping before {p['id']} {name}")
                save()
                return
            M, N, K, L = p["M"], p["N"], p["K"], p["L"]
            amn, ak = aligned(p)
            cands = {k: s for k, s in candidate_specs(g, p, sms).items()
                     if (name, k.split(":")[0]) not in bad and built(g, s)}
            if not ONLY_STREAMK and not all(built(g, j) for j in route_specs(g, p, sms)):
                log(f"SKIP {p['id']} {name}: the family call's kernels are not built")
                continue
            tp = Problem(M, N, K, L)
            try:
                ins = make_inputs(g.graph, bf16, bf16, tp, seed=(M * 31 + N * 7 + K) % 100003)
                outs = poisoned_outputs(g.graph, tp)
            except torch.cuda.OutOfMemoryError:
                log(f"OOM {p['id']} {name}")
                continue
            if not amn or not ak:  # packed tensors, as a user has them
                ins = {k: (v.contiguous() if hasattr(v, "dim") and v.dim() >= 2 else v) for k, v in ins.items()}
                outs = {k: v.contiguous() for k, v in outs.items()}
            A, B = ins["A"], ins["B"]
            kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
            Bt = B.transpose(-1, -2)
            plain = torch.empty(A.shape[:-1] + (N,), dtype=A.dtype, device=A.device)
            tkw = dict(kw)
            for k, v in kw.items():  # eager broadcasting: batched row vectors (L, N) -> (L, 1, N)
                if hasattr(v, "dim") and v.dim() == 2 and L > 1 and k == "bias":
                    tkw[k] = v.unsqueeze(-2)
            fns = {"cublas": lambda: torch.matmul(A, Bt, out=plain)}
            if not ONLY_STREAMK:
                fns.update({"eager": lambda: eager[name](torch.matmul(A, Bt), **tkw),
                            "compile": lambda: compiled[name](torch.matmul(A, Bt), **tkw),
                            "evtc": lambda: g(A, B, out=outs, **kw)})
            for label, spec in cands.items():
                gv = pinned(g, spec)
                fns[label] = (lambda gv=gv: gv(A, B, out=outs, **kw))
            calls, iters = _budget(p)
            t0 = time.perf_counter()
            try:
                t = time_graphs(fns, iters=iters, calls=calls)
            except Exception as e:  # noqa: BLE001 - recorded
                log(f"ERROR {p['id']} {name}: {type(e).__name__}: {str(e)[:300]}")
                torch.cuda.synchronize()
                continue
            spec = g.choose(M, N, K, L, aligned_mn=amn, aligned_k=ak, sm_count=sms)
            row = {"id": p["id"], "epilogue": name, "M": M, "N": N, "K": K, "L": L,
                   "ms": {k: (round(v, 6) if v == v else None) for k, v in t.items()},
                   "heuristic": space_label(spec)}
            rows.append(row)
            best = min((v, k) for k, v in t.items() if k not in ("cublas", "eager", "compile", "evtc") and v == v) \
                if any(v == v for k, v in t.items() if k not in ("cublas", "eager", "compile", "evtc")) else (math.nan, "-")
            rel = "  ".join(f"{k} {t[k] / t['cublas']:.3f}" for k in ("evtc", "eager", "compile") if k in t)
            log(f"{p['id']} {M}x{N}x{K}x{L} {name:9s} cublas {t['cublas'] * 1e3:8.1f} us  best {best[1]} "
                f"{best[0] / t['cublas']:.3f}  {rel}  ({len(cands)} cands, {time.perf_counter() - t0:.1f} s)")
            save()
            del ins, outs, A, B, kw, tkw, plain, fns
            torch.cuda.empty_cache()
    save()


def space_label(spec) -> str:
    from evtc.dispatch import space

    return space.label(spec)


def cmd_merge(args) -> None:
    rows, device, sms = {}, None, None
    for f in args.files:
        d = json.loads(Path(f).read_text())
        device, sms = d["device"], d["sm_count"]
        for r in d["rows"]:
            rows[(r["id"], r["epilogue"])] = r
    out = {"device": device, "sm_count": sms, "date": time.strftime("%Y-%m-%d"),
           "rows": sorted(rows.values(), key=lambda r: (r["id"], r["epilogue"]))}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, separators=(",", ":")))
    print(f"{len(rows)} rows from {device} -> {args.out}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    for n in ("build", "time"):
        s = sub.add_parser(n)
        s.add_argument("--split", default="all", choices=("all", "calibration", "validation"))
        s.add_argument("--problems", help="MxNxK[xL],... instead of the corpus")
        s.add_argument("--epilogues", help="a comma list of the classes to run (default: all three)")
        s.add_argument("--max-gflop", type=float, default=0, help="leave out problems above this many GFLOP")
        s.add_argument("--recheck", help="an earlier run's JSON: time only its two fastest candidates and the "
                                         "model's choice, with 3x the samples (the selection model's validation)")
        s.add_argument("--only-streamk", action="store_true",
                       help="only the stream-K-scheduler members' run-time variants (and cuBLAS, to scale by)")
        s.add_argument("--unaligned-k", action="store_true",
                       help="also the problems whose K is not a multiple of 8 (left out by default)")
    sub.choices["build"].add_argument("-j", "--jobs", type=int, default=os.cpu_count() or 1)
    t = sub.choices["time"]
    t.add_argument("--shard", default="0/1")
    t.add_argument("--out", required=True)
    t.add_argument("--budget-s", type=float, default=0, help="stop (after saving) once this many seconds passed")
    t.add_argument("--verify", action="store_true", help="check every candidate kernel against float64 first")
    m = sub.add_parser("merge")
    m.add_argument("files", nargs="+")
    m.add_argument("--out", required=True)
    args = ap.parse_args()
    global ONLY_STREAMK, RECHECK, BUDGET_MS, ONLY_EPILOGUES
    ONLY_STREAMK = getattr(args, "only_streamk", False)
    if getattr(args, "epilogues", None):
        ONLY_EPILOGUES = tuple(args.epilogues.split(","))
        if unknown := set(ONLY_EPILOGUES) - set(EPILOGUES):
            ap.error(f"--epilogues: unknown {sorted(unknown)} (known: {', '.join(EPILOGUES)})")
    if getattr(args, "recheck", None):
        RECHECK = {}
        for r in json.loads(Path(args.recheck).read_text())["rows"]:
            c = sorted((v, k) for k, v in r["ms"].items() if k not in ("cublas", "eager", "compile", "evtc") and v)
            RECHECK[(r["id"], r["epilogue"])] = [k for _, k in c[:2]]
        BUDGET_MS = 75.0
    {"build": cmd_build, "time": cmd_time, "merge": cmd_merge}[args.cmd](args)


if __name__ == "__main__":
    main()
