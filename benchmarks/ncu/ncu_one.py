"""One epilogue's `large` member at M x N x K (default 16384x4096x1024): 3 warm-up launches, then
the launch ncu profiles (run under ncu with --launch-skip 3 --launch-count 1)."""
import sys

import torch

import os
sys.path.insert(0, os.path.join(os.getcwd(), "examples"))
sys.path.insert(0, os.path.join(os.getcwd(), "benchmarks"))
import common  # noqa: F401,E402
import bench_shapes  # noqa: E402
import evtc  # noqa: E402
from evtc import bf16  # noqa: E402
from evtc.testing import Problem, make_inputs, poisoned_outputs  # noqa: E402

name = sys.argv[1]
member = sys.argv[2] if len(sys.argv) > 2 else "large"
M, N, K = (int(x) for x in (sys.argv[3] if len(sys.argv) > 3 else "16384x4096x1024").split("x"))
fam = bench_shapes.gemms()[name]
spec = fam.family[member]
g = evtc.Gemm(fam.pipeline.traced, a=bf16, b=bf16, c=bf16, d=bf16, arch=spec.arch, config=spec.config)
p = Problem(M, N, K, 1)
ins = make_inputs(g.graph, bf16, bf16, p, seed=M + N + K)
outs = poisoned_outputs(g.graph, p)
kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
for _ in range(4):
    g(ins["A"], ins["B"], out=outs, **kw)
torch.cuda.synchronize()
print(name, member, f"{M}x{N}x{K}", spec.config, flush=True)
