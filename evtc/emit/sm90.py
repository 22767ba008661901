"""The sm90 emitter: Graph + Plan -> a CUDA C++ source of the whole fused GEMM.

Input: the Graph after passes and its sm90 :class:`~evtc.plan.model.Plan` (which carries the
visitor tree). Output: the ``.cu`` text, from ``codegen_templates/sm90/gemm.cu.j2``
(which extends ``sm90/kernel_base.cu.j2``, shared with the conv kernel).

Everything the template prints is computed here from the plan; nothing is re-derived (the
stage counts, epilogue tile, slots and per-aux TMA/direct choices are the plan's). The visitor
tree becomes one ``using`` per visitor (``N<k>_<kind>``), one per ``Sm90EVT`` composition
(``EVT<k>``) and one per topological region (``Topo<k>``), declared children first. The same
tree, walked the same way, gives the nested initializer of ``FusionCallbacks::Arguments``,
each positional field commented with the visitor it initializes.
"""

from __future__ import annotations

from typing import Any

from evtc import ops
from evtc.abi import ABI_VERSION, abi_fields
from evtc.emit import common
from evtc.emit.core import NodeTable, TreeEmitter
from evtc.ir.graph import Graph
from evtc.ir.nodes import QUANT_CONVENTIONS, ReduceOp
from evtc.ir.printer import print_graph
from evtc.lower import Role, Visitor
from evtc.plan.model import Plan

FUSION = "cutlass::epilogue::fusion"
STRIDE_ROW_MAJOR = "cute::Stride<int64_t, cute::_1, int64_t>"  # row-major M x N, batched
STRIDE_COL_MAJOR = "cute::Stride<cute::_1, int64_t, int64_t>"  # column-major (swap-AB's D^T)


def mn_stride(plan: Plan) -> str:
    """The CuTe stride type of the kernel's M x N tensors: column-major under swap-AB."""
    return STRIDE_COL_MAJOR if plan.config.swap_ab else STRIDE_ROW_MAJOR


def mn_stride_args(plan: Plan, name: str) -> str:
    """The stride initializer of M x N tensor ``name`` from its ``evtc_args_t`` fields."""
    if plan.config.swap_ab:
        return f"{{cute::_1{{}}, args.ld_{name}, args.bs_{name}}}"
    return f"{{args.ld_{name}, cute::_1{{}}, args.bs_{name}}}"

# (register, shuffle/smem, global, atomic) reduce functors: the global one for the workspace's final
# reductions, the atomic one for scalar reductions (Sm90ScalarReduction has only an atomic
# implementation) and atomic row/column max and min (NOTE [Atomic row and column max])
REDUCE_FNS = {
    ReduceOp.SUM: ("cutlass::plus", "cutlass::plus", "cutlass::plus", "cutlass::atomic_add"),
    ReduceOp.MAX: ("cutlass::maximum", "cutlass::maximum", "cutlass::maximum", "cutlass::atomic_maximum"),
    ReduceOp.MIN: ("cutlass::minimum", "cutlass::minimum", "cutlass::minimum", "evtc::atomic_minimum"),
}

KERNEL_SCHEDULES = {
    ("cooperative", False): "cutlass::gemm::KernelTmaWarpSpecializedCooperative",
    ("pingpong", False): "cutlass::gemm::KernelTmaWarpSpecializedPingpong",
    ("cooperative", True): "cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum",
    ("pingpong", True): "cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum",
}
#: the pointer-array schedules of the grouped kernel, by (schedule, fp8 fast accumulation)
GROUPED_KERNEL_SCHEDULES = {
    ("cooperative", False): "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperative",
    ("pingpong", False): "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpong",
    ("cooperative", True): "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedCooperativeFP8FastAccum",
    ("pingpong", True): "cutlass::gemm::KernelPtrArrayTmaWarpSpecializedPingpongFP8FastAccum",
}
SCHEDULERS = {"persistent": "cutlass::gemm::PersistentScheduler", "streamk": "cutlass::gemm::StreamKScheduler",
              # NOTE [Batch-inner tile order] (codegen_templates/include/evtc/sm90_batch_inner.hpp)
              "batch_inner": "evtc::BatchInnerScheduler"}


#: the N extents of the sm90 WGMMA atoms CuTe's ``ss_op_selector`` (cute/arch/mma_sm90.hpp) picks
#: from by default: the largest of them that divides the tile's N, one WGMMA per atom
BASE_WGMMA_N = (8, 16, 32, 64, 96, 128, 192, 256)


