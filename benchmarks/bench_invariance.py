"""Issue 40's cost of batch invariance: ``Gemm(..., batch_invariant=True)`` against the default
family at the dense and MoE-expert GEMMs of DeepSeek-V3 and Llama-3-70B, 16 to 8192 tokens, bf16,
timed side by side in one run (:func:`evtc.testing.bench.time_interleaved`), with the member
each mode picked.

    python benchmarks/bench_invariance.py --prebuild              # here: build what an H200 picks
    python benchmarks/bench_invariance.py --json $OUT/invariance.json

The issue's target: at most 10 % slower (geomean) at 1024 tokens and more; printed per shape and
as geomeans over all rows and over the rows of 1024 tokens or more.
"""

from __future__ import annotations

import argparse
import math

import common  # (also sets sys.path)

import evtc

#: (model, layer, N, K) of each GEMM (weights N x K): DeepSeek-V3 (hidden 7168, dense MLP 18432,
#: routed expert 2048) and Llama-3-70B (hidden 8192, 64 + 2 x 8 heads of 128, MLP 28672)
SHAPES = [("deepseek-v3", "dense up+gate", 2 * 18432, 7168), ("deepseek-v3", "dense down", 7168, 18432),
          ("deepseek-v3", "expert up+gate", 2 * 2048, 7168), ("deepseek-v3", "expert down", 7168, 2048),
          ("llama-3-70b", "qkv", 10240, 8192), ("llama-3-70b", "o", 8192, 8192),
          ("llama-3-70b", "up+gate", 2 * 28672, 8192), ("llama-3-70b", "down", 8192, 28672)]
TOKENS = (16, 64, 256, 1024, 4096, 8192)
EPILOGUES = {"bare": "D = acc", "bias_relu": "D = relu(acc + bias[n])",
             "row_stats": "D = acc; m = max(acc, dim=1); s = sum(acc, dim=1)"}
DEVICE = "NVIDIA H200"


def gemms() -> dict:
    return {(name, inv): evtc.Gemm(text, a=evtc.bf16, batch_invariant=inv)
            for name, text in EPILOGUES.items() for inv in (False, True)}


def prebuild() -> None:
    common.build_chosen(gemms().values(), SHAPES, TOKENS, DEVICE)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prebuild", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.prebuild:
        prebuild()
        return
    import torch

    from evtc.runtime.timing import random_inputs
    from evtc.testing import Problem
    from evtc.testing.bench import time_interleaved

    table = gemms()
    device = torch.cuda.get_device_name()
    rows = []
    for name in EPILOGUES:
        base, inv = table[(name, False)], table[(name, True)]
        for model, layer, N, K in SHAPES:
            for M in TOKENS:
                x = random_inputs(base.graph, base.a, base.b, Problem(M, N, K, 1), seed=M + N)
                A, B = x.pop("A"), x.pop("B")
                t = time_interleaved({"default": lambda: base(A, B, **x), "invariant": lambda: inv(A, B, **x)},
                                     args.iters)
                row = {"epilogue": name, "model": model, "layer": layer, "M": M, "N": N, "K": K,
                       "default_ms": t["default"], "invariant_ms": t["invariant"],
                       "cost": t["invariant"] / t["default"],
                       "default_member": base.choose(M, N, K, device=device).name,
                       "invariant_member": inv.choose(M, N, K, device=device).name}
                rows.append(row)
                print(f"{name:9s} {model:12s} {layer:15s} M={M:5d} N={N:5d} K={K:5d}  default {t['default']:.4f} ms "
                      f"({row['default_member']})  invariant {t['invariant']:.4f} ms ({row['invariant_member']})  "
                      f"x{row['cost']:.3f}", flush=True)

    def gm(rs):
        return math.exp(sum(math.log(r["cost"]) for r in rs) / len(rs)) if rs else float("nan")

    big = [r for r in rows if r["M"] >= 1024]
    print(f"geomean cost: all rows {gm(rows):.3f}, rows of 1024 tokens or more {gm(big):.3f} (target <= 1.10)")
    common.write_json(args.json, {"device": common.device_name(), "rows": rows,
                                  "geomean_all": gm(rows), "geomean_1024_up": gm(big)})


if __name__ == "__main__":
    main()
