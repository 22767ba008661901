"""Fused convolutions on the GPU (sm90 kernels need an H100; sm80 ones run there too): every
reference epilogue that makes sense for a kind, on fprop, dgrad (stride 1 and 2, padding,
dilation) and wgrad, 2-D and 3-D, against torch's float64 convolution (``conv2d``/``conv3d``),
input gradient and weight gradient, with fresh random data, NaN-poisoned outputs and
evtc.testing's elementwise oracle (NOTE [The error bound]). The matrix pins each kind's default
kernel; the sm90 fprop family (1x1 problems on a Gemm, a non-default member) and dgrad family
(its routing) have their own tests (``test_gemm_route``, ``test_family_member``,
``test_dgrad_family_member``; ``python benchmarks/prebuild.py conv:family``), and every
persistent or dgrad-family member pinned has ``test_persistent_member`` (``conv:persistent``).

The kernels are listed in conv_cases.py; ``python benchmarks/prebuild.py conv`` builds them all
beforehand (in parallel, one nvcc per core).
"""

import zlib

import conv_cases as CC
import numpy as np
import pytest

import evtc
from evtc.ir.nodes import (
    AuxLoad,
    ColBroadcast,
    Reduction,
    RowBroadcast,
    ScalarBroadcast,
    Source,
    Store,
)

pytestmark = pytest.mark.gpu


#: the Convs each test without a kernel parameter uses: (name, kind, dims, arch, dtype, layout, strided)
FIXED_KERNELS = {
    "test_sm90_dgrad_routes_strided_problems_to_the_strided_kernel": [
        ("dgelu_bgrad", "dgrad", 2, "sm90", "bf16", "nhwc", False), ("dgelu_bgrad", "dgrad", 2, "sm80", "bf16", "nhwc", True)],
    "test_torch_channels_last_layout": [("bias_relu", "fprop", 2, "sm90", "bf16", "nchw", False)],
    "test_evtc_allocates_outputs": [(n, k, 2, arch, "bf16", "nhwc", False) for n, k in (("row_stats", "fprop"), ("dgelu_bgrad", "dgrad"))
                                    for arch in ("sm90", "sm80")],
    "test_results_depend_on_the_inputs": [("bias_relu", "fprop", 2, arch, "bf16", "nhwc", False) for arch in ("sm90", "sm80")],
    "test_zero_batch_gives_empty_outputs_and_identities": [("row_stats", "fprop", 2, "sm90", "bf16", "nhwc", False)],
    "test_bad_problem_is_refused_before_the_launch": [("bias_relu", "fprop", 2, "sm90", "bf16", "nhwc", False)],
}


def _key(conv, strided):
    return (conv.name, conv.kind, conv.dims, conv.arch, conv.a.name, conv.layout, strided)


def needed(items) -> tuple[set, set]:
    """The Conv keys and the strided-dgrad FastDivmod choices the selected tests of this module
    among ``items`` use (so that a run of some of them builds only their kernels)."""
    keys, divmod = set(), set()
    for item in items:
        if item.module.__name__ != __name__:
            continue
        p = getattr(item, "callspec", None)
        p = p.params if p is not None else {}
        name = item.originalname
        if name == "test_reference_epilogue":
            keys.add((p["name"], p["kind"], p["dims"], p["arch"], p["dtype"], "nhwc", False))
        elif name == "test_strided_dgrad":
            keys.add((p["name"], "dgrad", p["dims"], p["arch"], "bf16", "nhwc", True))
        elif name == "test_strided_dgrad_divmod_choices":
            divmod.add(p["fast"])
        else:
            keys.update(k for k in FIXED_KERNELS.get(name, []) if k[3] == p.get("arch", k[3]))
    return keys, divmod


