"""evtc.quantize without a GPU: the numpy quantizer of the interpreter against the torch
reference (bit for bit), the frontend's and the verifier's errors, the plan (one group per
epilogue subtile, D quantized), the members that can't run it, sm80's refusal, the emitted
visitor and the IR text round trip."""

import numpy as np
import pytest

import evtc
from evtc import dtypes
from evtc.errors import EpilogueTypeError, EvtcError, LegalizeError, PlanError
from evtc.ir.interpret import interpret
from evtc.ir.quant import quantize_groups

torch = pytest.importorskip("torch")
from evtc.testing.quant import quantize_per_token_group  # noqa: E402


def _y(M, N, seed):
    rng = np.random.default_rng(seed)
    y = (rng.standard_normal((M, N)) * rng.choice([1e-3, 1.0, 300.0], size=(M, 1))).astype(np.float32)
    if M > 4 and N > 70:
        y[1, :] = 0.0                 # amax 0: the epsilon
        y[2, 5] = np.inf              # inf in group 0
        y[3, 66] = np.nan             # NaN in group 1 (of 64)
        y[4, :] = 1e-12               # below the epsilon
    return y


@pytest.mark.parametrize("convention", ["vllm", "sglang", "deepgemm"])
@pytest.mark.parametrize("dtype", ["e4m3", "e5m2"])
@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("shape", [(9, 300), (5, 128), (1, 1000), (16, 77)])
def test_numpy_quantizer_is_bitwise_the_reference(convention, dtype, group, shape):
    y = _y(*shape, seed=hash((convention, dtype, group, shape)) % 1000)
    q, s = quantize_groups(y[None], group, convention, dtypes.coerce(dtype))
    q_ref, s_ref = quantize_per_token_group(torch.from_numpy(y), group, dtype, convention=convention)
    want_q = q_ref.float().numpy().astype(np.float64)
    assert np.array_equal(q[0], want_q, equal_nan=True)
    assert np.array_equal(s[0].astype(np.float32).view(np.int32)[~np.isnan(s[0])],
                          s_ref.numpy().view(np.int32)[~np.isnan(s[0])])
    assert np.array_equal(np.isnan(s[0]), np.isnan(s_ref.numpy()))
    # not vacuous: some quotient saturates at the dtype's max, and groups differ in scale
    assert np.nanmax(np.abs(q)) == dtypes.coerce(dtype).max
    assert len(np.unique(s[np.isfinite(s)])) > 1


@evtc.epilogue
def quant(acc, bias: evtc.RowVector[evtc.f32]):
    y = acc + bias
    q, s = evtc.quantize(y, evtc.e4m3, group=128)
    return {"D": q, "D_scale": s, "Y": y.to(evtc.f32)}


def test_interpreter_quantizes_per_group():
    rng = np.random.default_rng(1)
    acc, bias = rng.standard_normal((2, 33, 300)), rng.standard_normal(300)
    out = interpret(quant.graph, acc, {"bias": bias})
    assert out["D_scale"].shape == (2, 33, 3)
    for b in range(2):
        q_ref, s_ref = quantize_per_token_group(torch.from_numpy(out["Y"][b].astype(np.float32)), 128, "e4m3")
        assert np.array_equal(out["D"][b], q_ref.float().numpy())
        assert np.array_equal(out["D_scale"][b].astype(np.float32), s_ref.numpy())


def test_ir_text_round_trips():
    from evtc.ir.printer import print_graph

    text = print_graph(quant.graph)
    assert "group_quant(%0) {convention=vllm, group=128} : e4m3" in text
    assert "D_scale = group_scale(%1) : f32" in text
    assert evtc.parse_ir(text) == quant.graph


def _error(fn) -> EvtcError:
    with pytest.raises(EvtcError) as e:
        evtc.Gemm(evtc.epilogue(fn))
    return e.value


