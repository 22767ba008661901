"""``evtc.Gemm``: the facade over the build path and the call path of one GEMM epilogue.

Input: an epilogue, operand and output dtypes, an arch, optional configuration. Output: a callable
GEMM. Construction wires the build path (:class:`evtc.pipeline.Pipeline`: trace, passes, the
primary kernel's plan: epilogue errors surface here, at the user's line) to a kernel family
(:class:`evtc.dispatch.family.GemmFamily`); a call asks the dispatch stage
(:class:`evtc.dispatch.dispatcher.Dispatcher`). A pinned configuration is a family of one.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Mapping

import numpy as np

from evtc import dtypes, knobs
from evtc.compiler import cache
from evtc.dispatch.dispatcher import Dispatcher
from evtc.dispatch.family import GemmFamily, KernelSpec
from evtc.dtypes import DType
from evtc.errors import ArgumentError, ConfigError, api_boundary
from evtc.frontend.epilogue import Epilogue
from evtc.ir.graph import Graph
from evtc.ir.nodes import is_gated
from evtc.pipeline import Kernel, Pipeline
from evtc.plan import GemmConfig, default_config, get_target
from evtc.plan.config import check_mainloop_dtypes
from evtc.plan.config import validate as validate_config
from evtc.runtime.launch import KernelLibrary, Launcher
from evtc.runtime.signature import INT32_MAX
from evtc.torch.fast import FastPathHook, torch_compiling

__all__ = ["Gemm"]

class Gemm:
    """A GEMM ``D = epilogue(A @ B.T, ...)`` for one arch and set of dtypes: a family of kernels,
    one picked per problem.

    Args:
        epilogue: an ``@evtc.epilogue`` function, a Graph, or a textual expression
            (``"D = relu(alpha*acc + beta*C + bias[n])"``).
        a: dtype of A (M x K, row-major), e.g. ``evtc.bf16``.
        b: dtype of B (N x K, row-major; default: ``a``).
        c: dtype of the source C (default: ``d``); unused by an epilogue that reads no C, so that
            code making many epilogues may pass all four dtypes (a ``C=`` tensor given to such
            an epilogue's call is refused).
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
        batch_invariant: run only members whose outputs' bits for a row don't depend on how many
            rows (M) or batches (L) the call has, on the member chosen or on the run: one K order
            (no split-K, stream-K or swap-AB), with a row reduction one tile N and epilogue tile,
            no atomic sums (NOTE [Batch invariance] in :mod:`evtc.dispatch.invariance`). None:
            ``EVTC_BATCH_INVARIANT`` (default off).
        atomic_sums: add row and column sums into f32 across tiles with float atomics on every
            member (``GemmConfig.atomic_reductions = True``; NOTE [Atomic row and column sums]
            in evtc/plan/config.py): no workspace pass, but the sums' last bits depend on the
            order the tiles finish. Default off (sums through the workspace, in a fixed order);
            refused with ``batch_invariant``.

    Attributes:
        graph: the Graph after passes. ``str(gemm.graph)`` is its IR text.
        family: the family's members, name -> :class:`~evtc.family.spec.KernelSpec`.
        dispatch: the call path (:class:`~evtc.dispatch.dispatcher.Dispatcher`; its ``family``
            is the :class:`~evtc.dispatch.family.GemmFamily` of kernels and launchers).
        plan, config, source, kernel_graph: those of the primary kernel (the family's first
            member, or the pinned one): ``print(gemm.plan)`` shows its buffer table.

    Raises:
        EvtcError: a subclass located at the epilogue's line: trace, type, legalization,
            configuration and planning errors; with ``batch_invariant``, a sum reduction
            that atomics add (a scalar sum; any sum on sm80), a pinned configuration that
            splits K or swaps A and B, or plan options that change a row reduction's epilogue
            tile (:class:`~evtc.errors.ConfigError`); a configuration of the grouped kernel
            (``grouped=True``: :class:`evtc.GroupedGemm`'s, a ConfigError).

    Example::

        gemm = evtc.Gemm(bias_relu, a=evtc.bf16, b=evtc.bf16, c=evtc.bf16, d=evtc.bf16)
        D = gemm(A, B, C=C, alpha=1.0, beta=0.5, bias=bias)
    """

    @api_boundary
    def __init__(self, epilogue: Epilogue | Graph | str, *, a: DType | str = dtypes.bf16, b: DType | str | None = None,
                 c: DType | str | None = None, d: DType | str | None = None, arch: str = "sm90",
                 config: GemmConfig | Mapping | None = None, plan: str | Mapping = "evtc", plan_rank: int = 0,
                 autotune: bool | None = None, batch_invariant: bool | None = None,
                 atomic_sums: bool = False) -> None:
        self.a = dtypes.coerce(a, "a")
        self.b = dtypes.coerce(b, "b") if b is not None else self.a
        self.d = dtypes.coerce(d, "d") if d is not None else getattr(epilogue, "default_d", dtypes.bf16)
        self.c = dtypes.coerce(c, "c") if c is not None else None
        self.arch = arch
        self.target = get_target(arch)
        check_mainloop_dtypes(arch, self.a, self.b)
        if isinstance(config, Mapping):
            config = GemmConfig.from_json(dict(config))
        pinned = config is not None
        config = validate_config(default_config(arch, self.a, self.b) if config is None else config,
                                 arch, self.a, self.b)
        if pinned and config.grouped:
            # (the pointer-array kernel behind the plain binder and launcher would misread every call)
            raise ConfigError("config grouped=True is the grouped (pointer-array) kernel of evtc.GroupedGemm, not "
                              "evtc.Gemm's", hint="run it with evtc.GroupedGemm(epilogue, config=...), or leave "
                              "grouped False")
        self.pipeline = Pipeline(epilogue, a=self.a, b=self.b, c=self.c, d=self.d)
        self.name = self.pipeline.name
        fixed = dict(plan) if isinstance(plan, Mapping) else {}
        policy = fixed.pop("policy", "evtc") if isinstance(plan, Mapping) else plan
        _check_flag("autotune", autotune, self.name)
        _check_flag("batch_invariant", batch_invariant, self.name)
        _check_flag("atomic_sums", atomic_sums, self.name)
        invariant = knobs.batch_invariant.get() if batch_invariant is None else bool(batch_invariant)
        kernels = GemmFamily(self.pipeline, arch, self.target, config if pinned else None,
                             policy=policy, rank=plan_rank, fixed=fixed, batch_invariant=invariant,
                             atomic_sums=bool(atomic_sums))
        self.graph = kernels.graph
        self.family = kernels.members
        self.dispatch = Dispatcher(kernels, c=self.c, d=self.d, fast_path=FastPathHook)
        self.dispatch.autotune = knobs.autotune.get() if autotune is None else bool(autotune)
        self._fast = self.dispatch.fast
        self._torch_op = self._torch_op_error = None
        if "torch" in sys.modules:  # NOTE [The torch op is made outside torch.compile]
            from evtc.torch.ops import attach

            attach(self)

    # ---- the primary kernel (what a family of one is) ----------------------------------------------

    _primary = property(lambda self: self.dispatch.family.primary, doc="the primary kernel (a Kernel)")
    plan = property(lambda self: self._primary.plan, doc="the primary kernel's Plan")
    config = property(lambda self: self._primary.config, doc="the primary kernel's GemmConfig")
    source = property(lambda self: self._primary.source, doc="the primary kernel's .cu text")
    kernel_graph = property(lambda self: self._primary.graph, doc="the primary kernel's Graph (swap-AB: transposed)")
    artifact = property(lambda self: self._primary.artifact, doc="the primary kernel's cache Artifact, once built")

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
        """The (planned, maybe not built) kernel of a family member, by spec or member name
        (:meth:`evtc.dispatch.family.GemmFamily.kernel`: its raises).
        """
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
        (:mod:`evtc.dispatch.select`).

        Raises:
            ArgumentError: M, N, K or L not an integer from 1 to INT32_MAX; an odd N for an
                epilogue with ``evtc.glu``; ``aligned_mn``/``aligned_k`` not bools, ``sm_count``
                not an integer >= 1, ``device`` not a device name (str) or None.
        """
        self._gated_n(_tune_shapes([(M, N, K, L)], self.name))
        for flag, v in (("aligned_mn", aligned_mn), ("aligned_k", aligned_k)):
            if not isinstance(v, (bool, np.bool_)):
                raise ArgumentError(f"{flag}={v!r}: True or False", epilogue=self.name)
        if sm_count is not None and (isinstance(sm_count, (bool, np.bool_)) or
                                     not isinstance(sm_count, (int, np.integer)) or sm_count < 1):
            raise ArgumentError(f"sm_count={sm_count!r}: the number of SMs, an integer >= 1 (None: the arch's)",
                                epilogue=self.name)
        if device is not None and not isinstance(device, str):
            raise ArgumentError(f"device={device!r}: a device name such as 'NVIDIA H100 80GB HBM3' (the tuner's "
                                "key), or None", epilogue=self.name, hint="torch.cuda.get_device_name(i)")
        return self.dispatch.family.choose(M, N, K, L, aligned_mn=aligned_mn, aligned_k=aligned_k,
                                           sm_count=sm_count, device=device)

    def _gated_n(self, shapes: list[tuple[int, ...]]) -> list[tuple[int, ...]]:
        """``shapes``, checked for evtc.glu: its GEMM pairs B's N rows (gate and up interleaved),
        so N is even (the binder's rule, checked here before a member is chosen or built)."""
        if any(is_gated(o) for o in self.graph.outputs):
            for shape in shapes:
                if shape[1] % 2:
                    raise ArgumentError(f"shape {shape}: N = {shape[1]}, the columns of B that evtc.glu pairs (gate "
                                        "and up interleaved), must be even", epilogue=self.name,
                                        hint="build B with evtc.interleave_gate_up(W_gate, W_up)")
        return shapes

    def launcher(self, spec: KernelSpec) -> Launcher:
        """The launcher of a family member with its run-time arguments (builds its kernel on
        first use)."""
        return self.dispatch.family.launcher(spec)

    @api_boundary
    def tune(self, shapes, *, iters: int = 30, limit_s: float = 2.0, store: bool = True, verbose: bool = False,
             top: int | None = 4):
        """Time the selection model's first ``top`` candidates (None: all) of each of ``shapes``
        ((M, N, K) or (M, N, K, L)) on the current GPU and keep the fastest per shape bucket for
        this and later processes (:func:`evtc.dispatch.tune.tune`: its returns and raises).

        Raises:
            ArgumentError: a shape that is not 3 or 4 integers from 1 to 2^31 - 1 (N even for
                an epilogue with evtc.glu), no shape, ``iters`` or ``top`` not a positive
                integer, ``limit_s`` not a positive finite number, ``store`` or ``verbose`` not a
                bool (checked before the GPU is looked for).
        """
        from evtc.dispatch.tune import tune

        shapes = self._gated_n(_tune_shapes(shapes, self.name))
        _check_tune_options(self.name, iters=iters, limit_s=limit_s, store=store, verbose=verbose, top=top)
        return tune(self.dispatch, shapes, iters=iters, limit_s=limit_s, store=store, verbose=verbose, top=top)

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
        environment's ``EVTC_UNALIGNED_STAGING``) for every later call.

        Raises:
            ArgumentError: another value.
        """
        if how is not None and not isinstance(how, str):
            raise ArgumentError(f"set_unaligned_staging({how!r:.60}): 'auto', 'always', 'never' or None",
                                epilogue=self.name, hint="None takes EVTC_UNALIGNED_STAGING (default auto)")
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
            order the epilogue returned them. Reductions are (L, M) / (L, N) / (L,) (without L for
            unbatched problems). M x N outputs evtc allocates have rows padded to 16 bytes (a
            strided view; ``.contiguous()`` packs them), or are contiguous after contiguous M x N
            inputs whose rows are not 16-byte multiples (NOTE [The row layout of the outputs evtc
            allocates] in :mod:`evtc.dispatch.dispatcher`).

        The kernel is the one the dispatch stage routes the call's signature to (:meth:`choose`'s
        member, built on demand after every argument is checked; rows TMA can't address take
        the row-phase split, padded staging or the unaligned kernel). Zero sizes behave like
        torch, outputs may be an M x N input (in place, ``out=C``), and calls can be captured in
        a CUDA graph: docs/runtime.md has every rule.

        Raises:
            ArgumentError: a missing, extra or malformed argument (named).
            LaunchError: CUDA reported an error.
        """
        if out is None and stream is None:
            if torch_compiling():
                # inside torch.compile: the call is a custom op in the graph (evtc/torch/ops.py)
                op = self._torch_op
                if op is None:  # NOTE [The torch op is made outside torch.compile]
                    from evtc.torch.ops import no_op_message

                    raise RuntimeError(no_op_message(self))
                return op(A, B, **kwargs)
            fast = self._fast.call  # NOTE [The torch fast path] (Dispatcher.run, inlined)
            if fast is not None:
                r = fast(A, B, kwargs)
                if r is not None:
                    return r
        return self.dispatch.run_checked(A, B, kwargs, out, stream)

    def run(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any = None, stream: Any = None):
        """:meth:`__call__` with the epilogue's arguments as a dict, never through the torch op
        (with :class:`~evtc.runtime.tensors.TensorView` operands too).

        Raises:
            ArgumentError: ``kwargs`` is not a dict (mapping) of the epilogue's parameters; the
                raises of :meth:`__call__`.
        """
        if not isinstance(kwargs, Mapping):
            # (None was a TypeError of len(); a list of pairs an "unexpected argument ('alpha', 1.0)")
            raise ArgumentError(f"run(A, B, kwargs={kwargs!r:.60}): kwargs is a {type(kwargs).__name__}, not a dict "
                                "of the epilogue's parameters", epilogue=self.name,
                                hint="pass them as a dict, e.g. gemm.run(A, B, {'alpha': 1.0, 'bias': bias}) ({} for "
                                     "none)")
        return self.dispatch.run(A, B, kwargs, out, stream)

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


def _check_flag(name: str, value: Any, epilogue: str) -> None:
    """``autotune=``/``batch_invariant=``/``atomic_sums=``: True, False or None (``bool("false")``
    would be True)."""
    if value is not None and not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name}={value!r}: True, False or None (the environment's default)", epilogue=epilogue,
                          hint=f"pass {name}=True or {name}=False")


def _tune_shapes(shapes: Any, epilogue: str) -> list[tuple[int, ...]]:
    """gemm.tune's ``shapes``: a list of (M, N, K) or (M, N, K, L), every extent an integer from
    1 to INT32_MAX."""
    if isinstance(shapes, (str, bytes, Mapping)) or not hasattr(shapes, "__iter__"):
        raise ArgumentError(f"shapes={shapes!r:.60}: a list of (M, N, K) or (M, N, K, L) problems", epilogue=epilogue,
                            hint="e.g. gemm.tune([(4096, 4096, 4096), (128, 4096, 4096)])")
    shapes = list(shapes)
    if shapes and all(isinstance(v, (int, np.integer)) for v in shapes):
        raise ArgumentError(f"shapes={tuple(shapes)!r}: a list of shapes, not one shape", epilogue=epilogue,
                            hint=f"pass [{tuple(shapes)!r}]")
    if not shapes:
        raise ArgumentError("shapes is empty: no shape to tune", epilogue=epilogue,
                            hint="e.g. gemm.tune([(4096, 4096, 4096)])")
    for shape in shapes:
        ok = isinstance(shape, (tuple, list, np.ndarray)) and len(shape) in (3, 4) and all(
            isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and 1 <= v <= INT32_MAX
            for v in shape)
        if not ok:
            shown = tuple(shape) if isinstance(shape, (tuple, list, np.ndarray)) else shape
            raise ArgumentError(f"shape {shown!r:.80}: (M, N, K) or (M, N, K, L), each an integer from 1 to "
                                f"{INT32_MAX}", epilogue=epilogue, hint="e.g. (4096, 4096, 4096) or (128, 4096, 4096, 8)")
    return [tuple(int(v) for v in shape) for shape in shapes]


def _check_tune_options(epilogue: str, *, iters: Any, limit_s: Any, store: Any, verbose: Any, top: Any) -> None:
    def positive_int(v: Any) -> bool:
        return isinstance(v, (int, np.integer)) and not isinstance(v, (bool, np.bool_)) and v >= 1

    if not positive_int(iters):
        raise ArgumentError(f"iters={iters!r}: the timed samples per candidate, an integer >= 1", epilogue=epilogue)
    if top is not None and not positive_int(top):
        raise ArgumentError(f"top={top!r}: how many of the model's candidates to time, an integer >= 1 (None: all)",
                            epilogue=epilogue)
    if isinstance(limit_s, (bool, np.bool_)) or not isinstance(limit_s, (int, float, np.integer, np.floating)) \
            or not math.isfinite(limit_s) or limit_s <= 0:
        raise ArgumentError(f"limit_s={limit_s!r}: seconds a candidate's first call may take, a positive finite "
                            "number", epilogue=epilogue, hint="e.g. limit_s=2.0 (the default)")
    for name, v in (("store", store), ("verbose", verbose)):
        if not isinstance(v, (bool, np.bool_)):
            raise ArgumentError(f"{name}={v!r}: True or False", epilogue=epilogue)
