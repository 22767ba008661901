"""Rewrite rules as data: patterns over IR nodes, named rules, and the loop that applies them.

Input: a Graph and a :class:`PatternMatcher` (a table of :class:`RewriteRule`). Output: the
rewritten Graph.

tinygrad's ``PatternMatcher`` in evtc's IR: a rule is a row ``(name, pattern, rewrite)``; the
pattern says what the node looks like (op, operands, constants), binds names to the nodes it
matched, and ``rewrite(ctx, **bound)`` builds the replacement or returns None to decline (for
conditions a pattern can't state, such as "has one use"). Every row is tested on its own: the
pattern can also *build* an instance of itself (:meth:`Pat.build`), so ``tests/null`` evaluates
each rule's left and right sides with the reference interpreter on hypothesis-drawn operands.

Example::

    x = var("x")
    RULES = PatternMatcher([
        RewriteRule("x*1", op("mul", x, const(1.0), commutative=True), lambda ctx, x: x),
    ])
    graph = apply(graph, RULES)
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, Mapping, Sequence

from evtc.dtypes import DType, f32
from evtc.ir.graph import Graph, GraphBuilder, with_inputs
from evtc.ir.nodes import Compute, Immediate, Node, Output
from evtc.ir.verify import Violation
from evtc.passes.manager import rewrite

__all__ = ["Pat", "PatternMatcher", "RewriteContext", "RewriteRule", "apply", "const", "op", "var"]

_ANY = object()


@dataclasses.dataclass(frozen=True)
class Pat:
    """A pattern over IR nodes.

    Attributes:
        op: a :class:`Compute` op name the node must have (None: any node kind).
        kind: a node class the node must be an instance of (None: any).
        src: patterns for the node's ordered inputs (None: inputs not looked at).
        name: bind the matched node to this name (a name bound twice must match one node).
        value: for an :class:`Immediate`, the value it must equal (``0.0 == -0.0``).
        commutative: for two operands, also try them swapped.
    """

    op: str | None = None
    kind: type | None = None
    src: tuple["Pat", ...] | None = None
    name: str | None = None
    value: Any = _ANY
    commutative: bool = False

    def match(self, node: Node, bound: Mapping[str, Node]) -> Iterator[dict[str, Node]]:
        """Every way ``node`` matches, as the bindings extended from ``bound``."""
        if self.kind is not None and not isinstance(node, self.kind):
            return
        if self.op is not None and not (isinstance(node, Compute) and node.op == self.op):
            return
        if self.value is not _ANY and not (isinstance(node, Immediate) and node.value == self.value):
            return
        b = dict(bound)
        if self.name is not None:
            if self.name in b and b[self.name] is not node:
                return
            b[self.name] = node
        if self.src is None:
            yield b
            return
        ins = node.inputs
        if len(ins) != len(self.src):
            return
        orders = [ins]
        if self.commutative and len(ins) == 2:
            orders.append(ins[::-1])
        for order in orders:
            yield from _match_all(self.src, order, b)

    def build(self, bound: Mapping[str, Node], b: GraphBuilder, *, dtype: DType = f32,
              output: Callable[["Pat", Node], Node] | None = None) -> Node:
        """An instance of this pattern (for tests): variables from ``bound``, constants as
        immediates, ops as f32 computes (``convert`` in ``dtype``) and an output kind through
        ``output(pattern, value)``.

        Raises:
            ValueError: a variable isn't in ``bound``, or an output pattern without ``output``.
        """
        if self.op is None and self.kind is None and self.value is _ANY:
            if self.name not in bound:
                raise ValueError(f"pattern variable '{self.name}' is not bound")
            return bound[self.name]
        if self.value is not _ANY:
            return b.add(Immediate(f32, value=float(self.value)))
        args = tuple(s.build(bound, b, dtype=dtype, output=output) for s in (self.src or ()))
        if self.op is not None:
            return b.add(Compute(dtype if self.op == "convert" else f32, op=self.op, args=args))
        if self.kind is not None and issubclass(self.kind, Output) and output is not None and len(args) == 1:
            return output(self, args[0])
        raise ValueError(f"can't build an instance of {self}")

    @property
    def variables(self) -> tuple[str, ...]:
        """Names of the pattern's free variables (leaves of the pattern that bind any node)."""
        if self.op is None and self.kind is None and self.value is _ANY and self.src is None:
            return (self.name,) if self.name else ()
        out: list[str] = []
        for s in self.src or ():
            out += [v for v in s.variables if v not in out]
        return tuple(out)


def _match_all(pats: Sequence[Pat], nodes: Sequence[Node], b: dict[str, Node]) -> Iterator[dict[str, Node]]:
    if not pats:
        yield b
        return
    for b1 in pats[0].match(nodes[0], b):
        yield from _match_all(pats[1:], nodes[1:], b1)


def var(name: str) -> Pat:
    """Any node, bound to ``name``."""
    return Pat(name=name)


def const(value: float, name: str | None = None) -> Pat:
    """An immediate equal to ``value``."""
    return Pat(kind=Immediate, value=value, name=name)


def op(name: str, *src: Pat, commutative: bool = False, bind: str | None = None) -> Pat:
    """A compute of op ``name`` with operands matching ``src``."""
    return Pat(op=name, src=tuple(src), commutative=commutative, name=bind)


