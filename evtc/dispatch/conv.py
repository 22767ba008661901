"""A Conv's kernel family and its dispatch: a call -> the kernel (or the 1x1 route) that runs it.

Input: a :class:`~evtc.pipeline.Pipeline` (the epilogue traced; its passes per arch), the
convolution (kind, spatial dimensions, layout), its arch and configuration; per call the
operands, the epilogue's arguments, ``out=`` and a :class:`~evtc.runtime.conv_problem.ConvProblem`.
Output: the call's outputs, run by the 1x1 route's Gemm (:mod:`evtc.dispatch.conv_gemm`), the
strided-dgrad kernel, or the family member the heuristic picks for the implicit GEMM
(:func:`evtc.family.conv.choose`; NOTE [The sm90 conv family] in :mod:`evtc.family.conv`).

:class:`ConvFamily` holds the members and one :class:`~evtc.pipeline.conv.ConvKernel` per
(arch, strided, member), chooses one per problem and makes a
:class:`~evtc.runtime.launch.Launcher` per kernel and problem; :class:`ConvDispatcher` runs a
call. NOTE [Checks before builds] (:mod:`evtc.dispatch.dispatcher`) holds for a Conv too: a
kernel that is not built yet checks the call with its binder (the graph's ABI, no library)
before nvcc runs, so a bad call is refused in milliseconds, naming the argument.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from evtc import dtypes
from evtc.abi import CONV_KINDS, CONV_OPERANDS, ctypes_struct
from evtc.compiler import cache
from evtc.dispatch.conv_gemm import NOT_ROUTED, GemmRoute
from evtc.dtypes import DType
from evtc.errors import ArgumentError, ConfigError
from evtc.family import conv as conv_family
from evtc.family.conv import ConvMember, member_configs, pointwise_problem
from evtc.pipeline.conv import ConvKernel
from evtc.pipeline.kernel import Pipeline
from evtc.plan.config import GemmConfig, column_reduction_tile_ok
from evtc.plan.conv import conv_config, is_persistent, strided_dgrad_fields
from evtc.plan.target import get_target
from evtc.runtime import tensors
from evtc.runtime.conv_bind import ConvBinder
from evtc.runtime.conv_problem import LAYOUTS, ConvGeometry, ConvProblem, ConvSpec, geometry, to_nhwc
from evtc.runtime.launch import Launcher

__all__ = ["ConvDispatcher", "ConvFamily", "check_options"]

_DEFAULT_PROBLEM = ConvProblem()


def check_options(kind: str, dims: int, layout: str, fast_divmod: tuple[bool, bool], arch: str,
                  a: DType | str, b: DType | str | None) -> tuple[DType, DType]:
    """A Conv's operand dtypes (``b`` defaults to ``a``), after refusing the options no conv kernel
    takes (before its configuration is read).

    Raises:
        ConfigError: (anchor ``conv-config``) the first bad option, named.
    """
    if kind not in CONV_KINDS:
        raise ConfigError(f"kind = {kind!r} is not one of {CONV_KINDS}", anchor="conv-config")
    if not isinstance(dims, int) or isinstance(dims, bool) or dims not in (2, 3):  # (2.0 reached the emitter)
        raise ConfigError(f"dims = {dims!r}: evtc's convolutions are 2-D or 3-D", anchor="conv-config")
    if layout not in LAYOUTS:
        raise ConfigError(f"layout = {layout!r} is not one of {LAYOUTS}", anchor="conv-config")
    if (not isinstance(fast_divmod, tuple) or len(fast_divmod) != 2
            or not all(isinstance(x, bool) for x in fast_divmod)):
        raise ConfigError(f"fast_divmod = {fast_divmod!r}: a pair of bools (aux loads, stores)", anchor="conv-config")
    get_target(arch)
    a = dtypes.coerce(a, "a")
    b = dtypes.coerce(b, "b") if b is not None else a
    for name, dt in (("a", a), ("b", b)):
        if dt not in (dtypes.f16, dtypes.bf16):
            raise ConfigError(f"{name}={dt.name}: evtc's conv kernels take f16 or bf16 operands",
                              hint="fp8 convolutions are not supported; an fp8 output is (d=evtc.e4m3)",
                              anchor="conv-config")
    if a is not b:
        raise ConfigError(f"a is {a.name} and b is {b.name}: the tensor-core MMAs take one 16-bit type",
                          anchor="conv-config")
    return a, b


class ConvFamily:
    """The kernels of one Conv: its members, a :class:`~evtc.pipeline.conv.ConvKernel` per
    (arch, strided, member), and the choice of one per problem.

    Args:
        pipeline: the Conv's build path.
        kind, dims, layout, fast_divmod: the Conv's.
        arch: ``sm90`` or ``sm80``.
        config: the main kernel's validated configuration (:func:`evtc.plan.conv.conv_config`).
        pinned: ``config`` was given (a family of one); ``config_given``: with fields (not ``{}``).
        plan, plan_rank: the planner's options (:class:`evtc.Conv`'s).

    Attributes:
        members: member name -> :class:`~evtc.family.conv.ConvMember` (one entry, ``base`` or
            ``pinned``, unless an sm90 fprop or dgrad family).
        graph: the epilogue after passes for ``arch``. main: the main kernel (planned and
            emitted at construction, so epilogue errors surface there).

    Raises:
        ConfigError: a reserved parameter name, sm90's plan options on sm80.
        EvtcError: legalization and planning errors of the main kernel.
    """

    def __init__(self, pipeline: Pipeline, *, kind: str, dims: int, arch: str, layout: str,
                 fast_divmod: tuple[bool, bool], config: GemmConfig, pinned: bool, config_given: bool,
                 plan: str | Mapping = "evtc", plan_rank: int = 0) -> None:
        self.pipeline, self.name = pipeline, pipeline.name
        self.kind, self.dims, self.arch, self.layout, self.fast_divmod = kind, dims, arch, layout, fast_divmod
        self.a, self.b, self.config = pipeline.a, pipeline.b, config
        reserved = sorted({i.name for i in pipeline.traced.inputs} & {"problem", "out", "stream"})
        if reserved:
            raise ConfigError(f"epilogue parameter{'s' if len(reserved) > 1 else ''} {', '.join(map(repr, reserved))} "
                              "can't be passed: a Conv call takes problem=, out= and stream= itself",
                              epilogue=self.name, hint="rename the parameter", anchor="conv-config")
        self.graph = pipeline.graph_for(arch)
        fixed = dict(plan) if isinstance(plan, Mapping) else {}
        policy = fixed.pop("policy", "evtc") if isinstance(plan, Mapping) else plan
        self.plan_args = {"policy": policy, "rank": plan_rank, "fixed": fixed} if arch == "sm90" else {}
        if arch == "sm80" and (policy != "evtc" or fixed or plan_rank):
            raise ConfigError("plan policies, ranks and fixed decisions are sm90's", anchor="conv-config")
        self.pinned, self.config_given = pinned, config_given
        self._kernels: dict[tuple, ConvKernel] = {}
        self._choices: dict[tuple, ConvKernel] = {}
        # NOTE [The sm90 conv family]: sm90 fprop and dgrad without a pinned config choose a
        # member per problem; everything else is one kernel
        if arch == "sm90" and kind in conv_family.FAMILIES and not pinned:
            # each member's configuration (the heuristic's input; a member is planned when it
            # runs), without members whose tile the epilogue can't take (a column reduction: tile
            # N a multiple of 64)
            members = {n: (m, conv_config(arch, self.a, self.b, dict(m.fields), kind=kind))
                       for n, m in member_configs(self.a, conv_family.FAMILIES[kind]).items()}
            members = {n: mc for n, mc in members.items() if column_reduction_tile_ok(self.graph, mc[1])}
            self.members: dict[str, ConvMember] = {n: m for n, (m, _) in members.items()}
            self._member_configs = {n: (cfg, m.ctas_per_sm) for n, (m, cfg) in members.items()}
        else:
            one = "pinned" if pinned else "base"
            self.members = {one: ConvMember(one, {}, 1)}
            self._member_configs = {}
        self.main = self.kernel(arch, False)

    @property
    def pointwise_route(self) -> bool:
        """Whether 1x1 problems run on a Gemm (NOTE [1x1 convolutions as GEMMs]): an sm90 fprop family."""
        return self.arch == "sm90" and self.kind == "fprop" and not self.pinned

    # ---- kernels -----------------------------------------------------------------------------

    def kernel(self, arch: str, strided: bool, member: str | None = None) -> ConvKernel:
        """The (planned, emitted, maybe not built) kernel of ``arch``: the main one, the
        strided-dgrad one, or a family member's."""
        if member in (None, "base", "pinned") or strided or arch != self.arch:
            key: tuple = (arch, strided)
            member = None
        else:
            key = (arch, strided, member)
        k = self._kernels.get(key)
        if k is None:
            config, plan_args = self._kernel_config(arch, strided, member)
            k = self._kernels[key] = ConvKernel(self.pipeline, kind=self.kind, dims=self.dims, arch=arch,
                                                config=config, plan_args=plan_args, strided=strided,
                                                member=member or "base", fast_divmod=self.fast_divmod)
        return k

    def _kernel_config(self, arch: str, strided: bool, member: str | None) -> tuple[GemmConfig, dict]:
        """The configuration and planner options of a kernel (see :meth:`kernel`)."""
        a, b = self.a, self.b
        if strided and not (arch == self.arch and self.config_given):
            # NOTE [The strided-dgrad kernel's tile] in evtc.plan.conv
            return conv_config(arch, a, b, strided_dgrad_fields(a), kind=self.kind), {}
        if member is None:  # the main kernel (or another arch's default)
            if arch == self.arch:
                return self.config, self.plan_args
            return conv_config(arch, a, b, None, kind=self.kind), {}
        # a family member: the main kernel's plan policy, not its rank or fixed decisions
        return (conv_config(arch, a, b, dict(self._member_spec(member).fields), kind=self.kind),
                {"policy": self.plan_args["policy"]} if self.plan_args else {})

    def _member_spec(self, name: str) -> ConvMember:
        if name in self.members:
            return self.members[name]
        if name not in conv_family.CANDIDATES:
            raise ConfigError(f"no conv family member '{name}'",
                              hint=f"members: {', '.join(conv_family.CANDIDATES)}", anchor="conv-config")
        return member_configs(self.a, [name])[name]

    def member(self, name: str) -> ConvKernel:
        """The kernel of a family member or exploration candidate (:data:`evtc.family.conv.CANDIDATES`)
        by name; ``base`` is the main kernel.

        Raises:
            ConfigError: an unknown name, or a member this Conv's kind or arch can't take (only
                sm90 fprop and dgrad Convs without a pinned config have members besides their one
                kernel).
        """
        if name in ("base", "pinned") or name in self.members and len(self.members) == 1:
            return self.main
        if self.arch != "sm90" or self.kind not in conv_family.FAMILIES or self.pinned:
            raise ConfigError(f"member '{name}': only sm90 fprop and dgrad Convs without config= have a kernel family",
                              hint="pin a configuration with Conv(..., config={...}) instead", anchor="conv-config")
        self._member_spec(name)
        return self.kernel(self.arch, False, name)

    def kernels(self) -> list[ConvKernel]:
        """The kernels of the family (planned and emitted, not built): the main kernel first."""
        return [self.member(n) for n in self.members]

    # ---- the choice --------------------------------------------------------------------------

    def choose(self, M: int, N: int, K: int, *, sm_count: int | None = None, channels: int | None = None) -> str:
        """The member (name) an implicit GEMM of (M, N, K) runs on (:func:`evtc.family.conv.choose`).
        ``channels``: the channels the implicit GEMM's K runs over (:meth:`channels_of`); without
        it, none of the persistent members."""
        if len(self.members) == 1:
            return next(iter(self.members))
        return conv_family.choose(self._member_configs, M, N, K, sm_count or get_target(self.arch).sm_count,
                                  channels=channels)

    def channels_of(self, g: ConvGeometry) -> int:
        """The channels a problem's implicit-GEMM K runs over (the persistent members' rule, NOTE
        [Persistent conv kernels]): fprop's input channels C, dgrad's output channels K."""
        return g.k if self.kind == "dgrad" else g.c

    def route(self, spec: ConvSpec, a: Any = None, b: Any = None) -> ConvKernel:
        """The kernel of a problem: strided dgrad runs on the sm80 strided-dgrad kernel (on either
        arch); an sm90 fprop or dgrad family's member by :meth:`choose` (given the operands ``a`` and
        ``b``, cached by their shapes); everything else, and a malformed call, on the main kernel
        (whose binder says what is wrong)."""
        if self.kind == "dgrad" and not spec.unit_stride:
            return self.kernel("sm80", True)
        if len(self.members) == 1 or a is None:
            return self.main
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
        an, bn, _ = CONV_OPERANDS[self.kind]
        try:
            va = to_nhwc(tensors.view(a, an, self.name), self.layout)
            vb = to_nhwc(tensors.view(b, bn, self.name), self.layout)
            g = geometry(self.kind, self.dims, tuple(va.shape), tuple(vb.shape), spec, None, self.name)
        except ArgumentError:
            return self.main
        got = self.member(self.choose(*g.gemm, channels=self.channels_of(g)))
        if key is not None:
            if len(self._choices) > 256:
                self._choices.clear()
            self._choices[key] = got
        return got

    # ---- launchers ---------------------------------------------------------------------------

    def binder(self, kernel: ConvKernel, spec: ConvSpec, Args=None) -> ConvBinder:
        """The argument checker of ``kernel`` for problem ``spec`` (``Args``: its library's struct;
        before it is built, the ABI from the graph)."""
        return ConvBinder(kernel.graph, self.a, self.b, Args or ctypes_struct(kernel.fields), kind=self.kind,
                          dims=self.dims, layout=self.layout, spec=spec, arch=kernel.arch,
                          strided_dgrad=kernel.strided, tile=kernel.config.tile,
                          persistent=is_persistent(kernel.config))

    def launcher(self, kernel: ConvKernel, spec: ConvSpec, call: tuple | None = None) -> Launcher:
        """The launcher of ``kernel`` for problem ``spec`` (building the kernel on first use).

        Args:
            call: ``(a, b, kwargs, out)`` of the call that asks: checked by the kernel's binder
                before a build starts (NOTE [Checks before builds]).

        Raises:
            ArgumentError: ``call`` is malformed (named), before any build.
            BuildError: nvcc failed.
        """
        got = kernel.launchers.get(spec)
        if got is None:
            with kernel.lock:
                if kernel.library is None:
                    if call is not None:  # NOTE [Checks before builds]
                        self.binder(kernel, spec).signature(*call)
                    kernel.build()
                library = kernel.library
                assert library is not None
                got = kernel.launchers[spec] = Launcher(self.binder(kernel, spec, library.Args), library, self.name)
        return got

    def build(self, kernels: list, timeout: float | None = None, executor: Any = None) -> None:
        """Compile (or fetch from the cache) and load ``kernels`` (conv kernels and the 1x1
        route's Gemm kernels), in parallel.

        Raises:
            BuildError: nvcc failed (the source and log are kept and named).
        """
        results = cache.build_many([k.job() for k in kernels], executor=executor, timeout=timeout)
        for k, r in zip(kernels, results):
            if isinstance(r, Exception):
                raise r
            k.load(r)


