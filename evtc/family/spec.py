"""The kernels of a family and the choice of one per problem.

Input: the operand dtypes and an arch (the family), a :class:`Problem` (the choice). Output:
:class:`KernelSpec` s: each one emitted kernel (its compile-time :class:`GemmConfig` fields)
plus the run-time scheduler arguments a call passes it (split-K, the decomposition, the tile
order).

# NOTE [The default sm90 family]
One epilogue is built as a dozen kernels, so that every problem shape has one that fills the
H100's and H200's 132 SMs: cooperative 128x256 in 2x1 clusters (``large``), ping-pong 128x192 in
2x1 clusters (``pingpong``), ping-pong 128x128, 64x128, 64x256 and 128x176 (``pp128``, ``small``,
``pp64x256``, ``pp128x176``; the last one m64n176k16 WGMMA a K step: NOTE [Extended WGMMA shapes]
in evtc/emit/sm90.py), the stream-K scheduler's cooperative 128x128 and 128x64 (``streamk``,
``kheavy``: data-parallel, stream-K or split-K, a run-time argument), and swap-AB tiles for
decode-sized M (``D^T = B A^T``: ping-pong 64x32, 64x16, 64x16 in 4x1 clusters, and the stream-K
cooperative 128x32 ``swapk`` for split-K over a long K). Which one a problem runs on is the
selection model's choice (NOTE [The selection model], evtc/dispatch/select.py); the measurements
behind the members are in docs/performance.md ("The selection model", and "The rules the
selection model replaced" for the rules it replaced).

Built on demand, never by default: each clustered member without its cluster (``<name>_c1``:
NOTE [Cluster padding]), ``unaligned`` (the large tile with every M x N tensor register-direct,
for rows not 16-byte aligned; ``unaligned_pingpong`` the same on the ping-pong tile, for
epilogues with reductions at 15 waves or more) and, for A or B rows not 16-byte aligned (K not
a multiple of 8 in 16-bit), an sm80 kernel with one-element mainloop accesses, which runs on
Hopper through the driver's PTX JIT.
"""

from __future__ import annotations

import dataclasses
import math

from evtc.dtypes import DType
from evtc.plan.config import GemmConfig, default_config, default_swizzle
from evtc.plan.target import SM90

__all__ = ["EpilogueTraits", "KernelSpec", "Problem", "choose", "default_family", "fit_swizzle", "on_demand",
           "scheduled_tiles", "split_count"]


@dataclasses.dataclass(frozen=True)
class EpilogueTraits:
    """What of the epilogue the family and the choice depend on.

    Attributes:
        reductions: it has a row or column reduction (CUTLASS's Sm90ColReduction /
            Sm90RowReduction).
        workspace_reductions: one of them goes through the workspace in the persistent members
            (a sum, or an output that is not f32: per-tile partials, a fence, a tile counter and
            a final reduction across tiles), not atomics (NOTE [Atomic row and column max]).
        aux_stores: it stores an M x N tensor besides D.
    """

    reductions: bool = False
    aux_stores: bool = False
    workspace_reductions: bool = False

    @classmethod
    def of(cls, graph) -> EpilogueTraits:
        """The traits of an epilogue Graph (after passes)."""
        from evtc.ir.nodes import Reduction, Store

        outs = graph.outputs
        tile_reductions = [o for o in outs if isinstance(o, Reduction) and o.dim is not None and o.cross_tile]
        return cls(reductions=bool(tile_reductions),
                   aux_stores=sum(isinstance(o, Store) for o in outs) > 1,
                   workspace_reductions=not all(o.atomic_capable for o in tile_reductions))


@dataclasses.dataclass(frozen=True)
class Problem:
    """What the choice of a kernel depends on.

    Attributes:
        M, N, K, L: the GEMM's extents (L batches).
        aligned_mn: every M x N tensor (C, D, aux loads and stores) has 16-byte aligned rows.
        aligned_k: A and B have 16-byte aligned rows (TMA).
        sm_count: multiprocessors of the device.
    """

    M: int
    N: int
    K: int
    L: int = 1
    aligned_mn: bool = True
    aligned_k: bool = True
    sm_count: int = SM90.sm_count


