"""A float32 stand-in for a kernel, on the host: what the GPU-free oracle tests feed to
``evtc.testing.verify`` as "the kernel's outputs".

Input: a Graph, A and B (float64 arrays holding values of the operand dtype) and the epilogue's
inputs. Output: output name -> float64 array of the output dtype's values, computed the way the
kernel does: an f32 accumulator, every op in f32, ``tanh`` with a relative error of up to
2^-11 (PTX ``tanh.approx.f32``), conversions and stores rounded from f32, reductions summed in
f32 per 64-element chunk and then across chunks in a shuffled order (the tile partials and the
atomics).
"""

from __future__ import annotations

import numpy as np

from evtc import dtypes, ops
from evtc.ir.graph import Graph
from evtc.ir.nodes import (
    Accumulator,
    AuxLoad,
    ColBroadcast,
    Compute,
    Immediate,
    ReduceOp,
    Reduction,
    RowBroadcast,
    ScalarBroadcast,
    Source,
    Store,
)

LEAVES = (Source, AuxLoad, RowBroadcast, ColBroadcast, ScalarBroadcast)


def batched(leaf, value, L: int) -> np.ndarray:
    a = np.asarray(value, dtype=np.float64)
    if isinstance(leaf, (Accumulator, Source, AuxLoad)):
        return a if a.ndim == 3 else a[None]
    if isinstance(leaf, RowBroadcast):
        return a[:, None, :] if a.ndim == 2 else a[None, None, :]
    if isinstance(leaf, ColBroadcast):
        return a[:, :, None] if a.ndim == 2 else a[None, :, None]
    return a.reshape(-1, 1, 1) if a.ndim == 1 else a.reshape(1, 1, 1)


def reduce_axis(node: Reduction):
    return {1: 2, 0: 1, None: (1, 2)}[node.dim]


def _f32_sum(v: np.ndarray, axis, rng) -> np.ndarray:
    """Sum over ``axis`` in f32: 64-element chunks, then the chunk partials in a shuffled order."""
    axes = axis if isinstance(axis, tuple) else (axis,)
    keep = [a for a in range(v.ndim) if a not in axes]
    flat = np.moveaxis(v, keep, list(range(len(keep)))).reshape(tuple(v.shape[a] for a in keep) + (-1,))
    n = flat.shape[-1]
    pad = (-n) % 64
    flat = np.concatenate([flat, np.zeros(flat.shape[:-1] + (pad,), np.float32)], axis=-1)
    parts = flat.reshape(flat.shape[:-1] + (-1, 64)).sum(axis=-1, dtype=np.float32)
    order = rng.permutation(parts.shape[-1])
    total = np.zeros(parts.shape[:-1], np.float32)
    for i in order:
        total = (total + parts[..., i]).astype(np.float32)
    return total


def emulate(graph: Graph, A: np.ndarray, B: np.ndarray, inputs: dict, rng: np.random.Generator) -> dict:
    """The outputs an f32 kernel would give (see the module docs)."""
    acc = (A.astype(np.float32) @ np.swapaxes(B.astype(np.float32), -1, -2)).astype(np.float32)
    L = acc.shape[0] if acc.ndim == 3 else 1
    mn = (L,) + acc.shape[-2:]
    vals: dict[int, np.ndarray] = {}
    out: dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for node in graph.nodes:
            if isinstance(node, Accumulator):
                vals[id(node)] = acc.reshape(mn)
            elif isinstance(node, LEAVES):
                v = dtypes.round_to(batched(node, inputs[node.name], L), node.dtype)
                vals[id(node)] = v.astype(np.float32)
            elif isinstance(node, Immediate):
                vals[id(node)] = np.float32(node.value)
            elif isinstance(node, Compute):
                args = [vals[id(a)] for a in node.args]
                if node.op == "convert":
                    r = dtypes.round_to(args[0].astype(np.float64), node.dtype)
                else:
                    r = np.asarray(ops.get(node.op).numpy(*args))
                    if node.op == "tanh":
                        r = r * (1 + rng.uniform(-2.0 ** -11, 2.0 ** -11, np.shape(r)))
                vals[id(node)] = np.asarray(r).astype(np.float32)
            elif isinstance(node, Store):
                v = np.broadcast_to(vals[id(node.value)], mn).astype(np.float64)
                out[node.name] = dtypes.round_to(v, node.dtype)
            elif isinstance(node, Reduction):
                v = np.broadcast_to(vals[id(node.value)], mn).astype(np.float32)
                axis = reduce_axis(node)
                if node.op is ReduceOp.SUM:
                    r = _f32_sum(v, axis, rng)
                else:
                    r = (np.max if node.op is ReduceOp.MAX else np.min)(v, axis=axis)
                out[node.name] = dtypes.round_to(np.asarray(r, dtype=np.float64), node.dtype)
    return out


def host_problem(graph: Graph, a, shape, seed: int):
    """Random A, B (values of dtype ``a``, scaled as ``evtc.testing.make_inputs`` does) and
    epilogue inputs for ``shape = (M, N, K, L)``, as float64 numpy arrays.

    Returns:
        (A, B, inputs, acc, sq_dot): ``acc = A @ B^T`` and ``sum_k a^2 b^2`` in float64.
    """
    M, N, K, L = shape
    rng = np.random.default_rng(seed)
    s = K ** -0.25
    A = dtypes.round_to(np.clip(rng.standard_normal((L, M, K)) * s, -a.max, a.max), a)
    B = dtypes.round_to(np.clip(rng.standard_normal((L, N, K)) * s, -a.max, a.max), a)
    ins: dict = {}
    for leaf in graph.inputs:
        if isinstance(leaf, Accumulator):
            continue
        if isinstance(leaf, (Source, AuxLoad)):
            v = rng.standard_normal((L, M, N))
        elif isinstance(leaf, RowBroadcast):
            v = rng.standard_normal((L, N))
        elif isinstance(leaf, ColBroadcast):
            v = rng.standard_normal((L, M))
        else:
            v = rng.uniform(0.5, 1.5, L) if leaf.by_pointer else float(rng.uniform(0.5, 1.5))
        if not isinstance(leaf, ScalarBroadcast):
            v = dtypes.round_to(np.clip(v, -leaf.dtype.max, leaf.dtype.max), leaf.dtype)
        ins[leaf.name] = v
    Bt = np.swapaxes(B, -1, -2)
    return A, B, ins, A @ Bt, (A * A) @ (Bt * Bt)
