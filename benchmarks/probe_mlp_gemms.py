"""bench_torch.py's two MLP GEMMs, fc1 (+ bias + exact GELU) and fc2 (+ bias + residual), on the
family's pick and on pinned configurations (128x224: 14336 output channels in 64 tiles; 128x176,
cuBLAS's own fc1 tile at 1024 tokens: 82 tiles), beside cuBLAS's plain GEMM and bench_shapes.py's
bias_relu at fc1's shape (what the GELU costs), timed in CUDA graphs in one run (issue 13: where
the block's time beyond cuBLAS goes).

On the GPU machine (builds its kernels first, in parallel):

    python benchmarks/probe_mlp_gemms.py --json $OUT/probe_mlp_gemms.json

Pinned configurations keep their default tile order (no ``fit_swizzle``): with a 2x1 cluster and
8-tile bands, an M of 8 tiles is scheduled as 16 (NOTE [Swizzle padding] in evtc/family/spec.py);
the ``_sw0`` / ``_sw1`` columns set the band explicitly. ``--configs`` picks columns by name.

``--activations`` instead times fc1's shape (M x 14336 x 4096 + bias[n], M = 1024, 2048, 8192)
with four epilogues, bias only, + ReLU, + GELU's tanh approximation and + the exact GELU, on the
members ``--configs`` names (default ``pp64x256,pp128x192_c2x1``), twice: what each activation
costs on the same tile (NOTE [GELU without erff] in codegen_templates/include/evtc/functors.hpp).

``--profile`` instead runs the whole block (bench_torch.py's) under eager PyTorch, torch.compile
and the evtc backend at 1024, 2048 and 8192 tokens inside torch.profiler and prints each mode's
kernels with their device time per call: cuBLAS's kernel names (their tiles and clusters) and
what each mode spends beyond the two GEMMs.
"""
import argparse
import sys

import bench_shapes
import bench_torch
import common
import torch

import evtc
from evtc import bf16
from evtc.testing.bench import time_graphs
from evtc.testing import Problem, make_inputs, poisoned_outputs

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--iters", type=int, default=20)
ap.add_argument("--configs", help="comma-separated names of CFG to time (default: all)")
ap.add_argument("--profile", action="store_true", help="profile the whole block's kernels instead")
ap.add_argument("--activations", action="store_true", help="time fc1's shape with four epilogues instead")
ap.add_argument("--json")
args = ap.parse_args()
fc1, fc2 = bench_torch.gemms()
br = bench_shapes.gemms()["bias_relu"]
G = evtc.GemmConfig
CFG = {
    # cuBLAS's fc1 tile at 1024 tokens (14336 = 82 tiles of 176: 4.97 waves); one m64n176k16 WGMMA
    # a K step since NOTE [Extended WGMMA shapes] (evtc/emit/sm90.py), eleven m64n16k16 before
    "coop128x176": G(tile=(128, 176, 64), cluster=(1, 1, 1), schedule="cooperative", swizzle=0),
    "coop128x176_c1x2": G(tile=(128, 176, 64), cluster=(1, 2, 1), schedule="cooperative", swizzle=0),
    "pp128x176": G(tile=(128, 176, 64), cluster=(1, 1, 1), schedule="pingpong"),
    "pp128x176_c1x2": G(tile=(128, 176, 64), cluster=(1, 2, 1), schedule="pingpong"),
    "coop128x224_c2x1": G(tile=(128, 224, 64), cluster=(2, 1, 1), schedule="cooperative"),
    "coop128x224": G(tile=(128, 224, 64), cluster=(1, 1, 1), schedule="cooperative"),
    "coop128x256_c2x1": G(tile=(128, 256, 64), cluster=(2, 1, 1), schedule="cooperative"),
    "coop128x256_c2x1_sw0": G(tile=(128, 256, 64), cluster=(2, 1, 1), schedule="cooperative", swizzle=0),
    "coop128x256_c2x1_sw1": G(tile=(128, 256, 64), cluster=(2, 1, 1), schedule="cooperative", swizzle=1),
    "coop128x256_c1x2": G(tile=(128, 256, 64), cluster=(1, 2, 1), schedule="cooperative", swizzle=0),
    "coop256x128_c2x1": G(tile=(256, 128, 64), cluster=(2, 1, 1), schedule="cooperative"),
    "coop256x128_c1x2": G(tile=(256, 128, 64), cluster=(1, 2, 1), schedule="cooperative", swizzle=0),
    "pp128x192_c2x1": G(tile=(128, 192, 64), cluster=(2, 1, 1), schedule="pingpong"),
    "pp128x192_c2x1_sw0": G(tile=(128, 192, 64), cluster=(2, 1, 1), schedule="pingpong", swizzle=0),
    "pp128x192_c1x2": G(tile=(128, 192, 64), cluster=(1, 2, 1), schedule="pingpong"),
    "pp128x128_c2x1": G(tile=(128, 128, 64), cluster=(2, 1, 1), schedule="pingpong"),
    "pp128x128_c1x2": G(tile=(128, 128, 64), cluster=(1, 2, 1), schedule="pingpong"),
    "pp64x256": G(tile=(64, 256, 64), cluster=(1, 1, 1), schedule="pingpong"),
    "pp64x256_c2x1": G(tile=(64, 256, 64), cluster=(2, 1, 1), schedule="pingpong"),
    "sk128x256_c2x1": G(tile=(128, 256, 64), cluster=(2, 1, 1), scheduler="streamk", decomposition="stream_k"),
    "sk128x256_c1x1": G(tile=(128, 256, 64), cluster=(1, 1, 1), scheduler="streamk", decomposition="stream_k"),
    "sk128x192_c2x1": G(tile=(128, 192, 64), cluster=(2, 1, 1), scheduler="streamk", decomposition="stream_k"),
}
D, F = bench_torch.D_MODEL, bench_torch.FFN