@pytest.fixture(scope="module")
def convs(request):
    """The Convs of the selected tests, built in parallel up front."""
    import os

    from evtc.compiler import build_many

    keys, divmod = needed(request.session.items)
    default = (True, True)
    pairs = [(c, s) for c, s in CC.all_convs()
             if (c.fast_divmod == default and _key(c, s) in keys) or (c.fast_divmod != default and c.fast_divmod in divmod)]
    build_many(CC.kernels(pairs),
               workers=int(os.environ.get("EVTC_BUILD_JOBS", os.cpu_count() or 1)))
    # (the FastDivmod variants share their key with the default strided kernel: they stay out of
    # the table; test_strided_dgrad_divmod_choices makes its own)
    pairs = [(c, s) for c, s in pairs if c.fast_divmod == default]
    table = {}
    for conv, strided in pairs:
        table[(conv.name, conv.kind, conv.dims, conv.arch, conv.a.name, conv.layout, strided)] = conv
    return table


def get(convs, name, kind, dims, arch, dtype="bf16", layout="nhwc", strided=False):
    return convs[(name, kind, dims, arch, dtype, layout, strided)]


def random(torch, shape, dtype, gen, scale=1.0, positive=False):
    x = torch.randn(shape, generator=gen, device="cuda", dtype=torch.float32) * scale
    if positive:
        x = x.abs() + 0.5
    return x.to(getattr(torch, dtype.torch))


def run_and_check(conv, case: CC.Case, seed: int, record_errors, *, layout="nhwc", allocate=False):
    """Run ``conv`` on ``case`` with fresh random operands and epilogue inputs, NaN-poisoned
    outputs (or outputs evtc allocates), and check every element of every output against the
    float64 reference of the epilogue on torch's float64 convolution."""
    import torch

    from evtc.testing import accumulator_error, failure_report, to_numpy, verify

    kind, graph = conv.kind, conv.graph
    a_shape, b_shape, geo = CC.operand_shapes(kind, case)
    M, N, K = geo.gemm
    gen = torch.Generator(device="cuda")
    gen.manual_seed(seed)
    rng = np.random.default_rng(seed)
    s = CC.scale_for(K)
    A = random(torch, a_shape, conv.a, gen, s)
    B = random(torch, b_shape, conv.b, gen, s)
    out_shape = geo.shape(geo.output)

    def user_layout(t):  # NHWC-ordered tensor -> what the Conv's layout takes (same memory)
        return CC._nchw(t) if layout == "nchw" and t.dim() >= 3 else t

    kwargs, ref_inputs = {}, {}
    for leaf in graph.inputs:
        nm = leaf.name
        if isinstance(leaf, (Source, AuxLoad)):
            t = random(torch, out_shape, leaf.dtype, gen)
            kwargs[nm], ref_inputs[nm] = user_layout(t), to_numpy(t).reshape(M, N)
        elif isinstance(leaf, (RowBroadcast, ColBroadcast)):
            t = random(torch, (N if isinstance(leaf, RowBroadcast) else M,), leaf.dtype, gen)
            kwargs[nm], ref_inputs[nm] = t, to_numpy(t)
        elif isinstance(leaf, ScalarBroadcast):
            v = float(rng.uniform(0.5, 1.5))
            if leaf.by_pointer:
                kwargs[nm] = torch.full((), v, dtype=getattr(torch, leaf.dtype.torch), device="cuda")
            else:
                kwargs[nm] = v
            ref_inputs[nm] = v
    outs = None
    if not allocate:
        outs = {}
        for o in graph.outputs:
            if isinstance(o, Store):
                t = torch.empty(out_shape, dtype=getattr(torch, o.dtype.torch), device="cuda")
                t.view(torch.uint8).fill_(0x7F) if o.dtype.bytes == 1 else t.fill_(float("nan"))
                outs[o.name] = user_layout(t)
            elif isinstance(o, Reduction):
                ext = {1: (M,), 0: (N,), None: ()}[o.dim]
                outs[o.name] = torch.full(ext, float("nan"), dtype=getattr(torch, o.dtype.torch), device="cuda")
    got = conv(user_layout(A), user_layout(B), problem=case.problem(kind), out=outs, **kwargs)
    torch.cuda.synchronize()
    if not isinstance(got, dict):
        got = {graph.outputs[0].name: got}
    host = {}
    for o in graph.outputs:
        t = got[o.name]
        if isinstance(o, Store):
            want = tuple(out_shape) if layout == "nhwc" else tuple(CC._nchw(torch.empty(out_shape, device="meta")).shape)
            assert tuple(t.shape) == want, (o.name, tuple(t.shape), want)
            if layout == "nchw":
                assert t.is_contiguous(memory_format=torch.channels_last if t.dim() == 4 else torch.channels_last_3d)
                t = CC._nhwc(t)
            host[o.name] = to_numpy(t).reshape(M, N)
        else:
            host[o.name] = to_numpy(t)
    acc, sq = CC.exact_accumulator(kind, A, B, geo)
    results = verify(graph, host, acc, accumulator_error(sq, K, conv.a), ref_inputs)
    record_errors(results, (M, N, K))
    what = f"{conv.name} {geo.dims}-D {kind} {conv.arch} {case.name}"
    assert all(r.ok for r in results.values()), failure_report(results, what, graph)
    return results, host


