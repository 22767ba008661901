"""Issue 4's benchmark: evtc's shared-memory plans against stock CUTLASS's additive rule.

On the GPU machine:  python benchmarks/bench_planner.py --json $OUT/planner.json

For many_aux, residual_scale and gelu_aux (bf16) at (8192,8192,4096), (16384,4096,1024) and
(4096,4096,4096): epilogue shared memory, mainloop stages and median time of
  * the ``cutlass`` plan (stock rule) at each tile shape it can build,
  * the ``evtc`` plan (the cost model's choice) at the same tile shapes,
  * a few fixed evtc variants (aliasing, stage counts, slots), to calibrate the cost model,
all timed in alternation with cuBLAS's plain GEMM (the floor) in one run. Prints, per epilogue and
shape, the comparison at the same tile and at the best tile each policy can build, with ratios.
"""

from __future__ import annotations

import argparse

import common  # noqa: F401

import evtc
from evtc import bf16

SHAPES = [(8192, 8192, 4096), (16384, 4096, 1024), (4096, 4096, 4096)]
TILES = [
    dict(tile=(128, 256, 64), cluster=(2, 1, 1), schedule="cooperative"),
    dict(tile=(256, 128, 64), cluster=(2, 1, 1), schedule="cooperative"),
    dict(tile=(128, 128, 64), cluster=(2, 1, 1), schedule="cooperative"),
]
VARIANTS = {
    # the smaller aliasing plan, and the row broadcast in shared memory (stock's Sm90RowBroadcast)
    "many_aux": [{"share": True, "stages_c": 2}, {"share": True, "direct": []}],
    "residual_scale": [{"c_slot": "R1", "reuse": True, "stages_c": 2}, {"stages_c": 2}],
    "gelu_aux": [{"stages_d": 1}, {"epilogue_tile": (128, 64)}],
}


def label(policy, fixed) -> str:
    if not fixed:
        return policy
    return "evtc[" + ",".join(f"{k}={v}" for k, v in fixed.items()) + "]"


def gemms_for(name):
    import epilogues as E

    ep = E.REFERENCE[name]
    out = []
    for t in TILES:
        cfg = evtc.GemmConfig(**t)
        for policy, fixed in [("cutlass", {}), ("evtc", {})] + [("evtc", v) for v in VARIANTS[name]]:
            try:
                g = evtc.Gemm(ep, a=bf16, b=bf16, d=bf16, config=cfg, plan={"policy": policy, **fixed})
            except evtc.EvtcError as e:
                print(f"{name} {cfg.name} {label(policy, fixed)}: no plan ({str(e).splitlines()[0]})")
                continue
            out.append((label(policy, fixed), g))
    return out


def all_gemms(only=None):
    return [g for n in ([only] if only else VARIANTS) for _, g in gemms_for(n)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json")
    ap.add_argument("--only")
    args = ap.parse_args()
    import torch

    from evtc.testing.bench import time_interleaved
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    names = [args.only] if args.only else list(VARIANTS)
    table = {n: gemms_for(n) for n in names}
    uniq = {g.source: g for n in names for _, g in table[n]}
    common.build_all(list(uniq.values()), "planner")
    rows, summary = [], []
    for name in names:
        entries = [(lab, g) for lab, g in table[name] if g.source in uniq]
        for (M, N, K) in SHAPES:
            g0 = entries[0][1]
            ins = make_inputs(g0.graph, bf16, bf16, Problem(M, N, K), seed=11)
            outs = poisoned_outputs(g0.graph, Problem(M, N, K))
            A, B = ins["A"], ins["B"]
            kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
            plain = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
            Bt = B.t()
            fns = {"cublas": lambda: torch.matmul(A, Bt, out=plain)}
            for i, (lab, g) in enumerate(entries):
                g.build()
                fns[f"{i}"] = (lambda g=g: g(A, B, out=outs, **kw))
            t = time_interleaved(fns, args.iters)
            shape_rows = []
            for i, (lab, g) in enumerate(entries):
                r = {"epilogue": name, "shape": f"{M}x{N}x{K}", "tile": "x".join(map(str, g.config.tile)), "plan": lab,
                     "epi_tile": "x".join(map(str, g.plan.epilogue_tile)), "epi_bytes": g.plan.epilogue_smem_bytes,
                     "ml_stages": g.plan.mainloop_stages, "ms": t[str(i)], "over_cublas": t[str(i)] / t["cublas"],
                     "model_us": g.plan.cost.get("total_us"), "sc": g.plan.stages_c, "sd": g.plan.stages_d,
                     "share": len(g.plan.shares), "c_slot": g.plan.c_slot}
                shape_rows.append(r)
            rows += shape_rows
            default_tile = "x".join(map(str, TILES[0]["tile"]))
            same = {r["plan"]: r for r in shape_rows if r["tile"] == default_tile}
            best = {}
            for r in shape_rows:
                if r["plan"] in ("cutlass", "evtc") and (r["plan"] not in best or r["ms"] < best[r["plan"]]["ms"]):
                    best[r["plan"]] = r
            s = {"epilogue": name, "shape": f"{M}x{N}x{K}", "cublas_ms": t["cublas"]}
            if "cutlass" in same and "evtc" in same:
                s.update(same_tile=default_tile, cutlass_ms=same["cutlass"]["ms"], evtc_ms=same["evtc"]["ms"],
                         speedup_same_tile=same["cutlass"]["ms"] / same["evtc"]["ms"],
                         bytes_cutlass=same["cutlass"]["epi_bytes"], bytes_evtc=same["evtc"]["epi_bytes"])
            if "cutlass" in best and "evtc" in best:
                s.update(best_cutlass=f"{best['cutlass']['tile']} {best['cutlass']['ms']:.3f} ms "
                                      f"({best['cutlass']['epi_bytes']} B, {best['cutlass']['ml_stages']} st)",
                         best_evtc=f"{best['evtc']['tile']} {best['evtc']['ms']:.3f} ms "
                                   f"({best['evtc']['epi_bytes']} B, {best['evtc']['ml_stages']} st)",
                         speedup_best=best["cutlass"]["ms"] / best["evtc"]["ms"])
            fastest = min(shape_rows, key=lambda r: r["ms"])
            s["fastest"] = f"{fastest['plan']} {fastest['tile']} {fastest['ms']:.3f} ms"
            summary.append(s)
            print(common.table(shape_rows, ["epilogue", "shape", "tile", "plan", "epi_tile", "sc", "sd", "share", "c_slot",
                                            "epi_bytes", "ml_stages", "model_us", "ms", "over_cublas"]), flush=True)
            print(flush=True)
    print(f"planner comparison on {common.device_name()} (bf16)")
    print(common.table(summary, ["epilogue", "shape", "cublas_ms", "cutlass_ms", "evtc_ms", "speedup_same_tile",
                                 "bytes_cutlass", "bytes_evtc", "best_cutlass", "best_evtc", "speedup_best", "fastest"]))
    common.write_json(args.json, {"device": common.device_name(), "rows": rows, "summary": summary})


if __name__ == "__main__":
    main()
