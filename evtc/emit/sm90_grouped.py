"""The sm90 grouped-GEMM emitter: Graph + grouped Plan -> the ``.cu`` of a pointer-array kernel.

Input: the Graph after passes and its sm90 plan with ``config.grouped`` (planned as any sm90
epilogue: the same visitor tree, one shared-memory plan for every group, with the pointer-array
collective's tensor maps in its ``SharedStorage``). Output: ``codegen_templates/sm90/grouped.cu.j2``
rendered: the GEMM template with the pointer-array mainloop, schedule and collective epilogue, the
group table and its setup kernel (NOTE [The grouped kernel] in :mod:`evtc.grouped`).

What differs from :func:`evtc.emit.sm90.emit_sm90` is only where per-group values come from:
C and D through the collective's per-group pointers and strides, each row broadcast
(``bias[e, n]``) and column broadcast (``weight[token]``) through a per-group pointer array
(CUTLASS's ``Sm90RowBroadcast`` / ``Sm90ColBroadcast`` with a pointer element type,
``IsArrayOfPointers``), scalars by pointer indexed by the group (``Sm90ScalarBroadcast``'s batch
stride), other M x N tensors register-direct through per-group pointers (evtc's
``Sm90AuxLoadGrouped`` / ``Sm90AuxStoreGrouped``). :func:`evtc.grouped.check_grouped_graph`
refuses the rest (reductions) before anything is planned.
"""

from __future__ import annotations

from typing import Any

from evtc.abi import grouped_abi_fields
from evtc.emit import common
from evtc.emit.core import NodeTable
from evtc.emit.sm90 import GROUPED_KERNEL_SCHEDULES, gemm_render_args, node_table
from evtc.ir.graph import Graph
from evtc.ir.nodes import AuxLoad, ColBroadcast, ReduceOp, Reduction, RowBroadcast, Source, Store
from evtc.lower import Role, Visitor
from evtc.plan.model import Plan

__all__ = ["emit_sm90_grouped", "group_vectors", "reduction_shape"]


def group_vectors(graph: Graph, plan: Plan) -> list[tuple[str, str, str]]:
    """(name, kind, C++ element type) of every tensor the group table holds a pointer per group
    for, after its fixed nine arrays, in the ABI's order: row broadcasts (``"row"``), column
    broadcasts (``"col"``), and the M x N inputs and outputs that are not the collective's C or D
    (``"mn"``: register-direct aux loads and stores)."""
    out = []
    for leaf in graph.used_inputs:
        if isinstance(leaf, RowBroadcast):
            out.append((leaf.name, "row", leaf.dtype.cutlass))
        elif isinstance(leaf, ColBroadcast):
            out.append((leaf.name, "col", leaf.dtype.cutlass))
        elif isinstance(leaf, (Source, AuxLoad)) and leaf.name != plan.c_slot:
            out.append((leaf.name, "mn", leaf.dtype.cutlass))
    for o in graph.outputs:
        if isinstance(o, Store) and o.name != plan.d_slot:
            out.append((o.name, "mn", o.dtype.cutlass))
        elif isinstance(o, Reduction):  # NOTE [Reductions in the grouped kernel]
            out.append((o.name, {1: "red_row", 0: "red_col", None: "red_scalar"}[o.dim], "float"))
    return out


def reduction_shape(out: Reduction, T: int, E: int, N: int) -> tuple[int, ...]:
    """The shape of a grouped kernel's f32 reduction output (NOTE [Reductions in the grouped
    kernel]): a row reduction one value per token (T,), a column reduction one row per group
    (E, N), a scalar reduction one value per group (E,)."""
    return (T,) if out.dim == 1 else (E, N) if out.dim == 0 else (E,)


def _grouped_table(plan: Plan, vectors: list[tuple[str, str, str]]) -> NodeTable:
    base = node_table(plan)
    index = {name: k for k, (name, _, _) in enumerate(vectors)}

    def decisions(v: Visitor) -> dict[str, Any]:
        x = base.decisions(v)
        if v.role in (Role.ROW, Role.COL, Role.AUX_LOAD, Role.AUX_STORE, Role.GLU_STORE) and v.node.name in index:
            x = {**x, "direct": False, "group_array": f"table.vector[{index[v.node.name]}]"}
        elif v.role.is_reduction and v.node.name in index:
            x = {**x, "group_array": f"table.vector[{index[v.node.name]}]",
                 "identity_code": {ReduceOp.SUM: 0, ReduceOp.MAX: 1, ReduceOp.MIN: 2}[v.node.op]}
        return x

    return NodeTable(base.template, base.evt, base.topo, decisions)


def emit_sm90_grouped(graph: Graph, plan: Plan, *, name: str | None = None) -> str:
    """The ``.cu`` source of the grouped kernel of ``graph`` planned by ``plan``.

    Args:
        graph: the epilogue after passes (checked by :func:`evtc.grouped.check_grouped_graph`).
        plan: its sm90 plan with ``config.grouped`` (with the visitor tree).
        name: kernel name used in comments and the info JSON (default: the graph's name).

    Returns:
        The source text; deterministic.

    Raises:
        ValueError: ``plan`` is not a grouped sm90 plan with a D slot.
    """
    root = getattr(plan.tree, "root", None)
    gated = getattr(getattr(root, "op", None), "role", None) is Role.GLU_STORE  # (its output: a group vector)
    if plan.arch != "sm90" or plan.tree is None or not plan.config.grouped or (plan.d_slot is None and not gated):
        raise ValueError("emit_sm90_grouped needs a grouped sm90 plan with its visitor tree and a D slot (or a "
                         "gated store)")
    cfg = plan.config
    vectors = group_vectors(graph, plan)
    values = gemm_render_args(graph, plan, name=name, fields=grouped_abi_fields(graph),
                              table=_grouped_table(plan, vectors))
    c_input = graph.input(plan.c_slot) if plan.c_slot else None
    values.update(
        kernel_schedule=GROUPED_KERNEL_SCHEDULES[(cfg.schedule, bool(cfg.fast_accum and plan.operands[0].is_fp8))],
        epilogue_policy="cutlass::epilogue::Sm90PtrArrayTmaWarpSpecialized<StagesC, StagesD, FragmentSize, "
                        "ReuseSmemC, DelayTmaStore, 2>",
        collective_stride_c="StrideC*",
        collective_stride_d="StrideD*",
        c_ptr="table.ptr_C" if c_input is not None else "nullptr",
        c_stride="table.dC",
        d_ptr="table.ptr_D" if plan.d_slot else "nullptr",
        d_stride="table.dD",
        c_input=c_input.name if c_input is not None else None,
        d_output=plan.d_slot,
        group_vectors=vectors,
    )
    return common.render("sm90/grouped.cu.j2", **values)
