"""Row and column sums through float atomics (``GemmConfig(atomic_reductions=True)``: NOTE
[Atomic row and column sums] in evtc/plan/config.py) on the GPU: every element of every output
within its bound of the float64 reference (evtc.testing.check: fresh random data, NaN-poisoned
outputs), ragged and batched shapes, on a cooperative and a ping-pong tile; the workspace
variant of the same epilogue beside it, and the sums of two runs within their bound of each
other (float adds in the order the tiles finish need not agree bit for bit)."""

import pytest

import evtc
from evtc import bf16
from evtc.testing import Problem, check

from conftest_gpu import built_fixture

pytestmark = pytest.mark.gpu

CONFIGS = {"coop": dict(tile=(128, 128, 64)), "pp": dict(tile=(64, 128, 64), cluster=(1, 1, 1), schedule="pingpong")}
SHAPES = [(333, 517, 256, 2), (1000, 1024, 1024, 1), (7, 4096, 512, 1)]


def gemms() -> dict:
    import epilogues as E

    table = {}
    for name in ("row_stats", "dgelu_bgrad"):
        for cname, cfg in CONFIGS.items():
            for atomic in (True, None):
                table[(name, cname, atomic)] = evtc.Gemm(E.REFERENCE[name], a=bf16, b=bf16, d=bf16,
                                                         config=evtc.GemmConfig(**cfg, atomic_reductions=atomic))
    return table


built = built_fixture(gemms)


@pytest.mark.parametrize("atomic", [True, None], ids=["atomic", "workspace"])
@pytest.mark.parametrize("cname", list(CONFIGS))
@pytest.mark.parametrize("name", ["row_stats", "dgelu_bgrad"])
def test_sums_match_the_reference(built, name, cname, atomic):
    g = built[(name, cname, atomic)]
    sums = [b.name for b in g.plan.buffers if b.role in ("row_reduction", "col_reduction") and b.mode == "atomic"]
    if atomic:
        assert sums, g.plan  # not vacuous: the sums really go through atomics
    for k, shape in enumerate(SHAPES):
        res = check(g, Problem(*shape), seed=11 * k + 3)
        for n, r in res.items():
            assert r.ok, f"{name} {cname} atomic={atomic} {shape}: {r.describe()}"
