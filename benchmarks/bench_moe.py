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
  ``silu(gate) * acc`` fused (two grouped launches);
* ``evtc_glu``: SwiGLU in one grouped GEMM (``evtc.glu``, docs/gated.md) over each expert's
  [W_gate; W_up] with the rows interleaved (``evtc.interleave_gate_up``, made once), N / 2 stored.

``--graphs 1,64``: those token counts are also timed with each mode captured in a CUDA graph
(:func:`evtc.runtime.timing.time_graphs`: device time alone, as a served decode step runs).
``--members``: every family member of both grouped GEMMs is timed too (the data for
:func:`evtc.grouped.choose_member`).

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
import evtc.grouped
from evtc.grouped import GROUPED_MEMBERS, GroupedGemm

MODELS = {"dsv3": (256, 8, 7168, 2048), "qwen3": (128, 8, 2048, 768), "mixtral": (8, 2, 4096, 14336)}


@evtc.epilogue
def bare(acc):
    return acc


@evtc.epilogue
def swiglu_up(acc, gate: evtc.Matrix):
    return evtc.silu(gate) * acc


@evtc.epilogue
def swiglu(acc):
    return evtc.glu(acc, act="silu")


def grouped_gemms() -> list[GroupedGemm]:
    """The kernels this benchmark runs (every member of both epilogues; the same sources as
    tests/gpu/test_grouped_gpu.py's ``bare`` and ``swiglu_up``, so one build serves both)."""
    return [GroupedGemm(bare), GroupedGemm(swiglu_up), GroupedGemm(swiglu)]


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


def swiglu_ref(A, WguT, offs, inter: int):
    """``_grouped_mm`` on [W_gate; W_up], then SwiGLU eagerly (what ``compile`` compiles)."""
    import torch
    import torch.nn.functional as F

    y = torch._grouped_mm(A, WguT, offs=offs)
    return F.silu(y[:, :inter]) * y[:, inter:]


_WEIGHTS: dict = {}


def weights(torch, name):
    """(W_gate, W_up, [W_gate; W_up], its (E, H, 2I) transposed view, the rows of W_gate and W_up
    interleaved (E, 2I, H)) of a model, made once."""
    if name not in _WEIGHTS:
        _WEIGHTS.clear()
        E, _, H, inter = MODELS[name]
        g = torch.Generator(device="cuda").manual_seed(1)
        Wgu = torch.empty(E, 2 * inter, H, device="cuda", dtype=torch.bfloat16)
        for e in range(E):  # expert by expert: no float32 copy of the whole weight
            Wgu[e] = (torch.randn(2 * inter, H, generator=g, device="cuda") / math.sqrt(H)).to(torch.bfloat16)
        _WEIGHTS[name] = (Wgu[:, :inter], Wgu[:, inter:], Wgu, Wgu.transpose(1, 2),
                          evtc.interleave_gate_up(Wgu[:, :inter], Wgu[:, inter:]))
    return _WEIGHTS[name]


