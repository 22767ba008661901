"""The sm90 convolution emitter: Graph + Plan -> a CUDA C++ source of the fused implicit-GEMM
convolution (CUTLASS 3.x ``ConvUniversal``).

Input: the Graph after passes, its sm90 :class:`~evtc.plan.model.Plan` (from
:func:`evtc.plan.conv.plan_conv`: the GEMM planner with the conv kernel's one-warpgroup epilogue),
the kind (fprop, dgrad, wgrad) and spatial dimensions. Output: the ``.cu`` text, from
``codegen_templates/sm90/conv.cu.j2``.

The visitor tree, its Arguments initializer and every epilogue decision are printed exactly as
for the GEMM (:mod:`evtc.emit.sm90`'s node table, the same role macros of
``codegen_templates/sm90/nodes.j2``): the collective epilogue sees the flat GEMM problem
(NOTE [The conv epilogue sees a GEMM] in ``include/evtc/sm90_conv.hpp``), so its M x N tensors
have the GEMM's row-major stride. Only the mainloop (the conv ``CollectiveBuilder``), the
kernel (``ConvUniversal``), the problem shape and the workspace handling differ.
"""

from __future__ import annotations

from evtc.abi import CONV_OPERANDS, conv_abi_fields
from evtc.emit import common
from evtc.emit.sm90 import collective_epilogue_args, cxx_shape, mn_stride_args
from evtc.ir.graph import Graph
from evtc.plan.config import DECOMPOSITIONS
from evtc.plan.conv import kernel_kind
from evtc.plan.model import Plan

__all__ = ["CONV_OPERATORS", "MAPPING", "OUTPUT_LAYOUT", "conv_words", "emit_conv_sm90"]

CONV_OPERATORS = {"fprop": "cutlass::conv::Operator::kFprop", "dgrad": "cutlass::conv::Operator::kDgrad",
                  "wgrad": "cutlass::conv::Operator::kWgrad"}
#: the implicit GEMM of each kind, in words (NOTE [Implicit GEMM of a convolution])
MAPPING = {"fprop": "M = N*P*Q, N = K, K = C*R*S", "dgrad": "M = N*H*W, N = C, K = K*R*S",
           "wgrad": "M = K, N = R*S*C, K = N*P*Q"}
MAPPING_3D = {"fprop": "M = N*Z*P*Q, N = K, K = C*T*R*S", "dgrad": "M = N*D*H*W, N = C, K = K*T*R*S",
              "wgrad": "M = K, N = T*R*S*C, K = N*Z*P*Q"}
OUTPUT_LAYOUT = {"fprop": ("NPQK", "NZPQK"), "dgrad": ("NHWC", "NDHWC"), "wgrad": ("KRSC", "KTRSC")}
OPERAND_LAYOUT = {"x": ("NHWC", "NDHWC"), "dy": ("NPQK", "NZPQK"), "w": ("KRSC", "KTRSC")}


def _operand_comment(name: str, dims: int) -> str:
    return f"{name}, {OPERAND_LAYOUT[name][dims - 2]}"


def conv_words(kind: str, dims: int) -> dict[str, str]:
    """The template values that name a convolution, the same on both archs: its implicit GEMM in
    words, the output's and operands' layouts, CUTLASS's operator and layout tag."""
    an, bn, _ = CONV_OPERANDS[kind]
    return {"mapping": (MAPPING if dims == 2 else MAPPING_3D)[kind], "output_layout": OUTPUT_LAYOUT[kind][dims - 2],
            "operand_a": _operand_comment(an, dims), "operand_b": _operand_comment(bn, dims),
            "conv_operator": CONV_OPERATORS[kind],
            "layout_tag": "cutlass::layout::TensorNHWC" if dims == 2 else "cutlass::layout::TensorNDHWC"}


def emit_conv_sm90(graph: Graph, plan: Plan, *, kind: str, dims: int, kernel_smem_bound: int,
                   name: str | None = None) -> str:
    """The ``.cu`` source of a fused sm90 convolution.

    Args:
        graph: the epilogue after passes.
        plan: its sm90 plan (with the visitor tree), from :func:`evtc.plan.conv.plan_conv`.
        kind: ``fprop``, ``dgrad`` or ``wgrad``.
        dims: 2 or 3.
        kernel_smem_bound: the planner's bound of ``sizeof(ConvKernel::SharedStorage)`` (bytes),
            which the kernel ``static_assert``s.
        name: kernel name used in comments and the info JSON (default: the graph's name).

    Returns:
        The source text; deterministic (the same graph, plan and kind give the same bytes).
    """
    if plan.arch != "sm90" or plan.tree is None:
        raise ValueError(f"emit_conv_sm90 needs an sm90 plan with its visitor tree, got {plan.arch}")
    if plan.config.unaligned or plan.config.swap_ab:
        raise ValueError("the conv kernels have no unaligned or swap-AB variants")
    cfg = plan.config
    kernel = kernel_kind(cfg)  # nonpersistent, persistent, streamk or pingpong
    d_output = graph.output(plan.d_slot)
    return common.render(
        "sm90/conv.cu.j2",
        **collective_epilogue_args(graph, plan, name=name, fields=conv_abi_fields(graph),
                                   extra_info={"conv": {"kind": kind, "dims": dims}}),
        kind=kind,
        dims=dims,
        persistent=kernel != "nonpersistent",
        stream_k=kernel == "streamk",
        pingpong=kernel == "pingpong",
        split_k=cfg.split_k,
        decomposition=cfg.decomposition,
        decomposition_index=DECOMPOSITIONS.index(cfg.decomposition),
        **conv_words(kind, dims),
        element_d=d_output.dtype.cutlass,
        tile_shape=cxx_shape(*cfg.tile),
        mainloop_tile_shape=(f"cute::Shape<cute::_{cfg.tile[0]}, cute::Shape<cute::_{cfg.tile[1]}>, "
                             f"cute::Shape<cute::_{cfg.tile[2]}>>" if kind == "wgrad" else
                             f"cute::Shape<cute::_{cfg.tile[0]}, cute::_{cfg.tile[1]}, cute::Shape<cute::_{cfg.tile[2]}>>"),
        smem_capacity=plan.smem_capacity,
        kernel_smem_bound=kernel_smem_bound,
        d_ptr=f"static_cast<ElementD*>(args.p_{d_output.name})",
        d_stride=f"StrideD{mn_stride_args(plan, d_output.name)}",
    )
