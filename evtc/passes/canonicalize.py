"""Canonical form of arithmetic trees through sympy: the one place evtc uses sympy.

Input: a Graph. Output: an equivalent Graph whose arithmetic trees are in sympy's canonical
form where that takes fewer ops.

Maximal trees of ``add``/``sub``/``mul``/``div``/``neg`` (interior values with exactly one use,
by another op of the tree; at most :data:`MAX_TREE_OPS` ops each, larger trees are cut into
several) are translated to sympy with the op table's ``sympy`` column (:mod:`evtc.ops`), the
tree's other operands becoming real symbols. sympy collects like terms and constants
(``2 * (3 * x) -> 6 * x``, ``x + x -> 2 * x``); the result replaces the tree only if

* it has strictly fewer ops,
* it still uses every operand of the tree (a cancellation such as ``x - x -> 0`` or
  ``x * 0 -> 0`` would hide an inf or NaN the kernel would have produced), and
* it is real and finite: built from symbols, real numbers whose magnitude an f32 immediate
  holds, ``+``, ``*`` and powers with a real exponent. ``x / 0`` is ``zoo * x`` in sympy
  (complex infinity), and ``zoo``, ``nan``, ``oo`` or ``I`` have no f32 meaning: such trees
  keep their original ops (the kernel then computes ``x / 0`` as IEEE arithmetic does).

Then :data:`~evtc.passes.simplify.IDENTITIES` run again (sympy's form may read ``1.0 * x``).

Rounding: exact algebra on reals can change f32 rounding (reassociation); the tests check the
pass with the reference interpreter on random inputs within a relative tolerance.

Requires: simplify. Ensures: no row of ``IDENTITIES`` matches. Preserves: outputs, values up to
f32 rounding, the loc of each tree's root.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from evtc import ops
from evtc.dtypes import f32
from evtc.ir.graph import Graph, GraphBuilder, with_inputs
from evtc.ir.nodes import Compute, Immediate, Node
from evtc.passes.manager import Pass, PassResult, at, rewrite
from evtc.passes.pattern import apply
from evtc.passes.simplify import IDENTITIES, no_identity_matches

if TYPE_CHECKING:
    import sympy

__all__ = ["ARITH", "CANONICALIZE", "MAX_TREE_OPS", "canonicalize", "representable"]

#: the ops sympy may rewrite freely (exact algebra on reals); ``multiply_add`` is formed later
ARITH = ops.arithmetic_ops() - {"multiply_add"}

#: the largest tree handed to sympy in one piece; bounds sympy's time and the recursion depth
MAX_TREE_OPS = 64


def _trees(graph: Graph) -> list[tuple[Node, list[Node]]]:
    """(root, nodes of its tree in pre-order) for every arithmetic tree of ``graph``."""
    users = graph.users
    arith = {id(n) for n in graph.nodes if isinstance(n, Compute) and n.op in ARITH}

    def interior(n: Node) -> bool:
        us = users.get(id(n), ())
        return id(n) in arith and len(us) == 1 and id(us[0]) in arith

    work = [n for n in graph.nodes if id(n) in arith and not interior(n)]
    trees = []
    k = 0
    while k < len(work):
        root = work[k]
        k += 1
        inside: list[Node] = []
        stack = [root]
        while stack:
            n = stack.pop()
            if len(inside) == MAX_TREE_OPS:
                work.append(n)  # cut: the rest of the tree is a tree of its own
                continue
            inside.append(n)
            stack.extend(a for a in reversed(n.args) if interior(a))
        trees.append((root, inside))
    return trees


def representable(expr: sympy.Expr) -> bool:
    """True when ``expr`` is something :func:`_from_sympy` can build with f32 ops: symbols,
    finite real numbers within f32 range, sums, products and powers with a real exponent.

    ``zoo`` (``x / 0``), ``nan``, ``oo``, ``I`` and numbers beyond f32's range are not.
    """
    import sympy  # on first use, not at import: sympy alone takes 0.15-0.3 s to import

    for e in sympy.preorder_traversal(expr):
        if e.is_Symbol or isinstance(e, (sympy.Add, sympy.Mul)):
            continue
        if isinstance(e, sympy.Pow):
            if not (e.exp.is_Number and e.exp.is_real and e.exp.is_finite):
                return False
            continue
        if e.is_Number and e.is_real and e.is_finite and abs(float(e)) <= f32.max:
            continue
        return False
    return True


def _op_count(expr: sympy.Expr) -> int:
    """Ops evtc's IR needs for ``expr`` (an n-ary sympy Add/Mul is n-1 binary ops)."""
    import sympy

    if expr.is_Atom:
        return 0
    if isinstance(expr, (sympy.Add, sympy.Mul)):
        return len(expr.args) - 1 + sum(_op_count(a) for a in expr.args)
    if isinstance(expr, sympy.Pow):
        return 1 + _op_count(expr.base)
    return 1 + sum(_op_count(a) for a in expr.args)


