"""The sm80 (Ampere) lowering without a GPU: planning (thread map, shared storage, kernel
variants, buffers), emission of every reference epilogue and of every node kind and op, the
golden ``.cu`` of bias_relu, determinism and stream-K."""

import re

import pytest
from hypothesis import HealthCheck, given, settings

import evtc
from evtc import bf16, e4m3, e5m2, f16, f32
from evtc.plan import default_config
from evtc.plan.sm80 import Sm80Plan, row_reduction_floats, thread_map

REFERENCE = ["linear_combination", "bias_relu", "gelu_aux", "dgelu_bgrad", "residual_scale", "row_stats", "fp8_out",
             "many_aux"]


def sm80(ep, dt=bf16, **cfg):
    config = default_config("sm80", dt, dt).replace(**cfg) if cfg else None
    d = None if getattr(ep, "name", "") == "fp8_out" else dt
    return evtc.Gemm(ep, a=dt, b=dt, c=dt, d=d, arch="sm80", config=config)


def lines_matching(src: str, pattern: str) -> list[str]:
    return [l for l in src.splitlines() if re.search(pattern, l)]


# ---- planning ---------------------------------------------------------------------------------


def test_thread_map_matches_cutlass_metaprogram():
    """OutputTileOptimalThreadMap for 128x128 tiles of 64x64 warps (4 warps), worked by hand from
    output_tile_thread_map.h: 8-element bf16 accesses are 16 lanes x 2 rows, 1-element ones 32 x 1."""
    cfg = default_config("sm80", bf16, bf16)
    wide = thread_map(cfg, 16, 8)
    assert (wide.access_width, wide.access_rows, wide.iterations_column, wide.warps_remaining_for_rows, wide.group,
            wide.threads, wide.steps, wide.rows_per_step) == (16, 2, 1, 2, 2, 128, 8, 16)
    assert row_reduction_floats(wide) == 1024
    narrow = thread_map(cfg, 16, 1)
    assert (narrow.access_width, narrow.access_rows, narrow.iterations_column) == (32, 1, 4)
    assert row_reduction_floats(narrow) == 512


def test_plan_properties():
    import epilogues as E

    p = sm80(E.bias_relu).plan
    assert isinstance(p, Sm80Plan)
    assert (p.arch, p.policy, p.c_slot, p.d_slot) == ("sm80", "evtc", None, None)
    assert p.mainloop_stages == 4 and p.config.stages == 4
    assert p.mainloop_stage_bytes == (128 * 32 + 128 * 32) * 2
    assert p.epilogue_smem_bytes == 0
    assert p.epilogue_tile == (16, 128) and p.fragment_size == 8
    assert {b.name: (b.role, b.mode, b.stages, b.bytes) for b in p.buffers} == {
        "C": ("aux_load", "direct", 0, 0), "D": ("aux_store", "direct", 0, 0), "bias": ("row_broadcast", "direct", 0, 0)}
    assert [(v.name, v.alignment_ab, v.epilogue_access, v.stages) for v in p.variants] == [
        ("vector", 8, 8, 4), ("ragged_n", 8, 1, 4), ("ragged", 1, 1, 2)]
    assert dict(p.variants[0].vectors) == {"C": 8, "bias": 4, "D": 8}
    # the tree's root is D's store, wrapped around the value the lowering computes
    assert p.tree.root.op.role == "aux_store" and p.tree.root.op.name == "D"
    js = p.to_json()
    assert js["variants"][0]["name"] == "vector" and js["thread_map_element"] == "bf16"
    assert "ragged_n (A/B 8, epilogue 1, 4 stages)" in str(p)


def test_column_reduction_owns_shared_memory():
    """CUTLASS's VisitorRowReduction (evtc's column reduction) keeps one float per element of the
    compacted tile: 1024 floats with 8-element accesses, 512 with 1-element ones."""
    import epilogues as E

    p = sm80(E.dgelu_bgrad).plan
    assert [v.epilogue_smem_bytes for v in p.variants] == [4096, 2048, 2048]
    assert p.epilogue_smem_bytes == 4096
    (b,) = [b for b in p.buffers if b.name == "dbias"]
    assert (b.role, b.mode, b.bytes, b.offset) == ("col_reduction", "smem", 4096, 0)


