"""The kernels of a family and the choice of one per problem.

Input: the operand dtypes and an arch (the family), a :class:`Problem` (the choice). Output:
:class:`KernelSpec` s: each one emitted kernel (its compile-time :class:`GemmConfig` fields)
plus the run-time scheduler arguments a call passes it (split-K, the decomposition, the tile
order).

# NOTE [The default sm90 family]
One epilogue is built as a few kernels, chosen so that every problem shape has one that fills
the H100's 132 SMs. Each was picked by timing candidates in CUDA graphs beside cuBLAS
(benchmarks/explore_small.py, bench_shapes.py; docs/performance.md has the numbers):

* ``large``: cooperative 128x256x64, cluster 2x1, persistent: problems of a wave or more of its
  tiles (the mainloop's arithmetic intensity matters most);
* ``pingpong``: ping-pong 128x192x64, cluster 2x1, persistent: 15 waves or more, where one
  warpgroup's epilogue running beside the other's MMAs pays;
* ``streamk``: cooperative 128x128x64, cluster 1x1, the stream-K scheduler, run data-parallel:
  problems of most of a wave of 128x128 tiles but less than one of 128x256 (batched mid sizes,
  512x4096x4096, 2048x2048x8192) with K below 4096 or an epilogue that reduces through the
  workspace (the rest take ``pp128``), and the tuner's split-K and stream-K candidates;
* ``kheavy``: cooperative 128x64x64, cluster 1x1, stream-K scheduler: long K over few tiles
  (1024x1024x16384, 512x512x32768), split-K where the tiles leave SMs idle; the partial
  accumulators are reduced before the epilogue runs once per tile, so aux stores and reductions
  are exact;
* ``small``: ping-pong 64x128x64, cluster 1x1: few tiles (768x768x3072, 1000^3) and M of 65-256;
* ``pp128``: ping-pong 128x128x64, cluster 1x1: most of a wave to two of 128x128 tiles, less
  than a wave of 128x256, K of 4096 or more (NOTE [Ping-pong 128x128 tiles below two waves];
  ``streamk`` keeps the epilogues with reductions through the workspace there);
* ``pp64x256``: ping-pong 64x256x64, cluster 1x1: M of 2048 or less against a long N (NOTE [The
  64x256 ping-pong tile]);
* ``pp128x176``: ping-pong 128x176x64, cluster 1x1: M of 3072 or less against a long N where its
  tiles fill the machine's waves at least as well as every other ping-pong tile's and ``large``'s
  (NOTE [The 128x176 ping-pong tile]); its WGMMA is one m64n176k16 a K step (NOTE [Extended WGMMA
  shapes] in evtc/emit/sm90.py);
* ``swap16_c4``: swap-AB (``D^T = B A^T``) ping-pong 64x16x64 in 4x1 clusters: decode sizes
  (M <= 16) against N of 4096 or more, at any K (NOTE [Decode tiles in 4x1 clusters]);
* ``swap16``: the same tile without a cluster: decode-sized M (<= 32), where the long N goes on
  the tile's M and the call's M on a 16-wide tile N;
* ``swap``: the same on a 64x32 tile: M of 33-64, and M <= 32 with a long K (K > 2N).

The 16-wide swap tile (H100, 2026-11-26, CUDA graphs, / cuBLAS, beside the 64x32 one and eager
unfused): at 1x4096x4096 bias_relu 1.080 against 1.358, the row max 1.245 against 1.530 (eager
1.524), the aux-heavy epilogue 1.046 against 1.260; at 16x4096x4096 1.049 / 1.314 / 1.052
against 1.303 / 1.537 / 1.343; at 32x28672x4096 1.006 / 1.035 / 1.031 against 1.019 / 1.090 /
1.038 (the row max on ``small`` 1.036). It loses where the mainloop dominates: 16x4096x14336
1.034 / 1.080 / 1.025 against 1.006 / 1.048 / 0.987, 64x8192x8192 1.112 / 1.200 / 1.137 against
1.052 / 1.110 / 1.073 (docs/performance.md, "The 16-wide swap tile").

Split-K over the stream-K scheduler's turnstile reduction paid only for K loops of about 100 K
tiles per split or more (measured: 1x4096x4096 took 17.5 us data-parallel and 22.5 us with 4
splits), hence :data:`MIN_SPLIT_K_TILES`.

Built on demand, never by default: ``unaligned`` (the large tile with every M x N tensor
register-direct, for rows not 16-byte aligned; ``unaligned_pingpong`` the same on the ping-pong
tile, for epilogues with reductions at 15 waves or more: NOTE [Epilogue-aware choices]) and, for A or B rows not 16-byte aligned (K not a
multiple of 8 in 16-bit), an sm80 kernel with one-element mainloop accesses, which runs on Hopper
through the driver's PTX JIT.
"""

