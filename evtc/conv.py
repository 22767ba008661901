"""``evtc.Conv``: the facade over the build path and the call path of one fused convolution.

Input: an epilogue (``@evtc.epilogue`` function, Graph or textual expression), the kind of
convolution (fprop, dgrad, wgrad), its spatial dimensions, operand and output dtypes, an arch.
Output: a callable convolution ``conv(a, b, problem=ConvProblem(...), **epilogue_args)``.

A convolution shares everything with :class:`evtc.Gemm` from the IR to the plan: the epilogue is
traced, passed, lowered and planned as for the GEMM with M, N, K of the implicit GEMM (NOTE
[Implicit GEMM of a convolution] in :mod:`evtc.runtime.conv_problem`); only the mainloop and the
problem mapping differ (:mod:`evtc.plan.conv` configures and plans the conv kernels,
:mod:`evtc.emit.conv_sm90` and :mod:`evtc.emit.conv_sm80` emit them):

* sm90: CUTLASS 3.x's ``ConvUniversal`` (TMA im2col mainloop) with the collective epilogue and
  evtc's planned fusion callbacks; for fprop and unit-stride dgrad also the same mainloop on
  CUTLASS's persistent GEMM kernels (NOTE [Persistent conv kernels]);
* sm80: CUTLASS 2.x's implicit-GEMM mainloop with evtc's register-only visitor epilogue;
* strided dgrad (stride > 1): CUTLASS 2.x's strided-dgrad mainloop, on either arch.

Construction wires the build path (:class:`evtc.pipeline.Pipeline`; each kernel a
:class:`evtc.pipeline.conv.ConvKernel`) to the conv family (:class:`evtc.dispatch.conv.ConvFamily`:
an sm90 fprop or dgrad Conv picks a member per problem, NOTE [The sm90 conv family]); a call asks
the dispatch stage (:class:`evtc.dispatch.conv.ConvDispatcher`), which sends fprop's 1x1 problems
to a Gemm (:mod:`evtc.dispatch.conv_gemm`) and the rest to a conv kernel, every argument checked
before a kernel is built.

Example::

    @evtc.epilogue
    def bias_silu(acc, bias: evtc.RowVector[evtc.f32]):
        return evtc.silu(acc + bias)

    conv = evtc.Conv(bias_silu, kind="fprop", a=evtc.bf16, d=evtc.bf16, arch="sm90")
    y = conv(x, w, problem=evtc.ConvProblem(stride=1, padding=1), bias=b)   # x NHWC, w KRSC, y NHWC
"""

from __future__ import annotations

import json
import numbers
from collections.abc import Mapping, Sequence
from typing import Any

from evtc import dtypes
from evtc.compiler import cache
from evtc.dispatch.conv import ConvDispatcher, ConvFamily, check_options
from evtc.dispatch.conv_gemm import GemmRoute
from evtc.dtypes import DType
from evtc.errors import ArgumentError, ConfigError, api_boundary
from evtc.frontend.epilogue import Epilogue
from evtc.ir.graph import Graph
from evtc.pipeline import Pipeline
from evtc.pipeline.conv import ConvKernel
from evtc.plan.config import GemmConfig
from evtc.plan.conv import ConvPlan, conv_config, plan_conv
from evtc.runtime.conv_problem import ConvProblem

