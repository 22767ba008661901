"""The candidate space of the sm90 GEMM family: members and their run-time variants.

Input: a :class:`~evtc.family.spec.Problem`, the epilogue's traits and Graph, the operand dtypes.
Output: :class:`~evtc.family.spec.KernelSpec` s, each one kernel (a member's compile-time
configuration) with the run-time arguments a call passes it (split-K, the decomposition, the
tile order), labelled ``member`` or ``member:variant`` (:func:`label`).

The same enumeration serves the ground-truth benchmark (benchmarks/ground_truth.py, over
:data:`MEMBERS_ON_TRIAL`), the selection model that ranks the candidates, and the tuner that
times the best few.
"""

from __future__ import annotations

import functools
import json
import math

from evtc.dtypes import DType
from evtc.family.spec import EpilogueTraits, KernelSpec, Problem, default_family, fit_swizzle, for_epilogue, on_demand
from evtc.plan.config import GemmConfig

__all__ = ["MEMBERS_ON_TRIAL", "SPLITS", "candidates", "cluster_variants", "label", "trial_members"]

#: the K splits a stream-K-scheduler member is tried with (split-K through the workspace: the
#: partial accumulators are reduced before the epilogue runs once per tile)
SPLITS = (2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)

#: the fewest K tiles one split may get (a shorter K loop spends more on the reduction than it saves)
MIN_K_TILES_PER_SPLIT = 4

#: NOTE [Stream-K over a short K]: no stream-K decomposition where an output tile has at most
#: this many K tiles. Stream-K balances the waves by handing out K iterations; over 1-4 of them
#: it has little to hand out and still pays the fixup. In the ground truth's calibration half
#: (benchmarks/ground_truth/H200.json) it was the fastest candidate at <= 4 K tiles once in 24
#: (problem, class) rows, by 0.3 %; on the validation half, leaving it out took the ranker's
#: worst picks there away (16384x3072x64: ``kheavy:sk`` at 1.6x; within 1.15 of the fastest:
#: 97.8 -> 98.1 % pointwise, 95.9 -> 96.2 % aux).
MIN_K_TILES_FOR_STREAM_K = 5


@functools.lru_cache(maxsize=256)
def cluster_variants(members: tuple[KernelSpec, ...]) -> tuple[KernelSpec, ...]:
    """Each clustered member without its cluster (``<name>_c1``, built on demand), where that is
    not another member's configuration. Memoised per member tuple (specs are frozen): a routed
    call asks it once per new problem.

    NOTE [Cluster padding]: CUTLASS's sm90 schedulers round each batch's M and N tile counts up to
    a multiple of the cluster's extents (:func:`~evtc.family.spec.scheduled_tiles`,
    ``tile_scheduler_params.h``) and run the padding tiles with a whole tile's MMAs, while a
    cluster multicasts A and B tiles to its CTAs. Which wins depends on the shape (an LM head at
    128 tokens: one M tile of ``large`` scheduled as two), so both are candidates and the selection
    model decides (docs/performance.md, "The rules the selection model replaced": 2.45x without
    and 1.17x with the cluster dropped at 8 x 128 x 50257 x 4096)."""
    have = {json.dumps(s.config.kernel_json(s.arch), sort_keys=True) for s in members}
    out = []
    for s in members:
        if s.arch != "sm90" or s.config.cluster is None or tuple(s.config.cluster[:2]) == (1, 1):
            continue
        c1 = KernelSpec(s.name + "_c1", s.config.replace(cluster=(1, 1, 1)), s.arch)
        if json.dumps(c1.config.kernel_json(c1.arch), sort_keys=True) not in have:
            out.append(c1)
    return tuple(out)


def trial_members(a: DType, b: DType) -> tuple[KernelSpec, ...]:
    """The default sm90 family, its cluster-less variants, and the members on trial: the
    cooperative 256x128 tile in 2x1 clusters (``c256x128``; measured on the corpus, 2026-11-28,
    it was the fastest candidate by more than 2 % on one problem of 1023: not a member)."""
    fam = default_family("sm90", a, b)
    k = fam[0].config.tile[2]
    return fam + cluster_variants(fam) + (
        KernelSpec("c256x128", GemmConfig(tile=(256, 128, k), cluster=(2, 1, 1), schedule="cooperative"), "sm90"),)


