"""GEMM configurations: tile shape, cluster, kernel schedule, stages, tile scheduler.

Input: what the user asks for (or nothing). Output: a validated :class:`GemmConfig`.

The legality rules are the ones the CUTLASS collective builders and WGMMA impose (PTX ISA,
"Asynchronous Warpgroup Level Matrix Multiply-Accumulate": ``wgmma.mma_async`` has M = 64 per
warpgroup and N a multiple of 8 up to 256; ``sm90_gmma_builder.inl``):

* sm90 cooperative: tile M a multiple of 128 (two consumer warpgroups split M), ping-pong:
  tile M a multiple of 64; tile N a multiple of 16 (the epilogue's ``STSM`` copy atoms need
  N % 16, ``sm90_builder.inl``) and at most 256; tile K times the element size a multiple of
  32 bytes (the narrowest GMMA shared-memory swizzle row, ``ss_smem_selector``); cluster sizes 1, 2 or 4 per mode with at most
  4 CTAs (portable cluster size is 8, TMA multicast pays off up to 2-4).
* sm80: threadblock M and N multiples of 32 and of the warp tile, warp tile M/N multiples of
  16, K a multiple of 32 bytes, 2 to 8 stages (``default_gemm_universal_with_visitor.h``).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
from collections.abc import Mapping
from typing import Any

from evtc.dtypes import DType
from evtc.errors import ConfigError, PlanError
from evtc.plan.target import SM90

SCHEDULES_SM90 = ("cooperative", "pingpong")
SCHEDULERS = ("persistent", "streamk", "batch_inner")
# in the order of CUTLASS's RasterOrderOptions enumerators (tile_scheduler_detail.hpp): the
# kernel's raster_order argument is the index
RASTER_ORDERS = ("heuristic", "along_m", "along_n")
# CUTLASS's DecompositionMode enumerators, in order (tile_scheduler_detail.hpp): the stream-K
# scheduler's decomposition_mode argument is the index
DECOMPOSITIONS = ("heuristic", "data_parallel", "split_k", "stream_k")
# On sm90 the tile order and (stream-K scheduler) the decomposition are arguments of the
# persistent tile scheduler, not part of the kernel: these fields don't change the emitted source
# (one build serves every value).
RUNTIME_FIELDS_SM90 = ("swizzle", "raster", "split_k", "decomposition")
# GemmConfig.swizzle when it is None, by arch and (sm90) schedule. Measured on the H100 for bias_relu at
# 8192^3 (docs/performance.md): the cooperative 128x256 kernel ran 1.5-2 % faster with 8-tile
# bands than with CUTLASS's default of one tile (1.003-1.020 vs 1.021-1.030 of cuBLAS's time, four
# runs), and ping-pong 128x192, which keeps two tiles in flight per CTA, ran 20-30 % slower with
# 8-tile bands, so it keeps one tile. sm80: 8 tiles, the CUTLASS profiler's usual
# GemmIdentityThreadblockSwizzle<8>.
DEFAULT_SWIZZLE = {"sm90": {"cooperative": 3, "pingpong": 0}, "sm80": 3}
#: the schedule of a GemmConfig that names none, by arch
ARCH_SCHEDULE = {"sm90": "cooperative", "sm80": "multistage"}


# NOTE [Bounds of the tile order and of split-K]
# swizzle is the log2 of a band width CUTLASS takes up to 8 tiles: sm90's tile schedulers clamp
# max_swizzle_size to log2 <= 3 (get_log_swizzle_size, gemm/kernel/tile_scheduler_params.h), and
# sm80's GemmIdentityThreadblockSwizzle<N> uses at most 1 << 3 (get_log_tile,
# gemm/threadblock/threadblock_swizzle.h; its N is an int, so 1 << 40 doesn't even compile). So
# 0 to 3 on both. split_k is the stream-K scheduler's `int splits`, which CUTLASS lowers to the
# SM count (adjust_split_count in tile_scheduler_params.h): above MAX_SPLIT_K, the SM count of
# the sm90 target (132 on H100/H200), a split count never takes effect.
#: the largest GemmConfig.swizzle (log2 of 8 tiles) on either arch
MAX_SWIZZLE = 3
#: the largest GemmConfig.split_k: the sm90 target's SM count (evtc/plan/target.py)
MAX_SPLIT_K = SM90.sm_count


def default_swizzle(arch: str, schedule: str | None) -> int:
    """:data:`DEFAULT_SWIZZLE` of an arch and schedule (None: the arch's :data:`ARCH_SCHEDULE`);
    0 for a schedule it doesn't know (an unknown sm90 schedule is reported by
    :func:`validate`; its swizzle doesn't matter)."""
    default = DEFAULT_SWIZZLE[arch]
    if not isinstance(default, dict):
        return default
    return default.get(schedule or ARCH_SCHEDULE[arch], 0)


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """A GEMM configuration.

    Attributes:
        tile: CTA tile (M, N, K) in elements.
        cluster: thread block cluster shape (M, N, 1); sm90 only. None: (2, 1, 1) on sm90,
            (1, 1, 1) on sm80 (filled in by :func:`validate`).
        schedule: sm90 kernel schedule, ``"cooperative"`` or ``"pingpong"``; sm80's is
            ``"multistage"``. None: the arch's (cooperative on sm90).
        stages: mainloop pipeline stages, or None for as many as fit beside the epilogue's
            shared memory (CUTLASS ``StageCountAutoCarveout``).
        epilogue_tile: (M, N) of the epilogue subtile, or None to let the planner choose.
        scheduler: ``"persistent"`` (data-parallel persistent tiles), ``"streamk"``, or (sm90)
            ``"batch_inner"``: persistent tiles visited with the batch index fastest, so the L
            batches of one output tile run at once (NOTE [Batch-inner tile order] in
            ``codegen_templates/include/evtc/sm90_batch_inner.hpp``; what the row-phase split of
            :mod:`evtc.dispatch.phase_split` runs its main call on).
        warp_tile: sm80 warp tile (M, N, K).
        swizzle: log2 of the width, in tiles, of the bands the tile order is swizzled in, so that
            the tiles running at once share rows of A and columns of B in L2; None for the
            default of the arch and schedule (:data:`DEFAULT_SWIZZLE`). sm80: the threadblock swizzle
            ``GemmIdentityThreadblockSwizzle<1 << swizzle>`` (compiled in); sm90: the persistent
            tile scheduler's ``max_swizzle_size = 1 << swizzle``, 0 to 3 (a run-time argument;
            ``tile_scheduler_params.h`` caps it at 8).
        raster: sm90 tile order: ``"along_n"`` (consecutive tiles step along N), ``"along_m"``,
            or ``"heuristic"`` (CUTLASS's: along M when there are more tiles along N).
        fast_accum: fp8 only: accumulate without periodic promotion (faster, less accurate).
        split_k: sm90 stream-K scheduler only: split every output tile's K loop into this many
            parts, reduced in a workspace before the epilogue runs once per tile (so aux stores
            and reductions are exact); 1 lets ``decomposition`` decide. A run-time argument.
        decomposition: sm90 stream-K scheduler only: ``"heuristic"`` (CUTLASS's choice of the
            three below from the problem), ``"data_parallel"``, ``"split_k"`` or ``"stream_k"``
            (``DecompositionMode``, ``tile_scheduler_detail.hpp``). A run-time argument.
        swap_ab: sm90: compute ``D^T = B A^T``: the kernel sees an N x M problem whose M x N
            tensors are column-major, row and column broadcasts and reductions swapped
            (:mod:`evtc.family.swap_ab`). Small-M problems fill the machine this way.
        unaligned: sm90: every M x N tensor (C, D, aux loads and stores) is read and written
            register-direct with per-element predicates (void C and D in the collective), so rows
            need no 16-byte alignment: the variant for N not a multiple of 8 (16-bit) or 16 (fp8).
        atomic_reductions: sm90: how a row or column max/min into an f32 output is reduced across
            tiles (NOTE [Atomic row and column max], evtc/plan/sm90_buffers.py): True with atomics into
            the output, False through the workspace (per-tile partials, a tile counter, a final
            reduction), None (default) atomics except on the stream-K scheduler. True also adds
            row and column sums into f32 with float atomics, whose last bits then depend on the
            order the tiles finish (NOTE [Atomic row and column sums]; refused with
            ``batch_invariant=True``); False and None keep sums on the workspace. A kernel with
            atomic reductions never runs the stream-K decomposition (NOTE [Scalar reductions and
            stream-K], evtc/gemm.py): its ``"heuristic"`` runs data-parallel (or split-K), an
            explicit ``"stream_k"`` is refused. Compiled in; left out of :meth:`to_json` while
            None, so the sources (and kernel cache keys) of configs that don't set it stay as
            they were.
        packed_stores: sm90: every M x N output (D and aux stores) goes to shared memory as for
            a TMA store and is then stored by the epilogue threads, 32 consecutive elements of a
            row per store, so its rows need only be element-aligned (a caller's packed
            ``out=`` with N = 50257 in bf16), while C and aux loads keep 16-byte aligned rows
            (NOTE [Stores into packed rows], evtc/plan/sm90_buffers.py). Elements of 8 bits or more,
            row-major (not ``swap_ab``). Compiled in; left out of :meth:`to_json` while False.
        grouped: sm90: the grouped (pointer-array) kernel of :class:`evtc.GroupedGemm`: one
            launch runs E problems of their own M (an expert's tokens), sharing N and K, on
            CUTLASS's ``KernelPtrArrayTmaWarpSpecialized*`` schedules with a ``GroupProblemShape``
            (NOTE [The grouped kernel], evtc/grouped.py). Persistent scheduler only; no split-K,
            swap-AB or unaligned/packed variants. Left out of :meth:`to_json` while False.
    """

    tile: tuple[int, int, int] = (128, 256, 64)
    cluster: tuple[int, int, int] | None = None
    schedule: str | None = None
    stages: int | None = None
    epilogue_tile: tuple[int, int] | None = None
    scheduler: str = "persistent"
    warp_tile: tuple[int, int, int] | None = None
    swizzle: int | None = None
    raster: str = "heuristic"
    fast_accum: bool = False
    split_k: int = 1
    decomposition: str = "heuristic"
    swap_ab: bool = False
    unaligned: bool = False
    atomic_reductions: bool | None = None
    packed_stores: bool = False
    grouped: bool = False

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        if d["atomic_reductions"] is None:
            del d["atomic_reductions"]
        if not d["packed_stores"]:
            del d["packed_stores"]
        if not d["grouped"]:
            del d["grouped"]
        return d

    def kernel_json(self, arch: str) -> dict:
        """:meth:`to_json` without the fields that are run-time arguments on ``arch`` (what the
        emitted source records, so that they don't change it)."""
        d = self.to_json()
        if arch == "sm90":
            for k in RUNTIME_FIELDS_SM90:
                d.pop(k)
        return d

    @classmethod
    def from_json(cls, data: dict | str) -> "GemmConfig":
        """A config from a dict of its fields or their JSON text (lists become tuples).

        Raises:
            ConfigError: the text is not JSON, not an object, or names an unknown field.
        """
        if isinstance(data, str):
            try:
                data = json.loads(data)
            except json.JSONDecodeError as e:
                raise ConfigError(f"config {data!r} is not JSON: {e}") from None
            except RecursionError:  # Python's reader gives up on deep nesting; no config nests
                raise ConfigError(f"config {data!r:.80} is nested too deeply to be a GemmConfig's fields",
                                  hint="a config is one JSON object of GemmConfig fields") from None
        if not isinstance(data, Mapping):
            raise ConfigError(f"config {data!r} is not a dict of GemmConfig fields")
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(data) - set(known))
        if unknown:
            raise ConfigError(f"unknown config field{'s' if len(unknown) > 1 else ''} {unknown}",
                              hint=f"GemmConfig's fields: {', '.join(known)}")
        return cls(**{k: tuple(v) if isinstance(v, list) else v for k, v in data.items()})

    def replace(self, **changes) -> "GemmConfig":
        return dataclasses.replace(self, **changes)

    @property
    def name(self) -> str:
        """A short stable name, e.g. ``128x256x64_2x1_coop``."""
        t = "x".join(map(str, self.tile))
        c = "x".join(map(str, (self.cluster or (2, 1, 1))[:2]))
        s = {"cooperative": "coop", "pingpong": "pp", None: "default"}.get(self.schedule, self.schedule)
        extra = ""
        if self.stages:
            extra += f"_s{self.stages}"
        if self.epilogue_tile:
            extra += f"_e{self.epilogue_tile[0]}x{self.epilogue_tile[1]}"
        if self.scheduler != "persistent":
            extra += f"_{self.scheduler}"
        if self.swap_ab:
            extra += "_swapab"
        if self.unaligned:
            extra += "_unaligned"
        if self.packed_stores:
            extra += "_packed"
        return f"{t}_{c}_{s}{extra}"

    @property
    def schedule_name(self) -> str:
        """:attr:`name` with the tile order, e.g. ``128x256x64_2x1_coop_sw8_along_n``."""
        sw = "auto" if self.swizzle is None else 1 << self.swizzle
        extra = f"_splitk{self.split_k}" if self.split_k > 1 else ""
        if self.decomposition != "heuristic":
            extra += f"_{self.decomposition}"
        return f"{self.name}_sw{sw}_{self.raster}{extra}"


