"""``evtc.Gemm``: the whole pipeline behind one object.

Input: an epilogue (``@evtc.epilogue`` function, a Graph, or a textual expression), operand and
output dtypes, an arch and optional configuration. Output: a callable GEMM.

``Gemm(...)`` traces, runs the passes and plans its primary kernel right away (so errors in the
epilogue surface at construction, located at the user's line); a kernel's source is emitted on
first use (``gemm.source``, a build or a cache lookup). What the passes, the planner and the
emitter computed is kept in the construct memo (:mod:`evtc.compiler.memo`), so constructing the
same Gemm in a later process skips them. A Gemm is a *kernel
family* (:mod:`evtc.family.spec`): each call picks a kernel by the problem (M, N, K, L,
alignment), from the tuner's stored choices if any, else by the heuristic; kernels a call needs
are built on demand, :meth:`Gemm.build` builds the whole default family at once, and nvcc builds
are cached on disk. A pinned :class:`~evtc.plan.config.GemmConfig` is a family of one.
"""

from __future__ import annotations

import json
import math
import sys
from typing import TYPE_CHECKING, Any, Mapping

from evtc import dtypes
from evtc.compiler import cache, memo
from evtc.dtypes import DType
from evtc.abi import abi_fields, ctypes_struct
from evtc.errors import ArgumentError, ConfigError, MisalignedError, api_boundary
from evtc.frontend.epilogue import Epilogue
from evtc.ir.graph import Graph
from evtc.plan import GemmConfig, default_config, get_target
from evtc.plan.config import DECOMPOSITIONS, RASTER_ORDERS, atomic_reduction, column_reduction_tile_ok
from evtc.plan.config import validate as validate_config
from evtc.plan import make_plan
from evtc.plan.model import Plan
from evtc.ir.printer import print_graph
from evtc.family.spec import EpilogueTraits, KernelSpec, Problem, choose, default_family, for_epilogue, on_demand
from evtc.ir.nodes import AuxLoad, Reduction, Source, Store
from evtc.runtime import tensors
from evtc.runtime.bind import ALIGN, Binder, batch_count, follows_packed_inputs
from evtc.runtime.launch import KernelLibrary, Launcher, probe_call
from evtc.runtime.tensors import contiguous_strides

if TYPE_CHECKING:  # imported by the calls that need it (_staging): not on an aligned cache hit's path
    from evtc.runtime import staging


def as_graph(epilogue: Epilogue | Graph | str, *, c: DType | None, d: DType) -> Graph:
    """The Graph of an epilogue given in any of the accepted forms."""
    if isinstance(epilogue, Graph):
        return epilogue
    if isinstance(epilogue, Epilogue):
        return epilogue.trace(c=c, d=d)
    if isinstance(epilogue, str):
        def parse() -> Graph:
            from evtc.frontend.text import from_expr

            return from_expr(epilogue, c=c, d=d)

        return memo.traced_text(epilogue, c=c, d=d, parse=parse)  # a hit needn't import lark
    if callable(epilogue):
        return Epilogue(epilogue).trace(c=c, d=d)
    raise TypeError(f"can't make an epilogue of {type(epilogue).__name__}")


def emit(graph: Graph, plan: Plan, *, name: str | None = None) -> str:
    """The CUDA source for ``graph`` and its ``plan`` (sm90 or sm80)."""
    if plan.arch == "sm90":
        from evtc.emit.sm90 import emit_sm90

        return emit_sm90(graph, plan, name=name)
    from evtc.emit.sm80 import emit_sm80

    return emit_sm80(graph, plan, name=name)


