"""The visitor tree: the structure CUTLASS's epilogue fusion evaluates.

Input: built by :func:`evtc.lower.lower`. Output: read by the planners (which size each
visitor's shared storage) and the emitters (which print one ``using`` per visitor).

A :class:`Tree` is ``EVT<op, children...>`` (``Sm90EVT`` / ``Sm80EVT``): the op visits the values
its children produce. A :class:`Topo` is a topological visitor (``Sm90TopologicalVisitor`` /
``Sm80TopologicalVisitor``): ``ops[i]`` takes the outputs of ``ops[j]`` for ``j in edges[i]``, in
order; the last op's value is the region's. Both hold their parts in the order CUTLASS stores them
in ``Sm90VisitorImplBase::ops`` (an EVT's children first, then its own op; a region's ops in
order), so a *path* of indices from the root names one visitor in the C++ object and in its
``SharedStorage`` alike (:meth:`VisitorTree.paths`).
"""

from __future__ import annotations

import dataclasses
from typing import Iterator, Union

from evtc.ir.nodes import Compute, Leaf, Node, Output
from evtc.lower.roles import Role

__all__ = ["Topo", "Tree", "TreeLike", "Visitor", "VisitorTree"]


@dataclasses.dataclass(frozen=True, eq=False)
class Visitor:
    """One visitor: the IR node it implements and its :class:`Role`."""

    node: Node
    role: Role

    @property
    def name(self) -> str:
        """The tensor's name for leaves and outputs (``""`` for computes and constants)."""
        return getattr(self.node, "name", "") or ""


@dataclasses.dataclass(frozen=True, eq=False)
class Tree:
    """``EVT<op, children...>``; a leaf visitor is a Tree without children."""

    op: Visitor
    children: tuple["TreeLike", ...] = ()


@dataclasses.dataclass(frozen=True, eq=False)
class Topo:
    """A topological region: ``ops[i]`` takes ``ops[j]`` for ``j in edges[i]`` as operands; an
    op with no edges is a leaf visitor or an independent subtree; the last op is the result."""

    ops: tuple["TreeLike", ...]
    edges: tuple[tuple[int, ...], ...]


TreeLike = Union[Tree, Topo]


@dataclasses.dataclass(frozen=True, eq=False)
class VisitorTree:
    """The lowered epilogue.

    Attributes:
        root: the tree whose value the collective stores as D (sm90), or the output visitor
            that wraps everything (sm80).
        d_output: the output in the collective's D slot (sm90), or the output whose visitor is
            the root (sm80).
        c_input: the leaf in the collective's C slot, or None.
        keep_nodes: the ``first`` computes added to keep off-path outputs alive.
    """

    root: TreeLike
    d_output: Output
    c_input: Leaf | None
    keep_nodes: tuple[Compute, ...] = ()

    def walk(self) -> Iterator[tuple[tuple[int, ...], Tree]]:
        """(path, tree) of every visitor, children first (the order of their C++ aliases). A
        path indexes the nested ``ops`` tuples from the root (see the module docstring); an
        EVT's own op sits after its children."""
        stack: list[tuple[TreeLike, tuple[int, ...], bool]] = [(self.root, (), False)]
        while stack:
            t, path, expanded = stack.pop()
            if isinstance(t, Topo):
                for i in reversed(range(len(t.ops))):
                    stack.append((t.ops[i], path + (i,), False))
                continue
            if expanded or not t.children:
                yield (path + (len(t.children),) if t.children else path), t
                continue
            stack.append((t, path, True))
            for i in reversed(range(len(t.children))):
                stack.append((t.children[i], path + (i,), False))

    def visitors(self) -> list[Visitor]:
        """Every visitor, in the order its C++ alias is declared (children first)."""
        return [t.op for _, t in self.walk()]

    def paths(self) -> dict[tuple[Role, str], tuple[int, ...]]:
        """(role, tensor name) -> path of every aux load and aux store visitor."""
        return {(t.op.role, t.op.name): p for p, t in self.walk() if t.op.role.is_aux}

    def count(self, node: Node) -> int:
        """How many visitors implement ``node``."""
        return sum(1 for v in self.visitors() if v.node is node)
