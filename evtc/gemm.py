"""``evtc.Gemm``: the whole pipeline behind one object.

Input: an epilogue (``@evtc.epilogue`` function, a Graph, or a textual expression), operand and
output dtypes, an arch and optional configuration. Output: a callable GEMM.

``Gemm(...)`` traces, runs the passes, plans and emits right away (so errors in the epilogue
surface at construction, located at the user's line); the nvcc build happens on the first call
or on :meth:`Gemm.build` and is cached on disk.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from evtc import dtypes, passes
from evtc.compiler import cache
from evtc.dtypes import DType
from evtc.abi import abi_fields, ctypes_struct
from evtc.errors import ConfigError, api_boundary
from evtc.frontend.epilogue import Epilogue
from evtc.ir.graph import Graph
from evtc.plan import GemmConfig, default_config, get_target
from evtc.plan.config import RASTER_ORDERS
from evtc.plan import plan as make_plan
from evtc.plan.plan import Plan
from evtc.runtime import tensors
from evtc.runtime.bind import Binder
from evtc.runtime.launch import KernelLibrary


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
        self.config = config or default_config(arch, self.a, self.b)
        traced = as_graph(epilogue, c=self.c, d=self.d)
        self.name = traced.name
        self.graph = passes.run(traced, arch)
        fixed = dict(plan) if isinstance(plan, Mapping) else {}
        policy = fixed.pop("policy", "evtc") if isinstance(plan, Mapping) else plan
        self.plan = make_plan(self.graph, arch, a=self.a, b=self.b, config=self.config, policy=policy,
                              rank=plan_rank, fixed=fixed)
        self.config = self.plan.config  # validated: defaults that depend on the arch filled in
        self.source = emit(self.graph, self.plan)
        self.target = target
        self._library: KernelLibrary | None = None
        # sm90's register-direct accesses are whole 16-byte vectors (the Binder checks N); sm80
        # picks its access width at run time, so it has no such rule.
        self._direct = frozenset(b.name for b in self.plan.buffers if b.mode == "direct"
                                 and b.role in ("aux_load", "aux_store")) if self.plan.arch == "sm90" else frozenset()
        self._scheduler = {"max_swizzle_size": 1 << self.config.swizzle,
                           "raster_order": RASTER_ORDERS.index(self.config.raster)} if arch == "sm90" else {}
        self._binder = self._make_binder(ctypes_struct(abi_fields(self.graph, arch)))

    def _make_binder(self, Args) -> Binder:
        return Binder(self.graph, self.a, self.b, Args, self._direct, self._scheduler)

    # ---- building -------------------------------------------------------------------------------

    @api_boundary
    def build(self, timeout: float | None = None) -> cache.Artifact:
        """Compile (or fetch from the cache) and load the kernel.

        Raises:
            BuildError: nvcc failed (the source and log are kept and named).
            NoDeviceError: no nvcc.
        """
        art = cache.build(self.source, self.target, name=self.name, timeout=timeout)
        if self._library is None or self._library.path != art.library:
            self._library = KernelLibrary(art.library)
            self._binder = self._make_binder(self._library.Args)
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
            stream: a CUDA stream (torch/cupy stream or raw handle); default: the current
                stream of A's framework.
            **kwargs: the epilogue's parameters by name: tensors, and Python numbers for
                scalars.

        Returns:
            The output ``D`` when it is the only output; otherwise a dict name -> tensor in the
            order the epilogue returned them. Reductions are (L, M) / (L, N) / (L,) (without
            L for unbatched problems).

        Raises:
            ArgumentError: a missing, extra or malformed argument (named).
            LaunchError: CUDA reported an error.
        """
        lib = self.library
        args, outputs, keep, va = self._binder.bind(A, B, kwargs, out)
        ws_bytes = lib.workspace_size(args, va.device)
        ws_obj, ws_ptr = tensors.empty_bytes(va, ws_bytes)
        keep.append(ws_obj)
        handle = tensors.stream_handle(stream) if stream is not None else tensors.current_stream(va)
        lib.run(args, ws_ptr, ws_bytes, handle, va.device, epilogue=self.name)
        self._keepalive = keep  # the launch is asynchronous; hold the buffers until the next call
        if len(outputs) == 1 and "D" in outputs:
            return outputs["D"]
        return outputs

    def __repr__(self) -> str:
        return f"<evtc.Gemm {self.name} {self.arch} a={self.a} b={self.b} tile={self.config.name} plan={self.plan.policy}>"

    def describe(self) -> str:
        """The IR, the plan and the configuration, as text."""
        return f"{self.graph}\n{self.plan}\nconfig: {json.dumps(self.config.to_json())}\n"
