"""Issue 11's benchmark: a fused epilogue at every shape, against cuBLAS, eager PyTorch and
torch.compile, in one run.

On the GPU machine:  python benchmarks/bench_shapes.py --json $OUT/shapes.json

Three epilogues (bf16): ``bias_relu`` = relu(alpha*acc + beta*C + bias[n]), ``rowmax`` = a row
reduction (D = acc + bias[n] and the row max of D), ``aux_heavy`` = an aux store and two aux
loads (F = acc*R1 + bias[n] saved, D = gelu(F) + R2); over the problem set below (decode,
prefill, K-heavy, few-tile, vocabulary-sized N aligned and not, batched). Per problem: evtc (a
family Gemm: the member its heuristic picks, or the tuned one with --tuned), cuBLAS's plain GEMM
``torch.matmul`` (the floor), the epilogue run eagerly after it (unfused), and torch.compile
(default mode) of the same function; device time per call (median of back-to-back samples, CUDA
events, evtc.testing.bench.time_interleaved); ratios to cuBLAS, geometric means per epilogue and per
group; the member each problem ran on. Packed (contiguous) tensors for the unaligned-N problems,
as a user has them (``--evtc-outputs``: evtc allocates their outputs, packed after the packed
inputs: NOTE [The row layout of the outputs evtc allocates] in evtc/gemm.py); ``--staging``
selects the padded staging route for them (evtc/dispatch/staging.py).
"""

from __future__ import annotations

import argparse
import math
import time

import common  # noqa: F401  (sets sys.path)

import evtc
from evtc import bf16, f32
from evtc.dispatch import phase_split


@evtc.epilogue
def rowmax(acc, bias: evtc.RowVector[f32]):
    D = acc + bias
    return {"D": D, "row_max": evtc.max(D, dim=1)}


@evtc.epilogue
def aux_heavy(acc, bias: evtc.RowVector[f32], R1: evtc.Matrix, R2: evtc.Matrix):
    F = acc * R1 + bias
    return {"D": evtc.gelu(F) + R2, "F": F}


# (group, M, N, K, L)
PROBLEMS = [
    ("decode", 1, 4096, 4096, 1), ("decode", 16, 4096, 4096, 1), ("decode", 32, 28672, 4096, 1),
    ("decode", 64, 8192, 8192, 1), ("decode", 128, 14336, 4096, 1), ("decode", 256, 4096, 14336, 1),
    ("prefill", 8192, 4096, 14336, 1), ("prefill", 4096, 14336, 4096, 1), ("prefill", 512, 4096, 4096, 1),
    ("prefill", 8192, 8192, 8192, 1), ("prefill", 16384, 4096, 1024, 1), ("prefill", 4096, 4096, 4096, 1),
    ("k_heavy", 1024, 1024, 16384, 1), ("k_heavy", 512, 512, 32768, 1), ("k_heavy", 2048, 2048, 8192, 1),
    ("few_tile", 1000, 1000, 1000, 1), ("few_tile", 768, 768, 3072, 1),
    ("vocab", 4096, 50264, 4096, 1), ("vocab", 4096, 50257, 4096, 1), ("vocab", 2048, 32001, 4096, 1),
    ("batched", 2048, 2048, 2048, 4), ("batched", 512, 1024, 4096, 8),
]
EPILOGUES = ["bias_relu", "rowmax", "aux_heavy"]


def epilogue(name):
    import epilogues as E

    return {"bias_relu": E.bias_relu, "rowmax": rowmax, "aux_heavy": aux_heavy}[name]


def gemms() -> dict:
    """The family Gemm of each epilogue (its members and the unaligned variant are prebuilt)."""
    return {n: evtc.Gemm(epilogue(n), a=bf16, b=bf16, c=bf16, d=bf16) for n in EPILOGUES}


def prebuild_gemms() -> list:
    """Every kernel the benchmark runs: each family, its unaligned members (pinned Gemms, as
    explore_members.py pins them) and the build jobs of the packed-store variants the packed
    problems' caller outputs take, named as the staging route names them (so that no timed call
    builds one)."""
    out = []
    for g in gemms().values():
        out.append(g)
        for member in ("unaligned", "unaligned_pingpong"):
            k = g.kernel(member)
            out.append(evtc.Gemm(g.pipeline.traced, a=bf16, b=bf16, c=bf16, d=bf16, config=k.spec.config))
        for _, M, N, K, L in PROBLEMS:
            spec = g.choose(M, N, K, L)
            if N % 8 and not spec.config.swap_ab:
                out.append(g.kernel(spec.packed_variant()).job())
            geom = phase_split.packed_geometry(g, M, N, K) if N % 8 and L == 1 else None
            if geom is not None:  # the row-phase split's two batched calls (evtc/dispatch/phase_split.py)
                out += [g.kernel(s).job() for s in phase_split.members(g, geom, K)]
    return out