@dataclasses.dataclass(frozen=True)
class KernelSpec:
    """One kernel of a family and how a call runs it.

    Attributes:
        name: the family member (``large``, ``streamk``, ``swap``...).
        config: the kernel's configuration with the run-time fields a call uses (``split_k``,
            ``decomposition``): kernels are identified by :meth:`GemmConfig.kernel_json`, so specs
            that differ only in run-time fields share one build.
        arch: the arch the kernel is built for (``sm80`` for the unaligned-K fallback of sm90).
    """

    name: str
    config: GemmConfig
    arch: str

    def with_runtime(self, **changes) -> KernelSpec:
        return dataclasses.replace(self, config=self.config.replace(**changes))

    def batch_inner_variant(self) -> KernelSpec:
        """This member with the batch-inner tile order (``<name>_bi``, ``scheduler="batch_inner"``:
        NOTE [Batch-inner tile order]) if it has CUTLASS's persistent scheduler, else itself;
        built on demand."""
        if self.arch != "sm90" or self.config.scheduler != "persistent":
            return self
        return KernelSpec(self.name + "_bi", self.config.replace(scheduler="batch_inner"), self.arch)

    def packed_variant(self) -> KernelSpec:
        """This member's packed-store variant (``<name>_packed``, ``GemmConfig.packed_stores``:
        NOTE [Stores into packed rows] in evtc/plan/sm90_buffers.py), built on demand."""
        return KernelSpec(self.name + "_packed", self.config.replace(packed_stores=True), self.arch)


def for_epilogue(family, traits: EpilogueTraits) -> tuple[KernelSpec, ...]:
    """The default family adapted to an epilogue (its :class:`EpilogueTraits`).

    NOTE [Atomic reductions in the stream-K members]: where every row and column reduction of
    the epilogue is an f32 max or min (:attr:`evtc.ir.nodes.Reduction.atomic_capable`), the stream-K-
    scheduler members (``streamk``, ``kheavy``) reduce them with atomics too
    (``GemmConfig.atomic_reductions=True``; NOTE [Atomic row and column max]) and so run
    data-parallel or split-K, never the stream-K decomposition (NOTE [Scalar reductions and
    stream-K]), which the heuristic never picks for them anyway. The row max on the H200
    (2026-11-25, before this rule): 1.25x cuBLAS at 1024x1024x16384 on ``kheavy`` and 1.64x at
    512x1024x4096x8 on ``streamk`` through the workspace, as slow as or slower than the eager
    unfused epilogue (1.25, 1.60).
    """
    if not traits.reductions or traits.workspace_reductions:
        return tuple(family)
    return tuple(dataclasses.replace(s, config=s.config.replace(atomic_reductions=True))
                 if s.arch == "sm90" and s.config.scheduler == "streamk" else s for s in family)


def default_family(arch: str, a: DType, b: DType) -> tuple[KernelSpec, ...]:
    """The kernels built for every epilogue by default (NOTE [The default sm90 family])."""
    base = default_config(arch, a, b)
    if arch != "sm90":
        return (KernelSpec("large", base, arch),)
    k = base.tile[2]
    return (
        KernelSpec("large", base, arch),
        KernelSpec("pingpong", GemmConfig(tile=(128, 192, k), cluster=(2, 1, 1), schedule="pingpong"), arch),
        KernelSpec("streamk", GemmConfig(tile=(128, 128, k), cluster=(1, 1, 1), scheduler="streamk"), arch),
        KernelSpec("kheavy", GemmConfig(tile=(128, 64, k), cluster=(1, 1, 1), scheduler="streamk"), arch),
        KernelSpec("small", GemmConfig(tile=(64, 128, k), cluster=(1, 1, 1), schedule="pingpong"), arch),
        KernelSpec("pp128", GemmConfig(tile=(128, 128, k), cluster=(1, 1, 1), schedule="pingpong"), arch),
        KernelSpec("pp64x256", GemmConfig(tile=(64, 256, k), cluster=(1, 1, 1), schedule="pingpong"), arch),
        KernelSpec("pp128x176", GemmConfig(tile=(128, 176, k), cluster=(1, 1, 1), schedule="pingpong"), arch),
        KernelSpec("swap", GemmConfig(tile=(64, 32, k), cluster=(1, 1, 1), schedule="pingpong", swap_ab=True), arch),
        KernelSpec("swap16", GemmConfig(tile=(64, 16, k), cluster=(1, 1, 1), schedule="pingpong", swap_ab=True),
                   arch),
        KernelSpec("swap16_c4", GemmConfig(tile=(64, 16, k), cluster=(4, 1, 1), schedule="pingpong", swap_ab=True),
                   arch),
        KernelSpec("swapk", GemmConfig(tile=(128, 32, k), cluster=(1, 1, 1), schedule="cooperative",
                                       scheduler="streamk", swap_ab=True), arch),
    )


