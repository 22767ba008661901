"""NOTE [GELU without erff] (codegen_templates/include/evtc/functors.hpp): the polynomial the
kernels evaluate, read from the header, meets the NOTE's claims on the CPU (float32 Horner as the
device does it, ex2.approx's 2 ulp added): h = 2^Q(t) within 2.4 u of 0.5 erfc(t / sqrt 2) on
[0, 8], and Q decreasing out to 1e38 (no clamp needed). The device's own evaluation over all 2^32
inputs is benchmarks/micro/gelu_check.cu's."""
import math
import re
from pathlib import Path

import numpy as np

HEADER = Path(__file__).resolve().parents[2] / "codegen_templates" / "include" / "evtc" / "functors.hpp"
U = 2.0 ** -24


def _coefficients() -> list[float]:
    body = HEADER.read_text().split("CUTLASS_HOST_DEVICE float gelu(float x) {", 1)[1].split("#else", 1)[0]
    first = re.search(r"float q = ([-+0-9a-fx.p]+)f;", body).group(1)
    rest = re.findall(r"q = ::fmaf\(q, t, ([-+0-9a-fx.p]+)f\);", body)
    return [float.fromhex(v) for v in [first, *rest]]  # highest degree first


def _h(c: list[float], t: np.ndarray) -> np.ndarray:
    tf = t.astype(np.float32)
    q = np.full_like(tf, np.float32(c[0]))
    for k in c[1:]:
        q = (q * tf + np.float32(k)).astype(np.float32)  # numpy's float32 product and sum: two roundings
    return np.exp2(q.astype(np.float64))


def test_the_header_has_nine_float32_coefficients():
    c = _coefficients()
    assert len(c) == 9 and c[-1] == -1.0  # h(0) = 2^-1 = Phi(0)
    assert all(float(np.float32(v)) == v for v in c)


def test_h_is_within_the_notes_bound():
    c = _coefficients()
    t = np.linspace(0.0, 8.0, 200001)
    exact = 0.5 * np.vectorize(math.erfc)(t / math.sqrt(2.0))
    worst = np.abs(_h(c, t) * (1 + 2.0 ** -22) - exact).max() / U
    assert worst <= 2.4, worst
    # the check can fail: the linear coefficient 2^-16 off (relative) leaves the bound
    c2 = c[:-2] + [c[-2] * (1 + 2.0 ** -16), c[-1]]
    assert np.abs(_h(c2, t) - exact).max() / U > 2.4


def test_q_decreases_to_1e38():
    c = np.array(_coefficients(), dtype=np.float64)
    t = np.concatenate([np.linspace(0.0, 100.0, 100001), np.logspace(2, 38, 1000)])
    assert c[0] < 0 and (np.diff(np.polyval(c, t)) <= 0).all()
