"""One epilogue's stages, trace -> passes -> plan -> emit -> compile, each memoized once.

Input: an epilogue in any accepted form, operand dtypes; per kernel a
:class:`~evtc.family.spec.KernelSpec`. Output: :class:`Pipeline` (the traced graph and the
post-pass graph per arch) and :class:`Kernel` (one kernel's plan, source and library).
"""

from __future__ import annotations

from typing import Callable, Mapping, TypeVar

from evtc.abi import kernel_abi_fields
from evtc.compiler import cache
from evtc.dtypes import DType
from evtc.errors import ArgumentError
from evtc.family.spec import KernelSpec
from evtc.frontend.epilogue import Epilogue
from evtc.ir.graph import Graph
from evtc.ir.printer import print_graph
from evtc.pipeline import memo
from evtc.plan import make_plan
from evtc.runtime.launch import KernelLibrary

__all__ = ["Kernel", "Pipeline", "as_graph", "emit", "memoized"]

T = TypeVar("T")


def memoized(get: Callable[[], T | None], compute: Callable[[], T], put: Callable[[T], None]) -> T:
    """The value ``get`` finds, else ``compute``'s, stored with ``put``: the one way every stage
    reads and fills the construct memo (NOTE [The construct memo] in :mod:`evtc.pipeline.memo`)."""
    value = get()
    if value is None:
        value = compute()
        put(value)
    return value


def as_graph(epilogue: Epilogue | Graph | str, *, c: DType | None, d: DType) -> Graph:
    """The Graph of an epilogue given in any of the accepted forms.

    Raises:
        ArgumentError (a TypeError): ``epilogue`` is none of a Graph, an Epilogue, a string or a
            callable.
        EvtcError: trace and parse errors, located at the epilogue's line.
    """
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
    raise ArgumentError(f"can't make an epilogue of {type(epilogue).__name__} {epilogue!r:.40}",
                        hint="pass an @evtc.epilogue function, an expression such as \"D = relu(acc + bias[n])\", "
                             "or an evtc.Graph")


def emit(graph: Graph, plan) -> str:
    """The CUDA source of a GEMM kernel for ``graph`` and its ``plan`` (sm90 or sm80)."""
    if plan.arch == "sm90" and plan.config.grouped:
        from evtc.emit.sm90_grouped import emit_sm90_grouped

        return emit_sm90_grouped(graph, plan)
    if plan.arch == "sm90":
        from evtc.emit.sm90 import emit_sm90

        return emit_sm90(graph, plan)
    from evtc.emit.sm80 import emit_sm80

    return emit_sm80(graph, plan)


class Pipeline:
    """One epilogue's build path: traced once, its passes run once per arch, then one
    :class:`Kernel` per configuration.

    Args:
        epilogue: an ``@evtc.epilogue`` function, a Graph, or a textual expression.
        a, b: operand dtypes.
        c, d: the source C's dtype (None: the epilogue's) and the default output dtype.

    Attributes:
        traced: the traced Graph (before passes). name: its name.
        memo: the construct memo of the traced graph, or None when off.
    """

    def __init__(self, epilogue: Epilogue | Graph | str, *, a: DType, b: DType, c: DType | None, d: DType) -> None:
        self.a, self.b = a, b
        self.traced = as_graph(epilogue, c=c, d=d)
        self.name = self.traced.name
        self.memo = memo.memo_for(self.traced)
        self._graphs: dict[str, Graph] = {}

    def graph_for(self, arch: str) -> Graph:
        """The epilogue after passes, legalized for ``arch``."""
        g = self._graphs.get(arch)
        if g is None:
            def passes() -> Graph:
                from evtc import passes

                return passes.run(self.traced, arch)

            m = self.memo
            g = self._graphs[arch] = memoized(lambda: m.graph(arch) if m else None, passes,
                                              lambda v: m.put_graph(arch, v) if m else None)
        return g

    def kernel(self, spec: KernelSpec, policy: str = "evtc", rank: int = 0, fixed: Mapping | None = None) -> Kernel:
        """A new :class:`Kernel` of ``spec`` (planned now, emitted on first use)."""
        return Kernel(self, spec, policy, rank, fixed)


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

    def __init__(self, pipeline: Pipeline, spec: KernelSpec, policy: str = "evtc", rank: int = 0,
                 fixed: Mapping | None = None) -> None:
        self.spec = spec
        self.arch = spec.arch
        self.name = pipeline.name
        base = pipeline.graph_for(spec.arch)
        m = self._memo = pipeline.memo
        # what the plan and source depend on besides the traced graph (the memo's key)
        self._material = {"arch": spec.arch, "a": pipeline.a.name, "b": pipeline.b.name,
                          "config": spec.config.to_json(), "policy": policy, "rank": rank, "fixed": dict(fixed or {})}

        def plan():
            graph = base
            if spec.config.swap_ab:
                from evtc.family.swap_ab import transpose

                graph = transpose(graph)
            return graph, make_plan(graph, spec.arch, a=pipeline.a, b=pipeline.b, config=spec.config,
                                    policy=policy, rank=rank, fixed=fixed or {})

        self.graph, self.plan = memoized(lambda: m.plan(base, self._material) if m else None, plan,
                                         lambda v: m.put_plan(base, self._material, *v) if m else None)
        self.config = self.plan.config
        self._source: str | None = None
        self.library: KernelLibrary | None = None
        self.artifact: cache.Artifact | None = None

    @property
    def source(self) -> str:
        """The emitted ``.cu`` (emitted on first use, or read from the construct memo)."""
        if self._source is None:
            m = self._memo
            self._source = memoized(lambda: m.source(self._material) if m else None,
                                    lambda: emit(self.graph, self.plan),
                                    lambda v: m.put_source(self._material, v) if m else None)
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
        library.verify(fields=kernel_abi_fields(self.graph, self.arch, grouped=self.config.grouped),
                       ir=print_graph(self.graph), name=self.name, arch=self.arch)
        self.library, self.artifact = library, art

    def build(self, timeout: float | None = None) -> cache.Artifact:
        """Compile (or fetch from the cache) and load.

        Raises:
            BuildError: nvcc failed (the source and log are kept and named).
        """
        art = cache.build(self.source, arch=self.arch, name=self.job_name, timeout=timeout)
        self.load(art)
        return art
