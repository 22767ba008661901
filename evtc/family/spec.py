"""The kernels of a family and the choice of one per problem.

Input: the operand dtypes and an arch (the family), a :class:`Problem` (the choice). Output:
:class:`KernelSpec` s: each one emitted kernel (its compile-time :class:`GemmConfig` fields)
plus the run-time scheduler arguments a call passes it (split-K, the decomposition, the tile
order).

# NOTE [The default sm90 family]
One epilogue is built as a few kernels, chosen so that every problem shape has one that fills
the H100's 132 SMs (docs/performance.md has the measurements behind each):

* ``large``: cooperative 128x256x64, cluster 2x1, persistent: big problems (many tiles, the
  mainloop's arithmetic intensity matters most);
* ``pingpong``: ping-pong 128x192x64, cluster 2x1, persistent: one warpgroup's epilogue runs
  while the other's MMAs do, so epilogue-heavy problems (short K, many outputs) lose less to it;
* ``streamk``: cooperative 128x128x64, cluster 1x1, the stream-K scheduler: problems with few
  output tiles or long K loops, run as split-K (a fixed number of splits per tile) or stream-K
  (CUTLASS's balanced K ranges); the partial accumulators are reduced before the epilogue
  runs once per tile, so aux stores and reductions are exact;
* ``swap``: swap-AB (``D^T = B A^T``) with a 128x32x64 cooperative stream-K tile: decode-sized M
  (<= 64) puts the long N on the tile's M and splits K to fill the machine.

Built on demand, never by default: ``unaligned`` (the large tile with every M x N tensor
register-direct, for rows not 16-byte aligned) and, for A or B rows not 16-byte aligned (K not a
multiple of 8 in 16-bit), an sm80 kernel with one-element mainloop accesses, which runs on Hopper
through the driver's PTX JIT.
"""

from __future__ import annotations

import dataclasses
import math

from evtc.dtypes import DType
from evtc.plan.config import GemmConfig, default_config

__all__ = ["KernelSpec", "Problem", "choose", "default_family", "on_demand"]


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
    sm_count: int = 132


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

    def with_runtime(self, **changes) -> "KernelSpec":
        return dataclasses.replace(self, config=self.config.replace(**changes))


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
        KernelSpec("swap", GemmConfig(tile=(128, 32, k), cluster=(1, 1, 1), scheduler="streamk", swap_ab=True), arch),
    )


def on_demand(arch: str, a: DType, b: DType, name: str) -> KernelSpec:
    """A family member built only when a problem needs it: ``unaligned`` or ``unaligned_k``."""
    base = default_config(arch, a, b)
    if name == "unaligned":
        return KernelSpec(name, base.replace(unaligned=True), arch)
    if name == "unaligned_k":
        return KernelSpec(name, default_config("sm80", a, b), "sm80")
    raise KeyError(name)


def _tiles(M: int, N: int, L: int, tile: tuple[int, int, int]) -> int:
    return math.ceil(M / tile[0]) * math.ceil(N / tile[1]) * L


MIN_SPLIT_K_TILES = 4
"""The fewest K tiles (of the tile's K extent) worth giving one split or stream-K unit."""


def split_count(tiles: int, k_tiles: int, sm_count: int, *, min_k_tiles: int = MIN_SPLIT_K_TILES,
                max_splits: int = 16) -> int:
    """K splits that fill the machine in one wave: the most with tiles x splits <= the SM count,
    each split at least ``min_k_tiles`` K tiles long (shorter ones spend more on the reduction
    than they save), at most ``max_splits``."""
    if tiles >= sm_count:
        return 1
    return max(1, min(sm_count // tiles, k_tiles // min_k_tiles, max_splits))


def choose(family: dict[str, KernelSpec], p: Problem, arch: str, a: DType, b: DType) -> KernelSpec:
    """The kernel for problem ``p``, by a heuristic that is good without tuning (measured on the
    H100: docs/performance.md); a tuned choice, when the tuner stored one, takes precedence in
    :class:`evtc.Gemm`.

    Rules, in order: rows that TMA can't read go to the on-demand unaligned kernels; small M to
    swap-AB with split-K; problems that leave SMs idle with the large tile, or have long K loops,
    to the stream-K kernel with split-K; everything else to the large kernel.
    """
    if arch != "sm90" or "large" not in family:
        return next(iter(family.values()))
    if not p.aligned_k:
        return family.get("unaligned_k") or on_demand(arch, a, b, "unaligned_k")
    if not p.aligned_mn:
        return family.get("unaligned") or on_demand(arch, a, b, "unaligned")
    large = family["large"]
    if p.M <= 64 and p.N >= 256 and "swap" in family:
        spec = family["swap"]
        tiles = _tiles(p.N, p.M, p.L, spec.config.tile)
        k_tiles = math.ceil(p.K / spec.config.tile[2])
        splits = split_count(tiles, k_tiles, p.sm_count)
        return spec.with_runtime(split_k=splits, decomposition="split_k" if splits > 1 else "data_parallel")
    tiles = _tiles(p.M, p.N, p.L, large.config.tile)
    if "pingpong" in family and _tiles(p.M, p.N, p.L, family["pingpong"].config.tile) >= 15 * p.sm_count:
        # many waves: ping-pong's overlap of one warpgroup's epilogue with the other's MMAs pays
        # (H100, bias_relu: 0.93-0.96 of cuBLAS at 8192^3, 16384x4096x1024, 4096x14336x4096 and
        # 4096x50264x4096, where the cooperative kernel took 1.00-1.07; docs/performance.md)
        return family["pingpong"]
    if "streamk" in family and (tiles < p.sm_count // 2 or p.K >= 4 * max(p.M, p.N)):
        spec = family["streamk"]
        tiles = _tiles(p.M, p.N, p.L, spec.config.tile)
        k_tiles = math.ceil(p.K / spec.config.tile[2])
        splits = split_count(tiles, k_tiles, p.sm_count)
        if splits > 1:
            return spec.with_runtime(split_k=splits, decomposition="split_k")
        # K loops too short to split: stream-K's partial tiles would cost a workspace memset and
        # a reduction for no gain (256^3 on the H100: ~10 us launch with them), so the stream-K
        # kernel runs data-parallel, with the smaller tile's extra CTAs.
        return spec.with_runtime(split_k=1,
                                 decomposition="heuristic" if k_tiles >= 2 * MIN_SPLIT_K_TILES else "data_parallel")
    return large
