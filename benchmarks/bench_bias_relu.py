"""Issue 2's benchmark: fused bias_relu against cuBLAS, eager PyTorch and torch._addmm_activation.

On the GPU machine:  python benchmarks/bench_bias_relu.py --json $OUT/bias_relu.json

Device times per call (median of --iters samples of back-to-back calls, CUDA events, after
warm-up; fresh random inputs, preallocated outputs; evtc.testing.bench.time_interleaved) at
(8192,8192,8192), (16384,4096,1024), (4096,4096,4096), bf16:
  * evtc: relu(alpha*acc + beta*C + bias[n]), default configuration
  * cuBLAS: the plain GEMM A @ B.T (the floor: no epilogue work at all)
  * eager: the same epilogue function run unfused by PyTorch after the GEMM
  * addmm_act: torch._addmm_activation(bias, A, B.T) = relu(A @ B.T + bias), cuBLASLt's own
    fused epilogue, against evtc's relu(acc + bias[n]) (the beta = 0 variant)
"""

from __future__ import annotations

import argparse

import common  # noqa: F401  (sets sys.path)

import evtc
from evtc import bf16


@evtc.epilogue
def bias_relu_nobeta(acc, bias: evtc.RowVector[bf16]):
    return evtc.relu(acc + bias)


SHAPES = [(8192, 8192, 8192), (16384, 4096, 1024), (4096, 4096, 4096)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--config", help='a GemmConfig as JSON instead of the default, e.g. \'{"tile": [128, 192, 64], '
                                     '"schedule": "pingpong"}\'')
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    import epilogues as E
    from evtc.testing.bench import bench_gemm, time_interleaved
    from evtc.testing import Problem, make_inputs

    config = evtc.GemmConfig.from_json(args.config) if args.config else None
    fused = evtc.Gemm(E.bias_relu, a=bf16, b=bf16, c=bf16, d=bf16, config=config)
    nobeta = evtc.Gemm(bias_relu_nobeta, a=bf16, b=bf16, d=bf16, config=config)
    common.build_all([fused, nobeta], "bias_relu")
    rows = []
    for (M, N, K) in SHAPES:
        r = bench_gemm(fused, M, N, K, iters=args.iters, eager_fn=E.bias_relu.fn)
        ins = make_inputs(nobeta.graph, bf16, bf16, Problem(M, N, K), seed=7)
        A, B, bias = ins["A"], ins["B"], ins["bias"]
        out = torch.empty(M, N, dtype=torch.bfloat16, device="cuda")
        Bt = B.t()
        t = time_interleaved({"nobeta": lambda: nobeta(A, B, out=out, bias=bias),
                              "addmm": lambda: torch._addmm_activation(bias, A, Bt, use_gelu=False)}, args.iters)
        nb_ms, addmm_ms = t["nobeta"], t["addmm"]
        r.update({"shape": f"{M}x{N}x{K}", "evtc_nobeta_ms": nb_ms, "addmm_act_ms": addmm_ms,
                  "nobeta_over_addmm": nb_ms / addmm_ms})
        rows.append(r)
        print(f"{M}x{N}x{K}: evtc {r['evtc_ms']:.3f} ms, cuBLAS {r['cublas_ms']:.3f} ms, ratio {r['evtc_over_cublas']:.3f}",
              flush=True)
    print(f"\nbias_relu bf16 on {common.device_name()}, config {fused.config.schedule_name}, plan {fused.plan.policy}")
    print(common.table(rows, ["shape", "evtc_ms", "cublas_ms", "evtc_over_cublas", "eager_ms", "eager_over_evtc",
                              "evtc_nobeta_ms", "addmm_act_ms", "nobeta_over_addmm", "tflops", "evtc_launch_us"]))
    common.write_json(args.json, {"device": common.device_name(), "config": fused.config.to_json(),
                                  "plan": fused.plan.to_json(), "rows": rows})


if __name__ == "__main__":
    main()