#: the members built only when a problem needs them (:func:`on_demand`)
ON_DEMAND = ("unaligned", "unaligned_pingpong", "unaligned_k")


def on_demand(arch: str, a: DType, b: DType, name: str) -> KernelSpec:
    """A family member built only when a problem needs it (:data:`ON_DEMAND`): ``unaligned``,
    ``unaligned_pingpong`` (sm90; NOTE [The unaligned members' rule] says when) or ``unaligned_k``.

    Raises:
        KeyError: another name.
    """
    base = default_config(arch, a, b)
    if name == "unaligned":
        return KernelSpec(name, base.replace(unaligned=True), arch)
    if name == "unaligned_pingpong" and arch == "sm90":
        return KernelSpec(name, GemmConfig(tile=(128, 192, base.tile[2]), cluster=(2, 1, 1), schedule="pingpong",
                                           unaligned=True), arch)
    if name == "unaligned_k":
        return KernelSpec(name, default_config("sm80", a, b), "sm80")
    raise KeyError(name)


def _tiles(M: int, N: int, L: int, tile: tuple[int, int, int]) -> int:
    return math.ceil(M / tile[0]) * math.ceil(N / tile[1]) * L


MIN_SPLIT_K_TILES = 96
"""The fewest K tiles (of the tile's K extent) worth giving one split: shorter splits lost more
to the turnstile reduction than they gained on the H100 (1x4096x4096 took 17.5 us data-parallel and
22.5 us with 4 splits)."""


