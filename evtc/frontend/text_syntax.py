"""Reading text with the grammar: the parser, located syntax errors, and the readers' base.

Input: text in one of the two forms of ``grammar/epilogue.lark`` and a start symbol (``ir`` or
``exprs``). Output: the Lark tree with positions (:func:`_parse`), or a located
:class:`~evtc.errors.GrammarError` that says what was expected and, for the known mistakes,
what it means (Lark's ``match_examples``); and :class:`_TextReader`, the Transformer base both
readers (:mod:`evtc.frontend.text_ir`, :mod:`evtc.frontend.text_expr`) share.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, NamedTuple, NoReturn

from lark import Lark, Token, Transformer_NonRecursive, Tree
from lark.exceptions import LarkError, UnexpectedCharacters, UnexpectedInput, UnexpectedToken, VisitError

from evtc import dtypes
from evtc.dtypes import DType
from evtc.errors import EvtcError, GrammarError, SourceLoc
from evtc.frontend.builder import IRBuilder
from evtc.resources import data_path

__all__: list[str] = []


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