from __future__ import annotations

import dataclasses
import math

from evtc.dtypes import DType
from evtc.plan.config import GemmConfig, default_config, default_swizzle

__all__ = ["EpilogueTraits", "KernelSpec", "Problem", "choose", "default_family", "fit_cluster", "fit_swizzle",
           "on_demand", "scheduled_tiles"]


@dataclasses.dataclass(frozen=True)
class EpilogueTraits:
    """What of the epilogue the choice depends on (NOTE [Epilogue-aware choices]).

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
        tile_reductions = [o for o in outs if isinstance(o, Reduction) and o.dim is not None]
        return cls(reductions=bool(tile_reductions),
                   aux_stores=sum(isinstance(o, Store) for o in outs) > 1,
                   workspace_reductions=not all(o.atomic_capable for o in tile_reductions))

    def takes_pingpong(self, K: int) -> bool:
        """Whether the ping-pong rules apply at a K of ``K``: not to reductions through the
        workspace, whose per-tile cost the ping-pong overlap doesn't hide, nor to aux stores below
        K = 4096 (NOTE [Epilogue-aware choices], NOTE [Aux stores on ping-pong over a long K])."""
        return not self.workspace_reductions and (not self.aux_stores or K >= 4096)


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
        NOTE [Stores into packed rows] in evtc/plan/sm90.py), built on demand."""
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
    )


def on_demand(arch: str, a: DType, b: DType, name: str) -> KernelSpec:
    """A family member built only when a problem needs it: ``unaligned``, ``unaligned_pingpong``
    (the ping-pong tile, for problems of 15 waves or more) or ``unaligned_k``."""
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


def wave_efficiency(tiles: int, sm_count: int) -> float:
    """The fraction of the SM-waves a persistent kernel's ``tiles`` keep busy: tiles / (SMs x waves).

    NOTE [One wave of ping-pong tiles over a long K]: between one and two waves of 128x128 tiles
    and a K of at least 4 max(M, N), fewer than one wave of 128x256 tiles, where ping-pong's
    128x192 tiles fit one wave (H100, 2026-11-26, benchmarks/explore_members.py, bias_relu, CUDA
    graphs, / cuBLAS): ``pingpong`` 1.180 / 1.005 / 1.186 at 2048x1280x11520, 1536x1536x12288 and
    1280x2048x12288, where ``streamk`` (CUTLASS's heuristic decomposition: stream-K over 1-2
    waves) took 1.599 / 1.410 / 1.616 and ``large`` 2.442 / 1.581 / 1.815. At 2560x1280x10240
    (140 ping-pong tiles, over a wave) the 128x192 tile lost: 1.610 against ``streamk``'s 1.084
    (that problem takes ``pp128`` since 2026-11-27: NOTE [Ping-pong 128x128 tiles below two
    waves]). The
    same shapes are the UNet's 1280-channel 3x3 convolutions as implicit GEMMs
    (docs/performance.md, "It is not the im2col mainloop"). Heavy epilogues take it too, unlike
    every other ping-pong rule: with one tile per CTA no warpgroup's epilogue waits for another's
    (the second run, all three epilogues: bias_relu 1.175 / 1.027 / 1.183, the row max 1.187 /
    1.027 / 1.196, the aux-heavy epilogue 1.377 / 1.239 / 1.382 against ``streamk``'s 1.754 /
    1.560 / 1.703; at 2560x1280x10240 ``streamk`` 1.084 / 1.088 / 1.164 against ping-pong's 1.590
    / 1.581 / 1.727).

    NOTE [Wave quantisation between large and ping-pong]: below the 15 waves where ping-pong's
    overlap always pays, a light epilogue still takes ``pingpong`` (128x192) over ``large``
    (128x256) when it has 2 waves or more and its last wave is fuller by more than 3 % of the
    machine (4 waves or more until 2026-11-26: fc2 of the MLP block at 1536 tokens,
    1536x4096x14336 + bias + residual, has 192 large tiles, 2 waves 0.73 full, and 264 ping-pong
    tiles, 2 waves 1.00 full; ``explore_members.py --torch 1536`` on the H100, CUDA graphs, /
    cuBLAS: pingpong 1.058, large 1.437; at 2048 tokens, 0.97 / 0.89 full, large 1.023 and pingpong
    1.128, which the rule keeps). fc1 of the MLP block at 1024 tokens (1024x14336x4096 + GELU): 448 large tiles are 3.4
    waves (0.85 of them busy), 600 ping-pong tiles 4.5 (0.91); ``explore_members.py --torch 1024``
    on the H200 (2026-11-25, CUDA graphs, / cuBLAS): pingpong 1.19, large 1.34; at 1536 tokens
    (0.85 / 0.97) 0.99 against 1.40, at 3072 (0.92 / 0.97) ping-pong 1.10, streamk 1.25 and large
    slower still; the MLP block at 1024 tokens went from 1.049 to 0.983 of torch.compile's time
    (bench_torch.py). Unchanged by the rule: 512 tokens (large 1.09, its 4 ping-pong waves are 0.85
    full), 4096^3 (0.97 large, 0.89 ping-pong), 8192x4096x14336 (0.97 both: large) and every
    other problem of bench_shapes.py.
    """
    waves = math.ceil(tiles / sm_count)
    return tiles / (waves * sm_count)