def default_config(arch: str, a: DType, b: DType) -> GemmConfig:
    """The default configuration for ``arch`` and the operand types.

    sm90: cooperative 128x256 with a 2x1 cluster; K = 128 bytes of the operand type (64 for
    16-bit, 128 for fp8). This is the configuration measured closest to cuBLAS on the H100 for
    bias+relu epilogues (see docs/performance.md). sm80: 128x128x32 (16-bit) with 64x64 warps and
    4 stages, the CUTLASS profiler's common choice for 16-bit GEMMs on A100.
    """
    if arch == "sm90":
        k = 128 // a.bytes if a.bytes else 64
        return GemmConfig(tile=(128, 256, k), cluster=(2, 1, 1), schedule="cooperative")
    if arch == "sm80":
        return GemmConfig(tile=(128, 128, 32), cluster=(1, 1, 1), schedule="multistage", stages=4,
                          warp_tile=(64, 64, 32))
    raise ConfigError(f"unknown arch '{arch}'", hint="use 'sm90' (Hopper) or 'sm80' (Ampere)")


def atomic_reduction(n, config: GemmConfig) -> bool:
    """Whether an sm90 kernel of ``config`` reduces the Reduction output ``n`` across tiles with
    atomics (else through the workspace): every scalar reduction, and a row or column max/min
    into f32 (:attr:`evtc.ir.nodes.Reduction.atomic_capable`) unless ``config.atomic_reductions``
    says otherwise (None: atomics except on the stream-K scheduler). The rule and its reasons:
    NOTE [Atomic row and column max] at :func:`evtc.plan.sm90_buffers.reduction_mode`, which says why per
    output; this one is cheap to import (a launch asks it, the planner need not be loaded)."""
    if n.dim is None:
        return True
    if n.atomic_capable:
        return config.scheduler != "streamk" if config.atomic_reductions is None else bool(config.atomic_reductions)
    # NOTE [Atomic row and column sums]: a row or column sum into f32 through float atomics (the
    # same visitors as the max and min, cutlass::atomic_add) only where the configuration asks
    # (atomic_reductions=True): it spares the workspace pass (per-tile partials, a tile counter,
    # three CTA barriers a tile, a final reduction), which made the reduce class of the ground
    # truth 1.8x cuBLAS's plain GEMM (docs/performance.md), but float adds in the order the tiles
    # finish are not bit-for-bit reproducible run to run, so the default keeps the workspace and
    # batch_invariant=True refuses it.
    return config.atomic_reductions is True and n.atomic_sum_capable


