"""The one-GEMM gated form (``evtc.glu``, docs/gated.md) against the ways a SwiGLU (GeGLU) MLP's
gate and up projections run today: eager PyTorch as Llama's and Gemma's modules write it
(``act(x W_gate^T) * (x W_up^T)``: two GEMMs and the pointwise ops), ``torch.compile`` (default;
``--max-autotune`` adds that mode) of the same, evtc's two-GEMM form (the gate GEMM, then the up
GEMM with ``act(gate) * acc`` fused, the gate read as an aux load), and cuBLAS's plain GEMM over
the 2I columns alone (the floor of any fused kernel: no epilogue, 2I columns written). The gate
and up projections of Llama-3-8B, Llama-3-70B, Mistral-7B, Qwen2.5-7B (SwiGLU) and Gemma-2-9B
(GeGLU, tanh) at 1 to 8192 tokens, bf16, timed side by side in one run (back to back,
:func:`evtc.runtime.timing.time_interleaved`; in CUDA graphs with ``--graphs``). Every row
first checks evtc's outputs elementwise against the float64 product of the same bf16 weights.

    python benchmarks/bench_glu.py --prebuild               # build what the rows choose
    python benchmarks/bench_glu.py --json $OUT/glu.json [--graphs] [--max-autotune]

Issue 38's target for the gated one-GEMM form: Llama-3-8B's MLP at 1024 and 4096 tokens >= 1.15x
faster than torch.compile default (this benchmark times the gate/up half of the MLP, where the
fusion acts; the down projection is the same GEMM either way).
"""

from __future__ import annotations

import argparse
import math

import common  # (also sets sys.path)

import evtc

#: (model, hidden H, intermediate I, act): the gate and up projections are I x H each
MODELS = [("llama-3-8b", 4096, 14336, "silu"), ("llama-3-70b", 8192, 28672, "silu"),
          ("mistral-7b", 4096, 14336, "silu"), ("qwen2.5-7b", 3584, 18944, "silu"),
          ("gemma-2-9b", 3584, 14336, "gelu_tanh")]
TOKENS = (1, 128, 1024, 4096, 8192)
DEVICE = "NVIDIA H200"


def _epilogues(act: str) -> tuple:
    """(glu, up): the one-GEMM form over interleaved columns, and the two-GEMM form's up GEMM
    with the gate GEMM's output G as an aux load."""

    @evtc.epilogue(name=f"glu_{act}")
    def glu(acc):
        return evtc.glu(acc, act=act)

    @evtc.epilogue(name=f"gated_up_{act}")
    def up(acc, G: evtc.Matrix):
        return getattr(evtc, act)(G) * acc

    return glu, up


def gemms(act: str = "silu") -> dict:
    glu, up = _epilogues(act)
    return {"glu": evtc.Gemm(glu, a=evtc.bf16), "up": evtc.Gemm(up, a=evtc.bf16), "bare": evtc.Gemm("D = acc", a=evtc.bf16)}


def prebuild() -> None:
    """Build, in one parallel batch, the kernel each row's Gemms choose on the H200."""
    from evtc.compiler import build_many

    jobs = {}
    for _, H, I, act in MODELS:
        table = gemms(act)
        for name, N in (("glu", 2 * I), ("up", I), ("bare", I)):
            g = table[name]
            for M in TOKENS:
                k = g.kernel(g.choose(M, N, H, device=DEVICE))
                jobs.setdefault(k.source, k.job())
    print(f"building {len(jobs)} kernels", flush=True)
    res = build_many(list(jobs.values()))
    print(f"built {sum(not isinstance(r, Exception) for r in res)}/{len(res)}")


