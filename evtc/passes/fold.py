"""Constant folding.

Input: a Graph. Output: a Graph in which no compute has only constant operands, or a located
:class:`~evtc.errors.ConstantFoldError`.

A compute whose operands are all immediates is evaluated with the op's float64 numpy rule and
replaced by an immediate holding the f32-rounded result (a ``convert`` rounds to its dtype
first, so ``(0.1).to(e4m3)`` folds to the e4m3 value, held in f32 exactly; it saturates as the
kernel's conversion does).

NOTE [Constant folding refuses what f32 can't hold]
    One rule for every fold (:func:`check_fold`): when every operand is finite but the result,
    in the compute type, is not (``exp(100.0)`` = 2.7e43 > 3.4e38 in f32, ``exp(1000)``,
    ``log(0.0)``, ``sqrt(-1.0)``, ``rsqrt(0.0)``, ``0.0 * inf`` excepted), folding raises a
    located :class:`~evtc.errors.ConstantFoldError` rather than keep inf or NaN: the kernel would
    compute it in every element while the user meant a number. This pass folds in f32 (as the
    kernel computes); the expression form's folds (:meth:`evtc.frontend.builder.IRBuilder.fold`)
    and ``evtc.*`` functions called on numbers follow Python and fold in float64, so there only
    inf and NaN are refused (a finite float64 beyond f32 is refused when it becomes a
    constant of the graph). Results that underflow to zero or a subnormal fold to that value;
    operands that are already inf or NaN (``float("inf")``, written by the user) fold to what
    IEEE arithmetic gives, silently: the user asked for them.

Requires: propagate. Ensures: no all-constant compute (other than ``first``). Preserves:
outputs and their values up to f32 rounding of the folded constants (the kernel computes them
in f32 too).
"""

from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np

from evtc import ops
from evtc.dtypes import f32, round_to
from evtc.errors import ConstantFoldError, SourceLoc
from evtc.ir.graph import Graph, GraphBuilder, with_inputs
from evtc.ir.nodes import Compute, Immediate, Node
from evtc.ir.printer import format_float
from evtc.ir.verify import Violation
from evtc.passes.manager import Pass, PassResult, rewrite

__all__ = ["FOLD", "check_fold", "fold"]


def _finite(x: Any) -> bool:
    """Whether a folded operand or result is finite (ints and bools always are)."""
    if isinstance(x, (bool, int, np.bool_, np.integer)):
        return True
    try:
        return bool(np.all(np.isfinite(np.asarray(x, dtype=np.float64))))
    except (TypeError, ValueError, OverflowError):
        return True  # not a number at all: the caller reports that


def check_fold(expr: str, operands: Sequence[Any], result: Any, *, exact: Any = None, loc: SourceLoc | None,
               epilogue: str | None) -> None:
    """The one rule of constant folding (NOTE [Constant folding refuses what f32 can't hold]):
    finite operands must give a finite result.

    Args:
        expr: the expression as the user would read it, e.g. ``exp(1000.0)``.
        operands: the constants folded.
        result: the result in the compute type.
        exact: the float64 result, when ``result`` was rounded from it (for the message).
        loc: the user's line; ``epilogue``: the epilogue's name.

    Raises:
        ConstantFoldError: every operand is finite and ``result`` is inf or NaN.

    Example::

        check_fold("log(0.0)", [0.0], -inf, loc=loc, epilogue="e")   # raises: "... is infinite (-inf)"
    """
    if _finite(result) or not all(_finite(x) for x in operands):
        return
    value = float(np.asarray(result if exact is None else exact, dtype=np.float64))
    if math.isnan(value):
        what = "is not a number"
    elif math.isfinite(value):  # (only when rounding to f32 overflowed)
        what = f"is {value:.4g}, beyond f32's range (+-{f32.max:.4g})"
    else:
        what = f"is infinite ({format_float(value)})"
    raise ConstantFoldError(
        f"the constant expression {expr} {what}", loc=loc, epilogue=epilogue,
        hint="the kernel would compute with inf or NaN here; check the constant (or pass it as a runtime "
             "scalar if it is meant)",
    )


def _foldable(node: Node) -> bool:
    return (isinstance(node, Compute) and node.op != "first" and bool(node.args)
            and all(isinstance(i, Immediate) for i in node.args))


def _fold(graph: Graph):
    def rule(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
        node = with_inputs(node, inputs)
        if not _foldable(node):
            return node
        vals = [np.float64(i.value) for i in inputs]
        with np.errstate(all="ignore"):
            if node.op == "convert":
                v = round_to(np.asarray(vals[0]), node.dtype)
            else:
                v = ops.get(node.op).numpy(*vals)
            folded = float(round_to(np.asarray(v, dtype=np.float64), f32))
        shown = ", ".join(format_float(float(x)) for x in vals)
        expr = f"({shown}).to({node.dtype})" if node.op == "convert" else f"{node.op}({shown})"
        check_fold(expr, vals, folded, exact=v, loc=node.loc, epilogue=graph.name)
        return Immediate(f32, value=folded, loc=node.loc)

    return rule


def fold(graph: Graph) -> PassResult:
    """Fold every all-constant compute (module docs).

    Args:
        graph: a propagated Graph.

    Returns:
        The folded graph.

    Raises:
        ConstantFoldError: finite constants give a result f32 can't hold (NOTE [Constant
            folding refuses what f32 can't hold]), located at the compute's line.

    Example::

        fold(g).graph    # acc * (2.0 * 3.0 + exp(0.0))  ->  mul(acc, 7.0)
    """
    return PassResult.of(graph, rewrite(graph, _fold(graph)))


def nothing_left_to_fold(graph: Graph) -> Violation | None:
    """What :func:`fold` ensures: no compute other than ``first`` has only constant operands."""
    for n in graph.nodes:
        if _foldable(n):
            return Violation("no-constant-computes", f"'{n.op}' has only constant operands", n)
    return None


FOLD = Pass("fold", fold, requires=("propagate",), ensures=nothing_left_to_fold)
