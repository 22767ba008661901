"""Only EvtcErrors leave the frontends (issue 10): every form a Python epilogue can take either
traces or gives a clear located error, and random, partly invalid epilogues, written both as
Python functions and as expressions, raise nothing but EvtcError subclasses from ``trace``,
``from_expr`` and ``parse_ir``; random ``evtc emit`` options and ``--plan`` JSON end in a message
with status 2 or a written file (issue 37)."""

from __future__ import annotations

import functools
import linecache
import math
import warnings

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import evtc
from evtc.errors import EpilogueSignatureError, EvtcError, TraceError
from evtc.frontend.text import from_expr, parse_ir
from evtc.frontend.trace import trace
from evtc.ir import print_graph

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)

_counter = iter(range(10**9))


def _define(source: str, ns: dict | None = None):
    """Define the function ``ep`` from ``source`` under a file name linecache knows, so the
    tracer can point at its lines."""
    filename = f"<fuzz {next(_counter)}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = {"evtc": evtc, "math": math, **(ns or {})}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SyntaxWarning)  # e.g. "0.5[0]" in generated code
        code = compile(source, filename, "exec", dont_inherit=True)
    exec(code, namespace)
    return namespace["ep"], filename


# ---------------------------------------------------------------------------------------------
# The forms a function can take
# ---------------------------------------------------------------------------------------------


def test_positional_only_parameters_are_supported():
    """issue 10: 'def ep(acc, /)' raised a TypeError (the tracer called fn(**proxies))."""
    def ep(acc, alpha: float, /, beta: float):
        return acc * alpha + beta

    g = trace(ep)
    assert [i.name for i in g.inputs] == ["acc", "alpha", "beta"]


def test_keyword_only_parameters_and_defaults_are_inputs():
    def ep(acc, *, alpha: float = 2.0, bias: evtc.RowVector[evtc.f32] = None):
        return acc * alpha + bias

    g = trace(ep)
    assert [(i.name, i.kind) for i in g.inputs] == [("acc", "accumulator"), ("alpha", "scalar"), ("bias", "row")]


def test_default_without_annotation_explains_itself():
    def ep(acc, k=2.0):
        return acc * k

    with pytest.raises(EpilogueSignatureError) as ei:
        trace(ep)
    assert "parameter 'k'" in ei.value.message and "functools.partial" in ei.value.hint
    assert ei.value.loc.text.strip().startswith("def ep(acc, k=2.0)")


@pytest.mark.parametrize("sig,stars", [("acc, *rest", "*rest"), ("acc, **kw", "**kw"), ("acc, *rest: float", "*rest"),
                                       ("*acc", "*acc")])
def test_var_parameters_are_refused(sig, stars):
    ep, filename = _define(f"def ep({sig}):\n    return 1\n")
    with pytest.raises(EpilogueSignatureError) as ei:
        trace(ep)
    assert f"parameter '{stars}' can't be traced" in ei.value.message
    assert ei.value.loc.file == filename and ei.value.loc.line == 1


def test_lambda():
    g = trace(lambda acc: acc * 2.0)
    assert g.name == "lambda" and str(g).splitlines()[1] == "  %0 = mul(acc, 2.0) : f32"


def test_partial_binds_constants():
    def ep(acc, alpha: float, k: float):
        return acc * alpha + k

    g = trace(functools.partial(ep, k=0.5))
    assert [i.name for i in g.inputs] == ["acc", "alpha"] and "add(%0, 0.5)" in str(g)
    assert g.name == "ep"
    g2 = trace(functools.partial(functools.partial(ep, k=0.5), alpha=3.0))
    assert [i.name for i in g2.inputs] == ["acc"]


