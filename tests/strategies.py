"""Random epilogues, shared by the pass, planner, grammar and GPU tests.

Input: a source of random choices. Output: ``evtc.Epilogue`` objects of mixed node kinds and
dtypes: the accumulator, maybe C, scalars (by value and by device pointer), row and column
broadcasts, aux loads of several dtypes, up to 12 computes, and outputs: D, aux stores of
several dtypes, row, column and scalar reductions. Values stay in a sane range (``exp`` only
sees bounded arguments, ``log``/``sqrt`` only positive ones).

Two sources share one recipe (:func:`_recipe`), so both draw the same family of epilogues:

* :func:`random_epilogues`, a Hypothesis strategy, for GPU-free property tests (shrinking,
  the example database);
* :func:`seeded_epilogue` / :func:`fuzz_epilogues`, for the GPU fuzz: epilogue ``i`` of an arch
  comes from ``random.Random(seed)`` using only ``Random.random()``, whose sequence for a given
  seed Python guarantees across versions (the ``random`` module's docs, "Notes on
  Reproducibility"); Hypothesis's own choices depend on its and Python's versions, which made
  the kernels prebuilt here (Python 3.11) differ from the ones the GPU machine (3.12) asked for.
  ``tests/null/test_fuzz_epilogues.py`` pins the IR text hash of every fuzz epilogue
  (``tests/golden/fuzz_epilogues.txt``), so any drift fails there, without a GPU.
"""

from __future__ import annotations

import random

from hypothesis import strategies as st

import evtc
from evtc import bf16, e4m3, f16, f32

UNARY = ["relu", "sigmoid", "tanh", "neg", "abs", "silu", "gelu", "gelu_tanh", "hardswish", "erf",
         "exp_bounded", "log_pos", "sqrt_pos", "square"]
BINARY = ["add", "sub", "mul", "maximum", "minimum", "where_gt", "leaky_relu"]

#: fuzz epilogues per arch (issue 10: at least 200 on sm90 and 50 on sm80), their base seeds, and
#: the fewest IR nodes an epilogue needs to be kept (smaller ones test little)
FUZZ_COUNT = {"sm90": 200, "sm80": 50}
FUZZ_BASE_SEED = {"sm90": 90_000, "sm80": 80_000}
FUZZ_MIN_NODES = 8


class _HypothesisChoices:
    """Choices drawn through Hypothesis (shrinkable)."""

    def __init__(self, draw) -> None:
        self._draw = draw

    def boolean(self) -> bool:
        return self._draw(st.booleans())

    def integer(self, lo: int, hi: int) -> int:
        return self._draw(st.integers(lo, hi))

    def choice(self, options: list):
        return self._draw(st.sampled_from(options))


class _SeededChoices:
    """Choices from ``random.Random(seed)``, through ``random()`` alone (see the module docs)."""

    def __init__(self, seed: int) -> None:
        self._rng = random.Random(seed)

    def integer(self, lo: int, hi: int) -> int:
        return lo + min(int(self._rng.random() * (hi - lo + 1)), hi - lo)

    def boolean(self) -> bool:
        return self.integer(0, 1) == 1

    def choice(self, options: list):
        return options[self.integer(0, len(options) - 1)]


def _recipe(c, max_ops: int, mixed_dtypes: bool) -> dict:
    """An epilogue's parameters, steps and outputs, chosen with ``c``."""
    mat_dtypes = [bf16, f16, f32, e4m3] if mixed_dtypes else [bf16]
    params: list[tuple[str, object]] = [("acc", None)]
    if c.boolean():
        params.append(("C", None))
    for i in range(c.integer(0, 2)):
        params.append((f"s{i}", float))
    if c.boolean():
        params.append(("p0", evtc.DeviceScalar[f32]))
    for i in range(c.integer(0, 2)):
        params.append((f"r{i}", evtc.RowVector[c.choice([f32, bf16])]))
    if c.boolean():
        params.append(("c0", evtc.ColVector[f32]))
    for i in range(c.integer(0, 2)):
        params.append((f"X{i}", evtc.Matrix[c.choice(mat_dtypes)]))

    steps = []
    for _ in range(c.integer(1, max_ops)):
        if c.boolean():
            steps.append(("u", c.choice(UNARY), c.integer(0, 1000)))
        else:
            steps.append(("b", c.choice(BINARY), c.integer(0, 1000), c.integer(0, 1000),
                          c.choice([None, None, 0.5, 2.0, -1.0])))
    n_stores = c.integer(0, 2)
    store_dtypes = [c.choice([bf16, f16, f32, e4m3] if mixed_dtypes else [bf16]) for _ in range(n_stores)]
    reductions = [(c.choice(["sum", "max", "min"]), c.choice([1, 0, None])) for _ in range(c.integer(0, 2))]
    picks = [c.integer(0, 1000) for _ in range(n_stores + len(reductions))]
    return {"params": params, "steps": steps, "store_dtypes": store_dtypes, "reductions": reductions, "picks": picks}


def _build(recipe: dict, name: str) -> evtc.Epilogue:
    """The epilogue a recipe describes: a function with the recipe's signature."""
    params, steps = recipe["params"], recipe["steps"]
    store_dtypes, reductions, picks = recipe["store_dtypes"], recipe["reductions"], recipe["picks"]
    n_stores = len(store_dtypes)
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
    return evtc.epilogue(epi, name=name)


@st.composite
def random_epilogues(draw, max_ops: int = 12, mixed_dtypes: bool = True):
    """A Hypothesis strategy of random ``evtc.Epilogue`` objects (see the module docs)."""
    return _build(_recipe(_HypothesisChoices(draw), max_ops, mixed_dtypes), "random_epilogue")


def seeded_epilogue(seed: int, *, max_ops: int = 12, mixed_dtypes: bool = True) -> evtc.Epilogue:
    """The random epilogue of ``seed``, the same on every Python and Hypothesis version; it is
    named ``fuzz<seed>`` (in its IR text and its kernel)."""
    return _build(_recipe(_SeededChoices(seed), max_ops, mixed_dtypes), f"fuzz{seed}")


def fuzz_epilogues(arch: str, count: int | None = None) -> list[tuple[int, evtc.Epilogue]]:
    """The GPU fuzz's epilogues of ``arch``, as (seed, epilogue): the first ``count`` seeds from
    ``FUZZ_BASE_SEED[arch]`` on whose epilogue traces to at least ``FUZZ_MIN_NODES`` nodes.

    Args:
        arch: ``"sm90"`` or ``"sm80"``.
        count: how many (default ``FUZZ_COUNT[arch]``); a prefix of the full list.
    """
    count = FUZZ_COUNT[arch] if count is None else count
    out = []
    seed = FUZZ_BASE_SEED[arch]
    while len(out) < count:
        ep = seeded_epilogue(seed)
        if len(ep.trace(d=bf16).nodes) >= FUZZ_MIN_NODES:
            out.append((seed, ep))
        seed += 1
    return out


def collect(strategy, n: int, seed: int = 0, key=lambda e: str(e.graph)) -> list:
    """``n`` distinct examples of ``strategy`` (distinct by ``key``), drawn reproducibly through
    Hypothesis's engine on one Python and Hypothesis version (use :func:`fuzz_epilogues` where
    the examples must be the same everywhere)."""
    import hypothesis

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
