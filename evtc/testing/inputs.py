"""The oracle's device half: fresh random inputs and NaN-poisoned outputs for a GEMM problem.

Input: an epilogue's Graph, the operand dtypes and a :class:`Problem` (M, N, K, L). Output: torch
tensors on a device: A, B and every epilogue input, random and never zeros (:func:`make_inputs`);
every output preallocated and NaN-filled, row padding included (:func:`poisoned_outputs`), so an
unwritten element or a write past the last column fails :mod:`evtc.testing.oracle`'s check.
torch is imported only when a tensor is made.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from evtc.dtypes import DType
from evtc.ir.graph import Graph
from evtc.ir.nodes import Reduction, Store
from evtc.runtime.timing import padded_empty, random_inputs, random_tensor  # noqa: F401 (re-exported)
from evtc.testing.oracle import to_numpy

__all__ = ["Problem", "make_inputs", "padded_empty", "padding_of", "poisoned_outputs", "random_tensor"]


@dataclasses.dataclass
class Problem:
    """A GEMM problem: A is (L, M, K), B is (L, N, K), outputs (L, M, N)."""

    M: int
    N: int
    K: int
    L: int = 1


def _torch():
    import torch  # noqa: PLC0415 - only the GPU paths need it

    return torch


def padding_of(x):
    """The row padding after the last column of a tensor from :func:`padded_empty` (None when it
    has none), as a float64 numpy array."""
    if x.dim() < 2 or x.stride(-1) != 1 or x.stride(-2) <= x.shape[-1]:
        return None
    full = x.as_strided(tuple(x.shape[:-1]) + (x.stride(-2),), x.stride())
    return to_numpy(full[..., x.shape[-1]:])


def make_inputs(graph: Graph, a: DType, b: DType, p: Problem, *, device="cuda", seed=0, batched=None) -> dict[str, Any]:
    """Fresh random A, B and epilogue inputs for ``graph`` (torch tensors on ``device``):
    :func:`evtc.runtime.timing.random_inputs`.

    Values are N(0, 1) scaled so ``acc`` is O(1) (A and B scaled by K^-1/4) and zero-mean (the
    accumulator's error model assumes it); scalars are drawn from [0.5, 1.5]; inputs of
    ``log``/``sqrt``-style ops are not special-cased, so epilogues using them should take
    ``abs`` first or the tests choose their own data.
    """
    return random_inputs(graph, a, b, p, device=device, seed=seed, batched=batched)


def poisoned_outputs(graph: Graph, p: Problem, *, device="cuda", batched=None) -> dict[str, Any]:
    """Every output preallocated and filled with NaN, row padding included (so unwritten
    elements, and writes past the last column, fail the check)."""
    torch = _torch()
    batched = p.L > 1 if batched is None else batched
    lead = (p.L,) if batched else ()
    out = {}
    for o in graph.outputs:
        if isinstance(o, Store):
            out[o.name] = padded_empty(torch, lead + (p.M, o.columns(p.N)), o.dtype, device)
        elif isinstance(o, Reduction):
            if o.kind == "group_scale":  # in the layout the output declares, padding included
                shape = lead + (p.M, o.groups(p.N))
                strides = o.tensor_strides(p.M, p.N, batched)
                storage = torch.full((max(p.L if batched else 1, 1) * max(o.storage(p.M, p.N), 1),), float("nan"),
                                     dtype=torch.float32, device=device)
                out[o.name] = storage.as_strided(shape, strides)
                continue
            ext = o.axis.shape(p.M, p.N)
            shape = lead + ext
            t = padded_empty(torch, shape or (1,), o.dtype, device)
            out[o.name] = t if shape else t[0]
    return out