def needs_extended_wgmma(tile_n: int) -> bool:
    """Whether a CTA tile ``tile_n`` columns wide needs ``CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED``
    for one WGMMA to span it.

    NOTE [Extended WGMMA shapes]: ``ss_op_selector`` considers the other multiples of 8 up to 256
    (24, 40, ..., 176, ..., 248; all legal ``wgmma.mma_async`` N extents, PTX ISA "Matrix shape")
    only under that macro. Without it a 128x176 tile took the largest default divisor, 16: eleven
    m64n16k16 WGMMAs per K step, each reading the 64-row A slice from shared memory again (the
    PTX of the emitted kernel, 2026-11-27). On the H100 that tile ran 2.2-2.4x cuBLAS's time at
    1024-2048 x 14336 x 4096 with either schedule (Nsight Compute: "Mem Busy" 93 % against 37 %
    compute throughput) and 128x224 (seven m64n32k16) 1.5-2.4x (docs/performance.md, issue 13).
    With it (one m64n176k16 a K step, no spills in ptxas -v) the ping-pong 128x176 tile ran
    fc1 of the MLP block (+ bias + exact GELU) at 1.028-1.039x cuBLAS at 1024 x 14336 x 4096 and
    0.973-0.983 at 2048 rows (H100, 2026-11-27; every configuration checked against float64):
    the family's ``pp128x176`` (NOTE [The 128x176 ping-pong tile] in evtc/family/spec.py).
    evtc defines the macro in the GEMM source of such tiles only, so the kernels of the other
    tiles (every other default family member) keep their sources and cache keys. The conv kernels'
    160-wide members (five m64n32k16 a K step: the PTX of ``coop160``, 2026-11-27) are left as
    they were measured until they are measured with it."""
    base = max((n for n in BASE_WGMMA_N if tile_n % n == 0), default=0)
    best = max((n for n in range(8, 257, 8) if tile_n % n == 0), default=0)
    return best > base


def cxx_shape(*dims: int) -> str:
    return "cute::Shape<" + ", ".join(f"cute::_{d}" for d in dims) + ">"


def uses_tile_reduction(plan: Plan) -> bool:
    """Whether the plan has a row or column reduction: evtc's derived visitors of
    ``evtc/sm90_reductions.hpp`` (through the workspace or atomic), which its source (kernel or
    plugin fragment) must include."""
    return any(v.role in (Role.ROW_REDUCTION, Role.COL_REDUCTION) for v in plan.tree.visitors())


def reduction_is_atomic(plan: Plan, name: str) -> bool:
    """Whether reduction output ``name`` is reduced by atomics into the output (the plan's
    ``atomic`` mode), which the launch must first fill with the identity (initialize_workspace)."""
    b = plan.buffer(name)
    return b is not None and b.mode == "atomic"


def node_table(plan: Plan) -> NodeTable:
    """The sm90 node table: ``codegen_templates/sm90/nodes.j2`` with the plan's decisions."""
    shares = dict(plan.shares)

    def decisions(v: Visitor) -> dict[str, Any]:
        n = v.node
        if v.role in (Role.AUX_LOAD, Role.AUX_STORE):
            mode, stages = plan.aux_mode(n.name)
            return {"mode": mode, "stages": stages, "stride": mn_stride(plan), "host": shares.get(n.name),
                    "stride_args": mn_stride_args(plan, n.name),
                    # register-direct accesses are predicated per vector on its first element: the
                    # unaligned variant reads and writes one element at a time
                    "alignment": 1 if plan.config.unaligned else None}
        if v.role is Role.ROW:
            return {"direct": plan.aux_mode(n.name)[0] == "direct"}
        if v.role is Role.IMM:
            return {"bits": common.float_bits(n.value), "value": repr(n.value)}
        if v.role in (Role.COMPUTE, Role.KEEP):
            return {"functor": ops.get(n.op).functor}
        if v.role is Role.GLU_STORE:
            act = n.value.attr("act")
            return {"functor": ops.get(act).functor, "act": act, "tile": plan.config.tile[:2],
                    "epi": plan.epilogue_tile}
        if v.role is Role.GROUP_SCALE:
            q = n.value  # the group_quant: its dtype is D's fp8 type
            return {"convention": QUANT_CONVENTIONS.index(n.convention), "qmax": int(q.dtype.max)}
        if v.role.is_reduction:
            reg, shfl, gmem, atomic = REDUCE_FNS[n.op]
            return {"reg": reg, "shfl": shfl, "gmem": gmem, "atomic": atomic,
                    "is_atomic": reduction_is_atomic(plan, n.name), "identity": common.float_literal(n.op.identity)}
        return {}

    return NodeTable("sm90/nodes.j2", f"{FUSION}::Sm90EVT", f"{FUSION}::Sm90TopologicalVisitor", decisions)