def useful_fraction(p: Problem, tile: tuple[int, ...]) -> float:
    """The fraction of the SM-waves a persistent kernel of ``tile`` spends on the problem's own
    M x N x L elements: M N L / (SMs x waves x tile M x tile N). Unlike :func:`wave_efficiency` it
    also counts the tiles' padding past M and N (14336 columns are 81.5 tiles of 176).
    """
    tiles = _tiles(p.M, p.N, p.L, tile)
    waves = math.ceil(tiles / p.sm_count)
    return p.M * p.N * p.L / (waves * p.sm_count * tile[0] * tile[1])


# NOTE [Ping-pong 128x128 tiles below two waves]: the problems of most of a wave to two of 128x128
# tiles that have less than a wave of 128x256 ones, with an M above 256 (the down-projection of a
# transformer's MLP at 1024 tokens, 1024x4096x14336; 512x4096x4096; 2048x2048x8192; batched mid
# sizes such as 512x1024x4096x8) run best on the 128x128 tile of the ping-pong kernel, not of the
# cooperative one (``streamk``, run data-parallel, before 2026-11-27). On the H100 (2026-11-27,
# .carry probe, CUDA graphs, / cuBLAS's plain GEMM, two runs; pp128 against streamk):
#   1024x4096x14336: bias_relu 1.014 / 1.022 against 1.038 / 1.033, rowmax 1.030 / 1.026 against
#     1.055 / 1.051, aux_heavy 1.048 / 1.063 against 1.069 / 1.088, fc2 (+ bias + residual) 1.008
#     / 1.016 against 1.040 / 1.046;
#   1024x4096x11008: 1.020 / 1.016, 1.030 / 1.034, 1.055 / 1.063, 1.014 / 1.017 against 1.045 -
#     1.098;
#   2048x2048x8192: 1.033 / 1.034, 1.032 / 1.118, 1.112 / 1.137, 1.112 / 1.025 against 1.066 /
#     1.064, 1.068 / 1.066, 1.138 / 1.158, 1.074 / 1.070 (the one shape where single runs lost);
#   512x1024x4096x8: 1.094 / 1.061, 1.086 / 1.056, 1.223 / 1.215, 1.089 / 1.054 against 1.117 -
#     1.341;
#   512x4096x4096: 1.103 / 1.110, 1.165 / 1.167, 1.267 / 1.274, 1.094 / 1.090 against 1.114 -
#     1.322.
# The same tile with a 2x1 cluster was no better (1.013-1.267), the cooperative 128x256 tile with a
# 1x2 cluster close at 1024-2048 rows (1.020-1.100) and 1.86-2.03 at 512 (32 tiles). Reductions
# through the workspace were not measured on it and keep ``streamk`` (:meth:`EpilogueTraits.
# takes_pingpong`), and so do K below 4096: every problem measured had K of 4096-14336, and with
# one or two tiles a CTA a short K leaves the last tile's epilogue (one warpgroup's, not two)
# a larger share of the time.

