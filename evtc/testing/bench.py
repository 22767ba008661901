"""Timing helpers for benchmarks and the tuner (GPU only): CUDA events, warm-up, median of many
runs, fresh random inputs, preallocated outputs.

Input: a built :class:`evtc.Gemm` and a problem size. Output: a dict of medians (ms) and ratios.
"""

from __future__ import annotations

from typing import Any, Callable

from evtc.ir.graph import Graph
from evtc.runtime.timing import launch_overhead_us, time_graphs, time_interleaved  # noqa: F401 (re-exported)
from evtc.ir.nodes import (
    Accumulator,
    ColBroadcast,
    Compute,
    Immediate,
    Leaf,
    Reduction,
    RowBroadcast,
    Store,
)

__all__ = ["bench_gemm", "launch_overhead_us", "time_graphs", "time_interleaved", "torch_eval"]


def torch_eval(graph: Graph, acc, inputs: dict[str, Any]) -> dict[str, Any]:
    """Evaluate ``graph`` eagerly with torch ops, one kernel per op (the "unfused" baseline when
    no Python function is at hand). Column vectors are reshaped to broadcast."""
    import torch

    from evtc import ops

    vals: dict[int, Any] = {}
    out: dict[str, Any] = {}
    for n in graph.nodes:
        if isinstance(n, Accumulator):
            vals[id(n)] = acc
        elif isinstance(n, Leaf):
            x = inputs[n.name]
            if isinstance(n, ColBroadcast):
                x = x.unsqueeze(-1)
            elif isinstance(n, RowBroadcast) and x.dim() == 2:
                x = x.unsqueeze(-2)
            vals[id(n)] = x
        elif isinstance(n, Immediate):
            vals[id(n)] = n.value
        elif isinstance(n, Compute):
            args = [vals[id(a)] for a in n.args]
            if n.op == "convert":
                vals[id(n)] = args[0].to(getattr(torch, n.dtype.torch))
            else:
                args = [a if hasattr(a, "dtype") else torch.tensor(a, device=acc.device) for a in args]
                vals[id(n)] = ops.get(n.op).torch(torch, *args)
        elif isinstance(n, Store):
            out[n.name] = vals[id(n.value)].to(getattr(torch, n.dtype.torch))
        elif isinstance(n, Reduction):
            v = vals[id(n.value)].float()
            dims = n.axis.torch_dims
            fn = {"sum": torch.sum, "max": torch.amax, "min": torch.amin}[n.op.value]
            out[n.name] = fn(v, dim=dims)
    return out


def bench_gemm(gemm, M: int, N: int, K: int, L: int = 1, *, iters: int = 50, eager_fn: Callable | None = None,
               seed: int = 0, with_eager: bool = True) -> dict[str, float]:
    """Time ``gemm`` against cuBLAS's plain GEMM (the floor) and eager PyTorch unfused: the fused
    kernel in alternation with cuBLAS, then eager in alternation with cuBLAS
    (:func:`time_interleaved`), in one run.

    Returns:
        ``evtc_ms``, ``cublas_ms``, ``eager_ms`` and the ratios ``evtc_over_cublas``,
        ``eager_over_evtc``.
    """
    import torch

    from evtc.runtime.tensors import device_name
    from evtc.testing import Problem, chosen_kernel, make_inputs, poisoned_outputs

    p = Problem(M, N, K, L)
    ins = make_inputs(gemm.graph, gemm.a, gemm.b, p, seed=seed)
    outs = poisoned_outputs(gemm.graph, p)
    A, B = ins["A"], ins["B"]
    kwargs = {k: v for k, v in ins.items() if k not in ("A", "B")}
    # the kernel the timed calls run, built before the clock starts (not the whole family: a call
    # that needs another kernel, e.g. the staging route's, builds it in the warm-up)
    chosen_kernel(gemm, p, device=device_name(A.device.index or 0)).build()
    plain = torch.empty(A.shape[:-1] + (N,), dtype=A.dtype, device=A.device) if not gemm.a.is_fp8 else None
    Bt = B.transpose(-1, -2)
    scale = torch.ones((), device=A.device)
    if plain is not None:
        def cublas():
            return torch.matmul(A, Bt, out=plain)
    else:
        def cublas():
            return torch._scaled_mm(A, B.t(), scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)

    def eager():
        acc = torch.matmul(A, B.transpose(-1, -2)) if plain is not None else torch._scaled_mm(
            A, B.t(), scale_a=scale, scale_b=scale, out_dtype=torch.bfloat16)
        if eager_fn is not None:
            call = {k: (v.unsqueeze(-1) if k in col_names else v) for k, v in kwargs.items()}
            acc_name = gemm.graph.accumulator.name if gemm.graph.accumulator is not None else "acc"
            return eager_fn(**{acc_name: acc}, **call)
        return torch_eval(gemm.graph, acc, kwargs)

    col_names = {n.name for n in gemm.graph.inputs if isinstance(n, ColBroadcast)}
    # Eager's allocations and memory-bound kernels slow whatever runs next (clocks, allocator), so
    # it alternates with cuBLAS in a group of its own; the fused kernel alternates with cuBLAS.
    def fused():
        return gemm(A, B, out=outs, **kwargs)

    t = time_interleaved({"evtc": fused, "cublas": cublas}, iters)
    evtc_ms, cublas_ms = t["evtc"], t["cublas"]
    eager_ms = time_interleaved({"eager": eager, "cublas": cublas}, iters)["eager"] if with_eager else float("nan")
    return {
        "M": M, "N": N, "K": K, "L": L,
        "evtc_ms": evtc_ms, "cublas_ms": cublas_ms, "eager_ms": eager_ms,
        "evtc_over_cublas": evtc_ms / cublas_ms, "eager_over_evtc": eager_ms / evtc_ms,
        "tflops": 2.0 * M * N * K * L / (evtc_ms * 1e-3) / 1e12,
        "evtc_launch_us": launch_overhead_us(fused),
    }
