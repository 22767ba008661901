"""The tracer: runs an epilogue function on proxy values and records a Graph.

Input: a Python function and the dtypes of C and D. Output: :class:`evtc.ir.graph.Graph`.

Tracing is by operator overloading (torch.fx's ``Proxy``, JAX's tracers), not by re-parsing
the function's AST: the function runs once with :class:`Value` proxies for its parameters,
and every operation on a proxy adds a node through the trace's
:class:`~evtc.ir.graph.GraphBuilder`. Each node records the user's source line
(``file:line:col``), found by walking the stack to the first frame outside the evtc package
(torch.fx ``record_stack_traces``).

What can't be traced raises a located :class:`~evtc.errors.TraceError`: Python ``if``/``while``/
``bool()``/``and``/``or`` on a traced value (use :func:`evtc.where`), ``float(x)``/``math.*``
(use the ``evtc.*`` op), numpy ufuncs, iterating, indexing, and using a reduction result
inside the epilogue.
"""

from __future__ import annotations

import dataclasses
import inspect
import linecache
import sys
from pathlib import Path
from typing import Any, Callable

from evtc import dtypes
from evtc.dtypes import DType, f32
from evtc.errors import EpilogueSignatureError, EpilogueTypeError, SourceLoc, TraceError, UnknownDTypeError
from evtc.ir.graph import Graph, GraphBuilder
from evtc.ir.nodes import (
    Accumulator,
    AuxLoad,
    Bcast,
    ColBroadcast,
    Compute,
    Immediate,
    Leaf,
    Node,
    Output,
    ReduceOp,
    Reduction,
    RowBroadcast,
    ScalarBroadcast,
    Source,
    Store,
)

_EVTC_DIR = str(Path(__file__).resolve().parent.parent)


def user_loc(skip_internal: bool = True) -> SourceLoc | None:
    """The location of the innermost stack frame outside the evtc package (the user's line),
    with the column span of the expression being evaluated when Python knows it (3.11+)."""
    frame = sys._getframe(1)
    while frame is not None and skip_internal and frame.f_code.co_filename.startswith(_EVTC_DIR):
        frame = frame.f_back
    if frame is None:
        return None
    filename = frame.f_code.co_filename
    lineno = frame.f_lineno
    col = end_col = None
    positions = getattr(frame.f_code, "co_positions", None)
    if positions is not None:
        try:
            pos = list(positions())[frame.f_lasti // 2]
            if pos[0] == lineno and pos[1] == lineno:
                col, end_col = pos[2], pos[3]
        except (IndexError, TypeError):
            pass
    text = linecache.getline(filename, lineno).rstrip("\n") or None
    return SourceLoc(filename, lineno, col, end_col, text)


# ---------------------------------------------------------------------------------------------
# Parameter annotations: evtc.RowVector[f32], evtc.Scalar[f32], ...
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ParamKind:
    """What an epilogue parameter is: its leaf class and (optional) dtype."""

    leaf: type[Leaf]
    dtype: DType | None = None
    by_pointer: bool = False
    label: str = ""

    def __getitem__(self, dtype: DType | str) -> "ParamKind":
        return dataclasses.replace(self, dtype=dtypes.coerce(dtype))

    def __repr__(self) -> str:
        return f"evtc.{self.label}[{self.dtype}]" if self.dtype else f"evtc.{self.label}"


#: a runtime scalar passed by value, e.g. ``alpha: evtc.Scalar[f32]`` (a bare ``float`` works too)
Scalar = ParamKind(ScalarBroadcast, f32, label="Scalar")
#: a scalar read from device memory (one per batch when given a length-L tensor)
DeviceScalar = ParamKind(ScalarBroadcast, f32, by_pointer=True, label="DeviceScalar")
#: a length-N vector broadcast along M (a bias per output column)
RowVector = ParamKind(RowBroadcast, f32, label="RowVector")
#: a length-M vector broadcast along N (a scale per output row)
ColVector = ParamKind(ColBroadcast, f32, label="ColVector")
#: another M x N input (an aux load); bare ``Matrix`` takes the GEMM's D dtype
Matrix = ParamKind(AuxLoad, None, label="Matrix")
#: the source matrix C; bare ``Source`` (or a parameter named ``C``) takes the GEMM's C dtype
SourceMatrix = ParamKind(Source, None, label="Source")
#: the accumulator (a parameter named ``acc`` needs no annotation)
Acc = ParamKind(Accumulator, f32, label="Accumulator")


def classify_parameter(epilogue: str, param: inspect.Parameter, annotation: Any, index: int,
                       loc: SourceLoc | None) -> ParamKind:
    """Decide the kind of one parameter from its annotation and name.

    Raises:
        EpilogueSignatureError: the kind can't be inferred or the annotation is not one evtc
            knows; the message says which annotations are accepted.
    """
    name = param.name
    if name in ("inf", "nan"):
        raise EpilogueSignatureError(f"a parameter can't be named '{name}': the IR text reads it as a number",
                                     loc=loc, epilogue=epilogue, hint="rename the parameter")
    if isinstance(annotation, ParamKind):
        return annotation
    if annotation is float or annotation is int:
        return Scalar
    if annotation is inspect.Parameter.empty:
        if name == "acc":
            return Acc
        if name == "C":
            return SourceMatrix
    if param.kind in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD):
        raise EpilogueSignatureError(
            f"parameter '*{name}' can't be traced: epilogue parameters must be named one by one",
            loc=loc, epilogue=epilogue,
        )
    got = "no annotation" if annotation is inspect.Parameter.empty else f"annotation {annotation!r}"
    raise EpilogueSignatureError(
        f"can't infer what parameter '{name}' is ({got})",
        loc=loc,
        epilogue=epilogue,
        hint=(
            "name the accumulator 'acc' and the source matrix 'C', and annotate every other "
            "parameter: float or evtc.Scalar[dtype] (runtime scalar), evtc.RowVector[dtype] "
            "(length N), evtc.ColVector[dtype] (length M), evtc.Matrix[dtype] (M x N aux load)"
        ),
    )


