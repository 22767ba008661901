"""Issue 40's fused per-token-group fp8 output: a bf16 GEMM whose epilogue quantizes D per 1 x 128
group (``evtc.quantize``, vLLM's convention, e4m3 data and f32 scales) against cuBLAS's GEMM with
a bf16 output followed by the same quantization as a separate step, eager torch and
``torch.compile`` (default) of :func:`evtc.testing.quant.quantize_per_token_group`: the dense and
MoE-expert GEMMs of DeepSeek-V3 and Llama-3-70B at 16 to 8192 tokens, timed side by side in one
run (back to back, :func:`evtc.runtime.timing.time_interleaved`; and in CUDA graphs,
``--graphs``). Every row first checks that evtc's output is bitwise the reference's on the
same f32 values (a second, f32 output of y beside the quantized one).

    python benchmarks/bench_quant.py --prebuild              # build what the rows choose
    python benchmarks/bench_quant.py --json $OUT/quant.json
    python benchmarks/bench_quant.py --prebuild --tune-all   # build every candidate kernel
    python benchmarks/bench_quant.py --tune-all --json ...    # also time every candidate per row

The issue's target: >= 1.3x faster than GEMM + torch.compile's quantization at >= 1024 tokens,
never slower at any size. Printed per row and as geomeans (all rows; >= 1024 tokens).
"""

from __future__ import annotations

import argparse
import math

import common  # (also sets sys.path)

import evtc

#: (model, layer, N, K) (weights N x K): the GEMMs whose output feeds an fp8 GEMM
SHAPES = [("deepseek-v3", "dense up+gate", 2 * 18432, 7168), ("deepseek-v3", "dense down", 7168, 18432),
          ("deepseek-v3", "expert up+gate", 2 * 2048, 7168), ("deepseek-v3", "o_proj", 7168, 16384),
          ("llama-3-70b", "qkv", 10240, 8192), ("llama-3-70b", "up+gate", 2 * 28672, 8192),
          ("llama-3-70b", "down", 8192, 28672)]
TOKENS = (16, 128, 1024, 4096, 8192)
DEVICE = "NVIDIA H200"


def _epilogues(layout: str) -> tuple:
    """(quant, quant_checked): D = e4m3 per 1 x 128 group of acc (vLLM's convention) with its
    scales in ``layout``; the checked twin also stores y in f32 (the bitwise check's input)."""

    @evtc.epilogue(name="quant" + ("" if layout == "row_major" else "_" + layout))
    def quant(acc):
        q, s = evtc.quantize(acc, evtc.e4m3, group=128, scale_layout=layout)
        return {"D": q, "D_scale": s}

    @evtc.epilogue(name="quant_checked" + ("" if layout == "row_major" else "_" + layout))
    def quant_checked(acc):
        q, s = evtc.quantize(acc, evtc.e4m3, group=128, scale_layout=layout)
        return {"D": q, "D_scale": s, "Y": acc.to(evtc.f32)}

    return quant, quant_checked


def gemms(layout: str = "row_major") -> dict:
    """The fused kernel (scales in ``layout``), its checked twin, and evtc's plain GEMM with a
    bf16 D (what the fused epilogue costs over evtc's own kernel, beside what cuBLAS takes)."""
    quant, checked = _epilogues(layout)
    return {"quant": evtc.Gemm(quant, a=evtc.bf16), "checked": evtc.Gemm(checked, a=evtc.bf16),
            "bare": evtc.Gemm("D = acc", a=evtc.bf16)}


def prebuild(tune_all: bool = False, layout: str = "row_major") -> None:
    table = gemms(layout)
    common.build_chosen(table.values(), SHAPES, TOKENS, DEVICE)
    if tune_all:  # every candidate of the fused kernel (the selection's column, --tune-all)
        from evtc.compiler import build_many
        from evtc.dispatch.tune import candidates
        from evtc.family.spec import Problem

        fam = table["quant"].dispatch.family
        jobs = {}
        for *_, N, K in SHAPES:
            for M in TOKENS:
                for c in candidates(fam, Problem(M, N, K, 1, sm_count=132), None, DEVICE):
                    k = fam.kernel(c)
                    jobs.setdefault(k.source, k.job())
        print(f"building {len(jobs)} candidate kernels", flush=True)
        res = build_many(list(jobs.values()))
        print(f"built {sum(not isinstance(r, Exception) for r in res)}/{len(res)}")


