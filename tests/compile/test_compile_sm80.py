"""Compile tests (nvcc, no GPU): two reference epilogues build for sm_80 (with the PTX that lets
the driver JIT them for newer GPUs), and the built library's info agrees with the plan: the ABI,
the mainloop's stages, the visitor tree's shared storage (the kernels also ``static_assert`` it
per variant) and the kernel's shared memory."""

import ctypes

import pytest

import evtc
from evtc import bf16
from evtc.plan import default_config
from evtc.runtime.launch import KernelLibrary

pytestmark = pytest.mark.compile

# bias_relu: the benchmark epilogue (C, scalars, row broadcast); dgelu_bgrad with stream-K: an aux
# load, a column reduction through shared memory and the stream-K kernel.
CASES = [("bias_relu", "persistent"), ("dgelu_bgrad", "streamk")]


@pytest.fixture(scope="module")
def built():
    """Build both cases in parallel (2 nvcc processes on a 2-core machine, about a minute)."""
    import epilogues as E
    from evtc.compiler import build_many

    cfg = default_config("sm80", bf16, bf16)
    gemms = {c: evtc.Gemm(E.REFERENCE[c[0]], a=bf16, b=bf16, c=bf16, d=bf16, arch="sm80",
                          config=cfg.replace(scheduler=c[1])) for c in CASES}
    res = build_many([(g.source, g.target, g.name) for g in gemms.values()], workers=2)
    for r in res:
        if isinstance(r, Exception):
            raise r
    return gemms


@pytest.mark.parametrize("case", CASES, ids=lambda c: f"{c[0]}-{c[1]}")
def test_library_info_matches_the_plan(built, case):
    g = built[case]
    lib = KernelLibrary(g.build(family=False).library)
    info = lib.info
    plan = g.plan
    assert info["static"]["arch"] == "sm80"
    assert info["args_size"] == ctypes.sizeof(lib.Args)
    assert [f["name"] for f in info["static"]["abi"]] == [f.name for f in lib.fields]
    assert info["mainloop_stages"] == plan.mainloop_stages == 4
    assert info["epilogue_smem_bytes"] == plan.epilogue_smem_bytes
    assert info["static"]["plan"]["epilogue_smem_bytes"] == plan.epilogue_smem_bytes
    assert [v["name"] for v in info["static"]["plan"]["variants"]] == ["vector", "ragged_n", "ragged"]
    # the mainloop's stages share the kernel's shared memory with the epilogue (a union)
    assert plan.mainloop_stages * plan.mainloop_stage_bytes <= info["kernel_smem_bytes"] <= plan.smem_capacity


def test_column_reduction_shared_storage(built):
    """The planner's model of VisitorRowReduction::SharedStorage, checked by the static_asserts."""
    g = built[("dgelu_bgrad", "streamk")]
    assert g.plan.epilogue_smem_bytes == 4096
    assert KernelLibrary(g.build(family=False).library).info["epilogue_smem_bytes"] == 4096


def test_built_for_sm80_with_ptx(built):
    g = built[("bias_relu", "persistent")]
    art = g.build(family=False)
    log = art.log.read_text()
    assert "-gencode=arch=compute_80,code=[sm_80,compute_80]" in log
