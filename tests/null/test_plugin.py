"""The fragment API (evtc.plugin) without a compiler: the fragment's C++ is the GEMM's, its
placeholders and Params agree, its parameters describe the epilogue, and every mismatch a
generator can make is a FragmentError naming it."""

import json
import re
import string
from pathlib import Path

import pytest
from click.testing import CliRunner

import evtc
import evtc.plugin
from evtc import bf16, e4m3, f16, f32
from evtc.errors import ConfigError, FragmentError, PlanError

TILE = (128, 256, 64)


def lower(ep, **kw):
    args = dict(tile=TILE, a=bf16, d=bf16)
    args.update(kw)
    return evtc.plugin.lower(ep, **args)


def using_lines(text: str) -> list[tuple[str, str]]:
    """(alias, type) of the visitor-tree aliases (N<k>_..., EVT<k>, Topo<k>) and FusionCallbacks."""
    out = re.findall(r"^\s*using (N\d+_\w+|EVT\d+|Topo\d+|FusionCallbacks) = (.*);$", text, re.M)
    assert out
    return out


def reference_cases():
    import epilogues as E

    cases = {name: (ep, {}) for name, ep in E.REFERENCE.items()}
    cases["fp8_out"] = (E.fp8_out, {"a": e4m3})
    cases["many_aux/128x128"] = (E.many_aux, {"tile": (128, 128, 64)})
    cases["gelu_aux/pingpong"] = (E.gelu_aux, {"tile": (128, 128, 64), "schedule": "pingpong"})
    cases["residual_scale/c_slot=R1"] = (E.residual_scale, {"plan": {"c_slot": "R1"}})
    cases["bias_relu/stages=3"] = (E.bias_relu, {"stages": 3})
    return cases


@pytest.mark.parametrize("case", list(reference_cases()))
def test_fragment_is_the_gemms_epilogue(case):
    """The fusion callbacks, collective parameters and plan numbers of a fragment are those of
    evtc's own GEMM of the same configuration, alias for alias."""
    ep, kw = reference_cases()[case]
    frag = lower(ep, **kw)
    cfg = evtc.GemmConfig(tile=kw.get("tile", TILE), cluster=(1, 1, 1), schedule=kw.get("schedule", "cooperative"),
                          stages=kw.get("stages"))
    g = evtc.Gemm(ep, a=kw.get("a", bf16), d=bf16, config=cfg, plan=kw.get("plan", "evtc"))
    gemm_using = [(a, t) for a, t in using_lines(g.source) if a != "FusionCallbacks"]
    frag_using = [(a, t) for a, t in using_lines(frag.declarations) if a != "FusionCallbacks"]
    assert frag_using == gemm_using
    root = dict(using_lines(g.source))["FusionCallbacks"]
    assert dict(using_lines(frag.declarations))["FusionCallbacks"] == root
    p = g.plan
    assert (frag.epilogue_tile, frag.stages_c, frag.stages_d, frag.reuse_smem_c, frag.delay_tma_store) == \
           (p.epilogue_tile, p.stages_c, p.stages_d, p.reuse_smem_c, p.delay_tma_store)
    assert (frag.c_input, frag.d_output, frag.smem_bytes, frag.mainloop_stages) == \
           (p.c_slot, p.d_slot, p.epilogue_smem_bytes, p.mainloop_stages)
    for key, value in (("StagesC", p.stages_c), ("StagesD", p.stages_d), ("FragmentSize", p.fragment_size),
                       ("SharedStorageBytes", p.epilogue_smem_bytes), ("MainloopStages", p.mainloop_stages)):
        assert re.search(rf"static constexpr int {key} = {value};", frag.declarations), key
    assert f"ReuseSmemC = {str(p.reuse_smem_c).lower()};" in frag.declarations
    # the GEMM's collective-epilogue lines name the same C/D types
    assert re.search(rf"using ElementC = {re.escape(frag.element_c)};", g.source)
    assert re.search(rf"using ElementD = {re.escape(frag.element_d)};", g.source)