def validate(config: GemmConfig, arch: str, a: DType, b: DType) -> GemmConfig:
    """Check ``config`` against the rules in the module docstring.

    Returns:
        ``config`` when it is legal, with a swizzle of None replaced by its default.

    Raises:
        ConfigError: the first broken rule, naming the field and the rule's source.
    """
    if not isinstance(arch, str) or arch not in DEFAULT_SWIZZLE:
        raise ConfigError(f"unknown arch {arch!r:.60}", hint="use 'sm90' (Hopper) or 'sm80' (Ampere)")
    if not isinstance(config, GemmConfig):
        raise ConfigError(f"config = {config!r} is not a GemmConfig",
                          hint="pass evtc.GemmConfig(...) or a dict of its fields")
    _check_names(config)
    if config.schedule is None:
        config = config.replace(schedule=ARCH_SCHEDULE[arch])
    if config.cluster is None:
        config = config.replace(cluster=(2, 1, 1) if arch == "sm90" else (1, 1, 1))
    _check_types(config, arch)
    if a != b and not (a.is_fp8 and b.is_fp8):
        raise ConfigError(f"A is {a.name} and B is {b.name}: the tensor core MMAs take two operands of one 16-bit type "
                          "(no GMMA/mma.sync operator mixes f16 and bf16)", hint="convert one operand")
    if config.swizzle is None:
        config = config.replace(swizzle=default_swizzle(arch, config.schedule))
    if config.scheduler not in SCHEDULERS:
        raise ConfigError(f"scheduler '{config.scheduler}' is not one of {SCHEDULERS}")
    if config.scheduler == "batch_inner" and arch != "sm90":
        raise ConfigError(f"scheduler 'batch_inner' is an sm90 tile scheduler; {arch} has 'persistent' and 'streamk'",
                          hint="use scheduler='persistent'")
    if config.raster not in RASTER_ORDERS:
        raise ConfigError(f"raster '{config.raster}' is not one of {RASTER_ORDERS}")
    if arch == "sm90":
        _check_sm90(config, a, b)
    elif arch == "sm80":
        _check_sm80(config, a)
    return config


