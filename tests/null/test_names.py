"""Names that reach emitted C++ (evtc/ir/names.py, checked by the builder in every frontend):
reserved names (issue 9), injected text (issue 10), and what is still accepted."""

from __future__ import annotations

import linecache
import re

import pytest

import evtc
from evtc import f32
from evtc.errors import EpilogueSignatureError, EvtcError, GrammarError, TraceError
from evtc.frontend.text import from_expr, parse_ir
from evtc.ir.names import MAX_NAME_LENGTH, name_problem

HEADER = "epilogue e(acc: f32 accumulator{params}):\n"

BAD_NAMES = {
    "x\n#error injected": "is not an identifier",
    "a-b": "is not an identifier",
    "1x": "is not an identifier",
    "../x": "is not an identifier",
    "": "is not an identifier",
    "é": "is not ASCII",
    "int": "is a C++ keyword",
    "class": "is a C++ keyword",
    "and": "is a C++ keyword",
    "__shared__": "is reserved in C++",
    "_Bias": "is reserved in C++",
    "NULL": "macro",
    "CUTLASS_DEVICE": "macro",
    "x" * (MAX_NAME_LENGTH + 1): f"longer than {MAX_NAME_LENGTH}",
}
GOOD_NAMES = ["bias", "D", "F2", "row_max", "_t", "x" * MAX_NAME_LENGTH, "out_scale", "lambda", "kernel",
              "M", "N", "K", "L", "p_A", "alpha_"]


def _define(source: str, name: str = "ep"):
    """Define a function from ``source`` under a file name linecache knows (so the tracer can
    show its lines)."""
    filename = f"<test_names {abs(hash(source))}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    ns: dict = {"evtc": evtc}
    exec(compile(source, filename, "exec", dont_inherit=True), ns)
    return ns[name]


@pytest.mark.parametrize("name,problem", BAD_NAMES.items(), ids=repr)
def test_name_problem(name, problem):
    assert problem in name_problem(name)


@pytest.mark.parametrize("name", GOOD_NAMES)
def test_names_that_are_fine(name):
    assert name_problem(name) is None


# ---- the epilogue's own name ---------------------------------------------------------------------


def test_decorator_name_with_cxx_is_refused_before_anything_is_emitted():
    """issue 10: @evtc.epilogue(name="x\\n#error injected") put raw C++ into the .cu."""
    @evtc.epilogue(name="x\n#error injected")
    def ep(acc):
        return acc

    with pytest.raises(EpilogueSignatureError) as ei:
        evtc.Gemm(ep)
    err = ei.value
    assert "epilogue name 'x\\n#error injected' is not an identifier" in err.message
    assert err.loc is not None and err.loc.file == __file__ and "def ep(acc)" in err.loc.text
    assert "#names" in str(err) and "\n#error" not in str(err)


@pytest.mark.parametrize("name", ["x\ny", "../../etc/x", "int", "é"])
def test_expression_and_ir_names_are_checked(name):
    with pytest.raises(EpilogueSignatureError, match="epilogue name"):
        from_expr("D = acc", name=name)
    if name.isidentifier():  # the IR grammar only reads words
        with pytest.raises(GrammarError, match="epilogue name") as ei:
            parse_ir(f"epilogue {name}(acc: f32 accumulator):\n  D = store(acc) : bf16\n")
        assert (ei.value.loc.line, ei.value.loc.col) == (1, 9)


def test_lambdas_and_callables_get_identifier_names():
    assert evtc.epilogue(lambda acc: acc * 2).graph.name == "lambda"

    class Scaled:
        def __call__(self, acc):
            return acc * 2

    assert evtc.epilogue(Scaled()).graph.name == "Scaled"
    src = evtc.Gemm(lambda acc: acc * 2).source
    assert "<lambda>" not in src


# ---- parameters ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name,problem", [(n, p) for n, p in BAD_NAMES.items()
                                          if n.isidentifier() and n not in ("and", "class")], ids=repr)