def test_many_aux_promotes_an_aux_load_into_the_c_slot():
    """The plan's slot decisions reach the fragment: X is loaded through the C slot (ptr_C is X's
    pointer), D reuses its buffer, P and Q live in Y's and Z's buffers (evtc::Sm90SmemShare)."""
    import epilogues as E

    frag = lower(E.many_aux, cluster=(2, 1, 1))
    assert (frag.c_input, frag.d_output, frag.reuse_smem_c) == ("X", "D", True)
    assert frag.parameter("X").slot == "C" and frag.parameter("D").slot == "D"
    assert frag.parameter("P").mode == "shared" and frag.parameter("Y").slot is None
    assert "${p_X}),  // ptr_C" in frag.epilogue_arguments
    assert "${ld_X}, cute::_1{}, ${bs_X}},  // dC" in frag.epilogue_arguments
    assert "evtc::Sm90SmemShare<" in frag.declarations


def test_placeholders_bind_and_agree_with_the_header():
    import epilogues as E

    frag = lower(E.row_stats)
    names = [p.name for p in frag.placeholders]
    assert names == ["p_C", "ld_C", "bs_C", "s_alpha", "s_beta", "p_shift", "bs_shift", "p_D", "ld_D", "bs_D",
                     "p_row_max", "bs_row_max", "p_row_sum", "bs_row_sum"]
    assert set(re.findall(r"\$\{(\w+)\}", frag.epilogue_arguments)) == set(names)
    assert "$" not in frag.epilogue_arguments.replace("${", "")
    # the fusion initializer is the epilogue initializer's first part
    assert not {"p_C", "ld_C", "p_D", "ld_D"} & set(re.findall(r"\$\{(\w+)\}", frag.fusion_arguments))
    bound = frag.bind({n: f"args.{n}" for n in names})
    assert "${" not in bound
    # the header's arguments(Params const& args) returns the same initializer
    body = frag.declarations.split("arguments(Params const& args) {\n    return ", 1)[1].split(";\n  }", 1)[0]
    assert [line.strip() for line in body.splitlines()] == [line.strip() for line in bound.strip().splitlines()]
    # and its Params struct has every placeholder, in order, with its C type
    params = re.findall(r"^    (const void\*|void\*|int64_t|float) (\w+) = ", frag.declarations, re.M)
    assert params == [(p.ctype, p.name) for p in frag.placeholders]
    # string.Template works the same
    assert string.Template(frag.epilogue_arguments).substitute({n: f"args.{n}" for n in names}) == bound


def test_bind_refuses_missing_unknown_and_twice_bound_placeholders():
    import epilogues as E

    frag = lower(E.bias_relu)
    full = {p.name: "0" for p in frag.placeholders}
    with pytest.raises(FragmentError, match=r"placeholder s_beta of fragment evtc_fragment::EvtcEpilogue is not bound"):
        frag.bind({k: v for k, v in full.items() if k != "s_beta"})
    with pytest.raises(FragmentError, match="has no placeholder p_bogus"):
        frag.bind(full, p_bogus="x")
    with pytest.raises(FragmentError, match="'p_C' is bound twice"):
        frag.bind(full, p_C="y")
    with pytest.raises(FragmentError, match="give a C\\+\\+ expression"):
        frag.bind({**full, "p_C": None})
    with pytest.raises(FragmentError, match="'epilogue' or 'fusion'"):
        frag.bind(full, which="all")
    fusion = frag.bind({k: v for k, v in full.items() if not k.endswith(("_C", "_D"))}, which="fusion")
    assert "${" not in fusion and "float(0)" in fusion


@pytest.mark.parametrize("value,why", [
    ("", "an empty expression"), ("}", "an unbalanced '}'"), ("(args.p_C", "an unclosed '\\('"),
    ("args.p_C, 0", "a ',' outside brackets"), ("args.p_C; launch()", "a ';' outside brackets"),
    ("args.p_C // the C pointer", "a comment"), ("'x", "an unterminated literal"),
])
def test_bind_refuses_what_is_not_one_expression(value, why):
    """bind pasted any text: '' or '}' broke the initializer, and 'a, b' added an element that
    shifted every field after it, which C++ may accept (a silently wrong initializer)."""
    import epilogues as E

    frag = lower(E.bias_relu)
    full = {p.name: "0" for p in frag.placeholders}
    with pytest.raises(FragmentError, match=f"placeholder 'p_C' = .*: {why}"):
        frag.bind({**full, "p_C": value})
    for ok in ("static_cast<void const*>(args.p_C)", "f(a, b)", "x[i]", "'a'", '"a, b"', "(pick<int, 2>(x))"):
        assert ok in frag.bind({**full, "p_C": ok})