# NOTE [Decode tiles in 4x1 clusters]: at decode sizes (M <= 16: one 16-wide tile N under
# swap-AB) against an N of 4096 or more the swap-AB 64x16 ping-pong tile runs faster in 4x1
# clusters (four CTAs along the weights' rows, the activations' tile multicast to them), at any K;
# from M = 24 on (two tile columns) the cluster costs 10-140 %. On the H100 (2026-11-27, a .carry
# probe, CUDA graphs, time / cuBLAS's plain GEMM, two runs; swap16_c4 against the pick then:
# swap16, or swap where K > 2N; fc1 = + bias + exact GELU, fc2 = + bias + residual, the MLP
# block's GEMMs; bench_shapes.py's epilogues):
#   fc1 1x14336x4096 1.045 against 1.057 (an earlier run: 1.021-1.028 against 1.025-1.028),
#     8x14336x4096 1.010 against 1.043, 16x14336x4096 0.993 against 1.037 (earlier run);
#   fc2 1x4096x14336 0.982 against 1.042 (cuBLAS runs it split-K with a reduction kernel),
#     8x4096x14336 0.962 against 1.007;
#   bias_relu 1x4096x4096 0.880 against 1.045, 16x4096x4096 0.999 / 1.060, 1x14336x4096 1.042 /
#     1.055, 16x4096x14336 0.953 / 1.005; rowmax 1.085 / 1.27, 1.19 / 1.25, 1.123 / 1.130,
#     1.004 / 1.063; aux_heavy 0.913 / 1.14, 1.01 / 1.06, 1.05 / 1.07, 0.956 / 0.976;
#   losses where M > 16: 32x4096x4096 2.17-2.41 against 1.16-1.42, 32x28672x4096 1.11-1.19
#     against 0.97-1.00, 24x8192x8192 1.31-1.36 against 1.04-1.11, fc1 32x14336x4096 1.118
#     against 1.048; fc2 32x4096x14336 1.409 against 1.0 (swap).
# A 2x1 cluster gained less or lost (1.00-1.61); the 64x32 tile in 4x1 clusters came close to
# this one at M <= 16 (0.89-1.21). N below 4096 (fewer than 64 tiles) and epilogues reducing
# through the workspace were not measured and keep ``swap16``.

