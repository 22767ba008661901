"""The builder's rules that are not one builder's state: dialects, values, constants, shared errors.

Input: a frontend's choice of :class:`Dialect`, and the constants, names and values it hands to
:class:`~evtc.frontend.builder.IRBuilder`. Output: the vocabulary the builder and the frontends
share: the three dialects, :class:`Pending` reductions, what counts as a constant and how it is
shown, the operator tables for folding, and the errors every frontend raises the same way
(:func:`unknown_function_error`, :func:`not_elementwise_error`, :func:`constant_reduction_error`).
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import operator
from typing import Any, Callable, Sequence, Union

import numpy as np

from evtc.errors import (
    EpilogueSignatureError,
    EpilogueTypeError,
    EvtcError,
    GrammarError,
    SourceLoc,
    TraceError,
    UnsupportedOpError,
)
from evtc.ir.nodes import (Accumulator, AuxLoad, ColBroadcast, Leaf, Node, Reduction, RowBroadcast, ScalarBroadcast,
                           Source)

__all__ = [
    "Dialect", "PYTHON", "EXPRESSION", "IR_TEXT", "Pending", "Value", "is_constant", "MAX_INT_BITS", "F32_OVERFLOW",
    "short_repr", "not_elementwise_error", "constant_reduction_error", "unknown_function_error", "KIND_WORDS",
    "is_reduction_dim", "reduction_dim_message",
]

#: integer constants are folded exactly (as Python does) up to this many bits; a result that
#: would be larger is an error (a float can't hold more than 1024 bits of magnitude anyway)
MAX_INT_BITS = 4096

#: the smallest magnitude that rounds to infinity in f32 (round to nearest even): FLT_MAX plus
#: half an ulp, 2**128 - 2**103
F32_OVERFLOW = 2.0**128 - 2.0**103

_F32_MAX = float(np.finfo(np.float32).max)


# ---------------------------------------------------------------------------------------------
# Dialects: how each frontend spells things and which error classes it raises
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Dialect:
    """What differs between frontends: the error classes and a few spellings in hints.

    Attributes:
        name: a short name (``python``, ``expr``, ``ir``).
        prefix: how the epilogue functions are spelled: ``"evtc."`` (``evtc.exp``) or ``""``.
        aux_load: how an extra M x N input is declared, for hints.
        to: how a conversion is written, for hints.
        name_error: the epilogue's own name (an argument in Python and for expressions, a
            word of the text in the IR).
        signature_error: parameter declarations (names, kinds, counts).
        output_error: output names.
        output_anchor: the docs anchor of output-name errors (None: the class's own).
        dtype_error: unknown dtype names and dtypes an input can't have.
        op_error: an op not in the op table, or the wrong number of operands.
        trace_error: what can't be traced: a reduction used inside, a traced exponent, a bad
            reduction axis, a constant that can't be evaluated or represented.
    """

    name: str
    prefix: str
    aux_load: str
    to: str
    name_error: type[EvtcError]
    signature_error: type[EvtcError]
    output_error: type[EvtcError]
    output_anchor: str | None
    dtype_error: type[EvtcError]
    op_error: type[EvtcError]
    trace_error: type[EvtcError] = TraceError

    def fn(self, name: str) -> str:
        """``name`` as this frontend spells the function: ``evtc.exp`` or ``exp``."""
        return f"{self.prefix}{name}"


#: the Python tracer (:mod:`evtc.frontend.trace`)
PYTHON = Dialect(
    name="python", prefix="evtc.", aux_load="evtc.Matrix[dtype]", to="x.to(dtype)",
    name_error=EpilogueSignatureError, signature_error=EpilogueSignatureError,
    output_error=TraceError, output_anchor="trace-return", dtype_error=EpilogueTypeError, op_error=UnsupportedOpError,
)
#: the expression form of ``evtc emit --expr`` (:func:`evtc.frontend.text.from_expr`): names,
#: calls and inputs written wrongly are grammar errors
EXPRESSION = Dialect(
    name="expr", prefix="", aux_load="name[m, n]", to="to(acc, dtype)",
    name_error=EpilogueSignatureError, signature_error=GrammarError,
    output_error=GrammarError, output_anchor=None, dtype_error=EpilogueTypeError, op_error=GrammarError,
)
#: the canonical IR text (:func:`evtc.frontend.text.parse_ir`): everything wrong in it is a
#: grammar error
IR_TEXT = Dialect(
    name="ir", prefix="", aux_load="'name: dtype aux'", to="'%k = convert(acc) : dtype'",
    name_error=GrammarError, signature_error=GrammarError,
    output_error=GrammarError, output_anchor=None, dtype_error=GrammarError, op_error=GrammarError,
    trace_error=GrammarError,
)


# ---------------------------------------------------------------------------------------------
# Values
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Pending:
    """A reduction not yet returned as an output (the result of :meth:`IRBuilder.reduce`).

    It is complete only after every tile is done, so it can only become an output (possibly
    converted first); using it inside the epilogue is an error located at ``loc``, the place
    this use of it is written (a frontend re-locates it at each reference with :meth:`at`).

    Attributes:
        node: the unnamed :class:`~evtc.ir.nodes.Reduction`.
        loc: where this use of it is written.
    """

    node: Reduction
    loc: SourceLoc | None = None

    def at(self, loc: SourceLoc | None) -> "Pending":
        """The same reduction, used at ``loc``."""
        return dataclasses.replace(self, loc=loc)

    def describe(self) -> str:
        """``max(..., dim=1)``: how the reduction reads in messages."""
        if self.node.kind == "group_scale":
            return "quantize(...)'s scales"
        dim = "" if self.node.dim is None else f", dim={self.node.dim}"
        return f"{self.node.op.value}(...{dim})"


#: what the builder's operations take and return: a node, a pending reduction, or a Python
#: constant (int, float, bool or a 0-d numpy value)
Value = Union[Node, Pending, int, float, bool, np.generic, np.ndarray]


def is_constant(x: Any) -> bool:
    """True for the Python constants a builder folds and lifts: int, float, bool, and 0-d numpy
    numbers (not complex)."""
    if isinstance(x, (bool, int, float)):
        return True
    return (type(x).__module__.startswith("numpy") and getattr(x, "shape", None) == ()
            and getattr(getattr(x, "dtype", None), "kind", "") in ("b", "i", "u", "f"))


def short_repr(x: Any, width: int = 40) -> str:
    """``repr(x)`` cut to ``width`` characters; integers too long to print are described."""
    if isinstance(x, int) and not isinstance(x, bool) and x.bit_length() > 128:
        sign = "-" if x < 0 else ""  # (str() of a huge int is slow, and refused beyond 4300 digits)
        return f"{sign}~10**{round(math.log10(abs(x)))} (an integer of {x.bit_length()} bits)"
    text = repr(x)
    return text if len(text) <= width else text[: width - 3] + "..."


def _shown(x: Any) -> str:
    """A constant as an expression shows it: ``2``, ``0.5``, ``True``, ``inf``."""
    if isinstance(x, (bool, np.bool_)):
        return str(bool(x))
    if isinstance(x, (int, np.integer)):
        return short_repr(int(x))
    try:
        v = float(x)
    except (TypeError, ValueError, OverflowError):
        return short_repr(x)
    return repr(v) if math.isfinite(v) else ("nan" if math.isnan(v) else "inf" if v > 0 else "-inf")


def _int_bits(x: Any) -> int:
    return abs(x).bit_length() if isinstance(x, int) else 0


_BINARY: dict[str, Callable[[Any, Any], Any]] = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "div": operator.truediv,
    "gt": operator.gt, "ge": operator.ge, "lt": operator.lt, "le": operator.le,
    "eq": operator.eq, "ne": operator.ne,
}
_SYMBOLS = {"add": "+", "sub": "-", "mul": "*", "div": "/", "gt": ">", "ge": ">=", "lt": "<", "le": "<=",
            "eq": "==", "ne": "!="}
#: Python evaluates ``constant OP value`` with the value's reflected comparison
_REFLECTED = {"gt": "lt", "lt": "gt", "ge": "le", "le": "ge", "eq": "eq", "ne": "ne"}

_USED_INSIDE_HINT = "a reduction is only complete after every tile is done, so it can only be returned as an output"
_OUTPUT_HINT = "outputs must depend on acc, C or an M x N aux input; vectors come out of reductions"
_DIM_HINT = "dim=1 (or -1) reduces over N, one value per row; dim=0 (or -2) over M; no dim: both"


def reduction_dim_message(dim) -> str:
    """What is wrong with a ``dim`` that :func:`is_reduction_dim` refuses (both forms say it)."""
    if isinstance(dim, Node):  # the expression form's dim=alpha, dim=acc, dim=relu(1)...: a value, no number
        shown = dim.name if isinstance(dim, Leaf) and dim.name else f"a {type(dim).__name__.lower()} value"
        return f"dim={shown} is not a reduction axis of an M x N tile: the axis is a number written as such"
    return f"dim={dim!r:.40} is not a reduction axis of an M x N tile"


def is_reduction_dim(dim) -> bool:
    """Whether ``dim`` is a reduction axis of an M x N tile: None, or the integer 0, 1, -1 or -2
    (a bool, a float or a string is none; the traced and the eager forms both ask)."""
    return dim is None or (not isinstance(dim, bool) and isinstance(dim, (int, np.integer)) and dim in (0, 1, -1, -2))

#: how each input kind is named in messages
KIND_WORDS: dict[type[Leaf], str] = {
    Accumulator: "the accumulator", Source: "the source matrix C", ScalarBroadcast: "a scalar",
    RowBroadcast: "a row vector [n]", ColBroadcast: "a column vector [m]", AuxLoad: "an M x N input [m, n]",
}


def not_elementwise_error(name: str, dialect: Dialect, loc: SourceLoc | None, epilogue: str | None) -> EvtcError:
    """The error for the reduction ``max(a, b)``/``min(a, b)`` called with two values, as if it
    were the elementwise ``maximum``/``minimum`` (also raised when no trace is running)."""
    return dialect.trace_error(f"{dialect.fn(name)}() takes one value and reduces it", loc=loc, epilogue=epilogue,
                               hint=f"for the elementwise {name} of two values use {dialect.fn(name + 'imum')}(a, b); "
                                    "pass the axis as dim=")


def unknown_function_error(name: str, functions: Sequence[str], dialect: Dialect, loc: SourceLoc | None,
                           epilogue: str | None, *, also: Sequence[str] = (),
                           cls: type[EvtcError] | None = None) -> EvtcError:
    """The error for calling a function the frontend doesn't have (``evtc.rleu(x)`` in Python,
    ``rleu(x)`` in an expression): the same message in every frontend, with the close matches
    (difflib) and the list of functions.

    Args:
        name: the name as written, without the dialect's prefix.
        functions: the functions the frontend offers (listed in the hint).
        dialect: spells the names (``evtc.relu`` or ``relu``) and picks the class (``op_error``).
        also: other names a close match may be (``Gemm``, ``RowVector``: not listed).
        cls: the class instead of the dialect's (the ``evtc`` module's ``__getattr__`` raises
            :class:`~evtc.errors.UnknownFunctionError`, an ``AttributeError`` too).

    Example::

        unknown function 'evtc.rleu'
          hint: did you mean 'evtc.relu'? functions: abs, amax, clamp, ...
    """
    close = difflib.get_close_matches(name, [*functions, *also], n=3, cutoff=0.6)
    hint = f"did you mean {' or '.join(repr(dialect.fn(c)) for c in close)}? " if close else ""
    hint += f"functions: {', '.join(sorted(functions))}"
    return (cls or dialect.op_error)(f"unknown function '{dialect.fn(name)}'", loc=loc, epilogue=epilogue,
                                     hint=hint)


def constant_reduction_error(loc: SourceLoc | None, epilogue: str | None) -> EvtcError:
    """The error for a reduction of a constant (``sum(2.0)``; also raised when no trace is
    running)."""
    return EpilogueTypeError("reducing a constant; reductions take an M x N value", loc=loc, epilogue=epilogue)
