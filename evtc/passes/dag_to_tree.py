"""DAG -> tree: turn the epilogue graph into a tree of visitors.

Input: a verified Graph, the output that takes the collective's D slot and the input (if any)
that takes the C slot. Output: a :class:`VisitorTree`, the structure the emitters print as
nested ``Sm90EVT`` / ``Sm80EVT`` and ``Sm90TopologicalVisitor`` / ``Sm80TopologicalVisitor``.

CUTLASS's visitor trees evaluate a value once per *use* in a tree: ``Sm90EVT<Mul, X, X>``
instantiates ``X`` twice. That is harmless for the accumulator, a constant or a by-value scalar,
and wrong or wasteful for everything else (an aux load would be fetched and buffered twice, a
reduction would count twice). So:

1. The D store is the root: the tree computes D's value and the collective stores it.
2. Side-effect outputs (aux stores, reductions) pass their input through (their ``visit``
   returns it). Users of a stored value are rewired to use the store, so the store lies on the
   path to D when the value does. A store whose value does not reach D is kept alive by
   ``first(root, store)`` (op ``first``: returns its first operand).
3. Every node with several uses that is not cheap to duplicate becomes part of a *topological
   region*: the nodes on the paths from it to its immediate post-dominator (networkx
   ``immediate_dominators`` on the reversed graph). Overlapping regions merge until disjoint.
   A region is emitted as one topological visitor whose ops are its nodes in topological
   order; inputs from outside the region are whole subtrees evaluated as ops with no edges.

Requires: a verified graph with at least one Store (the D slot).
Guarantees: every non-duplicable node is evaluated exactly once; the root computes D's value.
Preserves: the graph itself (the tree refers to its nodes).
"""

from __future__ import annotations

import dataclasses
from typing import Union

import networkx as nx

from evtc.dtypes import f32
from evtc.ir.graph import Graph
from evtc.ir.nodes import (
    Accumulator,
    AuxLoad,
    ColBroadcast,
    Compute,
    Immediate,
    Leaf,
    Node,
    Reduction,
    RowBroadcast,
    ScalarBroadcast,
    Source,
    Store,
)


@dataclasses.dataclass(frozen=True, eq=False)
class Visitor:
    """One visitor op: the IR node it implements and its role.

    Roles: ``acc``, ``src`` (the C slot: Source, or an aux load promoted into it), ``scalar``,
    ``row``, ``col``, ``aux_load``, ``imm``, ``compute``, ``aux_store``, ``row_reduction``
    (over N: one value per row), ``col_reduction`` (over M), ``scalar_reduction``, ``keep``
    (the ``first`` op that keeps an off-path output alive).
    """

    node: Node
    role: str

    @property
    def name(self) -> str:
        return getattr(self.node, "name", "") or ""


@dataclasses.dataclass(frozen=True, eq=False)
class Tree:
    """``EVT<op, children...>``; a leaf visitor is a Tree without children."""

    op: Visitor
    children: tuple["TreeLike", ...] = ()


@dataclasses.dataclass(frozen=True, eq=False)
class Topo:
    """``TopologicalVisitor<ElementCompute, Edges, ops...>``: ``ops[i]`` takes the outputs of
    ``ops[j]`` for ``j in edges[i]`` as its operands, in order; the last op is the result.
    An op with no edges is a leaf visitor or an independent subtree."""

    ops: tuple["TreeLike", ...]
    edges: tuple[tuple[int, ...], ...]


TreeLike = Union[Tree, Topo]


@dataclasses.dataclass(frozen=True, eq=False)
class VisitorTree:
    """The result of this pass.

    Attributes:
        root: the tree whose value the collective stores as D.
        d_output: the Store in the D slot.
        c_input: the leaf in the C slot, or None.
        keep_nodes: the ``first`` nodes added to keep off-path outputs alive.
    """

    root: TreeLike
    d_output: Store
    c_input: Leaf | None
    keep_nodes: tuple[Compute, ...] = ()

    def visitors(self) -> list[Visitor]:
        """Every visitor, in the order its C++ alias is declared (children first)."""
        out: list[Visitor] = []

        def walk(t: TreeLike) -> None:
            if isinstance(t, Tree):
                for c in t.children:
                    walk(c)
                out.append(t.op)
            else:
                for o in t.ops:
                    walk(o)

        walk(self.root)
        return out


def leaf_role(node: Node, c_input: Leaf | None) -> str:
    """The visitor role of a leaf or immediate."""
    if c_input is not None and node is c_input:
        return "src"
    if isinstance(node, Accumulator):
        return "acc"
    if isinstance(node, Source):
        return "aux_load"  # a Source that lost the C slot (only possible on sm80) loads as aux
    if isinstance(node, ScalarBroadcast):
        return "scalar"
    if isinstance(node, RowBroadcast):
        return "row"
    if isinstance(node, ColBroadcast):
        return "col"
    if isinstance(node, AuxLoad):
        return "aux_load"
    if isinstance(node, Immediate):
        return "imm"
    raise AssertionError(type(node))


def _role(node: Node, c_input: Leaf | None) -> str:
    if isinstance(node, (Leaf, Immediate)):
        return leaf_role(node, c_input)
    if isinstance(node, Store):
        return "aux_store"
    if isinstance(node, Reduction):
        return {1: "row_reduction", 0: "col_reduction", None: "scalar_reduction"}[node.dim]
    if isinstance(node, Compute):
        return "keep" if node.op == "first" else "compute"
    raise AssertionError(type(node))


