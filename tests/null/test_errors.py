"""Every user error: its class, its message, the user's location, and no evtc frame shown."""

import os
import traceback
from pathlib import Path

import pytest

import evtc
from evtc import f32

THIS = __file__
#: the evtc package's own folder (not the checkout's: the checkout itself may be called evtc)
EVTC_PACKAGE = str(Path(evtc.__file__).resolve().parent) + os.sep


def _shown(err: BaseException) -> str:
    """What the user sees: the formatted traceback and message."""
    return "".join(traceback.format_exception(type(err), err, err.__traceback__))


def _evtc_frames(err: BaseException) -> list[str]:
    """The frames of the shown traceback (the error's and any chained one's) whose file is
    inside the evtc package."""
    frames = []
    seen = set()
    e: BaseException | None = err
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        frames += [f"{fr.filename}:{fr.lineno}" for fr in traceback.extract_tb(e.__traceback__)
                   if str(Path(fr.filename).resolve()).startswith(EVTC_PACKAGE)]
        e = e.__cause__ or (None if e.__suppress_context__ else e.__context__)
    return frames


def _assert_located(err: evtc.EvtcError, needle: str, epilogue: str) -> None:
    text = str(err)
    assert f"in epilogue '{epilogue}'" in text
    assert err.loc is not None and err.loc.file == THIS
    assert needle in err.loc.text
    assert "^" in text  # a caret under the span
    assert _evtc_frames(err) == [], _shown(err)  # no evtc-internal frame
    assert EVTC_PACKAGE not in _shown(err)
    assert "docs/errors.md#" in text


def test_if_on_traced_value():
    @evtc.epilogue
    def branchy(acc):
        if acc > 0:  # the offending line
            return acc
        return -acc

    with pytest.raises(evtc.TraceError) as ei:
        evtc.Gemm(branchy)
    _assert_located(ei.value, "if acc > 0", "branchy")
    assert "evtc.where" in str(ei.value)


def test_python_max_suggests_maximum():
    @evtc.epilogue
    def pymax(acc, x: evtc.Matrix):
        return max(acc, x)

    with pytest.raises(evtc.TraceError) as ei:
        pymax.graph
    _assert_located(ei.value, "max(acc, x)", "pymax")
    assert "evtc.maximum" in str(ei.value)


def test_math_function_on_traced_value():
    import math

    @evtc.epilogue
    def usesmath(acc):
        return math.exp(acc)

    with pytest.raises(evtc.TraceError) as ei:
        usesmath.graph
    _assert_located(ei.value, "math.exp(acc)", "usesmath")
    assert "evtc.exp" in str(ei.value)


def test_unannotated_parameter():
    @evtc.epilogue
    def noann(acc, bias):
        return acc + bias

    with pytest.raises(evtc.EpilogueSignatureError) as ei:
        noann.graph
    err = ei.value
    assert "bias" in err.message and err.loc is not None and "bias" in err.loc.text
    assert "evtc.RowVector" in str(err)


def test_non_traced_return():
    @evtc.epilogue
    def retconst(acc):
        return 1.0

    with pytest.raises(evtc.TraceError) as ei:
        retconst.graph
    assert "not a traced value" in str(ei.value) and "retconst" in str(ei.value)


def test_tuple_return_needs_names():
    @evtc.epilogue
    def tup(acc):
        return acc, acc

    with pytest.raises(evtc.TraceError, match="outputs need names"):
        tup.graph


def test_reduction_used_inside_epilogue():
    @evtc.epilogue
    def useredux(acc):
        return acc - evtc.max(acc, dim=1)

    with pytest.raises(evtc.TraceError) as ei:
        useredux.graph
    _assert_located(ei.value, "evtc.max(acc, dim=1)", "useredux")
    assert "only be returned" in str(ei.value)


def test_vector_output_is_a_type_error():
    @evtc.epilogue
    def vecout(acc, bias: evtc.RowVector[f32]):
        return {"D": acc, "b": bias * 2}

    with pytest.raises(evtc.EpilogueTypeError) as ei:
        vecout.graph
    assert "row value" in str(ei.value) and ei.value.loc is not None and "bias * 2" in ei.value.loc.text


def test_power_with_traced_exponent():
    @evtc.epilogue
    def powy(acc, x: evtc.Matrix):
        return acc ** x

    with pytest.raises(evtc.TraceError) as ei:
        powy.graph
    _assert_located(ei.value, "acc ** x", "powy")


def test_unknown_attribute_on_traced_value():
    @evtc.epilogue
    def attr(acc):
        return acc.fast_exp()  # (not a torch.Tensor method: acc.exp() reads as a torch-written epilogue)

    with pytest.raises(evtc.TraceError) as ei:
        attr.graph
    _assert_located(ei.value, "acc.fast_exp()", "attr")