# ---------------------------------------------------------------------------------------------
# The proxy
# ---------------------------------------------------------------------------------------------


class Tracer:
    """State of one trace: the builder, the epilogue's name, and the output dtypes."""

    def __init__(self, epilogue: str) -> None:
        self.epilogue = epilogue
        self.builder = GraphBuilder()

    def add(self, node: Node) -> Node:
        return self.builder.add(node)

    def error(self, cls: type[TraceError] | type, message: str, hint: str | None = None, loc=None):
        return cls(message, loc=loc or user_loc(), epilogue=self.epilogue, hint=hint)


def _lift(tracer: Tracer, x: Any) -> Node:
    """A node for ``x``: a Value's node, or an Immediate for a Python number."""
    if isinstance(x, Value):
        if x._tracer is not tracer:
            raise tracer.error(TraceError, "a value from another epilogue's trace was used here")
        return x._node
    if isinstance(x, Reduced):
        raise tracer.error(
            TraceError,
            f"the {x._node.role} '{x._describe()}' was used inside the epilogue",
            hint="a reduction is only complete after every tile is done, so it can only be returned as an output",
        )
    if isinstance(x, bool):
        return tracer.add(Immediate(f32, value=1.0 if x else 0.0, loc=user_loc()))
    if isinstance(x, (int, float)):
        return tracer.add(Immediate(f32, value=float(x), loc=user_loc()))
    if type(x).__module__.startswith("numpy") and getattr(x, "shape", None) == ():
        return tracer.add(Immediate(f32, value=float(x), loc=user_loc()))
    raise tracer.error(
        TraceError,
        f"a {type(x).__name__} can't be used in a traced epilogue",
        hint="use traced parameters and Python numbers; pass tensors as parameters annotated with evtc.Matrix/RowVector/ColVector",
    )


def apply(op: str, *args: Any, dtype: DType = f32, tracer: Tracer | None = None) -> "Value":
    """Record ``op(*args)`` and return its proxy (one of ``args`` must be a Value)."""
    if tracer is None:
        tracer = next(a._tracer for a in args if isinstance(a, (Value, Reduced)))
    nodes = tuple(_lift(tracer, a) for a in args)
    node = tracer.add(Compute(dtype, op=op, args=nodes, loc=user_loc()))
    return Value(tracer, node)