# NOTE [The 128x176 ping-pong tile]: an M of 3072 or less against a long N (N >= 8192, K <= 2N:
# the up-projection of a transformer's MLP at 1024-3072 tokens) runs best on 128x176 ping-pong
# tiles (cluster 1x1) wherever they fill the waves at least as well (:func:`useful_fraction`,
# padding counted) as ``pingpong``'s 128x192, ``pp64x256``'s and ``large``'s 128x256 tiles, from
# 3.5 waves on. Ties go to 128x176: it reuses each operand element more than 64x256 (M N / (M + N)
# multiply-adds per element loaded: 74 against 51) and measured 1-2 % faster at equal fill
# (2048x11008x4096). Its WGMMA is one m64n176k16 a K step only
# since NOTE [Extended WGMMA shapes] (evtc/emit/sm90.py); before, CUTLASS split the tile into
# eleven m64n16k16 and it took 2.2x cuBLAS. On the H100 (2026-11-27, a .carry probe, CUDA graphs,
# / cuBLAS's plain GEMM, two runs; fc1 = + bias + exact GELU, and bench_shapes.py's epilogues;
# pp128x176 against the pick then; fill of 176 / of the pick's tile):
#   1024x14336x4096 (0.99 / 0.97): fc1 1.041 / 1.045 against 1.067 / 1.067, bias_relu 1.033 / 1.032
#     against 1.048 / 1.050, rowmax 1.034 / 1.027 against 1.050 / 1.036, aux_heavy 1.095 / 1.090
#     against 1.140 / 1.134;
#   2048x14336x4096 (0.99 / 0.97): 0.980 / 0.989, 0.981 / 0.982, 0.965 / 0.964, 1.052 / 1.009
#     against 1.008 / 1.024, 1.044 / 1.061, 0.989 / 0.991, 1.099 / 1.078;
#   1024x28672x4096 (0.99 / 0.97): 0.970 / 0.979, 0.968 / 0.972, 0.966 / 0.966, 1.011 / 1.015
#     against 1.004 - 1.074;
#   1024x11008x4096 (0.95 / large's 0.87): 1.076 / 1.075, 1.059 / 1.071, 1.067 / 1.075, 1.147 / 1.148
#     against 1.198 - 1.313;
#   2048x11008x4096 (0.95 / 0.95): 0.975 / 0.975, 0.964 / 0.966, 0.960 / 0.961, 1.015 / 1.010
#     against 0.965 - 1.057;
#   3072x14336x4096 (0.99 / 128x192's 0.97): 0.913 / 0.917, 0.906 / 0.903, 0.898 / 0.902, 0.948 /
#     0.954 against 0.936 / 0.940, 0.922 / 0.917, 0.915 / 0.918, 0.971 / 0.970.
# Where another tile fills the waves better, the rule keeps the pick: 1024x8192x8192 (0.94 /
# pp64x256's 0.97): 1.051 - 1.084 against 1.009 - 1.054; 1536x14336x4096 (0.93 / 128x192's 0.97):
# 0.964 - 1.013 against 0.919 - 0.983. At 8192x14336x4096 (fc1, three runs, past this rule's M) it
# took 0.986 / 1.014 / 0.992 against ``pingpong``'s 0.995 / 1.017 / 1.006. The cooperative 128x176
# tile took 1.12-1.36 at 1024-2048 rows (one 128x176 accumulator over two warpgroups: the tile's
# epilogue is not hidden), so the member is ping-pong. Epilogues whose reductions go through the
# workspace were not measured on it and keep the rest of the rules.

# NOTE [The 64x256 ping-pong tile]: an M of 2048 or less against a long N (the up-projection of a
# transformer's MLP at 1024-2048 tokens) runs best on 64x256 ping-pong tiles, where their last
# wave is fuller than the 128x192 ping-pong tiles' by more than 3 % of the machine, from 3.5 waves
# on. Measured on the H100 (2026-11-26, benchmarks/explore_members.py, CUDA graphs, / cuBLAS's plain
# GEMM; pp64x256 against the pick then):
#   1024x14336x4096 (6.8 waves, 0.97 full; 128x192: 0.91): fc1 + GELU 1.080 / 1.160, bias_relu
#     1.062 / 1.120, rowmax 1.046 / 1.118, aux_heavy 1.190 / 1.471 (large);
#   2048x14336x4096 (13.6 waves): fc1 1.060 / 1.119, bias_relu 0.993 / 1.060, rowmax 0.992 / 1.052,
#     aux_heavy 1.120 / 1.237;
#   1024x8192x8192 (3.9 waves): bias_relu 1.012 / 1.024, rowmax 1.016 / 1.036, aux_heavy 1.085 / 1.132;
#   1024x28672x4096: bias_relu 1.005 / 1.066, rowmax 0.991 / 1.045, aux_heavy 1.138 / 1.238.
# Where it lost, the rule keeps the pick: 1536x14336x4096 (11 waves 0.93 full, 128x192 0.97):
# pingpong 0.990 / 0.925 / 0.934 against 1.055 / 1.009 / 1.006 (fc1, bias_relu, rowmax);
# 3072x14336x4096 (M > 2048): pingpong 0.972 against 1.007; an N of 2048-4096 (2048x2048x2048x4,
# 2048x4096x4096: large 1.128 / 1.068 against 1.2 or more); and a K much longer than N (fc2 of
# the MLP, 1024-2048x4096x14336: 1.76-1.87). With M = 8192 it took 2.4x (fc1): one 64-row A tile
# per 256 columns of B moves twice the operand bytes per MMA of 128x256, more than L2 serves once
# the operands outgrow it. Epilogues whose reductions go through the workspace were not measured
# and keep the rest of the rules.