def _to_sympy(root: Node, inside: set[int]) -> tuple[sympy.Expr, dict[str, Node]] | None:
    """The tree at ``root`` as a sympy expression and its symbols' nodes; None when a constant
    isn't finite. Symbols are numbered in depth-first, left-to-right order (sympy orders terms
    by name, so the numbering fixes the output's operand order)."""
    import sympy

    symbols: dict[int, sympy.Symbol] = {}
    leaves: dict[str, Node] = {}

    def go(n: Node) -> sympy.Expr:  # recursion depth <= MAX_TREE_OPS
        if id(n) in inside:
            return ops.get(n.op).sympy(*(go(a) for a in n.args))
        if isinstance(n, Immediate):
            if not math.isfinite(n.value):
                raise _NotFinite
            return sympy.Float(n.value, 53) if n.value != int(n.value) else sympy.Integer(int(n.value))
        if id(n) not in symbols:
            name = f"v{len(symbols)}"
            symbols[id(n)] = sympy.Symbol(name, real=True)
            leaves[name] = n
        return symbols[id(n)]

    try:
        return go(root), leaves
    except _NotFinite:
        return None


class _NotFinite(Exception):
    pass


def _canonical_form(expr: sympy.Expr) -> sympy.Expr:
    """sympy's candidate for ``expr`` (the expression as built is already canonical; pulling
    out common factors may save more)."""
    import sympy

    best = expr
    for cand in (sympy.factor_terms(expr),):
        if sympy.count_ops(cand) < sympy.count_ops(best):
            best = cand
    return best


def canonicalize(graph: Graph) -> PassResult:
    """Replace arithmetic trees by sympy's canonical form where that is shorter (module docs).

    Args:
        graph: a simplified Graph.

    Returns:
        The graph with rewritten trees, then :data:`~evtc.passes.simplify.IDENTITIES` applied.
    """
    replacements: dict[int, tuple[sympy.Expr, dict[str, Node]]] = {}
    for root, tree in _trees(graph):
        at(root)
        inside = {id(n) for n in tree}
        translated = _to_sympy(root, inside)
        if translated is None:
            continue
        expr, leaves = translated
        best = _canonical_form(expr)
        if (_op_count(best) < len(tree) and best.free_symbols == expr.free_symbols
                and len(expr.free_symbols) == len(leaves) and representable(best)):
            replacements[id(root)] = (best, leaves)
    if not replacements:
        return PassResult(graph, False)

    mapping: dict[int, Node] = {}

    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
        if id(node) in replacements:
            expr, leaves = replacements[id(node)]
            new = _from_sympy(expr, {k: mapping[id(v)] for k, v in leaves.items()}, b, node)
        else:
            new = with_inputs(node, inputs)
        new = b.add(new)
        mapping[id(node)] = new
        return new

    out = apply(rewrite(graph, rule), IDENTITIES)
    return PassResult.of(graph, out)


def _from_sympy(expr: sympy.Expr, leaves: dict[str, Node], b: GraphBuilder, like: Node) -> Node:
    """Build ``expr`` (a :func:`representable` expression) with f32 computes at ``like``'s loc."""
    import sympy


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
            # positive terms first so that subtraction reads naturally: a - b
            pos = [t for t in e.args if not _is_negated(t)]
            neg = [t for t in e.args if _is_negated(t)]
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
            acc = go(e.args[0])
            for f in e.args[1:]:
                acc = c("mul", acc, go(f))
            return acc
        if isinstance(e, sympy.Pow):
            base, exp = e.args
            if exp == -1:
                return c("div", imm(1.0), go(base))
            if exp.is_Integer and int(exp) > 0:
                acc = x = go(base)
                for _ in range(int(exp) - 1):
                    acc = c("mul", acc, x)
                return acc
            return c("pow", go(base), imm(float(exp)))
        raise TypeError(f"no f32 form for the sympy expression {type(e).__name__}")  # representable() excludes it

    return go(expr)


def _is_negated(t: sympy.Expr) -> bool:
    coeff, _ = t.as_coeff_Mul()
    return coeff.is_Number and coeff < 0


CANONICALIZE = Pass("canonicalize", canonicalize, requires=("simplify",), ensures=no_identity_matches)
