"""Measuring kernels: CUDA-event timing (in CUDA graphs or back to back) and fresh random inputs.

Input: functions that launch work on the current CUDA stream, or an epilogue's Graph and a
problem. Output: median milliseconds per call, or torch tensors. What the tuner
(:mod:`evtc.dispatch.tune`) times with; :mod:`evtc.testing` re-exports both for the tests and
the benchmarks. torch is imported only when called.
"""

from __future__ import annotations

import random
import statistics
from typing import Any, Callable

import numpy as np

from evtc.dtypes import DType
from evtc.ir.graph import Graph
from evtc.ir.nodes import Accumulator, AuxLoad, ColBroadcast, RowBroadcast, ScalarBroadcast, Source

__all__ = ["launch_overhead_us", "padded_empty", "random_inputs", "random_tensor", "time_graphs", "time_interleaved"]


def time_interleaved(fns: dict[str, Callable[[], Any]], iters: int = 50, warmup_ms: float = 300.0,
                     reps: int = 3) -> dict[str, float]:
    """Median device time (ms per call) of several functions, measured in alternation.

    Each sample is one function called ``reps + 1`` times back to back, with CUDA events around
    the last ``reps`` calls: the first call keeps the GPU busy while the host records the start
    event and issues the next calls, so the host's launch work (Python argument checks, CUTLASS's
    ``initialize``, TMA descriptor encoding) overlaps the previous call, as in a training loop,
    instead of adding an idle gap to the sample. (An event before a single call on an idle GPU
    times the host's launch path too: 2-6 % of a 1.7 ms GEMM.) The functions alternate in a fresh
    random order each round, so clock and temperature drift and the state one kernel leaves for
    the next (L2 contents) hit all of them alike, after a warm-up of about ``warmup_ms`` that
    brings the GPU to its steady clock."""
    import time

    import torch

    names = list(fns)
    t0 = time.perf_counter()
    while (time.perf_counter() - t0) * 1e3 < warmup_ms:
        for n in names:
            fns[n]()
        torch.cuda.synchronize()
    times: dict[str, list[float]] = {n: [] for n in names}
    order = list(names)
    rng = random.Random(0)
    for _ in range(iters):
        rng.shuffle(order)  # no function always runs right after the same one
        for n in order:
            fn = fns[n]
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            fn()
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            times[n].append(start.elapsed_time(end) / reps)
    return {n: statistics.median(v) for n, v in times.items()}


def time_graphs(fns: dict[str, Callable[[], Any]], iters: int = 20, calls: int = 10) -> dict[str, float]:
    """Median device time (ms per call) of each function run inside a CUDA graph: ``calls`` calls
    captured once and replayed ``iters`` times with events around each replay, in alternation.

    This is the kernels' own time, with no launch gaps: what a decode step captured in a graph
    (as serving frameworks do) sees, and a fair comparison of kernels whose host launch paths
    differ (a back-to-back sample of a 10 us kernel measures the host when its launch takes
    longer, :func:`time_interleaved`). A function that can't be captured gets NaN."""
    import torch

    graphs: dict[str, Any] = {}
    stream = torch.cuda.Stream()
    for n, fn in fns.items():
        try:
            with torch.cuda.stream(stream):
                fn()  # warm-up (and any first-call work) outside the capture
            torch.cuda.synchronize()
            g = torch.cuda.CUDAGraph()
            with torch.cuda.graph(g, stream=stream):
                for _ in range(calls):
                    fn()
            graphs[n] = g
        except Exception:  # noqa: BLE001 - report NaN for what can't be captured
            torch.cuda.synchronize()
    times: dict[str, list[float]] = {n: [] for n in graphs}
    order = list(graphs)
    rng = random.Random(0)
    for g in graphs.values():
        g.replay()
    torch.cuda.synchronize()
    for _ in range(iters):
        rng.shuffle(order)
        for n in order:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
            graphs[n].replay()
            end.record()
            end.synchronize()
            times[n].append(start.elapsed_time(end) / calls)
    return {n: (statistics.median(times[n]) if n in times else float("nan")) for n in fns}


