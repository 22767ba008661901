"""The textual frontends: the canonical IR text and the ``--expr`` expression form.

Input: text in one of the two forms of ``grammar/epilogue.lark``. Output:
:class:`evtc.ir.graph.Graph`, the same graph the tracer (:mod:`evtc.frontend.trace`) builds.

Both forms are parsed by one LALR(1) Lark parser with two start symbols and read by
non-recursive Lark Transformers that share one base (:class:`_TextReader`: locations, numbers,
dtypes, errors). The readers only read: what the text means is decided by the
:class:`~evtc.frontend.builder.IRBuilder` the tracer drives too (the expression form with the
tracer's semantics, the IR text without hash-consing or folding), so both frontends give the
same graph and the same message for the same mistake.
This module holds the two entry points; the parser, its syntax errors and the readers' base are
:mod:`evtc.frontend.text_syntax`, the readers :mod:`evtc.frontend.text_ir` and
:mod:`evtc.frontend.text_expr`.

**IR text** (:func:`parse_ir`) reads back what :func:`evtc.ir.printer.print_graph` writes, so
``parse_ir(print_graph(g)) == g``. Every line becomes one node, exactly as written (no
hash-consing: the text *is* the graph, duplicates included); lines no output depends on are
dropped, as the printer would never print them. An operand is a parameter, a ``%k`` or output
defined on an earlier line, or an inline float literal: an f32 :class:`~evtc.ir.nodes.Immediate`,
one per distinct value (the text can't tell shared constants from copies).

**Expressions** (:func:`from_expr`), e.g. ``"D = relu(alpha*acc + beta*C + bias[n])"``:

* Statements ``NAME = expr`` separated by ``;`` or newlines (a newline inside brackets continues
  the statement; ``#`` starts a comment). Every assigned name not starting with ``_`` is an
  output, in order of assignment; ``_name`` is a temporary, never a parameter (using one before
  it is assigned is an error). A later statement may use an earlier assigned name, getting its
  value (``F = acc + bias[n]; D = gelu(F)`` is the Python ``F = acc + bias; return {"F": F,
  "D": gelu(F)}``). A name is assigned once.
* Inputs: ``acc`` (the accumulator), ``C`` (the source, dtype ``c``, default ``d``),
  ``name[n]`` (a row vector, length N, f32), ``name[m]`` (a column vector, length M, f32),
  ``name[m, n]`` (an M x N aux load, dtype ``d``), and any other bare name not starting with
  ``_`` (a runtime scalar by value, f32). ``:dtype`` after an input reference overrides its
  dtype (``bias[n]:bf16``, ``R[m, n]:f16``, ``C:f16``); it may be given once or repeated
  identically. An input must be referenced the same way every time. The graph's inputs are
  ``acc`` first (when used), then the others in order of first appearance: the signature the
  equivalent Python function would have.
* Operators as in Python: comparisons ``> >= < <= == !=`` (loosest, not chained; 1.0/0.0
  masks), ``+ -``, ``* /``, unary ``-``/``+``, then ``**`` (right associative, tighter than
  unary minus on its left: ``-x**2`` is ``-(x**2)``). Numbers: ``2``, ``0.5``, ``1e-3``,
  ``inf``, ``nan``.
* Calls: every elementwise op of :data:`evtc.ops.OPS` that Python epilogues call as
  ``evtc.<op>`` (``relu``, ``where``, ``maximum``, ``gt``...; not the operators' own ops),
  ``clamp(x, lo, hi)``, the conversion ``to(x, dtype)``, and the reductions ``sum``, ``max``,
  ``min``, ``amax`` with an optional ``dim=0|1|-1|-2``. A reduction can only be the whole
  right-hand side of an output statement, or inside ``to(...)`` there (setting its dtype).
* The semantics are Python's with the ``evtc.*`` functions: operand order as written
  (``2*x`` is ``mul(2.0, x)``; ``2 < x`` is Python's reflected ``gt(x, 2.0)``), arithmetic and
  calls on constants fold eagerly (``2*3*acc`` is ``mul(6.0, acc)``, ``exp(1)`` a number),
  ``x ** y`` needs a constant ``y`` (a constant base gives ``pow(2.0, x)``, as ``__rpow__``
  does), and an output's dtype is that of a top-level ``to(...)``, else ``d`` (matrices) or f32
  (reductions). Equal subexpressions are one node (:class:`~evtc.ir.graph.GraphBuilder`).
  Integer constants fold exactly, as in Python, up to 4096 bits (``9**9**9`` is an error, not a
  hang); every constant used must be a finite f32, ``inf`` or ``nan``.
* ``to``, ``inf`` and ``nan`` are reserved words; function names can't be used as inputs, nor
  ``True``, ``False``, ``None``, ``NaN``, ``Infinity`` and their like (:mod:`evtc.ir.names`).
  Input and output names follow :mod:`evtc.ir.names` (``A``, ``B``, ``out``, ``stream`` and
  C++ keywords can't name inputs; ``A`` and ``B`` can't name outputs).

Errors are :class:`~evtc.errors.EvtcError` subclasses located in the text (file ``<expr>`` or
``<ir>``, line, columns, the line itself) so the message shows a caret: :class:`GrammarError`
for syntax and for names, calls and inputs written wrongly; :class:`TraceError` for what the
tracer rejects too (a reduction used inside an expression, a traced exponent);
:class:`EpilogueTypeError` for dtypes and broadcast shapes (unknown dtype, an input used as two
kinds, an output that is not M x N, reducing a vector). No Lark exception escapes.
"""

