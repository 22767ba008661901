"""The tracer: runs an epilogue function on proxy values and records a Graph.

Input: a Python function and the dtypes of C and D. Output: :class:`evtc.ir.graph.Graph`.

Tracing is by operator overloading (torch.fx's ``Proxy``, JAX's tracers), not by re-parsing
the function's AST: the function runs once with :class:`Value` proxies for its parameters,
and every operation on a proxy asks the trace's :class:`~evtc.frontend.builder.IRBuilder` for a
node; the builder holds the semantics and the messages shared with the text forms. Each node
records the user's source line (``file:line:col``), found by walking the stack to the first
frame outside the evtc package (torch.fx ``record_stack_traces``).

What can't be traced raises a located :class:`~evtc.errors.TraceError`: Python ``if``/``while``/
``bool()``/``and``/``or`` on a traced value (use :func:`evtc.where`), ``float(x)``/``math.*``
(use the ``evtc.*`` op), numpy ufuncs, iterating, indexing, and using a reduction result
inside the epilogue. An exception the function itself raises while it is traced (a
``NameError``, ``1/0``, ``sys.exit()``'s ``SystemExit``) comes out as a TraceError located at the
line that raised it.

What a function may be: a ``def`` or a ``lambda``, with positional-only, ordinary and
keyword-only parameters (defaults are ignored: every parameter is a runtime input), a
``functools.partial`` (parameters it binds by keyword are constants, not inputs), a bound method,
or an object with ``__call__``. ``*args``/``**kwargs`` parameters are an
:class:`~evtc.errors.EpilogueSignatureError`.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import linecache
import os
import re
import sys
import types
from pathlib import Path
from typing import Any, Callable

from evtc import dtypes
from evtc.dtypes import DType, f32
from evtc.errors import EpilogueSignatureError, EvtcError, SourceLoc, TraceError
from evtc.frontend.builder import PYTHON, IRBuilder, Pending, is_constant, not_elementwise_error
from evtc.ir import nodes as N
from evtc.ir.graph import Graph
from evtc.ir.names import name_problem

__all__ = [
    "user_loc", "ParamKind", "Scalar", "DeviceScalar", "RowVector", "ColVector", "Matrix", "SourceMatrix", "Acc",
    "classify_parameter", "signature_kinds", "default_name", "Tracer", "Value", "Reduced", "apply", "reduce",
    "trace",
]

#: the evtc package's folder, with a trailing separator (a frame whose file is below it is evtc's)
_EVTC_DIR = str(Path(__file__).resolve().parent.parent) + os.sep


def _is_evtc_file(filename: str) -> bool:
    return filename.startswith(_EVTC_DIR) or filename == "<evtc>"


@functools.lru_cache(maxsize=512)
def _positions(code: types.CodeType) -> tuple:
    """The (line, end_line, col, end_col) of each instruction of ``code`` (cached: a long
    epilogue asks once per traced operation)."""
    return tuple(code.co_positions())


def _frame_loc(code: types.CodeType, lineno: int | None, lasti: int) -> SourceLoc:
    filename = code.co_filename
    lineno = lineno or code.co_firstlineno
    col = end_col = None
    try:
        pos = _positions(code)[lasti // 2]
        if pos[0] == lineno and pos[1] == lineno:
            col, end_col = pos[2], pos[3]
    except (IndexError, TypeError, AttributeError):
        pass
    text = linecache.getline(filename, lineno).rstrip("\n") or None
    return SourceLoc(filename, lineno, col, end_col, text)


def user_loc(skip_internal: bool = True) -> SourceLoc | None:
    """The location of the innermost stack frame outside the evtc package (the user's line),
    with the column span of the expression being evaluated when Python knows it (3.11+)."""
    frame = sys._getframe(1)
    while frame is not None and skip_internal and _is_evtc_file(frame.f_code.co_filename):
        frame = frame.f_back
    if frame is None:
        return None
    return _frame_loc(frame.f_code, frame.f_lineno, frame.f_lasti)


# ---------------------------------------------------------------------------------------------
# Parameter annotations: evtc.RowVector[f32], evtc.Scalar[f32], ...
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ParamKind:
    """What an epilogue parameter is: its leaf class and (optional) dtype."""

    leaf: type[N.Leaf]
    dtype: DType | None = None
    by_pointer: bool = False
    label: str = ""

    def __getitem__(self, dtype: DType | str) -> "ParamKind":
        return dataclasses.replace(self, dtype=dtypes.coerce(dtype))

    def __repr__(self) -> str:
        return f"evtc.{self.label}[{self.dtype}]" if self.dtype else f"evtc.{self.label}"


#: a runtime scalar passed by value, e.g. ``alpha: evtc.Scalar[f32]`` (a bare ``float`` works too)
Scalar = ParamKind(N.ScalarBroadcast, f32, label="Scalar")
#: a scalar read from device memory (one per batch when given a length-L tensor)
DeviceScalar = ParamKind(N.ScalarBroadcast, f32, by_pointer=True, label="DeviceScalar")
#: a length-N vector broadcast along M (a bias per output column)
RowVector = ParamKind(N.RowBroadcast, f32, label="RowVector")
#: a length-M vector broadcast along N (a scale per output row)
ColVector = ParamKind(N.ColBroadcast, f32, label="ColVector")
#: another M x N input (an aux load); bare ``Matrix`` takes the GEMM's D dtype
Matrix = ParamKind(N.AuxLoad, None, label="Matrix")
#: the source matrix C; bare ``Source`` (or a parameter named ``C``) takes the GEMM's C dtype
SourceMatrix = ParamKind(N.Source, None, label="Source")
#: the accumulator (a parameter named ``acc`` needs no annotation)
Acc = ParamKind(N.Accumulator, f32, label="Accumulator")


def classify_parameter(epilogue: str, param: inspect.Parameter, annotation: Any, index: int,
                       loc: SourceLoc | None) -> ParamKind:
    """Decide the kind of one parameter from its annotation and name (its name itself is
    checked by the builder, :meth:`~evtc.frontend.builder.IRBuilder.check_input_name`).

    Raises:
        EpilogueSignatureError: a ``*args``/``**kwargs`` parameter, or the kind can't be
            inferred or the annotation is not one evtc knows; the message says which
            annotations are accepted.
    """
    name = param.name
    if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        stars = "*" if param.kind is inspect.Parameter.VAR_POSITIONAL else "**"
        raise EpilogueSignatureError(
            f"parameter '{stars}{name}' can't be traced: epilogue parameters must be named one by one",
            loc=loc, epilogue=epilogue,
        )
    if name == "acc" and annotation is not inspect.Parameter.empty and \
            not (isinstance(annotation, ParamKind) and annotation.leaf is N.Accumulator):
        # ('acc: float' made a runtime scalar named acc: the GEMM's product was never read)
        raise EpilogueSignatureError(
            f"parameter 'acc' is annotated {annotation!r:.60}: 'acc' names the accumulator, an f32 M x N tile",
            loc=loc, epilogue=epilogue,
            hint="leave 'acc' unannotated; give a scalar or vector input another name")
    if isinstance(annotation, ParamKind):
        return annotation
    if annotation is float or annotation is int:
        return Scalar
    if annotation is inspect.Parameter.empty:
        if name == "acc":
            return Acc
        if name == "C":
            return SourceMatrix
    got = "no annotation" if annotation is inspect.Parameter.empty else f"annotation {annotation!r}"
    hint = ("name the accumulator 'acc' and the source matrix 'C', and annotate every other "
            "parameter: float or evtc.Scalar[dtype] (runtime scalar), evtc.RowVector[dtype] "
            "(length N), evtc.ColVector[dtype] (length M), evtc.Matrix[dtype] (M x N aux load)")
    if param.default is not inspect.Parameter.empty:
        hint += ("; a default value doesn't make a parameter a constant: bind constants with "
                 "functools.partial(fn, name=value) or a closure")
    raise EpilogueSignatureError(f"can't infer what parameter '{name}' is ({got})", loc=loc, epilogue=epilogue,
                                 hint=hint)


# ---------------------------------------------------------------------------------------------
# The proxies
# ---------------------------------------------------------------------------------------------


class Tracer:
    """State of one trace: the :class:`~evtc.frontend.builder.IRBuilder` it drives."""

    def __init__(self, builder: IRBuilder) -> None:
        self.builder = builder

    @property
    def epilogue(self) -> str:
        return self.builder.epilogue

    def error(self, cls: type[EvtcError], message: str, hint: str | None = None, loc=None) -> EvtcError:
        return cls(message, loc=loc or user_loc(), epilogue=self.epilogue, hint=hint)

    def operand(self, x: Any, loc: SourceLoc | None) -> Any:
        """What the builder takes for ``x``: a Value's node, a Reduced's pending reduction
        (located at this use), or ``x`` itself (a constant, or something the builder rejects)."""
        if isinstance(x, Value):
            if x._tracer is not self:
                raise self.error(TraceError, "a value from another epilogue's trace was used here", loc=loc)
            return x._node
        if isinstance(x, Reduced):
            return x._pending.at(loc)
        return x

    def value(self, x: Any) -> Any:
        """A proxy for what the builder returned: a Value for a node, a Reduced for a pending
        reduction (a constant stays a constant)."""
        if isinstance(x, N.Node):
            return Value(self, x)
        if isinstance(x, Pending):
            return Reduced(self, x)
        return x


def _tracer_of(args: tuple) -> Tracer | None:
    return next((a._tracer for a in args if isinstance(a, (Value, Reduced))), None)


def apply(op: str, *args: Any, dtype: DType = f32, tracer: Tracer | None = None) -> "Value":
    """Record ``op(*args)`` as it is (no folding) and return its proxy (one of ``args`` must be
    a Value or Reduced, or ``tracer`` given)."""
    tracer = tracer or _tracer_of(args)
    loc = user_loc()
    nodes = tuple(tracer.operand(a, loc) for a in args)
    return tracer.value(tracer.builder.apply(op, nodes, loc, dtype=dtype))


def call(op: str, *args: Any) -> Any:
    """``evtc.<op>(*args)`` with at least one traced argument (the builder's ``call``)."""
    tracer = _tracer_of(args)
    loc = user_loc()
    return tracer.value(tracer.builder.call(op, tuple(tracer.operand(a, loc) for a in args), loc))


class Value:
    """A traced value inside an epilogue: arithmetic on it records nodes.

    Supports ``+ - * / **`` (with a constant exponent), unary ``-`` and ``abs()``, comparisons
    (which give 1.0/0.0 masks), and ``.to(dtype)``. Python control flow on it is an error.
    """

    __slots__ = ("_tracer", "_node")
    __array_ufunc__ = None  # numpy defers to our reflected operators and never loops over us

    def __init__(self, tracer: Tracer, node: N.Node) -> None:
        self._tracer = tracer
        self._node = node

    def __repr__(self) -> str:
        name = getattr(self._node, "name", "") or self._node.kind
        return f"<evtc traced value {name}: {self._node.dtype}>"

    @property
    def dtype(self) -> DType:
        return self._node.dtype

    def _binary(self, op: str, a: Any, b: Any) -> Any:
        tr = self._tracer
        loc = user_loc()
        return tr.value(tr.builder.binary(op, tr.operand(a, loc), tr.operand(b, loc), loc))

    # arithmetic
    def __add__(self, o): return self._binary("add", self, o)
    def __radd__(self, o): return self._binary("add", o, self)
    def __sub__(self, o): return self._binary("sub", self, o)
    def __rsub__(self, o): return self._binary("sub", o, self)
    def __mul__(self, o): return self._binary("mul", self, o)
    def __rmul__(self, o): return self._binary("mul", o, self)
    def __truediv__(self, o): return self._binary("div", self, o)
    def __rtruediv__(self, o): return self._binary("div", o, self)
    def __neg__(self): return self._tracer.value(self._tracer.builder.negate(self._node, user_loc()))
    def __pos__(self): return self
    def __abs__(self): return call("abs", self)

    def __pow__(self, o):
        tr = self._tracer
        loc = user_loc()
        return tr.value(tr.builder.power(self._node, tr.operand(o, loc), loc))

    def __rpow__(self, o):
        tr = self._tracer
        loc = user_loc()
        return tr.value(tr.builder.power(tr.operand(o, loc), self._node, loc))

    def __floordiv__(self, o):
        raise self._tracer.error(TraceError, "'//' (floor division) is not supported in epilogues",
                                 hint="use '/' for true division")

    __rfloordiv__ = __floordiv__

    def __mod__(self, o):
        raise self._tracer.error(TraceError, "'%' (remainder) is not supported in epilogues",
                                 hint="evtc has no remainder op ('evtc ops' lists what an epilogue can use)")

    __rmod__ = __mod__

    def __matmul__(self, o):
        raise self._tracer.error(TraceError, "'@' inside an epilogue: the GEMM itself is outside the epilogue",
                                 hint="the epilogue receives the product as 'acc'")

    __rmatmul__ = __matmul__

    # comparisons give 1.0 / 0.0 masks
    def __gt__(self, o): return self._binary("gt", self, o)
    def __ge__(self, o): return self._binary("ge", self, o)
    def __lt__(self, o): return self._binary("lt", self, o)
    def __le__(self, o): return self._binary("le", self, o)
    def __eq__(self, o): return self._binary("eq", self, o)  # type: ignore[override]
    def __ne__(self, o): return self._binary("ne", self, o)  # type: ignore[override]
    __hash__ = object.__hash__

    def to(self, dtype: DType | str) -> "Value":
        """Convert to ``dtype`` (rounding to nearest; fp8 saturates to its finite range)."""
        tr = self._tracer
        return tr.value(tr.builder.convert(self._node, dtype, user_loc()))

    # things that can't be traced
    def __bool__(self):
        loc = user_loc()
        hint = "Python control flow can't depend on a traced value; use evtc.where(cond, a, b) to select elementwise"
        if loc is not None and loc.text and any(f"{b}(" in loc.text for b in ("max", "min")):
            hint = "Python's max()/min() compare with 'if'; use evtc.maximum(a, b) / evtc.minimum(a, b)"
        raise TraceError("a traced value was used as a Python bool (if, while, and, or, not, bool())",
                         loc=loc, epilogue=self._tracer.epilogue, hint=hint, anchor="trace-bool")

    def _not_a_number(self, what: str):
        raise TraceError(f"{what} of a traced value: it has no value while tracing",
                         loc=user_loc(), epilogue=self._tracer.epilogue,
                         hint="use the evtc.* ops (evtc.exp, evtc.sqrt, ...) instead of math.* or float()",
                         anchor="trace-python-number")

    def __float__(self): self._not_a_number("float()")
    def __int__(self): self._not_a_number("int()")
    def __index__(self): self._not_a_number("using as an index")
    def __complex__(self): self._not_a_number("complex()")
    def __round__(self, ndigits=None): self._not_a_number("round()")
    def __trunc__(self): self._not_a_number("math.trunc()")
    def __floor__(self): self._not_a_number("math.floor()")
    def __ceil__(self): self._not_a_number("math.ceil()")

    def __iter__(self):
        raise self._tracer.error(TraceError, "a traced value can't be iterated or unpacked",
                                 hint="an epilogue value is one element of the tile; there is nothing to iterate")

    def __len__(self):
        raise self._tracer.error(TraceError, "len() of a traced value")

    def __getitem__(self, item):
        raise self._tracer.error(TraceError, "indexing a traced value",
                                 hint="epilogue values are elementwise; broadcast vectors are declared with "
                                      "evtc.RowVector / evtc.ColVector")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        if _is_tensor_method(name):
            raise _torch_written(self._tracer.error(
                TraceError, f"x.{name}() is a torch.Tensor method, and the epilogue is traced with evtc's values",
                hint="write the whole epilogue with torch ops and decorate it with "
                     "@evtc.epilogue(frontend='torch') (docs/torch.md), or use the evtc.* functions"))
        raise TraceError(f"traced values have no attribute '{name}'", loc=user_loc(),
                         epilogue=self._tracer.epilogue,
                         hint="use the evtc.* functions (evtc.exp(x), evtc.relu(x)...) and x.to(dtype)")

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        tracer = _tracer_of(tuple(args) + tuple((kwargs or {}).values()))
        if tracer is None:  # (a Value inside a list argument: torch.stack([x, y]))
            tracer = Tracer(IRBuilder("epilogue"))
        raise _torch_written(tracer.error(
            TraceError, f"torch.{name} was called on a traced value",
            hint=f"use evtc.{name} if it exists (see 'evtc ops'), or write the whole epilogue with torch ops and "
                 "decorate it with @evtc.epilogue(frontend='torch') (docs/torch.md)",
        ))


def _is_tensor_method(name: str) -> bool:
    """Whether ``x.<name>`` is a ``torch.Tensor`` attribute, when torch is installed (this error
    path imports it; tracing itself never does), so that the answer, and what ``@evtc.epilogue``
    does with the function, doesn't depend on whether something else imported torch first."""
    torch = sys.modules.get("torch")
    if torch is None:
        import importlib.util

        if importlib.util.find_spec("torch") is None:
            return False
        import torch
    return hasattr(torch.Tensor, name)


def _torch_written(err: EvtcError) -> EvtcError:
    """Mark ``err`` as raised because the function uses torch: ``@evtc.epilogue`` (frontend
    ``"auto"``) then imports it with the torch importer instead."""
    err.torch_written = True
    return err


class Reduced:
    """The result of :func:`evtc.sum` / ``max`` / ``min`` / ``amax`` while tracing: it can only
    be returned as an output (or converted with ``.to(dtype)`` first)."""

    __slots__ = ("_tracer", "_pending")

    def __init__(self, tracer: Tracer, pending: Pending) -> None:
        self._tracer = tracer
        self._pending = pending

    @property
    def _node(self) -> N.Reduction:
        return self._pending.node

    def __repr__(self) -> str:
        return f"<evtc traced {self._node.role} {self._pending.describe()}>"

    def _use(self, *_a, **_k):
        loc = user_loc()
        self._tracer.builder.lift(self._pending.at(loc), loc)  # raises: a reduction used inside

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _use
    __truediv__ = __rtruediv__ = __floordiv__ = __rfloordiv__ = __mod__ = __rmod__ = _use
    __neg__ = __pos__ = __abs__ = __pow__ = __rpow__ = __matmul__ = __rmatmul__ = _use
    __bool__ = __float__ = __int__ = __index__ = __complex__ = __iter__ = __len__ = __getitem__ = _use
    __gt__ = __lt__ = __ge__ = __le__ = __eq__ = __ne__ = _use  # type: ignore[assignment]
    __hash__ = object.__hash__
    __array_ufunc__ = None

    def to(self, dtype):
        """Set the output dtype of the reduction (accumulation stays f32)."""
        loc = user_loc()
        return Reduced(self._tracer, self._tracer.builder.convert(self._pending, dtype, loc))


def reduce(op: str, x: Any, dim: int | None) -> Reduced:
    """Record a reduction (``sum``, ``max``, ``min``) of the traced value ``x``."""
    tracer = x._tracer
    loc = user_loc()
    return Reduced(tracer, tracer.builder.reduce(op, tracer.operand(x, loc), dim, loc))


def quantize(x: Any, dtype: Any, group: Any, convention: Any, scale_layout: Any = "row_major") -> tuple[Value, Reduced]:
    """Record ``evtc.quantize`` of the traced value ``x``: (the quantized value, its scales)."""
    tracer = x._tracer
    loc = user_loc()
    q, scales = tracer.builder.quantize(tracer.operand(x, loc), dtype, group, convention, loc, scale_layout)
    return Value(tracer, q), Reduced(tracer, scales)


def glu(x: Any, act: Any) -> Value:
    """Record ``evtc.glu`` of the traced value ``x``: the gated value (N / 2 columns)."""
    tracer = x._tracer
    loc = user_loc()
    return Value(tracer, tracer.builder.glu(tracer.operand(x, loc), act, loc))


def not_elementwise(name: str, args: tuple) -> EvtcError:
    """The error for ``evtc.max(a, b)`` meant elementwise (traced or not)."""
    tracer = _tracer_of(args)
    return not_elementwise_error(name, PYTHON, user_loc(), tracer.epilogue if tracer else None)


# ---------------------------------------------------------------------------------------------
# Tracing a function
# ---------------------------------------------------------------------------------------------


def _source_object(fn: Callable) -> Any:
    """What holds ``fn``'s source: the function under a partial, the ``__call__`` of an
    object that is not a function."""
    while isinstance(fn, functools.partial):
        fn = fn.func
    if not (inspect.isfunction(fn) or inspect.ismethod(fn) or inspect.isclass(fn)) and callable(fn):
        fn = getattr(type(fn), "__call__", fn)
    return fn


#: the last function whose source was read, and what was read: a trace asks for the def line and
#: then each parameter's, and inspect.getsourcelines tokenizes the function every time
_last_source: list = [None, None]


def _source_lines(fn: Callable) -> tuple[str, list[str], int] | None:
    obj = _source_object(fn)
    if _last_source[0] is obj:
        return _last_source[1]
    try:
        file = inspect.getsourcefile(obj) or "<unknown>"
        lines, start = inspect.getsourcelines(obj)
    except (OSError, TypeError, IndexError):
        return None
    _last_source[:] = [obj, (file, lines, start)]
    return file, lines, start


def _def_loc(fn: Callable) -> SourceLoc | None:
    src = _source_lines(fn)
    if src is None:
        return None
    file, lines, start = src
    # Point at the 'def' line, after any decorators.
    for i, text in enumerate(lines):
        if text.lstrip().startswith(("def ", "async def ")):
            return SourceLoc(file, start + i, text.index("def"), None, text.rstrip("\n"))
    return SourceLoc(file, start, 0, None, lines[0].rstrip("\n"))


def _param_loc(fn: Callable, name: str, default: SourceLoc | None) -> SourceLoc | None:
    """The location of parameter ``name`` in the def line(s) of ``fn``, if it can be found."""
    if default is None:
        return None
    src = _source_lines(fn)
    if src is None:
        return default
    file, lines, start = src
    pat = re.compile(rf"\b{re.escape(name)}\b")
    for i in range(default.line - start, len(lines)):
        m = pat.search(lines[i])
        if m:
            return SourceLoc(file, start + i, m.start(), m.end(), lines[i].rstrip("\n"))
        if lines[i].rstrip().endswith(":"):
            break
    return default


def default_name(fn: Callable) -> str:
    """The epilogue name of ``fn`` when none is given: its ``__name__`` (of the function under
    a partial, of the class of a callable object), made an identifier (``<lambda>`` becomes
    ``lambda``), or ``epilogue``."""
    base = fn
    while isinstance(base, functools.partial):
        base = base.func
    name = getattr(base, "__name__", None)
    if not isinstance(name, str):
        name = type(base).__name__
    if name_problem(name) is not None:
        name = re.sub(r"[^A-Za-z0-9_]", "", name)
    return name if name_problem(name) is None else "epilogue"


def _parameters(fn: Callable, builder: IRBuilder) -> list[tuple[inspect.Parameter, ParamKind, SourceLoc | None]]:
    """(parameter, kind, loc) of every parameter of ``fn`` that is an input, in order: the
    names checked by the builder, the kinds by :func:`classify_parameter`."""
    epilogue = builder.epilogue
    loc = builder.loc
    try:
        inspect.signature(fn)
    except (TypeError, ValueError) as e:
        raise EpilogueSignatureError(f"can't read the signature of {fn!r:.60}: {e}", loc=loc, epilogue=epilogue,
                                     hint="an epilogue is a Python function (def or lambda) of its inputs") from None
    try:
        sig = inspect.signature(fn, eval_str=True)
    except Exception as e:  # noqa: BLE001 - a string annotation that doesn't evaluate
        raise EpilogueSignatureError(f"the annotations of '{epilogue}' could not be evaluated: {e}",
                                     loc=loc, epilogue=epilogue) from None
    bound = set(fn.keywords) if isinstance(fn, functools.partial) else set()
    out = []
    for i, p in enumerate(sig.parameters.values()):
        if p.name in bound:
            continue  # a constant bound by functools.partial
        ploc = _param_loc(fn, p.name, loc)
        if p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
            builder.check_input_name(p.name, ploc)
        out.append((p, classify_parameter(epilogue, p, p.annotation, i, ploc), ploc))
    return out


def signature_kinds(fn: Callable, epilogue: str) -> list[tuple[str, ParamKind]]:
    """The (name, kind) of every parameter of ``fn`` that is an input, in order.

    Raises:
        EpilogueSignatureError: a parameter's name or kind is not accepted, its annotation
            can't be evaluated, or the epilogue's name is not an identifier.
    """
    builder = IRBuilder(epilogue, dialect=PYTHON, loc=_def_loc(fn))
    return [(p.name, kind) for p, kind, _ in _parameters(fn, builder)]


@functools.lru_cache(maxsize=1)
def _library_dirs() -> tuple[str, ...]:
    import sysconfig

    paths = sysconfig.get_paths()
    return tuple(str(Path(paths[k]).resolve()) + os.sep for k in ("stdlib", "platstdlib", "purelib", "platlib")
                 if k in paths)


def _raised_by_the_function(err: Exception, epilogue: str, transparent: frozenset = frozenset()) -> TraceError:
    """A TraceError for an exception raised while the epilogue function ran, located at the
    innermost frame of the user's own code (not evtc's, not a library's). When evtc's frames lie
    between that line and the one that raised, evtc itself failed on what the line asked for,
    and the message says so; frames whose code object is in ``transparent`` (the torch
    importer's mode, which only passes calls on) don't count as evtc's there."""
    frames = []
    tb = err.__traceback__
    while tb is not None:
        frames.append((tb.tb_frame.f_code, tb.tb_lineno, tb.tb_lasti))
        tb = tb.tb_next
    user = [i for i, (code, _, _) in enumerate(frames)
            if not _is_evtc_file(code.co_filename) and not code.co_filename.startswith(_library_dirs())]
    if not user:
        user = [i for i, (code, _, _) in enumerate(frames) if not _is_evtc_file(code.co_filename)]
    loc = _frame_loc(*frames[user[-1]]) if user else None
    below = frames[user[-1] + 1:] if user else frames
    text = str(err)
    text = f"{type(err).__name__}: {text}" if text else type(err).__name__
    text = text if len(text) <= 300 else text[:297] + "..."
    if any(_is_evtc_file(code.co_filename) and code not in transparent for code, _, _ in below):
        return TraceError(f"evtc raised {text} while tracing this line", loc=loc, epilogue=epilogue,
                          hint="this may be a bug in evtc: please report it with the epilogue "
                               "(EVTC_TRACEBACK=full shows evtc's frames)")
    return TraceError(f"the epilogue function raised {text}", loc=loc, epilogue=epilogue,
                      hint="the function runs once, on traced values, when evtc traces it; fix the error at this "
                           "line (EVTC_TRACEBACK=full shows the whole traceback)")


def trace(fn: Callable, *, c: DType | None = None, d: DType = dtypes.bf16, name: str | None = None) -> Graph:
    """Trace ``fn`` into a Graph.

    Args:
        fn: the epilogue function. Parameters are classified by :func:`classify_parameter`.
        c: dtype of the source C when the function takes one and doesn't annotate it
            (defaults to ``d``).
        d: dtype of M x N outputs that don't set their own with ``.to(dtype)``, and of bare
            ``evtc.Matrix`` aux loads.
        name: the epilogue's name (defaults to :func:`default_name`).

    Returns:
        The traced, not yet simplified, Graph. Outputs are in the order returned; a bare
        return value is the output ``D``.

    Raises:
        EpilogueSignatureError, TraceError, EpilogueTypeError: located at the user's line.
    """
    epilogue = name or default_name(fn)
    builder = IRBuilder(epilogue, c=c or d, d=d, dialect=PYTHON, loc=_def_loc(fn))
    tracer = Tracer(builder)
    params = _parameters(fn, builder)
    args: list[Value] = []
    kwargs: dict[str, Value] = {}
    for p, kind, ploc in params:
        leaf = builder.input(p.name, kind.leaf, kind.dtype, by_pointer=kind.by_pointer, loc=ploc)
        if p.kind is inspect.Parameter.POSITIONAL_ONLY:
            args.append(Value(tracer, leaf))
        else:
            kwargs[p.name] = Value(tracer, leaf)
    try:
        result = fn(*args, **kwargs)
    except EvtcError as err:
        raise err.with_context(epilogue=builder.epilogue)  # (errors of eager evtc.* calls know no epilogue)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the user's own error (or sys.exit()), at their line
        raise _raised_by_the_function(err, builder.epilogue) from err
    if inspect.iscoroutine(result):
        result.close()
    _collect_outputs(tracer, result, builder.loc)
    return builder.graph()


def _collect_outputs(tracer: Tracer, result: Any, loc: SourceLoc | None) -> None:
    """Declare the outputs of ``result``: a traced value (the output ``D``) or a dict."""
    builder = tracer.builder
    epilogue = builder.epilogue
    if isinstance(result, (Value, Reduced)):
        items = [("D", result)]
    elif isinstance(result, dict):
        items = list(result.items())
        if not items:
            raise TraceError("the epilogue returned an empty dict", loc=loc, epilogue=epilogue, anchor="trace-return",
                             hint="return a traced value (the output D) or a dict of named outputs")
    elif isinstance(result, (tuple, list)):
        raise TraceError(
            f"the epilogue returned a {type(result).__name__}; outputs need names",
            loc=loc, epilogue=epilogue,
            hint='return a dict: {"D": d, "F": f, "row_max": evtc.max(d, dim=1)}', anchor="trace-return",
        )
    else:
        raise TraceError(
            f"the epilogue returned {type(result).__name__} {result!r:.40}, not a traced value",
            loc=loc, epilogue=epilogue,
            hint="return an expression of the parameters (e.g. 'return acc * alpha'), or a dict of them",
            anchor="trace-return",
        )
    for key, val in items:
        builder.check_output_name(key, loc)  # at the def line: the dict has no location of its own
        if isinstance(val, Reduced):
            if val._tracer is not tracer:
                raise tracer.error(TraceError, "a value from another epilogue's trace was used here", loc=loc)
            builder.output(key, val._pending, loc)
        elif isinstance(val, Value):
            node = tracer.operand(val, loc)
            builder.output(key, node, node.loc or loc)
        elif is_constant(val):
            builder.output(key, val, loc)
        else:
            raise TraceError(
                f"output '{key}' is a {type(val).__name__}, not a traced value",
                loc=loc, epilogue=epilogue, hint="every output must be computed from the parameters",
                anchor="trace-return",
            )