class Kernel:
    """One kernel of a Gemm's family: its configuration, plan and source, and its library once
    built. Specs that differ only in run-time fields (split-K, decomposition, tile order) share
    one Kernel.

    Attributes:
        spec: the family member it was made for.
        arch: the arch it is built for.
        graph: the epilogue it computes: the Gemm's, or its transpose under swap-AB.
        plan: its Plan (planned at construction, or read from the construct memo); ``config`` its
            validated configuration.
        source: the emitted ``.cu`` (emitted on first use, or read from the construct memo).
        library: the loaded :class:`KernelLibrary`, or None before :meth:`build`.
    """

    def __init__(self, gemm: "Gemm", spec: KernelSpec, policy: str = "evtc", rank: int = 0,
                 fixed: Mapping | None = None) -> None:
        self.spec = spec
        self.arch = spec.arch
        self.name = gemm.name
        base = gemm.graph_for(spec.arch)
        self._memo = gemm._memo
        # what the plan and source depend on besides the traced graph (the memo's key)
        self._material = {"arch": spec.arch, "a": gemm.a.name, "b": gemm.b.name, "config": spec.config.to_json(),
                          "policy": policy, "rank": rank, "fixed": dict(fixed or {})}
        hit = self._memo.plan(base, self._material) if self._memo is not None else None
        if hit is not None:
            self.graph, self.plan = hit
        else:
            graph = base
            if spec.config.swap_ab:
                from evtc.family.swap_ab import transpose

                graph = transpose(graph)
            self.graph = graph
            self.plan = make_plan(graph, spec.arch, a=gemm.a, b=gemm.b, config=spec.config, policy=policy,
                                  rank=rank, fixed=fixed or {})
            if self._memo is not None:
                self._memo.put_plan(base, self._material, self.graph, self.plan)
        self.config = self.plan.config
        self._source: str | None = None
        self.library: KernelLibrary | None = None
        self.artifact: cache.Artifact | None = None

    @property
    def source(self) -> str:
        """The emitted ``.cu`` (emitted on first use, or read from the construct memo)."""
        if self._source is None:
            src = self._memo.source(self._material) if self._memo is not None else None
            if src is None:
                src = emit(self.graph, self.plan)
                if self._memo is not None:
                    self._memo.put_source(self._material, src)
            self._source = src
        return self._source

    @property
    def job_name(self) -> str:
        return f"{self.name}[{self.spec.name}]"

    def job(self) -> cache.BuildJob:
        """The build job of this kernel (for :func:`evtc.compiler.build_many`)."""
        return cache.BuildJob(self.source, self.arch, self.job_name)

    def load(self, art: cache.Artifact) -> None:
        """Load ``art`` (this kernel's build) and check it is this kernel (ABI, IR, name)."""
        if self.library is not None and self.artifact is not None and self.artifact.key == art.key:
            return
        library = KernelLibrary(art.verified_library_path())
        library.verify(fields=abi_fields(self.graph, self.arch), ir=print_graph(self.graph), name=self.name,
                       arch=self.arch)
        self.library, self.artifact = library, art

    def build(self, timeout: float | None = None) -> cache.Artifact:
        """Compile (or fetch from the cache) and load."""
        art = cache.build(self.source, arch=self.arch, name=self.job_name, timeout=timeout)
        self.load(art)
        return art


_is_compiling = None  # torch.compiler.is_compiling, once torch is imported


def _torch_compiling() -> bool:
    """Whether torch.compile (Dynamo) is tracing this call (torch only if already imported)."""
    global _is_compiling
    if _is_compiling is None:
        torch = sys.modules.get("torch")
        compiler = getattr(torch, "compiler", None) if torch is not None else None
        if compiler is None or not hasattr(compiler, "is_compiling"):
            return False
        _is_compiling = compiler.is_compiling
    return bool(_is_compiling())


def _no_torch_op(gemm: "Gemm") -> str:
    """Why a call that torch.compile traces has no torch op (NOTE [The torch op is made outside
    torch.compile])."""
    if gemm._torch_op_error is not None:
        return str(gemm._torch_op_error)
    return (f"evtc: the Gemm '{gemm.name}' was made before torch was imported, so it has no torch op "
            "and torch.compile can't make one while it traces; call gemm.torch_op() once before "
            "compiling (or construct the Gemm after `import torch`)")


def atomic_reductions(graph: Graph, config: GemmConfig) -> list[Reduction]:
    """The reduction outputs a kernel of ``config`` reduces with atomics on sm90: the scalar
    ones, and row/column max/min into f32 where the config makes them atomic
    (:func:`evtc.plan.config.atomic_reduction`; the planner's :func:`evtc.plan.sm90.reduction_mode`)."""
    return [o for o in graph.outputs if isinstance(o, Reduction) and atomic_reduction(o, config)]


def _scheduler_args(config: GemmConfig, arch: str, graph: Graph | None = None) -> dict[str, int]:
    """The sm90 tile scheduler's run-time arguments of ``config`` (fields of ``evtc_args_t``).

    NOTE [Scalar reductions and stream-K]: on the H100 (2026-11-23, tests/gpu/test_family_gpu.py)
    fp8_out's amax (CUTLASS's ``Sm90ScalarReduction``) came out 15 % too large for one batch of a
    777x1031x1024x2 problem under the stream-K decomposition, while D, row and column reductions
    were exact (through the workspace), and under split-K and data-parallel the amax was exact.
    Until the cause is found, a kernel with an atomic reduction (a scalar one, or a row/column
    max/min made atomic, :func:`atomic_reductions`) never runs stream-K: an explicit
    ``decomposition="stream_k"`` is refused (:func:`check_decomposition`) and CUTLASS's
    ``"heuristic"`` (which may pick stream-K) becomes data-parallel (or split-K with splits > 1).
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
            :func:`atomic_reductions` lists for ``config``: a scalar reduction, or a row/column
            max/min with ``config.atomic_reductions=True`` (NOTE [Scalar reductions and
            stream-K] in :func:`_scheduler_args`).
    """
    if config.decomposition == "stream_k" and (atomic := atomic_reductions(graph, config)):
        names = ", ".join(o.name for o in atomic)
        scalar = all(o.dim is None for o in atomic)
        raise ConfigError(f"decomposition='stream_k' with {'a scalar' if scalar else 'an atomic'} reduction ({names}) "
                          "gave a wrong result on the H100, so evtc does not run it",
                          epilogue=graph.name,
                          hint="use decomposition='split_k' (with split_k=S) or 'data_parallel'"
                               + ("" if scalar else ", or atomic_reductions=False (reduce through the workspace)"))


