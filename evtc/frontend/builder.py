"""The IR builder: the one place where an epilogue's meaning and its error messages live.

Input: calls from a frontend (the Python tracer, the expression reader, the IR-text reader, the
torch importer), each carrying the :class:`~evtc.errors.SourceLoc` of the user's
text. Output: :class:`evtc.ir.graph.Graph`.

A frontend only reads its syntax; everything the syntax means is decided here, once: how a
parameter is declared (names, kinds, default dtypes, one accumulator and one source C), how a
constant becomes an :class:`~evtc.ir.nodes.Immediate` (and which constants can't), what an
operator does with constants and traced values (Python's semantics: folding, reflected
comparisons, ``**``), reductions and their axes, conversions, and how outputs are named and
typed. Every message about these is written here, so the tracer and the text forms say the same
thing about the same mistake; a frontend picks the error *classes* of its :class:`Dialect` and
the spelling of the functions it offers (``evtc.exp`` in Python, ``exp`` in expressions).
The dialects, :class:`Pending`, the constant rules and the errors shared with the frontends are
in :mod:`evtc.frontend.builder_rules` (re-exported here).

**The API a frontend drives** (the tracer in :mod:`evtc.frontend.trace`, the expression form in
:mod:`evtc.frontend.text`; the torch importer, :mod:`evtc.frontend.torch_import`, reads a
torch.fx graph and maps its ``placeholder`` nodes to :meth:`IRBuilder.input`, ``call_function`` nodes to
:meth:`~IRBuilder.binary` / :meth:`~IRBuilder.call` / :meth:`~IRBuilder.reduce` /
:meth:`~IRBuilder.convert` through its table of ATen ops, and the ``output`` node to
:meth:`~IRBuilder.output`)::

    from evtc.frontend.builder import IRBuilder, PYTHON
    from evtc.ir.nodes import Accumulator, RowBroadcast

    b = IRBuilder("bias_relu", c=bf16, d=bf16, dialect=PYTHON, loc=def_loc)
    acc = b.input("acc", Accumulator, loc=loc0)                 # -> Leaf (a Node)
    bias = b.input("bias", RowBroadcast, f32, loc=loc1)
    x = b.binary("add", acc, bias, loc=loc2)                    # -> Node (or a folded constant)
    y = b.call("relu", (x,), loc=loc3)                          # evtc.relu(x)
    m = b.reduce("max", y, 1, loc=loc4)                         # -> Pending (a reduction)
    b.output("D", y, loc=loc5)
    b.output("row_max", m, loc=loc4)
    graph = b.graph()

The methods, by what they do (each documents its rules and the errors it raises):

===================  ===========================================================================
declare inputs       ``input(name, kind, dtype=None, *, by_pointer, loc, dtype_loc)``
compute (Python's    ``binary(op, a, b, loc)`` (``add sub mul div gt ge lt le eq ne``),
semantics, folding)  ``negate(x, loc)``, ``plus(x, loc)``, ``power(base, exponent, loc)``,
                     ``call(op, args, loc)`` (``evtc.<op>``), ``convert(x, dtype, loc)``,
                     ``reduce(op, x, dim, loc)`` (``sum max min amax``)
raw nodes            ``apply(op, args, loc, *, dtype, attrs)`` (no folding), ``lift(x, loc)``,
                     ``add_output(node)``
outputs, the graph   ``output(name, value, loc)``, ``graph(loc=None)``
checks alone         ``check_input_name``, ``check_output_name``, ``check_input_dtype``,
                     ``check_op``, ``dtype(value, loc)``, ``constant(x, loc)``,
                     ``literal(text, loc)``, ``rename(name, loc)``
===================  ===========================================================================

A new frontend defines its own :class:`Dialect` (which error classes it raises, how it spells
functions in hints) or uses :data:`PYTHON`. The API is internal to evtc (not yet pinned): a
change to it changes the frontends in the same commit.

*Values* passed to and returned by the builder are of three sorts: a :class:`~evtc.ir.nodes.Node`
(a traced value, already interned by the builder), a :class:`Pending` reduction (the result of
:meth:`~IRBuilder.reduce`: it can only become an output, or be converted), and a Python
constant (``int``, ``float``, ``bool``, a 0-d numpy value), which the operations fold as Python
would and :meth:`~IRBuilder.lift` turns into an f32 Immediate. Every method takes the ``loc`` of
the text that asked for it; the nodes it makes carry that loc, and the errors it raises point
at it. Errors are :class:`~evtc.errors.EvtcError` subclasses chosen by the :class:`Dialect`.

Rules stated here (see each method): names follow :mod:`evtc.ir.names` (ASCII identifiers
that can reach C++; ``A``, ``B``, ``out``, ``stream``, ``self`` are reserved for parameters and
``A``, ``B`` for outputs); a constant must be a finite f32 or be ``inf``/``nan`` (finite values
beyond f32's range would turn into infinities in the kernel while the float64 reference keeps
them); integer arithmetic on constants is exact as in Python but bounded to
:data:`MAX_INT_BITS` bits, so no constant expression can hang (``9**9**9``).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, NoReturn, Sequence

import numpy as np

from evtc import dtypes, ops
from evtc.dtypes import DType, f32
from evtc.errors import EpilogueTypeError, EvtcError, SourceLoc, UnknownDTypeError, UnsupportedOpError
from evtc.frontend.builder_rules import (
    _BINARY,
    _DIM_HINT,
    _F32_MAX,
    _OUTPUT_HINT,
    _REFLECTED,
    _SYMBOLS,
    _USED_INSIDE_HINT,
    EXPRESSION,
    F32_OVERFLOW,
    IR_TEXT,
    is_reduction_dim,
    reduction_dim_message,
    KIND_WORDS,
    MAX_INT_BITS,
    PYTHON,
    Dialect,
    Pending,
    Value,
    _int_bits,
    _shown,
    constant_reduction_error,
    is_constant,
    not_elementwise_error,
    short_repr,
    unknown_function_error,
)
from evtc.ir import limits
from evtc.ir.graph import Graph, GraphBuilder
from evtc.ir.names import name_problem, reserved_output, reserved_parameter
from evtc.ir.nodes import (QUANT_CONVENTIONS, QUANT_GROUPS, QUANT_SCALE_LAYOUTS, Accumulator, AuxLoad, Bcast, Compute,
                           GroupScale, Immediate, Leaf, Node, Output, ReduceOp, Reduction, Source, Store,
                           glu_acts, is_glu_act)

__all__ = ["Dialect", "PYTHON", "EXPRESSION", "IR_TEXT", "Pending", "Value", "IRBuilder", "is_constant", "MAX_INT_BITS",
           "F32_OVERFLOW", "short_repr", "not_elementwise_error", "constant_reduction_error", "unknown_function_error",
           "KIND_WORDS"]


class IRBuilder:
    """Builds one epilogue's Graph from a frontend's calls (see the module docstring).

    Args:
        epilogue: the epilogue's name: the Graph's name, used in messages and in the emitted
            code, so it must pass :func:`evtc.ir.names.name_problem`.
        c: dtype of the source C when it is declared without one (default: ``d``).
        d: dtype of M x N outputs without a conversion, and of aux loads declared without one.
        dialect: the frontend's error classes and spellings (:data:`PYTHON` by default).
        loc: where the epilogue is defined (the ``def`` line, the first statement, the IR
            header): the Graph's loc, and the location of errors about the whole epilogue.
        name_loc: where the name is written, if not at ``loc``.
        intern: hash-cons nodes (:class:`~evtc.ir.graph.GraphBuilder`), so equal
            subexpressions are one node. The IR-text reader turns it off: the text *is* the
            graph, duplicates included.

    Raises:
        EvtcError (the dialect's ``name_error``): ``epilogue`` is not a name that can reach
            C++ (:mod:`evtc.ir.names`).
    """

    def __init__(self, epilogue: str, *, c: DType | None = None, d: DType = dtypes.bf16,
                 dialect: Dialect | None = None, loc: SourceLoc | None = None,
                 name_loc: SourceLoc | None = None, intern: bool = True) -> None:
        self.dialect = dialect or PYTHON
        self.epilogue = epilogue if isinstance(epilogue, str) else repr(epilogue)
        self.c = c or d
        self.d = d
        self.loc = loc
        self.intern = intern
        self.inputs: list[Leaf] = []
        self.outputs: list[Output] = []
        self._interned = GraphBuilder()
        self._built = 0  # nodes built (distinct ones when interning), for the size limits
        self._input_names: dict[str, Leaf] = {}
        self._output_names: set[str] = set()
        self.rename(epilogue, name_loc or loc)

    def rename(self, epilogue: str, loc: SourceLoc | None) -> None:
        """Set the epilogue's name (for readers that meet it late, like the IR text's header).

        Raises:
            EvtcError (the dialect's ``name_error``): not a name that can reach C++.
        """
        problem = name_problem(epilogue)
        if problem is not None:  # (no 'in epilogue <name>': the name can't be printed as it is)
            raise self.dialect.name_error(
                f"epilogue name {short_repr(epilogue)} {problem}", loc=loc, anchor="names",
                hint="the name goes into the emitted C++ and file names: use an identifier such as 'bias_relu' "
                     "(ASCII letters, digits, '_')")
        self.epilogue = epilogue

    # ---- errors ---------------------------------------------------------------------------

    def fail(self, cls: type[EvtcError], message: str, loc: SourceLoc | None, *, hint: str | None = None,
             anchor: str | None = None) -> NoReturn:
        """Raise ``cls(message)`` located at ``loc`` in this epilogue."""
        raise cls(message, loc=loc, epilogue=self.epilogue, hint=hint, anchor=anchor)

    # ---- names ----------------------------------------------------------------------------

    def check_input_name(self, name: Any, loc: SourceLoc | None) -> None:
        """Check that a parameter (an input) may be called ``name``: an identifier that can
        reach C++ (:func:`evtc.ir.names.name_problem`) and not reserved (``A``, ``B``, ``out``,
        ``stream``, ``self``, ``inf``, ``nan``).

        Raises:
            EvtcError (the dialect's ``signature_error``), located at ``loc``.
        """
        problem = name_problem(name)
        if problem is not None:
            self.fail(self.dialect.signature_error, f"parameter name {short_repr(name)} {problem}", loc,
                      hint="parameter names become C++ identifiers and Python keyword arguments: use ASCII "
                           "letters, digits and '_'", anchor="names")
        why = reserved_parameter(name)
        if why is not None:
            self.fail(self.dialect.signature_error, f"a parameter can't be named '{name}': {why}", loc,
                      hint="rename the parameter", anchor="names")

    def check_output_name(self, name: Any, loc: SourceLoc | None) -> None:
        """Check that an output may be called ``name``: an identifier that can reach C++, not
        reserved (``A``, ``B``, ``inf``, ``nan``), not a parameter's name, not an output's.

        Raises:
            EvtcError (the dialect's ``output_error``), located at ``loc``.
        """
        cls, anchor = self.dialect.output_error, self.dialect.output_anchor
        problem = name_problem(name)
        if problem is not None:
            self.fail(cls, f"output name {short_repr(name)} {problem}", loc, anchor="names",
                      hint="output names become C++ identifiers and dict keys: use ASCII letters, digits and '_'")
        why = reserved_output(name)
        if why is not None:
            self.fail(cls, f"an output can't be named '{name}': {why}", loc, hint="rename the output", anchor="names")
        if name in self._input_names:
            self.fail(cls, f"output '{name}' has the name of a parameter", loc, anchor=anchor,
                      hint="give outputs names different from the parameters")
        if name in self._output_names:
            self.fail(cls, f"output '{name}' is returned twice", loc, anchor=anchor,
                      hint="give each output its own name")

    # ---- dtypes ---------------------------------------------------------------------------

    def dtype(self, value: DType | str | Any, loc: SourceLoc | None) -> DType:
        """The dtype ``value`` names (a DType, an evtc name or alias, a torch dtype).

        Raises:
            EvtcError (the dialect's ``dtype_error``): unknown; the hint lists the dtypes.
        """
        try:
            return dtypes.coerce(value)
        except UnknownDTypeError as e:
            self.fail(self.dialect.dtype_error, e.message, loc, hint=e.hint)

    # ---- inputs ---------------------------------------------------------------------------

    def input(self, name: str, kind: type[Leaf], dtype: DType | None = None, *, by_pointer: bool = False,
              loc: SourceLoc | None = None, dtype_loc: SourceLoc | None = None) -> Leaf:
        """Declare the parameter ``name``; the Graph's inputs are in the order of these calls.

        Args:
            name: the parameter's name (:meth:`check_input_name`).
            kind: its leaf class: :class:`~evtc.ir.nodes.Accumulator`, ``Source``,
                ``ScalarBroadcast``, ``RowBroadcast``, ``ColBroadcast`` or ``AuxLoad``
                (``LEAF_KINDS`` maps the IR text's words to them).
            dtype: its dtype; None takes the default: f32 for the accumulator, scalars and
                vectors, ``c`` for the source, ``d`` for aux loads.
            by_pointer: a scalar read from device memory (``evtc.DeviceScalar``).
            loc: where it is declared; ``dtype_loc``: where its dtype is written.

        Returns:
            The leaf node.

        Raises:
            EvtcError (the dialect's ``signature_error``): a bad or reserved name, a name
                declared twice, a second accumulator or source C (located at the epilogue);
                (``dtype_error``): an accumulator that is not f32.
        """
        self.check_input_name(name, loc)
        if len(self.inputs) >= limits.LIMITS.inputs:
            raise limits.too_large("inputs", self.epilogue, loc)
        if name in self._input_names:
            self.fail(self.dialect.signature_error, f"parameter '{name}' is declared twice", loc,
                      hint="give each parameter its own name")
        self.check_input_dtype(kind, dtype, dtype_loc or loc)
        if kind in (Accumulator, Source) and any(isinstance(i, kind) for i in self.inputs):
            self.fail(self.dialect.signature_error, "an epilogue has at most one accumulator and one source C",
                      self.loc or loc, hint=f"declare extra M x N inputs with {self.dialect.aux_load}")
        if dtype is None:
            dtype = self.c if kind is Source else self.d if kind is AuxLoad else f32
        extra = {"by_pointer": True} if by_pointer else {}
        leaf = self.add(kind(dtype, name=name, loc=loc, **extra))
        self.inputs.append(leaf)  # type: ignore[arg-type]
        self._input_names[name] = leaf  # type: ignore[assignment]
        return leaf  # type: ignore[return-value]

    def check_input_dtype(self, kind: type[Leaf], dtype: DType | None, loc: SourceLoc | None) -> None:
        """Check that an input of ``kind`` may have ``dtype`` (the accumulator is f32).

        Raises:
            EvtcError (the dialect's ``dtype_error``), located at ``loc``.
        """
        if kind is Accumulator and dtype is not None and dtype is not f32:
            self.fail(self.dialect.dtype_error, f"the accumulator is f32, not {dtype}", loc,
                      hint=f"convert values with {self.dialect.to}")

    # ---- nodes ----------------------------------------------------------------------------

    def add(self, node: Node) -> Node:
        """Intern ``node`` (return the equal node already built), unless interning is off.

        Raises:
            GraphTooLargeError: the epilogue grows beyond :data:`evtc.ir.limits.LIMITS` (nodes,
                depth), located at ``node``'s line: a frontend stops there, having built no
                more than the limit (NOTE [Epilogue size limits]).
        """
        if node.depth > limits.LIMITS.depth:
            raise limits.too_large("depth", self.epilogue, node.loc)
        if not self.intern:
            self._built += 1
            out = node
        else:
            out = self._interned.add(node)
            self._built = len(self._interned)
        if self._built > limits.LIMITS.nodes:
            raise limits.too_large("nodes", self.epilogue, node.loc)
        return out

    def constant(self, x: Any, loc: SourceLoc | None) -> float:
        """The float64 value of the Python constant ``x``, checked to be an f32 the kernel can
        compute with: finite and within f32's range, or ``inf``/``nan`` themselves.

        Raises:
            EvtcError (the dialect's ``trace_error``): a finite constant beyond f32's range (an
                int too large for any float included), or a nonzero one that rounds to 0 in f32.
        """
        if isinstance(x, bool):
            return 1.0 if x else 0.0
        try:
            value = float(x)
        except OverflowError:
            self._not_f32(short_repr(x), loc)
        with np.errstate(over="ignore"):  # (1e308 becomes inf, refused below, without a RuntimeWarning)
            underflow = value != 0 and np.float32(value) == 0  # below half f32's least subnormal
        if underflow or (math.isfinite(value) and abs(value) >= F32_OVERFLOW):
            self._not_f32(_shown(x), loc, "rounds to 0 in f32" if underflow else "")
        return value

    def _not_f32(self, shown: str, loc: SourceLoc | None, what: str = "") -> NoReturn:
        what = what or "is not representable as a finite f32"
        self.fail(self.dialect.trace_error, f"the constant {shown} {what} (the epilogue computes in f32: magnitudes "
                  f"from {np.finfo(np.float32).smallest_subnormal:.3g} to {_F32_MAX:.8g}, and 0)", loc,
                  hint="scale the constant into f32's range; write 0 or inf where 0 or an infinite constant is meant")

    def literal(self, text: str, loc: SourceLoc | None) -> int | float:
        """The number a decimal literal of a text form means: an int for digits only (as
        Python reads ``2``), else a float (``0.5``, ``1e-3``, ``inf``, ``nan``).

        Raises:
            EvtcError (``trace_error``): an integer literal of more than :data:`MAX_INT_BITS`
                bits (no f32 can hold it, and Python refuses to read such long numbers), or a
                float literal beyond float64's range (``1e400``, which ``float`` reads as inf).
        """
        if text.isdigit():
            digits = len(text.lstrip("0"))
            if digits * math.log2(10) > MAX_INT_BITS:
                self._not_f32(f"{text.lstrip('0')[:12]}... ({digits} digits)", loc)
            return int(text)
        value = float(text)
        if math.isinf(value) and "inf" not in text.lower():
            # a finite literal beyond float64 (1e400): Python reads it as inf, which the text never said
            self._not_f32(text if len(text) <= 24 else text[:20] + "...", loc)
        return value

    def lift(self, x: Value, loc: SourceLoc | None) -> Node:
        """The node of ``x``: a node itself, or an f32 :class:`~evtc.ir.nodes.Immediate` for a
        constant (``True``/``False`` are 1.0/0.0).

        Raises:
            EvtcError (``trace_error``): ``x`` is a pending reduction (used inside the epilogue),
                a constant that is not a finite f32 (:meth:`constant`), or not a value at all.
        """
        if isinstance(x, Node):
            return x
        if isinstance(x, Pending):
            self.fail(self.dialect.trace_error, f"the {x.node.role} '{x.describe()}' was used inside the epilogue",
                      x.loc or loc, hint=_USED_INSIDE_HINT)
        if not is_constant(x):
            self.fail(self.dialect.trace_error, f"a {type(x).__name__} can't be used in a traced epilogue", loc,
                      hint="use traced parameters and Python numbers; pass tensors as parameters annotated with "
                           "evtc.Matrix/RowVector/ColVector")
        return self.add(Immediate(f32, value=self.constant(x, loc), loc=loc))

    def apply(self, op: str, args: Sequence[Value], loc: SourceLoc | None, *, dtype: DType = f32,
              attrs: tuple[tuple[str, Any], ...] = (), op_loc: SourceLoc | None = None) -> Compute:
        """Record ``op(*args)`` as it is, without folding: a :class:`~evtc.ir.nodes.Compute`.

        Args:
            op: a name in the op table (:data:`evtc.ops.OPS`).
            args: the operands, lifted with :meth:`lift`.
            loc: where the operation is written; ``op_loc``: where the op's name is.
            dtype: the result's dtype (f32, except for ``convert``).
            attrs: the node's constant attributes.

        Raises:
            EvtcError (the dialect's ``op_error``): an unknown op (at ``op_loc``) or the wrong
                number of operands; anything :meth:`lift` raises.
        """
        self.check_op(op, len(args), loc, op_loc=op_loc)
        nodes = tuple(self.lift(a, loc) for a in args)
        return self.add(Compute(dtype, op=op, args=nodes, attrs=attrs, loc=loc))  # type: ignore[return-value]

    def check_op(self, op: str, n_args: int, loc: SourceLoc | None, *, op_loc: SourceLoc | None = None) -> None:
        """Check that ``op`` is in the op table and takes ``n_args`` operands.

        Raises:
            EvtcError (the dialect's ``op_error``): an unknown op (at ``op_loc``, the hint lists
                the known ones) or the wrong number of operands (at ``loc``).
        """
        try:
            opdef = ops.get(op)
        except UnsupportedOpError as e:
            self.fail(self.dialect.op_error, e.message, op_loc or loc, hint=e.hint)
        if n_args != opdef.arity:
            arity = opdef.arity
            self.fail(self.dialect.op_error, f"op '{op}' takes {arity} operand{'s' * (arity != 1)}, got {n_args}", loc)

    # ---- constant folding -----------------------------------------------------------------

    def fold(self, expr: str, operands: Sequence[Any], fn: Callable[[], Any], loc: SourceLoc | None) -> Any:
        """Evaluate a constant expression as Python would (the frontend has only constants);
        its errors become located errors.

        Args:
            expr: the expression as written, for messages (``exp(1000)``, ``1 / 0``).
            operands: its constants; ``fn`` computes it.

        Raises:
            EvtcError (``trace_error``): the evaluation fails (division by zero, overflow, an
                operation the operands' types don't have, such as ``-`` of a comparison's numpy
                bool) or gives a complex number.
            ConstantFoldError: finite operands give inf or NaN (``exp(1000)``, ``log(0)``): the
                fold pass's rule, :func:`evtc.passes.fold.check_fold`.
        """
        from evtc.passes.fold import check_fold  # (the passes' package: loaded on the first fold)

        try:
            with np.errstate(all="ignore"):
                out = fn()
        except (ArithmeticError, ValueError, TypeError) as e:
            self.fail(self.dialect.trace_error, f"evaluating the constant expression {expr} fails: {e}", loc)
        if isinstance(out, complex) or np.iscomplexobj(out):
            self.fail(self.dialect.trace_error, f"the constant expression {expr} is complex: {short_repr(out)}",
                      loc, hint="a negative number to a fractional power has no real value")
        check_fold(expr, operands, out, loc=loc, epilogue=self.epilogue)
        return out

    def _bounded(self, what: str, bits: int, loc: SourceLoc | None) -> None:
        """Refuse an integer result of about ``bits`` bits beyond :data:`MAX_INT_BITS` before
        Python computes it (``9**9**9`` would take hours and gigabytes)."""
        if bits > MAX_INT_BITS:
            self.fail(self.dialect.trace_error,
                      f"the constant expression ({what}) is too large: its integer result has more than "
                      f"{MAX_INT_BITS} bits", loc,
                      hint=f"the epilogue computes in f32, whose largest finite value is {_F32_MAX:.8g}")

    def _fold_binary(self, op: str, a: Any, b: Any, loc: SourceLoc | None) -> Any:
        what = _SYMBOLS[op]
        if isinstance(a, int) and isinstance(b, int):
            if op in ("add", "sub"):
                self._bounded(what, max(_int_bits(a), _int_bits(b)) + 1, loc)
            elif op == "mul":
                self._bounded(what, _int_bits(a) + _int_bits(b), loc)
        return self.fold(f"{_shown(a)} {what} {_shown(b)}", (a, b), lambda: _BINARY[op](a, b), loc)

    # ---- operations -----------------------------------------------------------------------

    def binary(self, op: str, a: Value, b: Value, loc: SourceLoc | None) -> Value:
        """``a OP b`` with Python's semantics on traced values and constants: two constants
        fold (``2 * 3`` is 6); a constant on the left of a comparison takes the value's
        reflected comparison (``2 < x`` is ``gt(x, 2.0)``, as Python calls ``x.__gt__(2)``);
        otherwise a :class:`~evtc.ir.nodes.Compute` with the operands in order.

        Args:
            op: ``add``, ``sub``, ``mul``, ``div`` or a comparison (``gt``, ``ge``, ``lt``,
                ``le``, ``eq``, ``ne``; they give 1.0/0.0 masks).
        """
        if is_constant(a) and is_constant(b):
            return self._fold_binary(op, a, b, loc)
        if op in _REFLECTED and is_constant(a) and isinstance(b, Node):
            return self.apply(_REFLECTED[op], (b, a), loc)
        return self.apply(op, (a, b), loc)

    def negate(self, x: Value, loc: SourceLoc | None) -> Value:
        """``-x``: folds a constant, else ``neg(x)``."""
        if is_constant(x):
            return self.fold(f"-{_shown(x)}", (x,), lambda: -x, loc)
        return self.apply("neg", (x,), loc)

    def plus(self, x: Value, loc: SourceLoc | None) -> Value:
        """``+x``: ``x`` itself (a pending reduction can't be used)."""
        if isinstance(x, Pending):
            self.lift(x, loc)  # raises: a reduction used inside
        return +x if is_constant(x) else x

    def power(self, base: Value, exponent: Value, loc: SourceLoc | None) -> Value:
        """``base ** exponent`` as Python does it on traced values (``Value.__pow__`` and
        ``__rpow__``): the exponent of a traced base must be a constant; a constant base with a
        traced exponent gives ``pow(2.0, x)``; two constants fold.

        Raises:
            EvtcError (``trace_error``): a traced exponent of a traced base; an integer power
                too large to compute (:data:`MAX_INT_BITS`).
        """
        if is_constant(base) and is_constant(exponent):
            if isinstance(base, int) and isinstance(exponent, int) and exponent > 0 and abs(base) > 1:
                self._bounded("**", exponent * (_int_bits(base) - 1) + 1, loc)
            return self.fold(f"{_shown(base)} ** {_shown(exponent)}", (base, exponent), lambda: base ** exponent,
                             loc)
        if isinstance(base, Node) and not is_constant(exponent):
            self.fail(self.dialect.trace_error, "x ** y needs a constant exponent y", loc,
                      hint=f"write the exponent as a number, or use {self.dialect.fn('exp')}(y * "
                           f"{self.dialect.fn('log')}(x))")
        return self.apply("pow", (base, exponent), loc)

    def call(self, op: str, args: Sequence[Value], loc: SourceLoc | None) -> Value:
        """``evtc.<op>(*args)`` for an elementwise op of the table: recorded when an argument is
        traced; otherwise evaluated at once with the op's float64 reference, as the Python
        function does when called on numbers. ``pow`` with a traced argument follows
        :meth:`power`."""
        if all(is_constant(a) for a in args):
            ref = ops.get(op).numpy
            return self.fold(f"{op}({', '.join(_shown(a) for a in args)})", args,
                             lambda: ref(*[np.asarray(a, dtype=np.float64) for a in args]), loc)
        if op == "pow" and len(args) == 2:
            return self.power(args[0], args[1], loc)
        return self.apply(op, args, loc)

    def convert(self, x: Value, dtype: DType | str, loc: SourceLoc | None, *,
                dtype_loc: SourceLoc | None = None) -> Value:
        """``x.to(dtype)``: rounds to ``dtype`` (fp8 saturates). A constant is rounded at once;
        a pending reduction gets its output dtype (accumulation stays f32).

        Raises:
            EvtcError (``dtype_error``): an unknown dtype, located at ``dtype_loc``.
        """
        dt = self.dtype(dtype, dtype_loc or loc)
        if isinstance(x, Pending):
            if isinstance(x.node, GroupScale) and dt is not f32:
                self.fail(self.dialect.trace_error, f"converting quantize's scales to {dt.name}: they are f32",
                          loc, hint="return the scales as they are")
            return Pending(dataclasses.replace(x.node, dtype=dt), loc)
        if is_constant(x):
            return self.fold(f"to({_shown(x)}, {dt.name})", (x,),
                             lambda: dtypes.round_to(np.asarray(x, dtype=np.float64), dt), loc)
        return self.apply("convert", (x,), loc, dtype=dt)

    def reduce(self, op: str, x: Value, dim: Any, loc: SourceLoc | None, *,
               dim_loc: SourceLoc | None = None) -> Pending:
        """``evtc.sum/max/min/amax(x, dim=dim)``: a reduction of the M x N value ``x``.

        Args:
            op: ``sum``, ``max``, ``min``, or ``amax`` (the max of ``abs(x)``).
            dim: 1 or -1 reduces over N (a row reduction, one value per row), 0 or -2 over M
                (a column reduction), None over both (a scalar reduction).
            dim_loc: where ``dim`` is written.

        Returns:
            A :class:`Pending` reduction (f32 unless converted), located at ``loc``.

        Raises:
            EvtcError (``trace_error``): a bad axis, or ``x`` is a pending reduction;
                :class:`~evtc.errors.EpilogueTypeError`: ``x`` is a constant or not M x N.
        """
        if not is_reduction_dim(dim):
            self.fail(self.dialect.trace_error, reduction_dim_message(dim), dim_loc or loc, hint=_DIM_HINT)
        if dim is not None:
            dim = int(dim) % 2
        if op == "amax":
            x, op = self.call("abs", (x,), loc), "max"
        if is_constant(x):
            raise constant_reduction_error(loc, self.epilogue)
        node = self.lift(x, loc)
        if node.bcast is not Bcast.MN:
            self.fail(EpilogueTypeError, f"reducing a {node.bcast.value} value; reductions take an M x N value", loc)
        return Pending(Reduction(f32, name="", value=node, op=ReduceOp(op), dim=dim, loc=loc), loc)

    def quantize(self, x: Value, dtype: Any, group: Any, convention: Any, loc: SourceLoc | None,
                 scale_layout: Any = "row_major") -> tuple[Compute, Pending]:
        """``evtc.quantize(x, dtype, group=, convention=, scale_layout=)``: per-token-group
        quantization of the M x N value ``x`` (NOTE [Per-token-group quantization conventions],
        evtc/testing/quant.py); ``scale_layout`` is the scales' layout (:data:`~evtc.ir.nodes.
        QUANT_SCALE_LAYOUTS`, or a :class:`evtc.testing.quant.ScaleLayout` of those).

        Returns:
            (q, scales): q, the ``group_quant`` :class:`~evtc.ir.nodes.Compute` of dtype
            ``dtype`` (an M x N value that can only be returned as an output), and the
            :class:`Pending` :class:`~evtc.ir.nodes.GroupScale` (f32, one per 1 x group of a row).

        Raises:
            EvtcError (``trace_error``): a dtype that is not fp8, a group outside
                :data:`~evtc.ir.nodes.QUANT_GROUPS`, an unknown convention or scale layout;
                :class:`~evtc.errors.EpilogueTypeError`: ``x`` is a constant or not M x N.
        """
        dt = self.dtype(dtype, loc)
        if not dt.is_fp8:
            self.fail(self.dialect.trace_error, f"quantize to {dt.name}: per-token-group quantization writes e4m3 "
                      "or e5m2", loc, hint="pass evtc.e4m3 or evtc.e5m2")
        if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or int(group) not in QUANT_GROUPS:
            self.fail(self.dialect.trace_error, f"quantize group={group!r}: the epilogue quantizes groups of "
                      f"{', '.join(map(str, QUANT_GROUPS))} elements of a row", loc, hint="use group=128 (DeepSeek-V3's)")
        if convention not in QUANT_CONVENTIONS:
            self.fail(self.dialect.trace_error, f"quantize convention={convention!r}: one of "
                      f"{', '.join(QUANT_CONVENTIONS)}", loc, hint="vllm's is the default")
        layout = getattr(scale_layout, "value", scale_layout)  # a ScaleLayout, or its value
        if not isinstance(layout, str) or layout not in QUANT_SCALE_LAYOUTS:
            self.fail(self.dialect.trace_error, f"quantize scale_layout={scale_layout!r}: one of "
                      f"{', '.join(QUANT_SCALE_LAYOUTS)} (evtc.testing.quant.ScaleLayout's ROW_MAJOR, COL_MAJOR_TMA)",
                      loc, hint="'row_major' is the default; 'col_major_tma' is what DeepGEMM's kernels read")
        if is_constant(x):
            self.fail(EpilogueTypeError, "quantizing a constant; quantize takes an M x N value", loc)
        node = self.lift(x, loc)
        if node.bcast is not Bcast.MN:
            self.fail(EpilogueTypeError, f"quantizing a {node.bcast.value} value; quantize takes an M x N value", loc)
        attrs = (("convention", str(convention)), ("group", int(group)))
        if layout != "row_major":  # (the default is left out of the canonical text)
            attrs += (("layout", layout),)
        q = self.apply("group_quant", (node,), loc, dtype=dt, attrs=attrs)
        scales = GroupScale(f32, name="", value=q, op=ReduceOp.MAX, dim=1, group=int(group),
                            convention=str(convention), layout=layout, loc=loc)
        return q, Pending(scales, loc)

    def glu(self, x: Value, act: Any, loc: SourceLoc | None) -> Compute:
        """``evtc.glu(y, act)``: column j of the result is ``act(y[:, 2j]) * y[:, 2j + 1]`` (N / 2
        columns) of the M x N value ``y``: SwiGLU (act silu), GeGLU (gelu, gelu_tanh), ReGLU (relu)
        over W_gate's and W_up's rows interleaved (:func:`evtc.interleave_gate_up`).

        Returns:
            the ``glu`` :class:`~evtc.ir.nodes.Compute` (f32), an M x N/2 value that can only be
            returned as an output (rule ``glu-store``).

        Raises:
            EvtcError (``trace_error``): ``act`` is not the name of a unary op of the table;
                :class:`~evtc.errors.EpilogueTypeError`: ``y`` is a constant or not M x N.
        """
        if not is_glu_act(act):
            self.fail(self.dialect.trace_error, f"glu act={act!r}: the gate's activation is the name of a unary op, "
                      f"one of {', '.join(glu_acts())}", loc, hint="act='silu' is SwiGLU, 'gelu' GeGLU, 'relu' ReGLU")
        if is_constant(x):
            self.fail(EpilogueTypeError, "glu of a constant; glu takes the M x N value of interleaved gate and up "
                      "columns", loc)
        node = self.lift(x, loc)
        if node.bcast is not Bcast.MN:
            self.fail(EpilogueTypeError, f"glu of a {node.bcast.value} value; glu takes an M x N value (gate and "
                      "up columns interleaved)", loc)
        return self.apply("glu", (node,), loc, attrs=(("act", act),))

    def not_elementwise(self, name: str, loc: SourceLoc | None) -> NoReturn:
        """Raise the error for ``max(a, b)``/``min(a, b)`` written for the elementwise op."""
        raise not_elementwise_error(name, self.dialect, loc, self.epilogue)

    # ---- outputs --------------------------------------------------------------------------

    def output(self, name: str, value: Value, loc: SourceLoc | None) -> Output:
        """Make ``value`` the output ``name``; outputs are in the order of these calls.

        An M x N value becomes a :class:`~evtc.ir.nodes.Store` of dtype ``d``, or of the
        conversion's dtype when ``value`` is a conversion; a :class:`Pending` reduction becomes
        its :class:`~evtc.ir.nodes.Reduction`, named.

        Args:
            loc: where the output is written: the Store's loc and the location of errors (the
                Reduction keeps the loc of its call).

        Raises:
            EvtcError (the dialect's ``output_error``): see :meth:`check_output_name`;
                :class:`~evtc.errors.EpilogueTypeError`: the value is a constant, a vector or a
                scalar.
        """
        self.check_output_name(name, loc)
        if isinstance(value, Pending):
            return self.add_output(dataclasses.replace(value.node, name=name))
        if is_constant(value):
            try:
                shown = repr(float(value))
            except OverflowError:
                shown = short_repr(value)
            self.fail(EpilogueTypeError, f"output '{name}' is the constant {shown}, not an M x N matrix", loc,
                      hint=_OUTPUT_HINT)
        node = self.lift(value, loc)
        if node.bcast is not Bcast.MN:
            self.fail(EpilogueTypeError, f"output '{name}' is a {node.bcast.value} value, not an M x N matrix", loc,
                      hint=_OUTPUT_HINT)
        dt = node.dtype if (isinstance(node, Compute) and node.op in ("convert", "group_quant")) else self.d
        return self.add_output(Store(dt, name=name, value=node, loc=loc))

    def add_output(self, node: Output) -> Output:
        """Record the output node ``node`` as it is (its name checked, at ``node.loc``): for
        frontends that spell outputs out in full, like the IR text."""
        self.check_output_name(node.name, node.loc)
        if len(self.outputs) >= limits.LIMITS.outputs:
            raise limits.too_large("outputs", self.epilogue, node.loc)
        out = self.add(node)
        self.outputs.append(out)  # type: ignore[arg-type]
        self._output_names.add(node.name)
        return out  # type: ignore[return-value]

    def graph(self, loc: SourceLoc | None = None) -> Graph:
        """The Graph: the declared inputs and the outputs, in the order of the calls.

        Raises:
            EvtcError (the dialect's ``output_error``): no outputs.
        """
        if not self.outputs:
            self.fail(self.dialect.output_error, "the epilogue has no outputs", loc or self.loc,
                      hint="return at least one M x N value", anchor=self.dialect.output_anchor)
        return Graph(self.epilogue, tuple(self.inputs), tuple(self.outputs), loc or self.loc)