def profile() -> None:
    """Each mode's kernels, device time per block call (torch.profiler over 10 calls)."""
    import torch._dynamo
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as torch_profile

    from evtc.torch.backend import make_backend

    common.build_all([fc1, fc2], "profile")
    torch._dynamo.config.cache_size_limit = 64
    model = bench_torch.block()
    modes = {"eager": model, "default": torch.compile(model, dynamic=False),
             "evtc": torch.compile(model, backend=make_backend(), dynamic=False)}
    out = {}
    for T in (1024, 2048, 8192):
        x = torch.randn(T, D, device="cuda", dtype=torch.bfloat16)
        with torch.inference_mode():
            for name, fn in modes.items():
                for _ in range(3):
                    fn(x)
                torch.cuda.synchronize()
                with torch_profile(activities=[ProfilerActivity.CUDA]) as prof:
                    for _ in range(10):
                        fn(x)
                    torch.cuda.synchronize()
                ks = sorted((((getattr(e, "device_time_total", 0) or getattr(e, "cuda_time_total", 0)) / 10, e.count / 10,
                              e.key) for e in prof.key_averages()
                             if e.device_type == torch.autograd.DeviceType.CUDA and e.count > 0), reverse=True)
                print(f"T={T} {name}: {sum(k[0] for k in ks):.1f} us per call", flush=True)
                for us, count, key in ks[:8]:
                    print(f"    {us:8.1f} us x{count:.1f}  {key[:150]}", flush=True)
                out[f"{T}_{name}"] = [{"us": us, "count": c, "kernel": k} for us, c, k in ks]
    common.write_json(args.json, {"device": common.device_name(), "profile": out})


@evtc.epilogue
def fc1_bias(acc, bias: evtc.RowVector[bf16]):
    return acc + bias


@evtc.epilogue
def fc1_relu(acc, bias: evtc.RowVector[bf16]):
    return evtc.relu(acc + bias)


@evtc.epilogue
def fc1_gelu_tanh(acc, bias: evtc.RowVector[bf16]):
    return evtc.gelu_tanh(acc + bias)


@evtc.epilogue
def fc1_gelu(acc, bias: evtc.RowVector[bf16]):
    return evtc.gelu(acc + bias)