def test_methods_and_callable_objects():
    class Scale:
        def __init__(self, k):
            self.k = k

        def method(self, acc, bias: evtc.RowVector[evtc.f32]):
            return acc * self.k + bias

        def __call__(self, acc):
            return acc * self.k

        @staticmethod
        def static(acc):
            return -acc

    s = Scale(3.0)
    assert [i.name for i in trace(s.method).inputs] == ["acc", "bias"]
    g = trace(s)
    assert g.name == "Scale" and "mul(acc, 3.0)" in str(g)
    assert "neg(acc)" in str(trace(Scale.static))
    with pytest.raises(EpilogueSignatureError, match="can't be named 'self'.*bound method"):
        trace(Scale.method)  # the unbound function: 'self' is a parameter too


def test_a_class_is_not_an_epilogue():
    class NotAnEpilogue:
        def __init__(self, acc):
            self.acc = acc

    with pytest.raises(TraceError, match="returned NotAnEpilogue"):
        trace(NotAnEpilogue)


@pytest.mark.parametrize("obj", [42, "D = acc", 1.5])
def test_non_callables_are_refused_at_the_decorator(obj):
    with pytest.raises(EpilogueSignatureError, match="evtc.epilogue takes a function"):
        evtc.epilogue(obj)


def test_builtins_without_signature():
    with pytest.raises(EpilogueSignatureError):
        trace(max)  # no signature Python can read
    with pytest.raises(EpilogueSignatureError, match="parameter 'x'"):
        trace(abs)


def test_async_and_generator_functions():
    async def co(acc):
        return acc

    def gen(acc):
        yield acc

    for fn in (co, gen):
        with pytest.raises(TraceError, match="not a traced value"):
            trace(fn)


@pytest.mark.parametrize("body,exc", [("return acc * undefined_name", "NameError"),
                                      ("return acc * (1 / 0)", "ZeroDivisionError"),
                                      ("assert False, 'no'\n    return acc", "AssertionError"),
                                      ("return acc()", "TypeError"), ("return [1][acc]", "TraceError"),
                                      ("return helper(acc)", "RecursionError")])
def test_exceptions_raised_by_the_function_are_located_trace_errors(body, exc):
    def helper(x):
        return helper(x)

    ep, filename = _define(f"def ep(acc):\n    {body}\n", {"helper": helper})
    with pytest.raises(TraceError) as ei:
        trace(ep)
    err = ei.value
    assert exc in err.message or exc == "TraceError"
    if exc == "RecursionError":  # the innermost user frame: the helper that recursed
        assert err.loc.file == __file__ and "return helper(x)" in err.loc.text
    else:
        assert err.loc is not None and err.loc.file == filename and err.loc.line in (2, 3)


def test_failing_string_annotation():
    ep, filename = _define("def ep(acc, x: 'NoSuchType'):\n    return acc\n")
    with pytest.raises(EpilogueSignatureError, match="could not be evaluated"):
        trace(ep)


# ---------------------------------------------------------------------------------------------
# Random epilogues in both syntaxes
# ---------------------------------------------------------------------------------------------

#: parameter: (python declaration, expression reference)
PARAMS = [
    ("acc", "acc"), ("C", "C"), ("alpha: float", "alpha"), ("bias: evtc.RowVector[evtc.f32]", "bias[n]"),
    ("scale: evtc.ColVector[evtc.f32]", "scale[m]"), ("R: evtc.Matrix", "R[m, n]"),
    ("s: evtc.DeviceScalar[evtc.f32]", "s"), ("h: evtc.Matrix[evtc.f16]", "h[m, n]:f16"),
    # invalid ones
    ("A: evtc.Matrix", "A[m, n]"), ("out: float", "out"), ("x", "x[k]"), ("k: str", "k:f64"),
    ("C2: evtc.Source", "C[m]"), ("int: float", "int"), ("acc2: evtc.Matrix", "acc[n]"),
]
CONSTS = ["2", "0.5", "1e-3", "inf", "nan", "1e39", "10**400", "3.4e38", "-0.0", "7"]
UNARY = ["relu", "gelu", "exp", "sigmoid", "abs", "sqrt", "nope", "tanh"]
BINARY_FNS = ["maximum", "minimum", "where", "max", "min", "leaky_relu", "pow"]
OPS = ["+", "-", "*", "/", "**", "<", ">=", "==", "!=", "//", "%", "@"]
REDUCERS = ["sum", "max", "min", "amax"]
DIMS = [None, 0, 1, -1, -2, 2, "1.5"]
DTYPES = ["f16", "bf16", "e4m3", "f32", "f64"]
KEYS = ["D", "E", "row", "A", "int", "a b", "3", "_t", "acc", "out"]


