"""``evtc.Conv``: an epilogue fused into an implicit-GEMM convolution (fprop, dgrad, wgrad).

Input: an epilogue (``@evtc.epilogue`` function, Graph or textual expression), the kind of
convolution, its spatial dimensions, operand and output dtypes, an arch. Output: a callable
convolution ``conv(a, b, problem=ConvProblem(...), **epilogue_args)``.

A convolution shares everything with :class:`evtc.Gemm` from the IR to the plan: the epilogue
is traced, passed, lowered and planned exactly as for the GEMM with M, N, K of the implicit
GEMM (NOTE [Implicit GEMM of a convolution] in :mod:`evtc.runtime.conv_bind`); only the
mainloop and the problem mapping differ:

* sm90: CUTLASS 3.x's ``ConvUniversal`` (TMA im2col mainloop, ``KernelImplicitTmaWarpSpecializedSm90``)
  with the collective epilogue and evtc's planned fusion callbacks, seen through the flattened
  GEMM problem (NOTE [The conv epilogue sees a GEMM] in ``include/evtc/sm90_conv.hpp``); for
  fprop and unit-stride dgrad also the same mainloop on CUTLASS's persistent cooperative GEMM
  kernel, persistent or stream-K (NOTE [Persistent conv kernels]); :mod:`evtc.emit.conv_sm90`;
* sm80: CUTLASS 2.x's implicit-GEMM convolution mainloop (``DefaultConv{2,3}d{Fprop,Dgrad,Wgrad}``)
  with evtc's register-only visitor epilogue (``include/evtc/sm80_conv.hpp``);
  :mod:`evtc.emit.conv_sm80`;
* strided dgrad (stride > 1): CUTLASS 2.x's strided-dgrad mainloop with a visitor epilogue that
  maps each output row to its pixel (``include/evtc/sm80_conv.hpp``), on either arch (it is an
  sm80 kernel, JIT-compiled from PTX on Hopper): CUTLASS 3.x's sm90 kernels compute unit-stride
  dgrad only.

An sm90 fprop or dgrad Conv is a kernel family (:mod:`evtc.family.conv`): conv kernels of several
tiles and kernels, one picked per problem, and for fprop a GEMM for 1x1 problems
(:mod:`evtc.runtime.conv_gemm`).

Example::

    @evtc.epilogue
    def bias_silu(acc, bias: evtc.RowVector[evtc.f32]):
        return evtc.silu(acc + bias)

    conv = evtc.Conv(bias_silu, kind="fprop", a=evtc.bf16, d=evtc.bf16, arch="sm90")
    y = conv(x, w, problem=evtc.ConvProblem(stride=1, padding=1), bias=b)   # x NHWC, w KRSC, y NHWC
"""

from __future__ import annotations

import dataclasses
import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from evtc import dtypes, passes
from evtc.compiler import cache
from evtc.dtypes import DType
from evtc.errors import ArgumentError, ConfigError, PlanError, api_boundary
from evtc.frontend.epilogue import Epilogue
from evtc.ir.graph import Graph
from evtc.ir.printer import print_graph
from evtc.plan.config import GemmConfig
from evtc.plan.config import validate as validate_gemm_config
from evtc.plan.model import Plan, format_plan
from evtc.plan.smem import round_up
from evtc.plan.target import get_target
from evtc.runtime.conv_bind import (
    KINDS,
    LAYOUTS,
    OPERANDS,
    ConvBinder,
    ConvSpec,
    conv_abi_fields,
)
from evtc.runtime.conv_bind import geometry, to_nhwc
from evtc.runtime.conv_gemm import NOT_ROUTED, GemmRoute
from evtc.runtime.launch import KernelLibrary, Launcher
from evtc.runtime import tensors
from evtc.family import conv as conv_family
from evtc.family.conv import ConvMember, member_configs, pointwise_problem

__all__ = ["Conv", "ConvPlan", "ConvProblem", "conv_config", "plan_conv"]

#: The sm90 conv kernel's schedule and tile order, as the plan prints them: CUTLASS's
#: ``KernelImplicitTmaWarpSpecializedSm90`` is ``KernelTmaWarpSpecialized`` (one consumer
#: warpgroup, one output tile per CTA: ``conv/dispatch_policy.hpp`` static_asserts persistent
#: schedules away for conv). The persistent fprop kernels are :data:`PERSISTENT_SCHEDULE`'s.
SM90_SCHEDULE = "warpspecialized"
NONPERSISTENT = "nonpersistent"
#: sm80's implicit-GEMM mainloop (``ImplicitGemmMultistage``)
SM80_SCHEDULE = "multistage"


