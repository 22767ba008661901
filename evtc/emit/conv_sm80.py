"""The sm80 convolution emitter: Graph + Sm80Plan -> a CUDA C++ source of the fused implicit-GEMM
convolution (CUTLASS 2.x mainloop, evtc's visitor-epilogue kernel).

Input: the Graph after passes, its :class:`~evtc.plan.sm80.Sm80Plan` (from
:func:`evtc.plan.conv.plan_conv`: one kernel variant with 16-byte accesses), the kind and spatial
dimensions, and for strided dgrad the coordinate arithmetic of its loads and stores. Output:
the ``.cu`` text, from ``codegen_templates/sm80/conv.cu.j2``.

The visitor tree is printed as for the sm80 GEMM (:mod:`evtc.emit.sm80`'s node table, the role
macros of ``codegen_templates/sm80/nodes.j2``); the kernel is
``evtc::conv::ImplicitGemmConvolutionWithVisitor`` (``include/evtc/sm80_conv.hpp``) over CUTLASS's
``DefaultConv{2,3}d{Fprop,Dgrad,Wgrad}`` mainloop. For 2-D strided dgrad, the kernel is
``evtc::conv::ImplicitGemmConvolutionStridedDgradWithVisitor`` and the visitors that address rows
of the output (aux loads and stores, column broadcasts, row reductions) are evtc's remapping
ones, with masks in front of the other reductions (NOTE [Strided dgrad rows] in the header).
"""

from __future__ import annotations

from typing import Any

from evtc.abi import ABI_VERSION, conv_abi_fields
from evtc.emit import common
from evtc.emit.conv_sm90 import conv_words
from evtc.emit.core import NodeTable, TreeEmitter
from evtc.emit.sm80 import _c_gemm_shape, node_table, reduction_init
from evtc.ir.graph import Graph
from evtc.ir.nodes import Reduction
from evtc.ir.printer import print_graph
from evtc.lower import Role, Visitor
from evtc.plan.sm80 import EPILOGUE_STAGES, Sm80Plan

__all__ = ["DEFAULT_KERNELS", "emit_conv_sm80"]

#: CUTLASS's default conv kernels: (header, struct) per (dims, kind)
DEFAULT_KERNELS = {
    (2, "fprop"): ("default_conv2d_fprop", "DefaultConv2dFprop"),
    (2, "dgrad"): ("default_conv2d_dgrad", "DefaultConv2dDgrad"),
    (2, "wgrad"): ("default_conv2d_wgrad", "DefaultConv2dWgrad"),
    (3, "fprop"): ("default_conv3d_fprop", "DefaultConv3dFprop"),
    (3, "dgrad"): ("default_conv3d_dgrad", "DefaultConv3dDgrad"),
    (3, "wgrad"): ("default_conv3d_wgrad", "DefaultConv3dWgrad"),
}


def _mainloop(kind: str, dims: int, strided_dgrad: bool) -> tuple[str, str, str]:
    """(iterator algorithm, stride support, kernel kind) of CUTLASS's default kernel to take the
    mainloop from. The optimized iterators everywhere but strided dgrad: 2-D strided dgrad is
    CUTLASS's strided-dgrad kernel (optimized iterators; the CTA tiles walk the filter's stride
    phases), 3-D strided dgrad the analytic iterator that predicates the taps of each row (the only
    3-D one with strides)."""
    alg = "cutlass::conv::IteratorAlgorithm::"
    sup = "cutlass::conv::StrideSupport::"
    if kind == "dgrad" and strided_dgrad:
        if dims == 2:
            return alg + "kOptimized", sup + "kStrided", "strided"
        return alg + "kAnalytic", sup + "kStrided", "plain"
    if kind == "wgrad":
        return alg + "kOptimized", sup + "kStrided", "plain"
    return alg + "kOptimized", sup + "kUnity", "plain"