def test_parameters_describe_every_kind():
    @evtc.epilogue
    def all_kinds(acc, C, alpha: float, s: evtc.DeviceScalar[f32], r: evtc.RowVector[bf16], c: evtc.ColVector[f32],
                  X: evtc.Matrix[f16]):
        y = evtc.where(acc > 0.5, alpha * acc + C, s * X) + r + c
        return {"D": y, "F": evtc.gelu(y).to(e4m3), "rmax": evtc.max(y, dim=1), "csum": evtc.sum(y, dim=0),
                "amin": evtc.min(y)}

    frag = lower(all_kinds)
    got = {p.name: (p.kind, p.io, p.dtype, p.shape, p.slot, p.alignment, p.placeholders) for p in frag.parameters}
    assert got == {
        "C": ("source", "input", "bf16", ("L", "M", "N"), "C", 16, ("p_C", "ld_C", "bs_C")),
        "alpha": ("scalar", "input", "f32", (), None, 0, ("s_alpha",)),
        "s": ("device_scalar", "input", "f32", ("L",), None, 4, ("p_s", "bs_s")),
        "r": ("row_broadcast", "input", "bf16", ("L", "N"), None, 2, ("p_r", "bs_r")),
        "c": ("col_broadcast", "input", "f32", ("L", "M"), None, 4, ("p_c", "bs_c")),
        "X": ("aux_load", "input", "f16", ("L", "M", "N"), None, 16, ("p_X", "ld_X", "bs_X")),
        "D": ("store", "output", "bf16", ("L", "M", "N"), "D", 16, ("p_D", "ld_D", "bs_D")),
        "F": ("store", "output", "e4m3", ("L", "M", "N"), None, 16, ("p_F", "ld_F", "bs_F")),
        "rmax": ("row_reduction", "output", "f32", ("L", "M"), None, 4, ("p_rmax", "bs_rmax")),
        "csum": ("col_reduction", "output", "f32", ("L", "N"), None, 4, ("p_csum", "bs_csum")),
        "amin": ("scalar_reduction", "output", "f32", ("L",), None, 4, ("p_amin", "bs_amin")),
    }
    assert frag.parameter("rmax").reduce == "max" and frag.parameter("rmax").identity == float("-inf")
    assert frag.parameter("amin").identity == float("inf") and frag.parameter("csum").identity == 0.0
    assert frag.parameter("X").element == "cutlass::half_t" and frag.parameter("c").mode == "registers"
    assert frag.parameter("csum").mode == "workspace" and frag.parameter("amin").mode == "atomic"
    assert [p.placeholders for p in frag.parameters] == \
           [tuple(x.name for x in frag.placeholders if x.tensor == p.name) for p in frag.parameters]
    json.dumps(frag.to_json())  # the whole contract is JSON (infinite identities as strings)
    with pytest.raises(FragmentError, match="has no parameter 'nope'"):
        frag.parameter("nope")


def test_every_input_form_gives_the_same_fragment():
    expr = "D = relu(alpha*acc + beta*C + bias[n])"
    g = evtc.from_expr(expr)
    frags = [lower(expr), lower(g), lower(str(g)), lower("# a comment\n" + str(g))]
    assert len({f.header() for f in frags}) == 1

    @evtc.epilogue
    def expr_fn(acc, alpha: float, beta: float, C, bias: evtc.RowVector[f32]):
        return evtc.relu(alpha * acc + beta * C + bias)

    assert lower(expr_fn).ir.replace("expr_fn", "expr") == frags[0].ir
    with pytest.raises(FragmentError, match="epilogue=int"):
        lower(42)


def test_headers_are_deterministic_and_two_fragments_differ_only_in_names():
    import epilogues as E

    a = lower(E.gelu_aux, name="GeluA", namespace="ns::one")
    b = lower(E.gelu_aux, name="GeluA", namespace="ns::one")
    c = lower(E.gelu_aux, name="GeluB", namespace="ns::two")
    assert a.header() == b.header() and a == b
    assert a.header() != c.header()
    assert a.header().replace("GeluA", "GeluB").replace("ns::one", "ns::two") == c.header()
    assert c.qualified_name == "ns::two::GeluB" and c.callbacks_type == "ns::two::GeluB::FusionCallbacks"
    assert "namespace ns::two {" in c.declarations and "struct GeluB {" in c.declarations
    assert c.header().count("#pragma once") == 1 and "${" not in c.header()


