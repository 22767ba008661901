"""The IR text reader: the canonical IR text read back into a Graph, one node per line.

Input: the Lark tree of an ``ir`` text (:mod:`evtc.frontend.text_syntax`). Output: the
:class:`~evtc.ir.graph.Graph` it writes, exactly as written (no hash-consing or folding), or a
located :class:`~evtc.errors.GrammarError` (the builder's ``IR_TEXT`` dialect).
:func:`evtc.frontend.text.parse_ir` is the entry point.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from lark import Token, v_args

from evtc.dtypes import DType, f32
from evtc.errors import GrammarError, SourceLoc
from evtc.frontend.builder import IR_TEXT, IRBuilder
from evtc.frontend.text_syntax import _Kwarg, _Source, _TextReader
from evtc.ir.graph import Graph
from evtc.ir.nodes import (LEAF_KINDS, GroupScale, Immediate, Leaf, Node, Output, ReduceOp, Reduction, ScalarBroadcast,
                           Store)

__all__: list[str] = []

_IR_REDUCERS = {f"reduce_{op.value}": op for op in ReduceOp}


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
        if op in ("store", "group_scale") or op in _IR_REDUCERS:
            self.fail(GrammarError, f"'{op}' defines an output: write 'NAME = {op}(...)'", op_tok)
        self.builder.check_op(op, len(args), loc, op_loc=self.loc(op_tok))
        self._check_attrs(op, attrs, loc)
        nodes = tuple(self._operand(a, loc) for a in args)
        return self.builder.apply(op, nodes, loc, dtype=dt, attrs=attrs)

    def _check_attrs(self, op: str, attrs: tuple, loc: SourceLoc) -> None:
        """An attribute is given once: a repeated one would silently be its first (what the
        attributes mean is the verifier's: ``group_quant``'s in rule ``quantize-pair``)."""
        seen: set[str] = set()
        for k, _ in attrs:
            if k in seen:
                self.fail(GrammarError, f"'{op}': the attribute '{k}' is given twice", loc, hint="give it once")
            seen.add(k)

    def _output(self, name: str, op_tok: Token, args: list, attrs: Any, dt: DType, loc: SourceLoc) -> Output:
        op = str(op_tok)
        if op not in ("store", "group_scale") and op not in _IR_REDUCERS:
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
        if op == "group_scale":  # the scales of a group_quant, whose attributes they take
            if keywords:
                self.fail(GrammarError, "group_scale takes no keyword arguments", keywords[0].loc)
            attr = value.attr if getattr(value, "op", None) == "group_quant" else (lambda k, d: d)
            return GroupScale(dt, name=name, value=value, op=ReduceOp.MAX, dim=1, group=attr("group", 0),
                              convention=str(attr("convention", "")), layout=str(attr("layout", "row_major")), loc=loc)
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
