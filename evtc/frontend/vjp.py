"""Backward epilogues: a forward epilogue Graph -> the epilogue of the GEMM that produces its
output's gradient (reverse mode over the IR, one derivative rule per op).

Input: a forward epilogue whose one M x N output ``D`` the next layer consumes:
``D = f(acc, C, aux..., rows..., cols..., scalars...)`` (after passes, or as traced). Output: a
:class:`Backward`: the backward epilogue Graph, what the forward must save for it, and which
outputs are which gradients.

For a linear layer ``D = f(A @ W.T, params)`` training computes, from the gradient ``dD`` the
next layer's data-gradient GEMM produces, ``dZ = dD * df/dacc`` (then ``dA = dZ @ W`` and
``dW = dZ.T @ A``, two plain GEMMs), and the parameters' gradients: a row vector's
``sum(dD * df/dp, dim=0)``, a column vector's ``sum(..., dim=1)``, an aux load's or C's
``dD * df/dX``. All of that is an epilogue of the GEMM that produces ``dD`` (cuBLASLt's
``DGELU_BGRAD``, for any ``f``): its accumulator is ``dD``, the forward's accumulator comes in
as an aux load (``acc_fwd``) when a derivative needs it, and the vectors, scalars and M x N
inputs as they were. The forward then stores ``acc_fwd`` as an aux store (:attr:`Backward.saves`).

The derivative rules (:data:`RULES`, JAX's ``primitive_vjps``) build each op's input cotangents
from its output cotangent with IR ops; where an op has no rule, or an output is a reduction or
the epilogue has several M x N outputs, :func:`backward` raises an EvtcError that names them.
Tests compare every rule and every reference epilogue's backward epilogue with torch.autograd in
float64 (tests/null/test_vjp.py).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from evtc import dtypes
from evtc.errors import UnsupportedOpError
from evtc.ir.graph import Graph
from evtc.ir.nodes import (Accumulator, AuxLoad, ColBroadcast, Compute, Immediate, Node, Reduction, RowBroadcast,
                           ScalarBroadcast, Source, Store)

__all__ = ["RULES", "Backward", "backward"]

#: the forward accumulator's name in the backward epilogue (an aux load)
ACC_FWD = "acc_fwd"

_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)


class _Ops:
    """IR arithmetic for the rules: builder calls at one location."""

    def __init__(self, b, loc) -> None:
        self.b, self.loc = b, loc

    def __call__(self, op: str, *args):
        return self.b.apply(op, args, self.loc)


# Each rule: (ops, cotangent of the output, the output, *the inputs) -> one cotangent per input
# (None: not differentiable, e.g. a comparison's or a where's condition).
Rule = Callable[..., tuple]


def _gelu_tanh_grad(o: _Ops, x):
    # d/dx 0.5 x (1 + tanh(u)), u = s (x + 0.044715 x^3): 0.5 (1 + t) + 0.5 x (1 - t^2) s (1 + 3 * 0.044715 x^2)
    x2 = o("mul", x, x)
    u = o("mul", _SQRT_2_OVER_PI, o("add", x, o("mul", 0.044715, o("mul", x2, x))))
    t = o("tanh", u)
    du = o("mul", _SQRT_2_OVER_PI, o("add", 1.0, o("mul", 3 * 0.044715, x2)))
    return o("add", o("mul", 0.5, o("add", 1.0, t)),
             o("mul", o("mul", 0.5, x), o("mul", o("sub", 1.0, o("mul", t, t)), du)))


def _sigmoid_grad(o: _Ops, s):
    return o("mul", s, o("sub", 1.0, s))


RULES: dict[str, Rule] = {
    "add": lambda o, g, y, a, b: (g, g),
    "sub": lambda o, g, y, a, b: (g, o("neg", g)),
    "mul": lambda o, g, y, a, b: (o("mul", g, b), o("mul", g, a)),
    "div": lambda o, g, y, a, b: (o("div", g, b), o("neg", o("div", o("mul", g, y), b))),
    "neg": lambda o, g, y, a: (o("neg", g),),
    "multiply_add": lambda o, g, y, a, b, c: (o("mul", g, b), o("mul", g, a), g),
    "pow": lambda o, g, y, a, b: (o("mul", g, o("mul", b, o("pow", a, o("sub", b, 1.0)))),
                                  o("mul", g, o("mul", y, o("log", a)))),
    "sqrt": lambda o, g, y, a: (o("div", o("mul", 0.5, g), y),),
    "rsqrt": lambda o, g, y, a: (o("mul", g, o("mul", -0.5, o("div", y, a))),),
    "exp": lambda o, g, y, a: (o("mul", g, y),),
    "log": lambda o, g, y, a: (o("div", g, a),),
    "abs": lambda o, g, y, a: (o("mul", g, o("sub", o("gt", a, 0.0), o("lt", a, 0.0))),),
    "maximum": lambda o, g, y, a, b: (o("mul", g, o("ge", a, b)), o("mul", g, o("lt", a, b))),
    "minimum": lambda o, g, y, a, b: (o("mul", g, o("le", a, b)), o("mul", g, o("gt", a, b))),
    "relu": lambda o, g, y, a: (o("mul", g, o("gt", a, 0.0)),),
    "leaky_relu": lambda o, g, y, a, s: (o("mul", g, o("where", o("gt", a, 0.0), 1.0, s)), None),
    "sigmoid": lambda o, g, y, a: (o("mul", g, _sigmoid_grad(o, y)),),
    "tanh": lambda o, g, y, a: (o("mul", g, o("sub", 1.0, o("mul", y, y))),),
    "gelu": lambda o, g, y, a: (o("mul", g, o("gelu_grad", a)),),
    "gelu_tanh": lambda o, g, y, a: (o("mul", g, _gelu_tanh_grad(o, a)),),
    "silu": lambda o, g, y, a: (o("mul", g, _silu_grad(o, a)),),
    "erf": lambda o, g, y, a: (o("mul", g, o("mul", 2.0 / math.sqrt(math.pi), o("exp", o("neg", o("mul", a, a))))),),
    "hardswish": lambda o, g, y, a: (o("mul", g, o("where", o("le", a, -3.0), 0.0,
                                                   o("where", o("ge", a, 3.0), 1.0,
                                                     o("add", o("div", a, 3.0), 0.5)))),),
    "where": lambda o, g, y, c, a, b: (None, o("where", c, g, 0.0), o("where", c, 0.0, g)),
    "convert": lambda o, g, y, a: (g,),
    "first": lambda o, g, y, a, b: (g, None),
    **{cmp: (lambda o, g, y, a, b: (None, None)) for cmp in ("gt", "ge", "lt", "le", "eq", "ne")},
}


def _silu_grad(o: _Ops, x):
    s = o("sigmoid", x)
    return o("mul", s, o("add", 1.0, o("mul", x, o("sub", 1.0, s))))


@dataclasses.dataclass(frozen=True)
class Backward:
    """A forward epilogue's backward epilogue.

    Attributes:
        graph: the backward epilogue: ``acc`` is the gradient of the forward's ``D``; its output
            ``D`` the gradient of the forward's accumulator (``dZ``, in ``grad_dtype``), then
            ``d_<name>`` for each differentiable parameter (row vectors: a column sum; column
            vectors: a row sum; C and aux loads: an M x N output).
        saves: True when the backward reads the forward's accumulator (an aux load named
            ``acc_fwd``): the forward must store it.
        wrt: the forward parameters with a gradient output, in output order.
    """

    graph: Graph
    saves: bool
    wrt: tuple[str, ...]


def _recompute(b, graph: Graph) -> dict[int, Node]:
    """The forward's inputs declared on the backward builder ``b`` (C as an aux load) and its
    values rebuilt there, the accumulator as the aux load ``acc_fwd`` (declared only when a
    value reads it): forward node id -> backward node. Unused ones fall away in the passes."""
    primal: dict[int, Node] = {}
    for leaf in graph.inputs:
        if not isinstance(leaf, Accumulator):
            kind = AuxLoad if isinstance(leaf, Source) else type(leaf)
            primal[id(leaf)] = b.input(leaf.name, kind, leaf.dtype, by_pointer=getattr(leaf, "by_pointer", False))
    acc_fwd = None
    for n in graph.nodes:
        if isinstance(n, Accumulator):
            acc_fwd = acc_fwd or b.input(ACC_FWD, AuxLoad, dtypes.f32)
            primal[id(n)] = acc_fwd
        elif isinstance(n, Immediate):
            primal[id(n)] = b.lift(n.value, n.loc)
        elif isinstance(n, Compute):
            primal[id(n)] = b.apply(n.op, [primal[id(a)] for a in n.args], n.loc, dtype=n.dtype, attrs=n.attrs)
    return primal


def backward(graph: Graph, *, grad_dtype: dtypes.DType = dtypes.bf16, wrt: tuple[str, ...] | None = None,
             name: str | None = None) -> Backward:
    """The backward epilogue of ``graph`` (see the module docstring).

    Args:
        graph: the forward epilogue, with one M x N output (the value the next layer consumes).
        grad_dtype: dtype of the M x N gradients (``D`` = dZ, and C's and aux loads').
        wrt: the parameters to differentiate (default: every row and column vector, C and aux
            load; scalars only when named).
        name: the backward epilogue's name (default ``<forward>_bwd``).

    Raises:
        UnsupportedOpError: an op with no derivative rule (named, with the rules' list).
        EvtcError: several M x N outputs, or a reduction among them (not differentiated here).
    """
    from evtc.errors import EpilogueTypeError
    from evtc.frontend.builder import IRBuilder

    stores = [o for o in graph.outputs if isinstance(o, Store)]
    if len(stores) != 1 or any(isinstance(o, Reduction) for o in graph.outputs):
        raise EpilogueTypeError(f"'{graph.name}': a backward epilogue needs one M x N output and no reduction; "
                                f"it has {', '.join(o.name for o in graph.outputs)}", epilogue=graph.name,
                                hint="differentiate the epilogue of the value the next layer consumes")
    b = IRBuilder(name or f"{graph.name}_bwd", d=grad_dtype)
    o = _Ops(b, graph.loc)
    b.input("acc", Accumulator)
    primal = _recompute(b, graph)
    ct: dict[int, Node] = {id(stores[0].value): b.inputs[0]}
    for n in reversed(graph.nodes):
        g = ct.get(id(n))
        if g is None or not isinstance(n, Compute):
            continue
        rule = RULES.get(n.op)
        if rule is None:
            raise UnsupportedOpError(f"'{n.op}' has no derivative rule (evtc.frontend.vjp.RULES)",
                                     epilogue=graph.name,
                                     hint=f"differentiable ops: {', '.join(sorted(RULES))}")
        o.loc = n.loc
        for a, ga in zip(n.args, rule(o, g, primal[id(n)], *[primal[id(x)] for x in n.args])):
            if ga is not None and not isinstance(a, Immediate):
                ct[id(a)] = b.apply("add", (ct[id(a)], ga), n.loc) if id(a) in ct else ga
    acc = graph.accumulator
    if acc is None or id(acc) not in ct:
        raise EpilogueTypeError(f"'{graph.name}': its output does not depend on the accumulator", epilogue=graph.name)
    b.output("D", b.apply("convert", (ct[id(acc)],), graph.loc, dtype=grad_dtype)
             if grad_dtype is not dtypes.f32 else ct[id(acc)], graph.loc)
    names = []
    for leaf in graph.inputs:
        wanted = leaf.name in wrt if wrt is not None else isinstance(leaf, (RowBroadcast, ColBroadcast, AuxLoad,
                                                                            Source))
        if not wanted or isinstance(leaf, Accumulator) or id(leaf) not in ct:
            continue
        g = ct[id(leaf)]
        if isinstance(leaf, RowBroadcast):
            value = b.reduce("sum", g, 0, graph.loc)
        elif isinstance(leaf, ColBroadcast):
            value = b.reduce("sum", g, 1, graph.loc)
        elif isinstance(leaf, ScalarBroadcast):
            value = b.reduce("sum", g, None, graph.loc)
        else:
            value = b.apply("convert", (g,), graph.loc, dtype=grad_dtype)
        b.output(f"d_{leaf.name}", value, graph.loc)
        names.append(leaf.name)
    bwd = b.graph()
    saves = any(i.name == ACC_FWD for i in bwd.used_inputs)
    return Backward(bwd, saves, tuple(names))
