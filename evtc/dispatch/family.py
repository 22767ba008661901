"""A GEMM's kernel family: its members, a kernel per member, a launcher per member and run-time
arguments, and the choice of one for a problem.

Input: a :class:`~evtc.pipeline.Pipeline` (the epilogue's build path), an arch, and a pinned
configuration or none. Output: :class:`GemmFamily`, the :class:`KernelFamily` the dispatch
stage, the tuner and the routes (staging, the row-phase split, conv's 1x1 route) drive: they ask
it for members, kernels, launchers and choices, and never reach into a facade.
"""

from __future__ import annotations

import dataclasses

import json
from typing import Mapping, Protocol

from evtc.abi import abi_fields, ctypes_struct
from evtc.compiler import cache
from evtc.errors import ArgumentError, ConfigError
from evtc.family.spec import (ON_DEMAND, EpilogueTraits, KernelSpec, Problem, choose, default_family, for_epilogue,
                               on_demand)
from evtc.ir.graph import Graph
from evtc.ir.nodes import GroupScale, Reduction, is_gated
from evtc.pipeline import Kernel, Pipeline
from evtc.plan.config import (DECOMPOSITIONS, RASTER_ORDERS, GemmConfig, atomic_reduction, check_plan_options,
                              column_reduction_tile_ok, glu_config_ok, group_quant_config_ok)
from evtc.plan.config import validate as validate_config
from evtc.plan.target import Target
from evtc.runtime.bind import Binder
from evtc.runtime.launch import Launcher

__all__ = ["GemmFamily", "KernelFamily", "atomic_reductions", "check_decomposition", "kernel_key", "scheduler_args"]


class KernelFamily(Protocol):
    """What the dispatch stage, the tuner and the routes use of a family."""

    arch: str
    target: Target
    graph: Graph
    members: dict[str, KernelSpec]

    def kernel(self, spec: KernelSpec | str) -> Kernel: ...

    def primary_binder(self) -> Binder:
        """The primary kernel's argument checker (before it is built: the ABI from the graph)."""
        return self.binder(self.primary.spec, self.primary)

    def launcher(self, spec: KernelSpec) -> Launcher: ...

    def choose(self, M: int, N: int, K: int, L: int = 1, *, aligned_mn: bool = True, aligned_k: bool = True,
               sm_count: int | None = None, device: str | None = None) -> KernelSpec: ...


def kernel_key(spec: KernelSpec) -> str:
    """What identifies a build: specs with the same key share one kernel (they differ only in
    run-time fields)."""
    return json.dumps([spec.arch, spec.config.kernel_json(spec.arch)], sort_keys=True)


def atomic_reductions(graph: Graph, config: GemmConfig) -> list[Reduction]:
    """The reduction outputs a kernel of ``config`` reduces with atomics on sm90: the scalar
    ones, and row/column max/min into f32 where the config makes them atomic
    (:func:`evtc.plan.config.atomic_reduction`; the planner's :func:`evtc.plan.sm90.reduction_mode`)."""
    return [o for o in graph.outputs if isinstance(o, Reduction) and atomic_reduction(o, config)]


def scheduler_args(config: GemmConfig, arch: str, graph: Graph | None = None) -> dict[str, int]:
    """The sm90 tile scheduler's run-time arguments of ``config`` (fields of ``evtc_args_t``).

    NOTE [Scalar reductions and stream-K]: on the H100 (2026-11-23, tests/gpu/test_family_gpu.py)
    fp8_out's amax (CUTLASS's ``Sm90ScalarReduction``) came out 15 % too large for one batch of a
    777x1031x1024x2 problem under the stream-K decomposition, while D, row and column reductions
    were exact (through the workspace). Until the cause is found, a kernel with an atomic
    reduction (:func:`atomic_reductions`) never runs stream-K: an explicit
    ``decomposition="stream_k"`` is refused (:func:`check_decomposition`) and CUTLASS's
    ``"heuristic"`` becomes data-parallel (or split-K with splits > 1).
    """
    if arch != "sm90":
        return {}
    decomposition = config.decomposition
    if graph is not None and decomposition == "heuristic" and atomic_reductions(graph, config):
        decomposition = "split_k" if config.split_k > 1 else "data_parallel"
    return {"max_swizzle_size": 1 << config.swizzle, "raster_order": RASTER_ORDERS.index(config.raster),
            "splits": config.split_k, "decomposition_mode": DECOMPOSITIONS.index(decomposition),
            "reduction_mode": 0}