def test_too_many_stages_is_a_plan_error():
    import epilogues as E

    with pytest.raises(evtc.PlanError, match="stages"):
        sm80(E.bias_relu, tile=(256, 128, 64), warp_tile=(64, 64, 64), stages=8)


@pytest.mark.parametrize("tile, warp", [((128, 128, 32), (64, 64, 24)), ((128, 128, 64), (64, 64, 8))])
def test_warp_k_must_divide_tile_k_and_match_the_mma(tile, warp):
    import epilogues as E

    with pytest.raises(evtc.ConfigError, match="warp tile K"):
        sm80(E.bias_relu, tile=tile, warp_tile=warp)


def test_8bit_d_lays_out_the_thread_map_for_the_operands():
    import epilogues as E

    p = sm80(E.fp8_out).plan
    assert p.thread_map_element is bf16
    assert dict(p.variants[0].vectors)["D"] == 8  # 8 e4m3 per access: one 8-byte vector


def test_non_float_reductions_accumulate_in_a_float_workspace():
    @evtc.epilogue
    def red(acc, bias: evtc.RowVector[f32]):
        y = acc + bias
        return {"D": y, "rs": evtc.sum(y, dim=1).to(bf16), "cm": evtc.max(y, dim=0).to(f16), "s": evtc.sum(y)}

    g = sm80(red)
    assert g.plan.scratch == ("rs", "cm")
    src = g.source
    assert "float* rs = nullptr;" in src and "float* cm = nullptr;" in src
    assert "evtc::sm80::convert_reduction(scratch.rs, static_cast<cutlass::bfloat16_t*>(args.p_rs)" in src
    # every reduction starts from its identity, on the GEMM's stream
    assert "evtc::sm80::fill_identity(scratch.cm, args.N, args.N, args.L, -cutlass::platform::numeric_limits<float>::infinity(), stream)" in src
    assert "evtc::sm80::fill_identity(static_cast<float*>(args.p_s), 1, args.bs_s, args.L, 0.0f, stream)" in src


# ---- emission ---------------------------------------------------------------------------------


@pytest.mark.parametrize("name", REFERENCE)
@pytest.mark.parametrize("dt", [bf16, f16], ids=str)
@pytest.mark.parametrize("scheduler", ["persistent", "streamk"])
def test_reference_epilogues_emit(name, dt, scheduler):
    import epilogues as E

    g = sm80(E.REFERENCE[name], dt, scheduler=scheduler)
    src = g.source
    assert "cutlass::gemm::kernel::DefaultGemmWithVisitor<" in src
    assert "Sm90" not in src.split("namespace evtc_kernel")[1]
    swizzle = "ThreadblockSwizzleStreamK" if scheduler == "streamk" else "GemmIdentityThreadblockSwizzle<8>"
    assert lines_matching(src, rf"using ThreadblockSwizzle = cutlass::gemm::threadblock::{swizzle};")
    # every output is stored or reduced by a visitor, and C (if any) is an aux load
    for o in g.graph.outputs:
        assert f"args.p_{o.name}" in src
    assert "ptr_C: C is loaded by a visitor" in src
    # every positional initializer line of the fusion arguments names its visitor
    init = src[src.index("typename V::Callbacks::Arguments"):src.index("// ptr_A")]
    for line in init.splitlines()[1:-1]:
        if line.strip() and line.strip() not in ("}", "},"):
            assert "// " in line, line


