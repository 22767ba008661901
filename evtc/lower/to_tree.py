"""DAG -> visitor tree: the lowering algorithm.

Input: a Graph after passes, the output in the D slot, the leaf in the C slot. Output: a
:class:`~evtc.lower.tree.VisitorTree`.

CUTLASS's visitor trees evaluate a value once per *use* in a tree: ``Sm90EVT<Mul, X, X>``
instantiates ``X`` twice. That is harmless for the accumulator, a constant or a by-value scalar
(:func:`duplicable`), and wrong or wasteful for everything else (an aux load would be fetched and
buffered twice, a reduction would count twice). So, in four steps:

1. :func:`_operands`: the D store is the root: the tree computes D's value and the collective
   stores it. Side-effect outputs (aux stores, reductions) pass their input through (their
   ``visit`` returns it), so the outputs of one value form a chain, and users of a stored value
   are rewired to the end of its chain: the store lies on the path to D when the value does.
2. :func:`_keep_alive`: a chain whose end does not reach D is kept alive by
   ``first(root, end)`` (op ``first``: returns its first operand).
3. :func:`_regions`: every node with several uses that is not duplicable becomes part of a
   *topological region*: the nodes on the paths from it to its immediate post-dominator
   (networkx ``immediate_dominators`` on the reversed graph). Overlapping regions merge (their
   exit moves to a common post-dominator) until they are disjoint.
4. :func:`_build`: a region is one topological visitor whose ops are its nodes in topological
   order; operands from outside the region are whole subtrees, as ops with no edges.

Requires: a verified graph whose ``d_output`` is one of its outputs.
Ensures: every node that is not duplicable is evaluated by exactly one visitor
(:func:`check_tree`); the root computes D's value.
Preserves: the graph (the tree refers to its nodes).

Nothing here recurses in Python: a chain of thousands of nodes lowers in linear time.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Generator

from evtc.dtypes import f32
from evtc.errors import IRVerificationError
from evtc.ir.graph import Graph
from evtc.iterative import trampoline
from evtc.ir.nodes import Accumulator, Compute, Immediate, Leaf, Node, Output, ScalarBroadcast
from evtc.lower.roles import role_of
from evtc.lower.tree import Topo, Tree, TreeLike, Visitor, VisitorTree

if TYPE_CHECKING:
    import networkx as nx

__all__ = ["check_tree", "duplicable", "lower"]


def duplicable(node: Node) -> bool:
    """Cheap to evaluate once per use: a register read or a constant, no memory, no effects."""
    return isinstance(node, (Accumulator, Immediate)) or (isinstance(node, ScalarBroadcast) and not node.by_pointer)


class _Dag:
    """The visitor DAG being built: operand lists by node id (the IR's, rewired)."""

    def __init__(self, graph: Graph) -> None:
        self.node_of: dict[int, Node] = {id(n): n for n in graph.nodes}
        self.operands: dict[int, list[Node]] = {}
        self.position = {id(n): k for k, n in enumerate(graph.nodes)}

    def add(self, node: Node, operands: list[Node]) -> None:
        self.node_of[id(node)] = node
        self.operands[id(node)] = operands

    def reachable(self, root: Node) -> set[int]:
        seen: set[int] = set()
        stack = [root]
        while stack:
            x = stack.pop()
            if id(x) in seen:
                continue
            seen.add(id(x))
            stack.extend(self.operands.get(id(x), ()))
        return seen


def _operands(graph: Graph, d_output: Output) -> tuple[_Dag, Node, dict[int, Node]]:
    """Step 1: (the DAG without D's store, the root value, the end of each value's chain of
    side-effect outputs by the value's id)."""
    dag = _Dag(graph)
    for n in graph.nodes:
        if n is not d_output:
            dag.operands[id(n)] = list(n.inputs)
    chain_end: dict[int, Node] = {}
    side = [o for o in graph.outputs if o is not d_output]
    for o in side:
        v = o.value
        dag.operands[id(o)] = [chain_end.get(id(v), v)]
        chain_end[id(v)] = o
    side_ids = {id(o) for o in side}
    for nid, ops in dag.operands.items():
        if nid not in side_ids:
            dag.operands[nid] = [chain_end.get(id(x), x) for x in ops]
    root = chain_end.get(id(d_output.value), d_output.value)
    return dag, root, chain_end


def _keep_alive(dag: _Dag, root: Node, chain_end: dict[int, Node]) -> tuple[Node, list[Compute], set[int]]:
    """Step 2: (the new root, the ``first`` nodes added, the ids of the nodes that reach it)."""
    keeps: list[Compute] = []
    live = dag.reachable(root)
    for end in chain_end.values():  # each chain's last output has every earlier one upstream
        if id(end) not in live:
            keep = Compute(f32, op="first", args=(root, end), loc=end.loc)
            dag.add(keep, [root, end])
            keeps.append(keep)
            root = keep
            live |= dag.reachable(keep)
    return root, keeps, live


def _regions(dag: _Dag, root: Node, live: set[int]) -> tuple[nx.DiGraph, dict[int, set[int]]]:
    """Step 3: (the live DAG as a networkx graph, the body of each region by its exit's id)."""
    import networkx as nx  # on first use: `import evtc` and a memoised construct don't need it

    g = nx.DiGraph()
    g.add_nodes_from(live)
    uses: dict[int, int] = dict.fromkeys(live, 0)
    for nid in live:
        for x in dag.operands.get(nid, ()):
            g.add_edge(id(x), nid)
            uses[id(x)] += 1
    multi = [nid for nid in live if uses[nid] > 1 and not duplicable(dag.node_of[nid])]
    if not multi:
        return g, {}
    post_dom = nx.immediate_dominators(g.reverse(copy=False), id(root))

    def pdom_chain(x: int) -> list[int]:
        chain = [x]
        # networkx >= 3.5 leaves the start node out of the idom map
        while post_dom.get(chain[-1], chain[-1]) != chain[-1]:
            chain.append(post_dom[chain[-1]])
        return chain

    def body(entries: set[int], exit_: int) -> set[int]:
        # The nodes on the paths from the entries to the exit: since the exit post-dominates
        # every entry, everything reachable from an entry without passing the exit is on such a
        # path (its own path to the root must pass the exit). One search, linear in the body.
        seen = set(entries) | {exit_}
        stack = [e for e in entries if e != exit_]
        while stack:
            for succ in g.successors(stack.pop()):
                if succ not in seen:
                    seen.add(succ)
                    stack.append(succ)
        return seen

    regions = [({u}, post_dom.get(u, u)) for u in multi]
    while True:
        bodies = [body(entries, ex) for entries, ex in regions]
        # union-find over regions whose bodies overlap
        parent = list(range(len(regions)))

        def find(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        owner: dict[int, int] = {}
        merged = False
        for i, b in enumerate(bodies):
            for nid in b:
                j = owner.setdefault(nid, i)
                if j != i and find(j) != find(i):
                    parent[find(i)] = find(j)
                    merged = True
        if not merged:
            return g, {ex: b for (_, ex), b in zip(regions, bodies)}
        groups: dict[int, list[int]] = {}
        for i in range(len(regions)):
            groups.setdefault(find(i), []).append(i)
        new = []
        for members in groups.values():
            entries = set().union(*(regions[i][0] for i in members))
            chains = [pdom_chain(regions[i][1]) for i in members]
            common = set(chains[0]).intersection(*map(set, chains[1:]))
            new.append((entries, next(x for x in chains[0] if x in common)))
        regions = new


def _build(dag: _Dag, g: nx.DiGraph, root: Node, region_of_exit: dict[int, set[int]],
           c_input: Leaf | None) -> TreeLike:
    """Step 4: the nested Tree/Topo structure."""
    import networkx as nx

    order = nx.lexicographical_topological_sort(g, key=lambda x: dag.position.get(x, len(dag.position)))
    topo_index = {nid: k for k, nid in enumerate(order)}

    def visitor(nid: int) -> Visitor:
        node = dag.node_of[nid]
        return Visitor(node, role_of(node, c_input))

    def build(nid: int) -> Generator[int, TreeLike, TreeLike]:
        if nid in region_of_exit:
            ops: list[TreeLike] = []
            edges: list[tuple[int, ...]] = []
            index: dict[int, int] = {}
            for b in sorted(region_of_exit[nid], key=topo_index.__getitem__):
                ins = []
                for x in dag.operands.get(b, ()):
                    xid = id(x)
                    if xid not in index:  # an operand from outside the region: a subtree
                        sub = yield xid
                        index[xid] = len(ops)
                        ops.append(sub)
                        edges.append(())
                    ins.append(index[xid])
                index[b] = len(ops)
                ops.append(Tree(visitor(b)))
                edges.append(tuple(ins))
            if len(ops) == 2:
                # NOTE [Regions of two ops]: a leaf used several times by one op (``X * X``,
                # ``multiply_add(X, X, X)``) is a region of two ops, and both topological visitors
                # keep the values of the first R - 1 ops in ``cute::repeat<R - 1>(...)``, which for
                # R = 2 is the value itself, no tuple (cute/algorithm/tuple_algorithms.hpp), so
                # ``get<0>`` of it doesn't compile (an sm80 fuzz epilogue's build, 2026-11-29).
                # A pass-through ``first(x, x)`` between them makes three.
                leaf = ops[0].op.node if isinstance(ops[0], Tree) else dag.node_of[nid]
                keep = Compute(f32, op="first", args=(leaf, leaf))
                ops.insert(1, Tree(Visitor(keep, role_of(keep, c_input))))
                edges = [edges[0], (0, 0), tuple(e + 1 for e in edges[1])]
            return Topo(tuple(ops), tuple(edges))
        children = []
        for x in dag.operands.get(nid, ()):
            children.append((yield id(x)))
        return Tree(visitor(nid), tuple(children))

    return trampoline(build, id(root))


def lower(graph: Graph, d_output: Output, c_input: Leaf | None = None) -> VisitorTree:
    """Lower ``graph`` to a visitor tree with ``d_output`` in the D slot (see the module docs).

    Args:
        graph: the epilogue after passes.
        d_output: one of ``graph.outputs``: on sm90 the Store the collective writes; on sm80 the
            output whose visitor wraps the root (the tree then computes its value).
        c_input: the leaf the collective loads through its C slot, if any.

    Returns:
        The :class:`VisitorTree`.

    Raises:
        IRVerificationError: ``d_output`` is not an output of ``graph`` (a bug in the caller).
    """
    if not any(o is d_output for o in graph.outputs):
        raise IRVerificationError(f"'{getattr(d_output, 'name', d_output)}' is not an output of the epilogue",
                                  epilogue=graph.name)
    dag, root, chain_end = _operands(graph, d_output)
    root, keeps, live = _keep_alive(dag, root, chain_end)
    g, regions = _regions(dag, root, live)
    tree = VisitorTree(_build(dag, g, root, regions, c_input), d_output, c_input, tuple(keeps))
    return tree


def check_tree(graph: Graph, tree: VisitorTree) -> None:
    """The lowering's ``ensures``: every node of ``graph`` that the tree evaluates and that is not
    duplicable is evaluated by exactly one visitor; D's store is not a visitor on sm90.

    Raises:
        IRVerificationError: naming the node evaluated more than once.
    """
    counts: dict[int, int] = {}
    for v in tree.visitors():
        counts[id(v.node)] = counts.get(id(v.node), 0) + 1
    for n in graph.nodes:
        if counts.get(id(n), 0) > 1 and not duplicable(n):
            raise IRVerificationError(f"the visitor tree evaluates {getattr(n, 'name', '') or n.kind} "
                                      f"{counts[id(n)]} times", loc=n.loc, epilogue=graph.name)
