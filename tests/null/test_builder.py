"""The IR builder behind every frontend (evtc/frontend/builder.py): driven directly as a third
frontend would drive it, the same graphs as the tracer and the expression form, and the same
message for the same mistake whichever frontend made it."""

from __future__ import annotations

import inspect
import pickle

import pytest

import epilogues
import evtc
from evtc import bf16, f16, f32
from evtc.errors import EvtcError, GrammarError, SourceLoc, TraceError, UnsupportedOpError
from evtc.frontend import builder as builder_mod
from evtc.frontend.builder import EXPRESSION, IR_TEXT, PYTHON, IRBuilder, Pending
from evtc.frontend.text import from_expr, parse_ir
from evtc.frontend.trace import trace
from evtc.ir import verify
from evtc.passes.legalize import ARCH_RULES, legalize
from evtc.ir.nodes import Accumulator, AuxLoad, ColBroadcast, Compute, RowBroadcast, ScalarBroadcast, Source

LOC = SourceLoc("<fx>", 1, 0, 1, "x")

#: the reference epilogues as expressions (tests/null/test_grammar.py has the same table with the
#: input orders; here the tracer's graph is reordered to the expression's order of appearance)
from test_grammar import REFERENCE_EXPRS  # noqa: E402


def _reordered(g, names):
    return g.replace(inputs=tuple(g.input(n) for n in names))


# ---------------------------------------------------------------------------------------------
# A third frontend: the builder driven directly
# ---------------------------------------------------------------------------------------------


def _bias_relu_by_hand(d=bf16) -> evtc.Graph:
    """bias_relu built through the API the torch.fx importer uses."""
    b = IRBuilder("bias_relu", c=None, d=d, dialect=PYTHON, loc=LOC)
    acc = b.input("acc", Accumulator, loc=LOC)
    C = b.input("C", Source, loc=LOC)
    alpha = b.input("alpha", ScalarBroadcast, f32, loc=LOC)
    beta = b.input("beta", ScalarBroadcast, f32, loc=LOC)
    bias = b.input("bias", RowBroadcast, f32, loc=LOC)
    x = b.binary("add", b.binary("add", b.binary("mul", alpha, acc, LOC), b.binary("mul", beta, C, LOC), LOC),
                 bias, LOC)
    b.output("D", b.call("relu", (x,), LOC), LOC)
    return b.graph()


@pytest.mark.parametrize("d", [bf16, f16])
def test_builder_driven_directly_gives_the_traced_graph(d):
    by_hand = _bias_relu_by_hand(d)
    traced = epilogues.bias_relu.trace(d=d)
    assert str(by_hand) == str(traced)
    verify(by_hand)
    legalize(by_hand, ARCH_RULES["sm90"])
    # and the rest of the pipeline can't tell them apart
    assert evtc.Gemm(by_hand, d=d).source == evtc.Gemm(epilogues.bias_relu, d=d).source


def test_builder_reductions_conversions_and_folding():
    b = IRBuilder("stats", d=bf16, loc=LOC)
    acc = b.input("acc", Accumulator, loc=LOC)
    scale = b.input("scale", ColBroadcast, loc=LOC)
    assert scale.dtype is f32  # vectors and scalars default to f32
    y = b.binary("mul", acc, b.binary("mul", 2, 3, LOC), LOC)  # 2 * 3 folds to the int 6
    assert isinstance(y, Compute) and y.args[1].value == 6.0
    assert b.binary("lt", 2, acc, LOC).op == "gt"  # Python's reflected comparison
    m = b.reduce("amax", y, -1, LOC)
    assert isinstance(m, Pending) and m.node.dim == 1 and m.node.value.op == "abs"
    m16 = b.convert(m, "f16", LOC)
    b.output("D", b.convert(b.binary("mul", y, scale, LOC), "e4m3", LOC), LOC)
    b.output("amax", m16, LOC)
    g = b.graph()
    assert [(o.name, o.dtype.name) for o in g.outputs] == [("D", "e4m3"), ("amax", "f16")]
    assert g.output("amax").dim == 1


def test_builder_hash_conses_unless_told_not_to():
    for intern in (True, False):
        b = IRBuilder("e", loc=LOC, intern=intern)
        acc = b.input("acc", Accumulator, loc=LOC)
        r1, r2 = b.call("relu", (acc,), LOC), b.call("relu", (acc,), LOC)
        assert (r1 is r2) is intern


def test_builder_rejects_unknown_ops_with_the_dialects_class():
    for dialect, cls in ((PYTHON, UnsupportedOpError), (IR_TEXT, GrammarError), (EXPRESSION, GrammarError)):
        b = IRBuilder("e", dialect=dialect, loc=LOC)
        acc = b.input("acc", Accumulator, loc=LOC)
        with pytest.raises(cls, match="unknown op 'softplus'"):
            b.apply("softplus", (acc,), LOC)
        with pytest.raises(cls, match="op 'relu' takes 1 operand, got 2"):
            b.apply("relu", (acc, acc), LOC)


def test_builder_graph_needs_an_output_and_one_accumulator():
    b = IRBuilder("e", loc=LOC)
    b.input("acc", Accumulator, loc=LOC)
    with pytest.raises(TraceError, match="no outputs"):
        b.graph()
    with pytest.raises(evtc.EpilogueSignatureError, match="at most one accumulator"):
        b.input("acc2", Accumulator, loc=LOC)
    with pytest.raises(evtc.EpilogueSignatureError, match="'acc' is declared twice"):
        b.input("acc", AuxLoad, loc=LOC)