@st.composite
def expressions(draw, n_params: int, depth: int = 0):
    """An expression tree over parameters 0..n_params-1, as a nested tuple."""
    leaf = depth >= 3 or draw(st.integers(0, 3)) == 0
    if leaf:
        if n_params and draw(st.booleans()):
            return ("param", draw(st.integers(0, n_params - 1)))
        return ("const", draw(st.sampled_from(CONSTS)))
    kind = draw(st.sampled_from(["op", "op", "unary", "neg", "fn2", "reduce", "to", "where3", "python_only"]))
    sub = expressions(n_params, depth + 1)
    if kind == "op":
        return ("op", draw(st.sampled_from(OPS)), draw(sub), draw(sub))
    if kind == "unary":
        return ("call", draw(st.sampled_from(UNARY)), (draw(sub),))
    if kind == "neg":
        return ("neg", draw(sub))
    if kind == "fn2":
        return ("call", draw(st.sampled_from(BINARY_FNS)), (draw(sub), draw(sub)))
    if kind == "where3":
        return ("call", "where", (draw(sub), draw(sub), draw(sub)))
    if kind == "reduce":
        return ("reduce", draw(st.sampled_from(REDUCERS)), draw(sub), draw(st.sampled_from(DIMS)))
    if kind == "to":
        return ("to", draw(sub), draw(st.sampled_from(DTYPES)))
    return ("python_only", draw(st.sampled_from(["len", "index", "if", "float", "math", "str", "list", "attr"])),
            draw(sub))


def _int_valued(e) -> bool:
    """Whether Python evaluates ``e`` to an int before evtc sees it (integer constants under
    + - * // % and negation)."""
    if e[0] == "const":
        return e[1] in ("2", "7", "10**400")
    if e[0] == "neg":
        return _int_valued(e[1])
    return e[0] == "op" and e[1] in ("+", "-", "*", "//", "%") and _int_valued(e[2]) and _int_valued(e[3])


def to_python(e, params) -> str:
    kind = e[0]
    if kind == "param":
        return params[e[1]][0].split(":")[0]
    if kind == "const":
        return {"inf": "float('inf')", "nan": "float('nan')", "10**400": "(10**400)"}.get(e[1], e[1])
    if kind == "op":
        a, b = to_python(e[2], params), to_python(e[3], params)
        if e[1] == "**" and _int_valued(e[3]):
            # Python itself computes int ** int exactly and without bound (7 ** 10**400 runs
            # until memory is gone) in the user's own function, before evtc is called: a float
            # exponent keeps such a program's Python finite (float(10**400) raises OverflowError,
            # which the tracer reports as a located TraceError)
            b = f"float({b})"
        return f"({a} {e[1]} {b})"
    if kind == "neg":
        return f"(-{to_python(e[1], params)})"
    if kind == "call":
        return f"evtc.{e[1]}({', '.join(to_python(a, params) for a in e[2])})"
    if kind == "reduce":
        dim = "" if e[3] is None else f", dim={e[3]}"
        return f"evtc.{e[1]}({to_python(e[2], params)}{dim})"
    if kind == "to":
        return f"evtc.to({to_python(e[1], params)}, {e[2]!r})"
    inner = to_python(e[2], params)
    return {"len": f"len({inner})", "index": f"({inner})[0]", "if": f"(1.0 if {inner} else 2.0)",
            "float": f"float({inner})", "math": f"math.exp({inner})", "str": f"({inner} * 'x')",
            "list": f"([{inner}] * 2)", "attr": f"({inner}).exp()"}[e[1]]


