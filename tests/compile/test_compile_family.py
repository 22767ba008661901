"""Compile tests (nvcc, no GPU) of the kernel family's own kinds on sm90: swap-AB on ping-pong
64x32, the stream-K scheduler (``kheavy``: split-K and stream-K decompositions at run time), the
unaligned variant (void C and D, every M x N tensor register-direct), the packed-store variant of
a member (``large+packed``: void C and D, every M x N output through evtc::Sm90AuxStorePacked),
the batch-inner tile order of a 2x1-cluster member (``pingpong+bi``: evtc::BatchInnerScheduler,
the row-phase split's main call), and an fp8 epilogue with a scalar reduction (whose kernel always initialises it). Each builds for
sm_90a, and the library reports the planner's shared-memory bytes and stages."""

import pytest

import evtc
from evtc import bf16
from evtc.runtime.launch import KernelLibrary

pytestmark = pytest.mark.compile

MEMBERS = [("many_aux", "swap16"), ("row_stats", "kheavy"), ("gelu_aux", "unaligned"), ("fp8_out", "small"),
           ("gelu_aux", "large+packed"), ("bias_relu", "pingpong+bi")]


@pytest.fixture(scope="module")
def built():
    import epilogues as E
    from evtc.compiler import build_many

    kernels = {}
    for name, member in MEMBERS:
        a = evtc.e4m3 if name == "fp8_out" else bf16
        g = evtc.Gemm(E.REFERENCE[name], a=a, b=a)
        if member.endswith("+packed"):
            kernels[(name, member)] = g.kernel(g.kernel(member.split("+")[0]).spec.packed_variant())
        elif member.endswith("+bi"):
            kernels[(name, member)] = g.kernel(g.kernel(member.split("+")[0]).spec.batch_inner_variant())
        else:
            kernels[(name, member)] = g.kernel(member)
    res = build_many([k.job() for k in kernels.values()], workers=2)
    for k, r in zip(kernels.values(), res):
        if isinstance(r, Exception):
            raise r
        k.load(r)
    return kernels


@pytest.mark.parametrize("case", MEMBERS, ids=lambda c: f"{c[0]}-{c[1]}")
def test_member_builds_with_its_planned_bytes(built, case):
    k = built[case]
    lib = KernelLibrary(k.artifact.verified_library_path())
    info = lib.info
    assert info["epilogue_smem_bytes"] == k.plan.epilogue_smem_bytes
    assert info["mainloop_stages"] == k.plan.mainloop_stages
    assert info["kernel_smem_bytes"] <= 232448
    cfg = info["static"]["plan"]["config"]
    assert cfg["swap_ab"] == case[1].startswith("swap") and cfg["unaligned"] == (case[1] == "unaligned")
    assert (cfg["scheduler"] == "streamk") == (case[1] == "kheavy")
    assert (cfg["scheduler"] == "batch_inner") == case[1].endswith("+bi")
    assert cfg.get("packed_stores", False) == case[1].endswith("+packed")


def test_kinds_are_what_the_sources_say(built):
    assert "with or without a workspace:\n  // always call it" in built[("fp8_out", "small")].source
    assert "using TileScheduler = cutlass::gemm::StreamKScheduler;" in built[("row_stats", "kheavy")].source
    packed = built[("gelu_aux", "large+packed")].source
    assert "#include <evtc/sm90_packed_store.hpp>" in packed and "evtc::Sm90AuxStorePacked<" in packed
    assert "sm90_packed_store" not in built[("gelu_aux", "unaligned")].source
    bi = built[("bias_relu", "pingpong+bi")]
    assert "using TileScheduler = evtc::BatchInnerScheduler;" in bi.source
    assert "#include <evtc/sm90_batch_inner.hpp>" in bi.source and bi.plan.config.cluster == (2, 1, 1)
    assert "sm90_batch_inner" not in built[("row_stats", "kheavy")].source
