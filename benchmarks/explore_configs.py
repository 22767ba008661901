"""Time one epilogue under many GEMM configurations and plans (for choosing defaults).

    python benchmarks/explore_configs.py bias_relu --shape 8192x8192x8192 --json $OUT/explore.json
"""

from __future__ import annotations

import argparse
import itertools

import common  # noqa: F401

import evtc
from evtc import bf16

CONFIGS = [
    dict(tile=(128, 256, 64), cluster=(2, 1, 1), schedule="cooperative"),
    dict(tile=(128, 256, 64), cluster=(1, 2, 1), schedule="cooperative"),
    dict(tile=(128, 256, 64), cluster=(1, 1, 1), schedule="cooperative"),
    dict(tile=(256, 128, 64), cluster=(2, 1, 1), schedule="cooperative"),
    dict(tile=(256, 128, 64), cluster=(1, 2, 1), schedule="cooperative"),
    dict(tile=(128, 256, 64), cluster=(2, 1, 1), schedule="cooperative", epilogue_tile=(128, 64)),
    dict(tile=(128, 256, 64), cluster=(2, 1, 1), schedule="cooperative", epilogue_tile=(128, 16)),
    dict(tile=(128, 128, 64), cluster=(2, 1, 1), schedule="cooperative"),
    dict(tile=(64, 256, 64), cluster=(1, 2, 1), schedule="pingpong"),
    dict(tile=(128, 128, 64), cluster=(2, 1, 1), schedule="pingpong"),
    dict(tile=(128, 192, 64), cluster=(2, 1, 1), schedule="pingpong"),
]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("epilogue", default="bias_relu", nargs="?")
    ap.add_argument("--shape", action="append", default=None)
    ap.add_argument("--plans", default="evtc,cutlass")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    import epilogues as E
    from evtc.bench import bench_gemm

    ep = E.REFERENCE[args.epilogue]
    gemms = []
    for cfg, pol in itertools.product(CONFIGS, args.plans.split(",")):
        try:
            gemms.append(evtc.Gemm(ep, a=bf16, b=bf16, d=bf16, config=evtc.GemmConfig(**cfg), plan=pol))
        except evtc.EvtcError as e:
            print(f"skip {cfg} {pol}: {str(e).splitlines()[0]}")
    # the same source may come from several (config, plan) pairs: build each once
    uniq = {g.source: g for g in gemms}
    common.build_all(list(uniq.values()), args.epilogue)
    rows = []
    for shape in args.shape or ["8192x8192x8192"]:
        M, N, K = map(int, shape.split("x"))
        for g in gemms:
            try:
                r = bench_gemm(g, M, N, K, iters=args.iters)
            except evtc.EvtcError as e:
                print(f"{g!r} failed: {e}")
                continue
            r.update(shape=shape, config=g.config.name, plan=g.plan.policy, epi_bytes=g.plan.epilogue_smem_bytes,
                     ml_stages=g.plan.mainloop_stages, epi_tile=f"{g.plan.epilogue_tile[0]}x{g.plan.epilogue_tile[1]}",
                     sc=g.plan.stages_c, sd=g.plan.stages_d, reuse=g.plan.reuse_smem_c)
            rows.append(r)
            print(f"{shape} {g.config.name:32s} {g.plan.policy:8s} {r['evtc_ms']:.3f} ms  x{r['evtc_over_cublas']:.3f}", flush=True)
    print()
    print(common.table(rows, ["shape", "config", "plan", "epi_tile", "sc", "sd", "reuse", "epi_bytes", "ml_stages",
                              "evtc_ms", "cublas_ms", "evtc_over_cublas"]))
    common.write_json(args.json, {"device": common.device_name(), "epilogue": args.epilogue, "rows": rows})


if __name__ == "__main__":
    main()
