"""NOTE [Checks before builds] (evtc/dispatch/dispatcher.py): a call whose kernel is not built yet
has every argument checked before nvcc runs. Each bad call here must raise its ArgumentError
without a build being asked for (the cache's build entry points fail the test), on a family
Gemm and on a pinned one, whatever route the problem would take."""

import numpy as np
import pytest

import evtc
from evtc import f16
from evtc.compiler import cache
from test_runtime_launch import Fake, lin_args


EPILOGUE = "D = relu(alpha*acc + C + bias[n])"


def _bad_calls():
    A, B, kw = lin_args(64, 32, 16)
    return {
        "numpy operands": ((np.zeros((64, 16), np.float16), np.zeros((32, 16), np.float16), kw), "host memory"),
        "missing argument": ((A, B, {k: v for k, v in kw.items() if k != "bias"}), "missing argument 'bias'"),
        "extra argument": ((A, B, {**kw, "beta": 1.0}), "unexpected argument 'beta'"),
        "wrong K": ((A, Fake((32, 8)), kw), "K extents differ"),
        "wrong C shape": ((A, B, {**kw, "C": Fake((64, 31))}), "argument 'C' has shape"),
        "wrong bias dtype": ((A, B, {**kw, "bias": Fake((32,), "<f2")}), "argument 'bias' has dtype"),
        "scalar not a number": ((A, B, {**kw, "alpha": "x"}), "argument 'alpha'"),
        "bias on another device": ((A, B, {**kw, "bias": Fake((32,), "<f4", device=1)}), "cuda:1"),
        "1-D A": ((Fake((16,)), B, kw), "2-D or 3-D"),
        "unaligned N and a bad C": ((A, Fake((31, 16)), {**kw, "C": Fake((64, 30)), "bias": Fake((31,), "<f4")}),
                                    "argument 'C' has shape"),
        "unaligned K and a bad bias": ((Fake((64, 15)), Fake((32, 15)), {**kw, "bias": Fake((31,), "<f4")}),
                                       "argument 'bias' has shape"),
    }


@pytest.mark.parametrize("pinned", [False, True], ids=["family", "pinned"])
@pytest.mark.parametrize("case", list(_bad_calls()))
def test_a_bad_first_call_is_refused_before_any_build(no_build, case, pinned):
    g = evtc.Gemm(EPILOGUE, a=f16, b=f16, c=f16, d=f16,
                  config=evtc.GemmConfig() if pinned else None)
    (A, B, kw), needle = _bad_calls()[case]
    N = (B.shape if hasattr(B, "shape") else B.__cuda_array_interface__["shape"])[0]
    with pytest.raises(evtc.ArgumentError, match=needle):
        g(A, B, out=Fake((64, N)), **kw)  # (evtc allocates outputs with torch or cupy only)


def test_a_good_call_asks_for_its_build(no_build, monkeypatch):
    """The check is not a refusal of everything: a good call reaches the build of its member."""
    asked = []

    def build(source, arch=None, *, name="kernel", **kw):
        asked.append(name)
        raise RuntimeError("stop here")

    monkeypatch.setattr(cache, "build", build)
    g = evtc.Gemm(EPILOGUE, a=f16, b=f16, c=f16, d=f16)
    A, B, kw = lin_args(64, 32, 16)
    with pytest.raises(RuntimeError, match="stop here"):
        g(A, B, **kw)
    assert len(asked) == 1 and asked[0].startswith("expr[")
