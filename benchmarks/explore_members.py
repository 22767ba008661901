"""Every family member (and run-time variant) of bench_shapes.py's epilogues on the problems where
the heuristic's pick was measured worst, timed in CUDA graphs beside cuBLAS in one run: the
evidence for the heuristic's per-epilogue rules (evtc/family/spec.py, docs/performance.md).

    python benchmarks/explore_members.py --json $OUT/explore_members.json

Candidates are the tuner's (:func:`evtc.dispatch.tune.candidates`: each member, the stream-K
members' data-parallel and split-K variants up to 4 splits; not the stream-K decomposition), and for problems whose N is not a multiple of 8 the
on-demand ``unaligned`` and ``unaligned_pingpong`` members; each runs as a pinned Gemm on packed
(contiguous) tensors. Every result is compared with the heuristic's pick.
"""

from __future__ import annotations

import argparse

import common

import evtc
from evtc import bf16

PROBLEMS = [(1, 4096, 4096, 1), (32, 28672, 4096, 1), (64, 8192, 8192, 1), (128, 14336, 4096, 1),
            (16384, 4096, 1024, 1), (512, 512, 32768, 1), (1000, 1000, 1000, 1), (4096, 50257, 4096, 1),
            (2048, 32001, 4096, 1)]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--only", help="comma-separated epilogues (default: bench_shapes.py's three)")
    ap.add_argument("--problems", help="comma-separated MxNxK[xL]")
    ap.add_argument("--torch", help="comma-separated token counts: the MLP block's two GEMMs of bench_torch.py "
                                    "(fc1 + GELU at tokens x ffn x d_model, fc2 + residual at tokens x d_model x ffn) "
                                    "instead of bench_shapes.py's epilogues")
    ap.add_argument("--json")
    args = ap.parse_args()
    import bench_shapes
    import torch

    from evtc.testing.bench import time_graphs
    from evtc.family.spec import Problem as FP
    from evtc.family.spec import on_demand
    from evtc.dispatch.tune import candidates
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    problems = PROBLEMS if not args.problems else [
        tuple(int(x) for x in p.split("x")) + ((1,) if p.count("x") == 2 else ()) for p in args.problems.split(",")]
    fams = bench_shapes.gemms()
    per_fam = {}
    if args.torch:
        import bench_torch

        fc1, fc2 = bench_torch.gemms()
        fams = {"mlp_fc1": fc1, "mlp_fc2": fc2}
        tokens = [int(t) for t in args.torch.split(",")]
        D, F = bench_torch.D_MODEL, bench_torch.FFN
        per_fam = {"mlp_fc1": [(t, F, D, 1) for t in tokens], "mlp_fc2": [(t, D, F, 1) for t in tokens]}
    if args.only:
        fams = {k: v for k, v in fams.items() if k in args.only.split(",")}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    pinned: dict = {}

    def pin(g, spec):
        key = (g.name, repr(spec.config), spec.arch)
        if key not in pinned:
            pinned[key] = evtc.Gemm(g.pipeline.traced, a=bf16, b=bf16, c=bf16, d=bf16, arch=spec.arch, config=spec.config)
        return pinned[key]

    def cands_of(g, M, N, K, L):
        aligned = N % 8 == 0
        fp = FP(M, N, K, L, aligned, True, sms)
        return [c for c in candidates(g, fp) if c.config.decomposition != "stream_k" and c.config.split_k <= 4] \
            if aligned else [on_demand("sm90", bf16, bf16, n) for n in ("unaligned", "unaligned_pingpong")]

    # every candidate's kernel first, in parallel (one nvcc per core), then the timing
    common.build_all([pin(g, spec) for ep, g in fams.items() for M, N, K, L in per_fam.get(ep, problems)
                      for spec in cands_of(g, M, N, K, L)] + list(fams.values()), "explore_members")

    rows = []
    for ep, g in fams.items():
        for M, N, K, L in per_fam.get(ep, problems):
            aligned = N % 8 == 0
            cands = cands_of(g, M, N, K, L)
            pick = g.choose(M, N, K, L, aligned_mn=aligned)
            p = Problem(M, N, K, L)
            ins = make_inputs(g.graph, bf16, bf16, p, seed=M + N + K)
            outs = poisoned_outputs(g.graph, p)
            ins = {k: (v.contiguous() if hasattr(v, "dim") and v.dim() >= 2 else v) for k, v in ins.items()}
            outs = {k: (v.contiguous() if v.dim() >= 2 else v) for k, v in outs.items()}
            A, B = ins["A"], ins["B"]
            kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
            Bt = B.transpose(-1, -2)
            plain = torch.empty(A.shape[:-1] + (N,), dtype=A.dtype, device=A.device)
            fns = {"cublas": lambda: torch.matmul(A, Bt, out=plain)}
            labels = {}
            for spec in cands:
                label = f"{spec.name}:{spec.config.decomposition}:{spec.config.split_k}"
                gv = pin(g, spec)
                labels[label] = spec
                fns[label] = (lambda gv=gv: gv(A, B, out=outs, **kw))
            fns["heuristic"] = (lambda: g(A, B, out=outs, **kw))
            t = time_graphs(fns, args.iters)
            cub = t["cublas"]
            ranked = sorted((v, k) for k, v in t.items() if k not in ("cublas", "heuristic") and v == v)
            shape = f"{M}x{N}x{K}" + (f"x{L}" if L > 1 else "")
            print(f"{ep:10s} {shape:>16}  cuBLAS {cub * 1e3:7.1f} us  heuristic ({pick.name}) "
                  f"{t['heuristic'] / cub:.3f}  best: " + ", ".join(f"{k} {v / cub:.3f}" for v, k in ranked[:3]),
                  flush=True)
            rows.append({"epilogue": ep, "shape": shape, "cublas_us": cub * 1e3, "pick": pick.name,
                         "heuristic_us": t["heuristic"] * 1e3,
                         "us": {k: v * 1e3 for k, v in t.items() if k not in ("cublas", "heuristic")}})
            common.write_json(args.json, {"device": common.device_name(), "rows": rows})  # after each (time limits)


if __name__ == "__main__":
    main()
