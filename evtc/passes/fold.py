"""Constant folding.

Input: a Graph. Output: a Graph in which no compute has only constant operands, or a located
:class:`~evtc.errors.ConstantFoldError`.

A compute whose operands are all immediates is evaluated with the op's float64 numpy rule and
replaced by an immediate holding the f32-rounded result (a ``convert`` rounds to its dtype
first, so ``(0.1).to(e4m3)`` folds to the e4m3 value, held in f32 exactly; it saturates as the
kernel's conversion does).

NOTE [Constant folding refuses what f32 can't hold]
    When every operand is finite but the result is not representable in the f32 compute type
    (it overflows f32, like ``exp(100.0)`` = 2.7e43 > 3.4e38, or is NaN, like ``log(-1.0)``
    or ``0.0 / 0.0``), folding raises a :class:`~evtc.errors.ConstantFoldError` at the user's
    line rather than keep the compute: either choice gives inf or NaN in every element of the
    kernel's result, while the float64 reference (and the user's intent) may differ, so the
    epilogue is almost surely wrong and the user is told where. Results that underflow to zero
    or a subnormal fold to the f32 value (as the kernel computes them). Operands that are
    already inf or NaN (``float("inf")`` written by the user) fold to what IEEE arithmetic
    gives, silently: the user asked for them.

Requires: propagate. Ensures: no all-constant compute (other than ``first``). Preserves:
outputs and their values up to f32 rounding of the folded constants (the kernel computes them
in f32 too).
"""

from __future__ import annotations

import math

import numpy as np

from evtc import ops
from evtc.dtypes import f32, round_to
from evtc.errors import ConstantFoldError
from evtc.ir.graph import Graph, GraphBuilder, with_inputs
from evtc.ir.nodes import Compute, Immediate, Node
from evtc.ir.printer import format_float
from evtc.ir.verify import Violation
from evtc.passes.manager import Pass, PassResult, rewrite

__all__ = ["FOLD", "fold"]


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
        if not math.isfinite(folded) and all(math.isfinite(x) for x in vals):
            shown = ", ".join(format_float(float(x)) for x in vals)
            exact = float(np.asarray(v, dtype=np.float64))
            what = "is not a number" if math.isnan(exact) else (
                f"is {exact:.4g}, beyond f32's range (+-{f32.max:.4g})" if math.isfinite(exact) else "is infinite")
            expr = f"({shown}).to({node.dtype})" if node.op == "convert" else f"{node.op}({shown})"
            raise ConstantFoldError(
                f"the constant expression {expr} {what}",
                loc=node.loc, epilogue=graph.name,
                hint="the kernel would compute with inf or NaN here; check the constant (or pass it as a runtime "
                     "scalar if it is meant)",
            )
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