def mode_name():
    from evtc.dispatch.staging import mode

    return mode()


def geomean(xs):
    xs = [x for x in xs if x == x and x > 0]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--only", help="comma-separated epilogues")
    ap.add_argument("--groups", help="comma-separated problem groups")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile")
    ap.add_argument("--tune", action="store_true", help="tune each problem first (stores the winners)")
    ap.add_argument("--json")
    ap.add_argument("--staging", choices=("auto", "always", "never"),
                    help="the padded staging route for the unaligned-N problems (default: EVTC_UNALIGNED_STAGING, "
                         "else auto; evtc/dispatch/staging.py)")
    ap.add_argument("--evtc-outputs", action="store_true",
                    help="unaligned-N problems: let evtc allocate the outputs (packed after packed inputs) "
                         "instead of passing packed out= tensors")
    args = ap.parse_args()
    import torch

    from evtc.testing.bench import time_graphs, time_interleaved
    from evtc.ir.nodes import ColBroadcast, RowBroadcast
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    names = args.only.split(",") if args.only else EPILOGUES
    groups = set(args.groups.split(",")) if args.groups else None
    table = gemms()
    if args.staging:
        for g in table.values():
            g.set_unaligned_staging(args.staging)
    common.build_all(prebuild_gemms(), "shapes")
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for name in names:
        g = table[name]
        fn = epilogue(name).fn
        compiled = None if args.no_compile else torch.compile(fn)
        for group, M, N, K, L in PROBLEMS:
            if groups and group not in groups:
                continue
            p = Problem(M, N, K, L)
            packed = N % 8 != 0
            ins = make_inputs(g.graph, g.a, g.b, p, seed=M + N + K)
            outs = poisoned_outputs(g.graph, p)
            if packed:  # a user's packed tensors: rows of N elements, not 16-byte aligned
                ins = {k: (v.contiguous() if hasattr(v, "dim") and v.dim() >= 2 else v) for k, v in ins.items()}
                outs = {k: v.contiguous() for k, v in outs.items()}
            A, B = ins["A"], ins["B"]
            kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
            tuned = g.tune([(M, N, K, L)], iters=10) if args.tune and not packed else []
            aligned_mn = not packed
            spec = g.choose(M, N, K, L, aligned_mn=aligned_mn, sm_count=sms, device=torch.cuda.get_device_name())
            Bt = B.transpose(-1, -2)
            plain = torch.empty(A.shape[:-1] + (N,), dtype=A.dtype, device=A.device)
            cols = {n.name for n in g.graph.inputs if isinstance(n, ColBroadcast)}
            rows_ = {n.name for n in g.graph.inputs if isinstance(n, RowBroadcast)}
            # eager broadcasting: column vectors (.., M) -> (.., M, 1), batched rows (L, N) -> (L, 1, N)
            call = {k: (v.unsqueeze(-1) if k in cols else v.unsqueeze(-2) if k in rows_ and v.dim() == 2 else v)
                    for k, v in kw.items()}

            if packed and args.evtc_outputs:
                def fused():
                    return g(A, B, **kw)
            else:
                def fused():
                    return g(A, B, out=outs, **kw)

            def cublas():
                return torch.matmul(A, Bt, out=plain)

            def eager():
                return fn(acc=torch.matmul(A, Bt), **call)

            fns = {"evtc": fused, "cublas": cublas}
            t0 = time.perf_counter()
            fused()
            torch.cuda.synchronize()
            first_s = time.perf_counter() - t0
            t = time_interleaved(fns, args.iters, warmup_ms=100)
            te = time_interleaved({"eager": eager, "cublas": cublas}, args.iters, warmup_ms=50)
            tg = time_graphs({"evtc": fused, "cublas": cublas, "eager": eager}, args.iters)
            route = ""
            if spec.config.unaligned:
                # the padded staging route (evtc/dispatch/staging.py): an aligned member on padded copies
                from evtc.dispatch.staging import mode

                if mode(g.unaligned_staging) != "never":
                    # a plain call passes the outputs evtc allocates as out= tensors (evtc/gemm.py)
                    given = g.dispatch.packed_outputs(A, B, kw, None) if packed and args.evtc_outputs else outs
                    d = g.dispatch._staged_launcher(spec).plan(A, B, kw, given)
                    if d.stage:
                        route = "+staged"
                        spec = g.choose(M, N, K, L, aligned_mn=True, sm_count=sms,
                                        device=torch.cuda.get_device_name())
                        if d.packed is not None:  # the caller's outputs written in place (NOTE [Stores into packed rows])
                            route, spec = "+staged+packed" if d.inputs else "+packed", d.packed
                        if d.split is not None:  # NOTE [Row-phase split]: the main call's member
                            route, spec = "+split", phase_split.members(g, d.split, K)[0]
            row = {"epilogue": name, "group": group, "shape": f"{M}x{N}x{K}" + (f"x{L}" if L > 1 else ""),
                   "member": spec.name + route, "staging": args.staging or mode_name(),
                   "evtc_outputs": bool(packed and args.evtc_outputs), "config": spec.config.schedule_name,
                   "evtc_ms": t["evtc"], "cublas_ms": t["cublas"], "eager_ms": te["eager"],
                   "evtc_over_cublas": t["evtc"] / t["cublas"], "eager_over_cublas": te["eager"] / te["cublas"],
                   "graph_evtc_ms": tg["evtc"], "graph_cublas_ms": tg["cublas"], "graph_eager_ms": tg["eager"],
                   "graph_evtc_over_cublas": tg["evtc"] / tg["cublas"],
                   "graph_eager_over_cublas": tg["eager"] / tg["cublas"],
                   "first_call_s": first_s}
            if tuned:
                row["tuned"] = {k: tuned[0][k] for k in ("member", "runtime", "times_ms", "heuristic")}
            if compiled is not None:
                def comp():
                    return compiled(acc=torch.matmul(A, Bt), **call)

                try:
                    comp()
                    tc = time_interleaved({"compile": comp, "cublas": cublas}, args.iters, warmup_ms=50)
                    row["compile_ms"] = tc["compile"]
                    row["compile_over_cublas"] = tc["compile"] / tc["cublas"]
                except Exception as e:  # noqa: BLE001 - torch.compile may fail on a shape: record it
                    row["compile_error"] = f"{type(e).__name__}: {e}"[:200]
            row["evtc_vs_best_other"] = t["evtc"] / t["cublas"] / min(
                x for x in (row["eager_over_cublas"], row.get("compile_over_cublas", float("inf"))) if x == x)
            rows.append(row)
            if args.json:  # so far, in case a later problem fails
                import json
                from pathlib import Path

                Path(args.json).write_text(json.dumps({"device": common.device_name(), "rows": rows, "partial": True}))
            print(f"{name:9s} {row['shape']:>18s} {row['member']:16s} evtc/cuBLAS {row['evtc_over_cublas']:.3f} "
                  f"(graph {row['graph_evtc_over_cublas']:.3f})  eager {row['eager_over_cublas']:.3f} "
                  f"(graph {row['graph_eager_over_cublas']:.3f})  compile {row.get('compile_over_cublas', float('nan')):.3f}",
                  flush=True)
        del compiled
        torch._dynamo.reset()
    summary = {}
    for name in names:
        rs = [r for r in rows if r["epilogue"] == name]
        summary[name] = {"geomean_evtc_over_cublas": geomean([r["evtc_over_cublas"] for r in rs]),
                         "geomean_eager_over_cublas": geomean([r["eager_over_cublas"] for r in rs]),
                         "geomean_compile_over_cublas": geomean([r.get("compile_over_cublas", float("nan")) for r in rs]),
                         "graph_geomean_evtc_over_cublas": geomean([r["graph_evtc_over_cublas"] for r in rs]),
                         "slower_than_eager_or_compile": [r["shape"] for r in rs if r["evtc_vs_best_other"] > 1.0]}
        for grp in sorted({r["group"] for r in rs}):
            summary[name][f"geomean_{grp}"] = geomean([r["evtc_over_cublas"] for r in rs if r["group"] == grp])
    print(f"\nshapes on {common.device_name()}")
    print(common.table(rows, ["epilogue", "shape", "member", "evtc_over_cublas", "graph_evtc_over_cublas",
                              "eager_over_cublas", "compile_over_cublas", "evtc_ms", "cublas_ms"]))
    for name, s in summary.items():
        print(name, {k: (round(v, 3) if isinstance(v, float) else v) for k, v in s.items()})
    common.write_json(args.json, {"device": common.device_name(), "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