class Value:
    """A traced value inside an epilogue: arithmetic on it records nodes.

    Supports ``+ - * / **`` (with a constant exponent), unary ``-`` and ``abs()``, comparisons
    (which give 1.0/0.0 masks), and ``.to(dtype)``. Python control flow on it is an error.
    """

    __slots__ = ("_tracer", "_node")
    __array_ufunc__ = None  # numpy defers to our reflected operators and never loops over us

    def __init__(self, tracer: Tracer, node: Node) -> None:
        self._tracer = tracer
        self._node = node

    def __repr__(self) -> str:
        name = getattr(self._node, "name", "") or self._node.kind
        return f"<evtc traced value {name}: {self._node.dtype}>"

    @property
    def dtype(self) -> DType:
        return self._node.dtype

    # arithmetic
    def __add__(self, o): return apply("add", self, o)
    def __radd__(self, o): return apply("add", o, self)
    def __sub__(self, o): return apply("sub", self, o)
    def __rsub__(self, o): return apply("sub", o, self)
    def __mul__(self, o): return apply("mul", self, o)
    def __rmul__(self, o): return apply("mul", o, self)
    def __truediv__(self, o): return apply("div", self, o)
    def __rtruediv__(self, o): return apply("div", o, self)
    def __neg__(self): return apply("neg", self)
    def __pos__(self): return self
    def __abs__(self): return apply("abs", self)

    def __pow__(self, o):
        if isinstance(o, (Value, Reduced)):
            raise self._tracer.error(
                TraceError, "x ** y needs a constant exponent y",
                hint="write the exponent as a Python number, or use evtc.exp(y * evtc.log(x))",
            )
        return apply("pow", self, o)

    def __rpow__(self, o):
        return apply("pow", o, self)

    def __floordiv__(self, o):
        raise self._tracer.error(TraceError, "'//' (floor division) is not supported in epilogues",
                                 hint="use '/' for true division")

    __rfloordiv__ = __floordiv__
    __mod__ = __rmod__ = __floordiv__

    def __matmul__(self, o):
        raise self._tracer.error(TraceError, "'@' inside an epilogue: the GEMM itself is outside the epilogue",
                                 hint="the epilogue receives the product as 'acc'")

    # comparisons give 1.0 / 0.0 masks
    def __gt__(self, o): return apply("gt", self, o)
    def __ge__(self, o): return apply("ge", self, o)
    def __lt__(self, o): return apply("lt", self, o)
    def __le__(self, o): return apply("le", self, o)
    def __eq__(self, o): return apply("eq", self, o)  # type: ignore[override]
    def __ne__(self, o): return apply("ne", self, o)  # type: ignore[override]
    __hash__ = object.__hash__

    def to(self, dtype: DType | str) -> "Value":
        """Convert to ``dtype`` (rounding to nearest; fp8 saturates to its finite range)."""
        try:
            dt = dtypes.coerce(dtype)
        except UnknownDTypeError as e:
            raise self._tracer.error(EpilogueTypeError, e.message, hint=e.hint) from None
        return apply("convert", self, dtype=dt)

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

    def __iter__(self):
        raise self._tracer.error(TraceError, "a traced value can't be iterated or unpacked",
                                 hint="an epilogue value is one element of the tile; there is nothing to iterate")

    def __len__(self):
        raise self._tracer.error(TraceError, "len() of a traced value")

    def __getitem__(self, item):
        raise self._tracer.error(TraceError, "indexing a traced value",
                                 hint="epilogue values are elementwise; broadcast vectors are declared with evtc.RowVector / evtc.ColVector")

    def __getattr__(self, name: str):
        if name.startswith("__"):
            raise AttributeError(name)
        raise TraceError(f"traced values have no attribute '{name}'", loc=user_loc(),
                         epilogue=self._tracer.epilogue,
                         hint="use the evtc.* functions (evtc.exp(x), evtc.relu(x)...) and x.to(dtype)")

    def __torch_function__(self, func, types, args=(), kwargs=None):
        name = getattr(func, "__name__", str(func))
        raise self._tracer.error(
            TraceError, f"torch.{name} was called on a traced value",
            hint=f"use evtc.{name} if it exists (see 'evtc ops'); evtc functions also run eagerly on torch tensors",
        )


