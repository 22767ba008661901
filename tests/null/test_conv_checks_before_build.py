"""NOTE [Checks before builds] for evtc.Conv (evtc/dispatch/conv.py): a call whose kernel is not
built yet has every argument checked (the problem's fields, the geometry of the operands, every
tensor's shape, dtype and device, the names, the kernel's limits) before nvcc runs. Each bad call
here must raise its ArgumentError without a build being asked for (the cache's build entry
points fail the test), on a family Conv, a pinned one and an sm80 one; before, each of them ran
nvcc first (minutes) and only then reported the error, and ``padding=10**30`` was an
OverflowError from ctypes."""

import numpy as np
import pytest

import evtc
from evtc import f16
from evtc.compiler import cache
from test_checks_before_build import EPILOGUE
from test_runtime_launch import Fake

P1 = evtc.ConvProblem(padding=1)


def _args(c=16, k=32):
    """x (2, 8, 8, c), w (k, 3, 3, c) and the epilogue's arguments of y (2, 8, 8, k) with padding 1."""
    return Fake((2, 8, 8, c)), Fake((k, 3, 3, c)), {"C": Fake((2, 8, 8, k)), "alpha": 1.0,
                                                    "bias": Fake((k,), "<f4")}


def _bad_calls():
    x, w, kw = _args()
    return {
        "numpy operands": ((np.zeros((2, 8, 8, 16), np.float16), np.zeros((32, 3, 3, 16), np.float16), kw, P1),
                           "host memory"),
        "missing argument": ((x, w, {k: v for k, v in kw.items() if k != "bias"}, P1), "missing argument 'bias'"),
        "extra argument": ((x, w, {**kw, "beta": 1.0}, P1), "unexpected argument 'beta'"),
        "huge padding": ((x, w, kw, evtc.ConvProblem(padding=10**30)), r"problem: padding = \(10{30}"),
        "huge stride": ((x, w, kw, evtc.ConvProblem(stride=(1, 1 << 40), padding=1)), r"problem: stride = "),
        "channels differ": ((x, Fake((32, 3, 3, 24)), kw, P1), "x has 16 channels and w 24"),
        "3-D activation": ((Fake((2, 8, 16)), w, kw, P1), "argument 'x' has 3 dimensions"),
        "x not packed": ((Fake((2, 8, 8, 16), strides=(8 * 8 * 32, 8 * 32, 32, 1)), w, kw, P1),
                         "argument 'x' is not packed NHWC"),
        "w of another dtype": ((x, Fake((32, 3, 3, 16), "<f4"), kw, P1), "argument 'w' has dtype"),
        "wrong C shape": ((x, w, {**kw, "C": Fake((2, 8, 8, 24))}, P1), r"argument 'C' has shape \(2, 8, 8, 24\)"),
        "wrong bias dtype": ((x, w, {**kw, "bias": Fake((32,))}, P1), "argument 'bias' has dtype"),
        "bias on another device": ((x, w, {**kw, "bias": Fake((32,), "<f4", device=1)}, P1), "cuda:1"),
        "scalar not a number": ((x, w, {**kw, "alpha": "x"}, P1), "argument 'alpha'"),
        "channels off 16 bytes": ((*_args(c=12)[:2], kw, P1), r"C \(input channels\) = 12 is not a multiple of 8"),
        "a filter larger than the input": ((x, Fake((32, 11, 11, 16)), kw, P1), "larger than the padded input"),
    }


def _convs():
    return {
        "family": evtc.Conv(EPILOGUE, kind="fprop", a=f16, c=f16, d=f16, arch="sm90"),
        "pinned": evtc.Conv(EPILOGUE, kind="fprop", a=f16, c=f16, d=f16, arch="sm90", config={"tile": (128, 64, 64)}),
        "sm80": evtc.Conv(EPILOGUE, kind="fprop", a=f16, c=f16, d=f16, arch="sm80"),
    }


@pytest.fixture(scope="module")
def convs():
    return _convs()


@pytest.mark.parametrize("which", ["family", "pinned", "sm80"])
@pytest.mark.parametrize("case", list(_bad_calls()))
def test_a_bad_first_call_is_refused_before_any_build(no_build, convs, case, which):
    (x, w, kw, problem), needle = _bad_calls()[case]
    with pytest.raises(evtc.ArgumentError, match=needle):
        convs[which](x, w, problem=problem, out=Fake((2, 8, 8, 32)), **kw)  # (evtc allocates with torch or cupy)


@pytest.mark.parametrize("case, call, needle", [
    ("a wrong out= shape", lambda x, w, kw: dict(out=Fake((2, 8, 8, 24)), **kw),
     r"argument 'out\['D'\]' has shape \(2, 8, 8, 24\), expected the output's \(2, 8, 8, 32\)"),
    ("out= not a tensor", lambda x, w, kw: dict(out=[Fake((2, 8, 8, 32))], **kw), "is a list, not a device tensor"),
])
def test_bad_outputs_are_refused_before_any_build(no_build, convs, case, call, needle):
    x, w, kw = _args()
    with pytest.raises(evtc.ArgumentError, match=needle):
        convs["family"](x, w, problem=P1, **call(x, w, kw))


def test_the_kernels_limits_are_checked_before_its_build(no_build, convs):
    """The limits of the kernel the call would run on (sm90's TMA im2col padding, strided dgrad's
    input size) are checked before it is built."""
    x, w, kw = _args()
    big = Fake((1, 600, 8, 16))
    with pytest.raises(evtc.ArgumentError, match="padding 300 exceeds 256"):
        convs["family"](big, w, problem=evtc.ConvProblem(padding=(300, 1)), out=Fake((1, 1198, 8, 32)), **kw)
    dgrad = evtc.Conv("D = acc * relu(F)", kind="dgrad", a=f16, c=f16, d=f16, arch="sm90")
    with pytest.raises(evtc.ArgumentError, match="can't tell the input's size from dy"):
        dgrad(Fake((2, 4, 4, 32)), Fake((32, 3, 3, 16)), problem=evtc.ConvProblem(stride=2, padding=1),
              F=Fake((2, 8, 8, 16)))


def test_a_good_call_asks_for_its_build(no_build, monkeypatch):
    """The check is not a refusal of everything: a good call reaches the build of its kernel."""
    asked = []

    def build(source, arch=None, *, name="kernel", **kw):
        asked.append(name)
        raise RuntimeError("stop here")

    monkeypatch.setattr(cache, "build", build)
    conv = _convs()["pinned"]
    x, w, kw = _args()
    with pytest.raises(RuntimeError, match="stop here"):
        conv(x, w, problem=P1, out=Fake((2, 8, 8, 32)), **kw)
    assert asked == [conv.name]
