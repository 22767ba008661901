"""The lowering stage: the epilogue graph -> CUTLASS's visitor tree.

Input: a Graph after passes (:func:`evtc.passes.run`) and the slot decisions: the output the
collective's D slot stores and the input its C slot loads (the sm90 planner tries several; sm80
has no collective and wraps the tree in D's store). Output: a
:class:`~evtc.lower.tree.VisitorTree` of :class:`~evtc.lower.tree.Visitor` s with typed
:class:`~evtc.lower.roles.Role` s, which the planners size and the emitters print.

Contract: :func:`lower` never changes the graph; in the tree every node that is not duplicable
(a memory access or an effect) is evaluated exactly once (:func:`check_tree`); the role table
:data:`ROLES` is the only place that maps a node kind to a CUTLASS visitor.
"""

from evtc.ir.axes import ReduceAxis
from evtc.lower.roles import ROLES, Role, RoleSpec, reduction_role, role_of
from evtc.lower.to_tree import check_tree, duplicable, lower
from evtc.lower.tree import Topo, Tree, TreeLike, Visitor, VisitorTree

__all__ = ["ROLES", "ReduceAxis", "Role", "RoleSpec", "Topo", "Tree", "TreeLike", "Visitor", "VisitorTree",
           "check_tree", "duplicable", "lower", "reduction_role", "role_of"]