#: the GemmConfig fields that name a choice, and the choices (a schedule of None is the arch's)
_NAMED_FIELDS = {"schedule": SCHEDULES_SM90 + ("multistage",), "scheduler": SCHEDULERS, "raster": RASTER_ORDERS,
                 "decomposition": DECOMPOSITIONS}


def _check_names(config: GemmConfig) -> None:
    """The fields that name a choice are strings (a list or dict there was hashed into a
    TypeError by the schedule table, :attr:`GemmConfig.name`)."""
    for name, choices in _NAMED_FIELDS.items():
        value = getattr(config, name)
        if not isinstance(value, str) and not (name == "schedule" and value is None):
            raise ConfigError(f"{name} = {value!r:.60}: needs one of {', '.join(map(repr, choices))}",
                              hint=f"pass {name} as a string")


def _check_sm90(config: GemmConfig, a: DType, b: DType) -> None:
    """The sm90 rules of :func:`validate` (schedule, tile, cluster, epilogue tile, scheduler)."""
    tm, tn, tk = config.tile
    if config.schedule not in SCHEDULES_SM90:
        raise ConfigError(f"sm90 schedule '{config.schedule}' is not one of {SCHEDULES_SM90}")
    m_unit = 128 if config.schedule == "cooperative" else 64
    if tm % m_unit or tm > 256:
        raise ConfigError(
            f"tile M = {tm}: the {config.schedule} schedule needs a multiple of {m_unit} up to 256",
            hint="WGMMA has M = 64 per warpgroup; the cooperative schedule splits M over two warpgroups",
        )
    if tn % 16 or not 16 <= tn <= 256:
        raise ConfigError(f"tile N = {tn}: needs a multiple of 16 in [16, 256] (WGMMA N <= 256, STSM atoms need N % 16)")
    if (tk * a.bits // 8) % 32 or (tk * b.bits // 8) % 32:
        raise ConfigError(f"tile K = {tk}: K x element size must be a multiple of 32 bytes (a 32-byte swizzle row)")
    cm, cn, ck = config.cluster
    if ck != 1 or cm not in (1, 2, 4) or cn not in (1, 2, 4) or cm * cn > 4:
        raise ConfigError(f"cluster {config.cluster}: each of M, N in (1, 2, 4), K = 1, at most 4 CTAs")
    if config.epilogue_tile is not None:
        em, en = config.epilogue_tile
        if tm % em or tn % en or en % 16 or (config.schedule == "cooperative" and em != min(128, tm)) \
                or (config.schedule == "pingpong" and em != min(64, tm)):
            raise ConfigError(
                f"epilogue tile {config.epilogue_tile} doesn't fit tile {config.tile} with the {config.schedule} schedule",
                hint="its M must be 128 (cooperative) or 64 (ping-pong), its N a multiple of 16 dividing tile N",
            )
    if config.stages is not None and config.stages < 2:
        raise ConfigError(f"stages = {config.stages}: the TMA mainloop needs at least 2")
    if not 0 <= config.swizzle <= MAX_SWIZZLE:
        raise ConfigError(f"swizzle = {config.swizzle}: sm90's tile scheduler takes a swizzle of 1, 2, 4 or 8 tiles "
                          "(log2: 0 to 3; tile_scheduler_params.h)")
    if config.scheduler == "streamk" and config.schedule != "cooperative":
        raise ConfigError("the stream-K scheduler needs the cooperative schedule (CUTLASS's ping-pong kernel "
                          "static_asserts it away: sm90_gemm_tma_warpspecialized_pingpong.hpp)")
    if isinstance(config.split_k, bool) or not isinstance(config.split_k, int) or config.split_k < 1:
        raise ConfigError(f"split_k = {config.split_k!r}: a number of K splits, an integer >= 1")
    if config.split_k > MAX_SPLIT_K:
        raise ConfigError(f"split_k = {config.split_k}: CUTLASS's stream-K scheduler splits K at most once per SM "
                          f"({MAX_SPLIT_K} on the sm90 target; adjust_split_count in tile_scheduler_params.h)",
                          hint=f"use split_k <= {MAX_SPLIT_K}, or decomposition='heuristic' to let CUTLASS choose")
    if config.atomic_reductions is not None and not isinstance(config.atomic_reductions, bool):
        raise ConfigError(f"atomic_reductions = {config.atomic_reductions!r}: True, False or None")
    if config.packed_stores and (config.unaligned or config.swap_ab):
        raise ConfigError(f"packed_stores=True with {'unaligned' if config.unaligned else 'swap_ab'}=True: the "
                          "packed stores are for row-major outputs of a kernel whose C and aux loads go "
                          "through TMA", hint="use one of the two variants")
    if config.decomposition not in DECOMPOSITIONS:
        raise ConfigError(f"decomposition '{config.decomposition}' is not one of {DECOMPOSITIONS}")
    if config.grouped:
        _check_grouped(config)
    if (config.split_k > 1 or config.decomposition != "heuristic") and config.scheduler != "streamk":
        raise ConfigError(f"split_k = {config.split_k}, decomposition '{config.decomposition}': split-K and "
                          "stream-K are decompositions of the stream-K tile scheduler",
                          hint="add scheduler='streamk' (cooperative schedule)")
    if config.split_k > 1 and config.decomposition not in ("heuristic", "split_k"):
        raise ConfigError(f"split_k = {config.split_k} with decomposition '{config.decomposition}': splits are "
                          "only taken by the heuristic and split_k decompositions (tile_scheduler_params.h)")


def _check_grouped(config: GemmConfig) -> None:
    """The grouped kernel's rules: CUTLASS's pointer-array schedules take the persistent group
    tile scheduler (``PersistentTileSchedulerSm90Group``, sm90_tile_scheduler_group.hpp), no
    stream-K; evtc's variants for other layouts are not pointer-array kernels."""
    if not isinstance(config.grouped, bool):
        raise ConfigError(f"grouped = {config.grouped!r}: True or False")
    for name in ("swap_ab", "unaligned", "packed_stores"):
        if getattr(config, name):
            raise ConfigError(f"grouped=True with {name}=True: the grouped kernel has no such variant",
                              hint=f"leave {name} False")
    if config.scheduler != "persistent" or config.split_k != 1 or config.decomposition != "heuristic":
        raise ConfigError(f"grouped=True with scheduler '{config.scheduler}': the pointer-array kernels run on "
                          "CUTLASS's persistent group scheduler (no split-K or stream-K)",
                          hint="use scheduler='persistent', split_k=1")
    if config.atomic_reductions:
        raise ConfigError("grouped=True with atomic_reductions=True: the grouped kernel has no reductions")


def _check_sm80(config: GemmConfig, a: DType) -> None:
    """The sm80 rules of :func:`validate` (no sm90 variants or clusters, warp tiles, stages)."""
    tm, tn, tk = config.tile
    for name in ("swap_ab", "unaligned", "packed_stores", "grouped"):
        if getattr(config, name):
            raise ConfigError(f"{name}=True is an sm90 kernel variant",
                              hint="sm80 kernels pick aligned or ragged variants at run time by themselves")
    if config.split_k != 1 or config.decomposition != "heuristic":
        raise ConfigError("split_k / decomposition are arguments of sm90's stream-K tile scheduler",
                          hint="on sm80 use scheduler='streamk' (ThreadblockSwizzleStreamK)")
    if config.schedule != "multistage":
        raise ConfigError(f"schedule '{config.schedule}': sm80 kernels are multistage (cp.async) GEMMs",
                          hint="leave schedule unset on sm80 (pingpong and cooperative are sm90 schedules)")
    if tuple(config.cluster) != (1, 1, 1):
        raise ConfigError(f"cluster {config.cluster}: thread block clusters are sm90's (sm80 has none)",
                          hint="leave cluster unset on sm80")
    wm, wn, wk = config.warp_tile or (64, 64, tk)
    if tm % wm or tn % wn or wm % 16 or wn % 16 or tm % 32 or tn % 32:
        raise ConfigError(f"sm80 tile {config.tile} / warp tile {config.warp_tile} don't divide")
    if tk % wk or wk % 16:
        raise ConfigError(f"sm80 tile K = {tk} / warp tile K = {wk}: the warp K must divide the tile K and be a "
                          "multiple of 16 (the K of mma.sync m16n8k16 for 16-bit operands)")
    if (tk * a.bits // 8) % 32:
        raise ConfigError(f"tile K = {tk}: K x element size must be a multiple of 32 bytes")
    if (tm // wm) * (tn // wn) > 8:
        raise ConfigError("more than 8 warps per threadblock")
    if config.stages is not None and not 2 <= config.stages <= 8:
        raise ConfigError(f"sm80 stages = {config.stages}: between 2 and 8")
    if not 0 <= config.swizzle <= MAX_SWIZZLE:
        raise ConfigError(f"swizzle = {config.swizzle}: sm80's GemmIdentityThreadblockSwizzle<N> takes bands of at "
                          "most 8 tiles (log2: 0 to 3; get_log_tile in threadblock_swizzle.h)")
    if config.raster != "heuristic":
        raise ConfigError(f"raster '{config.raster}': sm80's threadblock swizzle has no raster order choice",
                          hint="leave raster='heuristic' on sm80 (it is an sm90 tile scheduler argument)")


def _positive_ints(value, n: int) -> bool:
    return (isinstance(value, tuple) and len(value) == n
            and all(isinstance(v, int) and not isinstance(v, bool) and v > 0 for v in value))


def _check_types(config: GemmConfig, arch: str) -> None:
    """Field types, and the fields that only one arch has (``validate``'s first step)."""
    for name, n in (("tile", 3), ("cluster", 3), ("epilogue_tile", 2), ("warp_tile", 3)):
        value = getattr(config, name)
        if (value is not None or name in ("tile", "cluster")) and not _positive_ints(value, n):
            raise ConfigError(f"{name} = {value!r}: needs a tuple of {n} positive integers")
    for name in ("stages", "swizzle"):
        value = getattr(config, name)
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
            raise ConfigError(f"{name} = {value!r}: needs a non-negative integer or None")
    for name in ("fast_accum", "swap_ab", "unaligned", "packed_stores", "grouped"):
        if not isinstance(getattr(config, name), bool):
            raise ConfigError(f"{name} = {getattr(config, name)!r}: needs True or False")
    if arch == "sm90" and config.warp_tile is not None:
        raise ConfigError(f"warp_tile = {config.warp_tile}: an sm80 field (sm90 kernels have no warp tile)",
                          hint="leave warp_tile=None on sm90")
    if arch == "sm80":
        for name, why in (("epilogue_tile", "sm80's epilogue works on each warp's accumulator fragment"),
                          ("fast_accum", "sm80 has no fp8 MMA")):
            if getattr(config, name):
                raise ConfigError(f"{name} = {getattr(config, name)!r}: an sm90 field ({why})",
                                  hint=f"leave {name} unset on sm80")


#: The planner decisions a caller may fix (``evtc.Gemm(plan={...})``, ``evtc emit --plan '{...}'``)
#: and what each takes: ``policy`` picks the planner, the others are the sm90 planner's
#: ``FIXABLE`` decisions (evtc/plan/sm90_space.py).
PLAN_DECISIONS = {
    "policy": "'evtc' or 'cutlass'",
    "c_slot": "the name of an M x N input, or None/null for no C",
    "d_slot": "the name of an M x N output",
    "epilogue_tile": "[M, N], two positive integers",
    "stages_c": "a positive integer",
    "stages_d": "a positive integer",
    "reuse": "True or False",
    "direct": "a list of the names of aux inputs, aux outputs and row vectors",
    "share": "True, False, or a list of [aux store, aux load] name pairs",
}


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _names(v: Any) -> bool:
    return isinstance(v, (list, tuple, set, frozenset)) and all(isinstance(x, str) for x in v)


_DECISION_OK = {
    "policy": lambda v: v in ("evtc", "cutlass"),
    "c_slot": lambda v: v is None or isinstance(v, str),
    "d_slot": lambda v: isinstance(v, str),
    "epilogue_tile": lambda v: isinstance(v, (list, tuple)) and len(v) == 2 and all(_is_int(x) and x > 0 for x in v),
    "stages_c": lambda v: _is_int(v) and v > 0,
    "stages_d": lambda v: _is_int(v) and v > 0,
    "reuse": lambda v: isinstance(v, bool),
    "direct": _names,
    "share": lambda v: isinstance(v, bool) or (isinstance(v, (list, tuple, set, frozenset)) and all(
        isinstance(p, (list, tuple)) and len(p) == 2 and _names(p) for p in v)),
}


def check_plan_decisions(decisions: Mapping[str, Any], *, policy: bool = True,
                         epilogue: str | None = None) -> dict[str, Any]:
    """Check fixed planner decisions strictly, by key and by type (a bool is no integer, a
    string no list of names), before the planner compares them with its candidates.

    Args:
        decisions: the decisions, e.g. ``{"reuse": True, "stages_c": 2}`` (:data:`PLAN_DECISIONS`).
        policy: whether ``policy`` may be among them (``evtc.Gemm(plan=...)`` takes it; the
            sm90 planner gets it as its own argument).
        epilogue: the epilogue's name, for the message.

    Returns:
        ``decisions`` as a dict.

    Raises:
        PlanError: an unknown decision (with the close matches and the list), or a value of the
            wrong type, naming the decision and what it takes.
    """
    if not isinstance(decisions, Mapping):
        raise PlanError(f"plan={decisions!r:.60} is not a dict of planner decisions", epilogue=epilogue,
                        hint="e.g. plan={'reuse': True, 'stages_c': 2}, or plan='evtc' / 'cutlass'")
    known = [k for k in PLAN_DECISIONS if policy or k != "policy"]
    unknown = sorted(k for k in decisions if k not in known)
    if unknown:
        close = sorted({m for k in unknown for m in difflib.get_close_matches(str(k), known, n=2)})
        hint = f"did you mean {', '.join(close)}? " if close else ""
        raise PlanError(f"unknown plan decision{'s' if len(unknown) > 1 else ''} {unknown}", epilogue=epilogue,
                        hint=f"{hint}fixable decisions: {', '.join(k for k in known if k != 'policy')}")
    for key, value in decisions.items():
        if not _DECISION_OK[key](value):
            hint = ("True/False is not a number" if isinstance(value, bool) and key != "share" else
                    "a string is not a list of names" if isinstance(value, str) and key in ("direct", "share") else None)
            raise PlanError(f"plan decision {key}={value!r:.60}: needs {PLAN_DECISIONS[key]}", epilogue=epilogue,
                            hint=hint)
    return dict(decisions)


def check_plan_options(arch: str, policy: Any, rank: Any, fixed: Mapping[str, Any] | None, *,
                       epilogue: str | None = None) -> None:
    """Refuse planner options that ``arch`` would ignore: sm80 kernels have no shared-memory plan
    to choose (every visitor works from registers, :mod:`evtc.plan.sm80`), so ``plan='cutlass'``,
    a ``plan_rank`` or fixed decisions there would be dropped while the call reports success.
    sm90 checks them itself, against its candidates (:func:`evtc.plan.sm90.plan_sm90`).

    Raises:
        PlanError: a policy that is neither ``evtc`` nor ``cutlass``; a fixed decision of the
            wrong key or type (:func:`check_plan_decisions`).
        ConfigError: a rank that is no integer >= 0; on sm80, any option other than the default.
    """
    if arch == "sm90":
        return
    if not isinstance(policy, str) or policy not in ("evtc", "cutlass"):
        raise PlanError(f"unknown planning policy {policy!r:.60}", epilogue=epilogue, hint="use one of ('evtc', 'cutlass')")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ConfigError(f"plan_rank={rank!r}: the rank of a plan in the cost model's order is an integer >= 0",
                          epilogue=epilogue)
    fixed = check_plan_decisions(fixed or {}, policy=False, epilogue=epilogue)
    given = ([f"plan={policy!r}"] if policy != "evtc" else []) + ([f"plan={fixed}"] if fixed else []) \
        + ([f"plan_rank={rank}"] if rank else [])
    if given:
        raise ConfigError(f"{', '.join(given)}: {arch} kernels have no shared-memory plan to choose (every epilogue "
                          "visitor works from registers), so it would be ignored", epilogue=epilogue,
                          hint=f"leave plan and plan_rank out on {arch} (they choose sm90's plan)")


def column_reduction_tile_ok(graph, config: GemmConfig) -> bool:
    """A column reduction (``Sm90RowReduction``) needs a tile N of at most 32 or a multiple of 64:
    its cross-warp step divides each lane's share of the CTA row (two values per 32-column
    epilogue subtile) by the subtiles along N (``logical_divide`` in
    ``sm90_visitor_store_tma_warpspecialized.hpp``), which an odd count above one doesn't divide
    ("Shape Divisibility Condition"; found building a 128x160 conv kernel with nvcc 13.0; the
    GEMM family's 192-wide tile builds and runs). Cheap to import, like :func:`atomic_reduction`:
    a Gemm's family asks it for each member (the 128x176 ping-pong tile)."""
    from evtc.ir.nodes import Reduction

    tn = config.tile[1]
    return tn <= 32 or tn % 64 == 0 or not any(isinstance(o, Reduction) and o.dim == 0 for o in graph.outputs)


def group_quant_config_ok(graph, config: GemmConfig) -> bool:
    """Whether ``config`` can run an epilogue that quantizes D per token group (``evtc.quantize``):
    the tile N a multiple of the group, no swap-AB (a row's groups would lie along the
    accumulator's M), a collective D store (not the unaligned or packed-rows variants), not
    grouped. The sm90 planner raises the same conditions as a PlanError
    (NOTE [Per-token-group quantization in the epilogue], evtc/plan/sm90_space.py)."""
    from evtc.ir.nodes import GroupScale

    scales = next((o for o in graph.outputs if isinstance(o, GroupScale)), None)
    if scales is None:
        return True
    return (config.tile[1] % scales.group == 0 and not config.swap_ab and not config.unaligned
            and not config.packed_stores and not config.grouped)


def glu_config_ok(graph, config: GemmConfig) -> bool:
    """Whether ``config`` can run a gated epilogue (``evtc.glu``): no swap-AB (a column pair would
    lie along the accumulator's M, across threads), not the unaligned or packed-rows variants. The sm90 planner raises the same conditions as a PlanError (NOTE [The gated
    epilogue], include/evtc/sm90_glu_store.hpp; :func:`evtc.plan.sm90_buffers.plan_glu`)."""
    from evtc.ir.nodes import is_gated

    if not any(is_gated(o) for o in graph.outputs):
        return True
    return not (config.swap_ab or config.unaligned or config.packed_stores)


def check_mainloop_dtypes(arch: str, a: DType, b: DType) -> None:
    """Refuse operand dtypes ``arch``'s mainloop can't take (:data:`evtc.dtypes.MAINLOOP_DTYPES`).

    Raises:
        ConfigError: a dtype the arch's mainloop lacks, or A and B of different widths.
    """
    from evtc.dtypes import MAINLOOP_DTYPES

    for name, dt in (("a", a), ("b", b)):
        if dt not in MAINLOOP_DTYPES[arch]:
            allowed = ", ".join(x.name for x in MAINLOOP_DTYPES[arch])
            raise ConfigError(f"{name}={dt.name} is not a {arch} mainloop dtype ({allowed})",
                              hint=(f"{arch}'s fp8 mainloop takes e4m3" if arch == "sm90" else "fp8 GEMMs need sm90")
                              if dt.is_fp8 else None)
    if a.bits != b.bits:
        raise ConfigError(f"A is {a.name} and B is {b.name}: mixed-width mainloops are not supported")
