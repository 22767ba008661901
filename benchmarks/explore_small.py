"""Candidate kernels for the problems one large tile serves badly (decode, few tiles, long K,
mid-sized batches), timed in CUDA graphs beside cuBLAS in one run: the measurements behind the
default sm90 family and its heuristic (evtc/family/spec.py, docs/performance.md).

    python benchmarks/explore_small.py --json $OUT/explore_small.json

Each configuration is a pinned Gemm; a stream-K configuration is also timed with its run-time
decompositions (data-parallel, stream-K, split-K S), which run the same built kernel.
"""

from __future__ import annotations

import argparse
import math

import common  # noqa: F401

import evtc
from evtc import bf16

CONFIGS = {
    "sk128x128_1x1": dict(tile=(128, 128, 64), cluster=(1, 1, 1), scheduler="streamk"),
    "sk128x128_2x1": dict(tile=(128, 128, 64), cluster=(2, 1, 1), scheduler="streamk"),
    "sk128x64_1x1": dict(tile=(128, 64, 64), cluster=(1, 1, 1), scheduler="streamk"),
    "pp64x128_1x1": dict(tile=(64, 128, 64), cluster=(1, 1, 1), schedule="pingpong"),
    "pp64x64_1x1": dict(tile=(64, 64, 64), cluster=(1, 1, 1), schedule="pingpong"),
    "pp64x128_2x1": dict(tile=(64, 128, 64), cluster=(2, 1, 1), schedule="pingpong"),
    "swap_sk128x32_1x1": dict(tile=(128, 32, 64), cluster=(1, 1, 1), scheduler="streamk", swap_ab=True),
    "swap_sk128x16_1x1": dict(tile=(128, 16, 64), cluster=(1, 1, 1), scheduler="streamk", swap_ab=True),
    "swap_pp64x32_1x1": dict(tile=(64, 32, 64), cluster=(1, 1, 1), schedule="pingpong", swap_ab=True),
    "swap_pp64x64_1x1": dict(tile=(64, 64, 64), cluster=(1, 1, 1), schedule="pingpong", swap_ab=True),
}
PROBLEMS = [(1, 4096, 4096, 1), (16, 4096, 4096, 1), (64, 8192, 8192, 1), (128, 14336, 4096, 1),
            (256, 4096, 14336, 1), (512, 4096, 4096, 1), (1024, 1024, 16384, 1), (512, 512, 32768, 1),
            (1000, 1000, 1000, 1), (768, 768, 3072, 1), (2048, 2048, 8192, 1), (512, 1024, 4096, 8),
            (2048, 2048, 2048, 4), (256, 256, 256, 1)]


def gemms(name="bias_relu") -> dict:
    """name -> pinned Gemm of every configuration."""
    import epilogues as E

    return {n: evtc.Gemm(E.REFERENCE[name], a=bf16, b=bf16, c=bf16, d=bf16, config=evtc.GemmConfig(**cfg))
            for n, cfg in CONFIGS.items()}


_VARIANTS: dict = {}


def _variant(name: str, **runtime):
    """The pinned Gemm of configuration ``name`` with run-time fields (the same built kernel)."""
    import epilogues as E

    key = (name, tuple(sorted(runtime.items())))
    if key not in _VARIANTS:
        _VARIANTS[key] = evtc.Gemm(E.REFERENCE["bias_relu"], a=bf16, b=bf16, c=bf16, d=bf16,
                                   config=evtc.GemmConfig(**CONFIGS[name], **runtime))
    return _VARIANTS[key]


def variants(name, g, M, N, K, L, sms):
    """(label, Gemm) of the run-time decompositions worth timing on ``g``'s kernel."""
    cfg = g.config
    if cfg.scheduler != "streamk":
        return [("", g)]
    m, n = (N, M) if cfg.swap_ab else (M, N)
    tiles = math.ceil(m / cfg.tile[0]) * math.ceil(n / cfg.tile[1]) * L
    k_tiles = math.ceil(K / cfg.tile[2])
    out = [("_dp", _variant(name, split_k=1, decomposition="data_parallel")),
           ("_sk", _variant(name, split_k=1, decomposition="stream_k"))]
    for s in (2, 3, 4, 8):
        if s <= k_tiles and tiles * s <= 2 * sms:
            out.append((f"_split{s}", _variant(name, split_k=s, decomposition="split_k")))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    from evtc.testing.bench import time_graphs
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    every = gemms()
    built = {id(g) for g in common.build_all(list(every.values()), "explore_small")}
    table = {n: g for n, g in every.items() if id(g) in built}
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []
    for M, N, K, L in PROBLEMS:
        p = Problem(M, N, K, L)
        any_g = next(iter(table.values()))
        ins = make_inputs(any_g.graph, bf16, bf16, p, seed=M + N + K)
        outs = poisoned_outputs(any_g.graph, p)
        A, B = ins["A"], ins["B"]
        kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
        Bt = B.transpose(-1, -2)
        plain = torch.empty(A.shape[:-1] + (N,), dtype=A.dtype, device=A.device)
        fns = {"cublas": lambda: torch.matmul(A, Bt, out=plain)}
        for name, g in table.items():
            for label, gv in variants(name, g, M, N, K, L, sms):
                fns[name + label] = (lambda gv=gv: gv(A, B, out=outs, **kw))
        t = time_graphs(fns, args.iters)
        cub = t["cublas"]
        ranked = sorted(((v, k) for k, v in t.items() if k != "cublas" and v == v))
        shape = f"{M}x{N}x{K}" + (f"x{L}" if L > 1 else "")
        print(f"{shape:>18}  cuBLAS {cub * 1e3:7.1f} us  best: " +
              ", ".join(f"{k} {v * 1e3:.1f} ({v / cub:.2f})" for v, k in ranked[:4]), flush=True)
        rows.append({"shape": shape, "cublas_us": cub * 1e3,
                     "us": {k: v * 1e3 for k, v in t.items() if k != "cublas"}})
    # every kernel and decomposition timed above, checked elementwise against the float64 reference
    from evtc.testing import check

    checks = {}
    for g in [*table.values(), *_VARIANTS.values()]:
        label = f"{g.config.schedule_name}"
        res = check(g, Problem(300, 264, 2000), seed=7)
        checks[label] = all(r.ok for r in res.values())
        if not checks[label]:
            print(f"WRONG: {label}: " + "; ".join(r.describe() for r in res.values() if not r.ok), flush=True)
    print(f"checked {len(checks)} kernels/decompositions: {sum(checks.values())} correct", flush=True)
    common.write_json(args.json, {"device": common.device_name(), "rows": rows, "checks": checks})


if __name__ == "__main__":
    main()
