"""Is the conv mainloop the difference? The UNet's 1280-channel 3x3 fprop layers (bench_conv.py)
on evtc's conv kernels beside evtc's Gemm of the same implicit-GEMM shape (M = N*P*Q, N = K,
K = C*R*S; tiled TMA for A instead of im2col), each pinned to the same tile of the persistent
cooperative kernel, with cuDNN's conv and cuBLAS's mm of that shape, in one run (CUDA graphs).

On the GPU machine:

    python benchmarks/probe_conv_as_gemm.py --json $OUT/probe_conv_as_gemm.json

Measured on the H100 (2026-11-26, docs/performance.md, "It is not the im2col mainloop"): the conv
kernels run as fast as the GEMM kernels of their tile or faster, and both trail cuBLAS there.
"""

from __future__ import annotations

import argparse

import common

import evtc
from evtc import bf16

import bench_conv as BC

#: tile name -> the persistent cooperative kernel's CTA tile
TILES = {"128x160": (128, 160, 64), "128x256": (128, 256, 64), "128x128": (128, 128, 64)}
LAYERS = ("unet_3x3_1280_16", "unet_3x3_1280_8")


def kernels() -> tuple[dict, dict]:
    """(tile -> Gemm, tile -> Conv), each pinned to the tile."""
    gemms = {n: evtc.Gemm(BC.bias_silu, a=bf16, b=bf16, d=bf16,
                          config=evtc.GemmConfig(tile=t, cluster=(1, 1, 1), schedule="cooperative"))
             for n, t in TILES.items()}
    convs = {n: evtc.Conv(BC.bias_silu, kind="fprop", a=bf16, d=bf16, arch="sm90", layout="nchw",
                          config={"schedule": "cooperative", "tile": t}) for n, t in TILES.items()}
    return gemms, convs


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    from evtc.testing.bench import time_graphs

    gemms, convs = kernels()
    common.build_all(list(gemms.values()) + list(convs.values()), "probe_conv_as_gemm")
    cl = torch.channels_last
    rows = []
    for layer in (l for l in BC.UNET if l.name in LAYERS):
        x = torch.randn(layer.n, layer.c, layer.h, layer.w, device="cuda").to(torch.bfloat16).contiguous(memory_format=cl)
        w = (torch.randn(layer.k, layer.c, layer.r, layer.s, device="cuda") * 0.03).to(torch.bfloat16)
        w = w.contiguous(memory_format=cl)
        b = torch.randn(layer.k, device="cuda").to(torch.bfloat16)
        p, q = layer.out
        M, N, K = layer.n * p * q, layer.k, layer.c * layer.r * layer.s
        A = torch.randn(M, K, device="cuda").to(torch.bfloat16)
        B = (torch.randn(N, K, device="cuda") * 0.03).to(torch.bfloat16)
        y = torch.empty(layer.n, layer.k, p, q, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)
        D = torch.empty(M, N, device="cuda", dtype=torch.bfloat16)
        problem = evtc.ConvProblem(stride=layer.stride, padding=layer.pad)
        fns = {"cudnn_conv": lambda: F.conv2d(x, w, None, layer.stride, layer.pad),
               "cublas_mm": lambda: torch.mm(A, B.t())}
        for n in TILES:
            fns[f"conv_{n}"] = (lambda c=convs[n]: c(x, w, problem=problem, out=y, bias=b))
            fns[f"gemm_{n}"] = (lambda g=gemms[n]: g(A, B, out=D, bias=b))
        t = time_graphs(fns, args.iters)
        row = {"layer": layer.name, "gemm": [M, N, K], "us": {k: v * 1e3 for k, v in t.items()}}
        rows.append(row)
        print(f"{layer.name:18s} ({M}, {N}, {K})  " + "  ".join(f"{k} {v:.1f}" for k, v in row["us"].items()), flush=True)
    common.write_json(args.json, {"device": common.device_name(), "rows": rows})


if __name__ == "__main__":
    main()
