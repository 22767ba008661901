"""Helpers to check an evtc kernel against the references (used by the GPU tests, the demo and
``evtc run``).

Input: a :class:`evtc.Gemm` (or Graph), a problem size and a random generator. Output: inputs
(fresh random data, never zeros), NaN-poisoned outputs, and relative errors against the float64
interpreter, ``||out - ref|| / ||ref||`` per output.

Tolerances come from the output dtype: the relative rounding error of one conversion is
``dtype.eps`` (2^-(mantissa+1)); the bound allows four of those plus 1e-4 for f32 arithmetic
and the activation functions' f32 implementations.
"""

from __future__ import annotations

import dataclasses
import sys
from typing import Any

import numpy as np

from evtc import dtypes
from evtc.dtypes import DType
from evtc.ir.graph import Graph
from evtc.ir.interpret import interpret
from evtc.ir.nodes import (
    Accumulator,
    AuxLoad,
    ColBroadcast,
    Reduction,
    RowBroadcast,
    ScalarBroadcast,
    Source,
    Store,
)


def tolerance(dtype: DType) -> float:
    """Relative-error bound for an output of ``dtype`` (see the module docs)."""
    return 4 * dtype.eps + 1e-4


@dataclasses.dataclass
class Problem:
    M: int
    N: int
    K: int
    L: int = 1


def _torch():
    import torch  # noqa: PLC0415 - only the GPU paths need it

    return torch


def padded_empty(torch, shape, dtype, device, fill=float("nan")):
    """A tensor of ``shape`` whose rows start on 16-byte boundaries (as TMA needs)."""
    per = max(1, 16 // dtype.bytes)
    last = shape[-1]
    padded = (last + per - 1) // per * per
    t = torch.empty(tuple(shape[:-1]) + (padded,), dtype=getattr(torch, dtype.torch), device=device)
    if dtype.is_fp8 and fill != fill:
        t.view(torch.uint8).fill_(0x7F)  # 0x7F is NaN in both e4m3 and e5m2
    else:
        t.fill_(fill)
    return t[..., :last]


def random_tensor(torch, shape, dtype: DType, device, gen, scale=1.0, positive=False):
    x = torch.randn(shape, generator=gen, device=device, dtype=torch.float32) * scale
    if positive:
        x = x.abs() + 0.5
    if dtype.is_fp8:
        x = x.clamp(-dtype.max, dtype.max)
    out = padded_empty(torch, shape, dtype, device, fill=0.0)
    out.copy_(x.to(getattr(torch, dtype.torch)))
    return out


def make_inputs(graph: Graph, a: DType, b: DType, p: Problem, *, device="cuda", seed=0, batched=None) -> dict[str, Any]:
    """Fresh random A, B and epilogue inputs for ``graph`` (torch tensors on ``device``).

    Values are N(0, 1) scaled so ``acc`` is O(1) (A and B scaled by K^-1/4); scalars are drawn
    from [0.5, 1.5]; inputs of ``log``/``sqrt``-style ops are not special-cased, so epilogues
    using them should take ``abs`` first or the tests choose their own data.
    """
    torch = _torch()
    gen = torch.Generator(device=device)
    gen.manual_seed(seed)
    batched = p.L > 1 if batched is None else batched
    lead = (p.L,) if batched else ()
    s = p.K ** -0.25
    out: dict[str, Any] = {
        "A": random_tensor(torch, lead + (p.M, p.K), a, device, gen, s),
        "B": random_tensor(torch, lead + (p.N, p.K), b, device, gen, s),
    }
    rng = np.random.default_rng(seed)
    for leaf in graph.inputs:
        n = leaf.name
        if isinstance(leaf, Accumulator):
            continue
        if isinstance(leaf, (Source, AuxLoad)):
            out[n] = random_tensor(torch, lead + (p.M, p.N), leaf.dtype, device, gen)
        elif isinstance(leaf, RowBroadcast):
            out[n] = random_tensor(torch, lead + (p.N,), leaf.dtype, device, gen).contiguous()
        elif isinstance(leaf, ColBroadcast):
            out[n] = random_tensor(torch, lead + (p.M,), leaf.dtype, device, gen).contiguous()
        elif isinstance(leaf, ScalarBroadcast):
            v = float(rng.uniform(0.5, 1.5))
            out[n] = torch.full(lead or (), v, dtype=getattr(torch, leaf.dtype.torch), device=device) if leaf.by_pointer else v
    return out


def poisoned_outputs(graph: Graph, p: Problem, *, device="cuda", batched=None) -> dict[str, Any]:
    """Every output preallocated and filled with NaN (so unwritten elements fail the check)."""
    torch = _torch()
    batched = p.L > 1 if batched is None else batched
    lead = (p.L,) if batched else ()
    out = {}
    for o in graph.outputs:
        if isinstance(o, Store):
            out[o.name] = padded_empty(torch, lead + (p.M, p.N), o.dtype, device)
        elif isinstance(o, Reduction):
            ext = {1: (p.M,), 0: (p.N,), None: ()}[o.dim]
            shape = lead + ext
            t = padded_empty(torch, shape or (1,), o.dtype, device)
            out[o.name] = t if shape else t[0]
    return out


def to_numpy(x) -> np.ndarray:
    if isinstance(x, (int, float)):
        return np.float64(x)
    return x.detach().to(device="cpu").double().numpy() if hasattr(x, "detach") else np.asarray(x, dtype=np.float64)


def reference(graph: Graph, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """Float64 reference outputs for ``inputs`` (the interpreter on ``A @ B.T`` in float64)."""
    A, B = inputs["A"], inputs["B"]
    if hasattr(A, "is_cuda") and A.is_cuda:  # float64 on the GPU: the same numbers, much sooner
        acc = to_numpy(A.double() @ B.double().transpose(-1, -2))
    else:
        acc = to_numpy(A) @ np.swapaxes(to_numpy(B), -1, -2)
    vals = {k: to_numpy(v) for k, v in inputs.items() if k not in ("A", "B")}
    return interpret(graph, acc, vals)


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| over the finite entries of ref (inf/NaN anywhere in out fails)."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64).reshape(out.shape)
    if not np.all(np.isfinite(out)):
        return float("inf")
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (den if den > 0 else 1.0))


def check(gemm, p: Problem, *, seed=0, device="cuda", batched=None) -> dict[str, tuple[float, float]]:
    """Run ``gemm`` on fresh random data with poisoned outputs and compare with the reference.

    Returns:
        output name -> (relative error, tolerance).
    """
    graph = gemm.graph
    ins = make_inputs(graph, gemm.a, gemm.b, p, device=device, seed=seed, batched=batched)
    outs = poisoned_outputs(graph, p, device=device, batched=batched)
    kwargs = {k: v for k, v in ins.items() if k not in ("A", "B")}
    gemm(ins["A"], ins["B"], out=outs, **kwargs)
    _torch().cuda.synchronize()
    ref = reference(graph, ins)
    result = {}
    for o in graph.outputs:
        result[o.name] = (relative_error(to_numpy(outs[o.name]), ref[o.name]), tolerance(o.dtype))
    return result


def in_pytest() -> bool:
    return "pytest" in sys.modules