from __future__ import annotations

from evtc import dtypes
from evtc.dtypes import DType
from evtc.errors import EpilogueTypeError, GrammarError, TraceError, UnknownDTypeError, api_boundary
from evtc.frontend.builder import EXPRESSION, IRBuilder
from evtc.frontend.text_expr import _ExprReader, expr_functions
from evtc.frontend.text_ir import _IRReader
from evtc.frontend.text_syntax import _epilogue_of_ir, _parse, _Source
from evtc.ir.graph import Graph

__all__ = ["parse_ir", "from_expr", "expr_functions"]

IR_FILE = "<ir>"
EXPR_FILE = "<expr>"


@api_boundary
def parse_ir(text: str, *, file: str = IR_FILE) -> Graph:
    """Read the canonical IR text (what :func:`evtc.ir.printer.print_graph` writes) back into a
    Graph; ``parse_ir(print_graph(g)) == g``.

    Args:
        text: the IR text (``# ...`` comments allowed, so ``print_graph(g, locs=True)`` reads too).
        file: the name locations use, e.g. the path the text came from.

    Raises:
        GrammarError: a syntax error, an unknown op/dtype/kind, a name used before it is
            defined or defined twice, a name that can't reach C++ (:mod:`evtc.ir.names`),
            an integer literal too large for any float; located in the text.
    """
    if not isinstance(text, str):
        raise GrammarError(f"IR text is a str, not {type(text).__name__}", hint="e.g. parse_ir(str(graph))")
    epilogue = _epilogue_of_ir(text)
    src = _Source(text, str(file))
    tree = _parse(src, "ir", epilogue)
    return _IRReader(src, epilogue).run(tree)


@api_boundary
def from_expr(text: str, *, c: DType | str | None = None, d: DType | str = dtypes.bf16,
              name: str | None = None) -> Graph:
    """Build the Graph of an epilogue written in the expression form (see the module docstring),
    e.g. ``from_expr("D = relu(alpha*acc + beta*C + bias[n])")``.

    Args:
        text: the statements.
        c: dtype of ``C`` when not given with ``C:dtype`` (default: ``d``).
        d: dtype of M x N outputs without a top-level ``to(...)``, and of ``name[m, n]`` inputs.
        name: the epilogue's name, used for the graph and in errors (default ``"expr"``).

    Returns:
        The Graph the tracer builds for the equivalent Python function (parameters in order of
        first appearance, ``acc`` first; outputs in order of assignment).

    Raises:
        GrammarError, TraceError, EpilogueTypeError: located in ``text`` (file ``<expr>``).
        EpilogueSignatureError: ``name`` is not an identifier that can reach C++.
    """
    epilogue = name or "expr"
    builder = IRBuilder(epilogue, dialect=EXPRESSION)  # checks the name first: messages quote it
    try:
        builder.d = dtypes.coerce(d, "d")
        builder.c = dtypes.coerce(c, "c") if c is not None else builder.d
    except UnknownDTypeError as e:
        raise EpilogueTypeError(e.message, epilogue=epilogue, hint=e.hint) from None
    if not isinstance(text, str):
        raise GrammarError(f"an expression is a str, not {type(text).__name__}", hint='e.g. from_expr("D = relu(acc)")')
    src = _Source(text, EXPR_FILE)
    tree = _parse(src, "exprs", epilogue)
    first = next((s for s in tree.children if s is not None), None)
    builder.loc = src.loc(first) if first is not None else None
    reader = _ExprReader(src, builder)
    reader.declare(tree)
    reader.run(tree)
    if not builder.outputs:
        raise TraceError("the expression has no outputs", loc=src.loc_at(0), epilogue=epilogue,
                         hint="assign at least one name not starting with '_', e.g. 'D = relu(acc)'")
    return builder.graph()
