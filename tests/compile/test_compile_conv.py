"""Compile tests (nvcc, no GPU) of the convolution kernels: one per arch. sm90: a fused fprop
whose epilogue has a TMA aux load, the collective's D and a column reduction (its workspace is
evtc's); sm80: the 2-D strided-dgrad kernel, every row-mapping visitor of evtc's in it. The
built libraries report the plan's bytes and stages (the kernels also ``static_assert`` them),
and a call reaches the library and fails cleanly without a device."""

import ctypes

import pytest

import evtc
from evtc import f16, f32

pytestmark = pytest.mark.compile


@evtc.epilogue
def dgelu_bgrad(acc, F: evtc.Matrix):
    D = acc * evtc.gelu_grad(F)
    return {"D": D, "dbias": evtc.sum(D, dim=0)}


@evtc.epilogue
def strided_all(acc, C, F: evtc.Matrix, scale: evtc.ColVector[f32], bias: evtc.RowVector[f32], alpha: float):
    """Every role that addresses rows: aux loads (C, F), a column broadcast, aux stores (P, D), a
    row reduction; and the masked reductions over M (column, scalar)."""
    D = alpha * acc * scale + bias + C
    G = D * evtc.gelu_grad(F)
    return {"D": G, "P": D, "rmax": evtc.max(G, dim=1), "csum": evtc.sum(G, dim=0), "amax": evtc.amax(G)}


@pytest.fixture(scope="module")
def built():
    from evtc.compiler import build_many

    sm90 = evtc.Conv(dgelu_bgrad, kind="fprop", a=f16, d=f16, arch="sm90")
    sm80 = evtc.Conv(strided_all, kind="dgrad", a=f16, c=f16, d=f16, arch="sm80", fast_divmod=(True, False))
    strided = sm80._kernel("sm80", True)
    main = sm90._kernels[("sm90", False)]
    res = build_many([(main.source, "sm90", sm90.name), (strided.source, "sm80", sm80.name)], workers=2)
    for r in res:
        if isinstance(r, Exception):
            raise r
    return {"sm90": (sm90, main), "sm80": (sm80, strided)}


@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_library_reports_the_plan(built, arch):
    conv, kernel = built[arch]
    kernel.build()
    lib = kernel.library
    info = lib.info
    plan = kernel.plan
    assert info["epilogue_smem_bytes"] == plan.epilogue_smem_bytes
    assert info["mainloop_stages"] == plan.mainloop_stages
    assert info["static"]["conv"]["kind"] == conv.kind
    assert [f["name"] for f in info["static"]["abi"]] == [f.name for f in kernel.fields]
    assert info["args_size"] == ctypes.sizeof(lib.Args)
    if arch == "sm90":
        # the union of the mainloop's and the epilogue's tensors: every stage the bound allows
        assert info["kernel_smem_bytes"] <= plan.kernel_smem_bound <= plan.smem_capacity
        assert plan.mainloop_stages == 7
        lib.lib.evtc_buffer_layout.restype = ctypes.c_char_p
        import json

        layout = json.loads(lib.lib.evtc_buffer_layout())
        assert layout["aux:F"][1] == plan.buffer("F").bytes and layout["aux:F"][0] == plan.buffer("F").offset
    else:
        assert info["kernel_smem_bytes"] <= plan.smem_capacity
        assert info["static"]["conv"]["fast_divmod"] == [True, False]


def test_a_call_reaches_the_library_and_fails_cleanly_without_a_device(built):
    """Conv.__call__ through the real sm90 library with fake f16 device tensors: checked, packed
    and prepared; without a GPU, evtc_prepare's CUDA error is a LaunchError (no crash)."""
    from devices import HAS_GPU

    if HAS_GPU:
        pytest.skip("a GPU is present")
    from fakecuda import FakeCuda

    conv, _ = built["sm90"]
    x, w = FakeCuda((2, 8, 8, 16)), FakeCuda((32, 3, 3, 16))
    with pytest.raises(evtc.LaunchError, match="CUDA error"):
        conv(x, w, problem=evtc.ConvProblem(padding=1), F=FakeCuda((2, 8, 8, 32)),
             out={"D": FakeCuda((2, 8, 8, 32)), "dbias": FakeCuda((32,), typestr="<f4")})


