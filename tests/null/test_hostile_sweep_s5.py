"""A hostile-input sweep (fifth round), no GPU and no nvcc: unusual Python in the epilogue frontend
(an annotated ``acc``, ``%`` on a traced value, constants beyond f32 under ``-W error``), the
expression form's ``dim=`` of a name, torch ops of epilogues whose parameter names are Python
keywords, ``GemmConfig.from_json`` of deeply nested text, and the tuner's store when its file is
damaged or holds a record this Gemm can't run. Each case escaped as a raw Python exception, was
accepted into a wrong kernel, or was reported as something else before its fix: now an EvtcError
naming the parameter, line or argument (or, for the store, the model's choice, as for an
unreadable file)."""

from __future__ import annotations

import itertools
import json
import linecache
import warnings

import pytest

import evtc
from evtc.errors import ArgumentError, ConfigError, EpilogueSignatureError, TraceError
from evtc.frontend.trace import trace

LIN = "D = relu(alpha*acc + C + bias[n])"
_counter = itertools.count()


def _define(src: str, **names):
    """The function ``ep`` of ``src``, under a file name linecache knows (so errors show its lines)."""
    filename = f"<s5 {next(_counter)}>"
    linecache.cache[filename] = (len(src), None, src.splitlines(True), filename)
    ns = {"evtc": evtc, **names}
    exec(compile(src, filename, "exec"), ns)
    return ns["ep"]


# ---- the Python frontend -----------------------------------------------------------------------------


@pytest.mark.parametrize("annotation", ["float", "int", "evtc.Scalar[evtc.f32]", "evtc.DeviceScalar",
                                        "evtc.RowVector[evtc.f32]", "evtc.Matrix[evtc.bf16]"])
def test_an_annotated_acc_is_refused_at_its_parameter(annotation):
    # 'acc: float' made a runtime scalar named acc (the IR said 'acc: f32 scalar'): the GEMM's
    # product was never read, and the call asked for acc=...
    ep = _define(f"def ep(acc: {annotation}, C):\n    return acc + C\n")
    with pytest.raises(EpilogueSignatureError, match="parameter 'acc' is annotated") as e:
        trace(ep)
    assert "leave 'acc' unannotated" in e.value.hint and e.value.loc.line == 1
    with pytest.raises(EpilogueSignatureError, match="parameter 'acc' is annotated"):
        evtc.Gemm(ep)


def test_acc_unannotated_and_other_names_annotated_still_trace():
    from evtc.frontend.trace import Acc

    g = trace(_define("def ep(acc, C, alpha: float, n: int):\n    return alpha * acc + n * C\n"))
    assert [(i.name, i.kind) for i in g.inputs] == [("acc", "accumulator"), ("C", "source"), ("alpha", "scalar"),
                                                    ("n", "scalar")]
    for src in ("def ep(x: Acc):\n    return x\n", "def ep(acc: Acc):\n    return acc\n"):
        assert [i.kind for i in trace(_define(src, Acc=Acc)).inputs] == ["accumulator"]


def test_remainder_of_a_traced_value_is_named_as_such():
    # '%' said "'//' (floor division) is not supported", with the hint "use '/' for true division"
    for body in ("acc % 2", "2 % acc"):
        with pytest.raises(TraceError, match=r"'%' \(remainder\) is not supported") as e:
            trace(_define(f"def ep(acc):\n    return {body}\n"))
        assert "'/'" not in (e.value.hint or "")
    with pytest.raises(TraceError, match=r"'//' \(floor division\)"):
        trace(_define("def ep(acc):\n    return acc // 2\n"))


@pytest.mark.parametrize("form", ["python", "expr"])
def test_a_constant_beyond_f32_is_refused_under_warnings_as_errors(form):
    # np.float32(1e308) warned 'overflow encountered in cast' before the constant was refused;
    # under -W error that warning was the error: "evtc raised RuntimeWarning ... while tracing"
    # and, in the expression form, "internal error while reading the text ... a bug in evtc"
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(TraceError, match="1e\\+308 is not representable as a finite f32"):
            if form == "python":
                trace(_define("def ep(acc):\n    return acc * 1e308\n"))
            else:
                evtc.from_expr("D = acc * 1e308")
        assert "mul(acc, 3e+38)" in str(evtc.from_expr("D = acc * 3e38"))  # within f32: still read


# ---- the expression form ------------------------------------------------------------------------------


@pytest.mark.parametrize("dim, shown", [("acc", "dim=acc"), ("alpha", "dim=alpha"), ("bias[n]", "dim=bias"),
                                        ("relu(acc)", "dim=a compute value")])
def test_expression_dim_of_a_value_names_it(dim, shown):
    # "dim=Accumulator(dtype=evtc.f32, name='acc' is not a reduction axis": the node's repr, cut
    with pytest.raises(TraceError) as e:
        evtc.from_expr(f"D = acc; s = sum(acc, dim={dim})")
    assert e.value.message.startswith(f"{shown} is not a reduction axis") and "(dtype=" not in e.value.message
    assert "reduce_sum(acc, dim=1)" in str(evtc.from_expr("D = acc; s = sum(acc, dim=1)"))


# ---- torch ops of epilogues with Python keywords for names -------------------------------------------------


@pytest.mark.parametrize("name", ["import", "def", "is", "lambda", "pass", "with", "NoneType"])
def test_torch_op_refuses_a_python_keyword_for_a_parameter(name):
    # torch's schema parser raised RuntimeError "expected ident but found 'import' here"
    pytest.importorskip("torch")
    g = evtc.Gemm(f"D = acc * {name}")
    with pytest.raises(ArgumentError, match=f"parameter '{name}' can't be named in a torch op schema"):
        g.torch_op()


