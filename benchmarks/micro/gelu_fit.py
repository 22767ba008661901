"""The polynomial of evtc's exact GELU (NOTE [GELU without erff] in
codegen_templates/include/evtc/functors.hpp): Q of degree 5 with 0.5 erfc(t / sqrt 2) ~= 2^Q(t)
on t in [0, 5.6] and Q(0) = -1 exactly (h(0) = 1/2 = Phi(0)), fitted by least squares weighted by
each point's share of the absolute error of h = 2^Q (d h = ln 2 h d Q), reweighted 200 times
towards the least largest error; the float32 coefficients, their float32 Horner evaluation's
largest absolute error of h on [0, 8] with ex2.approx's 2 ulp on top (in u = 2^-24), and whether
Q decreases on [0, 1e38] (no clamp needed).

    python benchmarks/micro/gelu_fit.py

prints the coefficients, highest degree first, as the C++ hex literals functors.hpp uses.
tests/null/test_gelu_polynomial.py applies :func:`worst_u` and :func:`decreasing` to the
coefficients the header has.
"""
import math

import numpy as np

DEGREE, T_MAX = 5, 5.6
U = 2.0 ** -24
erfc = np.vectorize(math.erfc, otypes=[np.float64])


def fit() -> list[float]:
    """The float32 coefficients of Q, highest degree first."""
    t = np.linspace(0.0, T_MAX, 40001)
    h = 0.5 * erfc(t / math.sqrt(2.0))
    y = np.log2(h)
    w = h * math.log(2.0)
    V = np.vander(t, DEGREE + 1, increasing=True)[:, 1:]  # the constant term is fixed: -1
    y = y + 1.0
    ww = w.copy()
    for _ in range(200):
        c, *_ = np.linalg.lstsq(V * ww[:, None], y * ww, rcond=None)
        err = (V @ c - y) * w
        ww = ww * (1 + 2 * np.abs(err) / np.abs(err).max())
    return [float(v) for v in np.concatenate([[-1.0], c]).astype(np.float32)[::-1]]


def h32(c: list[float], t: np.ndarray) -> np.ndarray:
    """2^Q(t) with Q's Horner steps in float32, as the device does them (numpy's float32 product
    and sum: two roundings where the device's FMA makes one), the power in float64."""
    tf = t.astype(np.float32)
    q = np.full_like(tf, np.float32(c[0]))
    for k in c[1:]:
        q = (q * tf + np.float32(k)).astype(np.float32)
    return np.exp2(q.astype(np.float64))


def worst_u(c: list[float], points: int = 400001) -> float:
    """The largest |h32 - 0.5 erfc(t / sqrt 2)| on [0, 8] with ex2.approx's 2 ulp (2^-22
    relative) added, in u."""
    t = np.linspace(0.0, 8.0, points)
    return float(np.abs(h32(c, t) * (1 + 2.0 ** -22) - 0.5 * erfc(t / math.sqrt(2.0))).max() / U)


def decreasing(c: list[float]) -> bool:
    """Whether Q (float64) decreases on [0, 1e38]: then 2^Q needs no clamp past the fit."""
    t = np.concatenate([np.linspace(0.0, 100.0, 100001), np.logspace(2, 38, 1000)])
    return bool(c[0] < 0 and (np.diff(np.polyval(np.array(c, dtype=np.float64), t)) <= 0).all())


def main() -> None:
    c = fit()
    print("coefficients, highest degree first:")
    print("  " + ", ".join(f"{v.hex().replace('0000000p', 'p')}f" for v in c))
    print(f"largest |h error| on [0, 8] with ex2's 2 ulp: {worst_u(c):.2f} u; "
          f"Q decreasing on [0, 1e38]: {decreasing(c)}")


if __name__ == "__main__":
    main()
