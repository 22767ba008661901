"""Informational benchmark: bias_relu lowered for sm80 (CUTLASS 2.x visitors, run through the
driver's PTX JIT on Hopper) against the same epilogue lowered for sm90 (TMA warp-specialized), at
4096^3, bf16, default configurations, both schedulers of sm80.

Not a test (pytest does not collect it). On the GPU machine:

    python tests/gpu/bench_sm80_vs_sm90.py [--iters 50]

Prints a table and writes ``$OUT/bench_sm80_vs_sm90.json`` (``./`` when ``OUT`` is unset): the
median time of each kernel in ms (CUDA events, interleaved runs after a warm-up, fresh random
inputs, preallocated outputs), its TFLOP/s and its time relative to sm90.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path[:0] = [str(ROOT), str(ROOT / "examples")]

import evtc  # noqa: E402
from evtc import bf16  # noqa: E402
from evtc.plan import default_config  # noqa: E402

M = N = K = 4096


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=50)
    args = ap.parse_args()

    import torch

    import epilogues as E
    from evtc.testing.bench import time_interleaved
    from evtc.compiler import build_many
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    cfg80 = default_config("sm80", bf16, bf16)
    gemms = {
        "sm90": evtc.Gemm(E.bias_relu, a=bf16, b=bf16, c=bf16, d=bf16, arch="sm90"),
        "sm80": evtc.Gemm(E.bias_relu, a=bf16, b=bf16, c=bf16, d=bf16, arch="sm80", config=cfg80),
        "sm80 stream-K": evtc.Gemm(E.bias_relu, a=bf16, b=bf16, c=bf16, d=bf16, arch="sm80",
                                   config=cfg80.replace(scheduler="streamk")),
    }
    for r in build_many([(g.source, g.target, g.name) for g in gemms.values()]):
        if isinstance(r, Exception):
            raise r
    p = Problem(M, N, K)
    ins = make_inputs(gemms["sm90"].graph, bf16, bf16, p, seed=0)
    A, B = ins.pop("A"), ins.pop("B")
    outs = {name: poisoned_outputs(g.graph, p) for name, g in gemms.items()}
    fns = {name: (lambda g=g, o=outs[name]: g(A, B, out=o, **ins)) for name, g in gemms.items()}
    for f in fns.values():
        f()
    torch.cuda.synchronize()
    d90 = outs["sm90"]["D"].float()
    agree = {name: float((o["D"].float() - d90).abs().max()) for name, o in outs.items()}
    times = time_interleaved(fns, iters=args.iters)

    flops = 2.0 * M * N * K
    rows = []
    for name, g in gemms.items():
        ms = times[name]
        rows.append({"kernel": name, "arch": g.arch, "config": g.config.name, "ms": ms, "tflops": flops / ms / 1e9,
                     "vs_sm90": ms / times["sm90"], "max_abs_diff_vs_sm90": agree[name]})
    print(f"bias_relu, bf16, M=N=K={M}, {torch.cuda.get_device_name()}")
    print(f"{'kernel':<15}{'config':<34}{'ms':>9}{'TFLOP/s':>10}{'vs sm90':>9}{'max|D-D90|':>12}")
    for r in rows:
        print(f"{r['kernel']:<15}{r['config']:<34}{r['ms']:>9.3f}{r['tflops']:>10.1f}{r['vs_sm90']:>9.2f}"
              f"{r['max_abs_diff_vs_sm90']:>12.3g}")
    out = Path(os.environ.get("OUT", ".")) / "bench_sm80_vs_sm90.json"
    out.write_text(json.dumps({"problem": [M, N, K], "dtype": "bf16", "device": torch.cuda.get_device_name(),
                               "iters": args.iters, "rows": rows}, indent=2))
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
