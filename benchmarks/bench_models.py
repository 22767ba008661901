"""Issue 38's model zoo benchmark: the blocks of tests/torch_zoo.py at their models' real widths
under eager PyTorch, torch.compile (default, and max-autotune with ``--autotune``) and
``torch.compile(backend="evtc")``, in one run, inference (bf16, ``torch.no_grad()``).

    python benchmarks/bench_models.py --json $OUT/models.json [--blocks llama,gpt2] [--tokens 1,128,1024,4096]

Per block and token count: each mode compiled with static shapes, its output compared with
eager's (max relative error), the evtc backend's fused-match count, the compile time, then the
time per call back to back (:func:`evtc.testing.bench.time_interleaved`) and in CUDA graphs
(:func:`evtc.testing.bench.time_graphs`), modes in alternation; ratios to torch.compile default. The
evtc backend builds the kernels its matches need the first time a shape is compiled (minutes
each, once per machine: the kernel cache); run once to build, again to time.
"""

from __future__ import annotations

import argparse
import math
import time

import common  # noqa: F401  (sets sys.path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", help="comma-separated zoo names (default: all)")
    ap.add_argument("--tokens", default="1,128,1024,4096")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--autotune", action="store_true", help="also torch.compile(mode='max-autotune')")
    ap.add_argument("--json")
    args = ap.parse_args()
    import sys

    import torch

    sys.path.insert(0, str(common.ROOT / "tests"))
    import torch_zoo as Z

    from evtc.testing.bench import time_graphs, time_interleaved
    from evtc.torch.backend import make_backend

    names = args.blocks.split(",") if args.blocks else list(Z.ZOO)
    rows = []
    for name in names:
        d, ffn = Z.REAL[name]
        for tokens in (int(t) for t in args.tokens.split(",")):
            block, inputs = Z.make(name, d, ffn, tokens, device="cuda")
            block.eval()
            modes = {"eager": block}
            t_compile = {}
            fused = None
            for mode in ("default", "max-autotune", "evtc"):
                if mode == "max-autotune" and not args.autotune:
                    continue
                torch._dynamo.reset()
                if mode == "evtc":
                    be = make_backend()
                    fn = torch.compile(block, backend=be)
                else:
                    fn = torch.compile(block, mode=mode)
                t0 = time.perf_counter()
                with torch.no_grad():
                    fn(*inputs)
                torch.cuda.synchronize()
                t_compile[mode] = time.perf_counter() - t0
                if mode == "evtc":
                    fused = be.fused
                modes[mode] = fn
            with torch.no_grad():
                ref = block(*inputs).float()
                err = {m: ((f(*inputs).float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item()
                       for m, f in modes.items()}
                calls = {m: (lambda f=f: f(*inputs)) for m, f in modes.items()}
                b2b = time_interleaved(calls, args.iters)
                graphs = time_graphs(calls, args.iters)
            row = {"block": name, "tokens": tokens, "d": d, "ffn": ffn, "fused": fused, "max_rel_err": err,
                   "compile_s": t_compile, "ms": b2b, "graph_ms": graphs,
                   "evtc_over_default": b2b["evtc"] / b2b["default"],
                   "graph_evtc_over_default": graphs["evtc"] / graphs["default"]}
            rows.append(row)
            print(f"{name:15s} {tokens:5d}  fused {fused}  evtc/compile {row['evtc_over_default']:.3f} "
                  f"(graphs {row['graph_evtc_over_default']:.3f})  eager/compile {b2b['eager'] / b2b['default']:.3f}  "
                  f"err evtc {err['evtc']:.2e}  compile {t_compile.get('evtc', 0):.1f} s", flush=True)
            common.write_json(args.json, {"device": common.device_name(), "rows": rows})
    big = [r for r in rows if r["tokens"] >= 1024]
    for key in ("evtc_over_default", "graph_evtc_over_default"):
        if big:
            gm = math.exp(sum(math.log(r[key]) for r in big) / len(big))
            print(f"geomean {key} at >= 1024 tokens: {gm:.3f} ({len(big)} rows)")


if __name__ == "__main__":
    main()
