"""Algebraic simplification: local rewrite rules, then sympy on arithmetic subtrees.

Input: a Graph. Output: an equivalent Graph with fewer or cheaper ops.

Two stages (tinygrad's PatternMatcher for the first, sympy at one boundary for the second):

1. :data:`RULES`, a table of local patterns, applied bottom-up to a fixpoint: ``x + 0``,
   ``x * 1``, ``x / 1``, ``x - 0``, ``0 - x -> -x``, ``--x``, ``x * -1 -> -x``,
   ``relu(relu(x))``, ``store(x.to(t)) : t -> store(x) : t`` (the store rounds to ``t`` the same
   way) and ``a * b + c -> multiply_add(a, b, c)``. No rule assumes fast math: ``x * 0`` is not
   folded (``inf * 0`` is NaN).
2. Maximal trees of ``add``/``sub``/``mul``/``div``/``neg`` (interior values with one use) are
   translated to sympy, which puts them in canonical form (collecting like terms and
   constants: ``2 * (3 * x) -> 6 * x``, ``x + x -> 2 * x``); the result replaces the tree only
   if it has strictly fewer ops and still uses every leaf (a cancellation such as ``x - x -> 0``
   or ``x * 0 -> 0`` would hide an inf or NaN, so it is refused). Leaves of the tree become
   sympy symbols.

Rounding: exact algebra on reals can change f32 rounding (reassociation, an fma's single
rounding); the tests check every rewrite with the reference interpreter on random inputs
within a relative tolerance.

Requires: fold. Guarantees: no pattern of :data:`RULES` matches. Preserves: outputs, locs of
rewritten roots.
"""

from __future__ import annotations

import dataclasses
from typing import Callable

import sympy

from evtc import ops
from evtc.dtypes import f32
from evtc.ir.graph import Graph, GraphBuilder, rebuild, with_inputs
from evtc.ir.nodes import Compute, Immediate, Node, Store


def _imm(n: Node, v: float) -> bool:
    return isinstance(n, Immediate) and n.value == v


def _op(n: Node, name: str) -> bool:
    return isinstance(n, Compute) and n.op == name


def _c(b: GraphBuilder, op: str, *args: Node, like: Node) -> Node:
    return b.add(Compute(f32, op=op, args=tuple(args), loc=like.loc))


# A rule: (name, op it applies to, fn(node, builder, uses) -> replacement or None).
Rule = tuple[str, str, Callable[[Compute, GraphBuilder], Node | None]]

RULES: list[Rule] = [
    ("x+0", "add", lambda n, b: n.args[0] if _imm(n.args[1], 0.0) else (n.args[1] if _imm(n.args[0], 0.0) else None)),
    ("x-0", "sub", lambda n, b: n.args[0] if _imm(n.args[1], 0.0) else None),
    ("0-x", "sub", lambda n, b: _c(b, "neg", n.args[1], like=n) if _imm(n.args[0], 0.0) else None),
    ("x*1", "mul", lambda n, b: n.args[0] if _imm(n.args[1], 1.0) else (n.args[1] if _imm(n.args[0], 1.0) else None)),
    ("x*-1", "mul", lambda n, b: _c(b, "neg", n.args[0], like=n) if _imm(n.args[1], -1.0)
        else (_c(b, "neg", n.args[1], like=n) if _imm(n.args[0], -1.0) else None)),
    ("x/1", "div", lambda n, b: n.args[0] if _imm(n.args[1], 1.0) else None),
    ("--x", "neg", lambda n, b: n.args[0].args[0] if _op(n.args[0], "neg") else None),
    ("relu(relu(x))", "relu", lambda n, b: n.args[0] if _op(n.args[0], "relu") else None),
]


def _apply_rules(graph: Graph) -> Graph:
    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
        node = with_inputs(node, inputs)
        changed = True
        while changed and isinstance(node, Compute):
            changed = False
            for _name, op, fn in RULES:
                if node.op == op and isinstance(node, Compute):
                    new = fn(node, b)
                    if new is not None and new is not node:
                        node = b.add(new)
                        changed = True
                        break
        return node

    return rebuild(graph, rule)


def _fold_store_convert(graph: Graph) -> Graph:
    """store(convert(x) : t) : t -> store(x) : t when the convert has no other use."""
    users = graph.users

    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
        new = with_inputs(node, inputs)
        if isinstance(node, Store) and _op(node.value, "convert") and node.value.dtype is node.dtype \
                and len(users[id(node.value)]) == 1 and _op(new.value, "convert"):
            return dataclasses.replace(new, value=new.value.args[0])
        return new

    return rebuild(graph, rule)


def _fuse_fma(graph: Graph) -> Graph:
    """add(mul(a, b), c) -> multiply_add(a, b, c) when the mul has one use."""
    users = graph.users

    def single(n: Node) -> bool:
        return len(users.get(id(n), ())) == 1

    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
        new = with_inputs(node, inputs)
        if isinstance(new, Compute) and new.op == "add":
            orig_args = node.args
            for k in (0, 1):
                m = new.args[k]
                if _op(m, "mul") and single(orig_args[k]):
                    other = new.args[1 - k]
                    return Compute(f32, op="multiply_add", args=(m.args[0], m.args[1], other), loc=new.loc)
        return new

    return rebuild(graph, rule)


# ---- sympy -------------------------------------------------------------------------------------

ARITH = ops.arithmetic_ops() - {"multiply_add"}


def _count_ops(n: Node, inside: set[int]) -> int:
    if id(n) not in inside:
        return 0
    return 1 + sum(_count_ops(a, inside) for a in n.inputs)


