"""The grouped GEMM's call arguments, checked and bound (:class:`evtc.GroupedGemm`'s call).

Input: the call's torch tensors (A (T, K), B (E, N, K), offs, the epilogue's inputs, ``out=``)
and the grouped kernel's argument struct. Output: the struct's fields set, or an
:class:`~evtc.errors.ArgumentError` naming the argument, before any build.
"""

from __future__ import annotations

import math

import numpy as np

from evtc.dtypes import DType
from evtc.errors import ArgumentError
from evtc.ir import nodes as ir_nodes
from evtc.runtime.signature import self_overlapping

__all__ = ["bind_input", "check_cuda", "check_matrix", "checked_offs", "check_operands", "check_overlaps",
           "torch_dtype"]


def torch_dtype(dt: DType):
    import torch

    return getattr(torch, dt.torch)


def check_cuda(t, what: str, device, name: str) -> None:
    import torch

    if not isinstance(t, torch.Tensor):
        raise ArgumentError(f"{what} is a {type(t).__name__}, not a torch tensor", epilogue=name)
    if t.device.type != "cuda" or (device is not None and t.device != device):
        raise ArgumentError(f"{what} is on {t.device}; the grouped GEMM runs on {device or 'a CUDA device'}",
                            epilogue=name, hint="move every tensor to A's CUDA device")


def check_operands(A, B, a: DType, b: DType, name: str):
    check_cuda(A, "A", None, name)
    check_cuda(B, "B", A.device, name)
    if A.dim() != 2 or B.dim() != 3:
        raise ArgumentError(f"A is {tuple(A.shape)} and B {tuple(B.shape)}: the grouped GEMM takes A (T, K) and "
                            "B (E, N, K)", epilogue=name)
    if A.shape[1] != B.shape[2]:
        raise ArgumentError(f"A is (T, K) = {tuple(A.shape)} and B (E, N, K) = {tuple(B.shape)}: K differs",
                            epilogue=name)
    if A.shape[1] == 0 and A.shape[0] and B.shape[0] and B.shape[1]:
        # (its stride checks would blame A's row stride; evtc.Gemm runs K = 0 on a zero scratch)
        raise ArgumentError(f"K = 0 (A {tuple(A.shape)}, B {tuple(B.shape)}): the grouped kernel has no zero-K path",
                            epilogue=name, hint="every accumulator is 0: compute the epilogue of zeros without the "
                            "GEMM, or pass K >= 8")
    for t, what, dt in ((A, "A", a), (B, "B", b)):
        if t.dtype != torch_dtype(dt):
            raise ArgumentError(f"{what} is {t.dtype}; this GroupedGemm was made for {dt.name}", epilogue=name)
        if t.shape[-1] > 1 and t.stride(-1) != 1:
            raise ArgumentError(f"{what}'s last dimension (K) is not contiguous (stride {t.stride(-1)})",
                                epilogue=name, hint=f"pass {what}.contiguous()")
    if A.shape[0] > 0 and (A.stride(0) * A.element_size()) % 16:
        raise ArgumentError(f"A's row stride ({A.stride(0)} elements) is not a multiple of 16 bytes", epilogue=name)
    if B.shape[0] > 0 and (B.stride(1) * B.element_size() % 16 or B.stride(0) * B.element_size() % 16):
        raise ArgumentError(f"B's strides {B.stride()} are not multiples of 16 bytes", epilogue=name)
    for t, what in ((A, "A"), (B, "B")):
        if t.numel() and t.data_ptr() % 16:
            raise ArgumentError(f"{what} does not start on a 16-byte boundary", epilogue=name)
    return A, B