@dataclasses.dataclass(frozen=True)
class ConvProblem:
    """The parameters of one convolution call (torch's ``conv2d``/``conv3d`` conventions).

    Attributes:
        stride: traversal stride, an int or one per spatial dimension (D, H, W order).
        padding: symmetric zero padding, an int or one per spatial dimension.
        dilation: filter dilation, an int or one per spatial dimension.
        groups: must be 1 (grouped convolutions are not supported).
        input_size: dgrad only: the spatial extents of dx (the forward input), which dy doesn't
            determine when the stride is above 1 (several input sizes give one output size; torch's
            ``conv_transpose`` calls it ``output_padding``). Not needed with ``out=`` given.
        filter_size: wgrad only: the spatial extents of dw, when x and dy don't determine them.

    Example::

        evtc.ConvProblem(stride=2, padding=1)                          # fprop, ResNet downsampling
        evtc.ConvProblem(stride=2, padding=1, input_size=(56, 56))     # its dgrad
    """

    stride: int | Sequence[int] = 1
    padding: int | Sequence[int] = 0
    dilation: int | Sequence[int] = 1
    groups: int = 1
    input_size: Sequence[int] | None = None
    filter_size: Sequence[int] | None = None

    def normalize(self, dims: int, epilogue: str | None = None) -> ConvSpec:
        """The problem for ``dims`` spatial dimensions as tuples of ints.

        Raises:
            ArgumentError: (anchor ``conv-problem``) a value of the wrong type or range, groups != 1.
        """

        def fail(msg: str, hint: str | None = None) -> ArgumentError:
            return ArgumentError(f"problem: {msg}", epilogue=epilogue, hint=hint, anchor="conv-problem")

        def spatial(name: str, value: Any, lo: int, optional: bool = False) -> tuple[int, ...] | None:
            if value is None and optional:
                return None
            if isinstance(value, int) and not isinstance(value, bool):
                value = (value,) * dims
            try:
                t = tuple(value)
            except TypeError:
                raise fail(f"{name} = {value!r} is not an int or a sequence of {dims} ints") from None
            if len(t) != dims or not all(isinstance(v, int) and not isinstance(v, bool) for v in t):
                raise fail(f"{name} = {value!r} needs {dims} ints (one per spatial dimension, "
                           f"{'D, H, W' if dims == 3 else 'H, W'})")
            if any(v < lo for v in t):
                raise fail(f"{name} = {t}: each must be at least {lo}")
            return t

        if not isinstance(self.groups, int) or isinstance(self.groups, bool) or self.groups != 1:
            raise fail(f"groups = {self.groups!r}: evtc's convolutions are not grouped (groups = 1); CUTLASS's sm90 "
                       "conv collective refuses groups > 1 (sm90_implicit_gemm_gmma_ss_warpspecialized.hpp)",
                       hint="run each group as its own convolution")
        return ConvSpec(spatial("stride", self.stride, 1), spatial("padding", self.padding, 0),
                        spatial("dilation", self.dilation, 1), 1,
                        spatial("input_size", self.input_size, 1, True), spatial("filter_size", self.filter_size, 1, True))


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
CONV_FIELDS = {"sm90": ("tile", "cluster", "stages", "epilogue_tile", "schedule", "scheduler", "split_k",
                        "decomposition"),
               "sm80": ("tile", "stages", "warp_tile", "swizzle")}