@dataclasses.dataclass
class RewriteContext:
    """What a rewrite function may use.

    Attributes:
        builder: interns the nodes the rewrite builds.
        root: the node being rewritten (its ``loc`` goes on the new nodes).
    """

    builder: GraphBuilder
    root: Node
    _uses: Callable[[Node], int | None]

    def compute(self, op_name: str, *args: Node) -> Node:
        """A new f32 compute at the root's location."""
        return self.builder.add(Compute(f32, op=op_name, args=tuple(args), loc=self.root.loc))

    def const(self, value: float) -> Node:
        """A new f32 immediate at the root's location."""
        return self.builder.add(Immediate(f32, value=float(value), loc=self.root.loc))

    def single_use(self, node: Node) -> bool:
        """True when ``node`` was used exactly once in the graph being rewritten (a node the
        rewrite itself built counts as not single-use)."""
        return self._uses(node) == 1


@dataclasses.dataclass(frozen=True)
class RewriteRule:
    """One row of a rule table.

    Attributes:
        name: the rule's name (``"x*1"``), used in tests and docs.
        pattern: what the rewritten node looks like.
        fn: ``fn(ctx, **bound) -> Node | None``; None declines (the node stays).
        doc: why the rewrite preserves values (and any exception, e.g. the sign of a zero).
    """

    name: str
    pattern: Pat
    fn: Callable[..., Node | None]
    doc: str = ""

    def apply(self, node: Node, ctx: RewriteContext) -> Node | None:
        """The replacement of ``node``, or None when the rule doesn't match or declines."""
        for bound in self.pattern.match(node, {}):
            new = self.fn(ctx, **bound)
            if new is not None and new is not node:
                return new
        return None


class PatternMatcher:
    """A table of rules, tried in order (the first that rewrites a node wins).

    Args:
        rules: the rows.

    Raises:
        ValueError: two rows share a name.
    """

    def __init__(self, rules: Sequence[RewriteRule]) -> None:
        names = [r.name for r in rules]
        dupes = {n for n in names if names.count(n) > 1}
        if dupes:
            raise ValueError(f"rule names used twice: {sorted(dupes)}")
        self.rules = tuple(rules)
        # by the root's op (None for other node kinds), so a node only tries the rules that can
        # match it, in table order
        self._by_op: dict[str | None, tuple[RewriteRule, ...]] = {}

    def __iter__(self) -> Iterator[RewriteRule]:
        return iter(self.rules)

    def __getitem__(self, name: str) -> RewriteRule:
        for r in self.rules:
            if r.name == name:
                return r
        raise KeyError(name)

    def only(self, *names: str) -> "PatternMatcher":
        """A matcher with just the rules called ``names`` (for testing one rule)."""
        return PatternMatcher([self[n] for n in names])

    def candidates(self, node: Node) -> tuple[RewriteRule, ...]:
        """The rules whose pattern's root can match ``node``, in table order."""
        key = node.op if isinstance(node, Compute) else None
        rules = self._by_op.get(key)
        if rules is None:
            rules = self._by_op[key] = tuple(r for r in self.rules if r.pattern.op in (None, key))
        return rules

    def rewrite(self, node: Node, ctx: RewriteContext) -> Node | None:
        """The first rule's replacement of ``node``, or None."""
        for r in self.candidates(node):
            new = r.apply(node, ctx)
            if new is not None:
                return new
        return None

    def first_match(self, graph: Graph) -> tuple[RewriteRule, Node] | None:
        """A rule that would still rewrite a node of ``graph``, and the node (None at a fixpoint);
        what a pass that applies this table ensures."""
        users = graph.users

        def uses(n: Node) -> int | None:
            return len(users.get(id(n), ()))

        b = GraphBuilder()
        for n in graph.nodes:
            ctx = RewriteContext(b, n, uses)
            for r in self.candidates(n):
                if r.apply(n, ctx) is not None:
                    return r, n
        return None

    def violation(self, graph: Graph, check: str) -> Violation | None:
        """:meth:`first_match` as the ``ensures`` of a pass that applies this table: a
        :class:`~evtc.ir.verify.Violation` named ``check`` at the node, or None."""
        found = self.first_match(graph)
        if found is None:
            return None
        rule, node = found
        return Violation(check, f"rule '{rule.name}' still matches", node)


def apply(graph: Graph, matcher: PatternMatcher) -> Graph:
    """Rewrite ``graph`` bottom-up with ``matcher``: each node, its inputs already rewritten,
    is rewritten until no rule applies (rules see only a node and its inputs, which are final
    by then, so one bottom-up sweep reaches the fixpoint of the whole graph).

    ``ctx.single_use(n)`` answers for the graph as it was before this sweep: the rewritten form
    of a node has the uses its original had.

    Args:
        graph: the graph to rewrite.
        matcher: the rule table.

    Returns:
        The rewritten graph (the same nodes where nothing matched).
    """
    users = graph.users
    origin: dict[int, Node] = {}

    def uses(n: Node) -> int | None:
        o = origin.get(id(n))
        return None if o is None else len(users.get(id(o), ()))

    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
        new = with_inputs(node, inputs)
        while True:
            ctx = RewriteContext(b, new, uses)
            out = matcher.rewrite(new, ctx)
            if out is None:
                break
            new = b.add(out)
        new = b.add(new)
        origin.setdefault(id(new), node)
        return new

    return rewrite(graph, rule)