def row(torch, compiled, name, tokens, skew, gg_plain, gg_up, gg_glu, iters, members=(), graphs=False):
    from evtc.runtime.timing import time_graphs, time_interleaved

    E, topk, H, inter = MODELS[name]
    gen = torch.Generator().manual_seed(tokens * 7 + len(skew))
    counts = routing(torch, tokens, E, topk, skew, gen)
    T = sum(counts)
    g = torch.Generator(device="cuda").manual_seed(tokens)
    A = (torch.randn(T, H, generator=g, device="cuda") / 4).to(torch.bfloat16)
    Wg, Wu, Wgu, WguT, Wil = weights(torch, name)  # Wg, Wu: (E, I, H) views with K contiguous
    offs = torch.tensor(counts, dtype=torch.int32).cumsum(0).to(torch.int32).to("cuda")

    def eager():
        return swiglu_ref(A, WguT, offs, inter)

    def evtc_swiglu():
        gate = gg_plain(A, Wg, offs)
        return gg_up(A, Wu, offs, gate=gate)

    want = eager()
    got = evtc_swiglu()
    got_glu = gg_glu(A, Wil, offs)
    compiled(A, WguT, offs, inter)
    torch.cuda.synchronize()
    scale = want.float().abs().max().clamp_min(1e-30)
    err = ((got.float() - want.float()).abs().max() / scale).item()
    err_glu = ((got_glu.float() - want.float()).abs().max() / scale).item()
    fns = {"grouped_mm": lambda: torch._grouped_mm(A, WguT, offs=offs), "grouped_mm+eager": eager,
           "compile": lambda: compiled(A, WguT, offs, inter), "evtc_plain": lambda: gg_plain(A, Wgu, offs),
           "evtc": evtc_swiglu, "evtc_glu": lambda: gg_glu(A, Wil, offs)}
    ms = time_interleaved(fns, iters=iters, warmup_ms=100.0)
    flops = 2.0 * T * H * 2 * inter
    extra = {}
    if members:  # every member of both grouped GEMMs, for the family rule
        sweep = {}
        for m in members:
            sweep[f"plain:{m}"] = lambda m=m: gg_plain(A, Wgu, offs, member=m)
            sweep[f"evtc:{m}"] = lambda m=m: gg_up(A, Wu, offs, member=m, gate=gg_plain(A, Wg, offs, member=m))
            sweep[f"glu:{m}"] = lambda m=m: gg_glu(A, Wil, offs, member=m)
        extra["members_ms"] = time_interleaved(sweep, iters=max(3, iters // 2), warmup_ms=50.0)
        extra["chosen"] = evtc.grouped.choose_member(T, E, 2 * inter)
    if graphs:  # device time alone, each mode captured in a CUDA graph (a decode step as served)
        extra["graph_ms"] = time_graphs(fns, iters=max(5, iters), calls=5)
    return {"model": name, "tokens": tokens, "routing": skew, "rows": T, "max_rel_err": err,
            "max_rel_err_glu": err_glu, "ms": ms, **extra,
            "glu_vs_eager": ms["grouped_mm+eager"] / ms["evtc_glu"], "glu_vs_compile": ms["compile"] / ms["evtc_glu"],
            "glu_vs_floor": ms["evtc_glu"] / ms["grouped_mm"],
            "tflops": {k: flops / (v * 1e-3) / 1e12 for k, v in ms.items()},
            "evtc_vs_eager": ms["grouped_mm+eager"] / ms["evtc"], "evtc_vs_compile": ms["compile"] / ms["evtc"],
            "evtc_vs_floor": ms["evtc"] / ms["grouped_mm"], "plain_vs_floor": ms["evtc_plain"] / ms["grouped_mm"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", default="dsv3,qwen3,mixtral")
    ap.add_argument("--tokens", default="1,64,512,4096,16384")
    ap.add_argument("--routing", default="balanced,zipf")
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--members", action="store_true", help="also time every family member (the family rule's data)")
    ap.add_argument("--graphs", default="1,64", help="token counts also timed inside CUDA graphs (device time)")
    ap.add_argument("--prebuild", action="store_true")
    ap.add_argument("--json")
    args = ap.parse_args()
    if args.prebuild:
        common.build_all(grouped_gemms(), "bench_moe")
        return
    import torch

    compiled = torch.compile(swiglu_ref, dynamic=True)
    gg_plain, gg_up, gg_glu = grouped_gemms()
    gg_plain.build()
    gg_up.build()
    gg_glu.build()
    rows = []
    hdr = f"{'model':8} {'tokens':>6} {'routing':9} {'rows':>7} | " + " ".join(
        f"{k:>16}" for k in ("grouped_mm", "grouped_mm+eager", "compile", "evtc_plain", "evtc", "evtc_glu")) + \
        " | vs eager  vs compile  /floor  plain/floor  err | glu: vs eager  vs compile  /floor  err"
    print(hdr)
    for name in args.models.split(","):
        for tokens in map(int, args.tokens.split(",")):
            for skew in args.routing.split(","):
                try:
                    r = row(torch, compiled, name, tokens, skew, gg_plain, gg_up, gg_glu, args.iters,
                            members=list(GROUPED_MEMBERS) if args.members else (),
                            graphs=str(tokens) in args.graphs.split(","))
                except Exception as e:  # a failed row is reported, the others still run
                    print(f"{name:8} {tokens:6d} {skew:9} FAILED: {type(e).__name__}: {e}", flush=True)
                    continue
                rows.append(r)
                ms = r["ms"]
                print(f"{name:8} {tokens:6d} {skew:9} {r['rows']:7d} | " + " ".join(f"{ms[k]:16.4f}" for k in ms) +
                      f" | {r['evtc_vs_eager']:8.3f} {r['evtc_vs_compile']:10.3f} {r['evtc_vs_floor']:7.3f} "
                      f"{r['plain_vs_floor']:12.3f} {r['max_rel_err']:.1e} | {r['glu_vs_eager']:8.3f} "
                      f"{r['glu_vs_compile']:10.3f} {r['glu_vs_floor']:7.3f} {r['max_rel_err_glu']:.1e}", flush=True)
                if "graph_ms" in r:
                    g = r["graph_ms"]
                    print(f"{'':8} {'':6} {'graphs':9} {'':7} | " + " ".join(f"{g[k]:16.4f}" for k in g) +
                          f" | {g['grouped_mm+eager'] / g['evtc']:8.3f} {g['compile'] / g['evtc']:10.3f} "
                          f"{g['evtc'] / g['grouped_mm']:7.3f} {g['evtc_plain'] / g['grouped_mm']:12.3f} | "
                          f"{g['grouped_mm+eager'] / g['evtc_glu']:8.3f} {g['compile'] / g['evtc_glu']:10.3f} "
                          f"{g['evtc_glu'] / g['grouped_mm']:7.3f}", flush=True)
                if "members_ms" in r:
                    mm = r["members_ms"]
                    print(f"{'':8} {'':6} {'members':9} {'':7} | chosen {r['chosen']}: " +
                          "  ".join(f"{k} {v:.4f}" for k, v in mm.items()), flush=True)
    gm = lambda xs: math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")  # noqa: E731
    big = [r for r in rows if r["tokens"] >= 512]
    summary = {"geomean_vs_eager": gm([r["evtc_vs_eager"] for r in rows]),
               "geomean_vs_compile": gm([r["evtc_vs_compile"] for r in rows]),
               "geomean_vs_floor_ge512": gm([r["evtc_vs_floor"] for r in big]),
               "geomean_plain_vs_floor_ge512": gm([r["plain_vs_floor"] for r in big]),
               "rows_vs_eager_ge_1.25": sum(r["evtc_vs_eager"] >= 1.25 for r in rows),
               "rows_vs_compile_ge_1.1": sum(r["evtc_vs_compile"] >= 1.1 for r in rows), "rows": len(rows),
               "glu_geomean_vs_eager": gm([r["glu_vs_eager"] for r in rows]),
               "glu_geomean_vs_compile": gm([r["glu_vs_compile"] for r in rows]),
               "glu_geomean_vs_floor_ge512": gm([r["glu_vs_floor"] for r in big]),
               "glu_rows_vs_eager_ge_1.25": sum(r["glu_vs_eager"] >= 1.25 for r in rows),
               "glu_rows_vs_compile_ge_1.1": sum(r["glu_vs_compile"] >= 1.1 for r in rows),
               "glu_rows_floor_le_1.10_ge512": sum(r["glu_vs_floor"] <= 1.10 for r in big)}
    print(json.dumps(summary, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "rows": rows, "summary": summary}, f, indent=1)


if __name__ == "__main__":
    sys.exit(main())