def _sympy_simplify(graph: Graph) -> Graph:
    users = graph.users
    arith = {id(n) for n in graph.nodes if isinstance(n, Compute) and n.op in ARITH}
    # interior nodes of a tree: arithmetic with exactly one user, itself arithmetic
    def is_interior(n: Node) -> bool:
        us = users.get(id(n), ())
        return id(n) in arith and len(us) == 1 and id(us[0]) in arith

    roots = [n for n in graph.nodes if id(n) in arith and not is_interior(n)]
    replacements: dict[int, tuple[sympy.Expr, dict[str, Node], int]] = {}
    for root in roots:
        symbols: dict[int, sympy.Symbol] = {}
        leaves: dict[str, Node] = {}
        inside: set[int] = set()

        def to_sym(n: Node) -> sympy.Expr:
            if n is root or is_interior(n):
                inside.add(id(n))
                a = [to_sym(x) for x in n.args]
                return {"add": lambda: a[0] + a[1], "sub": lambda: a[0] - a[1], "mul": lambda: a[0] * a[1],
                        "div": lambda: a[0] / a[1], "neg": lambda: -a[0]}[n.op]()
            if isinstance(n, Immediate):
                return sympy.Float(n.value, 53) if n.value != int(n.value) else sympy.Integer(int(n.value))
            if id(n) not in symbols:
                name = f"v{len(symbols)}"
                symbols[id(n)] = sympy.Symbol(name, real=True)
                leaves[name] = n
            return symbols[id(n)]

        try:
            expr = to_sym(root)
        except (OverflowError, ValueError):  # inf/nan constants: leave the tree alone
            continue
        before = _count_ops(root, inside)
        best = expr
        for cand in (sympy.factor_terms(expr),):
            if sympy.count_ops(cand) < sympy.count_ops(best):
                best = cand
        # Real algebra may cancel an operand (x*0 -> 0, x - x -> 0, x/x -> 1), which would hide an
        # inf or NaN the kernel would have produced: keep only rewrites that use every leaf.
        if _sympy_op_count(best) < before and best.free_symbols == expr.free_symbols \
                and len(expr.free_symbols) == len(leaves):
            replacements[id(root)] = (best, leaves, before)

    if not replacements:
        return graph

    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
        if id(node) in replacements:
            expr, leaves, _ = replacements[id(node)]
            mapped = {k: mapping[id(v)] for k, v in leaves.items()}
            return _from_sympy(expr, mapped, b, node)
        return with_inputs(node, inputs)

    # rebuild needs the rewritten leaves; capture them through a first pass mapping
    mapping: dict[int, Node] = {}

    def rule_tracking(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
        new = b.add(rule(node, inputs, b))
        mapping[id(node)] = new
        return new

    return rebuild(graph, rule_tracking)


def _sympy_op_count(expr: sympy.Expr) -> int:
    """Ops our IR needs for ``expr`` (n-ary sympy Add/Mul become n-1 binary ops)."""
    if expr.is_Atom:
        return 0
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        args = expr.args
        n = len(args) - 1
        if isinstance(expr, sympy.Mul) and any(a == -1 for a in args):
            n = len(args) - 1  # -1 * x is one neg
        return n + sum(_sympy_op_count(a) for a in args)
    if isinstance(expr, sympy.Pow):
        return 1 + _sympy_op_count(expr.base)
    return 1 + sum(_sympy_op_count(a) for a in expr.args)


def _from_sympy(expr: sympy.Expr, leaves: dict[str, Node], b: GraphBuilder, like: Node) -> Node:
    def imm(v: float) -> Node:
        return b.add(Immediate(f32, value=float(v), loc=like.loc))

    def c(op: str, *args: Node) -> Node:
        return b.add(Compute(f32, op=op, args=args, loc=like.loc))

    def go(e: sympy.Expr) -> Node:
        if e.is_Symbol:
            return leaves[e.name]
        if e.is_Number:
            return imm(float(e))
        if isinstance(e, sympy.Add):
            terms = list(e.args)
            # positive terms first so that subtraction reads naturally: a - b
            pos = [t for t in terms if not _is_negated(t)]
            neg = [t for t in terms if _is_negated(t)]
            acc = go(pos[0]) if pos else c("neg", go(-neg.pop(0)))
            for t in pos[1:]:
                acc = c("add", acc, go(t))
            for t in neg:
                acc = c("sub", acc, go(-t))
            return acc
        if isinstance(e, sympy.Mul):
            coeff, rest = e.as_coeff_Mul()
            if coeff == -1:
                return c("neg", go(rest))
            num, den = sympy.fraction(e)
            if den != 1:
                return c("div", go(num), go(den))
            factors = list(e.args)
            acc = go(factors[0])
            for f in factors[1:]:
                acc = c("mul", acc, go(f))
            return acc
        if isinstance(e, sympy.Pow):
            base, exp = e.args
            if exp == -1:
                return c("div", imm(1.0), go(base))
            if exp.is_Integer and int(exp) > 0:
                acc = go(base)
                x = acc
                for _ in range(int(exp) - 1):
                    acc = c("mul", acc, x)
                return acc
            return c("pow", go(base), imm(float(exp)))
        raise NotImplementedError(type(e))

    return go(expr)


def _is_negated(t: sympy.Expr) -> bool:
    coeff, _ = t.as_coeff_Mul()
    return coeff.is_Number and coeff < 0


def simplify(graph: Graph, arch: str | None = None) -> Graph:
    graph = _apply_rules(graph)
    graph = _sympy_simplify(graph)
    graph = _apply_rules(graph)
    graph = _fold_store_convert(graph)
    graph = _fuse_fma(graph)
    return graph