def test_the_module_docstring_documents_the_api():
    doc = builder_mod.__doc__
    for name in ("input", "binary", "call", "reduce", "convert", "output", "graph", "lift", "Pending", "Dialect",
                 "torch.fx"):
        assert name in doc, name
    for name in ("input", "lift", "apply", "binary", "negate", "power", "call", "convert", "reduce", "output",
                 "add_output", "graph", "check_input_name", "check_output_name", "dtype", "constant", "literal"):
        fn = getattr(IRBuilder, name)
        assert inspect.getdoc(fn), name


def test_nodes_survive_pickle_with_their_derived_facts():
    g = epilogues.many_aux.graph
    node = g.outputs[0].value
    back = pickle.loads(pickle.dumps(node))
    assert back.bcast is node.bcast and back.key()[:3] == node.key()[:3]
    assert repr(back) == repr(node)


# ---------------------------------------------------------------------------------------------
# Both frontends, one graph
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(REFERENCE_EXPRS))
@pytest.mark.parametrize("c,d", [(None, bf16), (f16, f16), (f32, evtc.e4m3)])
def test_tracer_and_expression_give_identical_ir_text(name, c, d):
    text, order = REFERENCE_EXPRS[name]
    traced = _reordered(epilogues.REFERENCE[name].trace(c=c, d=d), order)
    got = from_expr(text, c=c, d=d, name=name)
    assert str(got) == str(traced)
    assert str(parse_ir(str(got))) == str(got)


# ---------------------------------------------------------------------------------------------
# One message per mistake, whichever frontend made it
# ---------------------------------------------------------------------------------------------


def _used_inside(acc):
    return acc - evtc.max(acc, dim=1)


def _traced_exponent(acc, x: evtc.Matrix):
    return acc ** x


def _bad_dim(acc):
    return {"D": acc, "s": evtc.sum(acc, dim=2)}


def _reduce_vector(acc, scale: evtc.ColVector[f32]):
    return {"D": acc, "s": evtc.sum(scale, dim=1)}


def _vector_output(acc, bias: evtc.RowVector[f32]):
    return {"D": acc, "E": bias * 2.0}


def _const_output(acc):
    return {"D": acc, "E": 2 * 3}


def _two_values(acc, x: evtc.Matrix):
    return {"D": acc, "m": evtc.max(acc, x)}


def _huge_int(acc):
    return acc * 10**400


def _beyond_f32(acc):
    return acc * 1e39


def _unknown_dtype(acc):
    return evtc.to(acc, "f64")


def _reserved_param(acc, out: float):
    return acc * out


def _reserved_output(acc):
    return {"D": acc, "B": acc}


def _keyword_output(acc):
    return {"D": acc, "class": acc}


def _used_inside_temp(acc):
    m = evtc.max(acc, dim=1)
    return acc * m


SAME_MESSAGE = [
    (_used_inside, "D = acc - max(acc, dim=1)"),
    (_traced_exponent, "D = acc ** x[m, n]"),
    (_bad_dim, "D = acc; s = sum(acc, dim=2)"),
    (_reduce_vector, "D = acc; s = sum(scale[m], dim=1)"),
    (_vector_output, "D = acc; E = bias[n] * 2.0"),
    (_const_output, "D = acc; E = 2 * 3"),
    (_two_values, "D = acc; m = max(acc, x[m, n])"),
    (_huge_int, "D = acc * 10**400"),
    (_beyond_f32, "D = acc * 1e39"),
    (_unknown_dtype, "D = to(acc, f64)"),
    (_reserved_param, "D = acc * out"),
    (_reserved_output, "D = acc; B = acc"),
    (_keyword_output, "D = acc; class = acc"),
    (_used_inside_temp, "m = max(acc, dim=1); D = acc * m"),
]


def _strip_spelling(text: str) -> str:
    """The message with the frontends' spelling of functions made equal."""
    return text.replace("evtc.", "")


@pytest.mark.parametrize("fn,text", SAME_MESSAGE, ids=[fn.__name__ for fn, _ in SAME_MESSAGE])
def test_same_mistake_same_message_in_both_frontends(fn, text):
    with pytest.raises(EvtcError) as py:
        trace(fn, name="ep")
    with pytest.raises(EvtcError) as ex:
        from_expr(text, name="ep")
    p, e = py.value, ex.value
    # The expression form reports names written wrongly as grammar errors; all else alike.
    if not isinstance(e, GrammarError):
        assert type(p) is type(e), (p, e)
    assert _strip_spelling(p.message) == _strip_spelling(e.message), (p.message, e.message)
    assert (p.hint is None) == (e.hint is None)
    if p.hint:
        assert _strip_spelling(p.hint) == _strip_spelling(e.hint)
    assert p.loc is not None and p.loc.file == __file__ and e.loc is not None and e.loc.file == "<expr>"


def test_no_message_text_is_written_twice_in_the_frontends():
    """The messages both frontends give live in the builder only (issue 9: text.py repeated
    seven of the tracer's)."""
    from pathlib import Path

    root = Path(evtc.__file__).parent / "frontend"
    shared = ["was used inside the epilogue", "needs a constant exponent", "is not a reduction axis",
              "reductions take an M x N value", "not an M x N matrix", "takes one value and reduces it",
              "has the name of a parameter", "can't be named", "not representable",
              "evaluating the constant expression", "at most one accumulator", "the accumulator is f32",
              "vectors come out of reductions", "only complete after every tile"]
    for needle in shared:
        where = [p.name for p in sorted(root.glob("*.py")) if needle in p.read_text()]
        assert where and set(where) <= {"builder.py", "builder_rules.py"}, (needle, where)
