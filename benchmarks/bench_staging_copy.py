"""The staging route's copy of a packed M x N tensor into rows padded to 16 bytes (NOTE [Pitched
copies for staging] and NOTE [Copy kernels for staging], evtc/runtime/pitched_copy.py): torch's
``copy_``, ``cudaMemcpy2DAsync`` and evtc's copy kernel (registered by loading bias_relu's
primary sm90 kernel, built if the cache lacks it), with a contiguous ``copy_`` of the same bytes
for scale, in one run.

    python benchmarks/bench_staging_copy.py --json $OUT/staging_copy.json

Prints us per copy and TB/s (bytes read + written): the median of ``--iters`` copies timed back to
back between two CUDA events (no host time in them).
"""

from __future__ import annotations

import argparse

import common
import torch

from evtc.runtime.pitched_copy import copy_rows
from evtc.dispatch.staging import padded_row


def timed(fn, iters: int) -> float:
    """us per call of ``iters`` calls back to back (median of three such batches)."""
    for _ in range(3):
        fn()
    batches = []
    for _ in range(3):
        s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        s.record()
        for _ in range(iters):
            fn()
        e.record()
        e.synchronize()
        batches.append(s.elapsed_time(e) * 1e3 / iters)
    return sorted(batches)[1]


def register_kernel():
    """Load an sm90 kernel library, which registers its evtc_copy_rows; the registered function."""
    import epilogues as E

    import evtc
    from evtc import bf16
    from evtc.runtime import pitched_copy

    evtc.Gemm(E.bias_relu, a=bf16, b=bf16, c=bf16, d=bf16, arch="sm90").library
    return pitched_copy._COPY_KERNEL[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shapes", default="4096x50257,2048x32001,8192x50257")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    from evtc.runtime import pitched_copy

    kernel = register_kernel()
    rows = []
    for text in args.shapes.split(","):
        M, N = (int(x) for x in text.split("x"))
        src = torch.randn(M, N, device="cuda", dtype=torch.bfloat16)
        Np = padded_row(N, 2)
        dst = torch.empty(M * Np, device="cuda", dtype=torch.bfloat16).as_strided((M, N), (Np, 1))
        packed = torch.empty_like(src)
        moved = 2 * src.numel() * src.element_size()
        r = {"shape": text, "copy_us": timed(lambda: dst.copy_(src), args.iters),
             "contiguous_us": timed(lambda: packed.copy_(src), args.iters)}
        for way, fn in (("pitched", None), ("kernel", kernel)):
            pitched_copy._COPY_KERNEL[0] = fn
            dst.fill_(float("nan"))
            before = dict(pitched_copy.COUNTS)
            assert copy_rows(dst, src), f"the {way} copy did not apply"
            torch.cuda.synchronize()
            assert torch.equal(dst, src) and pitched_copy.COUNTS[{"pitched": "memcpy2d"}.get(way, way)] == \
                before[{"pitched": "memcpy2d"}.get(way, way)] + 1
            r[f"{way}_us"] = timed(lambda: copy_rows(dst, src), args.iters)
        pitched_copy._COPY_KERNEL[0] = kernel
        for k in ("copy", "pitched", "kernel", "contiguous"):
            r[f"{k}_tb_s"] = moved / r[f"{k}_us"] / 1e6
        r["pitched_over_copy"] = r["pitched_us"] / r["copy_us"]
        r["kernel_over_pitched"] = r["kernel_us"] / r["pitched_us"]
        rows.append(r)
        print(f"{text:>12s}  copy_ {r['copy_us']:7.1f} us ({r['copy_tb_s']:.2f} TB/s)  pitched {r['pitched_us']:7.1f} us "
              f"({r['pitched_tb_s']:.2f} TB/s)  kernel {r['kernel_us']:7.1f} us ({r['kernel_tb_s']:.2f} TB/s)  "
              f"contiguous {r['contiguous_us']:7.1f} us ({r['contiguous_tb_s']:.2f} TB/s)  "
              f"kernel/pitched {r['kernel_over_pitched']:.3f}")
    common.write_json(args.json, {"device": torch.cuda.get_device_name(), "rows": rows})


if __name__ == "__main__":
    main()