def test_bad_parameter_names_in_every_frontend(name, problem):
    ep = _define(f"def ep(acc, {name}: float):\n    return acc * {name}\n")
    with pytest.raises(EpilogueSignatureError) as ei:
        evtc.epilogue(ep).graph
    assert f"parameter name '{name[:36]}" in ei.value.message and problem in ei.value.message
    assert ei.value.anchor == "names"
    with pytest.raises(GrammarError, match=re.escape(problem)):
        from_expr(f"D = acc * {name}")
    with pytest.raises(GrammarError, match=re.escape(problem)):
        parse_ir(HEADER.format(params=f", {name}: f32 scalar") + "  D = store(acc) : bf16\n")


@pytest.mark.parametrize("name", ["A", "B", "out", "stream", "self"])
def test_reserved_parameter_names_are_refused_at_the_parameter(name):
    """issue 9: a parameter named A or B gave duplicate p_A/ld_A/bs_A fields and an nvcc error;
    out or stream could not be passed to Gemm.__call__."""
    ep = _define(f"def ep(acc, {name}: evtc.Matrix):\n    return acc + {name}\n")
    with pytest.raises(EpilogueSignatureError) as ei:
        evtc.Gemm(evtc.epilogue(ep))
    err = ei.value
    assert f"a parameter can't be named '{name}'" in err.message and "Gemm.__call__" in err.message
    assert err.loc is not None and err.loc.col == len("def ep(acc, ")
    with pytest.raises(GrammarError, match=f"can't be named '{name}'") as ei:
        from_expr(f"D = acc + {name}[m, n]")
    assert ei.value.loc.col == 10
    with pytest.raises(GrammarError, match=f"can't be named '{name}'"):
        parse_ir(HEADER.format(params=f", {name}: bf16 aux") + "  D = store(acc) : bf16\n")


@pytest.mark.parametrize("name", ["A", "B"])
def test_reserved_output_names(name):
    @evtc.epilogue
    def ep(acc):
        return {"D": acc, name: acc * 2}

    with pytest.raises(TraceError) as ei:
        evtc.Gemm(ep)
    assert f"an output can't be named '{name}'" in ei.value.message and ei.value.loc.file == __file__
    with pytest.raises(GrammarError, match=f"an output can't be named '{name}'") as ei:
        from_expr(f"D = acc\n{name} = acc * 2")
    assert (ei.value.loc.line, ei.value.loc.col) == (2, 0)
    with pytest.raises(GrammarError, match=f"an output can't be named '{name}'"):
        parse_ir(HEADER.format(params="") + f"  {name} = store(acc) : bf16\n")


def test_out_and_stream_are_fine_as_output_names():
    g = from_expr("out = acc; stream = relu(acc)")
    assert [o.name for o in g.outputs] == ["out", "stream"]
    fields = [f.name for f in evtc.abi.abi_fields(g, "sm90")]
    assert len(fields) == len(set(fields))


@pytest.mark.parametrize("key,problem", [("int", "C++ keyword"), ("__x", "reserved in C++"), ("a b", "identifier"),
                                         (3, "identifier"), ("é", "ASCII")])
def test_bad_output_keys(key, problem):
    @evtc.epilogue
    def ep(acc):
        return {"D": acc, key: acc}

    with pytest.raises(TraceError, match=re.escape(problem)) as ei:
        ep.graph
    assert "output name" in ei.value.message and ei.value.anchor == "names"
    assert ei.value.loc.file == __file__ and "def ep" in ei.value.loc.text


def test_every_accepted_name_gives_unique_abi_fields():
    """What the reserved names protect: the C argument struct of any epilogue the frontends
    accept has no duplicate field."""
    import epilogues

    for ep in epilogues.REFERENCE.values():
        for arch in ("sm90", "sm80"):
            fields = [f.name for f in evtc.abi.abi_fields(ep.graph, arch)]
            assert len(fields) == len(set(fields)), (ep.name, arch)


def test_name_errors_are_evtc_errors_with_the_names_anchor():
    for text in ("D = acc * NULL", "int = acc"):
        with pytest.raises(EvtcError) as ei:
            from_expr(text)
        assert "docs/errors.md#names" in str(ei.value)


def test_parameters_still_listed_for_good_names():
    @evtc.epilogue
    def ep(acc, alpha: float, bias: evtc.RowVector[f32]):
        return acc * alpha + bias

    assert [n for n, _ in ep.parameters] == ["acc", "alpha", "bias"]
