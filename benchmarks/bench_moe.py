"""Issue 39's benchmark: the routed experts' SwiGLU up-projection of three MoE models, in one run.

    python benchmarks/bench_moe.py --json $OUT/moe.json [--models dsv3,qwen3,mixtral] [--tokens 1,64,512,4096,16384]
    python benchmarks/bench_moe.py --prebuild        # build the grouped kernels (no GPU needed)

Models (their configs' ``n_routed_experts``/``num_experts``, ``num_experts_per_tok``,
``hidden_size``, ``moe_intermediate_size``/``intermediate_size``): DeepSeek-V3 (256 experts,
top-8, hidden 7168, expert intermediate 2048), Qwen3-30B-A3B (128, top-8, 2048, 768), Mixtral
8x7B (8, top-2, 4096, 14336). Each token's top-k copies are routed balanced (round robin) or
Zipf-skewed (expert e drawn with weight 1/(e+1)); A holds the T = tokens x top-k rows sorted by
expert, ``offs`` their cumulative counts (int32, on the device).

Columns, ms per call (CUDA events, modes in alternation: :func:`evtc.runtime.timing.time_interleaved`):

* ``grouped_mm``: ``torch._grouped_mm(A, W_gu^T, offs)`` alone, [W_gate; W_up] as one (E, 2I, H)
  weight: the floor a fused kernel aims at (no epilogue);
* ``grouped_mm+eager``: the same, then ``silu(y[:, :I]) * y[:, I:]`` eagerly;
* ``compile``: ``torch.compile`` of that function (default mode);
* ``evtc_plain``: ``evtc.GroupedGemm`` of ``D = acc`` on the (E, 2I, H) weight: the kernel
  against ``_grouped_mm`` with nothing fused;
* ``evtc``: SwiGLU with ``evtc.GroupedGemm``: the gate GEMM (``D = acc``) then the up GEMM with
  ``silu(gate) * acc`` fused (two grouped launches; the one-GEMM gated form is not built yet).

Every evtc output is checked against the ``grouped_mm+eager`` result (bf16, max relative error
printed) before anything is timed.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

import common  # noqa: F401  (sets sys.path)

import evtc
from evtc.grouped import GroupedGemm

MODELS = {"dsv3": (256, 8, 7168, 2048), "qwen3": (128, 8, 2048, 768), "mixtral": (8, 2, 4096, 14336)}


@evtc.epilogue
def bare(acc):
    return acc


@evtc.epilogue
def swiglu_up(acc, gate: evtc.Matrix):
    return evtc.silu(gate) * acc


def grouped_gemms() -> list[GroupedGemm]:
    """The kernels this benchmark runs (every member of both epilogues; the same sources as
    tests/gpu/test_grouped_gpu.py's ``bare`` and ``swiglu_up``, so one build serves both)."""
    return [GroupedGemm(bare), GroupedGemm(swiglu_up)]


def routing(torch, tokens: int, E: int, topk: int, skew: str, gen):
    """Tokens per expert (a list of E ints summing to tokens * topk)."""
    T = tokens * topk
    if skew == "balanced":
        counts = [T // E + (1 if e < T % E else 0) for e in range(E)]
    else:
        w = torch.tensor([1.0 / (e + 1) for e in range(E)])
        draw = torch.multinomial(w, T, replacement=True, generator=gen)
        counts = torch.bincount(draw, minlength=E).tolist()
    return counts


def row(torch, F, name, tokens, skew, gg_plain, gg_up, iters):
    from evtc.runtime.timing import time_interleaved

    E, topk, H, inter = MODELS[name]
    gen = torch.Generator().manual_seed(tokens * 7 + len(skew))
    counts = routing(torch, tokens, E, topk, skew, gen)
    T = sum(counts)
    dev = "cuda"
    g = torch.Generator(device=dev).manual_seed(tokens)
    A = (torch.randn(T, H, generator=g, device=dev) / 4).to(torch.bfloat16)
    Wg = (torch.randn(E, inter, H, generator=g, device=dev) / math.sqrt(H)).to(torch.bfloat16)
    Wu = (torch.randn(E, inter, H, generator=g, device=dev) / math.sqrt(H)).to(torch.bfloat16)
    Wgu = torch.cat([Wg, Wu], dim=1).contiguous()  # (E, 2I, H)
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32).to(dev)
    WguT = Wgu.transpose(1, 2)  # (E, H, 2I), column-major per expert: _grouped_mm's "TN"

    def eager():
        y = torch._grouped_mm(A, WguT, offs=offs)
        return F.silu(y[:, :inter]) * y[:, inter:]

    compiled = torch.compile(eager)

    def evtc_swiglu():
        gate = gg_plain(A, Wg, offs)
        return gg_up(A, Wu, offs, gate=gate)

    want = eager()
    got = evtc_swiglu()
    compiled()
    torch.cuda.synchronize()
    err = ((got.float() - want.float()).abs().max() / want.float().abs().max().clamp_min(1e-30)).item()
    fns = {"grouped_mm": lambda: torch._grouped_mm(A, WguT, offs=offs), "grouped_mm+eager": eager,
           "compile": compiled, "evtc_plain": lambda: gg_plain(A, Wgu, offs), "evtc": evtc_swiglu}
    ms = time_interleaved(fns, iters=iters)
    flops = 2.0 * T * H * 2 * inter
    return {"model": name, "tokens": tokens, "routing": skew, "rows": T, "max_rel_err": err, "ms": ms,
            "tflops": {k: flops / (v * 1e-3) / 1e12 for k, v in ms.items()},
            "evtc_vs_eager": ms["grouped_mm+eager"] / ms["evtc"], "evtc_vs_compile": ms["compile"] / ms["evtc"],
            "evtc_vs_floor": ms["evtc"] / ms["grouped_mm"], "plain_vs_floor": ms["evtc_plain"] / ms["grouped_mm"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="dsv3,qwen3,mixtral")
    ap.add_argument("--tokens", default="1,64,512,4096,16384")
    ap.add_argument("--routing", default="balanced,zipf")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--prebuild", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.prebuild:
        common.build_all(grouped_gemms(), "bench_moe")
        return
    import torch
    import torch.nn.functional as F

    gg_plain, gg_up = grouped_gemms()
    gg_plain.build()
    gg_up.build()
    rows = []
    hdr = f"{'model':8} {'tokens':>6} {'routing':9} {'rows':>7} | " + " ".join(
        f"{k:>16}" for k in ("grouped_mm", "grouped_mm+eager", "compile", "evtc_plain", "evtc")) + \
        " | vs eager  vs compile  /floor  plain/floor  err"
    print(hdr)
    for name in args.models.split(","):
        for tokens in map(int, args.tokens.split(",")):
            for skew in args.routing.split(","):
                r = row(torch, F, name, tokens, skew, gg_plain, gg_up, args.iters)
                rows.append(r)
                ms = r["ms"]
                print(f"{name:8} {tokens:6d} {skew:9} {r['rows']:7d} | " + " ".join(f"{ms[k]:16.4f}" for k in ms) +
                      f" | {r['evtc_vs_eager']:8.3f} {r['evtc_vs_compile']:10.3f} {r['evtc_vs_floor']:7.3f} "
                      f"{r['plain_vs_floor']:12.3f} {r['max_rel_err']:.1e}", flush=True)
    gm = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")  # noqa: E731
    big = [r for r in rows if r["tokens"] >= 512]
    summary = {"geomean_vs_eager": gm([r["evtc_vs_eager"] for r in rows]),
               "geomean_vs_compile": gm([r["evtc_vs_compile"] for r in rows]),
               "geomean_vs_floor_ge512": gm([r["evtc_vs_floor"] for r in big]),
               "geomean_plain_vs_floor_ge512": gm([r["plain_vs_floor"] for r in big]),
               "rows_vs_eager_ge_1.25": sum(r["evtc_vs_eager"] >= 1.25 for r in rows),
               "rows_vs_compile_ge_1.1": sum(r["evtc_vs_compile"] >= 1.1 for r in rows), "rows": len(rows)}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