def _bitwise(checked, A, B) -> bool:
    import torch

    from evtc.testing.quant import quantize_per_token_group

    got = checked(A, B)
    q_ref, s_ref = quantize_per_token_group(got["Y"].float(), 128, "e4m3")
    return bool(torch.equal(got["D"].contiguous().view(torch.uint8), q_ref.view(torch.uint8))
                and torch.equal(got["D_scale"], s_ref))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prebuild", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--graphs", action="store_true", help="also time each function in CUDA graphs")
    ap.add_argument("--tune-all", action="store_true",
                    help="also time every candidate (gemm.tune, all of them, in CUDA graphs): the choice / the fastest")
    ap.add_argument("--scale-layout", default="row_major", choices=("row_major", "col_major_tma"),
                    help="the scales' layout (col_major_tma: DeepGEMM's; the bitwise check compares values)")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.prebuild:
        prebuild(args.tune_all, args.scale_layout)
        return
    import torch

    from evtc.runtime.timing import time_graphs, time_interleaved
    from evtc.testing.quant import quantize_per_token_group

    table = gemms(args.scale_layout)
    g = table["quant"]
    device = torch.cuda.get_device_name()

    def eager_quant(y):
        return quantize_per_token_group(y, 128, "e4m3")

    compiled_quant = torch.compile(eager_quant, dynamic=True)  # one compile for every shape
    rows = []
    for model, layer, N, K in SHAPES:
        for M in TOKENS:
            A = torch.randn(M, K, device="cuda").to(torch.bfloat16)
            B = (torch.randn(N, K, device="cuda") / math.sqrt(K)).to(torch.bfloat16)
            exact = _bitwise(table["checked"], A, B)
            y = A @ B.t()
            compiled_quant(y)  # compile outside the timing
            bare = table["bare"]
            fns = {"evtc": lambda: g(A, B), "evtc_bf16": lambda: bare(A, B), "mm": lambda: A @ B.t(),
                   "mm+eager": lambda: eager_quant(A @ B.t()), "mm+compile": lambda: compiled_quant(A @ B.t())}
            t = time_interleaved(fns, args.iters)
            row = {"model": model, "layer": layer, "M": M, "N": N, "K": K, "bitwise": exact,
                   "member": g.choose(M, N, K, device=device).name, **{f"{k}_ms": v for k, v in t.items()},
                   "vs_compile": t["mm+compile"] / t["evtc"], "vs_eager": t["mm+eager"] / t["evtc"],
                   "vs_mm": t["mm"] / t["evtc"], "quant_cost": t["evtc"] / t["evtc_bf16"]}
            if args.tune_all:
                tuned = g.tune([(M, N, K)], top=None, store=False, iters=args.iters)[0]
                row.update(fastest=tuned["label"], fastest_ms=tuned["ms"], choice=tuned["heuristic"]["label"],
                           choice_ms=tuned["heuristic"]["ms"], candidates_ms=tuned["times_ms"])
                row["choice_over_fastest"] = (tuned["heuristic"]["ms"] or float("nan")) / tuned["ms"]
                print("    candidates (graphs, ms): " + ", ".join(f"{k} {v:.4f}" for k, v in tuned["times_ms"].items())
                      + f"; the choice {row['choice']} x{row['choice_over_fastest']:.3f} the fastest", flush=True)
            if args.graphs:
                tg = time_graphs(fns)
                row.update({f"{k}_graph_ms": v for k, v in tg.items()})
                row["vs_compile_graph"] = tg["mm+compile"] / tg["evtc"]
            rows.append(row)
            print(f"{model:12s} {layer:15s} M={M:5d} N={N:5d} K={K:5d} [{row['member']}] bitwise={exact}  "
                  f"evtc {t['evtc']:.4f}  mm {t['mm']:.4f}  mm+eager {t['mm+eager']:.4f}  "
                  f"mm+compile {t['mm+compile']:.4f} ms  x{row['vs_compile']:.3f} vs compile, "
                  f"x{row['vs_mm']:.3f} vs mm alone, evtc bf16 {t['evtc_bf16']:.4f} (quant costs x{row['quant_cost']:.3f})" +
                  (f", graphs x{row['vs_compile_graph']:.3f}" if args.graphs else ""), flush=True)

    def gm(rs, key):
        return math.exp(sum(math.log(r[key]) for r in rs) / len(rs)) if rs else float("nan")

    big = [r for r in rows if r["M"] >= 1024]
    summary = {"geomean_vs_compile_all": gm(rows, "vs_compile"), "geomean_vs_compile_1024_up": gm(big, "vs_compile"),
               "min_vs_compile": min(r["vs_compile"] for r in rows), "min_vs_compile_1024_up": min(r["vs_compile"] for r in big),
               "geomean_vs_eager_all": gm(rows, "vs_eager"), "geomean_vs_mm_all": gm(rows, "vs_mm"),
               "geomean_quant_cost": gm(rows, "quant_cost"),
               "bitwise_rows": sum(r["bitwise"] for r in rows), "row_count": len(rows)}
    if args.tune_all:
        summary["geomean_choice_over_fastest"] = gm(rows, "choice_over_fastest")
        summary["choice_within_1.05"] = sum(r["choice_over_fastest"] <= 1.05 for r in rows)
        print("the choice / the fastest candidate: geomean {geomean_choice_over_fastest:.3f}, within 1.05 on "
              "{choice_within_1.05}/{row_count}".format(**summary))
    print("speed-up vs GEMM + torch.compile quant: geomean all {geomean_vs_compile_all:.3f}, >= 1024 tokens "
          "{geomean_vs_compile_1024_up:.3f} (target >= 1.3), min all {min_vs_compile:.3f} (target >= 1.0), "
          "min >= 1024 {min_vs_compile_1024_up:.3f}; vs eager {geomean_vs_eager_all:.3f}; evtc / mm alone "
          "{geomean_vs_mm_all:.3f}; fused / evtc's bf16 GEMM {geomean_quant_cost:.3f}; bitwise {bitwise_rows}/{row_count}"
          .format(**summary))
    common.write_json(args.json, {"device": common.device_name(), "rows": rows, **summary})


if __name__ == "__main__":
    main()