def buffer_probes(plan: Plan) -> list[tuple[str, str]]:
    """(plan layout label, C++ expression of the member) of every buffer that owns shared memory
    (see :func:`evtc.plan.sm90.shared_storage` for the labels)."""
    from evtc.plan.sm90 import SLOT_C, SLOT_D, aux_label, row_label

    probes = []
    if plan.c_slot is not None:
        probes.append((SLOT_C, "s.tensors.collective.smem_C"))
    probes.append((SLOT_D, "s.tensors.collective.smem_D"))
    owners = {(b.role, b.name) for b in plan.buffers if b.mode in ("tma", "smem", "packed") and b.role not in ("C", "D")}
    for path, t in plan.tree.walk():
        v = t.op
        if (v.role.spec.buffer, v.name) not in owners or v.node is plan.tree.c_input:
            continue
        expr = "s.tensors.thread"
        for i in path:
            expr = f"cute::get<{i}>({expr})"
        if v.role is Role.ROW:
            probes.append((row_label(v.name), f"{expr}.smem"))
        elif v.role.is_aux:
            probes.append((aux_label(v.name), f"{expr}.smem_aux"))
    return probes


def _share_wrapper(plan: Plan, root_alias: str) -> tuple[str, str]:
    """The ``FusionCallbacks`` type: the tree itself, or wrapped by ``evtc::Sm90SmemShare``, which
    points each shared aux store at its aux load's buffer (NOTE [Aux buffer sharing])."""
    if not plan.shares:
        return root_alias, ""
    paths = plan.tree.paths()

    def seq(p: tuple[int, ...]) -> str:
        return "cute::seq<" + ", ".join(map(str, p)) + ">"

    pairs = ", ".join(f"evtc::SharePair<{seq(paths[(Role.AUX_LOAD, ld)])}, {seq(paths[(Role.AUX_STORE, st)])}>"
                      for st, ld in plan.shares)
    note = "; ".join(f"{st} lives in {ld}'s buffer" for st, ld in plan.shares)
    return f"evtc::Sm90SmemShare<{root_alias}, {pairs}>", note


def emit_sm90(graph: Graph, plan: Plan, *, name: str | None = None) -> str:
    """The ``.cu`` source of ``graph`` planned by ``plan`` for sm90.

    Args:
        graph: the epilogue after passes.
        plan: its sm90 plan (with the visitor tree).
        name: kernel name used in comments and the info JSON (default: the graph's name).

    Returns:
        The source text; deterministic (the same graph and plan give the same bytes).
    """
    if plan.arch != "sm90" or plan.tree is None:
        raise ValueError(f"emit_sm90 needs an sm90 plan with its visitor tree, got {plan.arch}")
    return common.render("sm90/gemm.cu.j2", **gemm_render_args(graph, plan, name=name, fields=abi_fields(graph, "sm90")))


def gemm_render_args(graph: Graph, plan: Plan, *, name: str | None, fields, table: NodeTable | None = None) -> dict:
    """The render arguments of ``sm90/gemm.cu.j2`` (and the templates that extend it) for
    ``graph`` planned by ``plan``, with the C ABI ``fields``; ``table`` replaces the node table."""
    cfg = plan.config
    # the unaligned variant has void C and D: its root is D's register-direct aux store, whose
    # element type the collective takes for its (unused) D buffer
    d_output = graph.output(plan.d_slot) if plan.d_slot else None
    smem_element_d = (d_output or plan.tree.d_output).dtype.cutlass
    uses = {v.role for v in plan.tree.visitors()}
    return dict(
        **collective_epilogue_args(graph, plan, name=name, fields=fields, table=table),
        element_d=d_output.dtype.cutlass if d_output is not None else "void",
        smem_element_d=smem_element_d,
        tile_shape=cxx_shape(*cfg.tile),
        kernel_schedule=KERNEL_SCHEDULES[(cfg.schedule, bool(cfg.fast_accum and plan.operands[0].is_fp8))],
        tile_scheduler=SCHEDULERS[cfg.scheduler],
        stage_count=(f"cutlass::gemm::collective::StageCount<{cfg.stages}>" if cfg.stages else
                     "cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>"),
        d_ptr=f"static_cast<ElementD*>(args.p_{d_output.name})" if d_output is not None else "nullptr",
        d_stride=f"StrideD{mn_stride_args(plan, d_output.name)}" if d_output is not None else "StrideD{}",
        stride_mn=mn_stride(plan),
        swap_ab=cfg.swap_ab,
        stream_k=cfg.scheduler == "streamk",
        batch_inner=cfg.scheduler == "batch_inner",
        uses_reduction=any(r.is_reduction for r in uses),
        atomic_reduction=any(b.mode == "atomic" for b in plan.buffers),
        extended_wgmma=needs_extended_wgmma(cfg.tile[1]),
    )