def test_fp8_output_is_supported_by_a_software_conversion():
    """sm80 has no cvt to e4m3: cutlass::float_e4m3_t converts in software below sm_89
    (float8.h), saturating like the hardware, so the fp8 epilogue lowers with 16-bit operands."""
    import epilogues as E

    src = sm80(E.fp8_out).source
    assert lines_matching(src, r"VisitorAuxStore<OutputTileThreadMap, cutlass::float_e4m3_t")
    assert lines_matching(src, r"Sm80ScalarReduction<cutlass::maximum, cutlass::atomic_maximum")


def test_fp8_mainloop_is_a_config_error():
    import epilogues as E

    with pytest.raises(evtc.ConfigError, match="sm80"):
        evtc.Gemm(E.fp8_out, a=e4m3, arch="sm80")


def test_bias_relu_golden(golden):
    import epilogues as E

    golden("bias_relu_sm80.cu", sm80(E.bias_relu).source)


def test_emission_is_deterministic():
    import epilogues as E

    a = sm80(E.row_stats, scheduler="streamk").source
    b = sm80(E.row_stats, scheduler="streamk").source
    assert a == b


def test_streamk_emission():
    import epilogues as E

    persistent = sm80(E.dgelu_bgrad).source
    streamk = sm80(E.dgelu_bgrad, scheduler="streamk").source
    assert "cutlass::gemm::threadblock::ThreadblockSwizzleStreamK;  // streamk" in streamk
    assert "ThreadblockSwizzleStreamK;" not in persistent
    # the visitor tree and the dispatch are the same; only the swizzle (and so the kernel) differs
    strip = lambda s: [l for l in s.splitlines() if "ThreadblockSwizzle =" not in l and "streamk" not in l
                       and "persistent" not in l and not l.startswith('    "')]
    assert strip(persistent) == strip(streamk)


def test_every_node_kind_has_its_visitor():
    @evtc.epilogue
    def all_kinds(acc, C, alpha: float, s: evtc.DeviceScalar[f32], r: evtc.RowVector[bf16], c: evtc.ColVector[f32],
                  X: evtc.Matrix[f16], Y: evtc.Matrix[e5m2]):
        y = evtc.where(acc > 0.5, alpha * acc + C, s * X) + r + c + Y
        return {"D": y, "F": evtc.gelu(y).to(e4m3), "rmax": evtc.max(y, dim=1), "csum": evtc.sum(y, dim=0),
                "amin": evtc.min(y)}

    src = sm80(all_kinds).source
    tb = "cutlass::epilogue::threadblock::"
    for pattern in [f"{tb}VisitorAccFetch", r"// C: the source C, register-direct",
                    r"VisitorScalarBroadcast<float, cute::Stride<cute::_0, cute::_0, cute::_0>>",
                    r"VisitorScalarBroadcast<float, cute::Stride<cute::_0, cute::_0, int>>",
                    r"VisitorRowBroadcast<OutputTileThreadMap, cutlass::bfloat16_t",
                    r"VisitorColBroadcast<OutputTileThreadMap, float", r"VisitorAuxLoad<OutputTileThreadMap, cutlass::half_t",
                    r"VisitorAuxLoad<OutputTileThreadMap, cutlass::float_e5m2_t",
                    r"VisitorAuxStore<OutputTileThreadMap, cutlass::float_e4m3_t",
                    r"VisitorAuxStore<OutputTileThreadMap, cutlass::bfloat16_t", r"evtc::Sm80Immediate<0x3f000000u>",
                    r"VisitorCompute<evtc::Where", r"VisitorCompute<evtc::Greater", r"VisitorCompute<evtc::Gelu, float",
                    # evtc's row reduction (over N) is CUTLASS's VisitorColReduction and vice versa
                    r"VisitorColReduction<cutlass::maximum, cutlass::atomic_maximum, OutputTileThreadMap, float, float, .*cute::Stride<cute::_1, cute::_0, int64_t>>",
                    r"VisitorRowReduction<cutlass::plus, cutlass::atomic_add, OutputTileThreadMap, float, float, .*cute::Stride<cute::_0, cute::_1, int64_t>>",
                    r"Sm80ScalarReduction<cutlass::minimum, evtc::atomic_minimum",
                    r"Sm80TopologicalVisitor<float, cute::tuple<"]:
        assert lines_matching(src, pattern), pattern
    assert "static_cast<float const*>(args.p_s)" in src and "args.s_alpha" in src


