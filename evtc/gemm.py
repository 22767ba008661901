"""``evtc.Gemm``: the whole pipeline behind one object.

Input: an epilogue (``@evtc.epilogue`` function, a Graph, or a textual expression), operand and
output dtypes, an arch and optional configuration. Output: a callable GEMM.

``Gemm(...)`` traces, runs the passes, plans and emits right away (so errors in the epilogue
surface at construction, located at the user's line); the nvcc build happens on the first call
or on :meth:`Gemm.build` and is cached on disk.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

from evtc import dtypes, passes
from evtc.compiler import cache
from evtc.dtypes import DType
from evtc.abi import abi_fields, ctypes_struct
from evtc.errors import ConfigError, api_boundary
from evtc.frontend.epilogue import Epilogue
from evtc.ir.graph import Graph
from evtc.plan import GemmConfig, default_config, get_target
from evtc.plan.config import DECOMPOSITIONS, RASTER_ORDERS
from evtc.plan.config import validate as validate_config
from evtc.plan import plan as make_plan
from evtc.plan.plan import Plan
from evtc.ir.printer import print_graph
from evtc.runtime.bind import Binder
from evtc.runtime.launch import KernelLibrary, Launcher


def as_graph(epilogue: Epilogue | Graph | str, *, c: DType | None, d: DType) -> Graph:
    """The Graph of an epilogue given in any of the accepted forms."""
    if isinstance(epilogue, Graph):
        return epilogue
    if isinstance(epilogue, Epilogue):
        return epilogue.trace(c=c, d=d)
    if isinstance(epilogue, str):
        from evtc.frontend.text import from_expr

        return from_expr(epilogue, c=c, d=d)
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


class Gemm:
    """A GEMM ``D = epilogue(A @ B.T, ...)`` compiled for one arch and set of dtypes.

    Args:
        epilogue: an ``@evtc.epilogue`` function, a Graph, or a textual expression
            (``"D = relu(alpha*acc + beta*C + bias[n])"``).
        a: dtype of A (M x K, row-major), e.g. ``evtc.bf16``.
        b: dtype of B (N x K, row-major; default: ``a``).
        c: dtype of the source C (default: ``d``).
        d: dtype of M x N outputs that don't choose their own with ``.to()``.
        arch: ``"sm90"`` (Hopper, TMA warp-specialized) or ``"sm80"`` (Ampere, register-only).
        config: a :class:`~evtc.plan.config.GemmConfig` (tile, cluster, schedule, stages...);
            default :func:`~evtc.plan.config.default_config`.
        plan: ``"evtc"`` (evtc's shared-memory planner) or ``"cutlass"`` (stock CUTLASS's
            additive rule, for comparison).
        plan_rank: take the n-th best plan of the cost model (the autotuner tries a few).

    Attributes:
        graph: the Graph after passes. ``str(gemm.graph)`` is its IR text.
        plan: the :class:`~evtc.plan.plan.Plan`; ``print(gemm.plan)`` shows it on one screen.
        source: the emitted ``.cu`` text.

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
        target = get_target(arch)
        for name, dt in (("a", self.a), ("b", self.b)):
            if dt not in dtypes.MAINLOOP_DTYPES[arch]:
                allowed = ", ".join(x.name for x in dtypes.MAINLOOP_DTYPES[arch])
                raise ConfigError(f"{name}={dt.name} is not a {arch} mainloop dtype ({allowed})",
                                  hint=(f"{arch}'s fp8 mainloop takes e4m3" if arch == "sm90" else "fp8 GEMMs need sm90") if dt.is_fp8 else None)
        if self.a.bits != self.b.bits:
            raise ConfigError(f"A is {self.a.name} and B is {self.b.name}: mixed-width mainloops are not supported")
        if isinstance(config, Mapping):
            config = GemmConfig.from_json(dict(config))
        self.config = validate_config(default_config(arch, self.a, self.b) if config is None else config,
                                      arch, self.a, self.b)
        traced = as_graph(epilogue, c=self.c, d=self.d)
        self.name = traced.name
        self.graph = passes.run(traced, arch)
        fixed = dict(plan) if isinstance(plan, Mapping) else {}
        policy = fixed.pop("policy", "evtc") if isinstance(plan, Mapping) else plan
        # swap-AB kernels run the epilogue of the transposed problem (evtc.family.swap_ab)
        self.kernel_graph = self.graph
        if self.config.swap_ab:
            from evtc.family.swap_ab import transpose

            self.kernel_graph = transpose(self.graph)
        self.plan = make_plan(self.kernel_graph, arch, a=self.a, b=self.b, config=self.config, policy=policy,
                              rank=plan_rank, fixed=fixed)
        self.config = self.plan.config  # validated: defaults that depend on the arch filled in
        self.source = emit(self.kernel_graph, self.plan)
        self.target = target
        self._library: KernelLibrary | None = None
        self._library_key: str | None = None
        # sm90's register-direct accesses are whole 16-byte vectors (the Binder checks N); sm80
        # picks its access width at run time, so it has no such rule.
        self._direct = frozenset(b.name for b in self.plan.buffers if b.mode == "direct"
                                 and b.role in ("aux_load", "aux_store")) if self.plan.arch == "sm90" else frozenset()
        self._scheduler = {"max_swizzle_size": 1 << self.config.swizzle,
                           "raster_order": RASTER_ORDERS.index(self.config.raster),
                           "splits": self.config.split_k,
                           "decomposition_mode": DECOMPOSITIONS.index(self.config.decomposition),
                           "reduction_mode": 0} if arch == "sm90" else {}
        self._binder = self._make_binder(ctypes_struct(abi_fields(self.graph, arch)))

    def _make_binder(self, Args) -> Binder:
        self._launcher: Launcher | None = None
        return Binder(self.graph, self.a, self.b, Args, self._direct, self._scheduler, arch=self.arch)

    # ---- building -------------------------------------------------------------------------------

    @api_boundary
    def build(self, timeout: float | None = None) -> cache.Artifact:
        """Compile (or fetch from the cache) and load the kernel.

        Raises:
            BuildError: nvcc failed (the source and log are kept and named).
            NoDeviceError: no nvcc.
        """
        art = cache.build(self.source, arch=self.arch, name=self.name, timeout=timeout)
        if self._library is None or self._library_key != art.key:
            library = KernelLibrary(art.verified_library_path())
            library.verify(fields=abi_fields(self.kernel_graph, self.arch), ir=print_graph(self.kernel_graph),
                           name=self.name, arch=self.arch)
            self._library = library
            self._library_key = art.key
            self._binder = self._make_binder(library.Args)
        self.artifact = art
        return art

    @property
    def library(self) -> KernelLibrary:
        if self._library is None:
            self.build()
        assert self._library is not None
        return self._library

    def info(self) -> dict:
        """The built kernel's info (plan, ABI, ``sizeof`` of the epilogue storage, stages)."""
        return self.library.info

    # ---- running ----------------------------------------------------------------------------------

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
            L for unbatched problems).

        Zero sizes behave like torch (empty outputs for M, N or L = 0, the epilogue of a zero
        accumulator for K = 0), outputs may be exactly an M x N input (in place, ``out=C``), and
        the call can be captured in a CUDA graph (``torch.cuda.graph``): see
        :mod:`evtc.runtime.bind` for every rule.

        Raises:
            ArgumentError: a missing, extra or malformed argument (named).
            LaunchError: CUDA reported an error.
        """
        launcher = self._launcher
        if launcher is None:
            library = self.library  # builds (and makes the Binder of the loaded ABI) on first use
            launcher = self._launcher = Launcher(self._binder, library, self.name)
        return launcher(A, B, kwargs, out, stream)

    def __repr__(self) -> str:
        return f"<evtc.Gemm {self.name} {self.arch} a={self.a} b={self.b} tile={self.config.name} plan={self.plan.policy}>"

    def describe(self) -> str:
        """The IR, the plan and the configuration, as text."""
        return f"{self.graph}\n{self.plan}\nconfig: {json.dumps(self.config.to_json())}\n"