__all__ = ["Conv", "ConvPlan", "ConvProblem", "conv_config", "plan_conv"]


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
        dispatch: the call path (:class:`~evtc.dispatch.conv.ConvDispatcher`; its ``family`` is
            the :class:`~evtc.dispatch.conv.ConvFamily` of kernels).
        gemm_route: the :class:`~evtc.dispatch.conv_gemm.GemmRoute` of 1x1 problems, or None
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
        if isinstance(dims, numbers.Integral) and not isinstance(dims, bool):
            dims = int(dims)  # a numpy integer is a dimension count too (and JSON can write an int)
        self.a, self.b = check_options(kind, dims, layout, fast_divmod, arch, a, b)
        self.kind, self.dims, self.arch, self.layout, self.fast_divmod = kind, dims, arch, layout, fast_divmod
        self.d = dtypes.coerce(d, "d") if d is not None else getattr(epilogue, "default_d", dtypes.bf16)
        self.c = dtypes.coerce(c, "c") if c is not None else None
        self.config = conv_config(arch, self.a, self.b, config, kind=kind)
        self.pipeline = Pipeline(epilogue, a=self.a, b=self.b, c=self.c, d=self.d)
        self.traced, self.name = self.pipeline.traced, self.pipeline.name
        kernels = ConvFamily(self.pipeline, kind=kind, dims=dims, arch=arch, layout=layout, fast_divmod=fast_divmod,
                             config=self.config, pinned=config is not None, config_given=bool(config), plan=plan,
                             plan_rank=plan_rank)
        self.graph, self.family, self.pinned = kernels.graph, kernels.members, kernels.pinned
        self.plan, self.source = kernels.main.plan, kernels.main.source
        route = None
        if kernels.pointwise_route:  # NOTE [1x1 convolutions as GEMMs]
            policy = kernels.plan_args.get("policy", "evtc")

            def make_gemm():
                from evtc.gemm import Gemm

                return Gemm(self.traced, a=self.a, b=self.b, c=self.c, d=self.d, arch=arch, plan=policy)

            route = GemmRoute(self.graph, self.a, self.b, layout, make_gemm)
        self.gemm_route = route
        self.dispatch = ConvDispatcher(kernels, route)

    # ---- the family ---------------------------------------------------------------------------------

    def member(self, name: str) -> ConvKernel:
        """The (planned, emitted, maybe not built) kernel of a family member or exploration
        candidate (:data:`evtc.family.conv.CANDIDATES`) by name; ``base`` is the main kernel.

        Raises:
            ConfigError: an unknown name, or a member this Conv can't take (only sm90 fprop and
                dgrad Convs without a pinned config have members besides their one kernel).
        """
        if not isinstance(name, str):  # (a list raised "unhashable type" from the family's table)
            raise ConfigError(f"member {name!r:.60} is not a member's name", epilogue=self.name, anchor="conv-config",
                              hint="pass a name such as 'base' (Conv.choose gives the one a problem runs on)")
        return self.dispatch.family.member(name)

    def kernels(self) -> list[ConvKernel]:
        """The kernels of the family (planned and emitted, not built): the main kernel first."""
        return self.dispatch.family.kernels()

    def jobs(self, *, gemm: bool = True) -> list[cache.BuildJob]:
        """The build jobs of the family and (``gemm=True``) of the 1x1 route's Gemm family (for
        :func:`evtc.compiler.build_many`, or to prebuild kernels on another machine)."""
        return [k.job() for k in self.kernels() + (self.gemm_route.kernels() if gemm and self.gemm_route else [])]

    def choose(self, M: int, N: int, K: int, *, sm_count: int | None = None, channels: int | None = None) -> str:
        """The family member (name) an implicit GEMM of (M, N, K) runs on
        (:func:`evtc.family.conv.choose`; NOTE [The sm90 conv family]). ``channels``: the
        channels the implicit GEMM's K runs over, fprop's input channels C and dgrad's output
        channels K (:meth:`channels_of`); without it, none of the persistent members.

        Raises:
            ArgumentError: M, N or K not an integer from 1 to INT32_MAX, ``sm_count`` or
                ``channels`` not an integer >= 1 or None (the checks of :meth:`evtc.Gemm.choose`).
        """
        from evtc.runtime.bind import INT32_MAX

        def integer(v: Any) -> bool:
            return isinstance(v, numbers.Integral) and not isinstance(v, bool)

        if not all(integer(v) and 1 <= v <= INT32_MAX for v in (M, N, K)):
            raise ArgumentError(f"choose({M!r:.20}, {N!r:.20}, {K!r:.20}): the implicit GEMM's M, N and K, each an "
                                f"integer from 1 to {INT32_MAX}", epilogue=self.name,
                                hint="e.g. conv.choose(n * p * q, k, c * r * s) for an fprop")
        for what, v in (("sm_count", sm_count), ("channels", channels)):
            if v is not None and (not integer(v) or v < 1):
                raise ArgumentError(f"{what}={v!r}: an integer >= 1, or None", epilogue=self.name)
        return self.dispatch.family.choose(int(M), int(N), int(K), sm_count=sm_count, channels=channels)

    def channels_of(self, g: Any) -> int:
        """The channels a problem's implicit-GEMM K runs over: fprop's C, dgrad's K."""
        return self.dispatch.family.channels_of(g)

    def kernel_for(self, a_shape: Sequence[int], b_shape: Sequence[int], problem: ConvProblem | None = None):
        """The kernel a call with packed, aligned operands of these NHWC (KRSC) shapes runs on, and
        its label: ``("m64", conv kernel)`` for a family member, ``("gemm:small", Gemm kernel)``
        for a 1x1 problem on the Gemm, ``("base", ...)`` for a Conv of one kernel. Both kernels
        have ``job()`` and ``build()`` (to prebuild what a set of layers runs).

        Raises:
            ArgumentError: shapes that are not a convolution of the Conv's kind (anchor
                ``conv-problem``).
        """
        return self.dispatch.kernel_for(a_shape, b_shape, problem)

    @api_boundary
    def build(self, timeout: float | None = None, *, strided: bool = False, family: bool = False,
              executor: Any = None) -> cache.Artifact:
        """Compile (or fetch from the cache) and load the main kernel, or with ``strided=True``
        (dgrad) the strided-dgrad kernel, or with ``family=True`` every family member and the
        1x1 route's Gemm family, in parallel (``executor``: a
        :class:`concurrent.futures.Executor`); ``timeout``: seconds before an nvcc is killed.

        Returns:
            The main (or strided) kernel's Artifact.

        Raises:
            BuildError: nvcc failed (the source and log are kept and named).
            NoDeviceError: no nvcc.
        """
        fam = self.dispatch.family
        if strided:
            if self.kind != "dgrad":
                raise ConfigError("only dgrad has a strided kernel", anchor="conv-config")
            return fam.kernel("sm80", True).build(timeout)
        if not family:
            return fam.main.build(timeout)
        fam.build(self.kernels() + (self.gemm_route.kernels() if self.gemm_route else []), timeout, executor)
        return fam.main.artifact  # type: ignore[return-value]

    def source_for(self, *, strided: bool = False) -> str:
        """The ``.cu`` text of the main kernel, or (dgrad, ``strided=True``) the strided one."""
        return self.dispatch.family.kernel("sm80", True).source if strided else self.source

    def info(self) -> dict:
        """The built main kernel's info (plan, ABI, ``sizeof`` of the epilogue storage, stages)."""
        main = self.dispatch.family.main
        if main.library is None:
            main.build()
        return main.library.info  # type: ignore[union-attr]

    # ---- running ------------------------------------------------------------------------------------

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
            (N,) or () (NOTE [Implicit GEMM of a convolution] in :mod:`evtc.runtime.conv_problem`).

        A kernel the cache lacks is built first, after every argument is checked (NOTE [Checks
        before builds]).

        Raises:
            ArgumentError: a bad argument or problem, named (problem limits: anchor
                ``conv-problem``).
            LaunchError: CUDA reported an error.
        """
        return self.dispatch.run(a, b, kwargs, problem, out, stream)

    # the family's kernels by (arch, strided) key, and the kernel a problem runs on (tests, benchmarks)
    @property
    def _kernels(self) -> dict[tuple, ConvKernel]:
        return self.dispatch.family._kernels

    def _kernel(self, arch: str, strided: bool, member: str | None = None) -> ConvKernel:
        return self.dispatch.family.kernel(arch, strided, member)

    def _route(self, spec, a: Any = None, b: Any = None, out: Any = None) -> ConvKernel:
        return self.dispatch.family.route(spec, a, b)

    def __repr__(self) -> str:
        return (f"<evtc.Conv {self.name} {self.dims}-D {self.kind} {self.arch} a={self.a} "
                f"tile={'x'.join(map(str, self.config.tile))}>")

    def describe(self) -> str:
        """The IR, the plan and the configuration, as text."""
        return f"{self.graph}\n{self.plan}\nconfig: {json.dumps(self.config.to_json())}\n"