def test_frontend_refuses_bad_arguments():
    def not_fp8(acc):
        q, s = evtc.quantize(acc, evtc.bf16)
        return {"D": q, "S": s}

    def odd_group(acc):
        q, s = evtc.quantize(acc, evtc.e4m3, group=100)
        return {"D": q, "S": s}

    def bad_convention(acc):
        q, s = evtc.quantize(acc, evtc.e4m3, convention="fbgemm")
        return {"D": q, "S": s}

    def constant(acc):
        q, s = evtc.quantize(2.0, evtc.e4m3)
        return {"D": q, "S": s}

    def scales_converted(acc):
        q, s = evtc.quantize(acc, evtc.e4m3)
        return {"D": q, "S": s.to(evtc.bf16)}

    def group_float(acc):
        q, s = evtc.quantize(acc, evtc.e4m3, group=128.0)
        return {"D": q, "S": s}

    def group_bool(acc):
        q, s = evtc.quantize(acc, evtc.e4m3, group=True)
        return {"D": q, "S": s}

    def convention_none(acc):
        q, s = evtc.quantize(acc, evtc.e4m3, convention=None)
        return {"D": q, "S": s}

    def of_a_reduction(acc):
        q, s = evtc.quantize(evtc.amax(acc, dim=1), evtc.e4m3)
        return {"D": q, "S": s}

    assert "group=128.0" in str(_error(group_float)) and "group=True" in str(_error(group_bool))
    assert "convention=None" in str(_error(convention_none))
    assert "used inside" in str(_error(of_a_reduction))
    assert "e4m3 or e5m2" in str(_error(not_fp8))
    assert "group=100" in str(_error(odd_group))
    assert "fbgemm" in str(_error(bad_convention))
    assert "constant" in str(_error(constant))
    assert "f32" in str(_error(scales_converted))


def test_quantized_value_is_only_an_output_pair():
    def used_inside(acc):
        q, s = evtc.quantize(acc, evtc.e4m3)
        return {"D": q * 2.0, "S": s}

    def no_scales(acc):
        q, s = evtc.quantize(acc, evtc.e4m3)
        return {"D": q}

    def stored_twice(acc):
        q, s = evtc.quantize(acc, evtc.e4m3)
        return {"D": q, "E": q, "S": s}

    def quantized_twice(acc):  # the kernel quantizes D alone: a second pair would corrupt it
        q, s = evtc.quantize(acc, evtc.e4m3)
        q2, s2 = evtc.quantize(acc * 2.0, evtc.e4m3)
        return {"D": q, "S": s, "E": q2, "T": s2}

    for fn in (used_inside, no_scales, stored_twice, quantized_twice):
        err = _error(fn)
        assert isinstance(err, EpilogueTypeError), (fn.__name__, err)
        assert "quantize" in str(err), fn.__name__


def test_plan_quantizes_d_one_group_per_subtile():
    for cfg, tile in ((evtc.GemmConfig(tile=(128, 128, 64), schedule="cooperative"), (128, 128)),
                      (evtc.GemmConfig(tile=(128, 256, 64), schedule="cooperative"), (128, 128)),
                      (evtc.GemmConfig(tile=(64, 128, 64), schedule="pingpong", cluster=(1, 1, 1)), (64, 128))):
        g = evtc.Gemm(quant, config=cfg)
        assert tuple(g.plan.epilogue_tile) == tile
        assert g.plan.d_slot == "D"
        assert "evtc::Sm90GroupQuant<128, 0, 448>" in g.source
        assert "#include <evtc/sm90_group_quant.hpp>" in g.source


