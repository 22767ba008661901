"""The textual frontends: the canonical IR text and the ``--expr`` expression form.

Input: text in one of the two forms of ``grammar/epilogue.lark``. Output:
:class:`evtc.ir.graph.Graph`, the same graph the tracer (:mod:`evtc.frontend.trace`) builds.

Both forms are parsed by one LALR(1) Lark parser with two start symbols and read by
non-recursive Lark Transformers that share one base (:class:`_TextReader`: locations, numbers,
dtypes, errors). The readers only read: what the text means is decided by the
:class:`~evtc.frontend.builder.IRBuilder` the tracer drives too (the expression form with the
tracer's semantics, the IR text without hash-consing or folding), so both frontends give the
same graph and the same message for the same mistake.

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
* ``to``, ``inf`` and ``nan`` are reserved words; function names can't be used as inputs.
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

import dataclasses
import functools
import re
from typing import Any, Callable, NamedTuple, NoReturn, Union

import numpy as np
from lark import Lark, Token, Transformer_NonRecursive, Tree, v_args
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from evtc import dtypes, ops
from evtc.dtypes import DType, f32
from evtc.errors import EpilogueTypeError, EvtcError, GrammarError, SourceLoc, TraceError, UnknownDTypeError, api_boundary
from evtc.frontend.builder import EXPRESSION, IR_TEXT, KIND_WORDS, IRBuilder, Pending, unknown_function_error
from evtc.ir.graph import Graph
from evtc.ir.nodes import (
    LEAF_KINDS,
    Accumulator,
    AuxLoad,
    ColBroadcast,
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
from evtc.resources import data_path

__all__ = ["parse_ir", "from_expr", "expr_functions"]

IR_FILE = "<ir>"
EXPR_FILE = "<expr>"

#: ops written as operators or with ``to(...)`` in expressions (and internal ones): not callable
_OPERATOR_OPS = frozenset({"add", "sub", "mul", "div", "neg", "convert", "first"})
_REDUCERS = ("sum", "max", "min", "amax")
_IR_REDUCERS = {f"reduce_{op.value}": op for op in ReduceOp}


def expr_functions() -> tuple[str, ...]:
    """The names callable in the expression form, sorted (``to`` included)."""
    elementwise = {name for name in ops.OPS if name not in _OPERATOR_OPS}
    return tuple(sorted(elementwise | {"clamp", "to", *_REDUCERS}))


# ---------------------------------------------------------------------------------------------
# The parser
# ---------------------------------------------------------------------------------------------


class _BracketJoiner:
    """Lark post-lexer: drops newline tokens inside (), [] and {} so a statement can continue
    on the next line within brackets (Python's implicit line joining)."""

    always_accept = ("_NL",)
    _OPEN = frozenset({"LPAR", "LSQB", "LBRACE"})
    _CLOSE = frozenset({"RPAR", "RSQB", "RBRACE"})

    def process(self, stream):
        depth = 0
        for tok in stream:
            if tok.type in self._OPEN:
                depth += 1
            elif tok.type in self._CLOSE:
                depth = max(0, depth - 1)
            elif tok.type == "_NL" and depth:
                continue
            yield tok


@functools.lru_cache(maxsize=None)
def _parser() -> Lark:
    """The Lark parser for ``grammar/epilogue.lark`` (built once)."""
    grammar = data_path("grammar", "epilogue.lark").read_text()
    return Lark(
        grammar,
        parser="lalr",
        lexer="contextual",
        start=["ir", "exprs"],
        propagate_positions=True,
        maybe_placeholders=True,
        postlex=_BracketJoiner(),
    )


class _Source:
    """The text being read, for turning Lark positions into :class:`SourceLoc`."""

    def __init__(self, text: str, file: str) -> None:
        self.text = text
        self.file = file
        self.lines = text.splitlines() or [""]

    def line_text(self, line: int) -> str | None:
        return self.lines[line - 1] if 1 <= line <= len(self.lines) else None

    def loc(self, item: Any) -> SourceLoc:
        """The location of a Lark Token or Tree meta (1-based columns) as a SourceLoc."""
        meta = item.meta if isinstance(item, Tree) else item
        line = getattr(meta, "line", None)
        if line is None:
            return SourceLoc(self.file, 1, None, None, self.line_text(1))
        col = meta.column - 1
        end_col = meta.end_column - 1 if getattr(meta, "end_line", line) == line else None
        return SourceLoc(self.file, line, col, end_col, self.line_text(line))

    def loc_at(self, pos: int, width: int = 1) -> SourceLoc:
        """The location of the character offset ``pos``."""
        pos = max(0, min(pos, len(self.text)))
        line = self.text.count("\n", 0, pos) + 1
        col = pos - (self.text.rfind("\n", 0, pos) + 1)
        return SourceLoc(self.file, line, col, col + max(1, width), self.line_text(line))


def _epilogue_of_ir(text: str) -> str:
    m = re.search(r"^\s*epilogue\s+(\w+)", text)
    return m.group(1) if m else "ir"


def _parse(src: _Source, start: str, epilogue: str) -> Tree:
    """Parse ``src`` from ``start``; a syntax error becomes a located GrammarError."""
    try:
        return _parser().parse(src.text, start=start)
    except UnexpectedInput as err:
        raise _syntax_error(err, src, start, epilogue) from None
    except LarkError as err:  # pragma: no cover - Lark raises UnexpectedInput for bad input
        raise GrammarError(f"can't parse the text: {err}", epilogue=epilogue) from None


# ---- syntax errors ---------------------------------------------------------------------------


class _Diagnosis(NamedTuple):
    """What a class of syntax errors means, found with Lark's ``match_examples``."""

    message: str
    hint: str


_EXPR_EXAMPLES: dict[_Diagnosis, list[str]] = {
    _Diagnosis("an operand is missing",
               "every operator needs a value on both sides, e.g. 'acc + bias[n]'"): [
        "D = acc +", "D = acc * * 2", "D = * acc", "D = acc + ;", "D = (acc + )", "D = acc -",
        "D = acc **", "D = acc <", "D = relu(acc, )", "D = relu(acc +)", "D = acc / \nE = acc",
        "D = ", "D = ;", "D = relu(, acc)", "D = (-)",
    ],
    _Diagnosis("a '(' is not closed", "add the missing ')'"): [
        "D = relu(acc", "D = (acc + 1", "D = relu((acc)", "D = maximum(acc, 1", "D = (acc",
    ],
    _Diagnosis("unmatched ')'", "remove it or add the '(' it closes"): [
        "D = acc)", "D = relu(acc))", "D = acc + 1)",
    ],
    _Diagnosis("an operator is missing between two values", "write the operator, e.g. 'alpha * acc'"): [
        "D = acc bias", "D = 2 acc", "D = (acc) (1)", "D = acc 2", "D = relu(acc) bias[n]",
        "D = bias[n] acc", "D = 2 (acc)",
    ],
    _Diagnosis("a statement is 'NAME = expression'",
               "name each output, e.g. 'D = relu(acc)'; separate statements with ';' or newlines"): [
        "relu(acc)", "acc + 1", "D", "D relu(acc)", "= acc", "D == acc", "2 = acc", "D; E = acc",
        "(D) = acc", "D[n] = acc", "D = acc; relu(acc)", "D = acc; + 1", "D = acc; = 1",
    ],
    _Diagnosis("a new line starts a new statement",
               "to continue an expression on the next line, wrap it in parentheses"): [
        "D = acc\n+ 1", "D = acc\n* 2", "D = acc\n/ 2", "D = acc\n** 2", "D = acc\n< 2", "D = acc\n>= 2",
        "D = acc\n- 1", "D = acc\n== 1", "D = acc\n!= 1", "D = acc\n<= 1", "D = acc\n> 1",
    ],
    _Diagnosis("comparisons can't be chained",
               "compare two values at a time; combine masks with '*' (and) or where(c, a, b)"): [
        "D = acc < 1 < 2", "D = acc > 0 == 1", "D = 0 <= acc <= 1", "D = relu(acc < 1 < 2)",
        "D = where(acc < 1 < 2, acc, C)", "D = (acc < 1 < 2)", "D = maximum(acc, 1 < acc < 2)",
    ],
    _Diagnosis("an index is written [m], [n] or [m, n]",
               "bias[n] is a row vector (length N), scale[m] a column vector (length M), R[m, n] an M x N input"): [
        "D = bias[]", "D = bias[n", "D = bias[1]", "D = bias[n][m]", "D = bias[n,]", "D = acc[",
    ],
    _Diagnosis("a dtype is missing after ':'",
               "e.g. bias[n]:bf16 (dtypes: " + ", ".join(d.name for d in dtypes.ALL) + ")"): [
        "D = bias[n]:", "D = bias[n]: 1", "D = acc * bias[n]: + 1", "D = alpha:",
    ],
    _Diagnosis("a conversion is written to(x, dtype)", "e.g. to(acc, e4m3)"): [
        "D = to(acc)", "D = to(acc, 1)", "D = to acc", "D = to(acc, e4m3", "D = to(acc, f16, f32)",
        "D = to", "D = to(acc, -f16)",
    ],
    _Diagnosis("'=' inside an expression", "each statement assigns one name; compare with '=='"): [
        "D = E = acc", "D = (E = acc)", "D = acc = 1",
    ],
}

_IR_EXAMPLES: dict[_Diagnosis, list[str]] = {
    _Diagnosis("the IR text starts with 'epilogue NAME(param: dtype kind, ...):'",
               "e.g. 'epilogue bias_relu(acc: f32 accumulator, bias: f32 row):'"): [
        "%0 = relu(acc) : f32", "D = store(acc) : bf16", "epilogue", "epilogue e", "epilogue (acc: f32 accumulator):",
        "epilogue e(acc: f32 accumulator)\n  D = store(acc) : bf16",
    ],
    _Diagnosis("a parameter is written 'name: dtype kind'", "e.g. 'alpha: f32 scalar'"): [
        "epilogue e(acc f32 accumulator):", "epilogue e(acc: f32):", "epilogue e(acc: f32 accumulator,):",
        "epilogue e(acc):", "epilogue e(acc: f32 accumulator x):",
    ],
    _Diagnosis("a node line is '%k = op(operands) : dtype' or 'NAME = store(value) : dtype'",
               "one node per line; operands are parameters, %k values defined above, or numbers"): [
        "epilogue e(acc: f32 accumulator):\n  D = store(acc)",
        "epilogue e(acc: f32 accumulator):\n  D = store(acc) :",
        "epilogue e(acc: f32 accumulator):\n  D = store(relu(acc)) : bf16",
        "epilogue e(acc: f32 accumulator):\n  %0 = acc + 1 : f32",
        "epilogue e(acc: f32 accumulator):\n  %0 relu(acc) : f32",
        "epilogue e(acc: f32 accumulator):\n  %0 = relu(acc : f32",
        "epilogue e(acc: f32 accumulator):\n  %0 = relu acc : f32",
        "epilogue e(acc: f32 accumulator):\n  %0 = relu(acc) : f32 f32",
        "epilogue e(acc: f32 accumulator):\n  %0 = relu(acc) {x} : f32",
    ],
}

#: what a terminal is called in messages
_TERMINAL_WORDS = {
    "NAME": "a name", "INT": "a number", "FLOAT": "a number", "INF": "inf", "NAN": "nan",
    "VALUE_ID": "a %value", "_NL": "a newline", "$END": "the end of the text",
}

#: terminals (by name or literal) that only one of the two forms uses
_IR_ONLY = frozenset({"VALUE_ID", "{", "}", "epilogue"})
_EXPR_ONLY = frozenset({";", "+", "*", "/", "**", ">", ">=", "<", "<=", "==", "!=", "[", "]", "to"})

_CHAR_HINTS = {
    ".": "there are no methods: convert with to(x, dtype); numbers are written 0.5 or .5",
    "@": "the GEMM itself is outside the epilogue: the epilogue receives the product as 'acc'",
    "%": "'%' is not an operator in expressions (only + - * / ** and comparisons)",
    "&": "combine 1.0/0.0 masks with '*' (and), or select with where(cond, a, b)",
    "|": "combine 1.0/0.0 masks with maximum(a, b) (or), or select with where(cond, a, b)",
    "~": "negate a 1.0/0.0 mask with '1 - mask'",
    "!": "'not equal' is written '!='",
    "'": "strings are not values; dtypes are written bare: to(x, bf16)",
    '"': "strings are not values; dtypes are written bare: to(x, bf16)",
}

_FLOOR_DIV_HINT = "'//' (floor division) is not supported; use '/'"

_WORD_HINTS = {
    "and": "Python's and/or/not can't be traced: multiply 1.0/0.0 masks (and) or use where(cond, a, b)",
    "or": "Python's and/or/not can't be traced: use maximum(mask_a, mask_b) (or) or where(cond, a, b)",
    "not": "Python's and/or/not can't be traced: negate a 1.0/0.0 mask with '1 - mask'",
    "if": "conditional expressions are written where(cond, a, b)",
    "else": "conditional expressions are written where(cond, a, b)",
}


def _describe_token(tok: Token) -> str:
    if tok.type == "$END":
        return "end of the text"
    if tok.type == "_NL":
        return "end of line"
    if tok.type == "NAME":
        return f"name '{tok}'"
    if tok.type in ("INT", "FLOAT"):
        return f"number {tok}"
    return f"'{tok}'"


def _describe_expected(names: set[str], start: str) -> str:
    """The terminals ``names`` in words, leaving out those only the other form uses (LALR
    merges states the two start symbols share, so their lookaheads can leak)."""
    parser = _parser()
    foreign = _IR_ONLY if start == "exprs" else _EXPR_ONLY
    words: set[str] = set()
    for name in names:
        if name in _TERMINAL_WORDS:
            if name not in foreign:
                words.add(_TERMINAL_WORDS[name])
            continue
        try:
            pattern = parser.get_terminal(name).pattern
        except KeyError:
            continue
        if pattern.type == "str" and pattern.value not in foreign:
            words.add(f"'{pattern.value}'")
    return ", ".join(sorted(words))


def _unclosed_bracket(text: str, pos: int) -> int | None:
    """The offset of the innermost bracket opened before offset ``pos`` and not closed there."""
    stack: list[int] = []
    pairs = {")": "(", "]": "[", "}": "{"}
    in_comment = False
    for i, ch in enumerate(text[:pos]):
        if ch == "#":
            in_comment = True
        elif ch == "\n":
            in_comment = False
        if in_comment:
            continue
        if ch in "([{":
            stack.append(i)
        elif ch in pairs and stack and text[stack[-1]] == pairs[ch]:
            stack.pop()
    return stack[-1] if stack else None


def _syntax_error(err: UnexpectedInput, src: _Source, start: str, epilogue: str) -> GrammarError:
    """A GrammarError for Lark's ``err``: located, with what was expected and, when one of the
    known bad inputs fails the same way (``match_examples``), what it means."""
    at_end = isinstance(err, UnexpectedToken) and err.token.type == "$END"
    if at_end:
        pos = len(src.text.rstrip())
        loc = src.loc_at(pos)
    else:
        pos = err.pos_in_stream if err.pos_in_stream is not None else len(src.text)
        width = len(err.token) if isinstance(err, UnexpectedToken) and err.token.type != "_NL" else 1
        loc = src.loc_at(pos, width)

    specific_hint = expected_hint = None
    if isinstance(err, UnexpectedCharacters):
        ch = src.text[pos] if pos < len(src.text) else ""
        message = f"unexpected character {ch!r}"
        specific_hint = _CHAR_HINTS.get(ch)
        if src.text[pos:pos + 2] == "//":
            specific_hint = _FLOOR_DIV_HINT
    else:
        tok = err.token  # type: ignore[attr-defined]
        message = f"unexpected {_describe_token(tok)}"
        if tok.type == "NAME":
            specific_hint = _WORD_HINTS.get(str(tok))
        elif str(tok) == "/" and src.text[max(0, pos - 1):pos + 1] == "//":
            specific_hint = _FLOOR_DIV_HINT
        expected = getattr(err, "expected", None) or getattr(err, "accepts", None)
        if expected:
            expected_hint = f"expected {_describe_expected(set(expected), start)}"

    hints: list[str] = []
    if specific_hint is not None:
        hints.append(specific_hint)
    else:
        examples = _EXPR_EXAMPLES if start == "exprs" else _IR_EXAMPLES
        parse = functools.partial(_parser().parse, start=start)
        try:
            label = err.match_examples(parse, examples, use_accepts=True)
        except Exception:  # noqa: BLE001 - a failing diagnosis must not hide the error itself
            label = None
        if label is not None:
            message = f"{label.message} ({message})"
            hints.append(label.hint)
        elif expected_hint is not None:
            hints.append(expected_hint)
    # A bracket left open explains an error at the end, or on a later line (newlines inside
    # brackets continue the statement, so the next statement reads as part of this one).
    opened = _unclosed_bracket(src.text, pos)
    if opened is not None and (at_end or "\n" in src.text[opened:pos]):
        where = src.loc_at(opened)
        hints.append(f"the '{src.text[opened]}' at {where.line}:{(where.col or 0) + 1} is not closed")
    hint = "; ".join(hints) or None
    return GrammarError(message, loc=loc, epilogue=epilogue, hint=hint, anchor="grammar")


# ---------------------------------------------------------------------------------------------
# The shared base of both readers
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Kwarg:
    """A ``name=value`` call argument."""

    name: str
    value: Any
    loc: SourceLoc


class _TextReader(Transformer_NonRecursive):
    """What both forms share: locations, numbers, dtype names, located errors, and the
    :class:`~evtc.frontend.builder.IRBuilder` that owns the semantics.

    A subclass's callbacks build nodes as Lark calls them bottom-up (children left to right,
    then the parent: the same order as the recursive ``Transformer``), statement (or line)
    after statement, so a name assigned (or defined) on one is known to the next. The walk is
    Lark's non-recursive one, so a 2000-deep nesting or a 100 KB expression can't exhaust
    Python's recursion limit.
    """

    def __init__(self, src: _Source, builder: IRBuilder) -> None:
        super().__init__(visit_tokens=False)
        self.src = src
        self.builder = builder

    @property
    def epilogue(self) -> str:
        return self.builder.epilogue

    # ---- helpers --------------------------------------------------------------------------

    def loc(self, item: Any) -> SourceLoc:
        return item if isinstance(item, SourceLoc) else self.src.loc(item)

    def fail(self, cls: type[EvtcError], message: str, at: Any, hint: str | None = None) -> NoReturn:
        raise cls(message, loc=self.loc(at) if at is not None else None, epilogue=self.epilogue, hint=hint)

    def dtype(self, tok: Token) -> DType:
        """The dtype named by ``tok`` (evtc names and aliases)."""
        return self.builder.dtype(str(tok), self.loc(tok))

    def run(self, tree: Tree) -> Any:
        """Transform ``tree``, letting EvtcErrors through unwrapped (Lark wraps exceptions
        raised in callbacks in VisitError)."""
        try:
            return self.transform(tree)
        except VisitError as err:
            inner = err.orig_exc
            if isinstance(inner, EvtcError):
                raise inner.with_traceback(None) from None
            raise GrammarError(
                f"internal error while reading the text: {type(inner).__name__}: {inner}",
                loc=self.loc(err.obj) if isinstance(err.obj, (Tree, Token)) else None,
                epilogue=self.epilogue, hint="this is a bug in evtc; please report it with the text",
            ) from inner

    # ---- shared rules ---------------------------------------------------------------------

    def number(self, children: list[Token]) -> int | float:
        (tok,) = children
        return self.builder.literal(str(tok), self.loc(tok))


# ---------------------------------------------------------------------------------------------
# IR text
# ---------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class _Param:
    """A parameter of the IR header, read but not yet declared."""

    name: str
    kind: type[Leaf]
    dtype: DType
    by_pointer: bool
    loc: SourceLoc


class _IRReader(_TextReader):
    """Reads the canonical IR text, one node per line, exactly as written: the builder checks
    the names (inputs, outputs, the epilogue's) and the ops, without hash-consing or folding.
    Everything wrong in IR text is a GrammarError (the builder's :data:`IR_TEXT` dialect)."""

    def __init__(self, src: _Source, epilogue: str) -> None:
        builder = IRBuilder("ir", dialect=IR_TEXT, intern=False)
        builder.epilogue = epilogue  # for messages until the header is read (checked there)
        super().__init__(src, builder)
        self.header_loc: SourceLoc | None = None
        self.values: dict[str, Node] = {}  # parameter, %k and output names
        self.constants: dict[str, Immediate] = {}  # by repr, so -0.0 and 0.0 stay apart

    def _define(self, name: str, node: Node, at: Any) -> None:
        self._check_new(name, at)
        self.values[name] = node

    def _check_new(self, name: str, at: Any) -> None:
        if name in self.values:
            self.fail(GrammarError, f"'{name}' is defined twice", at)

    # ---- header -----------------------------------------------------------------------------

    @v_args(meta=True)
    def param(self, meta, children) -> _Param:
        name, dtype_tok, kind_tok = children
        dt = self.dtype(dtype_tok)
        kind = str(kind_tok)
        loc = self.loc(meta)
        if kind == "devscalar":
            return _Param(str(name), ScalarBroadcast, dt, True, loc)
        cls = LEAF_KINDS.get(kind)
        if cls is None:
            self.fail(GrammarError, f"unknown input kind '{kind}'", kind_tok,
                      hint=f"kinds: {', '.join([*LEAF_KINDS, 'devscalar'])}")
        return _Param(str(name), cls, dt, False, loc)

    @v_args(meta=True)
    def header(self, meta, children) -> None:
        name, *params = children
        self.header_loc = self.loc(meta)
        self.builder.rename(str(name), self.loc(name))
        self.builder.loc = self.header_loc
        for p in params:
            if p is None:
                continue
            self._check_new(p.name, p.loc)
            leaf = self.builder.input(p.name, p.kind, p.dtype, by_pointer=p.by_pointer, loc=p.loc)
            self._define(p.name, leaf, p.loc)

    # ---- operands -------------------------------------------------------------------------

    def value_ref(self, children) -> Node:
        return self._lookup(children[0])

    def name_ref(self, children) -> Node:
        return self._lookup(children[0])

    def _lookup(self, tok: Token) -> Node:
        node = self.values.get(str(tok))
        if node is None:
            what = "value" if tok.startswith("%") else "name"
            self.fail(GrammarError, f"{what} '{tok}' is used before it is defined", tok,
                      hint="operands are parameters of the header or values defined on earlier lines")
        return node

    def number(self, children: list[Token]) -> int | float:
        """A literal, refused at the literal if it is an integer no float can hold: an operand
        becomes an f32 constant through ``float()``, which raises OverflowError beyond
        ~1.8e308 (a finite float beyond f32's range is read as written: the verifier reports
        it, as it does for any graph)."""
        value = super().number(children)
        if isinstance(value, int):
            try:
                float(value)
            except OverflowError:
                self.builder.constant(value, self.loc(children[0]))  # raises the not-an-f32 GrammarError
        return value

    def negative(self, children) -> float:
        return -children[0]

    @v_args(meta=True)
    def kwarg(self, meta, children) -> _Kwarg:
        name, value = children
        return _Kwarg(str(name), value, self.loc(meta))

    def attr(self, children) -> tuple[str, Any]:
        name, value = children
        if isinstance(value, Token):
            value = {"True": True, "False": False, "None": None}.get(str(value), str(value))
        return (str(name), value)

    def attrs(self, children) -> tuple[tuple[str, Any], ...]:
        return tuple(c for c in children if c is not None)

    # ---- lines ----------------------------------------------------------------------------

    def _operand(self, arg: Any, at: Any) -> Node:
        if isinstance(arg, _Kwarg):
            self.fail(GrammarError, f"unexpected keyword argument '{arg.name}'", arg.loc)
        if isinstance(arg, Node):
            return arg
        value = float(arg)
        key = repr(value)
        if key not in self.constants:  # one node per constant, as the builders make them
            self.constants[key] = Immediate(f32, value=value, loc=self.loc(at))
        return self.constants[key]

    @v_args(meta=True)
    def node(self, meta, children) -> None:
        target, op_tok, *middle, attrs, dtype_tok = children
        args = [a for a in middle if a is not None]
        dt = self.dtype(dtype_tok)
        loc = self.loc(meta)
        if target.type == "VALUE_ID":
            node = self._compute(op_tok, args, attrs or (), dt, loc)
        else:
            self._check_new(str(target), target)
            node = self.builder.add_output(self._output(str(target), op_tok, args, attrs, dt, loc))
        self._define(str(target), node, target)

    def _compute(self, op_tok: Token, args: list, attrs: tuple, dt: DType, loc: SourceLoc) -> Node:
        op = str(op_tok)
        if op == "store" or op in _IR_REDUCERS:
            self.fail(GrammarError, f"'{op}' defines an output: write 'NAME = {op}(...)'", op_tok)
        self.builder.check_op(op, len(args), loc, op_loc=self.loc(op_tok))
        nodes = tuple(self._operand(a, loc) for a in args)
        return self.builder.apply(op, nodes, loc, dtype=dt, attrs=attrs)

    def _output(self, name: str, op_tok: Token, args: list, attrs: Any, dt: DType, loc: SourceLoc) -> Output:
        op = str(op_tok)
        if op != "store" and op not in _IR_REDUCERS:
            self.fail(GrammarError, f"'{name} = {op}(...)': a named line is an output", op_tok,
                      hint="outputs are 'NAME = store(x)' or 'NAME = reduce_sum/max/min(x, dim=...)'; "
                           "computes are '%k = op(...)'")
        if attrs is not None:
            self.fail(GrammarError, f"'{op}' takes no attributes", loc)
        positional = [a for a in args if not isinstance(a, _Kwarg)]
        keywords = [a for a in args if isinstance(a, _Kwarg)]
        if len(positional) != 1:
            self.fail(GrammarError, f"'{op}' takes one value, got {len(positional)}", loc)
        value = self._operand(positional[0], loc)
        if op == "store":
            if keywords:
                self.fail(GrammarError, "store takes no keyword arguments", keywords[0].loc)
            return Store(dt, name=name, value=value, loc=loc)
        dim = None
        for k, kw in enumerate(keywords):
            if kw.name != "dim" or k > 0:
                what = "dim is given twice" if kw.name == "dim" else f"unexpected keyword argument '{kw.name}'"
                self.fail(GrammarError, what, kw.loc, hint="reductions take dim=0, dim=1 or no dim")
            if not isinstance(kw.value, int) or kw.value not in (0, 1):
                self.fail(GrammarError, f"dim={kw.value!r}: a reduction's dim is 0 or 1 (omit it for both)", kw.loc)
            dim = kw.value
        return Reduction(dt, name=name, value=value, op=_IR_REDUCERS[op], dim=dim, loc=loc)

    def ir(self, children) -> Graph:
        # Not builder.graph(): the text may hold no output (the verifier says so, not the reader).
        b = self.builder
        return Graph(b.epilogue, tuple(b.inputs), tuple(b.outputs), self.header_loc)


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


# ---------------------------------------------------------------------------------------------
# Expressions
# ---------------------------------------------------------------------------------------------


#: a value while evaluating an expression: a traced node, a pending reduction, or a Python
#: constant (int, float, bool or a 0-d numpy value, exactly what Python would hold)
_Val = Union[Node, Pending, int, float, bool, np.generic, np.ndarray]


@dataclasses.dataclass
class _InputDecl:
    """An input of an expression, from its references (see :meth:`_ExprReader.declare`)."""

    name: str
    cls: type[Leaf]
    form: str  # how it was first written, for messages: "bias[n]"
    loc: SourceLoc
    dtype: DType | None = None  # from a ':dtype' suffix
    dtype_loc: SourceLoc | None = None


_INDEX_KINDS: dict[tuple[str, ...], type[Leaf]] = {
    ("m",): ColBroadcast, ("n",): RowBroadcast, ("m", "n"): AuxLoad,
}


def _binary_rule(op: str) -> Callable:
    @v_args(meta=True)
    def rule(self: "_ExprReader", meta, children) -> _Val:
        a, b = children
        return self.builder.binary(op, a, b, self.loc(meta))

    rule.__name__ = op
    rule.__doc__ = f"``a {op} b`` (Python's operator semantics on traced values and constants)."
    return rule


class _ExprReader(_TextReader):
    """Reads the expression form with the tracer's semantics (see the module docstring), all of
    them the builder's (:data:`EXPRESSION` dialect): values are nodes, pending reductions, or
    Python constants folded as Python would."""

    def __init__(self, src: _Source, builder: IRBuilder) -> None:
        super().__init__(src, builder)
        self.leaves: dict[str, Leaf] = {}
        self.values: dict[str, _Val] = {}
        self.functions = frozenset(expr_functions())

    # ---- pass 1: the inputs ---------------------------------------------------------------

    def declare(self, tree: Tree) -> tuple[Leaf, ...]:
        """Find the inputs from the references in ``tree``, statement by statement (a name is
        an input where it is not yet assigned), check that each is used one way, and declare
        them: ``acc`` first, then in order of first appearance."""
        decls: dict[str, _InputDecl] = {}
        assigned: dict[str, SourceLoc] = {}
        for stmt in tree.children:
            if stmt is None:
                continue
            target, rhs = stmt.children
            refs = sorted(rhs.find_data("ref"), key=lambda t: (t.meta.line, t.meta.column))
            for ref in refs:
                self._declare_ref(ref, decls, assigned)
            name = str(target)
            if name in ("acc", "C"):
                kind = KIND_WORDS[Accumulator if name == "acc" else Source]
                self.fail(GrammarError, f"'{name}' is an input ({kind}) and can't be assigned", target,
                          hint="give the output another name, e.g. 'D'")
            if name in decls:
                first = decls[name].loc
                self.fail(GrammarError, f"'{name}' is an input (first used at {first.line}:{(first.col or 0) + 1}) "
                          "and can't be assigned", target,
                          hint="give the output another name, or assign it before it is used")
            if name in assigned:
                first = assigned[name]
                self.fail(GrammarError, f"'{name}' is assigned twice (first at {first.line}:{(first.col or 0) + 1})",
                          target, hint="use a new name for each value")
            if not name.startswith("_"):
                self.builder.check_output_name(name, self.loc(target))
            assigned[name] = self.loc(target)

        order = sorted(decls.values(), key=lambda dcl: (dcl.cls is not Accumulator, dcl.loc.line, dcl.loc.col or 0))
        for dcl in order:
            self.leaves[dcl.name] = self.builder.input(dcl.name, dcl.cls, dcl.dtype, loc=dcl.loc,
                                                       dtype_loc=dcl.dtype_loc)
        return tuple(self.builder.inputs)

    def _declare_ref(self, ref: Tree, decls: dict[str, _InputDecl], assigned: dict[str, SourceLoc]) -> None:
        name_tok, subscript, dtype_tok = ref.children
        name = str(name_tok)
        loc = self.loc(ref)
        index: tuple[str, ...] | None = None
        if subscript is not None:
            index = tuple(str(t) for t in subscript.children)
            if index not in _INDEX_KINDS:
                self.fail(GrammarError, f"'{name}[{', '.join(index)}]': an index is [m], [n] or [m, n]", subscript,
                          hint="name[n] is a row vector (length N, one value per column), name[m] a column "
                               "vector (length M, one value per row), name[m, n] an M x N input")
        form = name + (f"[{', '.join(index)}]" if index else "")
        if name in assigned:
            if index is not None or dtype_tok is not None:
                first = assigned[name]
                self.fail(GrammarError, f"'{name}' is the value assigned at {first.line}:{(first.col or 0) + 1}, "
                          "not an input", ref, hint=f"write it bare: '{name}'; convert values with to({name}, dtype)")
            return
        if name in self.functions:
            self.fail(GrammarError, f"'{name}' is a function: call it, e.g. '{name}(x)'", ref)
        if name.startswith("_"):
            self.builder.check_input_name(name, loc)  # a name no C++ parameter may have says so first
            self.fail(GrammarError, f"'{name}' is used before it is assigned: a name starting with '_' is a "
                      "temporary, not a parameter", ref,
                      hint=f"assign it on an earlier line ('{name} = ...'); the parameters are acc, C, indexed names "
                           "(bias[n], scale[m], R[m, n]) and bare names not starting with '_' (runtime scalars)")
        if name == "acc":
            cls: type[Leaf] = Accumulator
        elif name == "C":
            cls = Source
        else:
            cls = ScalarBroadcast if index is None else _INDEX_KINDS[index]
        if cls in (Accumulator, Source) and index is not None:
            self.fail(GrammarError, f"'{name}' is {KIND_WORDS[cls]}: write it without an index", subscript)
        dt = None
        if dtype_tok is not None:
            dt = self.dtype(dtype_tok)
            self.builder.check_input_dtype(cls, dt, self.loc(dtype_tok))
        decl = decls.get(name)
        if decl is None:
            self.builder.check_input_name(name, loc)
            decls[name] = _InputDecl(name, cls, form, loc, dt, self.loc(dtype_tok) if dtype_tok is not None else None)
            return
        if decl.cls is not cls:
            self.fail(EpilogueTypeError,
                      f"'{name}' is used as {KIND_WORDS[cls]} here but as {KIND_WORDS[decl.cls]} "
                      f"('{decl.form}') at {decl.loc.line}:{(decl.loc.col or 0) + 1}", ref,
                      hint="reference each input the same way every time")
        if dt is not None:
            if decl.dtype is not None and decl.dtype is not dt:
                at = decl.dtype_loc or decl.loc
                self.fail(EpilogueTypeError, f"'{name}' is declared {decl.dtype} at {at.line}:{(at.col or 0) + 1} "
                          f"and {dt} here", dtype_tok, hint="give an input's dtype once")
            decl.dtype, decl.dtype_loc = dt, self.loc(dtype_tok)

    # ---- rules: atoms -----------------------------------------------------------------------

    @v_args(meta=True)
    def ref(self, meta, children) -> _Val:
        name = str(children[0])
        if name not in self.values:
            return self.leaves[name]
        value = self.values[name]
        if isinstance(value, Pending):
            return value.at(self.loc(meta))
        return value

    def subscript(self, children) -> None:  # checked by declare()
        return None

    add = _binary_rule("add")
    sub = _binary_rule("sub")
    mul = _binary_rule("mul")
    div = _binary_rule("div")
    gt = _binary_rule("gt")
    ge = _binary_rule("ge")
    lt = _binary_rule("lt")
    le = _binary_rule("le")
    eq = _binary_rule("eq")
    ne = _binary_rule("ne")

    @v_args(meta=True)
    def neg(self, meta, children) -> _Val:
        (x,) = children
        return self.builder.negate(x, self.loc(meta))

    @v_args(meta=True)
    def pos(self, meta, children) -> _Val:
        (x,) = children
        return self.builder.plus(x, self.loc(meta))

    @v_args(meta=True)
    def pow(self, meta, children) -> _Val:
        base, exponent = children
        return self.builder.power(base, exponent, self.loc(meta))

    # ---- rules: calls ---------------------------------------------------------------------

    @v_args(meta=True)
    def kwarg(self, meta, children) -> _Kwarg:
        name, value = children
        return _Kwarg(str(name), value, self.loc(meta))

    def args(self, children) -> list:
        return list(children)

    @v_args(meta=True)
    def convert(self, meta, children) -> _Val:
        x, dtype_tok = children
        return self.builder.convert(x, str(dtype_tok), self.loc(meta), dtype_loc=self.loc(dtype_tok))

    @v_args(meta=True)
    def call(self, meta, children) -> _Val:
        name_tok, arglist = children
        name = str(name_tok)
        loc = self.loc(meta)
        args = arglist or []
        positional = tuple(a for a in args if not isinstance(a, _Kwarg))
        keywords = [a for a in args if isinstance(a, _Kwarg)]
        seen_keyword = False
        given: set[str] = set()
        for a in args:
            if isinstance(a, _Kwarg):
                seen_keyword = True
                if a.name in given:  # Python's "keyword argument repeated"
                    self.fail(GrammarError, f"{name}(): keyword argument '{a.name}' is given twice", a.loc,
                              hint="give each keyword argument once")
                given.add(a.name)
            elif seen_keyword:
                self.fail(GrammarError, "a positional argument follows a keyword argument", loc)

        if name in _REDUCERS:
            return self._reduction_call(name, positional, keywords, loc)
        if name not in self.functions:
            raise unknown_function_error(name, sorted(self.functions), EXPRESSION, self.loc(name_tok), self.epilogue)
        if keywords:
            self.fail(GrammarError, f"{name}() takes no keyword arguments", keywords[0].loc,
                      hint="pass the arguments by position")
        b = self.builder
        if name == "clamp":
            self._check_arity(name, positional, 3, loc)
            x, lo, hi = positional
            return b.call("minimum", (b.call("maximum", (x, lo), loc), hi), loc)
        self._check_arity(name, positional, ops.get(name).arity, loc)
        return b.call(name, positional, loc)

    def _check_arity(self, name: str, args: tuple, arity: int, loc: SourceLoc) -> None:
        if len(args) != arity:
            plural = "s" if arity != 1 else ""
            self.fail(GrammarError, f"{name}() takes {arity} argument{plural}, got {len(args)}", loc)

    def _reduction_call(self, name: str, positional: tuple, keywords: list[_Kwarg], loc: SourceLoc) -> Pending:
        if not positional:
            self.fail(GrammarError, f"{name}() needs the value to reduce", loc)
        if name in ("max", "min") and len(positional) > 1:
            self.builder.not_elementwise(name, loc)
        if len(positional) > 2:
            self.fail(GrammarError, f"{name}() takes a value and a dim, got {len(positional)} arguments", loc)
        dim: Any = positional[1] if len(positional) == 2 else None
        dim_loc = loc
        for kw in keywords:
            if kw.name != "dim" or len(positional) == 2:
                what = "dim is given twice" if kw.name == "dim" else f"unexpected keyword argument '{kw.name}'"
                self.fail(GrammarError, f"{name}(): {what}", kw.loc, hint="reductions take dim=0, dim=1 or no dim")
            dim, dim_loc = kw.value, kw.loc
        return self.builder.reduce(name, positional[0], dim, loc, dim_loc=dim_loc)

    # ---- rules: statements ----------------------------------------------------------------

    @v_args(meta=True)
    def stmt(self, meta, children) -> None:
        target, value = children
        name = str(target)
        loc = self.loc(meta)
        if name.startswith("_"):
            if isinstance(value, Pending):
                self.fail(TraceError, f"the {value.node.role} '{value.describe()}' is assigned to the "
                          f"temporary '{name}'", loc,
                          hint="a reduction can only be an output: give it a name not starting with '_'")
            self.values[name] = value
            return
        self.values[name] = value
        self.builder.output(name, value, loc)


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
        builder.d = dtypes.coerce(d)
        builder.c = dtypes.coerce(c) if c is not None else builder.d
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
