"""The planner's own decisions on the H100: every non-stock choice (slot promotion, aux store
aliasing with evtc::Sm90AliasedAuxStore, register-direct aux tensors and row broadcasts, small
stage counts, epilogue tiles) checked element by element against the float64 reference
(evtc.testing), ragged shapes included."""

import zlib

import pytest

import evtc
from evtc import bf16
from evtc.testing import Problem, check

from conftest_gpu import assert_matches

pytestmark = pytest.mark.gpu

SHAPES = [(4096, 4096, 4096, 1), (1000, 1000, 1000, 1), (777, 1031, 512, 3)]

# (epilogue, fixed plan decisions)
VARIANTS = [
    ("many_aux", {"share": True}),
    ("many_aux", {"share": True, "stages_c": 4, "epilogue_tile": (128, 32)}),
    ("many_aux", {"c_slot": None, "direct": ["Z", "Q"]}),
    ("many_aux", {"c_slot": "Y", "reuse": True, "share": False, "stages_c": 3}),
    ("residual_scale", {"c_slot": "R1", "reuse": True, "stages_c": 2}),
    ("residual_scale", {"direct": ["R2"], "epilogue_tile": (128, 64)}),
    ("gelu_aux", {"stages_d": 1}),
    ("gelu_aux", {"d_slot": "F"}),
    ("dgelu_bgrad", {"c_slot": "F", "reuse": True}),
]



@evtc.epilogue
def row_bf16(acc, C, r: evtc.RowVector[bf16], s: evtc.RowVector[evtc.f32]):
    """Two row broadcasts, one of them bf16 (converted to f32 in registers)."""
    return (acc + r) * s + C


# evtc::Sm90RowBroadcastDirect under the subtile loops it must follow: (epilogue, GEMM config);
# every row broadcast register-direct. Ping-pong has 64-row subtiles (EPI_M = 2 per tile), the
# 128x64 and 128x16 subtiles change the columns each thread holds.
ROW_DIRECT = [
    ("bias_relu", {}),
    ("bias_relu", {"tile": (128, 192, 64), "schedule": "pingpong"}),
    ("residual_scale", {"epilogue_tile": (128, 64)}),
    ("row_bf16", {"epilogue_tile": (128, 16)}),
    ("row_bf16", {"tile": (128, 128, 64), "cluster": (1, 2, 1), "schedule": "pingpong"}),
]


def row_direct_gemm(name, config):
    import epilogues as E

    ep = row_bf16 if name == "row_bf16" else E.REFERENCE[name]
    rows = [n.name for n in ep.trace().inputs if isinstance(n, evtc.ir.nodes.RowBroadcast)]
    return evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16, config=evtc.GemmConfig(**config), plan={"direct": rows})


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
        table[(name, str(fixed))] = evtc.Gemm(E.REFERENCE[name], a=bf16, b=bf16, d=bf16, plan=dict(fixed),
                                               config=evtc.GemmConfig())
    table[("two_pairs", "share")] = evtc.Gemm(two_pairs, plan={"share": True}, config=evtc.GemmConfig())
    for name, config in ROW_DIRECT:
        table[(name, str(config))] = row_direct_gemm(name, config)
    prebuild(list(table.values()))
    return table


def test_variants_are_really_what_they_say(built):
    g = built[("many_aux", str({"share": True}))]
    assert g.plan.shares and g.plan.reuse_smem_c and all(b.bytes == 0 for b in g.plan.buffers if b.name in ("P", "Q"))
    # the shared aux store and the root wrapper that points it at its load's buffer (NOTE [Aux buffer sharing])
    assert "evtc::Sm90SharedAuxStore<" in g.source and "evtc::Sm90SmemShare<" in g.source
    g = built[("many_aux", str({"c_slot": None, "direct": ["Z", "Q"]}))]
    assert {b.name for b in g.plan.buffers if b.mode == "direct"} == {"Z", "Q"}


@pytest.mark.parametrize("variant", VARIANTS, ids=lambda v: f"{v[0]}-{'-'.join(f'{k}={v[1][k]}' for k in v[1])}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_planner_variant(built, variant, shape, record_errors):
    name, fixed = variant
    g = built[(name, str(fixed))]
    direct = [b.name for b in g.plan.buffers if b.mode == "direct" and b.role in ("aux_load", "aux_store")]
    if direct and shape[1] % 8:
        with pytest.raises(evtc.ArgumentError, match="register-direct"):
            check(g, Problem(*shape))
        shape = (shape[0], shape[1] + 1, shape[2], shape[3])  # N = 1032: direct accesses are whole vectors
    assert_matches(g, shape, zlib.crc32(f"{variant}{shape}".encode()), f"{name} {fixed}", record_errors)


@pytest.mark.parametrize("case", ROW_DIRECT, ids=lambda c: f"{c[0]}-{'-'.join(f'{k}={v}' for k, v in c[1].items()) or 'default'}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_row_broadcast_direct(built, case, shape, record_errors):
    g = built[(case[0], str(case[1]))]
    assert "evtc::Sm90RowBroadcastDirect" in g.source and not any(b.mode == "smem" for b in g.plan.buffers)
    assert_matches(g, shape, zlib.crc32(f"row{case}{shape}".encode()), f"{case}", record_errors)


@pytest.mark.parametrize("swizzle,raster", [(0, "heuristic"), (3, "along_m"), (2, "along_n"), (1, "heuristic")])
def test_tile_order_is_a_runtime_argument(swizzle, raster, record_errors):
    """Every tile order (the scheduler's swizzle and raster arguments) runs the same kernel and
    gives the same result, ragged and batched shapes included."""
    import epilogues as E

    g = evtc.Gemm(E.bias_relu, a=bf16, b=bf16, c=bf16, d=bf16, config=evtc.GemmConfig(swizzle=swizzle, raster=raster))
    assert g.source == evtc.Gemm(E.bias_relu, a=bf16, b=bf16, c=bf16, d=bf16).source
    for shape in [(4096, 4096, 4096, 1), (3000, 1031, 512, 3)]:
        assert_matches(g, shape, zlib.crc32(f"order{swizzle}{raster}{shape}".encode()), f"swizzle {swizzle} {raster}",
                       record_errors)