# NOTE [Aux stores on ping-pong over a long K]: an epilogue with aux stores (but no reduction
# through the workspace) takes the ping-pong rules like a light one once K >= 4096: each tile's
# epilogue is then short beside its mainloop, and ping-pong runs it under the other warpgroup's
# MMAs. Measured on the H100 (2026-11-26, explore_members.py, aux_heavy = an aux store and two aux
# loads, CUDA graphs, / cuBLAS; pingpong against large, the pick then): 1536x14336x4096 1.035 /
# 1.478, 3072x14336x4096 1.000 / 1.231, 4096x14336x4096 1.150 / 1.265, 8192^3 1.061 / 1.106,
# 4096x50264x4096 1.194 / 1.359, 2048x32000x4096 1.031 / 1.238, 8192x14336x4096 1.208 / 1.217;
# the rules keep large where ping-pong was not faster: 4096^3 1.202 / 1.208, 8192x4096x14336 1.043
# / 1.039. At K = 1024 (16384x4096x1024) ping-pong stays out: 2.16 against 1.77 there (NOTE
# [Epilogue-aware choices]), 1.98 or more in this run against large's 1.77. Reductions through
# the workspace were not measured at long K and keep large.

MIN_SPLIT_K_TILES = 96
"""The fewest K tiles (of the tile's K extent) worth giving one split: shorter splits lost more
to the turnstile reduction than they gained on the H100 (NOTE [The default sm90 family])."""


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


#: the most padding tiles a cluster's rounding may add, as a share of the problem's tiles, before
#: the member runs without its cluster (NOTE [Cluster padding])
CLUSTER_WASTE = 0.10


def fit_cluster(spec: KernelSpec, p: Problem) -> KernelSpec:
    """``spec`` without its cluster (``<name>_c1``, cluster 1x1x1, built on demand) where CUTLASS's
    rounding of the tile counts to the cluster would add more than :data:`CLUSTER_WASTE` of
    padding tiles; else ``spec``.

    NOTE [Cluster padding]: CUTLASS's sm90 schedulers round each batch's M and N tile counts up
    to a multiple of the cluster's extents (:func:`scheduled_tiles`), and a padding tile costs a
    whole tile's MMAs (NOTE [Swizzle padding]). A 2x1 cluster over one M tile a batch computes
    twice the rows: on the H100 (2026-11-26, the row-phase split's main call, 8 batches of 128
    rows x 50257 x 4096, bias_relu) ``pingpong`` took 2.45-2.55x the aligned time and the same
    member without its cluster 1.17x. What the cluster buys (A and B tiles multicast to its two
    CTAs) was 2.6 % where it wastes nothing (aux_heavy at 2048 x 32008 x 4096: ``pingpong`` 1.004,
    ``pingpong_c1`` 1.030 of the family's pick, H100, 2026-11-27). So a waste above 10 % drops
    the cluster; an LM head at 128 tokens (128 x 50264 x 4096 on ``large``: one M tile scheduled
    as two) is the common problem this catches."""
    cfg = spec.config
    if spec.arch != "sm90" or cfg.cluster is None or tuple(cfg.cluster[:2]) == (1, 1):
        return spec
    M, N = (p.N, p.M) if cfg.swap_ab else (p.M, p.N)
    exact = _tiles(M, N, 1, cfg.tile)
    padded = scheduled_tiles(cfg, M, N, 1, swizzle=0)
    if exact == 0 or padded <= (1 + CLUSTER_WASTE) * exact:
        return spec
    return KernelSpec(spec.name + "_c1", cfg.replace(cluster=(1, 1, 1)), spec.arch)


