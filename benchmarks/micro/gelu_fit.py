"""The polynomial of evtc's exact GELU (NOTE [GELU without erff] in
codegen_templates/include/evtc/functors.hpp): Q of degree 8 with 0.5 erfc(t / sqrt 2) ~= 2^Q(t)
on t in [0, 5.6], fitted by least squares weighted by each point's share of the absolute error of
h = 2^Q (d h = ln 2 h d Q), reweighted 200 times towards the least largest error; the float32
coefficients, their float32 Horner evaluation's largest absolute error of h on [0, 8] with
ex2.approx's 2 ulp on top (in u = 2^-24), and whether Q decreases on [0, 1e38] (no clamp needed).

    python benchmarks/micro/gelu_fit.py

prints the coefficients, highest degree first, as the C++ hex literals functors.hpp uses.
"""
import math

import numpy as np

DEGREE, T_MAX = 8, 5.6
erfc = np.vectorize(math.erfc, otypes=[np.float64])


def fit() -> np.ndarray:
    t = np.linspace(0.0, T_MAX, 40001)
    h = 0.5 * erfc(t / math.sqrt(2.0))
    y = np.log2(h)
    w = h * math.log(2.0)
    V = np.vander(t, DEGREE + 1, increasing=True)
    ww = w.copy()
    for _ in range(200):
        c, *_ = np.linalg.lstsq(V * ww[:, None], y * ww, rcond=None)
        err = (V @ c - y) * w
        ww = ww * (1 + 2 * np.abs(err) / np.abs(err).max())
    return c.astype(np.float32)


def main() -> None:
    c = fit()
    t = np.linspace(0.0, 8.0, 400001)
    tf = t.astype(np.float32)
    q = np.full_like(tf, c[-1])
    for k in range(DEGREE - 1, -1, -1):
        q = (q * tf + c[k]).astype(np.float32)
    h = np.exp2(q.astype(np.float64)) * (1 + 2.0 ** -22)
    worst = np.abs(h - 0.5 * erfc(t / math.sqrt(2.0))).max() / 2.0 ** -24
    far = np.concatenate([np.linspace(0, 100, 100001), np.logspace(2, 38, 1000)])
    decreasing = bool((np.diff(np.polyval(c[::-1].astype(np.float64), far)) <= 0).all())
    print("coefficients, highest degree first:")
    print("  " + ", ".join(f"{float(v).hex().replace('0000000p', 'p')}f" for v in c[::-1]))
    print(f"largest |h error| on [0, 8] with ex2's 2 ulp: {worst:.2f} u; Q decreasing on [0, 1e38]: {decreasing}")


if __name__ == "__main__":
    main()