def test_configurations_that_cant_quantize_are_refused_before_any_build():
    swap = evtc.GemmConfig(tile=(64, 16, 64), cluster=(1, 1, 1), schedule="pingpong", swap_ab=True)
    odd_n = evtc.GemmConfig(tile=(128, 176, 64), schedule="pingpong", cluster=(1, 1, 1))
    for cfg, why in ((swap, "swap-AB"), (odd_n, "not a multiple of the group")):
        with pytest.raises(PlanError, match=why):
            evtc.Gemm(quant, config=cfg).plan
    with pytest.raises(PlanError, match="not one group wide"):
        evtc.Gemm(quant, config=evtc.GemmConfig(tile=(128, 128, 64), epilogue_tile=(128, 32))).plan
    with pytest.raises(PlanError, match="not one group wide"):
        evtc.Gemm(quant, config=evtc.GemmConfig(tile=(128, 128, 64)), plan={"epilogue_tile": [128, 32]}).plan
    with pytest.raises(LegalizeError, match="sm90 only"):
        evtc.Gemm(quant, arch="sm80").plan


def test_convolutions_and_grouped_gemms_refuse_quantize():
    with pytest.raises(PlanError, match="GEMMs only"):
        evtc.Conv(quant, kind="fprop").plan
    with pytest.raises(PlanError, match="grouped kernel does not quantize"):
        evtc.GroupedGemm(quant).plan


def test_family_keeps_only_members_that_can_quantize():
    fam = evtc.Gemm(quant).family
    assert fam, "no member left"
    for name, spec in fam.items():
        cfg = spec.config
        assert not cfg.swap_ab and cfg.tile[1] % 128 == 0, name
    plain = evtc.Gemm("D = acc + bias[n]").family
    assert set(fam) < set(plain)


def test_eager_quantize_on_numpy_and_bad_arguments():
    y = np.linspace(-3, 3, 2 * 300).reshape(2, 300)
    q, s = evtc.quantize(y, evtc.e4m3, group=128)
    q_ref, s_ref = quantize_per_token_group(torch.from_numpy(y).float(), 128, "e4m3")
    assert np.array_equal(q, q_ref.float().numpy()) and np.array_equal(s.astype(np.float32), s_ref.numpy())
    for bad in ({"x": np.ones(5)}, {"x": y, "group": 0}, {"x": y, "convention": "x"}, {"x": y, "dtype": "bf16"}):
        with pytest.raises(EvtcError):
            evtc.quantize(**bad)


def test_eager_quantize_is_the_reference():
    y = torch.randn(4, 256)
    q, s = evtc.quantize(y, evtc.e4m3, group=128)
    q_ref, s_ref = quantize_per_token_group(y, 128, "e4m3")
    assert torch.equal(q.view(torch.uint8), q_ref.view(torch.uint8)) and torch.equal(s, s_ref)


def _quant_with(layout):
    @evtc.epilogue(name=f"quant_{getattr(layout, 'value', layout)}")
    def q_layout(acc):
        q, s = evtc.quantize(acc, evtc.e4m3, group=128, scale_layout=layout)
        return {"D": q, "D_scale": s}

    return q_layout


def test_the_scale_layout_is_part_of_the_outputs_type():
    """scale_layout: row_major (the default, left out of the text) or col_major_tma (DeepGEMM's
    TMA layout); in the IR, the plan and the kernel's arguments (a row and a group stride, so one
    kernel writes either); bad values refused by name, before any build."""
    from evtc.abi import abi_fields
    from evtc.ir.printer import print_graph
    from evtc.testing.quant import ScaleLayout

    col = evtc.Gemm(_quant_with("col_major_tma"))
    text = print_graph(col.graph)
    assert "{convention=vllm, group=128, layout=col_major_tma}" in text
    assert evtc.parse_ir(text) == col.graph
    assert [o.layout for o in evtc.parse_ir(text).outputs if o.kind == "group_scale"] == ["col_major_tma"]
    assert "layout" not in print_graph(evtc.Gemm(_quant_with(ScaleLayout.ROW_MAJOR)).graph)
    assert "group, col_major_tma" in " ".join(str(col.plan).split())
    fields = {f.name: f.what for f in abi_fields(col.graph, "sm90")}
    assert fields["ld_D_scale"] == "ld" and fields["gs_D_scale"] == "group_stride"
    assert "args.ld_D_scale, args.gs_D_scale" in col.source
    for bad in ("colmajor", "COL_MAJOR_TMA", 3, None, ScaleLayout.MX_SM100_SWIZZLED):
        assert "scale_layout=" in str(_error(lambda acc, bad=bad: dict(zip(
            ("D", "S"), evtc.quantize(acc, evtc.e4m3, scale_layout=bad)))))
    # the text form's attribute is checked by the verifier
    with pytest.raises(EvtcError, match="layout"):
        evtc.Gemm(evtc.parse_ir(text.replace("layout=col_major_tma", "layout=swizzled")))