MEMBERS_ON_TRIAL = "trial"


def label(spec: KernelSpec) -> str:
    """``member`` for a persistent member, ``member:dp`` / ``member:sk`` / ``member:s<n>`` for a
    stream-K-scheduler member run data-parallel, stream-K or split-K over n."""
    cfg = spec.config
    if spec.arch != "sm90" or cfg.scheduler != "streamk":
        return spec.name
    if cfg.decomposition == "split_k" and cfg.split_k > 1:
        return f"{spec.name}:s{cfg.split_k}"
    return f"{spec.name}:{'sk' if cfg.decomposition == 'stream_k' else 'dp'}"


def _tiles(spec: KernelSpec, p: Problem) -> int:
    tm, tn = spec.config.tile[:2]
    m, n = (p.N, p.M) if spec.config.swap_ab else (p.M, p.N)
    return math.ceil(m / tm) * math.ceil(n / tn) * p.L


def candidates(p: Problem, traits: EpilogueTraits, graph, a: DType, b: DType,
               members: tuple[KernelSpec, ...] | str | None = None) -> list[KernelSpec]:
    """Every kernel and run-time variant that may run ``p``.

    Args:
        p: the problem (its alignment decides the route: A/B rows TMA can't read go to the sm80
            ``unaligned_k`` kernel, M x N rows to the register-direct ``unaligned`` members).
        traits: the epilogue's (atomic reductions change the stream-K members; NOTE [Atomic
            reductions in the stream-K members] in :mod:`evtc.family.spec`).
        graph: the epilogue after passes (a column reduction leaves out tiles whose N it can't
            take: :func:`evtc.plan.config.column_reduction_tile_ok`).
        a: A's dtype.
        b: B's dtype.
        members: the aligned members (default: the default family and its
            :func:`cluster_variants`; ``"trial"``: :func:`trial_members`).

    Returns:
        KernelSpecs, persistent members with the tile order :func:`~evtc.family.spec.fit_swizzle`
        gives them, stream-K-scheduler members data-parallel, stream-K (unless the kernel reduces
        with atomics: NOTE [Scalar reductions and stream-K] in evtc/gemm.py; or the K loop is
        short: NOTE [Stream-K over a short K]) and split-K over
        each of :data:`SPLITS` that keeps ``MIN_K_TILES_PER_SPLIT`` K tiles a split and at most
        1.5 waves of work units.
    """
    from evtc.dispatch.family import atomic_reductions
    from evtc.plan.config import column_reduction_tile_ok

    if not p.aligned_k:
        return [on_demand("sm90", a, b, "unaligned_k")]
    if not p.aligned_mn:
        return [on_demand("sm90", a, b, n) for n in ("unaligned", "unaligned_pingpong")]
    if members is None:
        members = default_family("sm90", a, b)
        members = members + cluster_variants(members)
    elif members == MEMBERS_ON_TRIAL:
        members = trial_members(a, b)
    out: list[KernelSpec] = []
    for spec in for_epilogue(members, traits):
        cfg = spec.config
        if cfg.swap_ab and p.M > 256:
            continue  # swap-AB puts M on the tile's N: for decode-sized M
        if not column_reduction_tile_ok(graph, cfg):
            continue
        if cfg.scheduler != "streamk":
            out.append(fit_swizzle(spec, p))
            continue
        tiles = _tiles(spec, p)
        k_tiles = math.ceil(p.K / cfg.tile[2])
        out.append(spec.with_runtime(split_k=1, decomposition="data_parallel"))
        if not atomic_reductions(graph, cfg) and k_tiles >= MIN_K_TILES_FOR_STREAM_K:
            out.append(spec.with_runtime(split_k=1, decomposition="stream_k"))
        for s in SPLITS:
            if tiles < p.sm_count and k_tiles >= MIN_K_TILES_PER_SPLIT * s and 2 * tiles * s <= 3 * p.sm_count:
                out.append(spec.with_runtime(split_k=s, decomposition="split_k"))
    return out
