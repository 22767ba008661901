"""evtc.GroupedGemm without a GPU (issue 39): what the grouped kernel accepts and refuses, its
plan's shared memory (the pointer-array collective's tensor maps), its source and ABI, the
family rule, and the argument checks that run before any build."""

import sys
from pathlib import Path

import pytest

import evtc
from evtc import f32
from evtc.abi import abi_fields, grouped_abi_fields
from evtc.errors import ArgumentError, ConfigError, PlanError
from evtc.grouped import GROUPED_MEMBERS, GroupedGemm, choose_member
from evtc.plan.smem import round_up

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "examples"))
import epilogues as E  # noqa: E402


@evtc.epilogue
def swiglu_up(acc, gate: evtc.Matrix):
    return evtc.silu(gate) * acc


@evtc.epilogue
def per_expert(acc, weight: evtc.ColVector[f32], alpha: evtc.DeviceScalar[f32], bias: evtc.RowVector[f32]):
    return weight * (alpha * acc + bias)


@pytest.mark.parametrize("member", list(GROUPED_MEMBERS))
@pytest.mark.parametrize("epilogue", [E.bias_relu, E.linear_combination, swiglu_up, per_expert, "D = acc"])
def test_grouped_source_is_the_pointer_array_kernel(epilogue, member):
    g = GroupedGemm(epilogue, member=member)
    src = g.source()
    cfg = GROUPED_MEMBERS[member]
    sched = "Cooperative" if cfg.schedule == "cooperative" else "Pingpong"
    assert f"cutlass::gemm::KernelPtrArrayTmaWarpSpecialized{sched}" in src
    assert "cutlass::gemm::GroupProblemShape<cute::Shape<int, int, int>>" in src
    assert "Sm90PtrArrayTmaWarpSpecialized<StagesC, StagesD, FragmentSize, ReuseSmemC, DelayTmaStore, 2>" in src
    assert "group_setup<<<" in src and "evtc_group_table_bytes" in src
    assert "DelayTmaStore = false" in src  # CUTLASS's builder never delays the store of a pointer-array kernel
    # the plan's epilogue bytes are what the source asserts sizeof(SharedStorage) is
    assert f"== {g.kernel().plan.epilogue_smem_bytes}," in src
    for leaf in g.graph.used_inputs:
        if type(leaf).__name__ in ("RowBroadcast", "ColBroadcast"):
            assert f"{leaf.dtype.cutlass}*, float" in src  # the array-of-pointers visitor


@pytest.mark.parametrize("epilogue", [E.bias_relu, swiglu_up, per_expert])
def test_grouped_plan_adds_the_tensor_maps(epilogue):
    """The grouped plan's SharedStorage is its TensorStorage (the plan's buffers), then the
    128-aligned TensorMapStorage (C's descriptor and two D descriptors: 384 B), then the load
    pipeline's barriers (16 B a C stage), rounded to the struct's alignment (its swizzled
    buffers'); the mainloop's stages are what is left of 232448 B after A's and
    B's descriptors (256 B). The compiled sizeof agrees: the source static_asserts it
    (tests/compile/test_grouped_build.py builds one)."""
    g = GroupedGemm(epilogue, member="coop128x128")
    p = g.kernel().plan
    # alignof: the widest swizzled M x N buffer's (Swizzle<B,4,3> aligns to 2^(B+7) B: 1024 B for
    # 128-byte subtile rows, 512 B for 64-byte ones; cutlass/detail/layout.hpp)
    row = p.epilogue_tile[1] * 2
    align = 1024 if row % 128 == 0 else 512 if row % 64 == 0 else 256
    end = max(b.offset + b.bytes for b in p.buffers if b.mode in ("tma", "smem"))
    if not any(b.mode == "smem" for b in p.buffers):
        end += 1  # the visitors' storage is an empty struct: sizeof 1 (C++)
    tensors = round_up(end, align)
    want = round_up(tensors + 3 * 128 + 16 * p.stages_c, align)
    assert p.epilogue_smem_bytes == want
    assert p.mainloop_stages == (232448 - 256 - want) // p.mainloop_stage_bytes


@pytest.mark.parametrize("epilogue,kinds", [(E.row_stats, {"row_max": "red_row", "row_sum": "red_row"}),
                                            (E.dgelu_bgrad, {"dbias": "red_col"}), (E.fp8_out, {"amax": "red_scalar"})])
def test_grouped_reductions_are_per_group_atomics(epilogue, kinds, no_build):
    """NOTE [Reductions in the grouped kernel]: a row reduction per token, a column reduction per
    expert and a scalar per expert, each evtc::Sm90ReductionGrouped through a group table pointer
    (the token's, the expert's row of (E, N), its element of (E,)); no workspace."""
    from evtc.emit.sm90_grouped import group_vectors

    g = GroupedGemm(epilogue, member="coop128x256")
    p = g.kernel().plan
    got = {name: kind for name, kind, _ in group_vectors(g.graph, p)}
    assert {n: got[n] for n in kinds} == kinds
    for n in kinds:
        assert p.buffer(n).mode == "atomic"
    src = g.source()
    assert src.count("evtc::Sm90ReductionGrouped<") == len(kinds)
    for n, kind in kinds.items():
        want = "+ start;" if kind == "red_row" else f"+ e * args.bs_{n};"
        assert f"static_cast<float const*>(args.p_{n}) {want}" in src, n