def test_the_binder_takes_the_declared_layout_and_refuses_the_other():
    """A caller's scales must have the declared layout (a dimension of extent 1 any stride);
    the kernel gets the grid's strides, evtc's allocation the layout's (batches a grid apart);
    the error names both layouts."""
    from test_runtime_launch import Fake

    M, N, K, G = 7, 300, 64, 3
    for layout, good, other in (("row_major", (3, 1), (1, 8)), ("col_major_tma", (1, 8), (3, 1))):
        binder = evtc.Gemm(_quant_with(layout), a=evtc.f16).dispatch.family.primary_binder()
        args, *_ = binder.bind(Fake((M, K)), Fake((N, K)), {}, {"D_scale": Fake((M, G), "<f4", strides=good)})
        assert (args.ld_D_scale, args.gs_D_scale, args.bs_D_scale) == good + (0,)
        args, *_ = binder.bind(Fake((M, K)), Fake((N, K)), {}, None)  # evtc's allocation
        assert (args.ld_D_scale, args.gs_D_scale) == good
        with pytest.raises(evtc.ArgumentError, match="ROW_MAJOR.*COL_MAJOR_TMA|COL_MAJOR_TMA.*ROW_MAJOR"):
            binder.bind(Fake((M, K)), Fake((N, K)), {}, {"D_scale": Fake((M, G), "<f4", strides=other)})
        one_row = 1 if layout == "row_major" else 4  # a grid of one row: its group stride (M padded to 4)
        args, *_ = binder.bind(Fake((1, K)), Fake((N, K)), {}, {"D_scale": Fake((1, G), "<f4", strides=(99, one_row))})
        assert args.gs_D_scale == one_row
    sig, _ = binder.signature(Fake((2, M, K)), Fake((2, N, K)), {}, None)
    alloc = next(a for a in sig.allocs if a.name == "D_scale")
    assert alloc.shape == (2, M, G) and alloc.strides == (G * 8, 1, 8)


def test_eager_quantize_returns_the_declared_layout():
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(3).standard_normal((7, 300))
    q, s = evtc.quantize(x, "e4m3", 128, scale_layout="col_major_tma")
    q0, s0 = evtc.quantize(x, "e4m3", 128)
    assert np.array_equal(s, s0) and np.array_equal(q, q0) and s.strides == (8, 64)
    t = torch.from_numpy(x).float()
    _, st = evtc.quantize(t, "e4m3", 128, scale_layout="col_major_tma")
    assert st.stride() == (1, 8) and torch.equal(st, evtc.quantize(t, "e4m3", 128)[1])
    with pytest.raises(evtc.ArgumentError, match="scale_layout"):
        evtc.quantize(x, "e4m3", 128, scale_layout="tma")


def test_a_quantizing_fragment_names_its_scales():
    """The fragment API (evtc.plugin.lower): the scales are a group_scale parameter, (L, M, G),
    with a row and a group stride; the header builds its fields (emit --fragment crashed on the
    group stride's description before)."""
    import evtc.plugin

    frag = evtc.plugin.lower(_quant_with("col_major_tma"), tile=(128, 256, 64), a=evtc.bf16)
    p = frag.parameter("D_scale")
    assert p.kind == "group_scale" and tuple(p.shape) == ("L", "M", "G") and p.io == "output"
    header = frag.header()
    assert "int64_t gs_D_scale = 0;" in header and "int64_t ld_D_scale = 0;" in header
