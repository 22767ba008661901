"""The staging route's copy of a packed M x N tensor into rows padded to 16 bytes (NOTE [Pitched
copies for staging], evtc/runtime/pitched_copy.py): torch's ``copy_`` against evtc's pitched
``cudaMemcpy2DAsync``, with a contiguous ``copy_`` of the same bytes for scale, in one run.

    python benchmarks/bench_staging_copy.py --json $OUT/staging_copy.json

Prints us per copy and TB/s (bytes read + written), median of ``--iters`` timed with CUDA events.
"""

from __future__ import annotations

import argparse

import common
import torch

from evtc.runtime.pitched_copy import copy_rows
from evtc.runtime.staging import padded_row


def timed(fn, iters: int) -> float:
    for _ in range(3):
        fn()
    times = []
    for _ in range(iters):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        fn()
        e.record()
        e.synchronize()
        times.append(s.elapsed_time(e) * 1e3)
    return sorted(times)[len(times) // 2]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x50257,2048x32001,8192x50257")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    for text in args.shapes.split(","):
        M, N = (int(x) for x in text.split("x"))
        src = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        Np = padded_row(N, 2)
        dst = torch.empty(M * Np, device="cuda", dtype=torch.bfloat16).as_strided((M, N), (Np, 1))
        packed = torch.empty_like(src)
        assert copy_rows(dst, src), "the pitched copy did not apply"
        torch.cuda.synchronize()
        assert torch.equal(dst, src)
        moved = 2 * src.numel() * src.element_size()
        r = {"shape": text, "copy_us": timed(lambda: dst.copy_(src), args.iters),
             "pitched_us": timed(lambda: copy_rows(dst, src), args.iters),
             "contiguous_us": timed(lambda: packed.copy_(src), args.iters)}
        for k in ("copy", "pitched", "contiguous"):
            r[f"{k}_tb_s"] = moved / r[f"{k}_us"] / 1e6
        r["pitched_over_copy"] = r["pitched_us"] / r["copy_us"]
        rows.append(r)
        print(f"{text:>12s}  copy_ {r['copy_us']:7.1f} us ({r['copy_tb_s']:.2f} TB/s)  pitched {r['pitched_us']:7.1f} us "
              f"({r['pitched_tb_s']:.2f} TB/s)  contiguous {r['contiguous_us']:7.1f} us ({r['contiguous_tb_s']:.2f} TB/s)"
              f"  pitched/copy_ {r['pitched_over_copy']:.3f}")
    common.write_json(args.json, {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
