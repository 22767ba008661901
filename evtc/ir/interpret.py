"""The reference interpreter: evaluates a Graph on host arrays in float64.

Input: a Graph, the accumulator (``A @ B.T`` in float64) and the epilogue's inputs as numpy
arrays. Output: a dict of numpy float64 arrays, one per output, rounded to the output dtypes.

It is the oracle for the passes (a pass must not change what this returns, up to float64
rounding) and for GPU results. Conversions (``x.to(dtype)``) and output dtypes are modelled
exactly with :func:`evtc.dtypes.round_to`; everything else is float64, which is at least as
accurate as the kernel's f32.

Shapes, with L the batch count (a 2-D accumulator means L = 1):

=================  ==========================================
accumulator, C,    (L, M, N), or (M, N) shared by all batches
aux loads
row broadcast      (N,) or (L, N)
column broadcast   (M,) or (L, M)
scalar             a number, or (L,) for a device scalar per batch
outputs            stores (L, M, N) (a glu's: (L, M, N / 2)); row reductions (L, M); column reductions (L, N);
                   scalar reductions (L,); a GroupScale (L, M, ceil(N / group))
=================  ==========================================
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from evtc import ops
from evtc.dtypes import round_to
from evtc.errors import ArgumentError
from evtc.ir import nodes as N
from evtc.ir.graph import Graph
from evtc.ir.quant import quantize_groups


def _as_batched(leaf: N.Node, value, L: int) -> np.ndarray:
    a = np.asarray(value, dtype=np.float64)
    if isinstance(leaf, (N.Accumulator, N.Source, N.AuxLoad)):
        return a if a.ndim == 3 else a[None]
    if isinstance(leaf, N.RowBroadcast):
        return a[:, None, :] if a.ndim == 2 else a[None, None, :]
    if isinstance(leaf, N.ColBroadcast):
        return a[:, :, None] if a.ndim == 2 else a[None, :, None]
    if isinstance(leaf, N.ScalarBroadcast):
        return a.reshape(-1, 1, 1) if a.ndim == 1 else a.reshape(1, 1, 1)
    raise AssertionError(type(leaf))


def interpret(graph: Graph, acc: np.ndarray, inputs: Mapping[str, object]) -> dict[str, np.ndarray]:
    """Evaluate ``graph`` in float64.

    Args:
        graph: the epilogue.
        acc: the accumulator, (M, N) or (L, M, N).
        inputs: every other input the outputs use, by parameter name (see the module docs for
            shapes). Extra names are ignored.

    Returns:
        Output name -> float64 array rounded to the output's dtype.

    Raises:
        ArgumentError: an input the outputs need is missing.
    """
    acc = np.asarray(acc, dtype=np.float64)
    L = acc.shape[0] if acc.ndim == 3 else 1
    values: dict[int, np.ndarray] = {}
    results: dict[str, np.ndarray] = {}
    quant: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    with np.errstate(all="ignore"):
        for node in graph.nodes:
            if isinstance(node, N.Accumulator):
                values[id(node)] = _as_batched(node, acc, L)
            elif isinstance(node, (N.Source, N.AuxLoad, N.RowBroadcast, N.ColBroadcast, N.ScalarBroadcast)):
                if node.name not in inputs:
                    raise ArgumentError(f"the reference needs input '{node.name}'", epilogue=graph.name)
                values[id(node)] = round_to(_as_batched(node, inputs[node.name], L), node.dtype)
            elif isinstance(node, N.Immediate):
                values[id(node)] = np.float64(node.value)
            elif isinstance(node, N.Compute):
                args = [values[id(a)] for a in node.args]
                if node.op == "convert":
                    values[id(node)] = round_to(args[0], node.dtype)
                elif node.op == "group_quant":  # (q, scales) of the group, for D and its GroupScale
                    v = np.broadcast_to(args[0], (L,) + acc.shape[-2:])
                    quant[id(node)] = quantize_groups(v, node.attr("group"), node.attr("convention"), node.dtype)
                    values[id(node)] = quant[id(node)][0]
                elif node.op == "glu":  # act(gate) * up over the interleaved columns: N / 2 of them
                    v = np.broadcast_to(args[0], (L,) + acc.shape[-2:])
                    values[id(node)] = ops.get(node.attr("act")).numpy(v[..., 0::2]) * v[..., 1::2]
                else:
                    values[id(node)] = np.asarray(ops.get(node.op).numpy(*args), dtype=np.float64)
            elif isinstance(node, N.Store):
                v = np.broadcast_to(values[id(node.value)], (L, acc.shape[-2], node.columns(acc.shape[-1])))
                results[node.name] = round_to(np.array(v), node.dtype)
            elif isinstance(node, N.GroupScale):
                results[node.name] = quant[id(node.value)][1]
            elif isinstance(node, N.Reduction):
                v = np.broadcast_to(values[id(node.value)], (L,) + acc.shape[-2:])
                axis = node.axis.numpy_axis
                fn = {N.ReduceOp.SUM: np.sum, N.ReduceOp.MAX: np.max, N.ReduceOp.MIN: np.min}[node.op]
                results[node.name] = round_to(fn(v, axis=axis), node.dtype)
            else:  # pragma: no cover
                raise AssertionError(type(node))
    return results
