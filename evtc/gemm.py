"""``evtc.Gemm``: the facade over the build path and the call path of one GEMM epilogue.

Input: an epilogue (``@evtc.epilogue`` function, a Graph, or a textual expression), operand and
output dtypes, an arch and optional configuration. Output: a callable GEMM.

Construction wires the build path (:class:`evtc.pipeline.Pipeline`: trace, passes, and the primary
kernel's plan, so errors in the epilogue surface at construction, located at the user's line) to
a kernel family (:class:`evtc.dispatch.family.GemmFamily`); a call asks the dispatch stage
(:class:`evtc.dispatch.dispatcher.Dispatcher`), which picks a member per problem (the tuner's
stored choice, else the heuristic), builds it on demand and launches it. A pinned
:class:`~evtc.plan.config.GemmConfig` is a family of one.
"""

from __future__ import annotations

import json
import sys
from typing import Any, Mapping

from evtc import dtypes
from evtc.compiler import cache
from evtc.dispatch.dispatcher import Dispatcher
from evtc.dispatch.family import GemmFamily, KernelSpec
from evtc.dtypes import DType
from evtc.errors import ArgumentError, ConfigError, api_boundary
from evtc.frontend.epilogue import Epilogue
from evtc.ir.graph import Graph
from evtc.pipeline import Kernel, Pipeline
from evtc.plan import GemmConfig, default_config, get_target
from evtc.plan.config import validate as validate_config
from evtc.plan.model import Plan
from evtc.runtime.launch import KernelLibrary, Launcher
from evtc.torch.fast import FastPathHook

__all__ = ["Gemm"]

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


