"""The emitter core: a visitor tree -> C++ type aliases and the nested Arguments initializer.

Input: a :class:`~evtc.lower.tree.VisitorTree` and, per arch, a :class:`NodeTable` (the role
macros of ``codegen_templates/<arch>/nodes.j2`` and a function that gives each visitor's plan
decisions). Output: :class:`Decl` lines (``using N<k>_<kind> = ...;`` one per visitor,
``EVT<k>`` per composition, ``Topo<k>`` per topological region, children first) and the lines of
``FusionCallbacks::Arguments``'s initializer, each positional field commented with the alias of
the visitor it initializes.

Both archs share this walk; they differ only in their node tables and their composition
templates (``Sm90EVT``/``Sm90TopologicalVisitor`` or ``Sm80EVT``/``Sm80TopologicalVisitor``).
The walks are iterative (:func:`evtc.iterative.trampoline`), so a long chain can't exhaust
Python's stack.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Generator

from evtc.emit import common
from evtc.iterative import trampoline
from evtc.lower import Role, Topo, Tree, TreeLike, Visitor

__all__ = ["Decl", "NodeTable", "TreeEmitter", "separate", "terminate"]


def terminate(lines: list[str], end: str) -> list[str]:
    """``lines`` with ``end`` (``,`` or ``;``) after the code of the last line, before its
    trailing ``// comment``: a bare leaf's initializer is one commented line (``{}  // N0_acc``),
    and a separator written after it would land inside the comment."""
    if not end or not lines:
        return list(lines)
    code, sep, comment = lines[-1].partition("  //")
    return [*lines[:-1], code + end + (sep + comment if sep else "")]


def separate(parts: list[list[str]]) -> list[str]:
    """The lines of initializer ``parts`` joined with commas, each before the trailing
    ``// comment`` of a part's last line (:func:`terminate`)."""
    lines: list[str] = []
    for i, body in enumerate(parts):
        lines.extend(terminate(body, ",") if i < len(parts) - 1 else body)
    return lines


@dataclasses.dataclass
class Decl:
    """One ``using`` line: alias = type, with a comment naming the IR node."""

    alias: str
    type: str
    comment: str


@dataclasses.dataclass(frozen=True)
class NodeTable:
    """How one arch prints visitors.

    Attributes:
        template: the macro file, e.g. ``sm90/nodes.j2`` (macros ``<role>``, ``<role>_comment``,
            ``<role>_args`` for every :class:`~evtc.lower.Role`).
        evt: the composition template, e.g. ``cutlass::epilogue::fusion::Sm90EVT``.
        topo: the topological visitor template, e.g. ``...::Sm90TopologicalVisitor``.
        decisions: ``f(visitor) -> dict``: what the plan decided for the visitor (stages, mode,
            strides...), passed to the macros as ``x``.
    """

    template: str
    evt: str
    topo: str
    decisions: Callable[[Visitor], dict[str, Any]]

    def _macro(self, name: str):
        return getattr(common.environment().get_template(self.template).module, name)

    def type(self, v: Visitor) -> tuple[str, str]:
        """(C++ type, comment) of one visitor."""
        x = self.decisions(v)
        role = v.role.value
        return str(self._macro(role)(v.node, x)), str(self._macro(f"{role}_comment")(v.node, x))

    def args(self, v: Visitor) -> str:
        """The ``Arguments`` initializer of one visitor."""
        return str(self._macro(f"{v.role.value}_args")(v.node, self.decisions(v)))


class TreeEmitter:
    """Declares a visitor tree and writes its Arguments initializer (see the module docstring)."""

    def __init__(self, table: NodeTable) -> None:
        self.table = table
        self.decls: list[Decl] = []
        self.counter = 0
        self.alias_of: dict[int, str] = {}  # id(Tree/Topo) -> alias (EVT<k>, Topo<k> or N<k>_...)
        self.op_alias: dict[int, str] = {}  # id(Tree) -> alias of its own visitor (N<k>_...)

    def declare(self, root: TreeLike) -> str:
        """Declare ``root`` (children first) into :attr:`decls` and return its alias."""

        def declare(t: TreeLike) -> Generator[TreeLike, str, str]:
            if isinstance(t, Tree):
                kids = []
                for c in t.children:
                    kids.append((yield c))
                typ, comment = self.table.type(t.op)
                k = self.counter
                self.counter += 1
                kind = t.op.node.op if t.op.role in (Role.COMPUTE, Role.KEEP) else t.op.role.value
                alias = f"N{k}_{kind}"
                self.decls.append(Decl(alias, typ, comment))
                self.op_alias[id(t)] = alias
                if kids:
                    evt = f"EVT{k}"
                    self.decls.append(Decl(evt, f"{self.table.evt}<{alias}, {', '.join(kids)}>",
                                           f"{kind}({', '.join(kids)})"))
                    alias = evt
                self.alias_of[id(t)] = alias
                return alias
            kids = []
            for o in t.ops:
                kids.append((yield o))
            k = self.counter
            self.counter += 1
            edges = ", ".join("cute::seq<" + ", ".join(map(str, e)) + ">" for e in t.edges)
            alias = f"Topo{k}"
            self.decls.append(Decl(alias, f"{self.table.topo}<float, cute::tuple<{edges}>, {', '.join(kids)}>",
                                   f"topological region of {len(t.ops)} ops"))
            self.alias_of[id(t)] = alias
            return alias

        return trampoline(declare, root)

    def arguments(self, root: TreeLike, indent: int, end: str = "") -> list[str]:
        """Lines of the nested initializer of ``root`` (declared first), indented by ``indent``
        levels of two spaces, ``end`` (``","`` where more fields follow it in the enclosing
        initializer, ``";"`` where it ends a statement) after its last field (:func:`terminate`)."""

        def arguments(item: tuple[TreeLike, int]) -> Generator[tuple[TreeLike, int], list[str], list[str]]:
            t, level = item
            pad = "  " * min(level, 32)  # bounded: a line per node, never one as long as the depth
            if isinstance(t, Tree) and not t.children:
                return [f"{pad}{self.table.args(t.op)}  // {self.alias_of[id(t)]}"]
            parts: list[list[str]] = []
            if isinstance(t, Tree):
                for c in t.children:
                    parts.append((yield (c, level + 1)))
                parts.append([f"{pad}  {self.table.args(t.op)}  // {self.op_alias[id(t)]}"])
            else:
                for o in t.ops:
                    parts.append((yield (o, level + 1)))
            return [f"{pad}{{  // {self.alias_of[id(t)]}", *separate(parts), f"{pad}}}"]

        return terminate(trampoline(arguments, (root, indent)), end)