class Reduced:
    """The result of :func:`evtc.sum` / ``max`` / ``min`` / ``amax`` while tracing: it can only
    be returned as an output."""

    __slots__ = ("_tracer", "_node")

    def __init__(self, tracer: Tracer, node: Reduction) -> None:
        self._tracer = tracer
        self._node = node

    def _describe(self) -> str:
        dim = "" if self._node.dim is None else f", dim={self._node.dim}"
        return f"{self._node.op.value}(...{dim})"

    def _use(self, *_a, **_k):
        raise self._tracer.error(
            TraceError,
            f"the {self._node.role} '{self._describe()}' was used inside the epilogue",
            hint="a reduction is only complete after every tile is done, so it can only be returned as an output",
        )

    __add__ = __radd__ = __sub__ = __rsub__ = __mul__ = __rmul__ = _use
    __truediv__ = __rtruediv__ = __neg__ = __pow__ = __bool__ = __float__ = _use
    __gt__ = __lt__ = __ge__ = __le__ = _use

    def to(self, dtype):
        """Set the output dtype of the reduction (accumulation stays f32)."""
        try:
            dt = dtypes.coerce(dtype)
        except UnknownDTypeError as e:
            raise self._tracer.error(EpilogueTypeError, e.message, hint=e.hint) from None
        return Reduced(self._tracer, self._tracer.add(dataclasses.replace(self._node, dtype=dt)))


def reduce(op: str, x: Any, dim: int | None) -> Reduced:
    """Record a reduction of the traced value ``x``."""
    tracer = x._tracer
    if dim is not None and (isinstance(dim, bool) or not isinstance(dim, int)) or dim not in (None, 0, 1, -1, -2):
        raise tracer.error(TraceError, f"dim={dim!r} is not a reduction axis of an M x N tile",
                           hint="dim=1 (or -1) reduces over N, one value per row; dim=0 (or -2) over M; no dim: both")
    if dim is not None:
        dim = dim % 2
    node = _lift(tracer, x)
    if node.bcast is not Bcast.MN:
        raise tracer.error(EpilogueTypeError, f"reducing a {node.bcast.value} value; reductions take an M x N value")
    red = Reduction(f32, name="", value=node, op=ReduceOp(op), dim=dim, loc=user_loc())
    return Reduced(tracer, red)


# ---------------------------------------------------------------------------------------------
# Tracing a function
# ---------------------------------------------------------------------------------------------


def _def_loc(fn: Callable) -> SourceLoc | None:
    try:
        file = inspect.getsourcefile(fn) or "<unknown>"
        lines, start = inspect.getsourcelines(fn)
    except (OSError, TypeError):
        return None
    # Point at the 'def' line, after any decorators.
    for i, text in enumerate(lines):
        if text.lstrip().startswith(("def ", "async def ")):
            return SourceLoc(file, start + i, text.index("def"), None, text.rstrip("\n"))
    return SourceLoc(file, start, 0, None, lines[0].rstrip("\n"))


def _param_loc(fn: Callable, name: str, default: SourceLoc | None) -> SourceLoc | None:
    """The location of parameter ``name`` in the def line(s) of ``fn``, if it can be found."""
    if default is None:
        return None
    try:
        lines, start = inspect.getsourcelines(fn)
        file = inspect.getsourcefile(fn) or default.file
    except (OSError, TypeError):
        return default
    import re

    pat = re.compile(rf"\b{re.escape(name)}\b")
    for i in range(default.line - start, len(lines)):
        m = pat.search(lines[i])
        if m:
            return SourceLoc(file, start + i, m.start(), m.end(), lines[i].rstrip("\n"))
        if lines[i].rstrip().endswith(":"):
            break
    return default


def signature_kinds(fn: Callable, epilogue: str) -> list[tuple[str, ParamKind]]:
    """The (name, kind) of every parameter of ``fn``, in order.

    Raises:
        EpilogueSignatureError: a parameter's kind can't be inferred, or its annotation can't be
            evaluated.
    """
    loc = _def_loc(fn)
    try:
        annotations = inspect.get_annotations(fn, eval_str=True)
    except Exception as e:  # a string annotation that doesn't evaluate
        raise EpilogueSignatureError(f"the annotations of '{epilogue}' could not be evaluated: {e}",
                                     loc=loc, epilogue=epilogue) from None
    out = []
    for i, p in enumerate(inspect.signature(fn).parameters.values()):
        ann = annotations.get(p.name, inspect.Parameter.empty)
        out.append((p.name, classify_parameter(epilogue, p, ann, i, _param_loc(fn, p.name, loc))))
    return out