def fp8_ok(name, case, kind):
    """fp8_out's e4m3 output rows must be 16-byte aligned: N a multiple of 16."""
    if name != "fp8_out":
        return True
    return CC.operand_shapes(kind, case)[2].gemm[1] % 16 == 0


PARAMS = []
for name, kind, dims, arch, dtype in CC.MATRIX:
    for case in CC.cases(kind, dims, arch):
        if fp8_ok(name, case, kind):
            PARAMS.append(pytest.param(name, kind, dims, arch, dtype.name, case,
                                       id=f"{arch}-{kind}{dims}d-{name}-{dtype.name}-{case.name}"))


@pytest.mark.parametrize("name, kind, dims, arch, dtype, case", PARAMS)
def test_reference_epilogue(convs, name, kind, dims, arch, dtype, case, record_errors):
    conv = get(convs, name, kind, dims, arch, dtype)
    run_and_check(conv, case, zlib.crc32(f"{name}{kind}{dims}{arch}{dtype}{case}".encode()), record_errors)


STRIDED_PARAMS = [pytest.param(name, dims, case, arch, id=f"{arch}-dgrad{dims}d-{name}-{case.name}")
                  for name, dims in CC.STRIDED
                  for case in (CC.CASES_STRIDED_DGRAD if dims == 2 else CC.CASES_STRIDED_DGRAD_3D)
                  for arch in ("sm80",)]


@pytest.mark.parametrize("name, dims, case, arch", STRIDED_PARAMS)
def test_strided_dgrad(convs, name, dims, case, arch, record_errors):
    """dgrad with stride > 1: the sm80 strided-dgrad kernel (each CTA tile walks one stride phase
    of dx; the epilogue maps its rows to dx's pixels)."""
    conv = get(convs, name, "dgrad", dims, arch, strided=True)
    run_and_check(conv, case, zlib.crc32(f"strided{name}{dims}{case}".encode()), record_errors)


@pytest.mark.parametrize("fast", CC.DIVMOD_VARIANTS, ids=lambda f: f"loads_{'fast' if f[0] else 'div'}_stores_{'fast' if f[1] else 'div'}")
def test_strided_dgrad_divmod_choices(convs, fast, record_errors):
    """Every compile-time choice of the row map's arithmetic computes the same pixels."""
    conv = CC.divmod_conv(fast)  # its kernel is in the cache (built by the fixture)
    for case in CC.CASES_STRIDED_DGRAD:
        run_and_check(conv, case, zlib.crc32(f"divmod{fast}{case}".encode()), record_errors)


def test_sm90_dgrad_routes_strided_problems_to_the_strided_kernel(convs, record_errors):
    """An sm90 dgrad Conv runs stride-2 problems on the sm80 strided-dgrad kernel (JIT-compiled
    from PTX on Hopper), and unit-stride ones on its own sm90 kernel."""
    conv = get(convs, "dgelu_bgrad", "dgrad", 2, "sm90")  # its strided kernel is the prebuilt sm80 one (same source)
    run_and_check(conv, CC.CASES_STRIDED_DGRAD[0], 11, record_errors)
    run_and_check(conv, CC.CASES_2D[0], 12, record_errors)


