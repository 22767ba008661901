"""The planner's own decisions on the H100: every non-stock choice (slot promotion, aux store
aliasing with evtc::Sm90AliasedAuxStore, register-direct aux tensors, small stage counts,
epilogue tiles) checked against the float64 reference, ragged shapes included."""

import zlib

import pytest

import evtc
from evtc import bf16
from evtc.testing import Problem, check

pytestmark = pytest.mark.gpu

SHAPES = [(4096, 4096, 4096, 1), (1000, 1000, 1000, 1), (777, 1031, 512, 3)]

# (epilogue, fixed plan decisions)
VARIANTS = [
    ("many_aux", {"alias": True}),
    ("many_aux", {"alias": True, "stages_c": 4, "epilogue_tile": (128, 32)}),
    ("many_aux", {"c_slot": None, "direct": ["Z", "Q"]}),
    ("many_aux", {"c_slot": "Y", "reuse": True, "alias": False, "stages_c": 3}),
    ("residual_scale", {"c_slot": "R1", "reuse": True, "stages_c": 2}),
    ("residual_scale", {"direct": ["R2"], "epilogue_tile": (128, 64)}),
    ("gelu_aux", {"stages_d": 1}),
    ("gelu_aux", {"d_slot": "F"}),
    ("dgelu_bgrad", {"c_slot": "F", "reuse": True}),
]


@evtc.epilogue
def two_pairs(acc, X: evtc.Matrix, Y: evtc.Matrix):
    """Two stores, each able to live in an aux load's buffer."""
    u = acc * X
    v = acc + Y
    return {"D": u + v, "U": u, "V": v}


@pytest.fixture(scope="module")
def built():
    import epilogues as E
    from conftest_gpu import prebuild

    table = {}
    for name, fixed in VARIANTS:
        table[(name, str(fixed))] = evtc.Gemm(E.REFERENCE[name], a=bf16, b=bf16, d=bf16, plan=dict(fixed))
    table[("two_pairs", "alias")] = evtc.Gemm(two_pairs, plan={"alias": True})
    prebuild(list(table.values()))
    return table


def test_variants_are_really_what_they_say(built):
    g = built[("many_aux", str({"alias": True}))]
    assert g.plan.alias and g.plan.reuse_smem_c and all(b.bytes == 0 for b in g.plan.buffers if b.name in ("P", "Q"))
    assert "evtc::Sm90SmemAlias" in g.source
    g = built[("many_aux", str({"c_slot": None, "direct": ["Z", "Q"]}))]
    assert {b.name for b in g.plan.buffers if b.mode == "direct"} == {"Z", "Q"}


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{'-'.join(f'{k}={v[1][k]}' for k in v[1])}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_planner_variant(built, variant, shape, record_errors):
    name, fixed = variant
    g = built[(name, str(fixed))]
    direct = [b.name for b in g.plan.buffers if b.mode == "direct"]
    if direct and shape[1] % 8:
        with pytest.raises(evtc.ArgumentError, match="register-direct"):
            check(g, Problem(*shape))
        shape = (shape[0], shape[1] + 1, shape[2], shape[3])  # N = 1032: direct accesses are whole vectors
    errs = check(g, Problem(*shape), seed=zlib.crc32(f"{variant}{shape}".encode()))
    record_errors(errs)
    for out, (err, tol) in errs.items():
        assert err <= tol, f"{variant} {shape}: {out} relative error {err:.3e} > {tol:.1e}"
