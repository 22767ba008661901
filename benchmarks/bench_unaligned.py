"""Issue 11: a caller's packed M x N tensors (odd N) against the aligned neighbour, by route.

For each epilogue and problem M x N x K with N not a multiple of 8 (bf16), the same call is timed
with the caller's packed C/aux inputs and packed ``out=`` tensors on each route, and the aligned
neighbour (N rounded up to 8, padded tensors) beside them, in one run (``time_interleaved``: back
to back, host launch work overlapped; ``time_graphs``: the kernels alone):

* ``auto``: what a call gets by default;
* ``staged``: ``EVTC_PHASE_SPLIT=never``, the padded staging route and the packed stores
  (NOTE [Padded staging for unaligned rows], evtc/dispatch/staging.py);
* ``split``, ``split_bi``, ``split_own``: ``EVTC_PHASE_SPLIT=always``, the row-phase split
  (NOTE [Row-phase split], evtc/dispatch/phase_split.py) with its default tile order for the
  main call, the batch-inner order, CUTLASS's own order (NOTE [Batch-inner tile order]);
* ``split_serial``: the split with its fringe call before the main call on one stream instead
  of beside its tail (NOTE [The fringe in the main call's tail]);
* ``fringe``: the split's fringe call alone, on stand-in data of its shape;
* ``own``: a plain call without ``out=``, the outputs evtc allocates (packed after the packed
  inputs: NOTE [The row layout of the outputs evtc allocates], evtc/gemm.py), default routes.

Every ratio is time / the aligned neighbour's. The outputs of ``split`` and ``staged`` are
compared (max |difference|, NaN): a speed number of a wrong result is worthless.

    python benchmarks/bench_unaligned.py --json out.json
    python benchmarks/bench_unaligned.py --only bias_relu --problems 4096x50257x4096
"""

from __future__ import annotations

import argparse
import os

import common

import evtc
from evtc import bf16

import bench_shapes as S

