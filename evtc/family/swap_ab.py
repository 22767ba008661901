"""Swap-AB: the epilogue of ``D = A B^T`` rewritten for the kernel that computes ``D^T = B A^T``.

Input: a Graph after passes. Output: the Graph of the same epilogue on the transposed problem,
which a kernel with column-major M x N tensors (``GemmConfig.swap_ab``) runs on the caller's
row-major tensors unchanged.

On the transposed problem (M' = N, N' = M) each element keeps its value and only its role in
the tile changes: a row broadcast ``bias[n]`` (varying along N) varies along M', so it becomes
a column broadcast; a column broadcast becomes a row broadcast; a row reduction (over N, one
value per row of D) reduces over M' and becomes a column reduction, and the reverse. Names,
dtypes and operand order are kept, so the C argument struct has the same fields: the binder
swaps M with N and A with B and passes every other pointer, leading dimension and batch stride
as they are (a row-major M x N tensor with row stride ``ld`` is the column-major N x M tensor
with column stride ``ld``). Small-M problems (decode) fill the machine this way: the kernel's
tile M runs along the long N.

Requires: a verified graph. Ensures: ``transpose(transpose(g)) == g``. Preserves: names, dtypes,
operand order, locations.
"""

from __future__ import annotations

import dataclasses

from evtc.ir.axes import ReduceAxis
from evtc.ir.graph import Graph, GraphBuilder, rebuild, with_inputs
from evtc.ir.nodes import ColBroadcast, Node, Reduction, RowBroadcast

__all__ = ["transpose"]


def _transposed(node: Node, inputs: tuple[Node, ...], builder: GraphBuilder) -> Node:
    if isinstance(node, RowBroadcast):
        return ColBroadcast(node.dtype, name=node.name, loc=node.loc)
    if isinstance(node, ColBroadcast):
        return RowBroadcast(node.dtype, name=node.name, loc=node.loc)
    new = with_inputs(node, inputs)
    if isinstance(new, Reduction):
        return dataclasses.replace(new, dim=ReduceAxis.of(new.dim).transposed().dim)
    return new


def transpose(graph: Graph) -> Graph:
    """The epilogue of ``graph`` on the transposed problem (see the module docstring)."""
    return rebuild(graph, _transposed)