def to_expr(e, params) -> str:
    kind = e[0]
    if kind == "param":
        return params[e[1]][1]
    if kind == "const":
        return e[1]
    if kind == "op":
        return f"({to_expr(e[2], params)} {e[1]} {to_expr(e[3], params)})"
    if kind == "neg":
        return f"(-{to_expr(e[1], params)})"
    if kind == "call":
        return f"{e[1]}({', '.join(to_expr(a, params) for a in e[2])})"
    if kind == "reduce":
        dim = "" if e[3] is None else f", dim={e[3]}"
        return f"{e[1]}({to_expr(e[2], params)}{dim})"
    if kind == "to":
        return f"to({to_expr(e[1], params)}, {e[2]})"
    inner = to_expr(e[2], params)
    return {"len": f"len({inner})", "index": f"{inner}[0]", "if": f"(1.0 if {inner} else 2.0)",
            "float": f"float({inner})", "math": f"math.exp({inner})", "str": f"({inner} * 'x')",
            "list": f"[{inner}]", "attr": f"{inner}.exp()"}[e[1]]


@st.composite
def programs(draw):
    params = draw(st.lists(st.sampled_from(PARAMS), min_size=0, max_size=5, unique=True))
    n = len(params)
    shape = draw(st.sampled_from(["dict", "dict", "bare", "tuple", "const"]))
    outputs = [(draw(st.sampled_from(KEYS)), draw(expressions(n))) for _ in range(draw(st.integers(1, 3)))]
    return params, shape, outputs


def render(program) -> tuple[str, str]:
    params, shape, outputs = program
    sig = ", ".join(p[0] for p in params)
    if shape == "bare":
        ret = to_python(outputs[0][1], params)
    elif shape == "tuple":
        ret = "(" + ", ".join(to_python(e, params) for _, e in outputs) + ",)"
    elif shape == "const":
        ret = "1.5"
    else:
        ret = "{" + ", ".join(f"{k if k.isdigit() else repr(k)}: {to_python(e, params)}" for k, e in outputs) + "}"
    python = f"def ep({sig}):\n    return {ret}\n"
    expr = "\n".join(f"{k} = {to_expr(e, params)}" for k, e in outputs)
    return python, expr


def _only_evtc_errors(build):
    try:
        g = build()
    except EvtcError as err:
        assert "internal error" not in err.message, err
        str(err)
        return None
    text = print_graph(g)
    assert print_graph(parse_ir(text)) == text
    return g


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # numpy on the constants of random code (nan % x)
@SETTINGS
@given(programs())
def test_random_epilogues_raise_only_evtc_errors(program):
    python, expr = render(program)
    ep, _ = _define(python)
    _only_evtc_errors(lambda: trace(ep, name="fuzz"))
    _only_evtc_errors(lambda: from_expr(expr, name="fuzz"))
    _only_evtc_errors(lambda: evtc.epilogue(ep).graph)


@SETTINGS
@given(programs(), st.data())
def test_random_ir_text_raises_only_evtc_errors(program, data):
    _, expr = render(program)
    try:
        g = from_expr(expr, name="fuzz")
    except EvtcError:
        g = from_expr("D = relu(acc * alpha + bias[n])", name="fuzz")
    text = str(g)
    pos = data.draw(st.integers(0, len(text)))
    insert = data.draw(st.sampled_from(["", "A", "int", "é", "__x", "1e39", "9" * 400, ": aux", "%0", "(", ")",
                                        "\n  B = store(acc) : bf16", ", out: f32 scalar", "reduce_max"]))
    cut = data.draw(st.integers(0, 4))
    _only_evtc_errors(lambda: parse_ir(text[:pos] + insert + text[pos + cut:]))