def test_headers_and_flags_point_at_real_files():
    import epilogues as E

    frag = lower(E.bias_relu)
    dirs = [Path(d) for d in frag.include_dirs]
    for h in frag.headers + frag.support_headers:
        assert any((d / h).is_file() for d in dirs), h
    for h in frag.evtc_headers + frag.support_headers:  # evtc's own, in evtc's include directory
        assert (dirs[0] / h).is_file(), h
    for h in frag.headers:
        assert f"#include <{h}>" in frag.header()
    for h in frag.support_headers:  # included once per library by the consumer, not by the fragment
        assert f"#include <{h}>" not in frag.header()
    assert "-std=c++17" in frag.nvcc_flags and "-gencode=arch=compute_90a,code=sm_90a" in frag.nvcc_flags
    assert "-shared" not in frag.nvcc_flags and not any(f.startswith("-I") for f in frag.nvcc_flags)


# ---- check: what a generator asks against what the fragment allows ----------------------------------


@pytest.fixture(scope="module")
def bias_relu_fragment():
    import epilogues as E

    return lower(E.bias_relu, name="BiasRelu")


@pytest.mark.parametrize("kw, message", [
    ({"tile": (128, 128, 64)}, r"tile \(128, 128, 64\) is not the tile it was planned for, \(128, 256, 64\)"),
    ({"tile": (128, 256, 128)}, r"tile \(128, 256, 128\) is not the tile"),
    ({"schedule": "pingpong"}, r"schedule 'pingpong' is not the schedule it was planned for, 'cooperative'"),
    ({"schedule": "cutlass::gemm::KernelTmaWarpSpecializedPingpong"}, "not the schedule it was planned for"),
    ({"epilogue_tile": (128, 64)}, r"epilogue tile \(128, 64\) is not the planned \(128, 32\)"),
    ({"cluster": (3, 1, 1)}, r"cluster \(3, 1, 1\) is not a legal sm90 cluster"),
    ({"a": f16}, "a=f16: it was planned for a=bf16"),
    ({"b": "e4m3"}, "b=e4m3: it was planned for b=bf16"),
    ({"c": f16}, r"c=f16: its C slot holds C \(bf16\)"),
    ({"c": "void"}, r"c=void: its C slot holds C"),
    ({"d": f32}, r"d=f32: its D slot holds D \(bf16\)"),
    ({"stages": 5}, "5 mainloop stages of 49168 B do not fit beside the epilogue's 34304 B"),
    ({"stages": 1}, "stages=1: the TMA mainloop needs an integer >= 2"),
    ({"version": 2}, "written for fragment version 2, the fragment is version 1"),
    ({"a": "f64"}, "check\\(a='f64'\\)"),
])
def test_check_names_each_mismatch(bias_relu_fragment, kw, message):
    with pytest.raises(FragmentError, match=message) as info:
        bias_relu_fragment.check(**kw)
    assert info.value.anchor == "fragment" and "evtc_fragment::BiasRelu" in str(info.value)


def test_check_accepts_what_it_was_planned_for(bias_relu_fragment):
    f = bias_relu_fragment
    f.check(tile=[128, 256, 64], schedule="cooperative", cluster=(2, 1), epilogue_tile=(128, 32), a="bf16", b=bf16,
            c="bf16", d="bf16", stages=4, version=1)
    f.check(schedule="cutlass::gemm::KernelTmaWarpSpecializedCooperative")
    f.check(schedule="cutlass::epilogue::TmaWarpSpecializedCooperative", cluster=(1, 4, 1))
    f.check()  # nothing asked, nothing checked


def test_check_of_a_fragment_without_c():
    import epilogues as E

    frag = lower(E.gelu_aux)
    assert frag.c_input is None and frag.element_c == "void"
    frag.check(c="void", d=bf16)
    with pytest.raises(FragmentError, match="c=bf16: it has no C slot"):
        frag.check(c=bf16)
    assert "nullptr,  // ptr_C" in frag.epilogue_arguments


# ---- lower: bad requests ------------------------------------------------------------------------------