def launch_overhead_us(fn: Callable[[], Any], calls: int = 20) -> float:
    """Host time (microseconds) one call of ``fn`` takes to issue its work, measured while the
    GPU is still busy with earlier calls (so it is the launch path alone, not waiting)."""
    import time

    import torch

    fn()
    torch.cuda.synchronize()
    fn()  # the GPU is busy with this one while the timed calls are issued
    t0 = time.perf_counter()
    for _ in range(calls):
        fn()
    dt = time.perf_counter() - t0
    torch.cuda.synchronize()
    return dt / calls * 1e6


def padded_empty(torch, shape, dtype, device, fill=float("nan")):
    """A tensor of ``shape`` whose rows start on 16-byte boundaries (as TMA needs); the padding
    after the last column is filled too (NaN by default: see :func:`padding_of`)."""
    per = max(1, 16 // dtype.bytes)
    last = shape[-1]
    padded = (last + per - 1) // per * per
    t = torch.empty(tuple(shape[:-1]) + (padded,), dtype=getattr(torch, dtype.torch), device=device)
    if dtype.is_fp8 and fill != fill:
        t.view(torch.uint8).fill_(0x7F)  # 0x7F is NaN in both e4m3 and e5m2
    else:
        t.fill_(fill)
    return t[..., :last]


def random_tensor(torch, shape, dtype: DType, device, gen, scale=1.0, positive=False):
    """N(0, scale^2) values of ``dtype`` (fp8 clamped to its range) in a padded tensor."""
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale
    if positive:
        x = x.abs() + 0.5
    if dtype.is_fp8:
        x = x.clamp(-dtype.max, dtype.max)
    out = padded_empty(torch, shape, dtype, device, fill=0.0)
    out.copy_(x.to(getattr(torch, dtype.torch)))
    return out


def random_inputs(graph: Graph, a: DType, b: DType, p, *, device="cuda", seed=0, batched=None) -> dict[str, Any]:
    """Fresh random A, B and epilogue inputs for ``graph`` (torch tensors on ``device``) for a
    problem ``p`` with attributes M, N, K, L.

    Values are N(0, 1) scaled so ``acc`` is O(1) (A and B scaled by K^-1/4) and zero-mean (the
    accumulator's error model assumes it); scalars are drawn from [0.5, 1.5]; inputs of
    ``log``/``sqrt``-style ops are not special-cased, so epilogues using them should take
    ``abs`` first or the tests choose their own data.
    """
    import torch

    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    batched = p.L > 1 if batched is None else batched
    lead = (p.L,) if batched else ()
    s = p.K ** -0.25
    out: dict[str, Any] = {
        "A": random_tensor(torch, lead + (p.M, p.K), a, device, gen, s),
        "B": random_tensor(torch, lead + (p.N, p.K), b, device, gen, s),
    }
    rng = np.random.default_rng(seed)
    for leaf in graph.inputs:
        n = leaf.name
        if isinstance(leaf, Accumulator):
            continue
        if isinstance(leaf, (Source, AuxLoad)):
            out[n] = random_tensor(torch, lead + (p.M, p.N), leaf.dtype, device, gen)
        elif isinstance(leaf, RowBroadcast):
            out[n] = random_tensor(torch, lead + (p.N,), leaf.dtype, device, gen).contiguous()
        elif isinstance(leaf, ColBroadcast):
            out[n] = random_tensor(torch, lead + (p.M,), leaf.dtype, device, gen).contiguous()
        elif isinstance(leaf, ScalarBroadcast):
            v = float(rng.uniform(0.5, 1.5))
            out[n] = torch.full(lead or (), v, dtype=getattr(torch, leaf.dtype.torch), device=device) if leaf.by_pointer else v
    return out
