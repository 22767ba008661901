"""Issue 11: a caller's packed ``out=`` at an unaligned N against the aligned neighbour.

For each epilogue of bench_shapes.py (bias_relu, rowmax, aux_heavy) at M x N x K with N not a
multiple of 8 (default 4096 x 50257 x 4096) and at its aligned neighbour N' (50264), in one
interleaved group (CUDA events, back to back; then the same in CUDA graphs):

* ``aligned``: the aligned problem, outputs given (``out=``), 16-byte aligned rows;
* ``packed_stores``: the unaligned problem with the caller's packed inputs and packed ``out=``
  tensors (rows of N elements), ``EVTC_PACKED_STORES=always``: misaligned inputs staged, the
  outputs written in place by the packed-store variant (NOTE [Stores into packed rows],
  evtc/plan/sm90.py);
* ``copy_back``: the same call with ``EVTC_PACKED_STORES=never``: outputs computed padded and
  copied into the caller's tensors (the route before the packed stores);

The default (``auto``) takes ``packed_stores`` for epilogues with one M x N output and
``copy_back`` for more.
* ``evtc_alloc``: the unaligned problem, outputs allocated by evtc (padded rows, strided views);
* ``cublas``: ``torch.matmul`` at the aligned N.

Prints time / aligned time per route (issue 11's target: <= 1.15), checks the packed outputs
against the float64 reference (NaN-poisoned first), and writes JSON (``--json``).
"""

import argparse
import os

import common  # noqa: F401  (sets sys.path)

import evtc
from evtc import bf16


def prebuild_jobs(gemms, M: int, N: int, K: int) -> list:
    """Build jobs of the kernels the calls take: for each family Gemm, the member of the aligned
    problem and its packed-store variant, as the calls name them (so no timed call builds one)."""
    Na = (N + 7) // 8 * 8
    jobs = {}
    for g in gemms:
        for spec in {g.choose(M, Na, K), g.choose(M, N, K, aligned_mn=True)}:
            for s in (spec, spec.packed_variant()):
                j = g.kernel(s).job()
                jobs[j.source] = j
    return list(jobs.values())


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--problem", default="4096x50257x4096", help="M x N x K, N not a multiple of 8")
    ap.add_argument("--only", help="comma-separated epilogues of bench_shapes.py")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--no-check", action="store_true", help="skip the float64 check of the packed outputs")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    import bench_shapes as S
    from evtc.testing.bench import time_graphs, time_interleaved
    from evtc.compiler import build_many
    from evtc.dispatch.staging import PACKED_ENV
    from evtc.testing import Problem, check_outputs, failure_report, make_inputs, poisoned_outputs

    M, N, K = map(int, args.problem.split("x"))
    Na = (N + 7) // 8 * 8
    if Na == N:
        raise SystemExit(f"N = {N} is a multiple of 8: nothing unaligned to measure")
    names = args.only.split(",") if args.only else S.EPILOGUES
    gemms = {n: evtc.Gemm(S.epilogue(n), a=bf16, b=bf16, c=bf16, d=bf16) for n in names}
    common.fast_path()
    res = build_many(prebuild_jobs(gemms.values(), M, N, K),
                     workers=int(os.environ.get("EVTC_BUILD_JOBS", os.cpu_count() or 1)))
    for r in res:
        if isinstance(r, Exception):
            raise SystemExit(f"build failed: {r}")
    rows = []
    for name, g in gemms.items():
        ins_a = make_inputs(g.graph, g.a, g.b, Problem(M, Na, K), seed=1)
        outs_a = poisoned_outputs(g.graph, Problem(M, Na, K))
        ins = make_inputs(g.graph, g.a, g.b, Problem(M, N, K), seed=2)
        ins = {k: (v.contiguous() if hasattr(v, "dim") and v.dim() >= 2 else v) for k, v in ins.items()}
        outs = {k: v.contiguous() for k, v in poisoned_outputs(g.graph, Problem(M, N, K)).items()}
        outs_cb = {k: v.clone() for k, v in outs.items()}
        kw_a = {k: v for k, v in ins_a.items() if k not in ("A", "B")}
        kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
        A, B = ins["A"], ins["B"]
        Bt = ins_a["B"].transpose(-1, -2)
        plain = torch.empty((M, Na), dtype=A.dtype, device=A.device)

        def packed_stores():
            os.environ[PACKED_ENV] = "always"
            return g(A, B, out=outs, **kw)

        def copy_back():
            os.environ[PACKED_ENV] = "never"
            return g(A, B, out=outs_cb, **kw)

        fns = {
            "aligned": lambda: g(ins_a["A"], ins_a["B"], out=outs_a, **kw_a),
            "packed_stores": packed_stores, "copy_back": copy_back,
            "evtc_alloc": lambda: g(A, B, **kw),
            "cublas": lambda: torch.matmul(ins_a["A"], Bt, out=plain),
        }
        before = sum(x.packed_calls for x in g.dispatch.family.launchers.values() if hasattr(x, "packed_calls"))
        packed_stores()
        torch.cuda.synchronize()
        took = sum(x.packed_calls for x in g.dispatch.family.launchers.values() if hasattr(x, "packed_calls")) > before
        row = {"epilogue": name, "problem": f"{M}x{N}x{K}", "aligned_problem": f"{M}x{Na}x{K}",
               "packed_stores_taken": took}
        if not args.no_check:
            res = check_outputs(g, ins, outs)
            row["check"] = all(r.ok for r in res.values())
            if not row["check"]:
                print(failure_report(res, f"{name} packed out=:", g.graph))
        t = time_interleaved(fns, args.iters, warmup_ms=200)
        tg = time_graphs(fns, args.iters)
        os.environ.pop(PACKED_ENV, None)
        for k in fns:
            row[f"{k}_ms"] = t[k]
            row[f"graph_{k}_ms"] = tg[k]
            row[f"{k}_over_aligned"] = t[k] / t["aligned"]
            row[f"graph_{k}_over_aligned"] = tg[k] / tg["aligned"]
        rows.append(row)
        print(f"{name:9s} packed stores {'taken' if took else 'NOT taken'}, check {row.get('check')}: " +
              "  ".join(f"{k} {t[k]:.3f} ms ({t[k] / t['aligned']:.3f}; graph {tg[k] / tg['aligned']:.3f})"
                        for k in fns), flush=True)
    print(f"\npacked out= on {common.device_name()} (time / aligned time at N = {Na})")
    print(common.table(rows, ["epilogue", "packed_stores_over_aligned", "graph_packed_stores_over_aligned",
                              "copy_back_over_aligned", "evtc_alloc_over_aligned", "cublas_over_aligned",
                              "aligned_ms", "packed_stores_ms"]))
    common.write_json(args.json, {"device": common.device_name(), "rows": rows})


if __name__ == "__main__":
    main()