def trace(fn: Callable, *, c: DType | None = None, d: DType = dtypes.bf16, name: str | None = None) -> Graph:
    """Trace ``fn`` into a Graph.

    Args:
        fn: the epilogue function. Parameters are classified by :func:`classify_parameter`.
        c: dtype of the source C when the function takes one and doesn't annotate it
            (defaults to ``d``).
        d: dtype of M x N outputs that don't set their own with ``.to(dtype)``, and of bare
            ``evtc.Matrix`` aux loads.
        name: the epilogue's name (defaults to the function's ``__name__``).

    Returns:
        The traced, not yet simplified, Graph. Outputs are in the order returned; a bare
        return value is the output ``D``.

    Raises:
        EpilogueSignatureError, TraceError, EpilogueTypeError: located at the user's line.
    """
    epilogue = name or getattr(fn, "__name__", "epilogue")
    tracer = Tracer(epilogue)
    loc = _def_loc(fn)
    kinds = signature_kinds(fn, epilogue)
    c = c or d
    leaves: list[Leaf] = []
    proxies: dict[str, Value] = {}
    for pname, kind in kinds:
        if kind.leaf is Accumulator:
            dt = f32
        elif kind.leaf is Source:
            dt = kind.dtype or c
        else:
            dt = kind.dtype or d
        extra = {"by_pointer": True} if kind.by_pointer else {}
        leaf = tracer.add(kind.leaf(dt, name=pname, loc=_param_loc(fn, pname, loc), **extra))
        leaves.append(leaf)  # type: ignore[arg-type]
        proxies[pname] = Value(tracer, leaf)
    n_src = sum(isinstance(l, Source) for l in leaves)
    n_acc = sum(isinstance(l, Accumulator) for l in leaves)
    if n_src > 1 or n_acc > 1:
        raise EpilogueSignatureError(
            "an epilogue has at most one accumulator and one source C",
            loc=loc, epilogue=epilogue, hint="declare extra M x N inputs with evtc.Matrix[dtype]",
        )

    result = fn(**proxies)
    outputs = _collect_outputs(tracer, result, d, loc)
    return Graph(epilogue, tuple(leaves), tuple(outputs), loc)


def _collect_outputs(tracer: Tracer, result: Any, d: DType, loc: SourceLoc | None) -> list[Output]:
    epilogue = tracer.epilogue
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
    outputs: list[Output] = []
    seen: set[str] = set()
    input_names = {n.name for n in tracer.builder._table.values() if isinstance(n, Leaf)}
    for key, val in items:
        if not isinstance(key, str) or not key.isidentifier():
            raise TraceError(f"output name {key!r} is not an identifier", loc=loc, epilogue=epilogue,
                             anchor="trace-return")
        if key in input_names:
            raise TraceError(f"output '{key}' has the name of a parameter", loc=loc, epilogue=epilogue,
                             hint="give outputs names different from the parameters", anchor="trace-return")
        seen.add(key)
        if isinstance(val, Reduced):
            outputs.append(tracer.add(dataclasses.replace(val._node, name=key)))  # type: ignore[arg-type]
        elif isinstance(val, Value):
            node = val._node
            if node.bcast is not Bcast.MN:
                raise EpilogueTypeError(
                    f"output '{key}' is a {node.bcast.value} value, not an M x N matrix",
                    loc=node.loc or loc, epilogue=epilogue,
                    hint="outputs must depend on acc, C or an M x N aux input; vectors come out of reductions",
                )
            dt = node.dtype if (isinstance(node, Compute) and node.op == "convert") else d
            outputs.append(tracer.add(Store(dt, name=key, value=node, loc=node.loc or loc)))  # type: ignore[arg-type]
        else:
            raise TraceError(
                f"output '{key}' is a {type(val).__name__}, not a traced value",
                loc=loc, epilogue=epilogue, hint="every output must be computed from the parameters",
                anchor="trace-return",
            )
    return outputs