def checked_offs(offs, E: int, T: int, device, check: bool, name: str):
    import torch

    if isinstance(offs, (list, tuple)):
        bad = [v for v in offs if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or not 0 <= v < 2**31]
        if bad:  # torch.tensor would truncate 0.5, take True as 1, or raise its own error
            raise ArgumentError(f"offs holds {bad[0]!r}: the grouped GEMM takes E = {E} int32 cumulative row counts",
                                epilogue=name, hint="pass integers from 0 to T, or an int32 tensor")
        offs = torch.tensor([int(v) if isinstance(v, np.integer) else v for v in offs], dtype=torch.int32)
        check = True
    if not isinstance(offs, torch.Tensor) or offs.dtype != torch.int32 or offs.shape != (E,):
        got = f"{offs.dtype} {tuple(offs.shape)}" if isinstance(offs, torch.Tensor) else type(offs).__name__
        raise ArgumentError(f"offs is {got}: the grouped GEMM takes E = {E} int32 cumulative row counts",
                            epilogue=name, hint="offs = torch.cumsum(tokens_per_expert, 0).to(torch.int32)")
    if offs.device.type not in ("cpu", device.type):  # (a meta tensor has no values to copy)
        raise ArgumentError(f"offs is on {offs.device}; the grouped GEMM reads it on {device}", epilogue=name,
                            hint="pass offs on A's device (or a CPU tensor or a list, checked and copied)")
    if check or offs.device.type == "cpu":
        host = offs.cpu().tolist()
        prev = 0
        for e, v in enumerate(host):
            if v < prev or v > T:
                raise ArgumentError(f"offs[{e}] = {v}: offsets must be non-decreasing and at most T = {T} "
                                    f"(offs[{e - 1 if e else 'before'}] = {prev})", epilogue=name)
            prev = v
    if offs.device != device:
        offs = offs.to(device)
    return offs.contiguous()


def check_matrix(t, what: str, dt: DType, T: int, N: int, device, name: str) -> None:
    check_cuda(t, what, device, name)
    if tuple(t.shape) != (T, N):
        raise ArgumentError(f"{what} is {tuple(t.shape)}; expected (T, N) = ({T}, {N})", epilogue=name)
    if t.dtype != torch_dtype(dt):
        raise ArgumentError(f"{what} is {t.dtype}; the epilogue declares {dt.name}", epilogue=name)
    if N > 1 and t.stride(1) != 1:
        raise ArgumentError(f"{what}'s rows are not contiguous (stride {t.stride()})", epilogue=name,
                            hint=f"pass {what}.contiguous()")
    if T and ((t.stride(0) * t.element_size()) % 16 or t.data_ptr() % 16):
        raise ArgumentError(f"{what}'s rows do not start on 16-byte boundaries (row stride {t.stride(0)})",
                            epilogue=name)


def span(t) -> tuple[int, int] | None:
    """The bytes ``t`` addresses, [first, past its last), or None when it has no elements."""
    if t.numel() == 0:
        return None
    lo = t.data_ptr()
    return lo, lo + (sum((s - 1) * st for s, st in zip(t.shape, t.stride())) + 1) * t.element_size()


def side_by_side(t, u) -> bool:
    """Two 2-D tensors of one row stride whose rows' bytes interleave without touching (two
    column blocks of one buffer): :func:`evtc.runtime.signature._disjoint`'s rule."""
    if t.dim() != 2 or u.dim() != 2 or t.stride(0) * t.element_size() != u.stride(0) * u.element_size():
        return False
    pitch = t.stride(0) * t.element_size()
    if pitch <= 0 or t.stride(1) != 1 or u.stride(1) != 1:
        return False
    d = (u.data_ptr() - t.data_ptr()) % pitch
    return t.shape[1] * t.element_size() <= d and d + u.shape[1] * u.element_size() <= pitch


