"""The sm90 convolution kernel family and the choice of one per problem.

Input: the operand dtype (the members' configurations), a problem's implicit-GEMM extents
(M, N, K) and the SM count (the choice). Output: :class:`ConvMember` s (a name, a conv
:class:`~evtc.plan.config.GemmConfig`, how many CTAs of it one SM holds) and the name of the
member a problem runs on; and the rule that sends a 1x1 fprop to a GEMM
(:func:`pointwise_problem`).

# NOTE [The sm90 conv family]
CUTLASS's sm90 conv kernel is ``KernelImplicitTmaWarpSpecializedSm90`` only: one producer and
one consumer warpgroup (256 threads), one output tile per CTA, no persistent, cooperative or
ping-pong schedule (``conv/dispatch_policy.hpp`` static_asserts the cooperative and ping-pong
schedule tags away; ``conv/collective/builders/sm90_gmma_builder.inl`` maps every conv schedule
to it). evtc runs the same conv mainloop on CUTLASS's persistent cooperative GEMM kernel too
(NOTE [Persistent conv kernels] in codegen_templates/include/evtc/sm90_conv.hpp; fprop and
unit-stride dgrad, the channels K runs over a multiple of the tile's K). So a family varies:

* the CTA tile of the non-persistent kernel: M of 64 or 128 (one consumer warpgroup: WGMMA's M = 64 per instruction; the
  non-persistent kernel has no ``setmaxnreg``, so every thread keeps at most 255 registers and
  the tile's ``TM*TN/128`` f32 accumulators per thread are capped at 128: 128x128, 64x256,
  128x64, 64x128; 128x256 would need 256 and spill) (evtc.plan.conv.conv_config). Measured with
  cuobjdump ``--dump-resource-usage`` (nvcc 13.0): the 128x128 kernel of bench_conv's
  ``bias_silu`` takes 179 registers a thread and no stack;
* the kernel: the persistent cooperative one (two consumer warpgroups, tiles of 128 or 256 rows)
  over the persistent tile scheduler (``coop128``, ``coop160``: 128x160 covers 320, 640 and 1280
  channels in whole tiles, where 128 or 256 pad 17-20 %) or the stream-K one (``streamk128``,
  ``streamk160``: fewer tiles than SMs, a long K; CUTLASS's heuristic decomposition splits it
  below half a wave of tiles and runs it data-parallel from there, ``get_num_sk_tiles`` in
  ``gemm/kernel/tile_scheduler_params.h``; ``sk*`` force stream-K, exploration only).
  On the UNet's layers they took evtc from 1.07-1.59x cuDNN + eager to 0.74-1.22x (2026-11-26,
  docs/performance.md);
* the cluster (1x1, 2x1, 1x2): the builder picks ``SM90_TMA_LOAD_IM2COL_MULTICAST`` for the
  activation when the cluster's N extent is above 1 and ``SM90_TMA_LOAD_MULTICAST`` for the filter
  when its M extent is (``sm90_gmma_builder.inl``, ``sm90_common.inl``); the grid is rounded up to
  whole clusters (``get_tiled_cta_shape_mnl``);
* the epilogue tile (64x32 by the planner; 64x64);
* on long-K problems, clusters along M (NOTE [Long-K conv layers: the filter multicast]);
* the ping-pong kernel (one consumer warpgroup a tile, the two alternating; exploration and
  ``Conv(config={"schedule": "pingpong"})`` only).

Not a candidate: two CTAs per SM (one CTA's epilogue under the other's mainloop, what ping-pong
does inside one CTA). With 4 stages a 128x64 or 64x128 CTA takes about 97 KiB of shared memory
(``evtc.plan.conv.sm90_kernel_smem``), so two would fit an SM's 228 KiB, but the registers don't: the
64x128 kernel of ``dgelu_bgrad`` (tests/compile) takes 182 registers a thread (cuobjdump
``--dump-resource-usage``, nvcc 13.0), and two CTAs of 256 threads need at most 128
(65536 a SM). The kernel's ``__launch_bounds__`` asks for one CTA per SM
(``MinBlocksPerMultiprocessor = 1``, ``gemm/kernel/sm90_gemm_tma_warpspecialized.hpp``); a member
with two would need a derived kernel type that sets it to 2 (and the spills measured).
:attr:`ConvMember.ctas_per_sm` is there for such a member.

:data:`CANDIDATES` are these (benchmarks/explore_conv.py times each on bench_conv's layers);
:data:`FAMILY` the ones the heuristic chooses between. The heuristic
(:func:`choose`) knows only what needs no measurement: wave quantization. Each candidate's time
is modelled as (waves of its CTAs over the SMs) x (its tile's work) / (its tile's relative MMA
efficiency); a stream-K member's waves are its tiles' share of one wave plus
:data:`STREAM_K_OVERHEAD`, and it is a candidate only with fewer tiles than SMs. The default
(``coop128`` where the persistent members can run, else ``base``) stays unless another member is
modelled :data:`MARGIN` faster. :data:`EFFICIENCY` was measured on the H100 (explore_conv.py;
docs/performance.md): non-persistent 64x128 0.75, 128x64 0.67, 64x256 1.12 where N is a multiple
of 256 and 0.7 otherwise (2026-11-25); persistent 128x128 1.06, 128x160 0.96 and 128x256 1.14,
stream-K 0.985 and 0.99 (2026-11-26, the medians over the layers measured). On the 14 3x3 and strided layers of
the UNet and ResNet-50 sets the pick is the fastest measured family member on 13 and within
0.6 % of it on the other (the UNet's 1280 x 8x8: ``streamk128`` 1.220, ``streamk160`` 1.214), and
within 2 % of every candidate explored. The cluster, 256x160, split-K and epilogue-tile
candidates are built and timed by the exploration only, and pinned with ``Conv(config=...)``.

Unit-stride dgrad is a family too (:data:`DGRAD_FAMILY`: fprop's members but ``coop128``),
chosen by the same model over its implicit GEMM (M = N*H*W, N = C, K = K*R*S; the persistent
members' channel rule on dy's K). On the UNet's five unit-stride dgrad layers
(benchmarks/explore_conv_dgrad.py, H100, 2026-11-26) the model picks ``coop160`` on four and
``streamk128`` on the 1280 x 8x8, the fastest measured kernel of each (0.39-0.81x cuDNN's dgrad
+ the eager dReLU, against ``base``'s 0.50-1.08x), and ``base`` (its default) where no member
is modelled faster: ``coop128`` took 1.01-1.14x ``base``'s time on dgrad, where on fprop it
took 0.93-1.0x. Strided dgrad runs on the strided-dgrad kernel.

# NOTE [Long-K conv layers: the filter multicast]
Every CTA tile reads its whole K extent of the im2col activation (tm x K) and of the filter
(tn x K) from L2, so a layer of few tiles over a long K moves (tm + tn) x K x 2 bytes a tile
through L2 in one wave. On the UNet's 1280-channel 3x3 layers (M = 2048 or 512, N = 1280,
K = 11520) that is the limit: ``coop160`` moved 7.2 TB/s there (the 29 MB filter read once per
M tile), and took 1.12x cuDNN + eager; the wave model, which counts MMA work only, can't see it.
A cluster along M multicasts each filter tile to its CTAs (``SM90_TMA_LOAD_MULTICAST``,
conv/collective/builders/sm90_common.inl), halving or quartering that traffic (H100,
2026-11-26, benchmarks/explore_conv.py, time / cuDNN + eager, docs/performance.md):

* 16x16 (M = 2048): ``coop192_c2x1`` 0.92-0.93 (``coop192`` 1.14-1.19); ``streamk128`` 1.31,
  ``_c2x1`` 1.10, ``_c4x1`` 1.02-1.04; ``m64`` 1.58, ``m64_c4x1`` 1.18;
* 8x8 (M = 512): ``m64_c4x1`` 0.87 (``m64`` 1.51, ``m64_c2x1`` 1.15); ``streamk128_c4x1``
  0.93-0.97 (``streamk128`` 1.22);
* ResNet-50's res5 3x3 (M = 1568, N = 512, K = 4608): ``m64_c4x1`` 0.80 (``m64`` 0.99);
* the UNet's 640-channel stride-2 layer (M = 2048, N = 640, K = 5760): ``streamk128_c4x1``
  0.77-0.78, ``coop128`` 0.75-0.87.

On the ten other layers on conv kernels (K < 2.5 max(M, N)), the clusters decide less: 128x128 tiles
gain on most (``streamk128_c4x1`` took 0.77-0.89x ``streamk128``'s time on seven of them,
1.05-1.12x on ResNet's res4 and strided shortcut), 160-wide tiles don't (0.98-1.03x), and a
clustered kernel beat the family's pick on one layer only, for want of a model of when (the
UNet's 640 x 32x32: ``streamk128_c4x1`` 0.861 against ``coop160``'s 0.941). So a problem with
K >= :data:`LONG_K_RATIO` x max(M, N) chooses between :data:`LONG_K_MEMBERS` only, by the wave
model with their long-K efficiencies (:data:`LONG_K_EFFICIENCY`), and other problems never take
them: ``coop192_c2x1`` on the 16x16 layer (112 tiles in one wave), ``m64_c4x1`` on the 8x8 and
res5 layers (80 and 100 tiles), ``streamk128_c4x1`` on the stride-2 one (80 tiles) and on
small problems (stream-K over every SM). The ping-pong kernel (``pp*``, exploration only) was
3-8 % faster than the cooperative one of the same tile on layers of two or more waves and
4-12 % slower on one wave; ``pp192_c2x1`` took 1.0x on the 16x16 layer.

# NOTE [1x1 convolutions as GEMMs]
An fprop with a 1 x 1 (x 1) filter, stride 1, no padding, dilation 1, groups 1 is exactly a GEMM:
y[n, h, w, k] = sum_c x[n, h, w, c] * w[k, c]. With x packed NHWC, A is x viewed as
(M = N*H*W, K = C) with row stride C, B is w (KRSC with R = S = 1) viewed as (N = K, K = C),
both K-major, as :class:`evtc.Gemm` takes them (``A @ B.T``), and every M x N tensor of the
epilogue (C, aux loads and stores, D) is the output's packed NHWC rows, the same (M, N) matrix
the implicit GEMM's epilogue sees. Row broadcasts (per output channel), column broadcasts (per
pixel), row, column and scalar reductions are therefore the same vectors either way. A Conv
routes such problems to a :class:`evtc.Gemm` of the same epilogue and dtypes
(:mod:`evtc.dispatch.conv_gemm`), whose persistent cooperative, ping-pong and stream-K kernels and
heuristic the conv kernel lacks. dgrad 1x1 with stride 1 is a GEMM too, with B = w viewed as
(N = C, K = K), which is N-major: evtc's Gemm takes B as N x K row-major (K-major) only, so
dgrad stays on the conv kernel.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence

from evtc.dtypes import DType
from evtc.plan.config import GemmConfig
from evtc.plan.conv import PERSISTENT_SCHEDULE, PERSISTENT_SCHEDULES, is_persistent, kernel_kind
from evtc.plan.target import SM90

__all__ = ["CANDIDATES", "DGRAD_FAMILY", "EFFICIENCY", "FAMILIES", "FAMILY", "MARGIN", "PERSISTENT_SCHEDULE",
           "PERSISTENT_SCHEDULES", "LONG_K_EFFICIENCY", "LONG_K_MEMBERS", "LONG_K_RATIO", "ConvMember", "choose",
           "is_persistent", "kernel_kind", "long_k", "member_configs", "modeled_time", "pointwise_problem", "tiles"]

#: name -> (the conv config's fields over the default, CTAs one SM holds); the tile's K is the
#: operand's 128 bytes (64 for 16-bit), filled in by :func:`member_configs`
CANDIDATES: dict[str, tuple[dict, int]] = {
    "base": ({}, 1),                                              # 128x128, the default
    "n64": ({"tile": (128, 64)}, 1),
    "m64": ({"tile": (64, 128)}, 1),
    "wide": ({"tile": (64, 256)}, 1),
    "c2x1": ({"cluster": (2, 1, 1)}, 1),                         # filter multicast along M
    "c1x2": ({"cluster": (1, 2, 1)}, 1),                         # activation multicast along N
    "epi64": ({"epilogue_tile": (64, 64)}, 1),
    # the persistent cooperative kernel (NOTE [Persistent conv kernels]): two consumer warpgroups
    "coop": ({"schedule": "cooperative", "scheduler": "persistent", "tile": (128, 256)}, 1),
    "coop128": ({"schedule": "cooperative", "scheduler": "persistent", "tile": (128, 128)}, 1),
    "coop_c2x1": ({"schedule": "cooperative", "scheduler": "persistent", "tile": (128, 256), "cluster": (2, 1, 1)}, 1),
    "streamk": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 256)}, 1),
    "streamk128": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 128)}, 1),
    # N = 160 divides the UNet's 320, 640 and 1280 channels in whole tiles
    "coop160": ({"schedule": "cooperative", "scheduler": "persistent", "tile": (128, 160)}, 1),
    "coop160_c2x1": ({"schedule": "cooperative", "scheduler": "persistent", "tile": (128, 160), "cluster": (2, 1, 1)}, 1),
    "streamk160": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 160)}, 1),
    "coop256x160": ({"schedule": "cooperative", "scheduler": "persistent", "tile": (256, 160)}, 1),
    "streamk160_c2x1": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 160), "cluster": (2, 1, 1)}, 1),
    "streamk256x160": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (256, 160)}, 1),
    "streamk256x160_c2x1": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (256, 160), "cluster": (2, 1, 1)}, 1),
    "coop160_c1x2": ({"schedule": "cooperative", "scheduler": "persistent", "tile": (128, 160), "cluster": (1, 2, 1)}, 1),
    "splitk2_160": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 160), "split_k": 2,
                     "decomposition": "split_k"}, 1),
    "splitk4_160": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 160), "split_k": 4,
                     "decomposition": "split_k"}, 1),
    "splitk4_128": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 128), "split_k": 4,
                     "decomposition": "split_k"}, 1),
    # stream-K forced (decomposition "stream_k"): CUTLASS's heuristic decomposition
    # (tile_scheduler_params.h, get_num_sk_tiles) is data-parallel whenever the last wave is at
    # least half full, e.g. 80 tiles on 132 SMs
    "sk128": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 128), "decomposition": "stream_k"}, 1),
    "sk160": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 160), "decomposition": "stream_k"}, 1),
    "sk256": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 256), "decomposition": "stream_k"}, 1),
    # 1280 channels in 6.7 tiles of 192 (4 % padding); 256x128: each consumer warpgroup 128x128
    "coop192": ({"schedule": "cooperative", "scheduler": "persistent", "tile": (128, 192)}, 1),
    "streamk192": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 192)}, 1),
    "coop256x128": ({"schedule": "cooperative", "scheduler": "persistent", "tile": (256, 128)}, 1),
    "streamk256x128": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (256, 128)}, 1),
    # 128x64: each consumer warpgroup 64x64, 80 tiles on the UNet's 1280 x 8x8 (cuDNN's kernel
    # there: 64x128 tiles, two math warpgroups, 80 CTAs)
    "coop128x64": ({"schedule": "cooperative", "scheduler": "persistent", "tile": (128, 64)}, 1),
    # the ping-pong kernel: one consumer warpgroup a tile (128 rows: two WGMMA chains), the other's
    # epilogue under its mainloop when an SM has two tiles
    "pp128": ({"schedule": "pingpong", "scheduler": "persistent", "tile": (128, 128)}, 1),
    "pp160": ({"schedule": "pingpong", "scheduler": "persistent", "tile": (128, 160)}, 1),
    "pp192": ({"schedule": "pingpong", "scheduler": "persistent", "tile": (128, 192)}, 1),
    "pp192_c2x1": ({"schedule": "pingpong", "scheduler": "persistent", "tile": (128, 192), "cluster": (2, 1, 1)}, 1),
    "pp64x256": ({"schedule": "pingpong", "scheduler": "persistent", "tile": (64, 256)}, 1),
    # clusters along M: the filter's TMA multicast to 2 or 4 CTAs (the 1280-channel layers read a
    # 29 MB filter once per M tile)
    "pp128_c2x1": ({"schedule": "pingpong", "scheduler": "persistent", "tile": (128, 128), "cluster": (2, 1, 1)}, 1),
    "pp160_c2x1": ({"schedule": "pingpong", "scheduler": "persistent", "tile": (128, 160), "cluster": (2, 1, 1)}, 1),
    "pp192_c4x1": ({"schedule": "pingpong", "scheduler": "persistent", "tile": (128, 192), "cluster": (4, 1, 1)}, 1),
    "coop192_c2x1": ({"schedule": "cooperative", "scheduler": "persistent", "tile": (128, 192), "cluster": (2, 1, 1)}, 1),
    "m64_c4x1": ({"tile": (64, 128), "cluster": (4, 1, 1)}, 1),
    "coop128x64_c2x1": ({"schedule": "cooperative", "scheduler": "persistent", "tile": (128, 64), "cluster": (2, 1, 1)}, 1),
    "coop128x64_c4x1": ({"schedule": "cooperative", "scheduler": "persistent", "tile": (128, 64), "cluster": (4, 1, 1)}, 1),
    "streamk128_c2x1": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 128), "cluster": (2, 1, 1)}, 1),
    "streamk128_c4x1": ({"schedule": "cooperative", "scheduler": "streamk", "tile": (128, 128), "cluster": (4, 1, 1)}, 1),
    "coop128_c2x1": ({"schedule": "cooperative", "scheduler": "persistent", "tile": (128, 128), "cluster": (2, 1, 1)}, 1),
    "m64_c2x1": ({"tile": (64, 128), "cluster": (2, 1, 1)}, 1),
}
#: the members a long-K problem chooses between, and only it (NOTE [Long-K conv layers: the
#: filter multicast]): clusters along M, whose CTAs share one TMA load of each filter tile; each
#: with its efficiency on long-K problems (in :data:`EFFICIENCY`'s unit): the unclustered tile's
#: efficiency times the median over the four long-K layers of the unclustered kernel's time over
#: the clustered one's (H100, 2026-11-26, explore_conv.py: ``streamk128`` 1.18x
#: ``streamk128_c4x1``'s time, ``m64`` 1.29x ``m64_c4x1``'s); ``coop192_c2x1``'s over the 13 3x3 layers
LONG_K_EFFICIENCY = {"coop192_c2x1": 1.08, "streamk128_c4x1": 1.16, "m64_c4x1": 0.97}
LONG_K_MEMBERS = tuple(LONG_K_EFFICIENCY)
#: a problem is long-K when K >= LONG_K_RATIO * max(M, N) (NOTE [Long-K conv layers: the filter
#: multicast])
LONG_K_RATIO = 2.5
#: the members the heuristic chooses between (NOTE [The sm90 conv family])
FAMILY = ("base", "n64", "m64", "wide", "coop128", "coop160", "coop", "streamk128", "streamk160", *LONG_K_MEMBERS)
#: unit-stride dgrad's members: fprop's without ``coop128``, which took 1.01-1.14x ``base``'s time
#: on the UNet's dgrad layers (H100, 2026-11-26, benchmarks/explore_conv_dgrad.py), so ``base``
#: stays dgrad's default (NOTE [The sm90 conv family]). The long-K members took the UNet's two
#: long-K dgrad layers from 0.754 (``coop160``) to 0.601 (``coop192_c2x1``) and from 0.827
#: (``streamk128``) to 0.621 (``m64_c4x1``) of cuDNN's dgrad + the eager dReLU (same run)
DGRAD_FAMILY = tuple(n for n in FAMILY if n != "coop128")
#: the conv kinds that are a family on sm90 (wgrad is one kernel: the persistent kernels don't
#: run it, NOTE [Persistent conv kernels])
FAMILIES = {"fprop": FAMILY, "dgrad": DGRAD_FAMILY}
#: the default member: the persistent 128x128 where it can run (channels a multiple of the tile's
#: K), else ``base``
PERSISTENT_DEFAULT = "coop128"
#: relative throughput of one CTA tile (M, N) of each kernel (``nonpersistent``, ``persistent``,
#: ``streamk``) at equal waves, measured on the H100: the median over layers of (modelled work /
#: time) relative to the non-persistent 128x128 (benchmarks/explore_conv.py, the fprop layers of
#: the UNet and ResNet-50 sets; non-persistent tiles 2026-11-25, persistent ones 2026-11-26).
#: 64x256 depends on N: 1.0-1.2 where N is a multiple of 256 (one tile spans 256 output channels:
#: the im2col activation tile is gathered once for them), 0.53-0.79 where N pads (:func:`efficiency`).
EFFICIENCY = {
    (128, 128, "nonpersistent"): 1.0, (64, 256, "nonpersistent"): 0.7, (64, 128, "nonpersistent"): 0.75,
    (128, 64, "nonpersistent"): 0.67, (64, 64, "nonpersistent"): 0.5,
    (128, 128, "persistent"): 1.06, (128, 160, "persistent"): 0.96, (128, 256, "persistent"): 1.14,
    (128, 128, "streamk"): 0.985, (128, 160, "streamk"): 0.99,
    # coop192_c2x1: the median over the 13 3x3 layers of both sets (2026-11-26, explore_conv.py)
    (128, 192, "persistent"): 1.08,
}
#: 64x256's efficiency where N is a multiple of 256 (measured 1.0-1.2, median 1.12)
WIDE_FULL_N = 1.12
#: a stream-K member's cost beyond its share of the work, in waves (the partial tiles' fixup and
#: the reduction; measured 0.21-0.28 on the UNet's 1280-channel layers, 0.35 fits every layer):
#: it is a candidate only for problems of fewer tiles than SMs, where CUTLASS's heuristic
#: decomposition (sm90_tile_scheduler_stream_k.hpp) splits K
STREAM_K_OVERHEAD = 0.35
#: another member replaces the default only when modelled at least this much faster
MARGIN = 0.05
#: shared memory of one H100 SM, bytes (228 KiB), and what the driver reserves per CTA (1 KiB)
SM_SMEM_BYTES = 233472
CTA_RESERVED_SMEM = 1024


@dataclasses.dataclass(frozen=True)
class ConvMember:
    """One kernel of a Conv's family.

    Attributes:
        name: ``base``, ``n64``, ``m64``... (:data:`CANDIDATES`), or ``pinned``.
        fields: the conv config's fields that differ from the default (for ``Conv(config=...)``).
        ctas_per_sm: CTAs of this kernel one SM is meant to hold (its shared memory allows them;
            tests/null check it against the plan).
    """

    name: str
    fields: Mapping
    ctas_per_sm: int = 1


def member_configs(a: DType, names: Sequence[str] | None = None) -> dict[str, ConvMember]:
    """The members ``names`` (default: every candidate) with full tiles for operand dtype ``a``."""
    k = 128 // a.bytes
    out = {}
    for name in (names if names is not None else CANDIDATES):
        fields, ctas = CANDIDATES[name]
        f = dict(fields)
        if "tile" in f:
            f["tile"] = (*f["tile"], k)
        out[name] = ConvMember(name, f, ctas)
    return out


def tiles(M: int, N: int, tile: Sequence[int]) -> int:
    """CTA tiles of an M x N output."""
    return math.ceil(M / tile[0]) * math.ceil(N / tile[1])


def modeled_time(config: GemmConfig, ctas_per_sm: int, M: int, N: int, K: int, sm_count: int,
                 tile_efficiency: float | None = None) -> float | None:
    """A relative time (no unit; comparable between members for one problem): waves of CTA
    tiles over ``sm_count * ctas_per_sm`` slots, times each tile's padded MMA work (its M x N x
    K rounded up to whole tiles) over its :data:`EFFICIENCY`, times the CTAs sharing an SM. A
    stream-K member spreads fewer tiles than SMs over every SM (their share of a wave, plus
    :data:`STREAM_K_OVERHEAD`), or one wave where CUTLASS's heuristic decomposition runs them
    data-parallel (at least half a wave of tiles); None where it has a wave or more (then it is
    the persistent kernel). ``tile_efficiency`` replaces :func:`efficiency` (the long-K members'
    :data:`LONG_K_EFFICIENCY`)."""
    tm, tn, tk = config.tile
    kind = kernel_kind(config)
    n_tiles = tiles(M, N, config.tile)
    slots = sm_count * ctas_per_sm
    if kind == "streamk":
        if n_tiles >= slots:
            return None
        if config.decomposition == "heuristic" and 2 * n_tiles >= slots and config.split_k == 1:
            # CUTLASS's heuristic decomposition is data-parallel when the last wave is at least
            # half full (tile_scheduler_params.h, get_num_sk_tiles): one wave of whole tiles, as
            # the persistent kernel runs them
            waves, kind = 1.0, "persistent"
        else:
            waves = n_tiles / slots + STREAM_K_OVERHEAD
    else:
        waves = math.ceil(n_tiles / slots)
    work = tm * tn * math.ceil(K / tk) * tk
    eff = tile_efficiency if tile_efficiency is not None else efficiency(tm, tn, N, kind)
    return waves * work * ctas_per_sm / eff


def efficiency(tm: int, tn: int, N: int, kind: str = "nonpersistent") -> float:
    """:data:`EFFICIENCY` of a tm x tn tile of a ``kind`` kernel on a problem of N output channels."""
    if (tm, tn, kind) == (64, 256, "nonpersistent") and N % 256 == 0:
        return WIDE_FULL_N
    return EFFICIENCY.get((tm, tn, kind), 0.5)


def choose(members: Mapping[str, tuple[GemmConfig, int]], M: int, N: int, K: int, sm_count: int = SM90.sm_count,
           channels: int | None = None) -> str:
    """The member a problem runs on (NOTE [The sm90 conv family]).

    Args:
        members: name -> (conv config, CTAs per SM) of the family; ``base`` is the default.
        M, N, K: the implicit GEMM's extents.
        sm_count: the device's multiprocessors.
        channels: the channels K runs over (fprop's input channels C, dgrad's output channels K).
            The persistent members need a multiple of their tile's K (NOTE [Persistent conv
            kernels]); None: not known, none of them runs.

    Returns:
        On a long-K problem (:func:`long_k`), the :data:`LONG_K_MEMBERS` member modelled fastest,
        where one is a member and runs. Else :data:`PERSISTENT_DEFAULT` (or ``base`` where the
        persistent members can't run or, as in :data:`DGRAD_FAMILY`, aren't members) unless a
        member other than the long-K ones is modelled :data:`MARGIN` faster (the fastest such).
    """
    if "base" not in members or len(members) == 1 or min(M, N, K) <= 0:
        return "base" if "base" in members else next(iter(members))

    def runs(cfg: GemmConfig) -> bool:
        return not is_persistent(cfg) or (channels is not None and channels % cfg.tile[2] == 0)

    times = {}
    for n, (c, ctas) in members.items():
        t = modeled_time(c, ctas, M, N, K, sm_count, LONG_K_EFFICIENCY.get(n)) if runs(c) else None
        if t is not None:
            times[n] = t
    if long_k(M, N, K):  # NOTE [Long-K conv layers: the filter multicast]
        longs = {n: t for n, t in times.items() if n in LONG_K_MEMBERS}
        if longs:
            return min(longs, key=lambda n: (longs[n], n))
    times = {n: t for n, t in times.items() if n not in LONG_K_MEMBERS}  # base (non-persistent) stays
    default = PERSISTENT_DEFAULT if PERSISTENT_DEFAULT in times else "base"
    best = min(times, key=lambda n: (times[n], n != default))
    return best if times[best] <= (1 - MARGIN) * times[default] else default


def long_k(M: int, N: int, K: int) -> bool:
    """Whether an implicit GEMM of extents M, N, K is long-K: K >= :data:`LONG_K_RATIO` x max(M, N)
    (NOTE [Long-K conv layers: the filter multicast])."""
    return K >= LONG_K_RATIO * max(M, N)


def pointwise_problem(kind: str, stride: Sequence[int], padding: Sequence[int], dilation: Sequence[int],
                      groups: int = 1) -> bool:
    """Whether a problem of a 1x1 filter is a GEMM (NOTE [1x1 convolutions as GEMMs]): fprop,
    stride 1, no padding, dilation 1, groups 1 (the filter's extents are the call's)."""
    return (kind == "fprop" and groups == 1 and all(s == 1 for s in stride) and all(p == 0 for p in padding)
            and all(d == 1 for d in dilation))