class ConvDispatcher:
    """Runs a Conv's calls: normalizes each call's problem (once per ConvProblem), sends 1x1
    problems to the Gemm route where it takes them, else runs the kernel the family routes the
    problem to.

    Args:
        family: the Conv's kernels.
        gemm_route: the 1x1 route (:class:`~evtc.dispatch.conv_gemm.GemmRoute`), or None.
    """

    def __init__(self, family: ConvFamily, gemm_route: GemmRoute | None = None) -> None:
        self.family = family
        self.gemm_route = gemm_route
        self._specs: dict[ConvProblem, ConvSpec] = {}

    def spec(self, problem: ConvProblem | None) -> ConvSpec:
        """The normalized problem of a call.

        Raises:
            ArgumentError: (anchor ``conv-problem``) not a ConvProblem, or a bad field (named).
        """
        fam = self.family
        if problem is None:
            problem = _DEFAULT_PROBLEM
        if not isinstance(problem, ConvProblem):
            raise ArgumentError(f"problem = {problem!r} is not an evtc.ConvProblem", epilogue=fam.name,
                                anchor="conv-problem")
        try:
            spec = self._specs.get(problem)
            hashable = True
        except TypeError:  # lists inside: normalized on every call
            spec, hashable = None, False
        if spec is None:
            spec = problem.normalize(fam.dims, fam.name)
            if hashable:
                self._specs[problem] = spec
        return spec

    def run(self, a: Any, b: Any, kwargs: Mapping[str, Any], problem: ConvProblem | None, out: Any, stream: Any):
        """Run a call (see :meth:`evtc.Conv.__call__`).

        Raises:
            ArgumentError: a bad argument or problem, named, before any build.
            LaunchError: CUDA reported an error.
        """
        if stream is not None:  # NOTE [Checks before builds]: the stream too (the launcher reads it after the build)
            tensors.stream_handle(stream, None, self.family.name)
        spec = self.spec(problem)
        route = self.gemm_route
        if route is not None and pointwise_problem(self.family.kind, spec.stride, spec.padding, spec.dilation,
                                                   spec.groups):
            got = route(a, b, kwargs, out, stream)
            if got is not NOT_ROUTED:
                return got
        kernel = self.family.route(spec, a, b)
        return self.family.launcher(kernel, spec, (a, b, kwargs, out))(a, b, kwargs, out, stream)

    def kernel_for(self, a_shape: Sequence[int], b_shape: Sequence[int], problem: ConvProblem | None = None):
        """The kernel a call with packed, aligned operands of these NHWC (KRSC) shapes runs on, and
        its label (see :meth:`evtc.Conv.kernel_for`).

        Raises:
            ArgumentError: shapes that are not a convolution of the Conv's kind (anchor
                ``conv-problem``).
        """
        fam = self.family
        spec = (problem or _DEFAULT_PROBLEM).normalize(fam.dims, fam.name)
        g = geometry(fam.kind, fam.dims, tuple(a_shape), tuple(b_shape), spec, None, fam.name)
        M, N, K = g.gemm
        vec = 16 // fam.a.bytes
        if (self.gemm_route is not None and all(f == 1 for f in g.flt) and not (g.c % vec or g.k % vec)
                and min(M, N, K) > 0 and pointwise_problem(fam.kind, spec.stride, spec.padding, spec.dilation,
                                                           spec.groups)):
            member, kernel = self.gemm_route.kernel(M, N, K)
            return f"gemm:{member.name}", kernel
        if fam.kind == "dgrad" and not spec.unit_stride:
            return "strided", fam.kernel("sm80", True)
        name = fam.choose(M, N, K, channels=fam.channels_of(g))
        return name, fam.member(name)