def test_torch_channels_last_layout(convs, record_errors):
    """layout='nchw': torch's logical NCHW tensors in channels_last memory, in and out."""
    conv = get(convs, "bias_relu", "fprop", 2, "sm90", layout="nchw")
    run_and_check(conv, CC.CASES_2D[0], 21, record_errors, layout="nchw")
    run_and_check(conv, CC.CASES_2D[1], 22, record_errors, layout="nchw", allocate=True)


@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_evtc_allocates_outputs(convs, arch, record_errors):
    """Outputs evtc allocates have the output's NHWC shape (reductions (M,), (N,), ())."""
    run_and_check(get(convs, "row_stats", "fprop", 2, arch), CC.CASES_2D[0], 31, record_errors, allocate=True)
    run_and_check(get(convs, "dgelu_bgrad", "dgrad", 2, arch), CC.CASES_2D[0], 32, record_errors, allocate=True)


@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_results_depend_on_the_inputs(convs, arch, record_errors):
    """Two seeds give different outputs, each its own reference's (no constant or stale result),
    and calls with several problems on one Conv use each its own problem."""
    conv = get(convs, "bias_relu", "fprop", 2, arch)
    _, out1 = run_and_check(conv, CC.CASES_2D[0], 41, record_errors)
    _, out2 = run_and_check(conv, CC.CASES_2D[0], 42, record_errors)
    assert not np.array_equal(out1["D"], out2["D"])
    for case in CC.CASES_2D[1:]:
        run_and_check(conv, case, 43, record_errors)


def test_zero_batch_gives_empty_outputs_and_identities(convs):
    import torch

    conv = get(convs, "row_stats", "fprop", 2, "sm90")
    x = torch.randn(0, 8, 8, 40, device="cuda").to(torch.bfloat16)
    w = torch.randn(72, 3, 3, 40, device="cuda").to(torch.bfloat16)
    out = conv(x, w, problem=evtc.ConvProblem(padding=1), C=torch.empty(0, 8, 8, 72, device="cuda", dtype=torch.bfloat16),
               alpha=1.0, beta=1.0, shift=torch.empty(0, device="cuda"))
    assert out["D"].shape == (0, 8, 8, 72) and out["row_max"].shape == (0,) and out["row_sum"].shape == (0,)


def test_bad_problem_is_refused_before_the_launch(convs):
    import torch

    conv = get(convs, "bias_relu", "fprop", 2, "sm90")
    x = torch.randn(1, 8, 8, 36, device="cuda").to(torch.bfloat16)
    w = torch.randn(72, 3, 3, 36, device="cuda").to(torch.bfloat16)
    with pytest.raises(evtc.ArgumentError, match="C \\(input channels\\) = 36 is not a multiple of 8"):
        conv(x, w, C=torch.empty(1, 8, 8, 72, device="cuda", dtype=torch.bfloat16), alpha=1.0, beta=1.0,
             bias=torch.zeros(72, device="cuda"), problem=evtc.ConvProblem(padding=1))


# ---- the sm90 fprop family: 1x1 problems on the Gemm, members chosen per problem ---------------------


def build_or_raise(jobs) -> None:
    """Build ``jobs`` in parallel (one nvcc per core); the first failed build is raised."""
    import os

    from evtc.compiler import build_many

    for r in build_many(jobs, workers=int(os.environ.get("EVTC_BUILD_JOBS", os.cpu_count() or 1))):
        if isinstance(r, Exception):
            raise r


@pytest.fixture(scope="module")
def family():
    """The family Convs of the route's and the member's tests, keyed (epilogue, dims, layout, kind
    of test), with every kernel their cases run built up front."""
    build_or_raise(CC.family_kernels())
    table = {}
    for conv, cs in CC.family_convs():
        kind = "member" if cs is CC.CASES_2D else "long_k" if cs is CC.CASES_LONG_K else "route"
        table[(conv.name, conv.dims, conv.layout, kind)] = conv
    return table


