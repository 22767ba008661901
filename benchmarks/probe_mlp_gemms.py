"""bench_torch.py's two MLP GEMMs, fc1 (+ bias + exact GELU) and fc2 (+ bias + residual), on the
family's pick and on pinned configurations (128x224: 14336 output channels in 64 tiles), beside
cuBLAS's plain GEMM and bench_shapes.py's bias_relu at fc1's shape (what the GELU costs), timed
in CUDA graphs in one run (issue 13: where the block's time beyond cuBLAS goes).

On the GPU machine (builds its kernels first, in parallel):

    python benchmarks/probe_mlp_gemms.py --json $OUT/probe_mlp_gemms.json

Pinned configurations keep their default tile order (no ``fit_swizzle``): with a 2x1 cluster and
8-tile bands, an M of 8 tiles is scheduled as 16 (NOTE [Swizzle padding] in evtc/family/spec.py).
"""
import argparse
import sys

import bench_shapes
import bench_torch
import common
import torch

import evtc
from evtc import bf16
from evtc.bench import time_graphs
from evtc.testing import Problem, make_inputs, poisoned_outputs

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--iters", type=int, default=20)
ap.add_argument("--json")
args = ap.parse_args()
fc1, fc2 = bench_torch.gemms()
br = bench_shapes.gemms()["bias_relu"]
CFG = {
    "coop128x224_c2x1": evtc.GemmConfig(tile=(128, 224, 64), cluster=(2, 1, 1), schedule="cooperative"),
    "coop128x224": evtc.GemmConfig(tile=(128, 224, 64), cluster=(1, 1, 1), schedule="cooperative"),
    "coop128x256_c2x1": evtc.GemmConfig(tile=(128, 256, 64), cluster=(2, 1, 1), schedule="cooperative"),
    "pp128x192_c2x1": evtc.GemmConfig(tile=(128, 192, 64), cluster=(2, 1, 1), schedule="pingpong"),
    "coop256x128_c2x1": evtc.GemmConfig(tile=(256, 128, 64), cluster=(2, 1, 1), schedule="cooperative"),
}
pinned = {}
for gname, g in (("fc1", fc1), ("fc2", fc2), ("bias_relu", br)):
    for n, c in CFG.items():
        try:
            pinned[(gname, n)] = evtc.Gemm(g._traced, a=bf16, b=bf16, c=bf16, d=bf16, arch="sm90", config=c)
        except evtc.EvtcError as e:
            print("refused", gname, n, str(e).splitlines()[0], file=sys.stderr)
common.build_all(list(pinned.values()) + [fc1, fc2, br], "probe")
D, F = bench_torch.D_MODEL, bench_torch.FFN
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