def check_decomposition(graph: Graph, config: GemmConfig) -> None:
    """Refuse the stream-K decomposition for a kernel with atomic reductions.

    Raises:
        ConfigError: ``config.decomposition == "stream_k"`` and ``graph`` has an output
            :func:`atomic_reductions` lists for ``config`` (NOTE [Scalar reductions and
            stream-K] in :func:`scheduler_args`).
    """
    if config.decomposition == "stream_k" and (atomic := atomic_reductions(graph, config)):
        names = ", ".join(o.name for o in atomic)
        scalar = all(o.dim is None for o in atomic)
        raise ConfigError(f"decomposition='stream_k' with {'a scalar' if scalar else 'an atomic'} reduction ({names}) "
                          "gave a wrong result on the H100, so evtc does not run it",
                          epilogue=graph.name,
                          hint="use decomposition='split_k' (with split_k=S) or 'data_parallel'"
                               + ("" if scalar else ", or atomic_reductions=False (reduce through the workspace)"))


class GemmFamily:
    """The kernels of one Gemm: a default family (or one pinned configuration), a
    :class:`~evtc.pipeline.Kernel` per distinct build, a :class:`~evtc.runtime.launch.Launcher`
    per member and run-time arguments.

    Args:
        pipeline: the epilogue's build path.
        arch: ``sm90`` or ``sm80``.
        target: the arch's :class:`~evtc.plan.target.Target`.
        config: a validated configuration to pin, or None for the default family.
        policy: the primary kernel's planner (:class:`evtc.Gemm`'s ``plan``: ``evtc`` or
            ``cutlass``).
        rank: the primary kernel's n-th best plan (:class:`evtc.Gemm`'s ``plan_rank``).
        fixed: the primary kernel's fixed planner decisions (:class:`evtc.Gemm`'s ``plan`` dict).
        atomic_sums: every sm90 member adds row and column sums with float atomics
            (``atomic_reductions=True`` on the members that leave it unset: NOTE [Atomic row and
            column sums]).
        batch_invariant: keep only members (and candidates) whose outputs' bits for a row don't
            depend on M, L, the member or the run (NOTE [Batch invariance] in
            :mod:`evtc.dispatch.invariance`).

    Attributes:
        members: name -> :class:`~evtc.family.spec.KernelSpec`; ``{"pinned": spec}`` for a pinned
            configuration.
        graph: the epilogue after passes for ``arch``. traits: its
            :class:`~evtc.family.spec.EpilogueTraits`.
        primary: the first member's kernel (planned at construction).

    Raises:
        ConfigError: a pinned stream-K decomposition with atomic reductions; with
            ``batch_invariant``, a sum reduction whose order is the run's (a scalar sum, atomic
            row or column sums) or a pinned configuration that splits K or swaps A and B.
        EvtcError: planning errors of the primary kernel.
    """

    def __init__(self, pipeline: Pipeline, arch: str, target: Target, config: GemmConfig | None, *,
                 policy: str = "evtc", rank: int = 0, fixed: Mapping | None = None,
                 batch_invariant: bool = False, atomic_sums: bool = False) -> None:
        self.pipeline = pipeline
        self.arch, self.target = arch, target
        self.a, self.b = pipeline.a, pipeline.b
        self.name = pipeline.name
        self.graph = pipeline.graph_for(arch)
        self.traits = EpilogueTraits.of(self.graph)  # what the choice of member depends on
        self.policy = policy
        check_plan_options(arch, policy, rank, fixed, epilogue=self.name)  # (before the construct memo answers)
        if config is not None:
            check_decomposition(pipeline.traced, config)
            self.members = {"pinned": KernelSpec("pinned", config, arch)}
        else:
            # without members whose tile the epilogue can't take (a column reduction: tile N of at
            # most 32 or a multiple of 64, so no pp128x176; evtc.quantize: a tile N that is a
            # multiple of the group, no swap-AB; evtc.glu: no swap-AB)
            self.members = {s.name: s for s in for_epilogue(default_family(arch, self.a, self.b), self.traits)
                            if s.arch != "sm90" or (column_reduction_tile_ok(self.graph, s.config)
                                                    and group_quant_config_ok(self.graph, s.config)
                                                    and glu_config_ok(self.graph, s.config))}
        if atomic_sums and arch == "sm90":  # NOTE [Atomic row and column sums]
            if batch_invariant:
                raise ConfigError("atomic_sums=True with batch_invariant=True: float atomics add the sums in the order "
                                  "the tiles finish", epilogue=self.name, hint="choose one of the two")
            if config is not None and config.atomic_reductions is False:
                raise ConfigError("atomic_sums=True with a pinned config of atomic_reductions=False: the config keeps "
                                  "the sums on the workspace, so atomic_sums would be ignored", epilogue=self.name,
                                  hint="choose one: leave the config's atomic_reductions unset, or drop atomic_sums")
            self.members = {n: dataclasses.replace(s, config=s.config.replace(atomic_reductions=True))
                            if s.config.atomic_reductions is None else s for n, s in self.members.items()}
        self._kernels: dict[str, Kernel] = {}
        #: the batch-invariant rule (:class:`~evtc.dispatch.invariance.Invariance`), or None
        self.invariance = None
        if batch_invariant:
            from evtc.dispatch.invariance import Invariance

            rule = Invariance.of(self.graph, arch)
            sums = [o.name for o in self.graph.outputs if isinstance(o, Reduction) and o.dim is not None
                    and o.op.value == "sum" and config is not None and atomic_reduction(o, config)]
            if sums:  # NOTE [Atomic row and column sums]
                raise ConfigError(f"batch_invariant=True with atomic_reductions=True: the sums {sums} would be added "
                                  "with float atomics, in the order the tiles finish", epilogue=self.name,
                                  hint="leave atomic_reductions unset (sums through the workspace, in a fixed order)")
            self.invariance, self.members = rule.members(self.members.values(), self._epilogue_tile)
        first = next(iter(self.members.values()))
        planned = self._kernels.get(kernel_key(first)) if not (rank or fixed) else None
        self.primary = self._kernels[kernel_key(first)] = planned or pipeline.kernel(first, policy, rank, fixed)
        if self.invariance is not None and self.invariance.row_keyed and \
                not self.invariance.admits(first, lambda s: self._plan_tile(self.primary)):
            raise ConfigError(f"batch_invariant=True: the plan options (plan_rank={rank}, plan={dict(fixed or {})}) give "
                              f"the primary kernel another epilogue tile than the family's other members, and the "
                              f"row reductions' bits depend on it", epilogue=self.name,
                              hint="leave plan_rank and the planner's epilogue tile alone, or pin a configuration")
        self.launchers: dict[tuple, Launcher] = {}
        self._tuned = None
        self._targets: dict[str | None, Target] = {None: target}

    def target_for(self, device: str | None) -> Target:
        """The arch's Target with the hardware facts of ``device`` (a GPU's name; None: the arch's
        reference part), :func:`evtc.plan.target.get_target`."""
        t = self._targets.get(device)
        if t is None:
            from evtc.plan.target import get_target

            t = self._targets[device] = get_target(self.arch, device)
        return t

    @property
    def pinned(self) -> bool:
        return "pinned" in self.members

    def _epilogue_tile(self, spec: KernelSpec) -> tuple | None:
        """The planned epilogue tile of a member (planning it; :mod:`evtc.dispatch.invariance`)."""
        return self._plan_tile(self.kernel(spec))

    @staticmethod
    def _plan_tile(kernel: Kernel) -> tuple | None:
        tile = kernel.plan.epilogue_tile
        return tuple(tile) if tile is not None else None

    def admits(self, spec: KernelSpec) -> bool:
        """Whether a candidate may run this family's problems (always, unless batch-invariant:
        :meth:`evtc.dispatch.invariance.Invariance.admits`)."""
        return self.invariance is None or self.invariance.admits(spec, self._epilogue_tile)

    def kernel(self, spec: KernelSpec | str) -> Kernel:
        """The (planned, maybe not built) kernel of a member, by spec or member name (an
        on-demand member by its name: :data:`~evtc.family.spec.ON_DEMAND`).

        Raises:
            ConfigError: a name that is no member's nor an on-demand kernel's, or ``spec``
                neither a KernelSpec nor a name.
        """
        if not isinstance(spec, KernelSpec):
            known = f"members: {', '.join(self.members)}; on demand: {', '.join(ON_DEMAND)}"
            if not isinstance(spec, str):
                raise ConfigError(f"kernel({spec!r:.60}): a KernelSpec or a member's name", epilogue=self.name,
                                  hint=known)
            try:
                spec = self.members[spec] if spec in self.members else on_demand(self.arch, self.a, self.b, spec)
            except KeyError:
                raise ConfigError(f"kernel('{spec}'): no member or on-demand kernel of this Gemm has that name",
                                  epilogue=self.name, hint=known) from None
        key = kernel_key(spec)
        k = self._kernels.get(key)
        if k is None:
            k = self._kernels[key] = self.pipeline.kernel(spec, self.policy)
        return k

    def kernels(self) -> list[Kernel]:
        """The kernels of the members, one per distinct build."""
        out: dict[str, Kernel] = {}
        for s in self.members.values():
            out.setdefault(kernel_key(s), self.kernel(s))
        return list(out.values())

    def build(self, kernels: list[Kernel], timeout: float | None = None, executor=None) -> None:
        """Compile (or fetch from the cache) and load ``kernels``, in parallel.

        Raises:
            BuildError: nvcc failed (the source and log are kept and named).
        """
        if len(kernels) == 1:
            kernels[0].build(timeout)
            return
        results = cache.build_many([k.job() for k in kernels], executor=executor, timeout=timeout)
        for k, r in zip(kernels, results):
            if isinstance(r, Exception):
                raise r
            k.load(r)

    def binder(self, spec: KernelSpec, kernel: Kernel, Args=None) -> Binder:
        """The argument checker of ``spec`` on ``kernel`` (``Args``: its library's struct; before
        it is built, the ABI from the graph)."""
        cfg = spec.config
        if Args is None:
            Args = kernel.library.Args if kernel.library is not None else ctypes_struct(abi_fields(self.graph, self.arch))
        unaligned = cfg.unaligned
        direct = frozenset() if unaligned or spec.arch != "sm90" else frozenset(
            b.name for b in kernel.plan.buffers if b.mode == "direct" and b.role in ("aux_load", "aux_store"))
        runtime = cfg.replace(swizzle=cfg.swizzle if cfg.swizzle is not None else kernel.config.swizzle)
        return Binder(self.pipeline.graph_for(spec.arch), self.a, self.b, Args, direct,
                      scheduler_args(runtime, spec.arch, self.graph),
                      arch=spec.arch, swap=cfg.swap_ab, mn_tma=spec.arch == "sm90" and not unaligned,
                      packed_stores=cfg.packed_stores)

    def primary_binder(self) -> Binder:
        """The primary kernel's argument checker (before it is built: the ABI from the graph)."""
        return self.binder(self.primary.spec, self.primary)

    def launcher(self, spec: KernelSpec) -> Launcher:
        """The launcher of a member with its run-time arguments (builds its kernel on first use).

        Raises:
            BuildError: nvcc failed.
        """
        key = (kernel_key(spec), json.dumps(spec.config.to_json(), sort_keys=True))
        launcher = self.launchers.get(key)
        if launcher is None:
            kernel = self.kernel(spec)
            if kernel.library is None:
                kernel.build()
            launcher = self.launchers[key] = Launcher(self.binder(spec, kernel, kernel.library.Args),
                                                      kernel.library, self.name)
        return launcher

    def choose(self, M: int, N: int, K: int, L: int = 1, *, aligned_mn: bool = True, aligned_k: bool = True,
               sm_count: int | None = None, device: str | None = None) -> KernelSpec:
        """The member (with its run-time arguments) a problem runs on: the tuner's stored choice
        for its shape bucket on ``device`` if there is one, else the heuristic's
        (:func:`evtc.family.spec.choose`)."""
        if self.pinned:
            return self.members["pinned"]
        p = Problem(M, N, K, L, aligned_mn, aligned_k, sm_count or self.target.sm_count)
        if aligned_mn and aligned_k and device is not None:
            tuned = self.tuned_choice(p, device)
            if tuned is not None and self.admits(tuned):
                return tuned
        if not (aligned_mn and aligned_k) and any(is_gated(o) for o in self.graph.outputs):
            raise ArgumentError(
                "evtc.glu's output is written by the TMA store of an aligned kernel: a D passed in out= needs rows "
                "of whole 16-byte vectors, and A and B rows 16-byte aligned (K a multiple of 8 for bf16); this "
                "call's are not", epilogue=self.name,
                hint="let evtc allocate D (it pads the rows), or pad K (and N / 2) to a multiple of 8")
        if not (aligned_mn and aligned_k) and any(isinstance(o, GroupScale) for o in self.graph.outputs):
            raise ArgumentError(
                "evtc.quantize's D is written by the TMA store of an aligned kernel: a D passed in out= needs "
                "rows of whole 16-byte vectors (N a multiple of 16 for fp8) and A and B rows 16-byte aligned; "
                "this call's are not (evtc's unaligned kernels store element by element and do not quantize)",
                epilogue=self.name, hint="let evtc allocate D (it pads the rows), or pad N to a multiple of 16")
        if self.arch == "sm90" and aligned_mn and aligned_k:
            ranked = self.ranked(p, device)
            if ranked:
                return ranked[0]
        if self.invariance is not None and self.arch == "sm90" and not (aligned_mn and aligned_k):
            # rows TMA can't address: one kernel whatever M (NOTE [Batch invariance])
            return on_demand(self.arch, self.a, self.b, "unaligned" if aligned_k else "unaligned_k")
        return choose(self.members, p, self.arch, self.a, self.b, self.traits)

    def ranked(self, p: Problem, device: str | None = None) -> list[KernelSpec]:
        """The candidates of an aligned sm90 problem (:func:`evtc.dispatch.space.candidates`:
        the members, their cluster-less variants, the stream-K members' run-time variants),
        fastest first by the selection model of ``device`` (NOTE [The selection model] in
        :mod:`evtc.dispatch.select`); empty where no table ships."""
        from evtc.dispatch import select, space

        table = select.load_table(device)
        if table is None:
            return []
        if min(p.M, p.N, p.K, p.L) < 1:  # an empty call launches nothing, K = 0 runs the epilogue
            # alone: any candidate will do, ranked as the smallest problem the model knows
            p = dataclasses.replace(p, M=max(p.M, 1), N=max(p.N, 1), K=max(p.K, 1), L=max(p.L, 1))
        cands = space.candidates(p, self.traits, self.graph, self.a, self.b,
                                 members=tuple(self.members.values()) + space.cluster_variants(
                                     tuple(self.members.values())))
        if self.invariance is not None:
            cands = [c for c in cands if self.admits(c)]
        return select.rank(p, self.epilogue_class, cands, table)

    @property
    def epilogue_class(self) -> str:
        """The ground truth's epilogue class this family is ranked as
        (:func:`evtc.dispatch.select.epilogue_class`)."""
        from evtc.dispatch.select import epilogue_class

        return epilogue_class(self.graph)

    def tuned_choice(self, p: Problem, device: str) -> KernelSpec | None:
        """The tuner's stored choice for ``p`` on ``device`` (:mod:`evtc.dispatch.tune`), or None."""
        from evtc.dispatch import tune

        if self._tuned is None:
            self._tuned = tune.TuneStore.for_family(self)
        rec = self._tuned.get(tune.shape_bucket(p.M, p.N, p.K, p.L), device)
        spec = tune.spec_of(rec) if rec is not None else None
        if spec is None or spec.arch != self.arch:
            return None
        try:  # a record of a damaged store, or of an evtc with other rules: the model decides
            validate_config(spec.config, self.arch, self.a, self.b)
        except ConfigError:
            return None
        return spec

    def forget_tuning(self) -> None:
        """Read the tuner's store again on the next choice."""
        self._tuned = None
