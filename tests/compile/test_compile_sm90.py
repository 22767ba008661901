"""Compile tests (nvcc, no GPU): emitted sm90 kernels build for sm_90a, and the planner's byte
count equals ``sizeof(CollectiveEpilogue::SharedStorage)`` reported by the built library (the
kernels also ``static_assert`` it), for the evtc plan and the stock ``cutlass`` plan."""

import pytest

import evtc
from evtc import bf16
from evtc.runtime.launch import KernelLibrary

pytestmark = pytest.mark.compile

CASES = [("bias_relu", "evtc"), ("bias_relu", "cutlass"), ("residual_scale", "evtc"), ("residual_scale", "cutlass"),
         ("gelu_aux", "evtc"), ("gelu_aux", "cutlass"),
         ("many_aux", "evtc")]  # all of evtc's own templates: aliased aux stores, the register-direct row


@pytest.fixture(scope="module")
def built():
    """Build every case in parallel (2 nvcc processes on a 2-core machine)."""
    import epilogues as E
    from evtc.compiler import build_many

    gemms = {c: evtc.Gemm(E.REFERENCE[c[0]], a=bf16, b=bf16, d=bf16, plan=c[1]) for c in CASES}
    gemms[("multi", "evtc")] = evtc.Gemm(multi_output, a=bf16, b=bf16, d=bf16)
    gemms[("quantize", "evtc")] = evtc.Gemm(quantize_col_major, a=bf16, b=bf16)
    gemms[("glu", "evtc")] = evtc.Gemm(swiglu, a=bf16, b=bf16)
    res = build_many([(g.source, g.target, g.name) for g in gemms.values()], workers=2)
    for (case, g), r in zip(gemms.items(), res):
        if isinstance(r, Exception):
            raise r
    return gemms


@evtc.epilogue
def multi_output(acc, C, alpha: float, bias: evtc.RowVector[evtc.f32], R: evtc.Matrix):
    """A DAG: t feeds an aux store, a row reduction and two computes (a topological region);
    D feeds a column reduction."""
    t = alpha * acc + bias
    D = evtc.maximum(t, t * R) + C
    return {"D": D, "T": t.to(evtc.f16), "row_max": evtc.max(t, dim=1), "col_sum": evtc.sum(D, dim=0)}


@evtc.epilogue
def quantize_col_major(acc, bias: evtc.RowVector[evtc.f32]):
    """evtc.quantize (include/evtc/sm90_group_quant.hpp, the root visitor) with DeepGEMM's
    column-major scales: the scale strides are run-time arguments."""
    q, s = evtc.quantize(acc + bias, evtc.e4m3, group=128, scale_layout="col_major_tma")
    return {"D": q, "D_scale": s}


@evtc.epilogue
def swiglu(acc, bias: evtc.RowVector[evtc.f32]):
    """evtc.glu (include/evtc/sm90_glu_store.hpp, the root visitor): void D, the N / 2 gated
    columns through the collective's D buffer and a TMA store of their own."""
    return evtc.glu(acc + bias, act="silu")


@pytest.mark.parametrize("case", CASES + [("multi", "evtc"), ("quantize", "evtc"), ("glu", "evtc")], ids=lambda c: f"{c[0]}-{c[1]}")
def test_planner_bytes_equal_sizeof(built, case):
    g = built[case]
    lib = KernelLibrary(g.build(family=False).library)
    info = lib.info
    assert info["epilogue_smem_bytes"] == g.plan.epilogue_smem_bytes
    assert info["mainloop_stages"] == g.plan.mainloop_stages
    assert info["kernel_smem_bytes"] <= 232448
    assert info["static"]["plan"]["epilogue_smem_bytes"] == g.plan.epilogue_smem_bytes
    assert [f["name"] for f in info["static"]["abi"]] == [f.name for f in lib.fields]


def test_multi_output_tree_has_a_topological_region(built):
    """Stores and reductions pass their input through (Sm90AuxStore, Sm90ColReduction return
    it), so they chain without a topological visitor; only t's two compute users need one."""
    src = built[("multi", "evtc")].source
    assert src.count("Sm90TopologicalVisitor<") == 1
    # an f32 row max is atomic (NOTE [Atomic row and column max]), the column sum goes through the workspace
    assert "Sm90ColReductionAtomic<" in src and "Sm90RowReductionParallel<" in src and "Sm90AuxStore" in src


def test_evtc_plan_is_not_larger_than_stock(built):
    for name in ("bias_relu", "residual_scale", "gelu_aux"):
        ours, stock = built[(name, "evtc")], built[(name, "cutlass")]
        assert ours.plan.mainloop_stages >= stock.plan.mainloop_stages


def test_kernels_are_split_builds(built):
    """NOTE [Split builds]: the GEMM kernel is compiled only in the device half, under its
    unmangled name, and the host half holds no cutlass::device_kernel of its own."""
    art = built[("bias_relu", "evtc")].build(family=False)
    assert "-DEVTC_SPLIT_DEVICE" in art.meta["command"]
    data = art.library.read_bytes()
    assert b"evtc_gemm_kernel" in data and b"_ZN7cutlass13device_kernel" not in data
