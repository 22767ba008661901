"""Where a training step's time goes: torch.profiler's CUDA kernel table of one training step
(forward and backward) of a zoo MLP block under torch.compile default and the evtc backend, side
by side (issue 38: the step is slower under evtc; this says which kernels).

    python benchmarks/profile_train.py --blocks llama [--tokens 4096] [--rows 25]
"""

from __future__ import annotations

import argparse
import math
import sys

import common


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="llama")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--rows", type=int, default=25)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--ops", action="store_true", help="also each op's CUDA time (evtc's fused ops, aten's mm)")
    args = ap.parse_args()
    import torch
    from torch.profiler import ProfilerActivity, profile

    sys.path.insert(0, str(common.ROOT / "tests"))
    import torch_zoo as Z
    from bench_train import _step
    from evtc.torch.backend import make_backend

    for name in args.blocks.split(","):
        d, ffn = Z.REAL[name]
        block, inputs = Z.make(name, d, ffn, args.tokens, device="cuda")
        block.train()
        loss_w = torch.randn(inputs[0].shape, device="cuda") / math.sqrt(inputs[0].numel())
        for mode in ("default", "evtc"):
            torch._dynamo.reset()
            fn = torch.compile(block, backend=make_backend()) if mode == "evtc" else torch.compile(block)
            step = _step(fn, block, inputs, loss_w)
            for _ in range(3):
                step()
            torch.cuda.synchronize()
            acts = [ProfilerActivity.CUDA] + ([ProfilerActivity.CPU] if args.ops else [])
            with profile(activities=acts) as prof:
                for _ in range(args.steps):
                    step()
                torch.cuda.synchronize()
            print(f"== {name} {args.tokens} tokens, {mode}: CUDA time per step, {args.steps} steps", flush=True)
            print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=args.rows, max_name_column_width=90),
                  flush=True)
            if args.ops:
                for e in sorted(prof.key_averages(), key=lambda e: -e.device_time_total):
                    if e.key.startswith("evtc::") or e.key in ("aten::mm", "aten::addmm", "aten::bmm"):
                        print(f"  op {e.key:60s} calls {e.count // args.steps:3d}  CUDA us/step "
                              f"{e.device_time_total / args.steps:9.1f}", flush=True)


if __name__ == "__main__":
    main()
