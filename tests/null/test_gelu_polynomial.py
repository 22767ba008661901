"""NOTE [GELU without erff] (codegen_templates/include/evtc/functors.hpp): the polynomial the
kernels evaluate, read from the header, meets the NOTE's claims on the CPU
(benchmarks/micro/gelu_fit.py's float32 Horner as the device does it, ex2.approx's 2 ulp added):
h = 2^Q(t) within 7.2 u of 0.5 erfc(t / sqrt 2) on [0, 8], and Q decreasing out to 1e38 (no
clamp needed). The device's own evaluation over all 2^32 inputs is
benchmarks/micro/gelu_check.cu's."""
import re
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks" / "micro"))

import gelu_fit  # noqa: E402

HEADER = ROOT / "codegen_templates" / "include" / "evtc" / "functors.hpp"


def _coefficients() -> list[float]:
    body = HEADER.read_text().split("CUTLASS_HOST_DEVICE float gelu(float x) {", 1)[1].split("#else", 1)[0]
    first = re.search(r"float q = ([-+0-9a-fx.p]+)f;", body).group(1)
    rest = re.findall(r"q = ::fmaf\(q, t, ([-+0-9a-fx.p]+)f\);", body)
    return [float.fromhex(v) for v in [first, *rest]]  # highest degree first


def test_the_header_has_six_float32_coefficients():
    c = _coefficients()
    assert len(c) == 6 and c[-1] == -1.0  # h(0) = 2^-1 = Phi(0)
    assert all(float(np.float32(v)) == v for v in c)


def test_h_is_within_the_notes_bound():
    c = _coefficients()
    assert gelu_fit.worst_u(c) <= 7.2
    # the check can fail: the linear coefficient 2^-16 off (relative) leaves the bound
    assert gelu_fit.worst_u(c[:-2] + [c[-2] * (1 + 2.0 ** -16), c[-1]]) > 7.2


def test_the_header_has_the_fits_coefficients():
    # benchmarks/micro/gelu_fit.py prints what the header holds (a refit is a deliberate change)
    assert _coefficients() == gelu_fit.fit()


def test_q_decreases_to_1e38():
    c = _coefficients()
    assert gelu_fit.decreasing(c)
    assert not gelu_fit.decreasing([-c[0]] + c[1:])  # the check can fail: a leading term that rises