def check_overlaps(label: str, t, read: list, name: str) -> None:
    """A given output ``t`` that overlaps itself, or (in memory) a tensor of ``read``: A, B,
    offs, an input, an output before it; exactly an M x N input is in place, allowed (each
    element is loaded by the thread that then stores it: evtc/runtime/bind.py's rule).

    Raises:
        ArgumentError: naming the output and what it overlaps.
    """
    if t.numel() and self_overlapping(tuple(t.shape), tuple(t.stride())):  # (the Gemm binder's rule)
        raise ArgumentError(f"{label} overlaps itself (shape {tuple(t.shape)}, strides {tuple(t.stride())}): the "
                            "groups' tiles would store to the same elements", epilogue=name,
                            hint="pass a tensor of its own, e.g. torch.empty(T, N)")
    mine = span(t)
    if mine is None:
        return
    for other, u, mn in read:
        theirs = span(u)
        if theirs is None or not (mine[0] < theirs[1] and theirs[0] < mine[1]) or side_by_side(t, u):
            continue
        if mn and (t.data_ptr(), t.shape, t.stride(), t.dtype) == (u.data_ptr(), u.shape, u.stride(), u.dtype):
            continue  # in place: out=C
        hint = ("the mainloop reads A, B and offs while the epilogue stores: pass a separate output tensor"
                if other in ("A", "B", "offs") else "an output may be exactly an M x N input (in place, e.g. "
                "out=C), but not part of one" if mn else "pass a separate tensor for each output")
        raise ArgumentError(f"{label} overlaps {'an output' if other.startswith('out') else 'the input'} "
                            f"{other if other.startswith('out') else repr(other)} in memory", epilogue=name, hint=hint)


def bind_input(args, leaf, value, T: int, N: int, E: int, device, name: str):
    """Set ``leaf``'s fields of ``args`` from ``value``; return what must stay alive."""
    n = leaf.name
    if isinstance(leaf, (ir_nodes.Source, ir_nodes.AuxLoad)):
        check_matrix(value, n, leaf.dtype, T, N, device, name)
        setattr(args, f"p_{n}", value.data_ptr())
        setattr(args, f"ld_{n}", value.stride(0))
        setattr(args, f"bs_{n}", 0)
        return value
    if isinstance(leaf, ir_nodes.ScalarBroadcast) and not leaf.by_pointer:
        if not isinstance(value, (int, float)) or isinstance(value, bool) or not math.isfinite(value):
            raise ArgumentError(f"scalar '{n}' = {value!r}: a finite number", epilogue=name)
        setattr(args, f"s_{n}", float(value))
        return None
    check_cuda(value, n, device, name)
    if value.dtype != torch_dtype(leaf.dtype):
        raise ArgumentError(f"'{n}' is {value.dtype}; the epilogue declares {leaf.dtype.name}", epilogue=name)
    if isinstance(leaf, ir_nodes.RowBroadcast):
        if value.shape == (N,):
            bs = 0
        elif value.shape == (E, N):
            bs = value.stride(0)
        else:
            raise ArgumentError(f"row vector '{n}' is {tuple(value.shape)}; expected (E, N) = ({E}, {N}) or (N,)",
                                epilogue=name)
        if N > 1 and value.stride(-1) != 1:
            raise ArgumentError(f"row vector '{n}' is not contiguous along N", epilogue=name)
    elif isinstance(leaf, ir_nodes.ColBroadcast):
        if value.shape != (T,) or (T > 1 and value.stride(0) != 1):
            raise ArgumentError(f"column vector '{n}' is {tuple(value.shape)} (strides {value.stride()}); expected "
                                f"a contiguous (T,) = ({T},)", epilogue=name)
        bs = 0
    else:  # a scalar by pointer: one for all groups, or one per group
        if value.numel() == 1 and value.dim() <= 1:
            bs = 0
        elif value.shape == (E,) and value.stride(0) == 1:
            bs = 1
        else:
            raise ArgumentError(f"scalar '{n}' is {tuple(value.shape)}; expected one element or (E,) = ({E},)",
                                epilogue=name)
    setattr(args, f"p_{n}", value.data_ptr())
    setattr(args, f"bs_{n}", bs)
    return value