def _check_dtypes(arch: str, a: DType, b: DType) -> None:
    for name, dt in (("a", a), ("b", b)):
        if dt not in dtypes.MAINLOOP_DTYPES[arch]:
            allowed = ", ".join(x.name for x in dtypes.MAINLOOP_DTYPES[arch])
            raise ConfigError(f"{name}={dt.name} is not a {arch} mainloop dtype ({allowed})",
                              hint=(f"{arch}'s fp8 mainloop takes e4m3" if arch == "sm90" else "fp8 GEMMs need sm90")
                              if dt.is_fp8 else None)
    if a.bits != b.bits:
        raise ConfigError(f"A is {a.name} and B is {b.name}: mixed-width mainloops are not supported")


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
        autotune: on the first call of each new shape bucket (M, N, K rounded up to powers of
            two), time the selection model's 4 best-ranked candidates on the GPU (building those
            not built) and keep the fastest for this and later processes (:mod:`evtc.dispatch.tune`);
            never while a CUDA graph is captured or torch.compile traces. None:
            ``EVTC_AUTOTUNE`` (default off: the model's choice).

    Attributes:
        graph: the Graph after passes. ``str(gemm.graph)`` is its IR text.
        family: the family's members, name -> :class:`~evtc.family.spec.KernelSpec`.
        dispatch: the call path (:class:`~evtc.dispatch.dispatcher.Dispatcher`; its ``family``
            is the :class:`~evtc.dispatch.family.GemmFamily` of kernels and launchers).
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
                 config: GemmConfig | Mapping | None = None, plan: str | Mapping = "evtc", plan_rank: int = 0,
                 autotune: bool | None = None) -> None:
        self.a = dtypes.coerce(a)
        self.b = dtypes.coerce(b) if b is not None else self.a
        self.d = dtypes.coerce(d) if d is not None else getattr(epilogue, "default_d", dtypes.bf16)
        self.c = dtypes.coerce(c) if c is not None else None
        self.arch = arch
        self.target = get_target(arch)
        _check_dtypes(arch, self.a, self.b)
        if isinstance(config, Mapping):
            config = GemmConfig.from_json(dict(config))
        pinned = config is not None
        config = validate_config(default_config(arch, self.a, self.b) if config is None else config,
                                 arch, self.a, self.b)
        self.pipeline = Pipeline(epilogue, a=self.a, b=self.b, c=self.c, d=self.d)
        self.name = self.pipeline.name
        fixed = dict(plan) if isinstance(plan, Mapping) else {}
        policy = fixed.pop("policy", "evtc") if isinstance(plan, Mapping) else plan
        kernels = GemmFamily(self.pipeline, arch, self.target, config if pinned else None,
                             policy=policy, rank=plan_rank, fixed=fixed)
        self.graph = kernels.graph
        self.family = kernels.members
        self.dispatch = Dispatcher(kernels, c=self.c, d=self.d, fast_path=FastPathHook)
        from evtc import knobs

        self.dispatch.autotune = knobs.autotune.get() if autotune is None else bool(autotune)
        self._fast = self.dispatch.fast
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
    def _primary(self) -> Kernel:
        return self.dispatch.family.primary

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
    def library(self) -> KernelLibrary:
        """The primary kernel's library (built on first use)."""
        if self._primary.library is None:
            self._primary.build()
        return self._primary.library

    def info(self) -> dict:
        """The primary kernel's info (plan, ABI, ``sizeof`` of the epilogue storage, stages)."""
        return self.library.info

    def graph_for(self, arch: str) -> Graph:
        """The epilogue after passes, legalized for ``arch``."""
        return self.pipeline.graph_for(arch)

    # ---- the family ---------------------------------------------------------------------------------

    def kernel(self, spec: KernelSpec | str) -> Kernel:
        """The (planned, maybe not built) kernel of a family member, by spec or member name."""
        return self.dispatch.family.kernel(spec)

    def kernels(self) -> list[Kernel]:
        """The kernels of the default family (planned and emitted, not built), one per distinct
        build (members that differ only in run-time fields share one)."""
        return self.dispatch.family.kernels()

    def jobs(self) -> list[cache.BuildJob]:
        """The build jobs of the default family (for :func:`evtc.compiler.build_many`, or to
        prebuild and carry kernels to a machine without nvcc)."""
        return [k.job() for k in self.kernels()]

    def choose(self, M: int, N: int, K: int, L: int = 1, *, aligned_mn: bool = True, aligned_k: bool = True,
               sm_count: int | None = None, device: str | None = None) -> KernelSpec:
        """The family member (with its run-time arguments) a problem runs on: the tuner's stored
        choice for its shape bucket on ``device`` if there is one, else the heuristic's
        (:func:`evtc.family.spec.choose`)."""
        return self.dispatch.family.choose(M, N, K, L, aligned_mn=aligned_mn, aligned_k=aligned_k,
                                           sm_count=sm_count, device=device)

    def launcher(self, spec: KernelSpec) -> Launcher:
        """The launcher of a family member with its run-time arguments (builds its kernel on
        first use)."""
        return self.dispatch.family.launcher(spec)

    @api_boundary
    def tune(self, shapes, *, iters: int = 30, limit_s: float = 2.0, store: bool = True, verbose: bool = False):
        """Time the family's kernels on ``shapes`` ((M, N, K) or (M, N, K, L)) on the current GPU
        and store the fastest per shape bucket, for this and later processes (see
        :mod:`evtc.dispatch.tune`).

        Returns:
            One dict per shape: the winner, every candidate's median ms, the heuristic's pick.

        Raises:
            NoDeviceError: no CUDA GPU.
        """
        from evtc.dispatch.tune import tune

        return tune(self.dispatch, shapes, iters=iters, limit_s=limit_s, store=store, verbose=verbose)

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
        self.dispatch.family.build(self.kernels() if family else [self._primary], timeout, executor)
        return self._primary.artifact  # type: ignore[return-value]

    # ---- running ----------------------------------------------------------------------------------

    #: the padded staging route for M x N rows TMA can't address: ``auto`` (a cost model),
    #: ``always`` or ``never``; None: ``EVTC_UNALIGNED_STAGING``, else ``auto``
    #: (NOTE [Padded staging for unaligned rows] in :mod:`evtc.dispatch.staging`).
    @property
    def unaligned_staging(self) -> str | None:
        return self.dispatch.unaligned_staging

    def set_unaligned_staging(self, how: str | None) -> None:
        """Select the padded staging route (``auto``, ``always``, ``never``, or None for the
        environment's ``EVTC_UNALIGNED_STAGING``) for every later call."""
        self.dispatch.set_unaligned_staging(how)

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
            allocates] in :mod:`evtc.dispatch.dispatcher`).

        The kernel is the family member :meth:`choose` picks for the problem (cached per call
        signature); one the cache lacks is built first, after every argument is checked. Zero
        sizes behave like torch (empty outputs for M, N or L = 0, the epilogue of a zero
        accumulator for K = 0), outputs may be exactly an M x N input (in place, ``out=C``), and
        the call can be captured in a CUDA graph (``torch.cuda.graph``): see
        :mod:`evtc.runtime.bind` for every rule. M x N inputs or ``out=`` tensors whose rows TMA
        can't address (e.g. packed rows of N = 50257 bf16) run on aligned members over strided
        views of them where they can (the row-phase split, :mod:`evtc.dispatch.phase_split`;
        ``EVTC_PHASE_SPLIT``), else on the unaligned kernel or, where a cost model says it is
        faster, on an aligned one over padded copies (:mod:`evtc.dispatch.staging`;
        ``EVTC_UNALIGNED_STAGING``, :meth:`set_unaligned_staging`).

        Raises:
            ArgumentError: a missing, extra or malformed argument (named).
            LaunchError: CUDA reported an error.
        """
        if out is None and stream is None:
            if _torch_compiling():
                # inside torch.compile: the call is a custom op in the graph (evtc/torch/ops.py)
                op = self._torch_op
                if op is None:  # NOTE [The torch op is made outside torch.compile]
                    raise RuntimeError(self._no_torch_op())
                return op(A, B, **kwargs)
            fast = self._fast.call  # NOTE [The torch fast path] (Dispatcher.run, inlined)
            if fast is not None:
                r = fast(A, B, kwargs)
                if r is not None:
                    return r
        return self.dispatch.run_checked(A, B, kwargs, out, stream)

    def run(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any = None, stream: Any = None):
        """:meth:`__call__` with the epilogue's arguments as a dict, never through the torch op
        (with :class:`~evtc.runtime.tensors.TensorView` operands too)."""
        return self.dispatch.run(A, B, kwargs, out, stream)

    def _no_torch_op(self) -> str:
        """Why a call that torch.compile traces has no torch op (NOTE [The torch op is made
        outside torch.compile])."""
        if self._torch_op_error is not None:
            return str(self._torch_op_error)
        return (f"evtc: the Gemm '{self.name}' was made before torch was imported, so it has no torch op "
                "and torch.compile can't make one while it traces; call gemm.torch_op() once before "
                "compiling (or construct the Gemm after `import torch`)")

    def torch_op(self):
        """This Gemm as a PyTorch custom op (:class:`evtc.torch.ops.TorchOp`): the same call
        without ``out=``/``stream=``, traceable by ``torch.compile(fullgraph=True)`` and
        ``torch.export`` (a fake implementation gives the outputs' shapes), usable in CUDA graphs.
        Calls inside a compiled function use it by themselves.

        Raises:
            ArgumentError: a parameter name the op schema can't hold.
            ImportError: torch is not installed.
        """
        from evtc.torch.ops import torch_op

        return torch_op(self)

    def __repr__(self) -> str:
        members = ", ".join(self.family)
        return (f"<evtc.Gemm {self.name} {self.arch} a={self.a} b={self.b} family=[{members}] "
                f"tile={self.config.name} plan={self.plan.policy}>")

    def describe(self) -> str:
        """The IR, the primary plan and the family, as text."""
        fam = "\n".join(f"  {n}: {s.config.schedule_name} ({s.arch})" for n, s in self.family.items())
        return f"{self.graph}\n{self.plan}\nconfig: {json.dumps(self.config.to_json())}\nfamily:\n{fam}\n"
