"""Hypothesis strategies for random epilogues, shared by the pass, planner, grammar and GPU tests.

``random_epilogues()`` draws an epilogue of mixed node kinds and dtypes: the accumulator, maybe
C, scalars (by value and by device pointer), row and column broadcasts, aux loads of several
dtypes, up to 12 computes, and outputs: D, aux stores of several dtypes, row, column and scalar
reductions. Values stay in a sane range (``exp`` only sees bounded arguments, ``log``/``sqrt``
only positive ones) so float32 kernels and the float64 reference can be compared with relative
errors.
"""

from __future__ import annotations

import hypothesis
from hypothesis import strategies as st

import evtc
from evtc import bf16, e4m3, f16, f32

UNARY = ["relu", "sigmoid", "tanh", "neg", "abs", "silu", "gelu", "gelu_tanh", "hardswish", "erf",
         "exp_bounded", "log_pos", "sqrt_pos", "square"]
BINARY = ["add", "sub", "mul", "maximum", "minimum", "where_gt", "leaky_relu"]


@st.composite
def random_epilogues(draw, max_ops: int = 12, mixed_dtypes: bool = True):
    """A random ``evtc.Epilogue`` (see the module docs)."""
    mat_dtypes = [bf16, f16, f32, e4m3] if mixed_dtypes else [bf16]
    params: list[tuple[str, object]] = [("acc", None)]
    if draw(st.booleans()):
        params.append(("C", None))
    for i in range(draw(st.integers(0, 2))):
        params.append((f"s{i}", float))
    if draw(st.booleans()):
        params.append(("p0", evtc.DeviceScalar[f32]))
    for i in range(draw(st.integers(0, 2))):
        params.append((f"r{i}", evtc.RowVector[draw(st.sampled_from([f32, bf16]))]))
    if draw(st.booleans()):
        params.append(("c0", evtc.ColVector[f32]))
    for i in range(draw(st.integers(0, 2))):
        params.append((f"X{i}", evtc.Matrix[draw(st.sampled_from(mat_dtypes))]))

    n_ops = draw(st.integers(1, max_ops))
    steps = []
    for _ in range(n_ops):
        if draw(st.booleans()):
            steps.append(("u", draw(st.sampled_from(UNARY)), draw(st.integers(0, 1000))))
        else:
            steps.append(("b", draw(st.sampled_from(BINARY)), draw(st.integers(0, 1000)), draw(st.integers(0, 1000)),
                          draw(st.sampled_from([None, None, 0.5, 2.0, -1.0]))))
    n_stores = draw(st.integers(0, 2))
    store_dtypes = [draw(st.sampled_from([bf16, f16, f32, e4m3] if mixed_dtypes else [bf16])) for _ in range(n_stores)]
    reductions = [(draw(st.sampled_from(["sum", "max", "min"])), draw(st.sampled_from([1, 0, None])))
                  for _ in range(draw(st.integers(0, 2)))]
    picks = [draw(st.integers(0, 1000)) for _ in range(n_stores + len(reductions))]

    names = [p for p, _ in params]

    def fn(**kw):
        vals = [kw[n] for n in names]
        mn = [kw["acc"]] + [kw[n] for n in names if n == "C" or n.startswith("X")]  # M x N values
        for step in steps:
            if step[0] == "u":
                _, op, i = step
                x = vals[i % len(vals)]
                y = {
                    "neg": lambda: -x, "abs": lambda: abs(x), "square": lambda: x * x,
                    "exp_bounded": lambda: evtc.exp(evtc.tanh(x)), "log_pos": lambda: evtc.log(abs(x) + 1.0),
                    "sqrt_pos": lambda: evtc.sqrt(abs(x) + 0.25),
                }.get(op, lambda: getattr(evtc, op)(x))()
            else:
                _, op, i, j, k = step
                x = vals[i % len(vals)]
                z = vals[j % len(vals)] if k is None else k
                y = {
                    "add": lambda: x + z, "sub": lambda: x - z, "mul": lambda: x * z,
                    "maximum": lambda: evtc.maximum(x, z), "minimum": lambda: evtc.minimum(x, z),
                    "where_gt": lambda: evtc.where(x > z, x, z * 0.5), "leaky_relu": lambda: evtc.leaky_relu(x, 0.1),
                }[op]()
            vals.append(y)
        # every output is M x N: anchor vectors and scalars on an M x N value
        last = vals[-1] + mn[len(mn) // 2]
        out = {"D": last}
        for k, dt in enumerate(store_dtypes):
            v = vals[picks[k] % len(vals)] + kw["acc"]
            out[f"S{k}"] = v.to(dt) if dt is not bf16 else v
        for k, (rop, dim) in enumerate(reductions):
            v = vals[picks[n_stores + k] % len(vals)] * kw["acc"]
            out[f"R{k}"] = getattr(evtc, rop)(v, dim=dim)
        return out

    sig_params = ", ".join(names)
    ns: dict = {"_fn": fn}
    exec(f"def epi({sig_params}):\n    return _fn({', '.join(f'{n}={n}' for n in names)})\n", ns)
    epi = ns["epi"]
    epi.__annotations__ = {n: a for n, a in params if a is not None}
    return evtc.epilogue(epi, name="random_epilogue")


def collect(strategy, n: int, seed: int = 0, key=lambda e: str(e.graph)) -> list:
    """``n`` distinct examples of ``strategy`` (distinct by ``key``), drawn reproducibly through
    Hypothesis's engine, for tests that must build every example before checking any (GPU)."""
    out: dict = {}

    @hypothesis.settings(max_examples=20 * n, derandomize=True, database=None, deadline=None,
                         phases=[hypothesis.Phase.generate], suppress_health_check=list(hypothesis.HealthCheck))
    @hypothesis.seed(seed)
    @hypothesis.given(strategy)
    def gather(x):
        if len(out) < n:
            out.setdefault(key(x), x)

    gather()
    return list(out.values())
