"""The op table: every elementwise op evtc knows, registered once.

Input: nothing. Output: :data:`OPS`, name -> :class:`OpDef`.

Each op is one :func:`register` call that gives all of its interpretations side by side
(JAX's rule tables, folded into one row):

* ``numpy``: the float64 reference used by the interpreter (:mod:`evtc.ir.interpret`);
* ``torch``: the eager implementation used when an epilogue function is called on tensors;
* ``sympy``: the algebraic form used by the canonicalize pass (:mod:`evtc.passes.canonicalize`,
  the only module that imports sympy), written with Python operators on its arguments so this
  table needn't import sympy; None for ops the pass treats as opaque operands;
* ``functor``: the C++ functor template applied to ``cutlass::Array<float, N>`` fragments by
  ``Sm90Compute`` / ``VisitorCompute``. ``cutlass::...`` names come from
  ``cutlass/functional.h`` and ``cutlass/epilogue/thread/activation.h``; ``evtc::...`` names
  are evtc's own functors in ``codegen_templates/include/evtc/functors.hpp``.

Comparisons produce 1.0 or 0.0 in the compute type (a *mask*), and :func:`evtc.where` selects
where its condition is non-zero, so masks compose with arithmetic (``mask * x``).

Adding an op is one ``register`` call (and, for an ``evtc::`` functor, a few lines of C++).
Plugins may register more; a missing interpretation raises :class:`UnsupportedOpError` naming
the op and the table.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable

import numpy as np

from evtc.errors import UnsupportedOpError


@dataclasses.dataclass(frozen=True)
class OpDef:
    """One row of the op table.

    Attributes:
        name: the op's name in the IR and the grammar (``add``, ``relu``...).
        arity: number of operands.
        numpy: float64 reference, ``f(*arrays) -> array``.
        torch: eager implementation on torch tensors, ``f(torch, *tensors) -> tensor``.
        sympy: ``f(*exprs) -> expr`` with Python operators only, or None when the canonicalize
            pass treats the op as opaque.
        functor: C++ functor template for fragments of ``cutlass::Array<float, N>``.
        commutative: operands may be reordered (used by CSE's canonical order).
        doc: one line for ``evtc ops`` and the docs.
    """

    name: str
    arity: int
    numpy: Callable[..., np.ndarray]
    torch: Callable[..., Any] | None
    sympy: Callable[..., Any] | None
    functor: str
    commutative: bool = False
    doc: str = ""


OPS: dict[str, OpDef] = {}


def register(op: OpDef) -> OpDef:
    """Add ``op`` to the table (the name must be new)."""
    if op.name in OPS:
        raise ValueError(f"op '{op.name}' is already registered")
    OPS[op.name] = op
    return op


def get(name: str) -> OpDef:
    """The op called ``name``.

    Raises:
        UnsupportedOpError: no such op; the message lists the known ops.
    """
    try:
        return OPS[name]
    except KeyError:
        raise UnsupportedOpError(
            f"unknown op '{name}'",
            hint=f"known ops: {', '.join(sorted(OPS))}",
        ) from None


# ---- helpers for the float64 reference --------------------------------------------------------

_erf = np.vectorize(math.erf, otypes=[np.float64])


def _np_gelu(x):
    return 0.5 * x * (1.0 + _erf(x / math.sqrt(2.0)))


def _np_gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x**3)))


def _np_gelu_grad(x):
    # d/dx [x * Phi(x)] = Phi(x) + x * phi(x)
    return 0.5 * (1.0 + _erf(x / math.sqrt(2.0))) + x * np.exp(-0.5 * x * x) / math.sqrt(2.0 * math.pi)


def _np_sigmoid(x):
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def _np_hardswish(x):
    return x * np.clip(x + 3.0, 0.0, 6.0) / 6.0


def _mask(b):
    return np.asarray(b, dtype=np.float64)


def _torch_mask(t, b, like):
    return b.to(like.dtype) if hasattr(like, "dtype") else b.float()


# ---- arithmetic (canonicalize translates these to sympy) ---------------------------------------

register(OpDef("add", 2, np.add, lambda t, a, b: a + b, lambda a, b: a + b, "cutlass::plus", True, "a + b"))
register(OpDef("sub", 2, np.subtract, lambda t, a, b: a - b, lambda a, b: a - b, "cutlass::minus", doc="a - b"))
register(OpDef("mul", 2, np.multiply, lambda t, a, b: a * b, lambda a, b: a * b, "cutlass::multiplies", True, "a * b"))
register(OpDef("div", 2, np.divide, lambda t, a, b: a / b, lambda a, b: a / b, "cutlass::divides", doc="a / b"))
register(OpDef("neg", 1, np.negative, lambda t, a: -a, lambda a: -a, "cutlass::negate", doc="-a"))
register(
    OpDef(
        "multiply_add", 3, lambda a, b, c: a * b + c, lambda t, a, b, c: a * b + c,
        lambda a, b, c: a * b + c, "cutlass::multiply_add", doc="a * b + c, one fused multiply-add",
    )
)
register(OpDef("pow", 2, np.power, lambda t, a, b: t.pow(a, b), lambda a, b: a**b, "evtc::Pow",
               doc="a ** b (b a constant)"))
register(OpDef("sqrt", 1, np.sqrt, lambda t, a: t.sqrt(a), None, "evtc::Sqrt", doc="square root"))
register(OpDef("rsqrt", 1, lambda a: 1.0 / np.sqrt(a), lambda t, a: t.rsqrt(a), None,
               "evtc::Rsqrt", doc="1 / sqrt(a)"))
register(OpDef("exp", 1, np.exp, lambda t, a: t.exp(a), None, "evtc::Exp", doc="e ** a"))
register(OpDef("log", 1, np.log, lambda t, a: t.log(a), None, "evtc::Log", doc="natural logarithm"))

# ---- min / max (opaque to canonicalize: piecewise forms don't simplify usefully) ---------------

register(OpDef("maximum", 2, np.maximum, lambda t, a, b: t.maximum(a, b), None, "cutlass::maximum", True,
               "elementwise max"))
register(OpDef("minimum", 2, np.minimum, lambda t, a, b: t.minimum(a, b), None, "cutlass::minimum", True,
               "elementwise min"))
register(OpDef("abs", 1, np.abs, lambda t, a: t.abs(a), None, "evtc::Abs", doc="absolute value"))

# ---- activations --------------------------------------------------------------------------------

register(OpDef("relu", 1, lambda a: np.maximum(a, 0.0), lambda t, a: t.relu(a), None,
               "cutlass::epilogue::thread::ReLu", doc="max(a, 0), NaN-propagating"))
register(OpDef("sigmoid", 1, _np_sigmoid, lambda t, a: t.sigmoid(a), None,
               "cutlass::epilogue::thread::Sigmoid", doc="1 / (1 + exp(-a))"))
register(OpDef("tanh", 1, np.tanh, lambda t, a: t.tanh(a), None, "cutlass::epilogue::thread::Tanh",
               doc="hyperbolic tangent"))
register(OpDef("gelu", 1, _np_gelu, lambda t, a: t.nn.functional.gelu(a), None,
               "evtc::Gelu", doc="a * Phi(a), the erf form"))
register(OpDef("gelu_tanh", 1, _np_gelu_tanh, lambda t, a: t.nn.functional.gelu(a, approximate="tanh"),
               None, "cutlass::epilogue::thread::GELU_taylor", doc="the tanh approximation of gelu"))
register(OpDef("gelu_grad", 1, _np_gelu_grad, None, None, "evtc::GeluGrad",
               doc="d gelu(a) / da (erf form), for the backward pass"))
register(OpDef("silu", 1, lambda a: a * _np_sigmoid(a), lambda t, a: t.nn.functional.silu(a), None,
               "cutlass::epilogue::thread::SiLu", doc="a * sigmoid(a)"))
register(OpDef("hardswish", 1, _np_hardswish, lambda t, a: t.nn.functional.hardswish(a), None,
               "cutlass::epilogue::thread::HardSwish", doc="a * relu6(a + 3) / 6"))
register(OpDef("erf", 1, _erf, lambda t, a: t.erf(a), None, "evtc::Erf", doc="error function"))
register(OpDef("leaky_relu", 2, lambda a, s: np.where(a > 0, a, a * s),
               lambda t, a, s: t.where(a > 0, a, a * s), None, "evtc::LeakyReLU",
               doc="a if a > 0 else a * slope (slope a scalar)"))

# ---- comparisons and selection --------------------------------------------------------------------

for _name, _np_fn, _cpp, _doc in (
    ("gt", np.greater, "evtc::Greater", "1.0 where a > b else 0.0"),
    ("ge", np.greater_equal, "evtc::GreaterEqual", "1.0 where a >= b else 0.0"),
    ("lt", np.less, "evtc::Less", "1.0 where a < b else 0.0"),
    ("le", np.less_equal, "evtc::LessEqual", "1.0 where a <= b else 0.0"),
    ("eq", np.equal, "evtc::Equal", "1.0 where a == b else 0.0"),
    ("ne", np.not_equal, "evtc::NotEqual", "1.0 where a != b else 0.0"),
):
    _torch_op = {"gt": "gt", "ge": "ge", "lt": "lt", "le": "le", "eq": "eq", "ne": "ne"}[_name]
    register(
        OpDef(
            _name, 2,
            (lambda f: lambda a, b: _mask(f(a, b)))(_np_fn),
            (lambda n: lambda t, a, b: getattr(t, n)(a, b).to(t.result_type(a, b)))(_torch_op),
            None, _cpp, _name in ("eq", "ne"), _doc,
        )
    )

register(OpDef("where", 3, lambda c, a, b: np.where(c != 0, a, b), lambda t, c, a, b: t.where(c != 0, a, b),
               None, "evtc::Where", doc="a where cond != 0 else b"))

# ---- conversions and plumbing ------------------------------------------------------------------------

# "convert" rounds to the node's dtype (saturating for fp8); its numpy rule is applied by the
# interpreter, which knows the target dtype.
register(OpDef("convert", 1, lambda a: a, None, None, "cutlass::epilogue::thread::Identity",
               doc="round to the node's dtype (x.to(dtype))"))
# "group_quant" is a per-token-group quantization (evtc.quantize): its value is y / scale of y's
# group, clamped and rounded to the node's fp8 dtype, with the scales in the GroupScale output
# whose value it is. Not elementwise: the interpreter computes it per group (evtc/ir/quant.py);
# on sm90 its visitor passes y through and the GroupScale visitor at the root quantizes the
# subtile (include/evtc/sm90_group_quant.hpp).
register(OpDef("group_quant", 1, lambda a: a, None, None, "cutlass::epilogue::thread::Identity",
               doc="per-token-group quantization of a (evtc.quantize; not elementwise)"))
# "glu" is the gated linear unit over interleaved columns (evtc.glu): column j of its value is
# act(y[:, 2j]) * y[:, 2j + 1], with act (attribute "act") a unary op of this table. Not
# elementwise (its value has N / 2 columns): the interpreter pairs the columns itself, and on sm90
# the root visitor that stores it pairs them inside the epilogue subtile
# (include/evtc/sm90_glu_store.hpp); it can only be stored (rule glu-store, evtc/ir/verify.py).
register(OpDef("glu", 1, lambda a: a, None, None, "cutlass::epilogue::thread::Identity",
               doc="gated linear unit over interleaved columns (evtc.glu; not elementwise)"))
# "first" returns its first operand; it keeps a side-effect-only output (an aux store or a
# reduction off the path to D) inside the visitor tree. Inserted by the lowering (evtc/lower).
register(OpDef("first", 2, lambda a, b: a, None, None, "evtc::First", doc="a (b is evaluated for its effects)"))


def arithmetic_ops() -> frozenset[str]:
    """Ops the canonicalize pass may rewrite freely through sympy (exact algebra on reals)."""
    return frozenset({"add", "sub", "mul", "div", "neg", "multiply_add"})