def collective_epilogue_args(graph: Graph, plan: Plan, *, name: str | None, fields, extra_info: dict | None = None,
                             table: NodeTable | None = None) -> dict:
    """The render arguments every sm90 kernel template (GEMM and conv) shares: the visitor tree's
    declarations and arguments, the collective epilogue's parameters from the plan, the operand
    and C types, the comments (IR, plan), the C ABI fields and the info JSON (``extra_info``
    goes after its ``arch``); ``table`` replaces the node table of :func:`node_table`."""
    em = TreeEmitter(table or node_table(plan))
    root = em.declare(plan.tree.root)
    fusion_args = em.arguments(plan.tree.root, 3, end=",")
    fusion_root, fusion_note = _share_wrapper(plan, root)
    cfg = plan.config
    a, b = plan.operands
    c_input = graph.input(plan.c_slot) if plan.c_slot else None
    info = {
        "abi_version": ABI_VERSION,
        "name": name or graph.name,
        "arch": "sm90",
        **(extra_info or {}),
        # the tile order is a run-time argument: leave it out, so that it doesn't change the source
        "plan": {**plan.to_json(), "config": cfg.kernel_json("sm90")},
        "abi": [f.to_json() for f in fields],
        "ir": print_graph(graph),
    }
    return dict(
        name=name or graph.name,
        ir_lines=print_graph(graph).rstrip("\n").splitlines(),
        plan_lines=str(plan).rstrip("\n").splitlines(),
        element_a=a.cutlass,
        element_b=b.cutlass,
        alignment_a=16 // a.bytes,
        alignment_b=16 // b.bytes,
        element_c=c_input.dtype.cutlass if c_input is not None else "void",
        cluster_shape=cxx_shape(*cfg.cluster),
        epilogue_tile=cxx_shape(*plan.epilogue_tile),
        stages_c=plan.stages_c,
        stages_d=plan.stages_d,
        fragment_size=plan.fragment_size,
        reuse_smem_c="true" if plan.reuse_smem_c else "false",
        delay_tma_store="true" if plan.delay_tma_store else "false",
        copy_atom_c="SM90_U32x4_STSM_N" if plan.epilogue_tile[1] % 16 == 0 else "SM90_U32x2_STSM_N",
        decls=em.decls,
        root=fusion_root,
        root_note=fusion_note,
        epilogue_smem_bytes=plan.epilogue_smem_bytes,
        mainloop_stages=plan.mainloop_stages,
        fusion_args=fusion_args,
        c_ptr=f"static_cast<ElementC const*>(args.p_{c_input.name})" if c_input is not None else "nullptr",
        c_stride=f"StrideC{mn_stride_args(plan, c_input.name)}" if c_input is not None else "StrideC{}",
        fields=fields,
        abi_version=ABI_VERSION,
        info_json=common.c_string(common.json_compact(info)),
        buffer_probes=buffer_probes(plan),
        # evtc/sm90_reductions.hpp, only where used (the other kernels' cache keys don't hash it)
        tile_reduction=uses_tile_reduction(plan),
        # evtc/sm90_packed_store.hpp, likewise (NOTE [Stores into packed rows], evtc/plan/sm90_buffers.py)
        packed_store=any(b.mode == "packed" for b in plan.buffers),
        # evtc/sm90_group_quant.hpp, likewise (NOTE [Per-token-group quantization in the epilogue])
        group_quant=any(v.role is Role.GROUP_SCALE for v in plan.tree.visitors()),
        # evtc/sm90_glu_store.hpp, likewise (NOTE [The gated epilogue])
        glu_store=any(v.role is Role.GLU_STORE for v in plan.tree.visitors()),
    )