def activations() -> None:
    """fc1's shape with four epilogues on pinned members, CUDA graphs, / cuBLAS, two runs."""
    names = args.configs.split(",") if args.configs else ["pp64x256", "pp128x192_c2x1"]
    unknown = sorted(set(names) - set(CFG))
    if unknown:
        raise SystemExit(f"unknown --configs {unknown}; known: {', '.join(CFG)}")
    eps = {"bias": fc1_bias, "relu": fc1_relu, "gelu_tanh": fc1_gelu_tanh, "gelu": fc1_gelu}
    pinned = {(e, n): evtc.Gemm(ep, a=bf16, b=bf16, d=bf16, arch="sm90", config=CFG[n])
              for e, ep in eps.items() for n in names}
    common.build_all(list(pinned.values()), "activations")
    rows = []
    for M in (1024, 2048, 8192):
        p = Problem(M, F, D, 1)
        fns, keep = {}, []
        A = B = None
        for (e, n), g in pinned.items():
            ins = make_inputs(g.graph, bf16, bf16, p, seed=M)  # the same seed: the same A, B, bias
            outs = poisoned_outputs(g.graph, p)
            A, B = (ins["A"], ins["B"]) if A is None else (A, B)
            keep.append(outs)
            fns[f"{e}:{n}"] = (lambda g=g, outs=outs, bias=ins["bias"]: g(A, B, out=outs, bias=bias))
        Bt, plain = B.transpose(-1, -2), torch.empty(M, F, dtype=A.dtype, device=A.device)
        fns["cublas"] = lambda: torch.matmul(A, Bt, out=plain)
        runs = [time_graphs(fns, args.iters) for _ in range(2)]
        cub = [t["cublas"] for t in runs]
        print(f"fc1 shape {M}x{F}x{D} cuBLAS {cub[0] * 1e3:7.1f} us " + " ".join(
            f"{k}={runs[0][k] / cub[0]:.3f}/{runs[1][k] / cub[1]:.3f}" for k in fns if k != "cublas"), flush=True)
        rows.append({"shape": [M, F, D], "runs_ms": runs})
    common.write_json(args.json, {"device": common.device_name(), "activations": rows})


if args.profile:
    profile()
    raise SystemExit(0)
if args.activations:
    activations()
    raise SystemExit(0)
if args.configs:
    CFG = {k: v for k, v in CFG.items() if k in args.configs.split(",")}
pinned = {}
for gname, g in (("fc1", fc1), ("fc2", fc2), ("bias_relu", br)):
    for n, c in CFG.items():
        try:
            pinned[(gname, n)] = evtc.Gemm(g.pipeline.traced, a=bf16, b=bf16, c=bf16, d=bf16, arch="sm90", config=c)
        except evtc.EvtcError as e:
            print("refused", gname, n, str(e).splitlines()[0], file=sys.stderr)
common.build_all(list(pinned.values()) + [fc1, fc2, br], "probe")
rows = []
for gname, g, (M, N, K) in [("fc1", fc1, (1024, F, D)), ("bias_relu", br, (1024, F, D)), ("fc1", fc1, (2048, F, D)),
                             ("bias_relu", br, (2048, F, D)), ("fc1", fc1, (8192, F, D)), ("fc2", fc2, (8192, D, F)),
                             ("fc2", fc2, (1024, D, F)), ("fc2", fc2, (2048, D, F))]:
    p = Problem(M, N, K, 1)
    ins = make_inputs(g.graph, bf16, bf16, p, seed=M + N)
    outs = poisoned_outputs(g.graph, p)
    A, B = ins["A"], ins["B"]
    kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
    Bt = B.transpose(-1, -2)
    plain = torch.empty(M, N, dtype=A.dtype, device=A.device)
    fns = {"cublas": lambda: torch.matmul(A, Bt, out=plain), "heuristic": lambda: g(A, B, out=outs, **kw)}
    for (gn, n), gv in pinned.items():
        if gn == gname:
            fns[n] = (lambda gv=gv: gv(A, B, out=outs, **kw))
    t = time_graphs(fns, args.iters)
    cub = t["cublas"]
    pick = g.choose(M, N, K, 1).name
    print(f"{gname:9s} {M}x{N}x{K} cuBLAS {cub*1e3:7.1f} us heuristic({pick}) {t['heuristic']/cub:.3f} "
          + " ".join(f"{k}={v/cub:.3f}" for k, v in sorted(t.items(), key=lambda x: x[1]) if k not in ("cublas", "heuristic")), flush=True)
    rows.append({"gemm": gname, "shape": [M, N, K], "pick": pick, "us": {k: v * 1e3 for k, v in t.items()}})
common.write_json(args.json, {"device": common.device_name(), "rows": rows})