def test_every_op_emits():
    from evtc import ops

    for name, op in ops.OPS.items():
        if name in ("first", "convert", "group_quant", "glu"):  # evtc.quantize, evtc.glu: test_quantize.py, test_glu.py
            continue
        src = sm80(_op_epilogue(name, op.arity)).source
        assert f"VisitorCompute<{op.functor}," in src, name


def _op_epilogue(name, arity):
    from evtc.frontend.trace import apply

    def fn(acc, X: evtc.Matrix):
        operands = [acc, 1.5] if name == "pow" else [acc, X, acc][:arity]
        return apply(name, *operands)

    return evtc.epilogue(fn, name=f"op_{name}")


def test_reduction_only_epilogue_wraps_the_tree_in_the_reduction():
    @evtc.epilogue
    def stats(acc, bias: evtc.RowVector[f32]):
        return {"rmax": evtc.max(acc + bias, dim=1)}

    p = sm80(stats).plan
    assert p.tree.root.op.role == "row_reduction"
    assert p.thread_map_element is bf16


def test_dispatch_requirements_follow_the_variants():
    import epilogues as E

    src = sm80(E.residual_scale).source
    body = src[src.index("static int select_variant"):src.index("struct Scratch")]
    assert "args.N % 8 == 0" in body and "args.K % 8 == 0" in body
    assert "is_aligned(args.p_R1, 16) && args.ld_R1 % 8 == 0 && args.bs_R1 % 8 == 0" in body
    assert "is_aligned(args.p_bias, 16) && args.bs_bias % 4 == 0" in body
    assert "scale" not in body  # column broadcasts are read element by element
    assert body.count("return ") == 3 and "return 2;  // ragged" in body


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(__import__("strategies").random_epilogues())
def test_random_epilogues_plan_and_emit(ep):
    g = evtc.Gemm(ep, a=bf16, b=bf16, d=bf16, arch="sm80")
    p = g.plan
    names = {b.name for b in p.buffers}
    tensors = {i.name for i in g.graph.used_inputs if i.is_tensor} | {o.name for o in g.graph.outputs}
    assert tensors == names
    assert p.epilogue_smem_bytes == max(v.epilogue_smem_bytes for v in p.variants)
    assert all(b.bytes == 0 for b in p.buffers if b.mode == "direct")
    assert g.source.count("static_assert(callbacks_smem_bytes") == len(p.variants)


def test_binder_accepts_ragged_n_on_sm80():
    """On sm80 the kernel picks its vector width at run time, so N = 1031 binds."""
    import epilogues as E

    g = evtc.Gemm(E.bias_relu, a=f16, b=f16, c=f16, d=f16, arch="sm80")
    M, N, K = 64, 1031, 64
    A, B = _FakeCuda((M, K), "<f2"), _FakeCuda((N, K), "<f2")
    C, D = _FakeCuda((M, N), "<f2", ld=1032), _FakeCuda((M, N), "<f2", ld=1032)
    args, _, _, _ = g.dispatch.family.primary_binder().bind(A, B, {"C": C, "alpha": 1.0, "beta": 0.5, "bias": _FakeCuda((N,), "<f4")},
                                   out={"D": D})
    assert (args.N, args.ld_C, args.ld_D) == (N, 1032, 1032)


class _FakeCuda:
    """A device tensor as ``__cuda_array_interface__`` describes it (nothing is allocated)."""

    _next = 1 << 20

    def __init__(self, shape, typestr, ld=None):
        itemsize = int(typestr[2:])
        strides = None if ld is None else (ld * itemsize, itemsize)
        _FakeCuda._next += 1 << 24
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (_FakeCuda._next, False),
                                         "strides": strides, "version": 3}
