"""The epilogue graph: nodes reachable from the outputs, in a stable topological order.

Input: nodes (:mod:`evtc.ir.nodes`). Output: :class:`Graph`, the object every stage passes on.

The graph stores its outputs and its declared inputs; everything else is derived, once per graph
(the topological order, the users, the text form: a Graph and its nodes are immutable), and no
walk recurses, so a chain of thousands of nodes is as easy as a short one. networkx is
an analysis view built on demand (:meth:`Graph.to_networkx`) for dominators, cycles and
liveness, not the storage. Construction goes through :class:`GraphBuilder`, which hash-conses
nodes so that one graph never holds two structurally equal nodes (``x*y`` written twice is one
node), and :func:`rebuild`, the one loop every rewriting pass uses.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import TYPE_CHECKING, Callable, Iterable, Iterator

from evtc.errors import SourceLoc
from evtc.ir.nodes import Accumulator, Compute, Leaf, Node, Output

if TYPE_CHECKING:
    import networkx as nx


class GraphBuilder:
    """Creates nodes, returning an existing node when a structurally equal one exists.

    Example::

        b = GraphBuilder()
        acc = b.add(Accumulator(f32, name="acc"))
        x = b.add(Compute(f32, op="relu", args=(acc,)))
        assert b.add(Compute(f32, op="relu", args=(acc,))) is x
    """

    def __init__(self) -> None:
        self._table: dict[tuple, Node] = {}

    def __len__(self) -> int:
        """The number of distinct nodes built."""
        return len(self._table)

    def add(self, node: Node) -> Node:
        """Intern ``node``: return the equal node already built, or ``node`` itself."""
        key = node.key()
        found = self._table.get(key)
        if found is not None:
            return found
        self._table[key] = node
        # Keep the inputs alive as long as the table refers to them by id.
        return node


def with_inputs(node: Node, inputs: tuple[Node, ...]) -> Node:
    """A copy of ``node`` with its inputs replaced (same kind, attributes and loc)."""
    if isinstance(node, Compute):
        if inputs == node.args:
            return node
        return dataclasses.replace(node, args=inputs)
    if isinstance(node, Output):
        if inputs == node.inputs:
            return node
        (value,) = inputs
        return dataclasses.replace(node, value=value)
    assert not inputs, f"{type(node).__name__} takes no inputs"
    return node


@dataclasses.dataclass(frozen=True, eq=False)
class Graph:
    """An epilogue.

    Attributes:
        name: the epilogue's name (the Python function's; ``"expr"`` or the given name for a
            textual expression).
        inputs: the declared parameters in signature order (``acc`` included); a parameter the
            outputs don't use stays here so the runtime still accepts it.
        outputs: the outputs in the order the user returned them.
        loc: the ``def`` line of the epilogue function, if any.
    """

    name: str
    inputs: tuple[Leaf, ...]
    outputs: tuple[Output, ...]
    loc: SourceLoc | None = dataclasses.field(default=None, repr=False)

    # ---- derived views ----------------------------------------------------------------------

    @functools.cached_property
    def nodes(self) -> tuple[Node, ...]:
        """All nodes reachable from the outputs, topologically sorted: a depth-first post-order
        over the outputs in order and each node's inputs in order (deterministic: the emitted
        code, and so the build cache key, depends on it)."""
        order: list[Node] = []
        seen: set[int] = set()
        for out in self.outputs:
            stack: list[tuple[Node, int]] = [(out, 0)]
            while stack:
                node, i = stack.pop()
                if i == 0 and id(node) in seen:
                    continue
                ins = node.inputs
                if i < len(ins):
                    stack.append((node, i + 1))
                    if id(ins[i]) not in seen:
                        stack.append((ins[i], 0))
                else:
                    if id(node) not in seen:
                        seen.add(id(node))
                        order.append(node)
        return tuple(order)

    @functools.cached_property
    def users(self) -> dict[int, tuple[Node, ...]]:
        """For each node id, the nodes that use it (once per use, in topological order)."""
        users: dict[int, list[Node]] = {id(n): [] for n in self.nodes}
        for n in self.nodes:
            for i in n.inputs:
                users[id(i)].append(n)
        return {k: tuple(v) for k, v in users.items()}

    def users_of(self, node: Node) -> tuple[Node, ...]:
        return self.users.get(id(node), ())

    @functools.cached_property
    def used_inputs(self) -> tuple[Leaf, ...]:
        """Declared inputs that some output depends on, in signature order."""
        live = {id(n) for n in self.nodes}
        return tuple(i for i in self.inputs if id(i) in live)

    def input(self, name: str) -> Leaf:
        for i in self.inputs:
            if i.name == name:
                return i
        raise KeyError(name)

    def output(self, name: str) -> Output:
        for o in self.outputs:
            if o.name == name:
                return o
        raise KeyError(name)

    @property
    def accumulator(self) -> Accumulator | None:
        for i in self.inputs:
            if isinstance(i, Accumulator):
                return i
        return None

    def to_networkx(self) -> nx.DiGraph:
        """A DiGraph over node ids with edges input -> user and the node in ``data['node']``.

        Edges carry no operand order (that lives in the nodes); a value used twice by one node
        (``x * x``) is one edge with ``data['uses'] == 2``.
        """
        import networkx as nx  # an analysis view: imported when asked for, not by `import evtc`

        g = nx.DiGraph()
        for n in self.nodes:
            g.add_node(id(n), node=n)
        for n in self.nodes:
            for i in n.inputs:
                if g.has_edge(id(i), id(n)):
                    g.edges[id(i), id(n)]["uses"] += 1
                else:
                    g.add_edge(id(i), id(n), uses=1)
        return g

    def replace(self, **changes) -> "Graph":
        return dataclasses.replace(self, **changes)

    # ---- text form and equality -------------------------------------------------------------

    @functools.cached_property
    def text(self) -> str:
        """The canonical text form (:func:`evtc.ir.printer.print_graph`), printed once."""
        from evtc.ir.printer import print_graph

        return print_graph(self)

    def __str__(self) -> str:
        return self.text

    def __eq__(self, other: object) -> bool:
        """Structural equality: same canonical text (names, kinds, dtypes, ops, order)."""
        if not isinstance(other, Graph):
            return NotImplemented
        return str(self) == str(other)

    def __hash__(self) -> int:
        return hash(str(self))

    def __iter__(self) -> Iterator[Node]:
        return iter(self.nodes)


Rule = Callable[[Node, tuple[Node, ...], GraphBuilder], Node]


def rebuild(graph: Graph, rule: Rule | None = None, *, builder: GraphBuilder | None = None) -> Graph:
    """Rebuild ``graph`` bottom-up, applying ``rule`` to every node.

    ``rule(node, new_inputs, builder)`` returns the node that replaces ``node``, given its
    already-rewritten inputs; it may build new nodes through ``builder`` (they are interned).
    Without a rule the graph is only re-interned, which merges equal subexpressions.
    Declared inputs that are not reachable are kept as they are.

    Returns:
        A new Graph with the same name, inputs (rewritten where reachable) and outputs order.
    """
    builder = builder or GraphBuilder()
    mapping: dict[int, Node] = {}
    for node in graph.nodes:
        new_inputs = tuple(mapping[id(i)] for i in node.inputs)
        if rule is not None:
            new = rule(node, new_inputs, builder)
        else:
            new = with_inputs(node, new_inputs)
        mapping[id(node)] = builder.add(new)
    for leaf in graph.inputs:
        if id(leaf) not in mapping:
            mapping[id(leaf)] = builder.add(leaf)
    outputs = tuple(mapping[id(o)] for o in graph.outputs)
    inputs = tuple(mapping[id(i)] for i in graph.inputs)
    return Graph(graph.name, inputs, outputs, graph.loc)  # type: ignore[arg-type]


def walk_inputs(nodes: Iterable[Node]) -> Iterator[Node]:
    """Depth-first iteration over ``nodes`` and everything they depend on (each once)."""
    seen: set[int] = set()
    stack = list(nodes)
    while stack:
        n = stack.pop()
        if id(n) in seen:
            continue
        seen.add(id(n))
        yield n
        stack.extend(n.inputs)
