"""Visitor roles: what each node of the visitor tree is, and what implements it per arch.

Input: IR nodes and the slot decisions. Output: a :class:`Role` per node, and :data:`ROLES`, the
one table that maps a role to its CUTLASS (or evtc) visitor on each arch and to the role of the
tensor it reads or writes in the :class:`~evtc.plan.model.Plan`.

The node kinds of the IR (:mod:`evtc.ir.nodes`) are what the user wrote; roles are what CUTLASS
runs. They differ in three places: the leaf in the collective's C slot is ``SRC`` whatever its
kind (the source C, or an aux load the sm90 planner promoted into an empty slot), the ``first``
compute that keeps an off-path output alive is ``KEEP``, and a :class:`ReduceAxis` picks one of
three reduction roles. Emitters print each role with the template macro of the same name
(``codegen_templates/<arch>/nodes.j2``); nothing else translates kinds to strings.
"""

from __future__ import annotations

import dataclasses
import enum

from evtc.ir import nodes as N
from evtc.ir.axes import ReduceAxis

__all__ = ["ROLES", "Role", "RoleSpec", "role_of", "reduction_role"]


class Role(str, enum.Enum):
    """The role of one visitor of the tree (its value names the template macro)."""

    ACC = "acc"
    SRC = "src"
    SCALAR = "scalar"
    ROW = "row"
    COL = "col"
    AUX_LOAD = "aux_load"
    IMM = "imm"
    COMPUTE = "compute"
    KEEP = "keep"
    AUX_STORE = "aux_store"
    ROW_REDUCTION = "row_reduction"
    COL_REDUCTION = "col_reduction"
    SCALAR_REDUCTION = "scalar_reduction"
    GROUP_SCALE = "group_scale"
    GLU_STORE = "glu_store"

    def __str__(self) -> str:
        return self.value

    def __format__(self, spec: str) -> str:
        return format(self.value, spec)

    @property
    def spec(self) -> "RoleSpec":
        return ROLES[self]

    @property
    def is_reduction(self) -> bool:
        return self in (Role.ROW_REDUCTION, Role.COL_REDUCTION, Role.SCALAR_REDUCTION)

    @property
    def is_aux(self) -> bool:
        """An M x N tensor a visitor of its own loads or stores (not through a collective slot)."""
        return self in (Role.AUX_LOAD, Role.AUX_STORE)


@dataclasses.dataclass(frozen=True)
class RoleSpec:
    """One row of the role table.

    Attributes:
        role: the role.
        kind: ``leaf`` (no operands), ``compute`` (operands in, a value out) or ``output``
            (passes its operand through and writes it, or a reduction of it, to memory).
        sm90: the visitor template on sm90 (``cutlass/epilogue/fusion/sm90_visitor_*.hpp``,
            evtc's ``include/evtc/sm90_visitors.hpp``).
        sm80: the visitor template on sm80 (``cutlass/epilogue/threadblock/fusion/visitor_*.hpp``).
        buffer: the role of its tensor in the Plan's buffer table, or None (no tensor).
        axis: the reduction axis of a reduction role.
    """

    role: Role
    kind: str
    sm90: str
    sm80: str
    buffer: str | None
    axis: ReduceAxis | None = None


ROLES: dict[Role, RoleSpec] = {s.role: s for s in (
    RoleSpec(Role.ACC, "leaf", "Sm90AccFetch", "VisitorAccFetch", None),
    RoleSpec(Role.SRC, "leaf", "Sm90SrcFetch", "VisitorAuxLoad", "C"),
    RoleSpec(Role.SCALAR, "leaf", "Sm90ScalarBroadcast", "VisitorScalarBroadcast", "scalar"),
    RoleSpec(Role.ROW, "leaf", "Sm90RowBroadcast / evtc::Sm90RowBroadcastDirect", "VisitorRowBroadcast", "row_broadcast"),
    RoleSpec(Role.COL, "leaf", "Sm90ColBroadcast", "VisitorColBroadcast", "col_broadcast"),
    RoleSpec(Role.AUX_LOAD, "leaf", "Sm90AuxLoad", "VisitorAuxLoad", "aux_load"),
    RoleSpec(Role.IMM, "leaf", "evtc::Sm90Immediate", "evtc::Sm80Immediate", None),
    RoleSpec(Role.COMPUTE, "compute", "Sm90Compute", "VisitorCompute", None),
    RoleSpec(Role.KEEP, "compute", "Sm90Compute<evtc::First>", "VisitorCompute<evtc::First>", None),
    RoleSpec(Role.AUX_STORE, "output", "Sm90AuxStore", "VisitorAuxStore", "aux_store"),
    RoleSpec(Role.ROW_REDUCTION, "output", "Sm90ColReduction", "VisitorColReduction", "row_reduction", ReduceAxis.ROW),
    RoleSpec(Role.COL_REDUCTION, "output", "Sm90RowReduction", "VisitorRowReduction", "col_reduction", ReduceAxis.COLUMN),
    RoleSpec(Role.SCALAR_REDUCTION, "output", "Sm90ScalarReduction", "evtc::Sm80ScalarReduction", "scalar_reduction",
             ReduceAxis.SCALAR),
    # evtc.quantize's scales, written by the root visitor that quantizes D's subtile (sm90 only:
    # the legalize pass refuses it elsewhere)
    RoleSpec(Role.GROUP_SCALE, "output", "evtc::Sm90GroupQuant", "none (LegalizeError: sm90 only)", "group_scale"),
    # evtc.glu's output: the root visitor pairs the subtile's columns and stores N / 2 of them
    # (the glu compute itself is no visitor; sm90 only: the legalize pass refuses it elsewhere)
    RoleSpec(Role.GLU_STORE, "output", "evtc::Sm90GluStore", "none (LegalizeError: sm90 only)", "glu_store"),
)}

_LEAF_ROLES: dict[type, Role] = {
    N.Accumulator: Role.ACC,
    N.Source: Role.AUX_LOAD,  # a Source that is not in the C slot (sm80) is loaded as an aux tensor
    N.ScalarBroadcast: Role.SCALAR,
    N.RowBroadcast: Role.ROW,
    N.ColBroadcast: Role.COL,
    N.AuxLoad: Role.AUX_LOAD,
    N.Immediate: Role.IMM,
}


def reduction_role(axis: ReduceAxis) -> Role:
    """The role of a reduction over ``axis``."""
    return {ReduceAxis.ROW: Role.ROW_REDUCTION, ReduceAxis.COLUMN: Role.COL_REDUCTION,
            ReduceAxis.SCALAR: Role.SCALAR_REDUCTION}[axis]


def role_of(node: N.Node, c_input: N.Leaf | None = None) -> Role:
    """The role of ``node`` when ``c_input`` is the leaf in the collective's C slot.

    Raises:
        TypeError: ``node`` is not an IR node kind (a bug in the caller).
    """
    if c_input is not None and node is c_input:
        return Role.SRC
    role = _LEAF_ROLES.get(type(node))
    if role is not None:
        return role
    if isinstance(node, N.Store):
        return Role.AUX_STORE
    if isinstance(node, N.GroupScale):
        return Role.GROUP_SCALE
    if isinstance(node, N.Reduction):
        return reduction_role(ReduceAxis.of(node.dim))
    if isinstance(node, N.Compute):
        return Role.KEEP if node.op == "first" else Role.COMPUTE
    raise TypeError(f"no visitor role for {type(node).__name__}")
