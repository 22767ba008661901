"""The sm80 emitter: Graph + Sm80Plan -> a CUDA C++ source of the fused GEMM for Ampere.

Input: the Graph after passes and its :class:`~evtc.plan.sm80.Sm80Plan` (which carries the
visitor tree, already wrapped in the visitor of the output that stores D, and the kernel
variants). Output: the ``.cu`` text, from ``codegen_templates/sm80/gemm.cu.j2`` (which
extends ``sm80/kernel_base.cu.j2``, shared with the conv kernel).

The visitor tree becomes one ``using`` per visitor (``N<k>_<kind>``), one per ``Sm80EVT``
composition (``EVT<k>``) and one per topological region (``Topo<k>``), declared children first
inside ``Visitors<kEpilogueAccess>`` (the thread map, and so every type that depends on it,
differs per kernel variant). The same tree, walked the same way, gives the nested initializer of
``FusionCallbacks::Arguments``, each positional field commented with the visitor it
initializes. Everything else the template prints (variant requirements, reduction fills and
conversions) is a list computed here from the plan.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from evtc import ops
from evtc.abi import ABI_VERSION, abi_fields
from evtc.emit import common
from evtc.emit.core import NodeTable, TreeEmitter
from evtc.ir.axes import ReduceAxis
from evtc.ir.graph import Graph
from evtc.ir.nodes import ReduceOp, Reduction, RowBroadcast, Source
from evtc.ir.printer import print_graph
from evtc.lower import Role, Visitor
from evtc.plan.sm80 import EPILOGUE_STAGES, KernelVariant, Sm80Plan

TB = "cutlass::epilogue::threadblock"
STRIDE_MN = "cute::Stride<int64_t, cute::_1, int64_t>"  # row-major M x N, batched

# (register reduce functor, atomic reduce functor) per op (visitor_store.hpp's RegReduceFn and
# AtomicReduceFn); atomics on float: cutlass/functional.h, evtc::atomic_minimum in functors.hpp
REDUCE_FNS = {
    ReduceOp.SUM: ("cutlass::plus", "cutlass::atomic_add"),
    ReduceOp.MAX: ("cutlass::maximum", "cutlass::atomic_maximum"),
    ReduceOp.MIN: ("cutlass::minimum", "evtc::atomic_minimum"),
}
SWIZZLE_STREAMK = "cutlass::gemm::threadblock::ThreadblockSwizzleStreamK"


@dataclasses.dataclass
class Requirement:
    """One line of a variant's requirement: a C++ condition and what it checks."""

    code: str
    comment: str


@dataclasses.dataclass
class VariantText:
    """What the template prints for one kernel variant."""

    index: int
    name: str
    alignment_ab: int
    epilogue_access: int
    stages: int
    epilogue_smem_bytes: int
    why: str
    requirements: list[Requirement]


@dataclasses.dataclass
class ReductionInit:
    """One reduction output: where the kernel accumulates it and how it is initialised."""

    name: str
    target: str  # float* expression the visitor's atomics update
    count: str  # elements per batch
    batch_stride: str  # of target, in elements
    identity: str
    convert_to: str | None  # C++ element type to round the float workspace into, or None
    output: str  # the output pointer expression (for the conversion)
    output_batch_stride: str


def _c_gemm_shape(dims) -> str:
    return "cutlass::gemm::GemmShape<" + ", ".join(map(str, dims)) + ">"


def reduction_init(plan: Sm80Plan, r: Reduction) -> ReductionInit:
    """Where reduction ``r`` accumulates (its output, or a float workspace when its dtype is not
    f32) and how it is initialised and converted."""
    scratch = r.name in plan.scratch
    count = {"M": "args.M", "N": "args.N", None: "1"}[ReduceAxis.of(r.dim).extent]
    out = f"static_cast<{r.dtype.cutlass}*>(args.p_{r.name})"
    return ReductionInit(
        name=r.name,
        target=f"scratch.{r.name}" if scratch else f"static_cast<float*>(args.p_{r.name})",
        count=count,
        batch_stride=count if scratch else f"args.bs_{r.name}",
        identity=common.float_literal(r.op.identity),
        convert_to=r.dtype.cutlass if scratch else None,
        output=out,
        output_batch_stride=f"args.bs_{r.name}",
    )


def node_table(plan: Sm80Plan) -> NodeTable:
    """The sm80 node table: ``codegen_templates/sm80/nodes.j2`` with the plan's decisions."""

    def decisions(v: Visitor) -> dict[str, Any]:
        n = v.node
        if v.role.is_aux:
            return {"stride": STRIDE_MN, "is_source": isinstance(n, Source),
                    "stride_args": f"{{args.ld_{n.name}, cute::_1{{}}, args.bs_{n.name}}}"}
        if v.role is Role.IMM:
            return {"bits": common.float_bits(n.value), "value": repr(n.value)}
        if v.role in (Role.COMPUTE, Role.KEEP):
            return {"functor": ops.get(n.op).functor}
        if v.role.is_reduction:
            reg, atomic = REDUCE_FNS[n.op]
            init = reduction_init(plan, n)
            return {"reg": reg, "atomic": atomic, "target": init.target, "identity": init.identity,
                    "batch_stride": init.batch_stride}
        return {}

    return NodeTable("sm80/nodes.j2", f"{TB}::Sm80EVT", f"{TB}::Sm80TopologicalVisitor", decisions)