def _staging():
    """:mod:`evtc.runtime.staging`, imported by the calls that need it (rows TMA can't address):
    not on an aligned cache hit's path."""
    from evtc.runtime import staging

    return staging


def _aligned_rows(v: tensors.TensorView, eb: int) -> bool:
    """TMA can read ``v``: 16-byte aligned base, row and batch strides."""
    if v.ptr % ALIGN:
        return False
    if len(v.shape) >= 2 and v.shape[-2] > 1 and (v.strides[-2] * eb) % ALIGN:
        return False
    return not (len(v.shape) == 3 and v.shape[0] > 1 and (v.strides[0] * eb) % ALIGN)


class Gemm:
    """A GEMM ``D = epilogue(A @ B.T, ...)`` for one arch and set of dtypes: a family of kernels,
    one picked per problem.

    Args:
        epilogue: an ``@evtc.epilogue`` function, a Graph, or a textual expression
            (``"D = relu(alpha*acc + beta*C + bias[n])"``).
        a: dtype of A (M x K, row-major), e.g. ``evtc.bf16``.
        b: dtype of B (N x K, row-major; default: ``a``).
        c: dtype of the source C (default: ``d``).
        d: dtype of M x N outputs that don't choose their own with ``.to()``.
        arch: ``"sm90"`` (Hopper, TMA warp-specialized) or ``"sm80"`` (Ampere, register-only).
        config: a :class:`~evtc.plan.config.GemmConfig` (tile, cluster, schedule, stages...):
            pins one kernel (a family of one). Default: the arch's family
            (:func:`evtc.family.spec.default_family`), whose first member is
            :func:`~evtc.plan.config.default_config`.
        plan: ``"evtc"`` (evtc's shared-memory planner) or ``"cutlass"`` (stock CUTLASS's
            additive rule, for comparison), or a dict of fixed planner decisions (for the
            primary kernel).
        plan_rank: take the n-th best plan of the cost model for the primary kernel.

    Attributes:
        graph: the Graph after passes. ``str(gemm.graph)`` is its IR text.
        family: the family's members, name -> :class:`~evtc.family.spec.KernelSpec`.
        plan, config, source, kernel_graph: those of the primary kernel (the family's first
            member, or the pinned one): ``print(gemm.plan)`` shows its buffer table.

    Raises:
        EvtcError: a subclass located at the epilogue's line: trace, type, legalization,
            configuration and planning errors.

    Example::

        gemm = evtc.Gemm(bias_relu, a=evtc.bf16, b=evtc.bf16, c=evtc.bf16, d=evtc.bf16)
        D = gemm(A, B, C=C, alpha=1.0, beta=0.5, bias=bias)
    """

    @api_boundary
    def __init__(self, epilogue: Epilogue | Graph | str, *, a: DType | str = dtypes.bf16, b: DType | str | None = None,
                 c: DType | str | None = None, d: DType | str | None = None, arch: str = "sm90",
                 config: GemmConfig | Mapping | None = None, plan: str | Mapping = "evtc", plan_rank: int = 0) -> None:
        self.a = dtypes.coerce(a)
        self.b = dtypes.coerce(b) if b is not None else self.a
        d_default = getattr(epilogue, "default_d", dtypes.bf16)
        self.d = dtypes.coerce(d) if d is not None else d_default
        self.c = dtypes.coerce(c) if c is not None else None
        self.arch = arch
        self.target = get_target(arch)
        for name, dt in (("a", self.a), ("b", self.b)):
            if dt not in dtypes.MAINLOOP_DTYPES[arch]:
                allowed = ", ".join(x.name for x in dtypes.MAINLOOP_DTYPES[arch])
                raise ConfigError(f"{name}={dt.name} is not a {arch} mainloop dtype ({allowed})",
                                  hint=(f"{arch}'s fp8 mainloop takes e4m3" if arch == "sm90" else "fp8 GEMMs need sm90") if dt.is_fp8 else None)
        if self.a.bits != self.b.bits:
            raise ConfigError(f"A is {self.a.name} and B is {self.b.name}: mixed-width mainloops are not supported")
        if isinstance(config, Mapping):
            config = GemmConfig.from_json(dict(config))
        pinned = config is not None
        config = validate_config(default_config(arch, self.a, self.b) if config is None else config,
                                 arch, self.a, self.b)
        self._traced = as_graph(epilogue, c=self.c, d=self.d)
        self.name = self._traced.name
        self._memo = memo.memo_for(self._traced)
        self._graphs: dict[str, Graph] = {}
        self.graph = self.graph_for(arch)
        fixed = dict(plan) if isinstance(plan, Mapping) else {}
        self._policy = fixed.pop("policy", "evtc") if isinstance(plan, Mapping) else plan
        self._traits = EpilogueTraits.of(self.graph)  # what the choice of member depends on
        if pinned:
            check_decomposition(self._traced, config)
            self.family = {"pinned": KernelSpec("pinned", config, arch)}
        else:
            # without members whose tile the epilogue can't take (a column reduction: tile N of at
            # most 32 or a multiple of 64, so no pp128x176)
            self.family = {s.name: s for s in for_epilogue(default_family(arch, self.a, self.b), self._traits)
                           if s.arch != "sm90" or column_reduction_tile_ok(self.graph, s.config)}
        primary_spec = next(iter(self.family.values()))
        self._kernels: dict[str, Kernel] = {}
        self._primary = self._kernels[self._kernel_key(primary_spec)] = Kernel(
            self, primary_spec, self._policy, plan_rank, fixed)
        self._launchers: dict[tuple, Launcher] = {}
        self._dispatch: dict[tuple, Launcher] = {}
        self._single: Launcher | None = None  # a pinned family's launcher, once built
        self._fast = None  # NOTE [The torch fast path] (evtc/runtime/torch_fast.py)
        self._fast_call = None  # its call(A, B, kwargs) -> outputs or None
        self._fast_off = False
        self._fast_refused: set = set()  # probe keys the fast path declined: not offered again
        self._prober = Binder(self.graph, self.a, self.b, ctypes_struct(abi_fields(self.graph, arch)), arch=arch)
        # NOTE [The row layout of the outputs evtc allocates]: the M x N inputs by name and
        # element bytes, the M x N outputs by name and dtype
        self._mn_loads = tuple((n.name, n.dtype.bytes) for n in self.graph.used_inputs
                               if isinstance(n, (Source, AuxLoad)))
        self._mn_stores = tuple((o.name, o.dtype) for o in self.graph.outputs if isinstance(o, Store))
        # rows of a multiple of this many elements are 16-byte multiples in every M x N input
        self._mn_row_quantum = max([ALIGN // math.gcd(ALIGN, eb) for _, eb in self._mn_loads] or [1])
        self._tuned = None
        self._torch_op = self._torch_op_error = None
        if "torch" in sys.modules:
            # NOTE [The torch op is made outside torch.compile]: Dynamo can't trace the making of
            # a torch.library op (a lock, the registration), so a call it traces must find the op
            # made already: made here when torch is imported (about 1.5 ms), else by torch_op().
            try:
                self.torch_op()
            except ArgumentError as e:  # a parameter name the schema can't hold: said when compiled
                self._torch_op_error = e

    # ---- the primary kernel (what a family of one is) ----------------------------------------------

    @property
    def plan(self) -> Plan:
        return self._primary.plan

    @property
    def config(self) -> GemmConfig:
        return self._primary.config

    @property
    def source(self) -> str:
        return self._primary.source

    @property
    def kernel_graph(self) -> Graph:
        return self._primary.graph

    @property
    def artifact(self) -> cache.Artifact | None:
        return self._primary.artifact

    @property
    def _direct(self) -> frozenset[str]:
        """The primary kernel's register-direct aux tensors (sm90's 16-byte vectors)."""
        if self.arch != "sm90" or self.config.unaligned:
            return frozenset()
        return frozenset(b.name for b in self.plan.buffers if b.mode == "direct" and b.role in ("aux_load", "aux_store"))

    @property
    def _binder(self) -> Binder:
        """The primary kernel's argument checker (before it is built: the ABI from the graph)."""
        k = self._primary
        Args = k.library.Args if k.library is not None else ctypes_struct(abi_fields(self.graph, self.arch))
        return Binder(self.graph, self.a, self.b, Args, self._direct, _scheduler_args(self.config, self.arch, self.graph),
                      arch=self.arch, swap=self.config.swap_ab, mn_tma=self.arch == "sm90" and not self.config.unaligned,
                      packed_stores=self.config.packed_stores)

    @property
    def _launcher(self) -> Launcher | None:
        """The launcher every call goes through, when one is fixed (a pinned family once built)."""
        return self._single

    @_launcher.setter
    def _launcher(self, launcher: Launcher | None) -> None:
        self._single = launcher

    def graph_for(self, arch: str) -> Graph:
        """The epilogue after passes, legalized for ``arch`` (an sm90 family's fallback for A and B
        rows TMA can't read is an sm80 kernel)."""
        g = self._graphs.get(arch)
        if g is None:
            g = self._memo.graph(arch) if self._memo is not None else None
            if g is None:
                from evtc import passes

                g = passes.run(self._traced, arch)
                if self._memo is not None:
                    self._memo.put_graph(arch, g)
            self._graphs[arch] = g
        return g

    # ---- the family -------------------------------------------------------------------------------

    @staticmethod
    def _kernel_key(spec: KernelSpec) -> str:
        return json.dumps([spec.arch, spec.config.kernel_json(spec.arch)], sort_keys=True)

    def kernel(self, spec: KernelSpec | str) -> Kernel:
        """The (planned, maybe not built) kernel of a family member, by spec or member name."""
        if isinstance(spec, str):
            spec = self.family[spec] if spec in self.family else on_demand(self.arch, self.a, self.b, spec)
        key = self._kernel_key(spec)
        k = self._kernels.get(key)
        if k is None:
            k = self._kernels[key] = Kernel(self, spec, self._policy)
        return k

    def kernels(self) -> list[Kernel]:
        """The kernels of the default family (planned and emitted, not built), one per distinct
        build (members that differ only in run-time fields share one)."""
        out: dict[str, Kernel] = {}
        for s in self.family.values():
            out.setdefault(self._kernel_key(s), self.kernel(s))
        return list(out.values())

    def jobs(self) -> list[cache.BuildJob]:
        """The build jobs of the default family (for :func:`evtc.compiler.build_many`, or to
        prebuild and carry kernels to a machine without nvcc)."""
        return [k.job() for k in self.kernels()]

    def choose(self, M: int, N: int, K: int, L: int = 1, *, aligned_mn: bool = True, aligned_k: bool = True,
               sm_count: int | None = None, device: str | None = None) -> KernelSpec:
        """The family member (with its run-time arguments) a problem runs on: the tuner's stored
        choice for its shape bucket on ``device`` if there is one, else the heuristic's
        (:func:`evtc.family.spec.choose`)."""
        if len(self.family) == 1 and "pinned" in self.family:
            return self.family["pinned"]
        p = Problem(M, N, K, L, aligned_mn, aligned_k, sm_count or self.target.sm_count)
        if aligned_mn and aligned_k and device is not None:
            tuned = self.tuned_choice(p, device)
            if tuned is not None:
                return tuned
        return choose(self.family, p, self.arch, self.a, self.b, self._traits)

    def tuned_choice(self, p: Problem, device: str) -> KernelSpec | None:
        """The tuner's stored choice for ``p`` on ``device`` (:mod:`evtc.family.tune`), or None."""
        from evtc.family import tune

        if self._tuned is None:
            self._tuned = tune.TuneStore.for_gemm(self)
        rec = self._tuned.get(tune.shape_bucket(p.M, p.N, p.K, p.L), device)
        if rec is None:
            return None
        try:
            base = self.family[rec["member"]]
        except KeyError:
            return None
        return base.with_runtime(**{k: rec["runtime"][k] for k in ("split_k", "decomposition") if k in rec["runtime"]})

    @api_boundary
    def tune(self, shapes, *, iters: int = 30, limit_s: float = 2.0, store: bool = True, verbose: bool = False):
        """Time the family's kernels on ``shapes`` ((M, N, K) or (M, N, K, L)) on the current GPU
        and store the fastest per shape bucket, for this and later processes (see
        :mod:`evtc.family.tune`).

        Returns:
            One dict per shape: the winner, every candidate's median ms, the heuristic's pick.

        Raises:
            NoDeviceError: no CUDA GPU.
        """
        from evtc.family.tune import tune

        return tune(self, shapes, iters=iters, limit_s=limit_s, store=store, verbose=verbose)

    # ---- building -------------------------------------------------------------------------------

    @api_boundary
    def build(self, timeout: float | None = None, *, executor=None, family: bool = True) -> cache.Artifact:
        """Compile (or fetch from the cache) and load the family's kernels, in parallel (with a
        progress bar when it takes over a second).

        Args:
            timeout: seconds before an nvcc is killed.
            executor: a :class:`concurrent.futures.Executor` to build on (see
                :func:`evtc.compiler.build_many`).
            family: build every default member (default), or only the primary kernel.

        Returns:
            The primary kernel's Artifact.

        Raises:
            BuildError: nvcc failed (the source and log are kept and named).
            NoDeviceError: no nvcc.
        """
        kernels = self.kernels() if family else [self._primary]
        if len(kernels) == 1:
            return kernels[0].build(timeout)
        results = cache.build_many([k.job() for k in kernels], executor=executor, timeout=timeout)
        for k, r in zip(kernels, results):
            if isinstance(r, Exception):
                raise r
            k.load(r)
        return self._primary.artifact  # type: ignore[return-value]

    @property
    def library(self) -> KernelLibrary:
        """The primary kernel's library (built on first use)."""
        if self._primary.library is None:
            self._primary.build()
        assert self._primary.library is not None
        return self._primary.library

    def info(self) -> dict:
        """The primary kernel's info (plan, ABI, ``sizeof`` of the epilogue storage, stages)."""
        return self.library.info

    # ---- running ----------------------------------------------------------------------------------

    def launcher(self, spec: KernelSpec) -> Launcher:
        """The launcher of a family member with its run-time arguments (builds its kernel on
        first use)."""
        key = (self._kernel_key(spec), json.dumps(spec.config.to_json(), sort_keys=True))
        launcher = self._launchers.get(key)
        if launcher is None:
            kernel = self.kernel(spec)
            if kernel.library is None:
                kernel.build()
            plan = kernel.plan
            unaligned = spec.config.unaligned
            direct = frozenset() if unaligned or spec.arch != "sm90" else frozenset(
                b.name for b in plan.buffers if b.mode == "direct" and b.role in ("aux_load", "aux_store"))
            binder = Binder(self.graph_for(spec.arch), self.a, self.b, kernel.library.Args, direct,
                            _scheduler_args(spec.config.replace(swizzle=spec.config.swizzle if spec.config.swizzle
                                                                 is not None else kernel.config.swizzle), spec.arch,
                                            self.graph),
                            arch=spec.arch, swap=spec.config.swap_ab, mn_tma=spec.arch == "sm90" and not unaligned,
                            packed_stores=spec.config.packed_stores)
            launcher = self._launchers[key] = Launcher(binder, kernel.library, self.name)
        return launcher

    def _problem_of(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any) -> dict:
        """M, N, K, L and the alignment of A, B and every M x N tensor the caller passes."""
        g = self.graph
        va, vb = tensors.view(A, "A", g.name), tensors.view(B, "B", g.name)
        if len(va.shape) not in (2, 3) or len(vb.shape) not in (2, 3):
            raise ArgumentError(f"A and B must be 2-D or 3-D, got A {tuple(va.shape)} and B {tuple(vb.shape)}",
                                epilogue=g.name)
        M, K = va.shape[-2:]
        N = vb.shape[-2]
        L = batch_count(va.shape, vb.shape)
        aligned_k = _aligned_rows(va, self.a.bytes) and _aligned_rows(vb, self.b.bytes)
        aligned_mn = True
        mxn = [(kwargs[n.name], n.dtype) for n in g.used_inputs
               if isinstance(n, (Source, AuxLoad)) and n.name in kwargs]
        given = out if isinstance(out, Mapping) else ({g.outputs[0].name: out} if out is not None else {})
        for x, dt in mxn:
            if not _aligned_rows(tensors.view(x, "tensor", g.name), dt.bytes):
                aligned_mn = False
        for o in g.outputs:
            x = given.get(o.name) if isinstance(o, Store) else None
            if x is None:
                continue
            # a caller's output must also end its rows on a 16-byte vector for the TMA store
            # (NOTE [Ragged N and TMA stores] in evtc.runtime.bind)
            if not _aligned_rows(tensors.view(x, "tensor", g.name), o.dtype.bytes) or N % (ALIGN // o.dtype.bytes):
                aligned_mn = False
        return dict(M=M, N=N, K=K, L=L, aligned_mn=aligned_mn, aligned_k=aligned_k, device=va.device)

    def _select(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any) -> Launcher:
        p = self._problem_of(A, B, kwargs, out)
        device = p.pop("device")
        spec = self.choose(**p, device=tensors.device_name(device) if device >= 0 else None)
        if (not p["aligned_mn"] and p["aligned_k"] and spec.config.unaligned and spec.arch == "sm90"
                and "pinned" not in self.family and _staging().mode(self.unaligned_staging) != "never"):
            # NOTE [Padded staging for unaligned rows]: an aligned member on padded copies, where
            # the cost model says so (decided per call by the StagedLauncher)
            return self._staged_launcher(spec)
        return self.launcher(spec)

    #: the padded staging route for M x N rows TMA can't address: ``auto`` (a cost model),
    #: ``always`` or ``never``; None: ``EVTC_UNALIGNED_STAGING``, else ``auto``
    #: (NOTE [Padded staging for unaligned rows] in :mod:`evtc.runtime.staging`). Changing it
    #: takes effect for new call signatures; call :meth:`set_unaligned_staging` to apply it to all.
    unaligned_staging: str | None = None

    def set_unaligned_staging(self, how: str | None) -> None:
        """Select the padded staging route (``auto``, ``always``, ``never``, or None for the
        environment's ``EVTC_UNALIGNED_STAGING``) for every later call."""
        if how is not None:
            _staging().mode(how)  # validate
        self.unaligned_staging = how
        self._forget_dispatch()

    def _staged_launcher(self, fallback: KernelSpec) -> staging.StagedLauncher:
        key = ("staged", self._kernel_key(fallback), json.dumps(fallback.config.to_json(), sort_keys=True))
        launcher = self._launchers.get(key)
        if launcher is None:
            checker = Binder(self.graph, self.a, self.b, ctypes_struct(abi_fields(self.graph, self.arch)),
                             arch=self.arch, mn_tma=False)
            launcher = self._launchers[key] = _staging().StagedLauncher(self, fallback, checker)
        return launcher  # type: ignore[return-value]

    @api_boundary
    def __call__(self, A: Any, B: Any, *, out: Any = None, stream: Any = None, **kwargs: Any):
        """Run ``D = epilogue(A @ B.T, **kwargs)`` on the caller's current stream.

        Args:
            A: (M, K) or (L, M, K) device tensor of dtype ``a``.
            B: (N, K) or (L, N, K) device tensor of dtype ``b``.
            out: preallocated output (a tensor for a single-output epilogue, else a dict).
            stream: a CUDA stream: a torch or cupy stream object (``torch.cuda.ExternalStream``
                for a raw handle you own), or 0/1/2 (the default, legacy and per-thread
                streams); default: the current stream of A's framework on A's device. The kernel
                runs on A's device whatever the current device is.
            **kwargs: the epilogue's parameters by name: tensors, and Python numbers for
                scalars.

        Returns:
            The output ``D`` when it is the only output; otherwise a dict name -> tensor in the
            order the epilogue returned them. Reductions are (L, M) / (L, N) / (L,) (without
            L for unbatched problems). M x N outputs evtc allocates (those not passed in ``out=``)
            have rows padded to 16 bytes: a strided (.., M, N) view whose row stride is N rounded
            up to a multiple of 16 bytes (N = 50257 bf16: 50264) and whose batch stride is M
            times that; ``.contiguous()`` gives packed rows (a copy). After M x N inputs that are
            all contiguous, one at least with rows that are not 16-byte multiples (a packed C of
            N = 50257 bf16), they are contiguous too (NOTE [The row layout of the outputs evtc
            allocates]).

        The kernel is the family member :meth:`choose` picks for the problem (cached per call
        signature); one the cache lacks is built first. Zero sizes behave like torch (empty
        outputs for M, N or L = 0, the epilogue of a zero accumulator for K = 0), outputs may be
        exactly an M x N input (in place, ``out=C``), and the call can be captured in a CUDA
        graph (``torch.cuda.graph``): see :mod:`evtc.runtime.bind` for every rule. M x N inputs
        or ``out=`` tensors whose rows TMA can't address (e.g. packed rows of N = 50257 bf16) run
        on aligned members over strided views of them where they can (the row-phase split,
        :mod:`evtc.runtime.phase_split`; ``EVTC_PHASE_SPLIT``), else on the unaligned kernel or,
        where a cost model says it is faster, on an aligned one over padded copies
        (:mod:`evtc.runtime.staging`; ``EVTC_UNALIGNED_STAGING``, :meth:`set_unaligned_staging`).

        Raises:
            ArgumentError: a missing, extra or malformed argument (named).
            LaunchError: CUDA reported an error.
        """
        if out is None and stream is None:
            if _torch_compiling():
                # inside torch.compile: the call is a custom op in the graph (evtc/torch_ops.py)
                op = self._torch_op
                if op is None:  # NOTE [The torch op is made outside torch.compile]
                    raise RuntimeError(_no_torch_op(self))
                return op(A, B, **kwargs)
            fast = self._fast_call
            if fast is not None:  # NOTE [The torch fast path] (as in run(), inlined)
                r = fast(A, B, kwargs)
                if r is not None:
                    return r
        return self._run_checked(A, B, kwargs, out, stream)

    def run(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any = None, stream: Any = None):
        """:meth:`__call__` with the epilogue's arguments as a dict, never through the torch op
        (what :class:`evtc.Conv`'s 1x1 route calls, with :class:`~evtc.runtime.tensors.TensorView`
        operands)."""
        fast = self._fast_call
        if fast is not None and out is None and stream is None:
            # torch tensors on a key the Python path below checked and prepared before
            r = fast(A, B, kwargs)
            if r is not None:
                return r
        return self._run_checked(A, B, kwargs, out, stream)

    def _run_checked(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any, stream: Any):
        """:meth:`run` on the Python launch path (after the torch fast path declined the call):
        checks, chooses, launches, and registers the call with the fast path."""
        if self._mn_loads and (out is None or isinstance(out, Mapping)):
            out = self._packed_outputs(A, B, kwargs, out)
        single = self._single
        if single is None and "pinned" in self.family:
            single = self._single = self.launcher(self.family["pinned"])
        if single is not None:
            launcher = single
            key, ptrs = single._probe(A, B, kwargs, out)
            result = single.run(key, ptrs, A, B, kwargs, out, stream)
        else:
            key, ptrs = probe_call(self._prober, A, B, kwargs, out)
            launcher = self._dispatch.get(key) if key is not None else None
            if launcher is None:
                try:
                    launcher = self._select(A, B, kwargs, out)
                except ArgumentError:
                    # a malformed call: the full checks of the primary kernel's binder say what is wrong
                    self._prober.signature(A, B, kwargs, out)
                    raise
                if key is not None:
                    self._dispatch[key] = launcher
            try:
                result = launcher.run(key, ptrs, A, B, kwargs, out, stream)
            except MisalignedError:
                # a base address TMA can't use, with strides it can: this call (only) goes to the member
                # chosen from its real alignment
                return self._select(A, B, kwargs, out)(A, B, kwargs, out, stream)
        if out is None and stream is None and key is not None and not self._fast_off:
            self._register_fast(launcher, key, A, B, kwargs)
        return result

    def _packed_outputs(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Mapping[str, Any] | None):
        """``out`` with the M x N outputs the caller did not pass allocated with packed rows, where
        NOTE [The row layout of the outputs evtc allocates] says so; else ``out`` unchanged.

        # NOTE [The row layout of the outputs evtc allocates]
        An M x N output evtc allocates has rows padded to 16 bytes (N = 50257 bf16: row stride
        50264), so that the TMA store and the next call's TMA loads address it; except where the
        call's M x N inputs (source C, aux loads) are all contiguous and their rows are not
        16-byte multiples (a packed vocabulary N = 50257 in bf16): then its outputs are
        contiguous too, like the result of a torch elementwise op on those inputs, and the call
        runs as if the caller had passed them with ``out=``. That is what lets such a call take
        the row-phase split (:mod:`evtc.runtime.phase_split`: every M x N tensor in one row
        layout, no copies; measured 1.03x the aligned neighbour at 4096 x 50257 x 4096 against
        1.13-1.22x on the staging route with padded outputs, H100, docs/performance.md).
        Shapes and strides alone decide it (:func:`evtc.runtime.bind.follows_packed_inputs`),
        so :mod:`evtc.torch_ops`'s fake implementation gives the same strides.
        """
        name = self.graph.name
        try:
            shape = getattr(B, "shape", None)  # torch, cupy: without a view (the common, aligned case)
            vb = tensors.view(B, "B", name) if shape is None else None
            shape = vb.shape if vb is not None else shape
            if len(shape) in (2, 3) and shape[-2] % self._mn_row_quantum == 0:
                return out  # rows of N elements are 16-byte multiples: padding changes nothing
            missing = [(n, dt) for n, dt in self._mn_stores if out is None or out.get(n) is None]
            if not missing:
                return out
            va, vb = tensors.view(A, "A", name), vb or tensors.view(B, "B", name)
            mn = []
            for n, eb in self._mn_loads:
                x = kwargs.get(n)
                if x is None:
                    return out
                v = tensors.view(x, n, name)
                mn.append((tuple(v.shape), tuple(v.strides), eb))
        except (ArgumentError, TypeError, ValueError, IndexError):
            return out  # a malformed call: the binder says what is wrong with it
        if len(va.shape) not in (2, 3) or len(vb.shape) not in (2, 3) or va.device < 0 or \
                not follows_packed_inputs(vb.shape[-2], mn):
            return out
        M, N = va.shape[-2], vb.shape[-2]
        batched = len(va.shape) == 3 or len(vb.shape) == 3
        shape = (batch_count(va.shape, vb.shape), M, N) if batched else (M, N)
        got = dict(out or {})
        for n, dt in missing:
            got[n], _ = tensors.strided_allocator(va.framework, va.device, shape, contiguous_strides(shape), dt)()
        return got

    def _forget_dispatch(self) -> None:
        """Drop every call signature's choice of kernel (and the torch fast path's copies of
        them): the next call of each signature chooses again (after tuning, or a new staging
        setting)."""
        self._dispatch.clear()
        self._fast_refused.clear()  # another launcher may take the key now
        if self._fast is not None:
            self._fast.clear()
        if "evtc.runtime.phase_split" in sys.modules:  # the row-phase split's members, chosen again
            sys.modules["evtc.runtime.phase_split"].forget(self)

    def _register_fast(self, launcher: Launcher, key: tuple, A: Any, B: Any, kwargs: Mapping[str, Any]) -> None:
        """Hand a call the Python path just checked and launched to the torch fast path (torch
        tensors only; builds the extension in the background on first use)."""
        torch = sys.modules.get("torch")
        if torch is None or type(A) not in (torch.Tensor, torch.nn.Parameter) or type(kwargs) is not dict:
            return
        fast = self._fast
        if fast is None:
            from evtc.runtime import torch_fast

            mod = torch_fast.module()
            if mod is None:
                if torch_fast.mode() == "0" or torch_fast.status().startswith("failed"):
                    self._fast_off = True
                return
            if type(launcher) is not Launcher:
                return
            try:
                fast = self._fast = torch_fast.FastPath(mod, self._prober, launcher.layout)
                self._fast_call = fast.bound
            except Exception:  # a layout the extension can't pack: the Python path serves every call
                self._fast_off = True
                return
        if type(launcher) is not Launcher:  # a staged call copies its inputs first: the Python path's
            return
        if key in self._fast_refused:  # declined before: its answer depends only on the key's signature
            return
        sig = launcher._signatures.get(key)
        if sig is not None and not fast.add(launcher, sig, A, B, kwargs, launcher.launch_address):
            if len(self._fast_refused) >= 4096:
                self._fast_refused.clear()
            self._fast_refused.add(key)

    def torch_op(self):
        """This Gemm as a PyTorch custom op (:class:`evtc.torch_ops.TorchOp`): the same call
        without ``out=``/``stream=``, traceable by ``torch.compile(fullgraph=True)`` and
        ``torch.export`` (a fake implementation gives the outputs' shapes), usable in CUDA graphs.
        Calls inside a compiled function use it by themselves.

        Raises:
            ArgumentError: a parameter name the op schema can't hold.
            ImportError: torch is not installed.
        """
        from evtc.torch_ops import torch_op

        return torch_op(self)

    def __repr__(self) -> str:
        members = ", ".join(self.family)
        return (f"<evtc.Gemm {self.name} {self.arch} a={self.a} b={self.b} family=[{members}] "
                f"tile={self.config.name} plan={self.plan.policy}>")

    def describe(self) -> str:
        """The IR, the primary plan and the family, as text."""
        fam = "\n".join(f"  {n}: {s.config.schedule_name} ({s.arch})" for n, s in self.family.items())
        return f"{self.graph}\n{self.plan}\nconfig: {json.dumps(self.config.to_json())}\nfamily:\n{fam}\n"
