"""A ``torch.compile`` backend that fuses linear layers with the pointwise work after them.

Input: the FX graph Dynamo captured (torch-level: ``linear``, ``gelu``, ``operator.add``, ...)
and its example inputs. Output: the same graph with each match replaced by one evtc Gemm's custom
op (:mod:`evtc.torch_ops`), compiled by Inductor for the rest.

    torch.compile(model, backend="evtc")      # registered on import of evtc.torch_backend and
                                              # through the torch_dynamo_backends entry point

A match is a ``linear(x, w, b)`` (``nn.Linear``, ``F.linear``) followed by a chain of pointwise
ops, each the only user of the one before: ``+ - *`` with a number, a length-N vector (a row
broadcast) or a tensor of the output's shape (an aux load: a residual), and ``relu``, ``gelu``
(erf or tanh), ``silu``, ``sigmoid``, ``tanh``. x may have leading batch dimensions (flattened
into M). What evtc can't run stays unfused and goes to Inductor: tensors not on a CUDA device,
operands that are not both bf16 or both f16, K or N not a multiple of 8, a value of the chain
used outside it, and anything that needs a gradient (the op has no autograd formula yet: fusion
is for inference, under ``torch.no_grad()`` / ``torch.inference_mode()``). Not handled yet (issue 13): matmul/addmm/bmm spelled without ``linear``,
reductions, values kept as extra outputs.
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any

__all__ = ["evtc_backend", "fuse", "make_backend"]

_UNARY = {"relu": "evtc.relu({})", "sigmoid": "evtc.sigmoid({})", "tanh": "evtc.tanh({})", "silu": "evtc.silu({})"}
_BINARY = {operator.add: "+", operator.sub: "-", operator.mul: "*"}


def _unary_of(node) -> str | None:
    """The evtc template of a supported unary call ``node`` (None otherwise)."""
    import torch
    import torch.nn.functional as F

    t = node.target
    if node.op == "call_method":
        return _UNARY.get(t) if not node.kwargs and len(node.args) == 1 else None
    if node.op != "call_function":
        return None
    for name, fn in (("relu", torch.relu), ("relu", F.relu), ("sigmoid", torch.sigmoid), ("tanh", torch.tanh),
                     ("silu", F.silu)):
        if t is fn and len(node.args) == 1 and not {k: v for k, v in node.kwargs.items() if v not in (False, None)}:
            return _UNARY[name]
    if t in (F.gelu, torch._C._nn.gelu) and len(node.args) == 1:
        approx = node.kwargs.get("approximate", "none")
        return {"none": "evtc.gelu({})", "tanh": "evtc.gelu_tanh({})"}.get(approx)
    return None


def _is_linear(node) -> bool:
    import torch
    import torch.nn.functional as F

    return node.op == "call_function" and node.target in (F.linear, torch._C._nn.linear)


def _val(node):
    return node.meta.get("example_value") if hasattr(node, "meta") else None


def _dtype_name(t) -> str | None:
    import torch

    return {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32"}.get(t.dtype)


class _Match:
    """One linear + pointwise chain: the nodes it replaces and the epilogue it becomes."""

    def __init__(self, linear, x, w, bias) -> None:
        self.linear, self.x, self.w = linear, x, w
        self.params: list[tuple[str, Any, str]] = []  # (name, fx node, evtc annotation)
        self.expr = "acc"
        self.nodes = [linear]
        if bias is not None:
            self._param(bias, "row")
            self.expr = f"(acc + {self.params[-1][0]})"

    def _param(self, node, kind: str) -> str:
        name = f"p{len(self.params)}"
        dt = _dtype_name(_val(node))
        ann = {"row": f"evtc.RowVector[evtc.{dt}]", "matrix": "evtc.Matrix"}[kind]
        self.params.append((name, node, ann))
        return name

    def source(self) -> str:
        args = ", ".join(["acc"] + [f"{name}: {ann}" for name, _, ann in self.params])
        return f"def fused_linear({args}):\n    return {self.expr}\n"


def _grow(m: _Match, N: int, out_shape) -> None:
    """Absorb the pointwise chain after the linear node (each the only user of the previous)."""
    import torch

    cur = m.linear
    while len(cur.users) == 1:
        nxt = next(iter(cur.users))
        uni = _unary_of(nxt)
        if uni is not None and nxt.args[0] is cur:
            m.expr = uni.format(m.expr)
        elif nxt.op == "call_function" and nxt.target in _BINARY and len(nxt.args) == 2 and not nxt.kwargs:
            a, b = nxt.args
            other = b if a is cur else a if b is cur else None
            if other is None or other is cur:
                break
            sym = _BINARY[nxt.target]
            if isinstance(other, (int, float)) and not isinstance(other, bool):
                term = repr(float(other))
            elif hasattr(other, "op"):
                v = _val(other)
                if not isinstance(v, torch.Tensor) or v.device != _val(cur).device or _dtype_name(v) is None:
                    break
                if tuple(v.shape) == (N,):
                    term = m._param(other, "row")
                elif tuple(v.shape) == tuple(out_shape) and v.is_contiguous():
                    term = m._param(other, "matrix")
                else:
                    break
            else:
                break
            m.expr = f"({m.expr} {sym} {term})" if a is cur else f"({term} {sym} {m.expr})"
        else:
            break
        m.nodes.append(nxt)
        cur = nxt


def fuse(gm, *, allow_cpu: bool = False, on_gemm: Callable | None = None) -> int:
    """Replace every match in ``gm`` (an FX GraphModule from Dynamo, with ``example_value``
    metadata) by an evtc Gemm's op, in place.

    Args:
        allow_cpu: fuse CPU tensors too (tests, with a CPU kernel registered for the op).
        on_gemm: called with each Gemm made (tests register their kernel there).

    Returns:
        The number of matches fused.
    """
    import torch

    import evtc

    fused = 0
    for node in list(gm.graph.nodes):
        if not _is_linear(node):
            continue
        args = list(node.args) + [None] * (3 - len(node.args))
        x, w, bias = args[0], args[1], node.kwargs.get("bias", args[2])
        vx, vw, vy = _val(x), _val(w), _val(node)
        if not all(isinstance(v, torch.Tensor) for v in (vx, vw, vy)) or (bias is not None and _val(bias) is None):
            continue
        if (vx.device.type != "cuda" and not allow_cpu) or vx.dtype != vw.dtype or _dtype_name(vx) not in ("bf16", "f16"):
            continue
        if vy.requires_grad:  # the op has no autograd formula: training graphs stay unfused
            continue
        K, N = vx.shape[-1], vw.shape[0]
        if vw.dim() != 2 or K % 8 or N % 8 or vx.dim() < 2:
            continue
        m = _Match(node, x, w, bias)
        _grow(m, N, tuple(vy.shape))
        ns = {"evtc": evtc}
        exec(compile(m.source(), f"<evtc fused linear {fused}>", "exec"), ns)  # noqa: S102 (our own text)
        dt = _dtype_name(vx)
        gemm = evtc.Gemm(evtc.epilogue(ns["fused_linear"]), a=dt, b=dt, c=dt, d=dt)
        if on_gemm is not None:
            on_gemm(gemm)
        op = gemm.torch_op()
        order = {n: x_ for n, x_, _ in m.params}
        last = m.nodes[-1]
        with gm.graph.inserting_before(last):
            x2 = gm.graph.call_method("reshape", (x, -1, K))
            call_args = [x2, w]
            for name in op.tensor_names:
                src = order[name]
                call_args.append(gm.graph.call_method("reshape", (src, -1, N)) if _val(src).dim() > 1 else src)
            y2 = gm.graph.call_function(op.overload, tuple(call_args))
            y = gm.graph.call_method("reshape", (y2, *tuple(vy.shape[:-1]), N))
        y.meta["example_value"] = _val(last)  # later matches read shapes from it
        last.replace_all_uses_with(y)
        for n in reversed(m.nodes):
            gm.graph.erase_node(n)
        fused += 1
    if fused:
        gm.graph.lint()
        gm.recompile()
    return fused


def make_backend(*, allow_cpu: bool = False, on_gemm: Callable | None = None, inductor: bool = True):
    """A Dynamo backend: :func:`fuse`, then Inductor (or the graph as is, ``inductor=False``).
    ``backend.fused`` counts the matches of every graph it compiled."""

    def backend(gm, example_inputs):
        backend.fused += fuse(gm, allow_cpu=allow_cpu, on_gemm=on_gemm)
        if not inductor:
            return gm.forward
        from torch._inductor.compile_fx import compile_fx

        return compile_fx(gm, example_inputs)

    backend.fused = 0
    return backend


def evtc_backend(gm, example_inputs):
    """``torch.compile(model, backend="evtc")``: fuse linear layers with their epilogues
    (:func:`fuse`), hand the rest to Inductor."""
    return _DEFAULT(gm, example_inputs)


_DEFAULT = make_backend()


def _register() -> None:
    try:
        from torch._dynamo import register_backend
        from torch._dynamo.backends.registry import _BACKENDS
    except ImportError:  # an old torch
        return
    if "evtc" not in _BACKENDS:
        register_backend(evtc_backend, name="evtc")


_register()
