"""The degenerate epilogues of tests/null/test_degenerate.py run on the GPU: a GEMM with no
epilogue (``D = acc``), only the source C, C scaled, only an aux load, an aux load passed through
as a second output, the accumulator stored twice; each on the default sm90 tile and on a decode
shape's swap-AB member, against the float64 reference, with NaN-poisoned outputs."""

import pytest

import evtc
from evtc import bf16
from evtc.testing import Problem, check, failure_report

pytestmark = pytest.mark.gpu

CASES = {"bare_acc": "D = acc", "only_c": "D = C", "scaled_c": "D = alpha*C", "only_aux": "D = X[m, n]",
         "aux_passthrough": "D = acc; F = X[m, n]", "acc_twice": "D = acc; F = acc"}
CONFIGS = {"large": evtc.GemmConfig(),
           "swap16": evtc.GemmConfig(tile=(64, 16, 64), cluster=(1, 1, 1), schedule="pingpong", swap_ab=True)}
SHAPES = {"large": [(200, 136, 72, 1), (77, 264, 64, 2)], "swap16": [(3, 1031, 256, 1), (16, 4096, 128, 2)]}


def gemms():
    """Every kernel this file runs (benchmarks/prebuild.py's group ``degenerate``)."""
    return {(c, k): evtc.Gemm(e, a=bf16, b=bf16, c=bf16, d=bf16, config=cfg)
            for c, e in CASES.items() for k, cfg in CONFIGS.items()}


@pytest.fixture(scope="module")
def built():
    from conftest_gpu import prebuild

    table = gemms()
    prebuild(list(table.values()))
    return table


@pytest.mark.parametrize("config", list(CONFIGS))
@pytest.mark.parametrize("case", list(CASES))
def test_degenerate_epilogue_matches_the_reference(built, case, config, record_errors):
    g = built[(case, config)]
    for shape in SHAPES[config]:
        res = check(g, Problem(*shape), seed=hash((case, shape)) % 1000)
        record_errors(res)
        assert all(r.ok for r in res.values()), failure_report(res, f"{case} on {config} {shape}:", g.graph)