def emit_conv_sm80(graph: Graph, plan: Sm80Plan, *, kind: str, dims: int, strided_dgrad: bool = False,
                   fast_divmod: tuple[bool, bool] = (True, True), name: str | None = None) -> str:
    """The ``.cu`` source of a fused sm80 convolution.

    Args:
        graph: the epilogue after passes.
        plan: its Sm80Plan (one variant), from :func:`evtc.plan.conv.plan_conv`.
        kind: ``fprop``, ``dgrad`` or ``wgrad``.
        dims: 2 or 3.
        strided_dgrad: the kernel of dgrad with stride > 1.
        fast_divmod: 2-D strided dgrad: (aux loads, stores) map rows to pixels with
            ``cutlass::FastDivmod`` (True) or plain division.
        name: kernel name used in comments and the info JSON (default: the graph's name).

    Returns:
        The source text; deterministic.
    """
    if plan.arch != "sm80" or plan.tree is None or len(plan.variants) != 1:
        raise ValueError("emit_conv_sm80 needs an sm80 plan of one variant with its visitor tree")
    variant = plan.variants[0]
    algorithm, stride_support, kernel_kind = _mainloop(kind, dims, strided_dgrad)
    remap = kernel_kind == "strided"
    table = node_table(plan)
    if remap:
        table = strided_dgrad_table(plan, table, fast_divmod)
    em = TreeEmitter(table)
    root = em.declare(plan.tree.root)
    fusion_args = em.arguments(plan.tree.root, 2, end=";")
    cfg = plan.config
    a, b = plan.operands
    fields = conv_abi_fields(graph)
    conv = {"kind": kind, "dims": dims, "strided_dgrad": strided_dgrad, "fast_divmod": list(fast_divmod) if remap else None}
    info = {"abi_version": ABI_VERSION, "name": name or graph.name, "arch": "sm80", "conv": conv,
            "plan": plan.to_json(), "abi": [f.to_json() for f in fields], "ir": print_graph(graph)}
    reductions = [reduction_init(plan, o) for o in graph.outputs if isinstance(o, Reduction)]
    header, default = DEFAULT_KERNELS[(dims, kind)]
    return common.render(
        "sm80/conv.cu.j2",
        name=name or graph.name,
        kind=kind,
        dims=dims,
        strided_dgrad=strided_dgrad,
        **conv_words(kind, dims),
        **_kernel_types(plan, remap),
        problem_size_type="cutlass::conv::Conv2dProblemSize" if dims == 2 else "cutlass::conv::Conv3dProblemSize",
        default_header=header,
        default_kernel=default,
        iterator_algorithm=algorithm,
        stride_support=stride_support,
        # the 2-D default kernels take the operands' access widths; the 3-D ones fix 16 bytes
        alignment_args=", kAlignmentAB, kAlignmentAB" if dims == 2 else "",
        strided_geometry=remap,
        ir_lines=print_graph(graph).rstrip("\n").splitlines(),
        plan_lines=str(plan).rstrip("\n").splitlines(),
        element_a=a.cutlass,
        element_b=b.cutlass,
        element_output=plan.thread_map_element.cutlass,
        threadblock_shape=_c_gemm_shape(cfg.tile),
        warp_shape=_c_gemm_shape(plan.warp_tile),
        instruction_shape=_c_gemm_shape(plan.instruction_shape),
        epilogue_stages=EPILOGUE_STAGES,
        stages=variant.stages,
        alignment_ab=variant.alignment_ab,
        epilogue_access=variant.epilogue_access,
        decls=em.decls,
        root=root,
        fusion_args=fusion_args,
        scratch=[r for r in reductions if r.convert_to is not None],
        reductions=reductions,
        epilogue_smem_bytes=variant.epilogue_smem_bytes,
        smem_capacity=plan.smem_capacity,
        fields=fields,
        abi_version=ABI_VERSION,
        info_json=common.c_string(common.json_compact(info)),
    )


def _kernel_types(plan: Sm80Plan, remap: bool) -> dict[str, str]:
    """The kernel and threadblock swizzle types: the strided-dgrad ones (``remap``) or the plain."""
    if remap:
        return {"kernel_type": "evtc::conv::ImplicitGemmConvolutionStridedDgradWithVisitor<typename DefaultKernel::Mma, "
                               "Epilogue, ThreadblockSwizzle>",
                "swizzle": "cutlass::conv::threadblock::StridedDgradIdentityThreadblockSwizzle<1>"}
    return {"kernel_type": "evtc::conv::ImplicitGemmConvolutionWithVisitor<typename DefaultKernel::Mma, Epilogue, "
                           "ThreadblockSwizzle, kConvOp, ConvProblemSize>",
            "swizzle": f"cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<{plan.swizzle_width}>"}


def strided_dgrad_table(plan: Sm80Plan, table: NodeTable, fast_divmod: tuple[bool, bool]) -> NodeTable:
    """The node table of the 2-D strided-dgrad kernel: the sm80 table's decisions with each
    row-mapping visitor's divmod choice (``fast``: aux loads and column broadcasts take
    ``fast_divmod[0]``, aux stores and row reductions ``fast_divmod[1]``), printed by
    ``codegen_templates/sm80/conv_strided_dgrad_nodes.j2``."""
    loads, stores = fast_divmod

    def decisions(v: Visitor) -> dict[str, Any]:
        x = dict(table.decisions(v))
        if v.role in (Role.AUX_LOAD, Role.COL):
            x["fast"] = loads
        elif v.role in (Role.AUX_STORE, Role.ROW_REDUCTION):
            x["fast"] = stores
        return x

    return NodeTable("sm80/conv_strided_dgrad_nodes.j2", table.evt, table.topo, decisions)
