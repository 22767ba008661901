"""Lowering of ops CUTLASS lacks into ones it has (or into evtc's own functors).

Input: a Graph. Output: a Graph whose computes all have a functor on every arch.

:data:`LOWERINGS`, a table of named rows (:mod:`evtc.passes.pattern`): ``pow(x, c)`` for c in
{0, 1, 2, 3, 0.5, -0.5, -1} becomes ``1``, ``x``, ``x*x``, ``x*x*x``, ``sqrt``, ``rsqrt``,
``1/x``; other exponents stay ``pow`` (``evtc::Pow``, ``powf``). Every other op of the table
has a functor (``cutlass::`` or ``evtc::``); an op without one raises
:class:`~evtc.errors.UnsupportedOpError` naming the op.

Values: ``x*x*x`` rounds twice where ``powf`` rounds once. ``rsqrt`` differs from ``pow(x, -0.5)``
at ``x = -inf`` (``pow`` gives 0, ``rsqrt`` NaN) and ``x = -0`` (``pow`` gives ``+inf``,
``rsqrt`` ``-inf``); the rule tests name these exceptions and check every other value. On the
device ``sqrt`` also differs from ``powf(x, 0.5)`` at ``x = -inf`` (C99 F.9.4.4 gives ``+inf``,
``sqrtf`` NaN), where numpy's ``power``, the interpreter's rule for ``pow``, already gives NaN.

Requires: fold. Ensures: every compute has a functor and no row of :data:`LOWERINGS` matches.
Preserves: values (up to f32 rounding and the exception above).
"""

from __future__ import annotations

from evtc import ops
from evtc.errors import UnsupportedOpError
from evtc.ir.graph import Graph
from evtc.ir.nodes import Compute
from evtc.ir.verify import Violation
from evtc.passes.manager import Pass, PassResult, at
from evtc.passes.pattern import PatternMatcher, RewriteRule, apply, const, op, var

__all__ = ["LOWER", "LOWERINGS", "lower"]

_x = var("x")

LOWERINGS = PatternMatcher([
    RewriteRule("x**0", op("pow", _x, const(0.0)), lambda ctx, x: ctx.const(1.0)),
    RewriteRule("x**1", op("pow", _x, const(1.0)), lambda ctx, x: x),
    RewriteRule("x**2", op("pow", _x, const(2.0)), lambda ctx, x: ctx.compute("mul", x, x)),
    RewriteRule("x**3", op("pow", _x, const(3.0)), lambda ctx, x: ctx.compute("mul", ctx.compute("mul", x, x), x)),
    RewriteRule("x**0.5", op("pow", _x, const(0.5)), lambda ctx, x: ctx.compute("sqrt", x),
                doc="on the device, differs at x = -inf: powf gives +inf, sqrtf NaN (numpy's power gives NaN too)"),
    RewriteRule("x**-0.5", op("pow", _x, const(-0.5)), lambda ctx, x: ctx.compute("rsqrt", x),
                doc="differs at x = -inf (pow gives 0, rsqrt NaN) and x = -0 (pow gives +inf, rsqrt -inf)"),
    RewriteRule("x**-1", op("pow", _x, const(-1.0)), lambda ctx, x: ctx.compute("div", ctx.const(1.0), x)),
])


def _check_functors(graph: Graph) -> None:
    for n in graph.nodes:
        if isinstance(n, Compute):
            at(n)
            if not ops.get(n.op).functor:
                raise UnsupportedOpError(f"op '{n.op}' has no CUTLASS or evtc functor", loc=n.loc,
                                         epilogue=graph.name,
                                         hint="register a functor for it in evtc/ops.py, or write it with other ops")


def lower(graph: Graph) -> PassResult:
    """Apply :data:`LOWERINGS`, then check that every op has a functor.

    Args:
        graph: a folded Graph.

    Returns:
        The lowered graph.

    Raises:
        UnsupportedOpError: an op has no functor (located at its line).

    Example::

        lower(g).graph    # pow(acc, 2.0)  ->  mul(acc, acc)
    """
    out = apply(graph, LOWERINGS)
    _check_functors(out)
    return PassResult.of(graph, out)


def every_op_has_a_functor(graph: Graph) -> Violation | None:
    """What :func:`lower` ensures: no row of :data:`LOWERINGS` matches and every compute's op
    has a functor."""
    unlowered = LOWERINGS.violation(graph, "lowered")
    if unlowered is not None:
        return unlowered
    for n in graph.nodes:
        if isinstance(n, Compute) and not ops.get(n.op).functor:
            return Violation("lowered", f"op '{n.op}' has no functor", n)
    return None


LOWER = Pass("lower", lower, requires=("fold",), ensures=every_op_has_a_functor)