def choose(family: dict[str, KernelSpec], p: Problem, arch: str, a: DType, b: DType,
           traits: EpilogueTraits = EpilogueTraits()) -> KernelSpec:
    """The kernel for problem ``p``, by a heuristic that is good without tuning (measured on the
    H100: docs/performance.md); a tuned choice, when the tuner stored one, takes precedence in
    :class:`evtc.Gemm`.

    Rules, in order (NOTE [The default sm90 family]): rows that TMA can't read go to the
    on-demand unaligned kernels; M <= 16 against N >= 4096 to the 16-wide swap-AB tile in 4x1
    clusters ``swap16_c4`` (NOTE [Decode tiles in 4x1 clusters]), other M <= 32 to ``swap16``
    (unless K > 2N),
    M <= 64 to ``swap``; 15 waves or more of ping-pong tiles to
    ping-pong; an M of 3072 or less against a long N to ``pp128x176`` where its tiles fill the waves
    best (NOTE [The 128x176 ping-pong tile]), else, for an M of 2048 or less, to ``pp64x256`` (NOTE
    [The 64x256 ping-pong tile]); a wave or more of 128x256 tiles to the large kernel, or to
    ping-pong where its last wave is fuller (NOTE [Wave quantisation between large and
    ping-pong]); long K (>= 128 K tiles) over less than a wave of 128x128 tiles to ``kheavy``
    (split-K where its tiles leave SMs idle); most of a wave of 128x128 tiles to ``pp128`` from K =
    4096 on (NOTE [Ping-pong 128x128 tiles below two waves]),
    else ``streamk`` (data-parallel); the rest (few tiles, M of 65-256) to ``small``.
    ``traits`` change four of them (NOTE [Epilogue-aware choices]). The member then drops its
    cluster where the cluster's rounding pads the tiles (:func:`fit_cluster`, NOTE [Cluster
    padding]) and narrows its tile order's band where that pads them (:func:`fit_swizzle`).

    NOTE [Epilogue-aware choices]: measured on the H100 (2026-11-23,
    benchmarks/explore_members.py, time / cuBLAS's plain GEMM in CUDA graphs):
    * a row or column reduction under swap-AB becomes the other kind over the long N: the row max
      took 2.57 / 2.83 / 1.95x cuBLAS on swap at 1x4096x4096 / 32x28672x4096 / 64x8192x8192
      against 2.21 / 1.93 / 1.38x on ``small``: epilogues with reductions didn't take swap-AB.
      With the parallel final reduction (evtc::Sm90ColReductionParallel /
      Sm90RowReductionParallel, codegen_templates/include/evtc/sm90_reductions.hpp; 2026-11-25)
      the row max took 1.69 / 1.67 / 1.16 / 1.18 / 1.32x on swap at M = 1 / 16 / 32 / 64 / 128
      against 2.21 / 2.40 / 1.13 / 1.17 / 1.22x on ``small``: swap-AB for M <= 16 only;
    * at 16384x4096x1024 (21 waves of ping-pong tiles) the row max took 1.85x on ``pingpong``
      and 1.46x on ``large``, the aux-heavy epilogue (an aux store and two aux loads) 2.16x
      against 1.77x (bias_relu: 0.92x on ping-pong): heavy epilogues (reductions, aux stores)
      don't take ping-pong. Since the f32 row max reduces with atomics (NOTE [Atomic row and
      column max]; H200, 2026-11-25) it takes 0.94x on ``pingpong`` and 1.11x on ``large``: only
      reductions through the workspace (sums, 16-bit outputs) count as heavy; and since
      2026-11-26 aux stores only below K = 4096 (NOTE [Aux stores on ping-pong over a long K]);
    * unaligned N (4096x50257x4096): ``unaligned`` (cooperative) beat ``unaligned_pingpong`` for
      bias_relu (0.237 / 0.268 of cuBLAS) and the aux-heavy epilogue (0.429 / 0.618); the row
      max was the other way (0.189 / 0.181): ``unaligned_pingpong`` only for epilogues with
      reductions.
    """
    return fit_swizzle(fit_cluster(_choose(family, p, arch, a, b, traits), p), p)


