"""Conv kernel configurations and plans: a conv config -> a validated GemmConfig, and Graph +
config -> a :class:`ConvPlan`.

Input: an arch, the operand dtypes, the kind of convolution and a configuration (a dict of
:class:`~evtc.plan.config.GemmConfig` fields, a GemmConfig or None); for planning also the Graph
after passes. Output: the conv kernel's :class:`~evtc.plan.config.GemmConfig`
(:func:`conv_config`, which refuses what a conv kernel doesn't take) and its
:class:`~evtc.plan.model.Plan` (:func:`plan_conv`: the GEMM planners with the conv kernel's
schedule and, on sm90's non-persistent kernel, its stage rule).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from evtc.dtypes import DType
from evtc.errors import ConfigError, PlanError
from evtc.ir.graph import Graph
from evtc.ir.nodes import is_gated
from evtc.plan.config import GemmConfig
from evtc.plan.config import validate as validate_gemm_config
from evtc.plan.model import Plan, format_plan
from evtc.plan.smem import round_up
from evtc.plan.target import get_target

__all__ = ["CONFIG_FIELDS", "NONPERSISTENT", "PERSISTENT_SCHEDULE", "PERSISTENT_SCHEDULES", "SM80_SCHEDULE",
           "SM90_SCHEDULE", "ConvPlan", "conv_config", "is_persistent", "kernel_kind", "plan_conv",
           "sm90_kernel_smem", "strided_dgrad_fields"]

#: The sm90 conv kernel's schedule and tile order, as the plan prints them: CUTLASS's
#: ``KernelImplicitTmaWarpSpecializedSm90`` is ``KernelTmaWarpSpecialized`` (one consumer
#: warpgroup, one output tile per CTA: ``conv/dispatch_policy.hpp`` static_asserts persistent
#: schedules away for conv). The persistent fprop kernels are :data:`PERSISTENT_SCHEDULE`'s.
SM90_SCHEDULE = "warpspecialized"
NONPERSISTENT = "nonpersistent"
#: sm80's implicit-GEMM mainloop (``ImplicitGemmMultistage``)
SM80_SCHEDULE = "multistage"
#: the schedule of the sm90 conv kernels on CUTLASS's persistent cooperative GEMM kernel (NOTE
#: [Persistent conv kernels] in codegen_templates/include/evtc/sm90_conv.hpp): fprop and
#: unit-stride dgrad; the non-persistent conv kernel has the GemmConfig default
PERSISTENT_SCHEDULE = "cooperative"
#: the schedules of CUTLASS's persistent GEMM kernels a conv runs on: the cooperative one (two
#: consumer warpgroups on one tile) and the ping-pong one (one consumer warpgroup a tile, the two
#: alternating: one's epilogue under the other's mainloop; persistent tile scheduler only)
PERSISTENT_SCHEDULES = ("cooperative", "pingpong")


# ---- configuration --------------------------------------------------------------------------------


def _defaults(arch: str, a: DType, kind: str) -> GemmConfig:
    if arch == "sm90":
        # wgrad: N = 64, as CUTLASS's sm90 wgrad tests, since C must be a multiple of it
        # (check_arch_limits)
        n = 64 if kind == "wgrad" else 128
        return GemmConfig(tile=(128, n, 128 // a.bytes), cluster=(1, 1, 1), schedule=SM90_SCHEDULE,
                          scheduler=NONPERSISTENT, swizzle=0)
    # CUTLASS's sm80 conv tests' usual 16-bit tile, 4 stages as evtc's sm80 GEMM
    return GemmConfig(tile=(128, 128, 32), cluster=(1, 1, 1), schedule=SM80_SCHEDULE, stages=4,
                      warp_tile=(64, 64, 32), scheduler=NONPERSISTENT, swizzle=0)


#: fields a conv config may set, per arch (the rest are the conv kernel's)
CONFIG_FIELDS = {"sm90": ("tile", "cluster", "stages", "epilogue_tile", "schedule", "scheduler", "split_k",
                          "decomposition"),
                 "sm80": ("tile", "stages", "warp_tile", "swizzle")}
#: f32 accumulators per thread a ping-pong conv tile may take (TM*TN/128, of the 232 registers
#: the ping-pong kernel's consumer warpgroups get: 128x192, the largest tile measured)
PINGPONG_MAX_ACCUMULATORS = 192


def is_persistent(config: GemmConfig) -> bool:
    """Whether a conv config runs on one of CUTLASS's persistent GEMM kernels (NOTE [Persistent
    conv kernels]) rather than its non-persistent conv kernel."""
    return config.schedule in PERSISTENT_SCHEDULES


def kernel_kind(config: GemmConfig) -> str:
    """``nonpersistent`` (CUTLASS's conv kernel), ``persistent`` or ``streamk`` (the persistent
    cooperative GEMM kernel over that tile scheduler) or ``pingpong`` (the persistent ping-pong
    GEMM kernel): NOTE [Persistent conv kernels]."""
    if not is_persistent(config):
        return "nonpersistent"
    if config.schedule == "pingpong":
        return "pingpong"
    return "streamk" if config.scheduler == "streamk" else "persistent"


def conv_config(arch: str, a: DType, b: DType, config: GemmConfig | Mapping | None = None, *,
                kind: str = "fprop") -> GemmConfig:
    """The configuration of a conv kernel: the arch's default with what ``config`` sets.

    ``config`` is a dict of :class:`~evtc.plan.config.GemmConfig` fields, or a GemmConfig whose
    fields left at GemmConfig's defaults take the conv defaults. sm90 takes ``tile`` (M of 64
    or 128: one consumer warpgroup, whose ``TM*TN/128`` f32 accumulators per thread are at most
    128; N a multiple of 16 up to 256), ``cluster`` (1, 2 or 4 per mode, at most 4 CTAs: TMA
    multicast of the activation over N, of the filter over M), ``stages``, ``epilogue_tile`` (M
    = 64, N of 16, 32 or 64 dividing the tile's), and for fprop and dgrad
    ``schedule="cooperative"`` with ``scheduler`` ``"persistent"`` (default) or ``"streamk"``: the
    persistent cooperative kernel (NOTE [Persistent conv kernels]; the GEMM's cooperative rules,
    tile 128x256 by default), or ``schedule="pingpong"``: the persistent ping-pong kernel (the
    GEMM's ping-pong rules, tile 128x128 by default), and with ``"streamk"`` ``split_k`` and ``decomposition``
    (compile-time here: the conv kernels take no scheduler arguments at run time); sm80 ``tile``,
    ``warp_tile``, ``stages``, ``swizzle``. Defaults: sm90 128x128x(128 bytes) (wgrad 128x64),
    cluster 1x1, stages as many as fit; sm80 128x128x32, warps 64x64x32, 4 stages.

    Raises:
        ConfigError: an illegal value or a field the conv kernels don't have.
    """
    base = _defaults(arch, a, kind)
    given = _given_fields(arch, config)
    extra = sorted(k for k, v in given.items() if k not in CONFIG_FIELDS[arch] and v != getattr(base, k))
    if extra:
        raise ConfigError(f"the {arch} conv kernel has no {', '.join(extra)} to choose",
                          hint=f"a conv config takes {', '.join(CONFIG_FIELDS[arch])}"
                               + ("; sm90 conv kernels are non-persistent, one output tile per CTA "
                                  "(CUTLASS conv/dispatch_policy.hpp)" if arch == "sm90" else ""),
                          anchor="conv-config")
    cfg = base.replace(**{k: v for k, v in given.items() if k in CONFIG_FIELDS[arch]})
    if arch == "sm90" and (cfg.schedule != SM90_SCHEDULE or cfg.scheduler != NONPERSISTENT):
        return _persistent_config(cfg, a, b, kind, given)
    if arch == "sm90" and (cfg.split_k != 1 or cfg.decomposition != "heuristic"):
        raise ConfigError(f"split_k = {cfg.split_k}, decomposition '{cfg.decomposition}': decompositions of the "
                          "persistent kernel's stream-K tile scheduler",
                          hint="add schedule='cooperative', scheduler='streamk' (fprop)", anchor="conv-config")
    if arch == "sm80":
        # the GEMM's sm80 rules (tile/warp divisibility, K, stages) hold for the conv mainloop
        validate_gemm_config(cfg.replace(schedule="multistage", scheduler="persistent"), "sm80", a, b)
        return cfg
    return _nonpersistent_config(cfg, a, b)


def _given_fields(arch: str, config: GemmConfig | Mapping | None) -> dict[str, Any]:
    """The fields ``config`` sets: a dict's (lists as tuples), or a GemmConfig's that differ
    from GemmConfig's defaults.

    Raises:
        ConfigError: an unknown field, or a config that is neither.
    """
    if config is None:
        return {}
    if isinstance(config, GemmConfig):
        stock = GemmConfig()
        return {f.name: getattr(config, f.name) for f in dataclasses.fields(GemmConfig)
                if getattr(config, f.name) != getattr(stock, f.name)}
    if isinstance(config, Mapping):
        known = {f.name for f in dataclasses.fields(GemmConfig)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ConfigError(f"unknown config field{'s' if len(unknown) > 1 else ''} {unknown}",
                              hint=f"a conv config takes {', '.join(CONFIG_FIELDS[arch])}", anchor="conv-config")
        return {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
    raise ConfigError(f"config = {config!r} is not a GemmConfig or a dict", anchor="conv-config")


def _nonpersistent_config(cfg: GemmConfig, a: DType, b: DType) -> GemmConfig:
    """``cfg`` checked for CUTLASS's (non-persistent) sm90 conv kernel.

    Raises:
        ConfigError: the first rule it breaks.
    """
    # The GEMM's sm90 rules hold for the conv mainloop (the same GMMA and TMA atoms,
    # conv/collective/builders/sm90_gmma_builder.inl): tile N a multiple of 16 up to 256, K of
    # 32-byte multiples; cluster extents 1, 2 or 4 and at most 4 CTAs (the builder multicasts the
    # activation's im2col TMA over the cluster's N and the filter's TMA over its M:
    # sm90_cluster_shape_to_im2col_tma_atom in conv/collective/builders/sm90_common.inl).
    # Validated as ping-pong, whose M unit (64) is one warpgroup's, as the conv kernel's.
    validate_gemm_config(cfg.replace(schedule="pingpong", scheduler="persistent", epilogue_tile=None), "sm90", a, b)
    tm, tn, _ = cfg.tile
    # conv/dispatch_policy.hpp: KernelImplicitTmaWarpSpecializedSm90 is KernelTmaWarpSpecialized,
    # one consumer warpgroup (WGMMA M = 64 per instruction, so M of 64 or 128)
    if tm not in (64, 128):
        raise ConfigError(f"tile M = {tm}: the sm90 conv kernel has one consumer warpgroup (M of 64 or 128)",
                          anchor="conv-config")
    # gemm/kernel/sm90_gemm_tma_warpspecialized.hpp (the non-persistent kernel) has no setmaxnreg:
    # every thread keeps at most 255 registers, so the consumer's TM*TN/128 f32 accumulators are
    # capped at 128 (128x256 would need 256 and spill)
    if tm * tn // 128 > 128:
        raise ConfigError(f"tile {cfg.tile}: one consumer warpgroup would hold {tm * tn // 128} f32 accumulators per "
                          "thread (at most 128: the non-persistent kernel has no register reallocation, 255 registers "
                          "a thread; sm90_gemm_tma_warpspecialized.hpp)", hint="use 128x128, 64x256, 128x64 or 64x128",
                          anchor="conv-config")
    if cfg.epilogue_tile is not None:
        em, en = cfg.epilogue_tile
        if em != min(64, tm) or en not in (16, 32, 64) or tn % en:
            raise ConfigError(f"epilogue tile {cfg.epilogue_tile}: the one-warpgroup epilogue has M = {min(64, tm)} and N "
                              "of 16, 32 or 64 dividing tile N", anchor="conv-config")
    return cfg


def _persistent_config(cfg: GemmConfig, a: DType, b: DType, kind: str, given: Mapping) -> GemmConfig:
    """A conv config on one of CUTLASS's persistent GEMM kernels (NOTE [Persistent conv kernels]):
    ``schedule="cooperative"`` with ``scheduler`` ``"persistent"`` (the default when only the
    schedule is given) or ``"streamk"``, or ``schedule="pingpong"`` (persistent scheduler); the
    GEMM's sm90 rules for that schedule hold (cooperative: tile M of 128 or 256, split over two
    consumer warpgroups; ping-pong: M of 64 or 128, one consumer warpgroup a tile)."""
    if cfg.schedule == SM90_SCHEDULE:
        raise ConfigError(f"scheduler '{cfg.scheduler}': the {SM90_SCHEDULE} conv kernel is non-persistent",
                          hint="add schedule='cooperative' for the persistent cooperative kernel", anchor="conv-config")
    if not is_persistent(cfg):
        raise ConfigError(f"sm90 conv schedule '{cfg.schedule}' is not one of "
                          f"{(SM90_SCHEDULE, *PERSISTENT_SCHEDULES)}", anchor="conv-config")
    if kind not in ("fprop", "dgrad"):
        raise ConfigError(f"schedule='{cfg.schedule}': fprop and (unit-stride) dgrad run on the persistent "
                          "kernels, not wgrad (its B is the im2col operand, whose view has no batch mode "
                          "to give the GEMM kernel)", hint="wgrad takes the non-persistent kernel's fields",
                          anchor="conv-config")
    if cfg.scheduler == NONPERSISTENT:
        if "scheduler" in given:
            raise ConfigError(f"scheduler '{NONPERSISTENT}' with schedule='{cfg.schedule}'",
                              hint="use 'persistent'" + (" or 'streamk'" if cfg.schedule == PERSISTENT_SCHEDULE else ""),
                              anchor="conv-config")
        cfg = cfg.replace(scheduler="persistent")
    if cfg.scheduler == "batch_inner":
        raise ConfigError("scheduler 'batch_inner': the conv kernels take 'persistent' or 'streamk' (the batch-inner "
                          "tile order is the GEMM's row-phase split's)", hint="use 'persistent'", anchor="conv-config")
    if "tile" not in given:
        cfg = cfg.replace(tile=(128, 256 if cfg.schedule == PERSISTENT_SCHEDULE else 128, cfg.tile[2]))
    validate_gemm_config(cfg, "sm90", a, b)
    tm, tn, _ = cfg.tile
    # the ping-pong kernel's consumer warpgroup holds the whole tile's f32 accumulators,
    # TM*TN/128 a thread, in the 232 registers setmaxnreg gives it (240 from 208 accumulators on:
    # sm90_gemm_tma_warpspecialized_pingpong.hpp, MmaRegisterRequirement); evtc allows 192 (128x192)
    if cfg.schedule == "pingpong" and tm * tn // 128 > PINGPONG_MAX_ACCUMULATORS:
        raise ConfigError(f"tile {cfg.tile}: the ping-pong kernel's consumer warpgroup would hold {tm * tn // 128} f32 "
                          f"accumulators per thread (at most {PINGPONG_MAX_ACCUMULATORS} of its 232 registers: "
                          "sm90_gemm_tma_warpspecialized_pingpong.hpp)", hint="use 128x192, 128x128 or 64x256",
                          anchor="conv-config")
    return cfg


# ---- planning ----------------------------------------------------------------------------------------


def sm90_kernel_smem(config: GemmConfig, a: DType, b: DType, plan: Plan, stages: int) -> int:
    """An upper bound of ``sizeof(ConvKernel::SharedStorage)`` (bytes) with ``stages`` mainloop
    stages: the kernel (``sm90_gemm_tma_warpspecialized.hpp``, non-persistent) keeps the
    mainloop's and the epilogue's tensors in a union, then the mainloop's pipeline barriers
    (16 bytes a stage) and the epilogue's load barriers (16 bytes a ``StagesC`` stage). The union
    and the whole storage are rounded up to 1024 bytes (the largest smem alignment, a 128-byte
    swizzle atom's: the struct takes its union's alignment); the epilogue's part is bounded by
    ``sizeof(CollectiveEpilogue::SharedStorage)``."""
    tm, tn, tk = config.tile
    stage = (a.bits * tm * tk + b.bits * tn * tk) // 8
    union = round_up(max(stages * stage, plan.epilogue_smem_bytes), 1024)
    return round_up(union + 16 * stages + 16 * max(plan.stages_c, 1), 1024)


@dataclasses.dataclass(frozen=True)
class ConvPlan(Plan):
    """An sm90 conv kernel's :class:`~evtc.plan.model.Plan`: the GEMM planner's decisions for the
    epilogue, with the mainloop stages of the conv kernel, whose epilogue and mainloop tensors
    share a union (:func:`sm90_kernel_smem`).

    Attributes:
        kernel_smem_bound: the bound of ``sizeof(ConvKernel::SharedStorage)`` (bytes) that the
            kernel ``static_assert``s.
    """

    kernel_smem_bound: int = 0

    def to_json(self) -> dict:
        d = super().to_json()
        d["kernel_smem_bound"] = self.kernel_smem_bound
        return d

    def __str__(self) -> str:
        lines = format_plan(self).split("\n")
        cfg = self.config
        persistent = is_persistent(cfg)
        lines[0] = (f"plan ({self.policy}) for sm90 conv: tile {'x'.join(map(str, cfg.tile))}, cluster "
                    f"{'x'.join(map(str, cfg.cluster[:2]))}, "
                    + (f"{cfg.schedule}, {cfg.scheduler}" if persistent else "non-persistent"))
        if persistent:  # the GEMM's kernel: the plan's own budget line holds
            return "\n".join(lines)
        # the budget line: the epilogue doesn't add to the mainloop here (a union)
        lines[2] = (f"epilogue smem: {self.epilogue_smem_bytes} B, shared with {self.mainloop_stages} stages x "
                    f"{self.mainloop_stage_bytes} B: {self.kernel_smem_bound} of {self.smem_capacity} B")
        return "\n".join(lines)


def plan_conv(graph: Graph, arch: str, a: DType, b: DType, config: GemmConfig, *, policy: str = "evtc",
              rank: int = 0, fixed: Mapping | None = None) -> Plan:
    """Plan the epilogue of a conv kernel: evtc's GEMM planners with the conv kernel's schedule.

    sm90: :func:`evtc.plan.sm90.plan_sm90` (the one-warpgroup epilogue: subtiles of 64 rows, 128
    threads), then the mainloop stages of the conv kernel, where the epilogue's tensors don't
    take from the mainloop (:func:`sm90_kernel_smem`). sm80: :func:`evtc.plan.sm80.plan_sm80`
    with its first kernel variant only (16-byte accesses: the conv kernels need channels in
    16-byte vectors anyway).

    Raises:
        PlanError: nothing fits; an epilogue that quantizes D (``evtc.quantize``: built and
            checked for GEMMs only), or whose output is ``evtc.glu``'s (the gated store is the
            GEMMs' root visitor over a void D; the conv kernels store D).
    """
    if any(is_gated(o) for o in graph.outputs):
        raise PlanError("evtc.glu (the one-GEMM gated form) is built for evtc.Gemm and evtc.GroupedGemm only: the "
                        "conv kernels store a D of the convolution's N columns", epilogue=graph.name,
                        hint="return the convolution's output and apply the gated unit after it (evtc.glu on torch "
                        "tensors runs eagerly), or run the conv as a GEMM")
    if any(getattr(o, "kind", "") == "group_scale" for o in graph.outputs):
        raise PlanError("evtc.quantize is built for GEMMs only: the conv kernels' epilogue was not checked with it",
                        epilogue=graph.name, hint="quantize the convolution's output after it "
                        "(evtc.testing.quant.quantize_per_token_group), or run the conv as a GEMM")
    target = get_target(arch)
    if arch == "sm90" and is_persistent(config):
        from evtc.plan.sm90 import plan_sm90

        # the GEMM's kernel and its stage rule: the epilogue's buffers beside the mainloop's
        plan = plan_sm90(graph, target, config, a=a, b=b, policy=policy, rank=rank, fixed=fixed)
        fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
        fields.update(notes=plan.notes + (f"conv on the persistent {config.schedule} kernel ({config.scheduler} tile "
                                          "scheduler), the epilogue's buffers beside the mainloop's",),
                      kernel_smem_bound=target.smem_capacity)
        return ConvPlan(**fields)
    if arch == "sm90":
        from evtc.plan.sm90 import plan_sm90

        # the GEMM planner's stage rule (a carveout) is not the conv kernel's: plan without it
        plan = plan_sm90(graph, target, config.replace(stages=None), a=a, b=b, policy=policy, rank=rank, fixed=fixed)
        if config.stages:
            stages = config.stages
            if sm90_kernel_smem(config, a, b, plan, stages) > target.smem_capacity:
                raise PlanError(f"{stages} mainloop stages at tile {config.tile} exceed the {target.smem_capacity} B "
                                "of shared memory a block may use", epilogue=graph.name, hint="use fewer stages")
        else:
            stages = 1
            while sm90_kernel_smem(config, a, b, plan, stages + 1) <= target.smem_capacity:
                stages += 1
            if stages < 2:
                raise PlanError(f"tile {config.tile} leaves fewer than 2 mainloop stages", epilogue=graph.name,
                                hint="use a smaller tile")
        note = (f"conv kernel (non-persistent): the epilogue's buffers share a union with the mainloop's, so the "
                f"mainloop keeps {stages} stages")
        fields = {f.name: getattr(plan, f.name) for f in dataclasses.fields(plan)}
        fields.update(config=config, mainloop_stages=stages, notes=plan.notes + (note,),
                      kernel_smem_bound=sm90_kernel_smem(config, a, b, plan, stages))
        return ConvPlan(**fields)
    from evtc.plan.sm80 import plan_sm80

    plan = plan_sm80(graph, target, config, a=a, b=b)
    notes = tuple(n for n in plan.notes if not n.startswith("kernel variants"))
    notes += ("conv kernel: one variant, 16-byte vectors (channels are multiples of 16 bytes)",)
    return dataclasses.replace(plan, variants=plan.variants[:1], notes=notes,
                               epilogue_smem_bytes=plan.variants[0].epilogue_smem_bytes)


# NOTE [The strided-dgrad kernel's tile]
# The strided-dgrad kernel (CUTLASS 2.x's, NOTE [Strided dgrad rows] in
# include/evtc/sm80_conv.hpp) runs with a 128x128 tile of K = 128 bytes (64 16-bit channels),
# warps of 64x64, 3 stages, unless the Conv was given a configuration of its own arch. On the
# five stride-2 layers of benchmarks/bench_conv.py (H100, 2026-11-26,
# benchmarks/explore_conv_dgrad.py --strided; time / cuDNN's dgrad + the eager dReLU in CUDA
# graphs) it took 0.461 / 0.224 / 0.519 / 0.635 / 0.848 against the sm80 default's (128x128x32,
# 4 stages) 0.486 / 0.238 / 0.565 / 0.679 / 1.006: the fastest of nine configurations on three
# layers and within 8 % of the fastest (128x256x32, which is slower on the UNet's) on the other
# two.


def strided_dgrad_fields(a: DType) -> dict:
    """The configuration fields of the strided-dgrad kernel for operand dtype ``a`` (NOTE [The
    strided-dgrad kernel's tile])."""
    k = 128 // a.bytes
    return {"tile": (128, 128, k), "warp_tile": (64, 64, k), "stages": 3}