def test_grouped_reductions_into_16_bit_outputs_are_refused(no_build):
    @evtc.epilogue
    def rowmax_bf16(acc):
        return {"D": acc, "m": evtc.max(acc, dim=1).to(evtc.bf16)}

    with pytest.raises(PlanError, match="reduces into f32") as e:
        GroupedGemm(rowmax_bf16)
    assert "'m'" in str(e.value)


@pytest.mark.parametrize("epilogue", [E.gelu_aux, E.residual_scale, E.many_aux])
def test_grouped_aux_tensors_go_through_the_group_table(epilogue):
    """Aux loads beyond C and aux stores beyond D are register-direct through per-group
    pointers: evtc's grouped visitors, the group table's "mn" arrays, no TMA aux buffers."""
    g = GroupedGemm(epilogue, member="coop128x128")
    src, p = g.source(), g.kernel().plan
    extra = [n.name for n in g.graph.used_inputs if type(n).__name__ in ("AuxLoad", "Source") and n.name != p.c_slot]
    extra += [o.name for o in g.graph.outputs if o.name != p.d_slot]
    assert extra
    for name in extra:
        assert f"+ start * args.ld_{name};" in src  # its pointer per group
        assert p.aux_mode(name)[0] == "direct"
    assert ("evtc::Sm90AuxStoreGrouped<" in src) == any(type(o).__name__ == "Store" and o.name != p.d_slot
                                                         for o in g.graph.outputs)
    assert "#include <evtc/sm90_grouped.hpp>" in src


def test_grouped_config_rules():
    with pytest.raises(ConfigError, match="persistent"):
        GroupedGemm(E.bias_relu, config=evtc.GemmConfig(scheduler="streamk", schedule="cooperative"))
    with pytest.raises(ConfigError, match="swap_ab"):
        GroupedGemm(E.bias_relu, config=evtc.GemmConfig(swap_ab=True))
    with pytest.raises(ConfigError, match="sm90 kernel variant"):
        evtc.Gemm(E.bias_relu, arch="sm80", config=evtc.GemmConfig(grouped=True, tile=(128, 128, 32)))
    with pytest.raises(ConfigError, match="member"):
        GroupedGemm(E.bias_relu, member="huge")
    with pytest.raises(ConfigError, match="not a GemmConfig"):
        GroupedGemm(E.bias_relu, config=(128, 128, 64))
    # grouped=False stays out of the config's JSON: the other kernels' sources don't change
    assert "grouped" not in evtc.GemmConfig().to_json()
    assert evtc.GemmConfig(grouped=True).to_json()["grouped"] is True


def test_grouped_abi_adds_offsets_and_table():
    g = GroupedGemm(E.bias_relu)
    f = grouped_abi_fields(g.graph)
    assert f[:-2] == abi_fields(g.graph, "sm90")
    assert [(x.name, x.what) for x in f[-2:]] == [("p_offs", "ptr"), ("p_groups", "ptr")]


def test_grouped_member_rule():
    assert choose_member(8, 256, 4096) == "pp64x128"  # decode: a few tokens per expert
    assert choose_member(64 * 128, 128, 768) == "pp64x128"
    assert choose_member(64 * 128 + 1, 128, 768) == "coop128x256"
    assert choose_member(512 * 8, 8, 14336) == "coop128x256"
    assert choose_member(0, 0, 4096) == "pp64x128"


def test_grouped_call_checks_before_build(no_build):
    torch = pytest.importorskip("torch")
    g = GroupedGemm(E.bias_relu)
    A = torch.zeros(8, 64, dtype=torch.bfloat16)
    B = torch.zeros(2, 64, 64, dtype=torch.bfloat16)
    offs = torch.tensor([4, 8], dtype=torch.int32)
    with pytest.raises(ArgumentError, match="A is on cpu"):
        g(A, B, offs, C=A, alpha=1.0, beta=1.0, bias=torch.zeros(64))
    with pytest.raises(ArgumentError, match="not a torch tensor"):
        g([[1.0]], B, offs)


