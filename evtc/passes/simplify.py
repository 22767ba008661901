"""Algebraic simplification by local rules.

Input: a Graph. Output: an equivalent Graph in which no rule of :data:`IDENTITIES` matches.

:data:`IDENTITIES` is a table of named rows (tinygrad's ``PatternMatcher``, see
:mod:`evtc.passes.pattern`), applied bottom-up to a fixpoint:

=============  ==============================  ======================================
rule           rewrite                         exact?
=============  ==============================  ======================================
x+0            ``x + 0``, ``0 + x`` -> ``x``   yes, except ``-0.0 + 0.0`` is ``+0.0``
x-0            ``x - 0`` -> ``x``              yes, except the sign of a zero ``x``
0-x            ``0 - x`` -> ``-x``             yes, except the sign of a zero ``x``
x*1            ``x * 1``, ``1 * x`` -> ``x``   yes
x*-1           ``x * -1``, ``-1 * x`` -> ``-x``  yes
x/1            ``x / 1`` -> ``x``              yes
--x            ``-(-x)`` -> ``x``              yes
relu(relu(x))  ``relu(relu(x))`` -> ``relu(x)``  yes (NaN propagates through both)
=============  ==============================  ======================================

No rule assumes fast math: ``x * 0`` is not folded (``inf * 0`` is NaN), nor ``x - x``.
Each row has its own equivalence test (``tests/null/test_rules.py``): both sides evaluated by the
reference interpreter on hypothesis-drawn operand DAGs and inputs, including inf and NaN.

Requires: fold. Ensures: no row of :data:`IDENTITIES` matches. Preserves: outputs, values
(exactly, up to the sign of zero), the locs of rewritten nodes.
"""

from __future__ import annotations

from evtc.ir.graph import Graph
from evtc.ir.verify import Violation
from evtc.passes.manager import Pass, PassResult
from evtc.passes.pattern import PatternMatcher, RewriteRule, apply, const, op, var

__all__ = ["IDENTITIES", "SIMPLIFY", "simplify"]

_x = var("x")

IDENTITIES = PatternMatcher([
    RewriteRule("x+0", op("add", _x, const(0.0), commutative=True), lambda ctx, x: x),
    RewriteRule("x-0", op("sub", _x, const(0.0)), lambda ctx, x: x),
    RewriteRule("0-x", op("sub", const(0.0), _x), lambda ctx, x: ctx.compute("neg", x)),
    RewriteRule("x*1", op("mul", _x, const(1.0), commutative=True), lambda ctx, x: x),
    RewriteRule("x*-1", op("mul", _x, const(-1.0), commutative=True), lambda ctx, x: ctx.compute("neg", x)),
    RewriteRule("x/1", op("div", _x, const(1.0)), lambda ctx, x: x),
    RewriteRule("--x", op("neg", op("neg", _x)), lambda ctx, x: x),
    RewriteRule("relu(relu(x))", op("relu", op("relu", _x, bind="inner")), lambda ctx, x, inner: inner),
])


def simplify(graph: Graph) -> PassResult:
    """Apply :data:`IDENTITIES` to a fixpoint.

    Args:
        graph: a folded Graph.

    Returns:
        The simplified graph.

    Example::

        simplify(g).graph    # (acc * 1.0 + 0.0) / 1.0 - 0.0 + -(-x)  ->  add(acc, x)
    """
    return PassResult.of(graph, apply(graph, IDENTITIES))


def no_identity_matches(graph: Graph) -> Violation | None:
    """What :func:`simplify` (and ``canonicalize``) ensure: no row of :data:`IDENTITIES` matches."""
    return IDENTITIES.violation(graph, "no-identity-matches")


SIMPLIFY = Pass("simplify", simplify, requires=("fold",), ensures=no_identity_matches)