def split_count(tiles: int, k_tiles: int, sm_count: int, *, min_k_tiles: int = MIN_SPLIT_K_TILES,
                max_splits: int = 16) -> int:
    """K splits that fill the machine in one wave: the most with tiles x splits <= the SM count,
    each split at least ``min_k_tiles`` K tiles long (shorter ones spend more on the reduction
    than they save), at most ``max_splits``."""
    if tiles >= sm_count:
        return 1
    return max(1, min(sm_count // tiles, k_tiles // min_k_tiles, max_splits))


def _log_swizzle(ctas_m: int, ctas_n: int, max_swizzle: int) -> int:
    """log2 of the swizzle CUTLASS's sm90 tile schedulers use: ``get_log_swizzle_size`` in
    ``cutlass/gemm/kernel/tile_scheduler_params.h`` (``ctas_*`` already rounded to the cluster)."""
    least = min(ctas_m, ctas_n)
    if max_swizzle >= 8 and least >= 6:
        return 3
    if max_swizzle >= 4 and least >= 3:
        return 2
    if max_swizzle >= 2 and least >= 2:
        return 1
    return 0


def scheduled_tiles(config: GemmConfig, M: int, N: int, L: int = 1, swizzle: int | None = None) -> int:
    """Output tiles the sm90 persistent and stream-K schedulers hand out for an M x N x L problem
    (the kernel's own M and N: swap-AB's are the call's N and M): CUTLASS rounds the tile counts
    of M and of N each up to a multiple of cluster x swizzle (``PersistentTileSchedulerSm90Params
    ::initialize``, tile_scheduler_params.h), and the padding tiles are scheduled and run like the
    rest (``blocks_per_problem_`` counts them)."""
    tm, tn = config.tile[:2]
    cm, cn = config.cluster[:2]
    ctas_m = math.ceil(math.ceil(M / tm) / cm) * cm
    ctas_n = math.ceil(math.ceil(N / tn) / cn) * cn
    log = _log_swizzle(ctas_m, ctas_n, 1 << (config.swizzle if swizzle is None else swizzle))
    band = 1 << log
    return math.ceil(ctas_m / (band * cm)) * band * cm * math.ceil(ctas_n / (band * cn)) * band * cn * L


#: the most padding tiles a swizzle may add, as a share of the problem's tiles (NOTE [Swizzle padding])
SWIZZLE_WASTE = 0.03


def fit_swizzle(spec: KernelSpec, p: Problem) -> KernelSpec:
    """``spec`` with its tile order's band narrowed until CUTLASS's rounding adds at most
    :data:`SWIZZLE_WASTE` of padding tiles.

    NOTE [Swizzle padding]: CUTLASS's sm90 schedulers round the M and N tile counts up to a
    multiple of cluster x swizzle and run the padding tiles (out of bounds: zero-filled loads,
    predicated stores, full MMA time). With ``large``'s 2x1 cluster and 8-tile bands, M = 1024 (8
    tiles) became 16: on the H100 (2026-11-25, explore_members --torch) 1024x14336x4096 took 372
    us on ``large``, exactly its time at M = 2048, against 185 us on ``pingpong`` (no swizzle).
    Narrowing the band (a run-time argument, the same build) removes the padding."""
    cfg = spec.config
    if spec.arch != "sm90" or cfg.scheduler not in ("persistent", "streamk"):
        return spec
    if cfg.swizzle is None:  # the schedule's default
        cfg = cfg.replace(swizzle=default_swizzle("sm90", cfg.schedule))
    if not cfg.swizzle:
        return spec
    M, N = (p.N, p.M) if cfg.swap_ab else (p.M, p.N)
    least = scheduled_tiles(cfg, M, N, 1, swizzle=0)
    for log in range(cfg.swizzle, 0, -1):
        if scheduled_tiles(cfg, M, N, 1, swizzle=log) <= (1 + SWIZZLE_WASTE) * least:
            return spec if log == cfg.swizzle else dataclasses.replace(spec, config=cfg.replace(swizzle=log))
    return dataclasses.replace(spec, config=cfg.replace(swizzle=0))


def choose(family: dict[str, KernelSpec], p: Problem, arch: str, a: DType, b: DType,
           traits: EpilogueTraits = EpilogueTraits()) -> KernelSpec:
    """The kernel of a problem the selection model doesn't rank: rows TMA can't read.

    A and B rows that are not 16-byte aligned go to the sm80 ``unaligned_k`` kernel; M x N rows
    that are not, to ``unaligned`` (cooperative, 128x256 tiles) or ``unaligned_pingpong``
    (128x192) by NOTE [The unaligned members' rule]. An aligned problem takes the family's first
    member here: :class:`evtc.dispatch.family.GemmFamily` ranks aligned sm90 problems with the
    model before it asks.

    NOTE [The unaligned members' rule]: ping-pong where M <= 128 (one tile row) and the epilogue
    has no row or column reduction, else cooperative. Fitted on the calibration half of the
    ground truth (benchmarks/ground_truth/H200.json, the 48 (problem, class) rows with M x N rows
    TMA can't address): at one tile row the 192-wide tiles put a third more CTAs on a memory-bound
    problem (pointwise and aux: ping-pong 0.62-0.93 of cooperative's time at M <= 56, 1.13-1.34 at
    M >= 301 but one K-heavy problem); with reductions the ping-pong member was slower nearly
    everywhere (0.93-1.90). On the validation half, read once: chosen / the faster of the two
    1.029 geomean, 27 of 30 within 1.05 (the rule it replaced, from one H100 problem -- ping-pong
    for reductions at 15 waves or more: 1.203, 13 of 30; calibration 1.012 against 1.187).
    """
    if arch != "sm90" or "large" not in family:
        return next(iter(family.values()))
    if not p.aligned_k:
        return family.get("unaligned_k") or on_demand(arch, a, b, "unaligned_k")
    if not p.aligned_mn:
        name = "unaligned_pingpong" if p.M <= 128 and not traits.reductions else "unaligned"
        return family.get(name) or on_demand(arch, a, b, name)
    return fit_swizzle(next(iter(family.values())), p)