def test_torch_op_still_takes_names_that_look_like_keywords():
    pytest.importorskip("torch")
    op = evtc.Gemm("D = acc * pass_ + def_[n]").torch_op()
    assert "float pass_" in op.schema and "Tensor def_" in op.schema


# ---- GemmConfig.from_json -------------------------------------------------------------------------------


def test_config_json_nested_too_deeply_is_a_config_error():
    # json's RecursionError escaped
    with pytest.raises(ConfigError, match="nested too deeply"):
        evtc.GemmConfig.from_json("[" * 100_000 + "]" * 100_000)
    assert evtc.GemmConfig.from_json('{"tile": [128, 128, 64]}').tile == (128, 128, 64)


# ---- the tuner's store ---------------------------------------------------------------------------------


@pytest.fixture
def store(tmp_path, monkeypatch):
    from evtc.dispatch.tune import TuneStore

    monkeypatch.setenv("EVTC_CACHE_DIR", str(tmp_path))
    g = evtc.Gemm(LIN)
    s = TuneStore.for_family(g.dispatch.family)
    s.path.parent.mkdir(parents=True, exist_ok=True)
    return g, s


def _choice(g):
    g.dispatch.family.forget_tuning()
    return g.choose(64, 32, 16, device="H200")


@pytest.mark.parametrize("content", [
    '{"format": 2, "choices": []}', '{"format": 2, "choices": {"H200": []}}', '{"format": 2, "choices": {"H200": "x"}}',
    "[" * 100_000 + "]" * 100_000, "null", "[]",
])
def test_a_damaged_tuning_store_is_read_as_empty_and_replaced_by_the_next_put(store, content):
    # 'list' object has no attribute 'get' (and RecursionError) from every choice of the Gemm,
    # on every call on a GPU; put() failed the same way
    from evtc.dispatch.tune import STORE_FORMAT, record_of, shape_bucket

    g, s = store
    model = g.choose(64, 32, 16)
    s.path.write_text(content)
    assert _choice(g) == model
    tuned = g.dispatch.family.members["streamk"]
    type(s)(s.path).put(shape_bucket(64, 32, 16), "H200", record_of(tuned))
    assert json.loads(s.path.read_text())["format"] == STORE_FORMAT
    assert _choice(g) == tuned


@pytest.mark.parametrize("change", [{"arch": "sm80"}, {"arch": None}, {"config": {"tile": [[1]]}},
                                    {"config": {"stages": 1e999}}, {"config": {"swizzle": 99}}])
def test_a_tuned_record_this_gemm_cannot_run_is_not_chosen(store, change):
    # an sm80 record was chosen for an sm90 Gemm (and built as an sm80 kernel); a config that
    # does not validate failed every call with a ConfigError about a config nobody passed
    from evtc.dispatch.tune import record_of, shape_bucket

    g, s = store
    model = g.choose(64, 32, 16)
    tuned = g.dispatch.family.members["streamk"]
    rec = dict(record_of(tuned))
    s.put(shape_bucket(64, 32, 16), "H200", rec)
    assert _choice(g) == tuned  # the record as stored is chosen
    bad = dict(rec, **{k: v for k, v in change.items() if k != "config"})
    if "config" in change:
        bad["config"] = dict(rec["config"], **change["config"])
    type(s)(s.path).put(shape_bucket(64, 32, 16), "H200", bad)
    assert _choice(g) == model


# ---- evtc cache prune --------------------------------------------------------------------------------------


@pytest.mark.parametrize("option, value", [("--max-size", "10XB"), ("--max-size", "-1"), ("--older-than", "soon"),
                                           ("--older-than", "-3d")])
def test_cache_prune_reads_its_options_without_a_cache_too(tmp_path, option, value):
    # with no cache folder, 'evtc cache prune --max-size 10XB' said "no kernel cache at ..." and
    # exited 0: the malformed option was never read
    from click.testing import CliRunner

    from evtc.cli import main

    r = CliRunner().invoke(main, ["cache", "--dir", str(tmp_path / "none"), "prune", option, value])
    assert r.exit_code == 2 and "Invalid value" in r.output and value in r.output, r.output
    r = CliRunner().invoke(main, ["cache", "--dir", str(tmp_path / "none"), "prune", "--max-size", "5G"])
    assert r.exit_code == 0 and "no kernel cache at" in r.output, r.output
    assert not (tmp_path / "none").exists()


@pytest.mark.parametrize("text, says", [("D = acc * NaN", "writes it nan"), ("D = acc * Infinity", "writes it inf"),
                                        ("D = acc + True", "no booleans or None"), ("D = acc * None", "or None")])
def test_expression_names_that_look_like_constants_are_refused(text, says):
    """`D = acc * NaN` made a runtime scalar named NaN (the expression form writes nan and inf in
    lower case, and has no booleans or None); `nan` itself is still the number."""
    from evtc.errors import GrammarError

    with pytest.raises(GrammarError, match=says):
        evtc.Gemm(text, a="bf16")
    assert "inf" in str(evtc.Gemm("D = maximum(acc, -inf)", a="bf16").graph)  # the number still reads


@pytest.mark.parametrize("body", [lambda acc: acc.T * 2, lambda acc: acc.t() + 1, lambda acc: acc.transpose(0, 1)])
def test_a_transpose_in_an_epilogue_is_named(body):
    """`acc.T` was refused as "torch op aten.permute.default has no evtc lowering", an op the user
    did not write; it is a transpose, and the message says what to do instead."""
    from evtc.errors import UnsupportedOpError

    def ep(acc):
        return body(acc)

    with pytest.raises(UnsupportedOpError, match=r"a transpose \(\.T") as e:
        evtc.Gemm(ep, a="bf16")
    assert "transpose the GEMM's operands" in str(e.value)