def duplicable(node: Node) -> bool:
    """Cheap to evaluate once per use: a register read or a constant, no memory, no effects."""
    return isinstance(node, (Accumulator, Immediate)) or (isinstance(node, ScalarBroadcast) and not node.by_pointer)


def dag_to_tree(graph: Graph, d_output: Store, c_input: Leaf | None = None) -> VisitorTree:
    """Build the visitor tree for ``graph`` with ``d_output`` in the D slot.

    Args:
        graph: the epilogue (after passes).
        d_output: one of ``graph.outputs``, the output the collective stores.
        c_input: the leaf loaded through the collective's C slot, if any.

    Returns:
        The :class:`VisitorTree`.
    """
    assert d_output in graph.outputs
    # --- 1/2: the visitor DAG, as operand lists keyed by node id -----------------------------
    operands: dict[int, list[Node]] = {}
    nodes: dict[int, Node] = {}
    for n in graph.nodes:
        if n is d_output:
            continue
        nodes[id(n)] = n
        operands[id(n)] = list(n.inputs)

    # chains of side-effect outputs per value
    chain_end: dict[int, Node] = {}
    side_outputs = [o for o in graph.outputs if o is not d_output]
    for o in side_outputs:
        v = o.value
        prev = chain_end.get(id(v), v)
        operands[id(o)] = [prev]
        chain_end[id(v)] = o
    # rewire users of stored values to the end of the chain
    side_ids = {id(o) for o in side_outputs}
    for nid, ops in operands.items():
        if nid in side_ids:
            continue
        operands[nid] = [chain_end.get(id(x), x) for x in ops]
    root: Node = chain_end.get(id(d_output.value), d_output.value)

    # --- keep off-path outputs alive ------------------------------------------------------------
    def reaches_root() -> set[int]:
        seen: set[int] = set()
        stack = [root]
        while stack:
            x = stack.pop()
            if id(x) in seen:
                continue
            seen.add(id(x))
            stack.extend(operands.get(id(x), []))
        return seen

    keeps: list[Compute] = []
    live = reaches_root()
    for end in chain_end.values():  # each chain's last output has every earlier one upstream
        if id(end) not in live:
            keep = Compute(f32, op="first", args=(root, end), loc=end.loc)
            nodes[id(keep)] = keep
            operands[id(keep)] = [root, end]
            keeps.append(keep)
            root = keep
            live = reaches_root()

    # --- 3: regions ----------------------------------------------------------------------------
    g = nx.DiGraph()
    for nid in live:
        g.add_node(nid)
    for nid in live:
        for x in operands.get(nid, []):
            g.add_edge(id(x), nid)
    uses: dict[int, int] = {nid: 0 for nid in live}
    for nid in live:
        for x in operands.get(nid, []):
            uses[id(x)] += 1
    node_of = {**{id(n): n for n in graph.nodes}, **{id(k): k for k in keeps}}

    multi = [nid for nid in live if uses[nid] > 1 and not duplicable(node_of[nid])]
    regions: list[tuple[set[int], int]] = []
    if multi:
        post_dom = nx.immediate_dominators(g.reverse(copy=True), id(root))

        def pdom_chain(x: int) -> list[int]:
            chain = [x]
            # networkx >= 3.5 leaves the start node out of the idom map
            while post_dom.get(chain[-1], chain[-1]) != chain[-1]:
                chain.append(post_dom[chain[-1]])
            return chain

        def between(entries: set[int], exit_: int) -> set[int]:
            down = set()
            for e in entries:
                down |= nx.descendants(g, e) | {e}
            up = nx.ancestors(g, exit_) | {exit_}
            return (down & up) | {exit_}

        for u in multi:
            exit_ = post_dom.get(u, u)
            regions.append(({u}, exit_))
        # merge until the regions are disjoint
        changed = True
        while changed:
            changed = False
            bodies = [between(entries, ex) for entries, ex in regions]
            for i in range(len(regions)):
                for j in range(i + 1, len(regions)):
                    if bodies[i] & bodies[j]:
                        ci, cj = pdom_chain(regions[i][1]), pdom_chain(regions[j][1])
                        common = next(x for x in ci if x in set(cj))
                        regions[i] = (regions[i][0] | regions[j][0], common)
                        del regions[j]
                        changed = True
                        break
                if changed:
                    break
        region_of_exit = {ex: between(entries, ex) for entries, ex in regions}
    else:
        region_of_exit = {}
    position = {id(n): k for k, n in enumerate(graph.nodes)}
    order = nx.lexicographical_topological_sort(g, key=lambda x: position.get(x, len(position)))
    topo_index = {nid: k for k, nid in enumerate(order)}

    # --- emit the tree -----------------------------------------------------------------------------
    def visitor(nid: int) -> Visitor:
        return Visitor(node_of[nid], _role(node_of[nid], c_input))

    def build(nid: int) -> TreeLike:
        if nid in region_of_exit:
            body = sorted(region_of_exit[nid], key=topo_index.__getitem__)
            ops: list[TreeLike] = []
            edges: list[tuple[int, ...]] = []
            index: dict[int, int] = {}
            for b in body:
                ins = []
                for x in operands.get(b, []):
                    xid = id(x)
                    if xid not in index:
                        # an operand from outside the region: an independent subtree
                        index[xid] = len(ops)
                        ops.append(build(xid))
                        edges.append(())
                    ins.append(index[xid])
                index[b] = len(ops)
                ops.append(Tree(visitor(b)))
                edges.append(tuple(ins))
            return Topo(tuple(ops), tuple(edges))
        return Tree(visitor(nid), tuple(build(id(x)) for x in operands.get(nid, [])))

    return VisitorTree(build(id(root)), d_output, c_input, tuple(keeps))