class _Variants:
    """The run-time requirements of the kernel variants."""

    def __init__(self, graph: Graph, plan: Sm80Plan) -> None:
        self.graph = graph
        self.plan = plan

    # ---- kernel variants ------------------------------------------------------------------------

    def requirements(self, v: KernelVariant) -> list[Requirement]:
        """The run-time conditions under which variant ``v`` accesses only elements inside the
        problem with aligned vectors (NOTE [Ragged shapes on sm80] in :mod:`evtc.plan.sm80`)."""
        a, b = self.plan.operands
        reqs: list[Requirement] = []
        if v.alignment_ab > 1:
            va = v.alignment_ab
            reqs.append(Requirement(f"args.K % {va} == 0", f"K: whole {va}-element vectors of A and B"))
            for op, dt in (("A", a), ("B", b)):
                reqs.append(Requirement(
                    f"is_aligned(args.p_{op}, {va * dt.bytes}) && args.ld_{op} % {va} == 0 && args.bs_{op} % {va} == 0",
                    f"{op}: base, row and batch strides"))
        if v.epilogue_access > 1:
            reqs.append(Requirement(f"args.N % {v.epilogue_access} == 0",
                                    f"N: whole {v.epilogue_access}-element epilogue accesses"))
        leaves = {n.name: n for n in self.graph.used_inputs}
        outs = {o.name: o for o in self.graph.outputs}
        for name, elems in v.vectors:
            if elems == 1:
                continue
            node = leaves.get(name) or outs[name]
            stride = "" if isinstance(node, RowBroadcast) else f" && args.ld_{name} % {elems} == 0"
            reqs.append(Requirement(
                f"is_aligned(args.p_{name}, {elems * node.dtype.bytes}){stride} && args.bs_{name} % {elems} == 0",
                f"{name}: {elems}-element vectors"))
        return reqs


def _variant_texts(em: _Variants, plan: Sm80Plan) -> list[VariantText]:
    return [VariantText(i, v.name, v.alignment_ab, v.epilogue_access, v.stages, v.epilogue_smem_bytes, v.why,
                        em.requirements(v)) for i, v in enumerate(plan.variants)]


def emit_sm80(graph: Graph, plan: Sm80Plan, *, name: str | None = None) -> str:
    """The ``.cu`` source of ``graph`` planned by ``plan`` for sm80.

    Args:
        graph: the epilogue after passes.
        plan: its :class:`~evtc.plan.sm80.Sm80Plan` (with the wrapped visitor tree).
        name: kernel name used in comments and the info JSON (default: the graph's name).

    Returns:
        The source text; deterministic (the same graph and plan give the same bytes).
    """
    if plan.arch != "sm80" or plan.tree is None:
        raise ValueError(f"emit_sm80 needs an sm80 plan with its visitor tree, got {plan.arch}")
    em = TreeEmitter(node_table(plan))
    root = em.declare(plan.tree.root)
    fusion_args = em.arguments(plan.tree.root, 4, end=",")
    cfg = plan.config
    a, b = plan.operands
    fields = abi_fields(graph, "sm80")
    info = {
        "abi_version": ABI_VERSION,
        "name": name or graph.name,
        "arch": "sm80",
        "plan": plan.to_json(),
        "abi": [f.to_json() for f in fields],
        "ir": print_graph(graph),
    }
    reductions = [reduction_init(plan, o) for o in graph.outputs if isinstance(o, Reduction)]
    variants = _variant_texts(_Variants(graph, plan), plan)
    return common.render(
        "sm80/gemm.cu.j2",
        name=name or graph.name,
        ir_lines=print_graph(graph).rstrip("\n").splitlines(),
        plan_lines=str(plan).rstrip("\n").splitlines(),
        element_a=a.cutlass,
        element_b=b.cutlass,
        element_output=plan.thread_map_element.cutlass,
        threadblock_shape=_c_gemm_shape(cfg.tile),
        warp_shape=_c_gemm_shape(plan.warp_tile),
        instruction_shape=_c_gemm_shape(plan.instruction_shape),
        epilogue_stages=EPILOGUE_STAGES,
        swizzle=SWIZZLE_STREAMK if cfg.scheduler == "streamk"
        else f"cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<{plan.swizzle_width}>",
        scheduler=cfg.scheduler,
        decls=em.decls,
        root=root,
        variants=variants,
        tried=variants[:-1],
        fallback=variants[-1],
        fusion_args=fusion_args,
        scratch=[r for r in reductions if r.convert_to is not None],
        reductions=reductions,
        epilogue_smem_bytes=plan.epilogue_smem_bytes,
        mainloop_stages=plan.mainloop_stages,
        smem_capacity=plan.smem_capacity,
        fields=fields,
        abi_version=ABI_VERSION,
        info_json=common.c_string(common.json_compact(info)),
    )
