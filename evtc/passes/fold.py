"""Constant folding.

Input: a Graph. Output: a Graph in which no compute has only constant operands.

A compute whose operands are all immediates is evaluated with the op's float64 numpy rule and
replaced by an immediate holding the f32-rounded result (a ``convert`` rounds to its dtype
first, so ``(0.1).to(e4m3)`` folds to the e4m3 value, held in f32 exactly).

Requires: propagate. Guarantees: no all-constant compute. Preserves: outputs and their values
up to f32 rounding of the folded constants (the kernel computes them in f32 too).
"""

from __future__ import annotations

import numpy as np

from evtc import ops
from evtc.dtypes import f32, round_to
from evtc.ir.graph import Graph, GraphBuilder, rebuild, with_inputs
from evtc.ir.nodes import Compute, Immediate, Node


def _fold(node: Node, inputs: tuple[Node, ...], b: GraphBuilder) -> Node:
    node = with_inputs(node, inputs)
    if isinstance(node, Compute) and node.op != "first" and inputs and all(isinstance(i, Immediate) for i in inputs):
        vals = [np.float64(i.value) for i in inputs]
        with np.errstate(all="ignore"):
            if node.op == "convert":
                v = round_to(np.asarray(vals[0]), node.dtype)
            else:
                v = ops.get(node.op).numpy(*vals)
        return Immediate(f32, value=float(round_to(np.asarray(v, dtype=np.float64), f32)), loc=node.loc)
    return node


def fold(graph: Graph, arch: str | None = None) -> Graph:
    return rebuild(graph, _fold)
