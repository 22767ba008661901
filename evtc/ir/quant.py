"""Per-token-group quantization on numpy arrays: what ``evtc.quantize`` computes, for the
reference interpreter (:mod:`evtc.ir.interpret`) and the CPU kernels.

Input: y (L, M, N) values (rounded to f32 first, as the kernel holds them), the group, the
convention and the fp8 dtype. Output: the quantized values (L, M, N) as float64 (exactly the fp8
values) and the f32 scales (L, M, ceil(N / group)).

The arithmetic is :func:`evtc.testing.quant.quantize_per_token_group`'s, operation for
operation in f32 (NOTE [Per-token-group quantization conventions] there), in numpy instead of
torch so that the interpreter needs no torch: each f32 operation is correctly rounded in both,
``np.max`` and ``np.maximum`` propagate NaN as torch's ``amax`` and ``maximum`` do, and the fp8
cast is :func:`evtc.dtypes.round_to` (round to nearest even, saturating). tests/null/
test_quantize.py checks the two against each other bit for bit.
"""

from __future__ import annotations

import numpy as np

from evtc.dtypes import DType, round_to

__all__ = ["EPS", "quantize_groups"]

#: the floor of a group's amax, per convention (the sources' epsilons)
EPS = {"vllm": 1e-10, "sglang": 1e-10, "deepgemm": 1e-4}


def quantize_groups(y: np.ndarray, group: int, convention: str, dtype: DType) -> tuple[np.ndarray, np.ndarray]:
    """(q, scales) of ``y`` (L, M, N): q (L, M, N) float64 holding fp8 values of ``dtype``;
    scales (L, M, G) float64 holding f32 values, G = ceil(N / group). A last, partial group
    is padded with zeros, which never raise its amax."""
    y = np.asarray(y, dtype=np.float32)
    L, M, N = y.shape
    group = min(group, max(N, 1))  # a group wider than a row is the row: the same bits, no padding to 10**30
    G = -(-N // group)
    pad = G * group - N
    with np.errstate(all="ignore"):
        g = np.concatenate([y, np.zeros((L, M, pad), np.float32)], axis=2) if pad else y
        g = g.reshape(L, M, G, group)
        qmax = np.float32(dtype.max)
        amax = np.maximum(np.max(np.abs(g), axis=3), np.float32(EPS[convention]))
        if convention == "vllm":
            scale = amax * (np.float32(1.0) / qmax)
            q = np.clip(g / scale[..., None], -qmax, qmax)
        elif convention == "sglang":
            scale = amax / qmax
            q = np.clip(g * (np.float32(1.0) / scale)[..., None], -qmax, qmax)
        elif convention == "deepgemm":
            q = g * (qmax / amax)[..., None]
            scale = amax / qmax
        else:
            raise ValueError(f"unknown convention {convention!r}")
        q = q.reshape(L, M, G * group)[:, :, :N]
    return round_to(q.astype(np.float64), dtype), scale.astype(np.float64)
