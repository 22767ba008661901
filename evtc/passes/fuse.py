"""Fusions into what CUTLASS's visitors already do.

Input: a Graph. Output: an equivalent Graph in which no rule of :data:`FUSIONS` matches.

:data:`FUSIONS`, a table of named rows (:mod:`evtc.passes.pattern`), applied bottom-up:

=================  ===============================================  ============================
rule               rewrite                                          condition
=================  ===============================================  ============================
store(convert(x))  ``store(convert(x) : t) : t -> store(x) : t``    the convert has no other use
                   (the store rounds to ``t`` the same way, once)
a*b+c              ``a * b + c``, ``c + a * b`` ->                   the product has no other use
                   ``multiply_add(a, b, c)`` (``cutlass::multiply_add``)
=================  ===============================================  ============================

Both preserve values in the reference interpreter exactly (rounding to ``t`` twice is rounding
once; the interpreter's ``multiply_add`` is ``a * b + c`` in float64); on the GPU an fma rounds
once instead of twice. Each row has its own equivalence test (``tests/null/test_rules.py``).

Requires: canonicalize (so that sympy's trees, which it builds from ``add`` and ``mul``, are
final). Ensures: no row of :data:`FUSIONS` matches. Preserves: outputs, values, the loc of the
fused ``add``.
"""

from __future__ import annotations

import dataclasses

from evtc.dtypes import f32
from evtc.ir.graph import Graph
from evtc.ir.nodes import Compute, Node, Store
from evtc.ir.verify import Violation
from evtc.passes.manager import Pass, PassResult
from evtc.passes.pattern import Pat, PatternMatcher, RewriteContext, RewriteRule, apply, op, var

__all__ = ["FUSE", "FUSIONS", "fuse"]


def _store_convert(ctx: RewriteContext, store: Store, cv: Node, x: Node) -> Node | None:
    if cv.dtype is store.dtype and ctx.single_use(cv):
        return dataclasses.replace(store, value=x)
    return None


def _fma(ctx: RewriteContext, add: Node, m: Node, a: Node, b: Node, c: Node) -> Node | None:
    if ctx.single_use(m):
        return Compute(f32, op="multiply_add", args=(a, b, c), loc=add.loc)
    return None


FUSIONS = PatternMatcher([
    RewriteRule("store(convert(x))",
                Pat(kind=Store, name="store", src=(op("convert", var("x"), bind="cv"),)), _store_convert),
    RewriteRule("a*b+c", op("add", op("mul", var("a"), var("b"), bind="m"), var("c"), commutative=True, bind="add"),
                _fma),
])


def fuse(graph: Graph) -> PassResult:
    """Apply :data:`FUSIONS`.

    Args:
        graph: a canonicalized Graph.

    Returns:
        The fused graph.

    Example::

        fuse(g).graph    # D = store(convert(add(mul(alpha, acc), C)) : e4m3) : e4m3
                         #   -> D = store(multiply_add(alpha, acc, C)) : e4m3
    """
    return PassResult.of(graph, apply(graph, FUSIONS))


def no_fusion_matches(graph: Graph) -> Violation | None:
    """What :func:`fuse` ensures: no row of :data:`FUSIONS` matches."""
    return FUSIONS.violation(graph, "no-fusion-matches")


FUSE = Pass("fuse", fuse, requires=("canonicalize",), ensures=no_fusion_matches)