PROBLEMS = ["4096x50257x4096", "2048x32001x4096", "1024x50257x4096"]
ROUTES = ["auto", "staged", "split", "split_serial", "split_bi", "split_own", "fringe", "own"]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--only", help="comma-separated epilogues (bench_shapes.py's)", default="bias_relu,aux_heavy")
    ap.add_argument("--problems", help="comma-separated MxNxK", default=",".join(PROBLEMS))
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    from evtc.testing.bench import time_graphs, time_interleaved
    from evtc.compiler import build_many
    from evtc.dispatch import phase_split as ps
    from evtc.dispatch.staging import SPLIT_ENV
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    names = args.only.split(",")
    probs = [tuple(map(int, p.split("x"))) for p in args.problems.split(",")]
    gemms = {n: evtc.Gemm(S.epilogue(n), a=bf16, b=bf16, c=bf16, d=bf16) for n in names}
    jobs = {}
    for g in gemms.values():
        for M, N, K in probs:
            specs = [g.choose(M, (N + 7) // 8 * 8, K), g.choose(M, N, K)]
            if not specs[1].config.swap_ab:
                specs.append(specs[1].packed_variant())
            geom = ps.find_geometry(M, N, [(0, N, 2)], align_bytes=[2])
            for order in (None, True, False):
                ps.BATCH_INNER = order
                specs += list(ps.members(g, geom, K)) if geom is not None else []
            ps.BATCH_INNER = None
            for s in specs:
                j = g.kernel(s).job()
                jobs[j.source] = j
    res = build_many(list(jobs.values()), workers=int(os.environ.get("EVTC_BUILD_JOBS", 16)))
    for r in res:
        if isinstance(r, Exception):
            raise r
    common.fast_path()

    def route(env: str | None, order: bool | None, overlap: bool = True):
        if env is None:
            os.environ.pop(SPLIT_ENV, None)
        else:
            os.environ[SPLIT_ENV] = env
        ps.BATCH_INNER = order
        ps.OVERLAP_FRINGE = overlap

    rows = []
    for name, g in gemms.items():
        for M, N, K in probs:
            Na = (N + 7) // 8 * 8
            ins_a = make_inputs(g.graph, g.a, g.b, Problem(M, Na, K), seed=1)
            outs_a = poisoned_outputs(g.graph, Problem(M, Na, K))
            kw_a = {k: v for k, v in ins_a.items() if k not in ("A", "B")}
            ins = make_inputs(g.graph, g.a, g.b, Problem(M, N, K), seed=2)
            ins = {k: (v.contiguous() if hasattr(v, "dim") and v.dim() >= 2 else v) for k, v in ins.items()}
            kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
            A, B = ins["A"], ins["B"]
            outs = {r: {k: v.contiguous() for k, v in poisoned_outputs(g.graph, Problem(M, N, K)).items()}
                    for r in ROUTES if r not in ("fringe", "own")}
            settings = {"auto": (None, None, True), "staged": ("never", None, True), "split": ("always", None, True),
                        "split_serial": ("always", None, False), "split_bi": ("always", True, True),
                        "split_own": ("always", False, True)}

            def call(r):
                env, order, overlap = settings[r]

                def f():
                    route(env, order, overlap)
                    return g(A, B, out=outs[r], **kw)
                return f

            fns = {"aligned": lambda: g(ins_a["A"], ins_a["B"], out=outs_a, **kw_a)}
            fns.update({r: call(r) for r in settings})

            def own():
                route(None, None)
                return g(A, B, **kw)

            fns["own"] = own
            geom = ps.find_geometry(M, N, [(outs["split"]["D"].data_ptr(), N, 2)], align_bytes=[2])
            if geom is not None:  # the fringe call alone, on stand-ins of its operands
                G, Mb, Fn, step = geom.groups, geom.rows, geom.fringe_n, geom.step
                ld = ps.row_stride_for(geom, geom.width, 2)
                mn = lambda: torch.randn(M, ld, device="cuda").to(A.dtype).as_strided(  # noqa: E731
                    (G, Mb, Fn), (ld + step, G * ld, 1))
                A3 = A.as_strided((G, Mb, K), (K, G * K, 1))
                Bf = torch.randn(geom.width, K, device="cuda").to(A.dtype).as_strided((G, Fn, K), (step * K, K, 1))
                kwf = {k: (mn() if hasattr(v, "dim") and v.dim() == 2 else
                           v[:geom.width].as_strided((G, Fn), (step, 1)) if hasattr(v, "dim") and v.numel() == N else v)
                       for k, v in kw.items()}
                outf = {k: mn() for k in outs["split"]}
                fringe = ps.launchers(g, geom, K)[1]
                fns["fringe"] = lambda: fringe(A3, Bf, kwf, outf, None)
            for f in fns.values():
                f()
            torch.cuda.synchronize()
            diff = {k: (outs["split"][k].float() - outs["staged"][k].float()).abs().max().item() for k in outs["split"]}
            mine = own()
            mine = mine if isinstance(mine, dict) else {g.graph.outputs[0].name: mine}
            torch.cuda.synchronize()
            diff_own = {k: (outs["split"][k].float() - mine[k].float()).abs().max().item() for k in outs["split"]}
            own_strides = {k: tuple(v.stride()) for k, v in mine.items()}
            del mine
            nan = {r: any(torch.isnan(v).any().item() for v in o.values()) for r, o in outs.items()}
            t = time_interleaved(fns, args.iters, warmup_ms=200)
            tg = time_graphs(fns, max(5, args.iters // 2))
            route(None, None)
            row = {"epilogue": name, "problem": f"{M}x{N}x{K}", "aligned_ms": t["aligned"],
                   "split_member": ps.members(g, geom, K)[0].name if geom is not None else None,
                   "max_diff_split_vs_staged": diff, "max_diff_split_vs_own": diff_own,
                   "own_strides": own_strides, "nan": nan}
            for r in fns:
                if r != "aligned":
                    row[r] = t[r] / t["aligned"]
                    row["graph_" + r] = tg[r] / tg["aligned"]
            rows.append(row)
            print(f"{name} {M}x{N}x{K} (aligned {t['aligned']:.3f} ms; split on {row['split_member']}; "
                  f"max |split - staged| {max(diff.values()):.3g}, |split - own| {max(diff_own.values()):.3g}, "
                  f"own's strides {own_strides}, NaN {any(nan.values())})")
            print("   " + "  ".join(f"{r} {row[r]:.3f}/{row['graph_' + r]:.3f}" for r in fns if r != "aligned"))
    print("(time / aligned neighbour: back-to-back / CUDA graphs)")
    common.write_json(args.json, {"device": common.device_name(), "rows": rows})


if __name__ == "__main__":
    main()