def test_elementwise_max_misuse():
    @evtc.epilogue
    def twoargs(acc, x: evtc.Matrix):
        return evtc.max(acc, x)

    with pytest.raises(evtc.TraceError, match="evtc.maximum"):
        twoargs.graph


def test_scalar_reduction_must_be_f32_on_sm90():
    @evtc.epilogue
    def amax16(acc):
        return {"D": acc, "amax": evtc.amax(acc).to(evtc.bf16)}

    with pytest.raises(evtc.LegalizeError) as ei:
        evtc.Gemm(amax16)
    assert "amax" in str(ei.value) and "f32" in str(ei.value)


def test_sm90_needs_an_mn_output():
    @evtc.epilogue
    def onlyredux(acc):
        return {"s": evtc.sum(acc, dim=1)}

    with pytest.raises(evtc.LegalizeError, match="stores D"):
        evtc.Gemm(onlyredux)


def test_fp8_mainloop_on_sm80_is_a_config_error():
    import epilogues as E

    with pytest.raises(evtc.ConfigError, match="sm80"):
        evtc.Gemm(E.linear_combination, a=evtc.e4m3, arch="sm80")


def test_bad_tile_is_a_config_error():
    import epilogues as E

    with pytest.raises(evtc.ConfigError, match="tile M"):
        evtc.Gemm(E.linear_combination, config=evtc.GemmConfig(tile=(96, 128, 64)))


def test_traceback_full_keeps_frames(monkeypatch):
    monkeypatch.setenv("EVTC_TRACEBACK", "full")

    @evtc.epilogue
    def branchy2(acc):
        if acc:
            return acc
        return acc

    with pytest.raises(evtc.TraceError) as ei:
        evtc.Gemm(branchy2)
    assert _evtc_frames(ei.value)  # the check of _assert_located can fail


@pytest.mark.parametrize("where", ["d", "a"])
def test_unknown_dtype_name_is_an_evtc_error(where):
    """A dtype name evtc doesn't know (f64 here) is an EvtcError with the known names, not a bare
    KeyError from a dict lookup."""
    import epilogues as E

    kw = dict(a="bf16", b="bf16", d="bf16")
    kw[where] = "f64"
    with pytest.raises(evtc.UnknownDTypeError) as ei:
        evtc.Gemm(E.bias_relu, **kw)
    msg = str(ei.value)
    assert "unknown dtype 'f64'" in msg and "bf16" in msg and "#type-error" in msg
    assert isinstance(ei.value, KeyError)


def test_empty_dict_return_points_at_the_return_docs():
    @evtc.epilogue
    def nothing(acc):
        return {}

    with pytest.raises(evtc.TraceError) as ei:
        nothing.graph
    assert "empty dict" in str(ei.value) and "#trace-return" in str(ei.value)


def test_unknown_dtype_inside_the_epilogue_is_located_once():
    @evtc.epilogue
    def bad_dtype(acc):
        return acc.to("f64")

    with pytest.raises(evtc.EpilogueTypeError) as ei:
        bad_dtype.graph
    _assert_located(ei.value, 'acc.to("f64")', "bad_dtype")
    text = str(ei.value)
    assert text.count("see docs/errors.md") == 1 and "use one of f32" in text


# ---- issue 37: an unknown evtc.<name> is the expression form's error ---------------------------


def test_typo_in_an_op_name_is_located_with_close_matches():
    @evtc.epilogue
    def typo(acc):
        return evtc.rleu(acc)  # the offending line

    with pytest.raises(evtc.UnsupportedOpError) as ei:
        typo.graph
    _assert_located(ei.value, "evtc.rleu(acc)", "typo")
    text = str(ei.value)
    assert "unknown function 'evtc.rleu'" in text and "did you mean 'evtc.relu'" in text
    assert "functions: abs, amax, clamp" in text and "bug in evtc" not in text
    with pytest.raises(evtc.GrammarError) as ex:  # the expression form says the same
        evtc.from_expr("D = rleu(acc)")
    assert ex.value.message == "unknown function 'rleu'" and "did you mean 'relu'" in ex.value.hint
    # the same list of functions, but evtc.quantize, which only Python epilogues call
    assert ex.value.hint.split("? ")[1] == ei.value.hint.split("? ")[1].replace(" quantize,", "")


def test_unknown_evtc_attribute_is_still_an_attribute_error():
    assert not hasattr(evtc, "rleu") and not hasattr(evtc, "__wrapped__")
    with pytest.raises(ImportError, match="cannot import name 'rleu'"):
        from evtc import rleu  # noqa: F401
    with pytest.raises(AttributeError) as ei:
        evtc.Gemmm  # noqa: B018
    assert isinstance(ei.value, evtc.EvtcError) and "did you mean 'evtc.Gemm'" in str(ei.value)
    assert ei.value.loc is not None and ei.value.loc.file == THIS
