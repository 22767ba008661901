"""The cost model that ranks sm90 epilogue plans.

Input: a candidate plan (slots, stages, epilogue tile, TMA/direct per aux tensor), the GEMM
configuration and the target. Output: estimated times in microseconds (a dict of terms).

It is a ranking device, not a simulator: absolute numbers are rough, the order is what matters,
and the autotuner measures the best few. The model, for a nominal problem (M = N = 8192,
K = 4096, or the ``problem`` given) on a persistent grid:

* MMA time per output tile: ``2 * TM * TN * K / (mma_flops / sm_count)``, inflated by a stall
  factor that decays exponentially with the MMA work the other mainloop stages hold (fitted on
  the H100, see the constants and docs/performance.md);
* epilogue memory time per tile: bytes moved / (bandwidth / sm_count). TMA loads of the first
  ``StagesC`` subtiles are prefetched while the mainloop runs (fewer with ``ReuseSmemC``, whose
  load slots free only after the store of ``StagesD`` subtiles earlier); the rest are exposed.
  TMA stores overlap the next subtile unless ``StagesD`` is 1. Register-direct tensors move
  whole 32-byte sectors for 16-byte row pieces (x2 traffic) and are not prefetched;
* the kernel takes the larger of the compute path (tiles per SM times the per-tile time) and
  the memory path (all bytes over bandwidth).
"""

from __future__ import annotations

import math

from evtc.dtypes import DType
from evtc.ir.graph import Graph
from evtc.ir.nodes import AuxLoad, ColBroadcast, RowBroadcast, Source, Store
from evtc.plan.target import Target

NOMINAL_PROBLEM = (8192, 8192, 4096)
# Mainloop stall: the fraction of MMA time lost waiting for loads decays with how much MMA work the
# other stages hold, stall = A * exp(-(stages - 1) * t_kblock / TAU). Fitted with
# benchmarks/bench_planner.py on the H100 (docs/performance.md): many_aux at 128x128x64 tiles ran
# 40 % slower with 2 stages than 3 and 18 % slower with 3 than 4; gelu_aux 4 % slower with 5 than 6.
STALL_A = 2.0
STALL_TAU_S = 0.46e-6
DIRECT_TRAFFIC = 2.0
DIRECT_EXPOSED = 1.0
# Per epilogue subtile: two named-barrier syncs, fences, a TMA issue and a pipeline wait for every
# smem tensor. Halving many_aux's subtiles (128x16 -> 128x32, six TMA tensors) saved about 1.3 us
# each; bias_relu's (two tensors) about 0.45 us.
SUBTILE_FIXED_S = 0.25e-6
SUBTILE_PER_TENSOR_S = 0.2e-6
# With ReuseSmemC a load slot frees only when the store from it has completed: on top of the
# shallower prefetch, the producer waits on stores. many_aux at 128x128 tiles lost 3.5 % with the
# same prefetch depth, about 40 % of its per-tile load time.
REUSE_EXPOSED = 0.4
FILL_DRAIN = 2.0


def _smem_tensor_count(graph: Graph, cand) -> int:
    """M x N tensors that go through shared memory (C, D and the TMA aux loads and stores)."""
    n = 0
    for x in (*graph.used_inputs, *graph.outputs):
        if isinstance(x, (AuxLoad, Source, Store)) and x.name not in cand.direct:
            n += 1
    return n


def estimate(graph: Graph, cand, config, target: Target, a: DType, b: DType, stages: int,
             problem: tuple[int, int, int] = NOMINAL_PROBLEM) -> dict[str, float]:
    """Estimated microseconds for ``problem`` with candidate ``cand`` (see the module docs)."""
    M, N, K = problem
    tm, tn, _ = config.tile
    em, en = cand.epilogue_tile
    sms = target.sm_count
    bw_sm = target.mem_bandwidth / sms  # bytes/s per SM
    tiles = math.ceil(M / tm) * math.ceil(N / tn)
    waves = math.ceil(tiles / sms)
    epi_tiles = (tm // em) * (tn // en)

    t_mma = 2.0 * tm * tn * K / (target.mma_flops / sms)
    t_kblock = 2.0 * tm * tn * config.tile[2] / (target.mma_flops / sms)
    stall = STALL_A * math.exp(-(stages - 1) * t_kblock / STALL_TAU_S)

    load_tma = load_direct = store_tma = store_direct = vec = 0.0
    for n in graph.used_inputs:
        nbytes = tm * tn * n.dtype.bytes
        if isinstance(n, (AuxLoad, Source)):
            if n.name in cand.direct:
                load_direct += nbytes
            else:
                load_tma += nbytes
        elif isinstance(n, RowBroadcast):
            vec += tn * n.dtype.bytes
        elif isinstance(n, ColBroadcast):
            vec += tm * n.dtype.bytes
    for o in graph.outputs:
        if isinstance(o, Store):
            nbytes = tm * tn * o.dtype.bytes
            if o.name in cand.direct:
                store_direct += nbytes
            else:
                store_tma += nbytes

    prefetch = cand.stages_c - (cand.stages_d if cand.reuse else 0)
    prefetched = max(0, min(prefetch, epi_tiles)) / epi_tiles
    exposed_load = load_tma * (1.0 - prefetched) / bw_sm
    if cand.stages_c == 1 and load_tma:
        exposed_load = load_tma / bw_sm  # no double buffering at all
    if cand.reuse:
        exposed_load += REUSE_EXPOSED * load_tma / bw_sm
    exposed_store = store_tma / bw_sm * (1.0 if cand.stages_d == 1 else 0.25)
    direct = (load_direct + store_direct) * DIRECT_TRAFFIC / bw_sm * DIRECT_EXPOSED
    n_smem = _smem_tensor_count(graph, cand)
    # the pipeline fills and drains once per tile: the first subtile's loads and the last one's
    # stores are never overlapped (bigger subtiles expose more: bias_relu at 16384x4096x1024 ran
    # 8 % slower with 128x64 subtiles than with 128x32)
    subtile_bytes = (load_tma + store_tma) / epi_tiles
    t_epi = (exposed_load + exposed_store + direct + vec / bw_sm + FILL_DRAIN * subtile_bytes / bw_sm
             + epi_tiles * (SUBTILE_FIXED_S + SUBTILE_PER_TENSOR_S * n_smem))

    t_tile = t_mma * (1.0 + stall) + t_epi
    compute_path = waves * t_tile
    total_bytes = tiles * (load_tma + store_tma + vec + (load_direct + store_direct) * DIRECT_TRAFFIC) \
        + (M * K * a.bytes + N * K * b.bytes)
    memory_path = total_bytes / target.mem_bandwidth
    total = max(compute_path, memory_path)
    return {
        "mma_us_per_tile": round(t_mma * 1e6, 3),
        "stall_fraction": stall,
        "epilogue_exposed_us_per_tile": round(t_epi * 1e6, 3),
        "compute_path_us": round(compute_path * 1e6, 2),
        "memory_path_us": round(memory_path * 1e6, 2),
        "total_us": round(total * 1e6, 2),
    }