def _choose(family: dict[str, KernelSpec], p: Problem, arch: str, a: DType, b: DType,
            traits: EpilogueTraits) -> KernelSpec:
    if arch != "sm90" or "large" not in family:
        return next(iter(family.values()))
    if not p.aligned_k:
        return family.get("unaligned_k") or on_demand(arch, a, b, "unaligned_k")
    if not p.aligned_mn:
        # register-direct stores cost the epilogue most where tiles are many: ping-pong hides
        # one warpgroup's epilogue behind the other's MMAs
        many = _tiles(p.M, p.N, p.L, (128, 192, 1)) >= 15 * p.sm_count
        name = "unaligned_pingpong" if many and traits.reductions else "unaligned"
        return family.get(name) or on_demand(arch, a, b, name)

    def has(*names: str) -> bool:
        return all(n in family for n in names)

    large = family["large"]
    if p.M <= 16 and p.N >= 4096 and not traits.workspace_reductions and has("swap16_c4"):
        # NOTE [Decode tiles in 4x1 clusters]
        return family["swap16_c4"]
    if p.M <= (16 if traits.workspace_reductions else 32) and p.N >= 256 and p.K <= 2 * p.N and has("swap16"):
        return family["swap16"]
    if p.M <= 64 and p.N >= 256 and has("swap") and (not traits.reductions or p.M <= 16):
        return family["swap"]
    if p.M <= 64 and p.N >= 256 and has("small"):
        return family["small"]
    pingpong_ok = traits.takes_pingpong(p.K)
    if (has("pingpong") and pingpong_ok
            and _tiles(p.M, p.N, p.L, family["pingpong"].config.tile) >= 15 * p.sm_count):
        # many waves: ping-pong's overlap of one warpgroup's epilogue with the other's MMAs pays
        # (H100, bias_relu: 0.93-0.96 of cuBLAS at 8192^3, 16384x4096x1024, 4096x14336x4096 and
        # 4096x50264x4096, where the cooperative kernel took 1.00-1.07; docs/performance.md)
        return family["pingpong"]
    # the up-projection shapes the two long-N ping-pong tiles were measured on
    long_n = not traits.workspace_reductions and p.N >= 8192 and p.K <= 2 * p.N
    if has("pp128x176", "pp64x256", "pingpong") and long_n and pingpong_ok and p.M <= 3072:
        # NOTE [The 128x176 ping-pong tile]
        tile = family["pp128x176"].config.tile
        if _tiles(p.M, p.N, p.L, tile) >= 3.5 * p.sm_count and useful_fraction(p, tile) >= max(
                useful_fraction(p, family[n].config.tile) for n in ("pingpong", "pp64x256", "large")):
            return family["pp128x176"]
    if has("pp64x256", "pingpong") and long_n and p.M <= 2048:
        # NOTE [The 64x256 ping-pong tile]
        t64 = _tiles(p.M, p.N, p.L, family["pp64x256"].config.tile)
        t192 = _tiles(p.M, p.N, p.L, family["pingpong"].config.tile)
        if t64 >= 3.5 * p.sm_count and wave_efficiency(t64, p.sm_count) > wave_efficiency(t192, p.sm_count) + 0.03:
            return family["pp64x256"]
    large_tiles = _tiles(p.M, p.N, p.L, large.config.tile)
    if has("pingpong") and pingpong_ok and large_tiles >= p.sm_count:
        # NOTE [Wave quantisation between large and ping-pong]
        pp_tiles = _tiles(p.M, p.N, p.L, family["pingpong"].config.tile)
        if pp_tiles >= 2 * p.sm_count and wave_efficiency(pp_tiles, p.sm_count) > \
                wave_efficiency(large_tiles, p.sm_count) + 0.03:
            return family["pingpong"]
    if large_tiles >= p.sm_count:
        return large
    if not has("streamk", "kheavy", "small"):
        return large
    tiles128 = _tiles(p.M, p.N, p.L, family["streamk"].config.tile)
    if (has("pingpong") and tiles128 >= p.sm_count and p.K >= 4 * max(p.M, p.N)
            and _tiles(p.M, p.N, p.L, family["pingpong"].config.tile) <= p.sm_count):
        # NOTE [One wave of ping-pong tiles over a long K]
        return family["pingpong"]
    spec = family["kheavy"]
    if tiles128 < p.sm_count and p.K >= 4 * max(p.M, p.N) and p.K >= 128 * spec.config.tile[2]:
        # (768x768x3072, 48 K tiles, ran 1.6x faster on ``small``)
        splits = split_count(_tiles(p.M, p.N, p.L, spec.config.tile), math.ceil(p.K / spec.config.tile[2]),
                             p.sm_count)
        return spec.with_runtime(split_k=splits, decomposition="split_k" if splits > 1 else "data_parallel")
    if p.M > 256 and 4 * tiles128 >= 3 * p.sm_count:
        if has("pp128") and pingpong_ok and p.K >= 4096:
            # NOTE [Ping-pong 128x128 tiles below two waves]
            return family["pp128"]
        return family["streamk"].with_runtime(split_k=1, decomposition="data_parallel")
    return family["small"]