def test_sm90_source_uses_the_flat_epilogue(built):
    _, kernel = built["sm90"]
    src = kernel.source
    assert "using CollectiveEpilogue = evtc::Sm90ConvEpilogue<StockEpilogue>;" in src
    assert "Sm90AuxLoad<" in src and "evtc::Sm90RowReductionParallel<" in src
    assert "CollectiveEpilogue::initialize_workspace(shape, arguments.epilogue, workspace, stream" in src


def test_sm90_conv_is_a_split_build(built):
    """NOTE [Split builds]: the sm90 conv kernel is compiled only in the device half, under its
    unmangled name; the host half holds no cutlass::device_kernel."""
    _, kernel = built["sm90"]
    art = kernel.build()
    assert "-DEVTC_SPLIT_DEVICE" in art.meta["command"]
    data = art.library.read_bytes()
    assert b"evtc_conv_kernel" in data and b"_ZN7cutlass13device_kernel" not in data


@pytest.fixture(scope="module", params=["streamk128", "pp192_c2x1"])
def member(request):
    """Two candidates of the sm90 fprop family (NOTE [Persistent conv kernels]), with the aux load
    and the column reduction of ``dgelu_bgrad`` (its partials in the workspace beside the
    scheduler's): ``streamk128``, the conv mainloop on CUTLASS's persistent cooperative GEMM
    kernel over the stream-K tile scheduler (128x128x64, two consumer warpgroups), and
    ``pp192_c2x1``, on the persistent ping-pong kernel (128x192x64, one consumer warpgroup a
    tile, cluster 2x1: the filter multicast)."""
    conv = evtc.Conv(dgelu_bgrad, kind="fprop", a=f16, d=f16, arch="sm90")
    kernel = conv.member(request.param)
    kernel.build()
    return conv, kernel


def test_a_family_member_reports_its_plan(member):
    """A conv config other than the default builds on the persistent kernel, and its library
    reports the planned epilogue bytes (the kernel static_asserts sizeof == plan), the stages (the
    GEMM's rule: the epilogue beside the mainloop) and the tile."""
    conv, kernel = member
    info = kernel.library.info
    plan = kernel.plan
    assert kernel.source != conv.source and "evtc::Sm90ConvMainloopAsGemm<" in kernel.source
    if kernel.member == "streamk128":
        assert plan.config.tile == (128, 128, 64)
        assert plan.config.schedule == "cooperative" and plan.config.scheduler == "streamk"
        assert "cutlass::gemm::StreamKScheduler>" in kernel.source
    else:
        assert plan.config.tile == (128, 192, 64) and plan.config.cluster == (2, 1, 1)
        assert plan.config.schedule == "pingpong" and plan.config.scheduler == "persistent"
        assert "cutlass::gemm::KernelTmaWarpSpecializedPingpong;" in kernel.source
        assert "cutlass::gemm::PersistentScheduler>" in kernel.source
    assert info["epilogue_smem_bytes"] == plan.epilogue_smem_bytes
    assert info["mainloop_stages"] == plan.mainloop_stages
    assert plan.mainloop_stages * plan.mainloop_stage_bytes + plan.epilogue_smem_bytes <= plan.smem_capacity
    # the kernel holds both: the epilogue's buffers and every stage's A and B tiles (f16)
    tm, tn, tk = plan.config.tile
    assert info["epilogue_smem_bytes"] + plan.mainloop_stages * (tm + tn) * tk * 2 <= info["kernel_smem_bytes"] \
        <= plan.smem_capacity
    assert info["static"]["conv"]["kind"] == "fprop"