def test_negating_a_folded_comparison_is_a_located_error():
    """Found by test_random_epilogues_raise_only_evtc_errors: ``-(2 < relu(2))`` folds to numpy's
    bool, which has no ``-``. Both frontends give a located TraceError (the text frontend had
    called it an internal error)."""
    from evtc.frontend.text import from_expr

    with pytest.raises(TraceError) as text_err:
        from_expr("D = (-(2 < relu(2)))", name="fuzz")
    assert "internal error" not in text_err.value.message and "<expr>:1:6" in str(text_err.value)
    ep, _ = _define("def ep():\n    return {'D': (-(2 < evtc.relu(2)))}\n")
    with pytest.raises(TraceError) as py_err:
        trace(ep, name="fuzz")
    assert "internal error" not in py_err.value.message


#: found by test_random_ir_text_raises_only_evtc_errors: '9' * 400 written over the '%' of
#: 'store(%2)', so the operand is a 401-digit integer literal
_HUGE_INT_IR = ("epilogue fuzz(acc: f32 accumulator, alpha: f32 scalar, bias: f32 row):\n"
                "  %0 = mul(acc, alpha) : f32\n  %1 = add(%0, bias) : f32\n  %2 = relu(%1) : f32\n"
                "  D = store(" + "9" * 400 + "2) : bf16\n")


@pytest.mark.parametrize("text,col", [
    (_HUGE_INT_IR, 13),
    ("epilogue e(acc: f32 accumulator):\n  %0 = mul(-" + "9" * 400 + ", acc) : f32\n  D = store(%0) : bf16\n", 13),
    ("epilogue e(acc: f32 accumulator):\n  %0 = relu(acc) {k=" + "9" * 400 + "} : f32\n  D = store(%0) : bf16\n",
     21),
    ("epilogue e(acc: f32 accumulator):\n  D = reduce_sum(acc, dim=" + "9" * 400 + ") : f32\n", 27),
], ids=["fuzz-store-operand", "negative-operand", "attribute", "dim"])
def test_ir_integer_literal_too_large_for_a_float(text, col):
    """An integer literal no float can hold was read with float() and raised OverflowError,
    reported as 'internal error while reading the text: OverflowError: int too large to convert
    to float'; it is now refused at the literal like any constant that is not an f32."""
    with pytest.raises(evtc.GrammarError) as ei:
        parse_ir(text)
    err = ei.value
    assert "internal error" not in err.message
    assert err.message.startswith("the constant ~10**40") and "not representable as a finite f32" in err.message
    assert err.hint and "f32's range" in err.hint
    assert err.loc.line in (2, 5) and err.loc.col + 1 == col
    str(err)


def test_ir_large_finite_constant_is_read_as_written():
    """A literal float() can hold but f32 can't is read (the verifier reports it), not refused."""
    g = parse_ir("epilogue e(acc: f32 accumulator):\n  %0 = mul(acc, " + "9" * 300 + ") : f32\n"
                 "  D = store(%0) : bf16\n")
    assert "mul(acc, 1e+300)" in str(g)


@pytest.mark.parametrize("fn,arg", [(parse_ir, None), (parse_ir, b"epilogue e(acc: f32 accumulator):\n"),
                                    (from_expr, 3), (from_expr, b"D = acc")])
def test_text_entry_points_take_only_text(fn, arg):
    with pytest.raises(evtc.GrammarError, match="is a str, not"):
        fn(arg)


@pytest.mark.parametrize("kw", [dict(name=3), dict(name="a.b"), dict(d="f64"), dict(c=object())])
def test_expression_arguments_are_checked(kw):
    with pytest.raises(EvtcError):
        from_expr("D = acc", **kw)