@pytest.mark.parametrize("kw, error, message", [
    ({"arch": "sm80"}, FragmentError, "epilogue fragments are CUTLASS 3.x sm90"),
    ({"name": "3x"}, FragmentError, "name='3x' is not a C\\+\\+ identifier"),
    ({"name": "class"}, FragmentError, "is a C\\+\\+ keyword"),
    ({"name": "__x"}, FragmentError, "reserved name"),
    ({"name": "FusionCallbacks"}, FragmentError, "the name of a member of the fragment struct"),
    ({"name": "EVT3"}, FragmentError, "the name of a member"),
    ({"name": None}, FragmentError, "name=None is not a C\\+\\+ identifier"),
    ({"namespace": "a::"}, FragmentError, "namespace='' is not a C\\+\\+ identifier"),
    ({"namespace": "cutlass"}, FragmentError, "a name CUTLASS or evtc uses"),
    ({"namespace": ""}, FragmentError, "a C\\+\\+ namespace"),
    ({"epilogue_tile": (128, 48)}, ConfigError, r"epilogue tile \(128, 48\) doesn't fit tile \(128, 256, 64\)"),
    ({"epilogue_tile": (64, 32)}, ConfigError, "doesn't fit tile"),
    ({"tile": (96, 256, 64)}, ConfigError, "tile M = 96"),
    ({"tile": (128, 256)}, ConfigError, "needs a tuple of 3 positive integers"),
    ({"schedule": "magic"}, ConfigError, "schedule 'magic'"),
    ({"cluster": (8, 1, 1)}, ConfigError, "cluster"),
    ({"a": f32}, ConfigError, "a=f32 is not a sm90 mainloop dtype"),
    ({"stages": 9}, PlanError, "leaves the mainloop 9 stages"),
])
def test_lower_refuses_bad_requests(kw, error, message):
    import epilogues as E

    with pytest.raises(error, match=message):
        lower(E.bias_relu, **kw)


def test_lists_and_two_extent_clusters_are_accepted():
    import epilogues as E

    frag = lower(E.bias_relu, tile=[128, 256, 64], cluster=[2, 1], epilogue_tile=[128, 32])
    assert frag.tile == (128, 256, 64) and frag.cluster == (2, 1, 1) and frag.epilogue_tile == (128, 32)
    assert "using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;" in frag.declarations


def test_a_plan_that_does_not_fit_the_tile_is_a_plan_error():
    import epilogues as E

    with pytest.raises(PlanError, match=r"no cutlass plan leaves the mainloop 2 stages at tile \(256, 256, 64\)"):
        lower(E.many_aux, tile=(256, 256, 64), plan="cutlass")


def test_epilogue_errors_stay_located():
    with pytest.raises(evtc.GrammarError):
        lower("D = relu(acc +")


# ---- evtc emit --fragment ---------------------------------------------------------------------------------


def test_cli_writes_the_fragment_header(tmp_path):
    import epilogues as E
    from evtc.cli import main

    out = tmp_path / "g.h"
    spec = str(Path(__file__).resolve().parents[2] / "examples" / "epilogues.py") + ":gelu_aux"
    res = CliRunner().invoke(main, ["emit", spec, "--fragment", "--name", "GeluAux",
                                    "--namespace", "my::kernels", "--tile", "128x128x64", "--cluster", "1x2",
                                    "--schedule", "pingpong", "-o", str(out)])
    assert res.exit_code == 0, res.output
    want = evtc.plugin.lower(E.gelu_aux, tile=(128, 128, 64), cluster=(1, 2, 1), schedule="pingpong", a=bf16,
                             name="GeluAux", namespace="my::kernels")
    assert out.read_text() == want.header()
    assert "fragment my::kernels::GeluAux of gelu_aux" in res.output
    res = CliRunner().invoke(main, ["emit", "--expr", "D = relu(acc)", "--fragment"])
    assert res.exit_code == 0 and "struct EvtcEpilogue {" in res.output and "namespace evtc_fragment {" in res.output


def test_cli_fragment_errors_exit_2():
    from evtc.cli import main

    res = CliRunner().invoke(main, ["emit", "--expr", "D = relu(acc)", "--fragment", "--name", "struct"])
    assert res.exit_code == 2 and "FragmentError" in res.output and "see docs/errors.md#fragment" in res.output
