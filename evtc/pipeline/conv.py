"""One conv kernel's stages above the graph: plan -> emit -> compile.

Input: a :class:`~evtc.pipeline.Pipeline` (the epilogue traced, its passes per arch), the kind of
convolution and its spatial dimensions, and per kernel an arch, a validated conv configuration
(:func:`evtc.plan.conv.conv_config`) and the planner's options. Output: :class:`ConvKernel`, the
kernel's :class:`~evtc.plan.conv.ConvPlan` (or sm80 plan), its emitted ``.cu`` and, once built,
its verified library.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

from evtc.abi import conv_abi_fields
from evtc.compiler import cache
from evtc.ir.graph import Graph
from evtc.ir.printer import print_graph
from evtc.pipeline.kernel import Kernel, Pipeline
from evtc.plan.config import GemmConfig
from evtc.plan.conv import plan_conv
from evtc.runtime.launch import KernelLibrary

__all__ = ["ConvKernel", "emit_conv"]


def emit_conv(graph: Graph, plan, *, kind: str, dims: int, strided: bool = False,
              fast_divmod: tuple[bool, bool] = (True, True)) -> str:
    """The CUDA source of a conv kernel for ``graph`` and its ``plan`` (sm90 or sm80; ``strided``:
    sm80's strided-dgrad kernel, whose row mapping ``fast_divmod`` chooses)."""
    if plan.arch == "sm90":
        from evtc.emit.conv_sm90 import emit_conv_sm90

        return emit_conv_sm90(graph, plan, kind=kind, dims=dims, kernel_smem_bound=plan.kernel_smem_bound)
    from evtc.emit.conv_sm80 import emit_conv_sm80

    return emit_conv_sm80(graph, plan, kind=kind, dims=dims, strided_dgrad=strided, fast_divmod=fast_divmod)


class ConvKernel:
    """One emitted conv kernel of a Conv: its arch, plan, source and (once built) library.

    Args:
        pipeline: the Conv's build path.
        kind, dims: the convolution.
        arch: the arch it is built for.
        config: its validated configuration.
        plan_args: the planner's options (``policy``, ``rank``, ``fixed``; sm90).
        strided: the strided-dgrad kernel.
        member: the family member it is (``base`` for the main kernel).
        fast_divmod: the strided-dgrad kernel's row mapping (:func:`emit_conv`).

    Attributes:
        graph: the epilogue after passes for ``arch``. plan, source: planned and emitted at
            construction. fields: its ABI.
        library, artifact: once built (:meth:`build`, :meth:`load`).
        launchers: a launcher per :class:`~evtc.runtime.conv_problem.ConvSpec`, made by the dispatch
            stage (:meth:`evtc.dispatch.conv.ConvFamily.launcher`); emptied when another library
            loads. lock: held while one is made.
    """

    def __init__(self, pipeline: Pipeline, *, kind: str, dims: int, arch: str, config: GemmConfig,
                 plan_args: Mapping | None = None, strided: bool = False, member: str = "base",
                 fast_divmod: tuple[bool, bool] = (True, True)) -> None:
        self.name = pipeline.name
        self.arch, self.strided, self.member, self.config = arch, strided, member, config
        self.graph = pipeline.graph_for(arch)
        self.plan = plan_conv(self.graph, arch, pipeline.a, pipeline.b, config, **dict(plan_args or {}))
        self.source = emit_conv(self.graph, self.plan, kind=kind, dims=dims, strided=strided, fast_divmod=fast_divmod)
        self.fields = conv_abi_fields(self.graph)
        self.library: KernelLibrary | None = None
        self.artifact: cache.Artifact | None = None
        self.launchers: dict = {}
        self.lock = threading.Lock()

    @property
    def job_name(self) -> str:
        return self.name if self.member == "base" else f"{self.name}[{self.member}]"

    # the GEMM kernel's build job and build (of ``source``, ``arch``, ``job_name``, then :meth:`load`)
    job = Kernel.job
    build = Kernel.build

    def load(self, art: cache.Artifact) -> None:
        """Load ``art`` (this kernel's build) and check it is this kernel (ABI, IR, name)."""
        if self.library is None or self.artifact is None or self.artifact.key != art.key:
            library = KernelLibrary(art.verified_library_path())
            library.verify(fields=self.fields, ir=print_graph(self.graph), name=self.name, arch=self.arch)
            self.library = library
            self.launchers = {}
        self.artifact = art