def test_reducing_a_number_is_a_type_error_in_both_frontends():
    def ep(acc):
        return acc * evtc.sum(2.0, dim=1)

    with pytest.raises(evtc.EpilogueTypeError, match="reducing a constant") as ei:
        trace(ep)
    assert ei.value.epilogue == "ep" and ei.value.loc.file == __file__
    with pytest.raises(evtc.EpilogueTypeError, match="reducing a constant"):
        from_expr("D = acc; s = sum(2.0, dim=1)")


def test_an_error_inside_evtc_is_told_apart_from_the_functions_own(monkeypatch):
    from evtc import dtypes
    from evtc.frontend import builder

    # a builder method that fails inside evtc (round_to of something that is not an array)
    monkeypatch.setattr(builder.IRBuilder, "negate", lambda self, x, loc: dtypes.round_to(object(), None))
    with pytest.raises(TraceError) as ei:
        trace(lambda acc: -acc)
    assert ei.value.message.startswith("evtc raised ") and "bug in evtc" in ei.value.hint
    assert ei.value.loc.file == __file__
    with pytest.raises(TraceError) as ei:
        trace(lambda acc: acc * {}["missing"])
    assert ei.value.message == "the epilogue function raised KeyError: 'missing'"


# ---------------------------------------------------------------------------------------------
# The command line's options (issue 37): a message and status 2, or a written file; never a
# traceback, never status 0 with nothing written
# ---------------------------------------------------------------------------------------------

_JSON = st.recursive(st.none() | st.booleans() | st.integers(-3, 300) | st.floats(allow_nan=False) |
                     st.sampled_from(["X", "D", "C", "evtc", "cutlass", ""]),
                     lambda inner: st.lists(inner, max_size=3), max_leaves=6)
_PLAN_KEYS = ["policy", "c_slot", "d_slot", "epilogue_tile", "stages_c", "stages_d", "reuse", "direct", "share",
              "alias", "stages"]
_OPTIONS = st.sampled_from([
    ("--conv", "fprop"), ("--conv", "wgrad"), ("--fragment",), ("--dims", "3"), ("--dims", "4"), ("--name", "X"),
    ("--name", "1bad"), ("--namespace", "ns"), ("--print-includes",), ("--print-nvcc",), ("--arch", "sm80"),
    ("--tile", "128x128x64"), ("--tile", "0x1x1"), ("--tile", "axb"), ("--cluster", "1x1"), ("--cluster", "3x1"),
    ("--epilogue-tile", "128x32"), ("--stages", "1"), ("--stages", "9"), ("--scheduler", "streamk"),
    ("--schedule", "pingpong"), ("--a", "e5m2"), ("--d", "e4m3"), ("--plan", "cutlass"), ("--plan", "[1]"),
    ("--plan", "{"),
])


@pytest.mark.filterwarnings("ignore")
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], database=None)
@given(st.lists(_OPTIONS, max_size=3), st.none() | st.dictionaries(st.sampled_from(_PLAN_KEYS), _JSON, max_size=3))
def test_random_cli_options_fail_only_as_messages(tmp_path_factory, options, plan):
    import json

    from click.testing import CliRunner

    from evtc.cli import main

    out = tmp_path_factory.mktemp("cli") / "k.cu"
    args = ["emit", "--expr", "D = relu(acc + C); F = acc * bias[n]", "-o", str(out)]
    for opt in options:
        args += list(opt)
    if plan is not None:
        args += ["--plan", json.dumps(plan)]
    r = CliRunner().invoke(main, args)
    assert r.exception is None or isinstance(r.exception, SystemExit), (args, r.output, r.exception)
    assert "Traceback" not in r.output, (args, r.output)
    if r.exit_code == 0:
        printed = any(o[0] in ("--print-includes", "--print-nvcc") for o in options)
        assert printed or (out.is_file() and out.stat().st_size > 0), (args, r.output)
    else:
        assert r.exit_code == 2 and ("evtc: " in r.output or "Error: " in r.output), (args, r.output)