def _check(got, x, wg, wu, act) -> float:
    """The worst |got - want| / (|want| 2^-8 + 2^-8 max|want|) (<= 1 passes: half a bf16 ulp of
    the output plus a small absolute floor for the products near 0)."""
    import torch

    xd = x.double()
    f = {"silu": torch.nn.functional.silu, "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[act]
    want = f(xd @ wg.double().T) * (xd @ wu.double().T)
    err = (got.double() - want).abs()
    allowed = want.abs() * 2.0 ** -7 + 2.0 ** -8 * want.abs().max()
    return float((err / allowed).max())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--prebuild", action="store_true")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--graphs", action="store_true", help="also time each function in CUDA graphs")
    ap.add_argument("--max-autotune", action="store_true", help="also torch.compile(mode='max-autotune')")
    ap.add_argument("--models", default=",".join(m[0] for m in MODELS))
    ap.add_argument("--tokens", default=",".join(map(str, TOKENS)))
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.prebuild:
        prebuild()
        return
    import torch

    from evtc.runtime.timing import time_graphs, time_interleaved

    F = torch.nn.functional
    acts = {"silu": F.silu, "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}
    rows = []
    wanted = set(args.models.split(","))
    tokens = [int(t) for t in args.tokens.split(",")]
    for model, H, I, act in MODELS:
        if model not in wanted:
            continue
        table = gemms(act)
        f = acts[act]

        def eager(x, wg, wu, f=f):
            return f(x @ wg.T) * (x @ wu.T)

        compiled = torch.compile(eager, dynamic=False)
        compiled_ma = torch.compile(eager, mode="max-autotune", dynamic=False) if args.max_autotune else None
        gen = torch.Generator(device="cuda").manual_seed(0)
        wg = (torch.randn(I, H, device="cuda", generator=gen) / math.sqrt(H)).bfloat16()
        wu = (torch.randn(I, H, device="cuda", generator=gen) / math.sqrt(H)).bfloat16()
        w_il = evtc.interleave_gate_up(wg, wu)  # once, as at load time
        w_cat = torch.cat([wg, wu])
        for M in tokens:
            x = torch.randn(M, H, device="cuda", generator=gen).bfloat16()
            glu, up, bare = table["glu"], table["up"], table["bare"]
            worst = _check(glu(x, w_il), x, wg, wu, act)
            worst2 = _check(up(x, wu, G=bare(x, wg)), x, wg, wu, act)
            fns = {"evtc_glu": lambda: glu(x, w_il), "evtc_2gemm": lambda: up(x, wu, G=bare(x, wg)),
                   "mm_2I": lambda: x @ w_cat.T, "eager": lambda: eager(x, wg, wu), "compile": lambda: compiled(x, wg, wu)}
            if compiled_ma is not None:
                fns["max_autotune"] = lambda: compiled_ma(x, wg, wu)
            for fn in fns.values():
                fn()  # compile (and autotune) outside the timing
            t = time_interleaved(fns, args.iters)
            row = {"model": model, "act": act, "M": M, "H": H, "I": I, "check_excess": worst, "check_excess_2gemm": worst2,
                   "member": glu.choose(M, 2 * I, H, device=torch.cuda.get_device_name()).name,
                   **{f"{k}_ms": v for k, v in t.items()},
                   "vs_compile": t["compile"] / t["evtc_glu"], "vs_eager": t["eager"] / t["evtc_glu"],
                   "vs_2gemm": t["evtc_2gemm"] / t["evtc_glu"], "over_floor": t["evtc_glu"] / t["mm_2I"]}
            if compiled_ma is not None:
                row["vs_max_autotune"] = t["max_autotune"] / t["evtc_glu"]
            if args.graphs:
                tg = time_graphs(fns)
                row.update({f"{k}_graph_ms": v for k, v in tg.items()})
                row["vs_compile_graph"] = tg["compile"] / tg["evtc_glu"]
            rows.append(row)
            print(f"{model:12s} {act:9s} M={M:5d} H={H:5d} I={I:5d} [{row['member']}] check {worst:.2f}/{worst2:.2f}  "
                  f"glu {t['evtc_glu']:.4f}  2gemm {t['evtc_2gemm']:.4f}  mm(2I) {t['mm_2I']:.4f}  eager {t['eager']:.4f}  "
                  f"compile {t['compile']:.4f} ms  x{row['vs_compile']:.3f} vs compile, x{row['vs_eager']:.3f} vs eager, "
                  f"x{row['vs_2gemm']:.3f} vs 2-GEMM, {row['over_floor']:.3f} of the floor" +
                  (f", x{row['vs_max_autotune']:.3f} vs max-autotune" if compiled_ma is not None else "") +
                  (f", graphs x{row['vs_compile_graph']:.3f}" if args.graphs else ""), flush=True)

    def gm(rs, key):
        return math.exp(sum(math.log(r[key]) for r in rs) / len(rs)) if rs else float("nan")

    big = [r for r in rows if r["M"] >= 1024]
    summary = {"geomean_vs_compile_all": gm(rows, "vs_compile"), "geomean_vs_compile_1024_up": gm(big, "vs_compile"),
               "min_vs_compile": min((r["vs_compile"] for r in rows), default=float("nan")),
               "geomean_vs_eager_all": gm(rows, "vs_eager"), "geomean_vs_2gemm_all": gm(rows, "vs_2gemm"),
               "geomean_over_floor_1024_up": gm(big, "over_floor"),
               "checked_rows": sum(r["check_excess"] <= 1 for r in rows), "row_count": len(rows)}
    print("evtc.glu: vs torch.compile geomean all {geomean_vs_compile_all:.3f}, >= 1024 tokens "
          "{geomean_vs_compile_1024_up:.3f}, min {min_vs_compile:.3f}; vs eager {geomean_vs_eager_all:.3f}; vs evtc's "
          "two-GEMM form {geomean_vs_2gemm_all:.3f}; / cuBLAS's plain GEMM over 2I columns (>= 1024) "
          "{geomean_over_floor_1024_up:.3f}; checked {checked_rows}/{row_count}".format(**summary))
    common.write_json(args.json, {"device": common.device_name(), "rows": rows, **summary})


if __name__ == "__main__":
    main()
