"""The expression reader: the ``--expr`` form read with the tracer's semantics.

Input: the Lark tree of an ``exprs`` text (:mod:`evtc.frontend.text_syntax`) and an
:class:`~evtc.frontend.builder.IRBuilder` of the ``EXPRESSION`` dialect. Output: the inputs
declared (pass 1, :meth:`_ExprReader.declare`) and the outputs built (pass 2) in that builder,
or a located error. :func:`evtc.frontend.text.from_expr` is the entry point; its module
docstring states the form.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, NoReturn, Union

import numpy as np
from lark import Tree, v_args

from evtc import ops
from evtc.dtypes import DType
from evtc.errors import EpilogueTypeError, GrammarError, SourceLoc, TraceError
from evtc.frontend.builder import EXPRESSION, KIND_WORDS, IRBuilder, Pending, unknown_function_error
from evtc.frontend.text_syntax import _Kwarg, _Source, _TextReader
from evtc.ir.nodes import Accumulator, AuxLoad, ColBroadcast, Leaf, Node, RowBroadcast, ScalarBroadcast, Source

__all__ = ["expr_functions"]

#: ops written as operators or with ``to(...)`` in expressions (and internal ones): not callable
_OPERATOR_OPS = frozenset({"add", "sub", "mul", "div", "neg", "convert", "first", "group_quant"})
_REDUCERS = ("sum", "max", "min", "amax")


def expr_functions() -> tuple[str, ...]:
    """The names callable in the expression form, sorted (``to`` included)."""
    elementwise = {name for name in ops.OPS if name not in _OPERATOR_OPS}
    return tuple(sorted(elementwise | {"clamp", "to", *_REDUCERS}))


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
            for call in rhs.find_data("call"):  # (before its keyword's value is read as an input)
                name_tok, arglist = call.children
                kw = next((a for a in (arglist.children if isinstance(arglist, Tree) else ())
                           if isinstance(a, Tree) and a.data == "kwarg"), None)
                if str(name_tok) == "glu" and kw is not None:
                    self._glu_keyword(kw)
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
        if name == "glu" and keywords:
            self._glu_keyword(keywords[0].loc)
        if keywords:
            self.fail(GrammarError, f"{name}() takes no keyword arguments", keywords[0].loc,
                      hint="pass the arguments by position")
        b = self.builder
        if name == "glu":  # SwiGLU over interleaved columns (evtc.glu's default act)
            self._check_arity(name, positional, 1, loc)
            return b.glu(positional[0], "silu", loc)
        if name == "clamp":
            self._check_arity(name, positional, 3, loc)
            x, lo, hi = positional
            return b.call("minimum", (b.call("maximum", (x, lo), loc), hi), loc)
        self._check_arity(name, positional, ops.get(name).arity, loc)
        return b.call(name, positional, loc)

    def _glu_keyword(self, where) -> NoReturn:
        """Raise the error for ``glu(x, act=...)``: the expression form's glu is SwiGLU."""
        self.fail(GrammarError, "glu() takes no keyword arguments in the expression form: glu(x) is SwiGLU "
                  "(act silu)", where, hint="another activation is a Python epilogue's evtc.glu(x, act='gelu')")

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
