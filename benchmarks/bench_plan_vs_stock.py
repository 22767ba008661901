"""Issue 4's regression check: every reference epilogue with evtc's plan against stock CUTLASS's
additive plan (``plan="cutlass"``) at the default GEMM configuration, timed in alternation with
cuBLAS in one run. The goal is that no reference epilogue is more than 2 % slower with evtc's plan.

    python benchmarks/bench_plan_vs_stock.py --json $OUT/plan_vs_stock.json

Where the two policies produce the same decisions (same slots, stages, epilogue tile and buffers),
the kernels are the same code and their difference is the measurement's noise; the table says so.
bf16 A/B/C/D (fp8_out: e4m3 A/B/D).
"""

from __future__ import annotations

import argparse
import json

import common  # noqa: F401

import evtc
from evtc import bf16, e4m3

SHAPES = [(8192, 8192, 4096), (16384, 4096, 1024), (4096, 4096, 4096)]


def make(name: str, plan: str):
    import epilogues as E

    if name == "fp8_out":
        return evtc.Gemm(E.REFERENCE[name], a=e4m3, b=e4m3, d=e4m3, plan=plan)
    return evtc.Gemm(E.REFERENCE[name], a=bf16, b=bf16, c=bf16, d=bf16, plan=plan)


def pairs(differing: bool = False):
    """(name, evtc Gemm, cutlass Gemm or None when stock CUTLASS has no plan at this tile); with
    ``differing``, only the epilogues whose two plans differ (the others are the same kernel)."""
    import epilogues as E

    out = []
    for name in E.REFERENCE:
        ours = make(name, "evtc")
        try:
            stock = make(name, "cutlass")
        except evtc.PlanError as e:
            print(f"{name}: no cutlass plan at {ours.config.name} ({str(e).splitlines()[0]})")
            stock = None
        if differing and stock is not None and decisions(ours.plan) == decisions(stock.plan):
            continue
        out.append((name, ours, stock))
    return out


def all_gemms(differing: bool = False, table=None):
    """Every Gemm of :func:`pairs` (or of its result ``table``, to plan them only once)."""
    return [g for _, ours, stock in (table if table is not None else pairs(differing)) for g in (ours, stock)
            if g is not None]


def decisions(plan) -> str:
    d = json.loads(plan.dumps())
    d.pop("policy", None)
    d.pop("cost", None)
    d.pop("notes", None)
    for b in d.get("buffers", []):
        b.pop("why", None)
    return json.dumps(d, sort_keys=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--differing", action="store_true", help="only the epilogues whose plans differ from stock's")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    from evtc.testing.bench import time_interleaved
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    table = pairs(args.differing)
    common.build_all(all_gemms(table=table), "plan_vs_stock")
    rows = []
    for (M, N, K) in SHAPES:
        fns = {}
        plain = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        a16 = torch.randn(M, K, device="cuda", dtype=torch.bfloat16)
        b16 = torch.randn(N, K, device="cuda", dtype=torch.bfloat16)
        fns["cublas"] = lambda: torch.matmul(a16, b16.t(), out=plain)
        for name, ours, stock in table:
            if stock is None:
                continue
            p = Problem(M, N, K)
            ins = make_inputs(ours.graph, ours.a, ours.b, p, seed=5)
            A, B = ins.pop("A"), ins.pop("B")
            for tag, g in (("evtc", ours), ("cutlass", stock)):
                outs = poisoned_outputs(g.graph, p)
                g.build()
                fns[f"{name}/{tag}"] = (lambda g=g, A=A, B=B, outs=outs, ins=ins: g(A, B, out=outs, **ins))
        t = time_interleaved(fns, args.iters)
        for name, ours, stock in table:
            if stock is None:
                continue
            rows.append({"epilogue": name, "shape": f"{M}x{N}x{K}", "same_plan": decisions(ours.plan) == decisions(stock.plan),
                         "bytes_evtc": ours.plan.epilogue_smem_bytes, "bytes_cutlass": stock.plan.epilogue_smem_bytes,
                         "stages_evtc": ours.plan.mainloop_stages, "stages_cutlass": stock.plan.mainloop_stages,
                         "evtc_ms": t[f"{name}/evtc"], "cutlass_ms": t[f"{name}/cutlass"], "cublas_ms": t["cublas"],
                         "evtc_over_cutlass": t[f"{name}/evtc"] / t[f"{name}/cutlass"]})
        print(common.table([r for r in rows if r["shape"] == f"{M}x{N}x{K}"],
                           ["epilogue", "shape", "same_plan", "bytes_evtc", "bytes_cutlass", "stages_evtc", "stages_cutlass",
                            "evtc_ms", "cutlass_ms", "evtc_over_cutlass"]), flush=True)
        print(flush=True)
    worst = max(rows, key=lambda r: r["evtc_over_cutlass"])
    print(f"on {common.device_name()}: worst evtc/cutlass {worst['evtc_over_cutlass']:.3f} "
          f"({worst['epilogue']} {worst['shape']}, same plan: {worst['same_plan']})")
    common.write_json(args.json, {"device": common.device_name(), "rows": rows})


if __name__ == "__main__":
    main()
