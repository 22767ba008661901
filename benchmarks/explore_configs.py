"""Time one epilogue under several GEMM configurations, plans and tile orders, all in alternation
with cuBLAS in one run (for choosing defaults; see docs/performance.md).

    python benchmarks/explore_configs.py bias_relu --json $OUT/explore.json

The tile order (the sm90 scheduler's swizzle and raster arguments) is a run-time argument, so
every order of a configuration runs the same built kernel.
"""

from __future__ import annotations

import argparse

import common  # noqa: F401

import evtc
from evtc import bf16

CONFIGS = [
    (dict(tile=(128, 256, 64), cluster=(2, 1, 1), schedule="cooperative"), "evtc"),
    (dict(tile=(128, 256, 64), cluster=(1, 2, 1), schedule="cooperative"), "evtc"),
    (dict(tile=(256, 128, 64), cluster=(2, 1, 1), schedule="cooperative"), "evtc"),
    (dict(tile=(128, 192, 64), cluster=(2, 1, 1), schedule="pingpong"), "evtc"),
    (dict(tile=(128, 192, 64), cluster=(1, 2, 1), schedule="pingpong"), "evtc"),
]
# (log2 swizzle, raster): CUTLASS's default (1 tile, heuristic) first
ORDERS = [(0, "heuristic"), (1, "along_m"), (2, "along_m"), (3, "along_m"), (1, "along_n"), (2, "along_n"),
          (3, "along_n")]
SHAPES = ["8192x8192x8192", "16384x4096x1024", "4096x4096x4096"]


def gemms(name="bias_relu", orders=ORDERS):
    import epilogues as E

    out = []
    for cfg, plan in CONFIGS:
        for swizzle, raster in orders:
            try:
                g = evtc.Gemm(E.REFERENCE[name], a=bf16, b=bf16, d=bf16,
                              config=evtc.GemmConfig(**cfg, swizzle=swizzle, raster=raster),
                              plan=plan if isinstance(plan, str) else {"policy": "evtc", **plan})
            except evtc.EvtcError as e:
                print(f"skip {cfg} {plan}: {str(e).splitlines()[0]}")
                break
            out.append((f"{g.config.schedule_name} {plan if isinstance(plan, str) else 'evtc' + str(sorted(plan.items()))}", g))
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("epilogue", default="bias_relu", nargs="?")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    from evtc.testing.bench import time_interleaved
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    entries = gemms(args.epilogue)
    common.build_all(list({g.source: g for _, g in entries}.values()), args.epilogue)
    rows = []
    for shape in SHAPES:
        M, N, K = map(int, shape.split("x"))
        g0 = entries[0][1]
        ins = make_inputs(g0.graph, bf16, bf16, Problem(M, N, K), seed=3)
        outs = poisoned_outputs(g0.graph, Problem(M, N, K))
        A, B = ins["A"], ins["B"]
        kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
        plain = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        Bt = B.t()
        fns = {"cublas": lambda: torch.matmul(A, Bt, out=plain)}
        for i, (_, g) in enumerate(entries):
            g.build()
            fns[str(i)] = (lambda g=g: g(A, B, out=outs, **kw))
        t = time_interleaved(fns, args.iters)
        shape_rows = []
        for i, (lab, g) in enumerate(entries):
            p = g.plan
            shape_rows.append({"shape": shape, "config": lab, "epi_tile": f"{p.epilogue_tile[0]}x{p.epilogue_tile[1]}",
                               "sc": p.stages_c, "sd": p.stages_d, "reuse": p.reuse_smem_c, "epi_bytes": p.epilogue_smem_bytes,
                               "ml_stages": p.mainloop_stages, "ms": t[str(i)], "cublas_ms": t["cublas"],
                               "over_cublas": t[str(i)] / t["cublas"]})
        rows += shape_rows
        cols = ["shape", "config", "epi_tile", "sc", "sd", "reuse", "epi_bytes", "ml_stages", "ms", "cublas_ms", "over_cublas"]
        print(common.table(shape_rows, cols), flush=True)
        best = sorted(shape_rows, key=lambda r: r["ms"])[:5]
        print(f"\nfastest at {shape}:\n" + common.table(best, ["config", "ms", "over_cublas"]) + "\n", flush=True)
    common.write_json(args.json, {"device": common.device_name(), "epilogue": args.epilogue, "rows": rows})


if __name__ == "__main__":
    main()