ROUTE_PARAMS = [pytest.param(n, dims, layout, case, id=f"sm90-fprop{dims}d-{n}-{layout}-{case.name}")
                for n, dims, layout in CC.ROUTE for case in CC.route_cases(dims) if fp8_ok(n, case, "fprop")]


@pytest.mark.parametrize("name, dims, layout, case", ROUTE_PARAMS)
def test_gemm_route(family, name, dims, layout, case, record_errors):
    """A 1x1, stride-1, unpadded fprop of a family Conv runs on its Gemm (over views of the NHWC
    tensors) and gives the reference's outputs in the Conv's layout; evtc allocates them in one
    call, the caller in the other."""
    conv = family[(name, dims, layout, "route")]
    seed = zlib.crc32(f"route{name}{dims}{layout}{case}".encode())
    run_and_check(conv, case, seed, record_errors, layout=layout)
    assert conv.gemm_route._recipes, "the call did not take the GEMM route"
    run_and_check(conv, case, seed + 1, record_errors, layout=layout, allocate=True)


MEMBER_PARAMS = [pytest.param(n, case, id=f"sm90-fprop2d-{n}-{case.name}")
                 for n in CC.MEMBER_EPILOGUES for case in CC.CASES_2D]


@pytest.mark.parametrize("name, case", MEMBER_PARAMS)
def test_family_member(family, name, case, record_errors):
    """A family Conv runs the small CASES_2D on the member its heuristic picks (the 64x128 tile,
    not the default, in clusters of four on the long-K case; 1x1 ones on the Gemm), against the
    float64 reference."""
    import torch

    conv = family[(name, 2, "nhwc", "member")]
    a_shape, b_shape, _ = CC.operand_shapes("fprop", case)
    if all(f == 1 for f in case.flt):  # a 1x1 problem: the Gemm
        run_and_check(conv, case, zlib.crc32(f"member{name}{case}".encode()), record_errors)
        assert conv.gemm_route._recipes
        return
    x = torch.empty(a_shape, device="cuda", dtype=torch.bfloat16)
    w = torch.empty(b_shape, device="cuda", dtype=torch.bfloat16)
    k = conv._route(case.problem("fprop").normalize(2), x, w)
    # the 5x3 case is long-K (K >= 2.5 max(M, N)): the 64x128 tile in clusters of four
    assert k.member in (CC.MEMBER, "m64_c4x1") and k.config.tile[:2] == (64, 128)
    run_and_check(conv, case, zlib.crc32(f"member{name}{case}".encode()), record_errors)
    assert k.launchers, "the call did not run on the member"


LONG_K_PARAMS = [pytest.param(n, case, id=f"sm90-fprop2d-{n}-{case.name}")
                 for n in CC.LONG_K_EPILOGUES for case in CC.CASES_LONG_K]


@pytest.mark.parametrize("name, case", LONG_K_PARAMS)
def test_long_k_member(family, name, case, record_errors):
    """A family Conv runs a long-K problem on a long-K member (a cluster along M multicasting the
    filter: NOTE [Long-K conv layers: the filter multicast]), against the float64 reference."""
    from evtc.family import conv as CF

    conv = family[(name, 2, "nhwc", "long_k")]
    a_shape, b_shape, _ = CC.operand_shapes("fprop", case)
    label, k = conv.kernel_for(a_shape, b_shape, case.problem("fprop"))
    assert label in CF.LONG_K_MEMBERS and k.member == label and k.config.cluster[0] > 1
    run_and_check(conv, case, zlib.crc32(f"longk{name}{case}".encode()), record_errors)
    assert k.launchers, f"the call did not run on {label}"


@pytest.fixture(scope="module")
def dgrad_family():
    """The dgrad family Convs of DGRAD_FAMILY_EPILOGUES, every kernel their cases run built up front."""
    build_or_raise(CC.dgrad_family_kernels())
    return CC.dgrad_family_convs()


