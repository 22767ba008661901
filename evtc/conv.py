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

import json
import threading
from collections.abc import Mapping, Sequence
from typing import Any

from evtc import dtypes, passes
from evtc.abi import CONV_KINDS as KINDS
from evtc.abi import CONV_OPERANDS as OPERANDS
from evtc.abi import conv_abi_fields
from evtc.compiler import cache
from evtc.dtypes import DType
from evtc.errors import ArgumentError, ConfigError, api_boundary
from evtc.frontend.epilogue import Epilogue
from evtc.ir.graph import Graph
from evtc.ir.printer import print_graph
from evtc.plan.config import GemmConfig
from evtc.plan.conv import ConvPlan, conv_config, plan_conv, strided_dgrad_fields
from evtc.plan.target import get_target
from evtc.runtime.conv_bind import ConvBinder
from evtc.runtime.conv_problem import LAYOUTS, ConvProblem, ConvSpec, geometry, to_nhwc
from evtc.runtime.conv_gemm import NOT_ROUTED, GemmRoute
from evtc.runtime.launch import KernelLibrary, Launcher
from evtc.runtime import tensors
from evtc.family import conv as conv_family
from evtc.family.conv import ConvMember, member_configs, pointwise_problem

__all__ = ["Conv", "ConvPlan", "ConvProblem", "conv_config", "plan_conv"]

def _as_graph(epilogue: Any, *, c: DType | None, d: DType) -> Graph:
    from evtc.pipeline import as_graph

    return as_graph(epilogue, c=c, d=d)


# ---- kernels -----------------------------------------------------------------------------------------

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