def test_grouped_torch_op_schema_and_fake():
    """The op torch.compile puts in its graph: the epilogue's parameters in its schema, and a
    fake implementation giving D's (T, N) shape and dtype without a GPU."""
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    gg = GroupedGemm(E.bias_relu)
    op = gg.torch_op()
    assert op.schema == "(Tensor A, Tensor B, Tensor offs, Tensor C, Tensor bias, float alpha, float beta) -> Tensor"
    assert op.qualname.startswith("evtc::grouped_bias_relu_")
    assert GroupedGemm(E.bias_relu).torch_op() is op  # one op per distinct GroupedGemm
    with FakeTensorMode():
        cuda = dict(device="cuda")
        A = torch.empty(10, 64, dtype=torch.bfloat16, **cuda)
        B = torch.empty(3, 48, 64, dtype=torch.bfloat16, **cuda)
        offs = torch.empty(3, dtype=torch.int32, **cuda)
        D = op(A, B, offs, C=torch.empty(10, 48, dtype=torch.bfloat16, **cuda), bias=torch.empty(3, 48, **cuda),
               alpha=1.0, beta=2.0)
        assert (tuple(D.shape), D.dtype) == ((10, 48), torch.bfloat16)
    with pytest.raises(ArgumentError, match="missing bias"):
        op(A, B, offs, C=A, alpha=1.0, beta=2.0)


@pytest.mark.parametrize("epilogue,shapes", [
    (E.row_stats, {"D": (10, 48), "row_max": (10,), "row_sum": (10,)}),
    (E.dgelu_bgrad, {"D": (10, 48), "dbias": (3, 48)}),
    (E.fp8_out, {"D": (10, 48), "amax": (3,)}),
])
def test_grouped_torch_op_returns_the_reductions(epilogue, shapes):
    """A GroupedGemm with reductions has a torch op too (it had none: "its reductions' shapes are
    not in the op's schema"): every output in the epilogue's order, the reductions f32 and shaped
    as the call returns them (NOTE [Reductions in the grouped kernel]): per token (T,), per
    expert (E, N) and (E,)."""
    torch = pytest.importorskip("torch")
    from torch._subclasses.fake_tensor import FakeTensorMode

    gg = GroupedGemm(epilogue)
    op = gg.torch_op()
    assert op.output_names == tuple(o.name for o in gg.graph.outputs) and set(op.output_names) == set(shapes)
    assert op.schema.endswith("-> (" + ", ".join(["Tensor"] * len(shapes)) + ")")
    with FakeTensorMode():
        cuda = dict(device="cuda")
        A = torch.empty(10, 64, dtype=torch.bfloat16, **cuda)
        B = torch.empty(3, 48, 64, dtype=torch.bfloat16, **cuda)
        offs = torch.empty(3, dtype=torch.int32, **cuda)
        kw = {}
        for leaf in gg.graph.used_inputs:
            if leaf.name in op.scalar_names:
                kw[leaf.name] = 1.0
            elif leaf.name in op.tensor_names:
                kind = type(leaf).__name__
                shape = {"RowBroadcast": (3, 48), "ColBroadcast": (10,)}.get(kind, (10, 48))
                kw[leaf.name] = torch.empty(shape, dtype=getattr(torch, leaf.dtype.torch), **cuda)
        got = op(A, B, offs, **kw)
        for name, shape in shapes.items():
            want = torch.float32 if name != "D" else getattr(torch, gg.graph.output("D").dtype.torch)
            assert (tuple(got[name].shape), got[name].dtype) == (shape, want), name


def test_grouped_out_is_a_dict_when_the_result_is(no_build, monkeypatch):
    """With reductions beside D the result is a dict, and so may out= be (the GPU test passed
    {'D': ...} and got "out is a dict, not a torch tensor"); a bare tensor still names D; a
    reduction in out= is refused by name (evtc allocates and fills it). T = 0: no kernel runs."""
    torch = pytest.importorskip("torch")
    import evtc.grouped as grouped

    def on_cpu_too(t, what, device, name):
        if not isinstance(t, torch.Tensor):
            raise ArgumentError(f"{what} is a {type(t).__name__}, not a torch tensor")

    monkeypatch.setattr("evtc.runtime.grouped_args.check_cuda", on_cpu_too)
    g = GroupedGemm(E.row_stats)
    A = torch.zeros(0, 64, dtype=torch.bfloat16)
    B = torch.zeros(2, 48, 64, dtype=torch.bfloat16)
    offs = torch.zeros(2, dtype=torch.int32)
    ins = dict(C=torch.zeros(0, 48, dtype=torch.bfloat16), alpha=1.0, beta=0.5, shift=torch.zeros(0))
    d_name = next(o.name for o in g.graph.outputs if isinstance(o, evtc.ir.nodes.Store))
    D = torch.zeros(0, 48, dtype=getattr(torch, g.graph.outputs[0].dtype.torch))
    for out in ({d_name: D}, D):
        got = g.run_eager(A, B, offs, out=out, **ins)
        assert isinstance(got, dict) and got[d_name] is D and set(got) == {o.name for o in g.graph.outputs}
    red = next(o.name for o in g.graph.outputs if not isinstance(o, evtc.ir.nodes.Store))
    with pytest.raises(ArgumentError, match=f"reduction.*'{red}'"):
        g.run_eager(A, B, offs, out={d_name: D, red: torch.zeros(0)}, **ins)
    with pytest.raises(ArgumentError, match="out\\['D'\\]|out\\['"):
        g.run_eager(A, B, offs, out={d_name: torch.zeros(0, 47, dtype=D.dtype)}, **ins)