#: sm90 conv kernels on CUTLASS's persistent cooperative GEMM kernel, and the persistent
#: schedules (cooperative, ping-pong) (defined with the family)
PERSISTENT_SCHEDULE = conv_family.PERSISTENT_SCHEDULE
PERSISTENT_SCHEDULES = conv_family.PERSISTENT_SCHEDULES
#: f32 accumulators per thread a ping-pong conv tile may take (TM*TN/128, of the 232 registers
#: the ping-pong kernel's consumer warpgroups get: 128x192, the largest tile measured)
PINGPONG_MAX_ACCUMULATORS = 192


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
    if config is None:
        given: dict[str, Any] = {}
    elif isinstance(config, GemmConfig):
        stock = GemmConfig()
        given = {f.name: getattr(config, f.name) for f in dataclasses.fields(GemmConfig)
                 if getattr(config, f.name) != getattr(stock, f.name)}
    elif isinstance(config, Mapping):
        known = {f.name for f in dataclasses.fields(GemmConfig)}
        unknown = sorted(set(config) - known)
        if unknown:
            raise ConfigError(f"unknown config field{'s' if len(unknown) > 1 else ''} {unknown}",
                              hint=f"a conv config takes {', '.join(CONV_FIELDS[arch])}", anchor="conv-config")
        given = {k: tuple(v) if isinstance(v, list) else v for k, v in config.items()}
    else:
        raise ConfigError(f"config = {config!r} is not a GemmConfig or a dict", anchor="conv-config")
    extra = sorted(k for k, v in given.items() if k not in CONV_FIELDS[arch] and v != getattr(base, k))
    if extra:
        raise ConfigError(f"the {arch} conv kernel has no {', '.join(extra)} to choose",
                          hint=f"a conv config takes {', '.join(CONV_FIELDS[arch])}"
                               + ("; sm90 conv kernels are non-persistent, one output tile per CTA "
                                  "(CUTLASS conv/dispatch_policy.hpp)" if arch == "sm90" else ""),
                          anchor="conv-config")
    cfg = base.replace(**{k: v for k, v in given.items() if k in CONV_FIELDS[arch]})
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
    # The GEMM's sm90 rules hold for the conv mainloop (the same GMMA and TMA atoms,
    # conv/collective/builders/sm90_gmma_builder.inl): tile N a multiple of 16 up to 256, K of
    # 32-byte multiples; cluster extents 1, 2 or 4 and at most 4 CTAs (the builder multicasts the
    # activation's im2col TMA over the cluster's N and the filter's TMA over its M:
    # sm90_cluster_shape_to_im2col_tma_atom in conv/collective/builders/sm90_common.inl).
    # Validated as ping-pong, whose M unit (64) is one warpgroup's, as the conv kernel's.
    checked = validate_gemm_config(cfg.replace(schedule="pingpong", scheduler="persistent", epilogue_tile=None),
                                   "sm90", a, b)
    del checked
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
    if not conv_family.is_persistent(cfg):
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
        persistent = conv_family.is_persistent(cfg)
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
        PlanError: nothing fits.
    """
    target = get_target(arch)
    if arch == "sm90" and conv_family.is_persistent(config):
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


def _as_graph(epilogue: Any, *, c: DType | None, d: DType) -> Graph:
    from evtc.pipeline import as_graph

    return as_graph(epilogue, c=c, d=d)


# ---- kernels -----------------------------------------------------------------------------------------

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



class _Kernel:
    """One emitted conv kernel of a Conv: its arch, plan, source and (once built) library, and
    a Launcher per problem."""

    def __init__(self, conv: Conv, arch: str, strided: bool, member: str | None = None) -> None:
        self.conv = conv
        self.arch = arch
        self.strided = strided
        self.member = member or "base"
        a, b = conv.a, conv.b
        self.graph = conv.graph if arch == conv.arch else passes.run(conv.traced, arch)
        if strided and not (arch == conv.arch and conv._config_given):
            # NOTE [The strided-dgrad kernel's tile]
            self.config = conv_config(arch, a, b, strided_dgrad_fields(a), kind=conv.kind)
            plan_args = {}
        elif member is None:  # the main kernel (or another arch's default)
            self.config = conv.config if arch == conv.arch else conv_config(arch, a, b, None, kind=conv.kind)
            plan_args = conv._plan_args if arch == conv.arch else {}
        else:  # a family member: the main kernel's plan policy, not its rank or fixed decisions
            self.config = conv_config(arch, a, b, dict(conv._member_spec(member).fields), kind=conv.kind)
            plan_args = {"policy": conv._plan_args["policy"]} if conv._plan_args else {}
        self.plan = plan_conv(self.graph, arch, a, b, self.config, **plan_args)
        if arch == "sm90":
            from evtc.emit.conv_sm90 import emit_conv_sm90

            self.source = emit_conv_sm90(self.graph, self.plan, kind=conv.kind, dims=conv.dims,
                                         kernel_smem_bound=self.plan.kernel_smem_bound)
        else:
            from evtc.emit.conv_sm80 import emit_conv_sm80

            self.source = emit_conv_sm80(self.graph, self.plan, kind=conv.kind, dims=conv.dims, strided_dgrad=strided,
                                         fast_divmod=conv.fast_divmod)
        self.fields = conv_abi_fields(self.graph)
        self.library: KernelLibrary | None = None
        self.artifact: cache.Artifact | None = None
        self.launchers: dict[ConvSpec, Launcher] = {}
        self.lock = threading.Lock()

    @property
    def job_name(self) -> str:
        return self.conv.name if self.member == "base" else f"{self.conv.name}[{self.member}]"

    def job(self) -> cache.BuildJob:
        """The build job of this kernel (for :func:`evtc.compiler.build_many`)."""
        return cache.BuildJob(self.source, self.arch, self.job_name)

    def build(self, timeout: float | None = None) -> cache.Artifact:
        art = cache.build(self.source, arch=self.arch, name=self.job_name, timeout=timeout)
        self.load(art)
        return art

    def load(self, art: cache.Artifact) -> None:
        """Load ``art`` (this kernel's build) and check it is this kernel (ABI, IR, name)."""
        if self.library is None or self.artifact is None or self.artifact.key != art.key:
            library = KernelLibrary(art.verified_library_path())
            library.verify(fields=self.fields, ir=print_graph(self.graph), name=self.conv.name, arch=self.arch)
            self.library = library
            self.launchers = {}
        self.artifact = art

    def launcher(self, spec: ConvSpec) -> Launcher:
        got = self.launchers.get(spec)
        if got is None:
            with self.lock:
                if self.library is None:
                    self.build()
                assert self.library is not None
                binder = ConvBinder(self.graph, self.conv.a, self.conv.b, self.library.Args, kind=self.conv.kind,
                                    dims=self.conv.dims, layout=self.conv.layout, spec=spec, arch=self.arch,
                                    strided_dgrad=self.strided, tile=self.config.tile,
                                    persistent=conv_family.is_persistent(self.config))
                got = self.launchers[spec] = Launcher(binder, self.library, self.conv.name)
        return got


class Conv:
    """A convolution ``out = epilogue(conv(a, b), ...)`` compiled for one kind, arch and dtypes.

    Args:
        epilogue: an ``@evtc.epilogue`` function, a Graph, or a textual expression; ``acc`` is
            the convolution's output tile (f32).
        kind: ``"fprop"`` (``y = conv(x, w)``; call ``conv(x, w)``), ``"dgrad"`` (``dx``, the
            gradient of the input; call ``conv(dy, w)``) or ``"wgrad"`` (``dw``, the gradient of
            the filter; call ``conv(dy, x)``).
        dims: 2 (NHWC activations, KRSC filters) or 3 (NDHWC, KTRSC).
        a: dtype of the GEMM's A operand (fprop x, dgrad and wgrad dy): ``bf16`` or ``f16``.
        b: dtype of B (fprop and dgrad w, wgrad x); default ``a``.
        c: dtype of the source C (default: ``d``).
        d: dtype of the output tensors that don't choose their own with ``.to()``.
        arch: ``"sm90"`` (Hopper: TMA im2col, warp-specialized) or ``"sm80"`` (Ampere, also runs
            on Hopper).
        config: a dict of GemmConfig fields or a GemmConfig (see :func:`conv_config`): pins
            one kernel for every problem. None (default): sm90 fprop and dgrad are kernel families
            (NOTE [The sm90 conv family] in :mod:`evtc.family.conv`): each call runs the member
            :meth:`choose` picks for its implicit GEMM (strided dgrad: the strided-dgrad kernel),
            and fprop's 1x1 problems (stride 1, no padding, dilation 1) run on an
            :class:`evtc.Gemm` of the same epilogue (NOTE [1x1 convolutions as GEMMs]); wgrad and
            sm80 are one kernel.
        plan: ``"evtc"`` or ``"cutlass"`` (sm90: stock CUTLASS's epilogue rule), or a dict of
            fixed plan decisions (as :class:`evtc.Gemm`).
        plan_rank: sm90: take the n-th best plan of the cost model.
        layout: ``"nhwc"``: every activation-shaped tensor is given and returned in NHWC (NDHWC)
            order, filters KRSC (KTRSC), all packed; ``"nchw"``: torch's logical order (N, C, H,
            W) and (K, C, R, S) of tensors stored channels-last (``torch.channels_last`` /
            ``channels_last_3d``), which is how torch's channels-last tensors are passed directly;
            outputs are returned likewise.
        fast_divmod: strided dgrad only: (aux loads, stores) compute the output pixel of each
            row with ``cutlass::FastDivmod`` (True) or plain division (False), a compile-time
            choice (benchmarks/bench_conv.py measures the four).

    Attributes:
        graph: the epilogue after passes. plan: the main kernel's Plan (``print(conv.plan)``).
        source: the main kernel's ``.cu`` text. config: its configuration (the family's
        ``base`` member, or the pinned one).
        family: member name -> :class:`~evtc.family.conv.ConvMember` (one entry, ``base`` or
            ``pinned``, unless sm90 fprop or dgrad without ``config``).
        gemm_route: the :class:`~evtc.runtime.conv_gemm.GemmRoute` of 1x1 problems, or None
            (its ``.gemm`` is the :class:`evtc.Gemm`, made on first use).

    Raises:
        ConfigError: a bad kind, dims, dtype, layout, arch or configuration.
        EvtcError: trace, type, legalization and planning errors, located at the epilogue's line.

    Example::

        conv = evtc.Conv(bias_relu, kind="fprop", a=evtc.bf16, d=evtc.bf16, arch="sm90")
        y = conv(x, w, problem=evtc.ConvProblem(padding=1), C=r, alpha=1.0, beta=1.0, bias=b)
    """

    @api_boundary
    def __init__(self, epilogue: Epilogue | Graph | str, *, kind: str = "fprop", dims: int = 2,
                 a: DType | str = dtypes.bf16, b: DType | str | None = None, c: DType | str | None = None,
                 d: DType | str | None = None, arch: str = "sm90", config: GemmConfig | Mapping | None = None,
                 plan: str | Mapping = "evtc", plan_rank: int = 0, layout: str = "nhwc",
                 fast_divmod: tuple[bool, bool] = (True, True)) -> None:
        if kind not in KINDS:
            raise ConfigError(f"kind = {kind!r} is not one of {KINDS}", anchor="conv-config")
        if dims not in (2, 3) or isinstance(dims, bool):
            raise ConfigError(f"dims = {dims!r}: evtc's convolutions are 2-D or 3-D", anchor="conv-config")
        if layout not in LAYOUTS:
            raise ConfigError(f"layout = {layout!r} is not one of {LAYOUTS}", anchor="conv-config")
        if (not isinstance(fast_divmod, tuple) or len(fast_divmod) != 2
                or not all(isinstance(x, bool) for x in fast_divmod)):
            raise ConfigError(f"fast_divmod = {fast_divmod!r}: a pair of bools (aux loads, stores)", anchor="conv-config")
        get_target(arch)
        self.kind, self.dims, self.arch, self.layout, self.fast_divmod = kind, dims, arch, layout, fast_divmod
        self.a = dtypes.coerce(a)
        self.b = dtypes.coerce(b) if b is not None else self.a
        for name, dt in (("a", self.a), ("b", self.b)):
            if dt not in (dtypes.f16, dtypes.bf16):
                raise ConfigError(f"{name}={dt.name}: evtc's conv kernels take f16 or bf16 operands",
                                  hint="fp8 convolutions are not supported; an fp8 output is (d=evtc.e4m3)",
                                  anchor="conv-config")
        if self.a is not self.b:
            raise ConfigError(f"a is {self.a.name} and b is {self.b.name}: the tensor-core MMAs take one 16-bit type",
                              anchor="conv-config")
        self.d = dtypes.coerce(d) if d is not None else getattr(epilogue, "default_d", dtypes.bf16)
        self.c = dtypes.coerce(c) if c is not None else None
        self.config = conv_config(arch, self.a, self.b, config, kind=kind)
        self.traced = _as_graph(epilogue, c=self.c, d=self.d)
        self.name = self.traced.name
        reserved = sorted({i.name for i in self.traced.inputs} & {"problem", "out", "stream"})
        if reserved:
            raise ConfigError(f"epilogue parameter{'s' if len(reserved) > 1 else ''} {', '.join(map(repr, reserved))} "
                              "can't be passed: a Conv call takes problem=, out= and stream= itself",
                              epilogue=self.name, hint="rename the parameter", anchor="conv-config")
        self.graph = passes.run(self.traced, arch)
        fixed = dict(plan) if isinstance(plan, Mapping) else {}
        policy = fixed.pop("policy", "evtc") if isinstance(plan, Mapping) else plan
        self._plan_args = {"policy": policy, "rank": plan_rank, "fixed": fixed} if arch == "sm90" else {}
        if arch == "sm80" and (policy != "evtc" or fixed or plan_rank):
            raise ConfigError("plan policies, ranks and fixed decisions are sm90's", anchor="conv-config")
        self._kernels: dict[tuple, _Kernel] = {}
        # the family (NOTE [The sm90 conv family]): sm90 fprop and dgrad without a pinned config
        # choose a member per problem, fprop sends 1x1 problems to a GEMM; everything else is
        # one kernel
        self.pinned = config is not None
        self._config_given = bool(config)  # a configuration with fields (not None or {})
        if arch == "sm90" and kind in conv_family.FAMILIES and not self.pinned:
            from evtc.plan.config import column_reduction_tile_ok

            # each member's configuration (the heuristic's input; a member is planned when it
            # runs), without members whose tile the epilogue can't take (a column reduction: tile
            # N a multiple of 64)
            members = {n: (m, conv_config(arch, self.a, self.b, dict(m.fields), kind=kind))
                       for n, m in member_configs(self.a, conv_family.FAMILIES[kind]).items()}
            members = {n: mc for n, mc in members.items() if column_reduction_tile_ok(self.graph, mc[1])}
            self.family: dict[str, ConvMember] = {n: m for n, (m, _) in members.items()}
            self._member_configs = {n: (cfg, m.ctas_per_sm) for n, (m, cfg) in members.items()}
            self.gemm_route: GemmRoute | None = GemmRoute(self) if kind == "fprop" else None
        else:
            self.family = {"pinned" if self.pinned else "base": ConvMember("pinned" if self.pinned else "base", {}, 1)}
            self._member_configs = {}
            self.gemm_route = None
        # the main kernel: planned and emitted now, so epilogue errors surface at construction
        strided_main = False
        main = self._kernel(arch, strided_main)
        self.plan = main.plan
        self.source = main.source
        self._specs: dict[ConvProblem, ConvSpec] = {}
        self._choices: dict[tuple, _Kernel] = {}

    def _kernel(self, arch: str, strided: bool, member: str | None = None) -> _Kernel:
        if member in (None, "base", "pinned") or strided or arch != self.arch:
            key: tuple = (arch, strided)
            member = None
        else:
            key = (arch, strided, member)
        k = self._kernels.get(key)
        if k is None:
            k = self._kernels[key] = _Kernel(self, arch, strided, member)
        return k

    def _member_spec(self, name: str) -> ConvMember:
        if name in self.family:
            return self.family[name]
        if name not in conv_family.CANDIDATES:
            raise ConfigError(f"no conv family member '{name}'",
                              hint=f"members: {', '.join(conv_family.CANDIDATES)}", anchor="conv-config")
        return member_configs(self.a, [name])[name]

    def member(self, name: str) -> _Kernel:
        """The (planned, emitted, maybe not built) kernel of a family member or exploration
        candidate (:data:`evtc.family.conv.CANDIDATES`) by name; ``base`` is the main kernel.

        Raises:
            ConfigError: an unknown name, or a member this Conv's kind or arch can't take (only
                sm90 fprop and dgrad Convs without a pinned config have members besides their one
                kernel).
        """
        if name in ("base", "pinned") or name in self.family and len(self.family) == 1:
            return self._kernels[(self.arch, False)]
        if self.arch != "sm90" or self.kind not in conv_family.FAMILIES or self.pinned:
            raise ConfigError(f"member '{name}': only sm90 fprop and dgrad Convs without config= have a kernel family",
                              hint="pin a configuration with Conv(..., config={...}) instead", anchor="conv-config")
        self._member_spec(name)
        return self._kernel(self.arch, False, name)

    def kernels(self) -> list[_Kernel]:
        """The kernels of the family (planned and emitted, not built): the main kernel first."""
        return [self.member(n) for n in self.family]

    def jobs(self, *, gemm: bool = True) -> list[cache.BuildJob]:
        """The build jobs of the family and (``gemm=True``) of the 1x1 route's Gemm family (for
        :func:`evtc.compiler.build_many`, or to prebuild kernels on another machine)."""
        out = [k.job() for k in self.kernels()]
        if gemm and self.gemm_route is not None:
            out += self.gemm_route.gemm.jobs()
        return out

    def choose(self, M: int, N: int, K: int, *, sm_count: int | None = None, channels: int | None = None) -> str:
        """The family member (name) an implicit GEMM of (M, N, K) runs on
        (:func:`evtc.family.conv.choose`; NOTE [The sm90 conv family]). ``channels``: the
        channels the implicit GEMM's K runs over, fprop's input channels C and dgrad's output
        channels K (:meth:`channels_of`); without it, none of the persistent members."""
        if len(self.family) == 1:
            return next(iter(self.family))
        return conv_family.choose(self._member_configs, M, N, K, sm_count or get_target(self.arch).sm_count,
                                  channels=channels)

    def kernel_for(self, a_shape: Sequence[int], b_shape: Sequence[int], problem: ConvProblem | None = None):
        """The kernel a call with packed, aligned operands of these NHWC (KRSC) shapes runs on, and
        its label: ``("m64", conv kernel)`` for a family member, ``("gemm:small", Gemm kernel)``
        for a 1x1 problem on the Gemm, ``("base", ...)`` for a Conv of one kernel. Both kernels
        have ``job()`` and ``build()`` (to prebuild what a set of layers runs).

        Raises:
            ArgumentError: shapes that are not a convolution of the Conv's kind (anchor
                ``conv-problem``).
        """
        spec = (problem or _DEFAULT_PROBLEM).normalize(self.dims, self.name)
        g = geometry(self.kind, self.dims, tuple(a_shape), tuple(b_shape), spec, None, self.name)
        M, N, K = g.gemm
        vec = 16 // self.a.bytes
        if (self.gemm_route is not None and all(f == 1 for f in g.flt) and not (g.c % vec or g.k % vec)
                and min(M, N, K) > 0 and pointwise_problem(self.kind, spec.stride, spec.padding, spec.dilation,
                                                           spec.groups)):
            gemm = self.gemm_route.gemm
            member = gemm.choose(M, N, K)
            return f"gemm:{member.name}", gemm.kernel(member)
        if self.kind == "dgrad" and not spec.unit_stride:
            return "strided", self._kernel("sm80", True)
        name = self.choose(M, N, K, channels=self.channels_of(g))
        return name, self.member(name)

    def channels_of(self, g: Any) -> int:
        """The channels a problem's implicit-GEMM K runs over (the persistent members' rule, NOTE
        [Persistent conv kernels]): fprop's input channels C, dgrad's output channels K."""
        return g.k if self.kind == "dgrad" else g.c

    def _route(self, spec: ConvSpec, a: Any = None, b: Any = None, out: Any = None) -> _Kernel:
        """The kernel of a problem: strided dgrad runs on the sm80 strided-dgrad kernel (on either
        arch); an sm90 fprop or dgrad family's member by :meth:`choose` (given the operands ``a`` and
        ``b``); everything else on the main kernel."""
        if self.kind == "dgrad" and not spec.unit_stride:
            return self._kernel("sm80", True)
        main = self._kernels[(self.arch, False)]
        if len(self.family) == 1 or a is None:
            return main
        pa, pb = tensors.probe_for(type(a)), tensors.probe_for(type(b))
        key = None
        if pa is not None and pb is not None:
            try:
                key = (spec, pa(a)[0], pb(b)[0])
            except Exception:
                key = None
        got = self._choices.get(key) if key is not None else None
        if got is not None:
            return got
        try:
            va = to_nhwc(tensors.view(a, OPERANDS[self.kind][0], self.name), self.layout)
            vb = to_nhwc(tensors.view(b, OPERANDS[self.kind][1], self.name), self.layout)
            g = geometry(self.kind, self.dims, tuple(va.shape), tuple(vb.shape), spec, None, self.name)
        except ArgumentError:
            return main  # its binder reports what is wrong
        got = self.member(self.choose(*g.gemm, channels=self.channels_of(g)))
        if key is not None:
            if len(self._choices) > 256:
                self._choices.clear()
            self._choices[key] = got
        return got

    @api_boundary
    def build(self, timeout: float | None = None, *, strided: bool = False, family: bool = False,
              executor: Any = None) -> cache.Artifact:
        """Compile (or fetch from the cache) and load the main kernel, or with ``strided=True``
        (dgrad) the strided-dgrad kernel, or with ``family=True`` every family member and the
        1x1 route's Gemm family, in parallel.

        Args:
            timeout: seconds before an nvcc is killed.
            strided: build dgrad's strided kernel.
            family: build the whole family (:meth:`jobs`).
            executor: a :class:`concurrent.futures.Executor` for the family's builds.

        Returns:
            The main (or strided) kernel's Artifact.

        Raises:
            BuildError: nvcc failed (the source and log are kept and named).
            NoDeviceError: no nvcc.
        """
        if strided:
            if self.kind != "dgrad":
                raise ConfigError("only dgrad has a strided kernel", anchor="conv-config")
            return self._kernel("sm80", True).build(timeout)
        main = self._kernels[(self.arch, False)]
        if not family:
            return main.build(timeout)
        kernels = self.kernels()
        gemm_kernels = self.gemm_route.gemm.kernels() if self.gemm_route is not None else []
        results = cache.build_many([k.job() for k in kernels + gemm_kernels], executor=executor, timeout=timeout)
        for k, r in zip(kernels + gemm_kernels, results):
            if isinstance(r, Exception):
                raise r
            k.load(r)
        assert main.artifact is not None
        return main.artifact

    def source_for(self, *, strided: bool = False) -> str:
        """The ``.cu`` text of the main kernel, or (dgrad, ``strided=True``) the strided one."""
        return self._kernel("sm80", True).source if strided else self.source

    def info(self) -> dict:
        """The built main kernel's info (plan, ABI, ``sizeof`` of the epilogue storage, stages)."""
        k = self._kernels[(self.arch, False)]
        if k.library is None:
            k.build()
        assert k.library is not None
        return k.library.info

    @api_boundary
    def __call__(self, a: Any, b: Any, *, problem: ConvProblem | None = None, out: Any = None, stream: Any = None,
                 **kwargs: Any):
        """Run the convolution and its epilogue on the caller's current stream.

        Args:
            a, b: the operands: fprop ``(x, w)``, dgrad ``(dy, w)``, wgrad ``(dy, x)``; device
                tensors of dtype ``a``/``b``, packed in the Conv's ``layout`` (x N x H x W x C,
                w K x R x S x C, dy N x P x Q x K for ``"nhwc"``).
            problem: stride, padding, dilation (and dgrad's input size, wgrad's filter size);
                default ``ConvProblem()`` (stride 1, no padding).
            out: preallocated outputs (a tensor for a single-output epilogue, else a dict);
                for dgrad and wgrad an output tensor also fixes the size of dx or dw.
            stream: a CUDA stream (as :meth:`evtc.Gemm.__call__`).
            **kwargs: the epilogue's parameters: M x N tensors shaped like the output (or
                (M, N)), row vectors of N values, column vectors of M, scalars.

        Returns:
            The output alone when it is the only one, else a dict name -> tensor. M x N outputs
            have the output's shape (y, dx or dw, in the Conv's layout); reductions are (M,),
            (N,) or () (NOTE [Implicit GEMM of a convolution] in :mod:`evtc.runtime.conv_bind`).

        Raises:
            ArgumentError: a bad argument or problem, named (problem limits: anchor
                ``conv-problem``).
            LaunchError: CUDA reported an error.
        """
        if problem is None:
            problem = _DEFAULT_PROBLEM
        if not isinstance(problem, ConvProblem):
            raise ArgumentError(f"problem = {problem!r} is not an evtc.ConvProblem", epilogue=self.name,
                                anchor="conv-problem")
        try:
            spec = self._specs.get(problem)
            hashable = True
        except TypeError:  # lists inside: normalized on every call
            spec, hashable = None, False
        if spec is None:
            spec = problem.normalize(self.dims, self.name)
            if hashable:
                self._specs[problem] = spec
        route = self.gemm_route
        if route is not None and pointwise_problem(self.kind, spec.stride, spec.padding, spec.dilation, spec.groups):
            got = route(a, b, kwargs, out, stream)
            if got is not NOT_ROUTED:
                return got
        return self._route(spec, a, b, out).launcher(spec)(a, b, kwargs, out, stream)

    def __repr__(self) -> str:
        return (f"<evtc.Conv {self.name} {self.dims}-D {self.kind} {self.arch} a={self.a} "
                f"tile={'x'.join(map(str, self.config.tile))}>")

    def describe(self) -> str:
        """The IR, the plan and the configuration, as text."""
        return f"{self.graph}\n{self.plan}\nconfig: {json.dumps(self.config.to_json())}\n"


_DEFAULT_PROBLEM = ConvProblem()