DGRAD_FAMILY_PARAMS = [pytest.param(n, case, id=f"sm90-dgrad2d-family-{n}-{case.name}")
                       for n in CC.DGRAD_FAMILY_EPILOGUES for case in CC.CASES_DGRAD_FAMILY]


@pytest.mark.parametrize("name, case", DGRAD_FAMILY_PARAMS)
def test_dgrad_family_member(dgrad_family, name, case, record_errors):
    """A dgrad Conv without config= runs each case on the kernel its heuristic picks (a stream-K
    member, the 64x128 tile, the strided-dgrad kernel), against the float64 reference."""
    import torch

    conv = dgrad_family[name]
    a_shape, b_shape, g = CC.operand_shapes("dgrad", case)
    label, want = conv.kernel_for(a_shape, b_shape, case.problem("dgrad"))
    dy = torch.empty(a_shape, device="cuda", dtype=torch.bfloat16)
    w = torch.empty(b_shape, device="cuda", dtype=torch.bfloat16)
    assert conv._route(case.problem("dgrad").normalize(2), dy, w) is want
    run_and_check(conv, case, zlib.crc32(f"dgradfamily{name}{case}".encode()), record_errors)
    assert want.launchers, f"the call did not run on {label}"


# ---- the persistent cooperative members (NOTE [Persistent conv kernels]) -------------------------------


@pytest.fixture(scope="module")
def persistent():
    """Every persistent member's Conv of PERSISTENT_EPILOGUES; each kernel is built (or found in
    the cache) by its first call: ``python benchmarks/prebuild.py conv:persistent`` builds them all
    beforehand, in parallel."""
    return CC.persistent_convs()


PERSISTENT_PARAMS = [pytest.param(n, m, kind, case, id=f"sm90-{kind}2d-{n}-{m}-{case.name}")
                     for n, m, kind in CC.persistent_pairs()
                     for case in (CC.CASES_PERSISTENT_FP8 if n == "fp8_out" else
                                  CC.CASES_PERSISTENT if kind == "fprop" else CC.CASES_PERSISTENT_DGRAD)]


@pytest.mark.parametrize("name, member, kind, case", PERSISTENT_PARAMS)
def test_persistent_member(persistent, name, member, kind, case, record_errors):
    """An fprop or unit-stride dgrad pinned to a member on CUTLASS's persistent cooperative GEMM
    kernel (persistent, stream-K or split-K tile scheduler), or (dgrad) to a member of the dgrad
    family on the non-persistent kernel, gives the float64 reference's outputs: stores, row and
    column reductions (their partials reduced across stream-K units before the epilogue), aux
    loads."""
    from evtc.family import conv as CF

    conv = persistent[(name, member, kind)]
    assert conv.config.tile[:2] == CF.member_configs(evtc.bf16, [member])[member].fields["tile"][:2]
    assert (conv.config.schedule in CF.PERSISTENT_SCHEDULES) == (CF.kernel_kind(conv.config) != "nonpersistent")
    run_and_check(conv, case, zlib.crc32(f"persistent{name}{member}{kind}{case}".encode()), record_errors)
    # a second call on fresh data (the stream-K flags and the reductions' workspace re-initialised)
    run_and_check(conv, case, zlib.crc32(f"persistent2{name}{member}{kind}{case}".encode()), record_errors)


def test_persistent_member_refuses_channels_off_the_k_tile(persistent):
    """The persistent kernel's tile scheduler counts K tiles of the flat K; channels that are not a
    multiple of the tile's K would make its count disagree with the mainloop's: refused before the
    launch, never a wrong result."""
    import torch

    conv = persistent[("bias_relu", "coop", "fprop")]
    x = torch.randn(2, 8, 8, 40, device="cuda").to(torch.bfloat16)
    w = torch.randn(72, 3, 3, 40, device="cuda").to(torch.bfloat16)
    with pytest.raises(evtc.EvtcError, match="multiple of 64"):
        conv(x, w, C=torch.randn(2, 8, 8, 72, device="cuda").to(torch.bfloat16), alpha=1.0, beta=1.0,
             bias=torch.randn(72, device="cuda"), problem=evtc.ConvProblem(padding=1))
