"""A hostile-input sweep of the newest entry points (2026-11-29), no GPU and no nvcc: evtc.quantize
(traced, IR text, eager numpy and torch), evtc.GroupedGemm's construction and offsets, the
construction of an epilogue from something that is none, gemm.tune's and evtc.Gemm's flags, and
`evtc emit -o`. Each case is an input that escaped as a raw Python exception, or was accepted
silently, before its fix: now an EvtcError naming the argument, before any build."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import evtc
from evtc.errors import ArgumentError, ConfigError, EpilogueTypeError, EvtcError, GrammarError
from evtc.frontend.text import parse_ir

torch = pytest.importorskip("torch")

from evtc.runtime.grouped_args import checked_offs as _check_offs  # noqa: E402  (imports torch lazily, but the checks need it)

# ---- evtc.quantize in the IR text ----------------------------------------------------------------

_IR = """epilogue q(acc: f32 accumulator):
  %0 = group_quant(acc) {ATTRS} : e4m3
  D = store(%0) : STORE
  D_scale = group_scale(%0) : f32
"""


def _ir(attrs: str = "convention=vllm, group=128", store: str = "e4m3") -> str:
    return _IR.replace("ATTRS", attrs).replace("STORE", store)


def test_ir_text_quantize_of_the_python_frontend_still_reads():
    g = evtc.Gemm(parse_ir(_ir()))
    assert g.plan.d_slot == "D" and "evtc::Sm90GroupQuant<128, 0, 448>" in g.source


@pytest.mark.parametrize("attrs, needle", [
    # a float group was accepted (64.0 == 64) and emitted as Sm90GroupQuant<64.0, ...>: an nvcc error
    ("convention=sglang, group=64.0", "group=64.0"),
    # the convention read as the integer 1, its scales' as the string "1": "(group 64, 1) differ from (group 64, 1)"
    ("convention=1, group=64", "convention=1"),
    ("group=64", "group=64"),  # no convention: "(group 64, ) differ from their quantization's (group 64, None)"
])
def test_ir_text_group_quant_attributes_are_checked_on_the_quantization(attrs, needle):
    with pytest.raises(EpilogueTypeError) as e:
        evtc.Gemm(parse_ir(_ir(attrs))).plan
    assert needle in str(e.value) and "differ" not in str(e.value)


def test_ir_text_refuses_a_repeated_attribute():
    # was silently the first: {group=64, group=128} planned groups of 64
    with pytest.raises(GrammarError, match="'group' is given twice"):
        parse_ir(_ir("convention=vllm, group=64, group=128"))


def test_ir_text_group_quant_takes_only_its_own_attributes():
    # {..., eps=1e-4} was kept and ignored (other ops' attributes round-trip as printed: test_grammar)
    with pytest.raises(EpilogueTypeError, match="eps=0.0001"):
        evtc.Gemm(parse_ir(_ir("convention=deepgemm, eps=1e-4, group=128"))).plan


@pytest.mark.parametrize("store", ["bf16", "f32", "e5m2"])
def test_ir_text_stores_the_quantized_value_in_its_own_dtype(store):
    # was accepted: the kernel's D (ElementD bf16) would hold y / scale unrounded to e4m3
    with pytest.raises(EpilogueTypeError, match=f"stored as {store}"):
        evtc.Gemm(parse_ir(_ir(store=store))).plan


# ---- eager evtc.quantize --------------------------------------------------------------------------

_Y = np.linspace(-3, 3, 2 * 256).reshape(2, 256)


@pytest.mark.parametrize("x", [[["a", "b"]], [[1.0, 2.0], [3.0]], np.array([[object()] * 4] * 2), {"a": 1}, "abc",
                               np.ones((2, 128), dtype=complex)])
def test_eager_quantize_refuses_what_is_no_real_matrix(x):
    # numpy's ValueError/TypeError escaped; complex values lost their imaginary part with a warning
    with pytest.raises(ArgumentError, match="evtc.quantize"):
        evtc.quantize(x, evtc.e4m3)


def test_eager_quantize_takes_a_group_larger_than_a_row():
    # group=10**30 escaped as numpy's "Maximum allowed dimension exceeded" (the padding)
    q, s = evtc.quantize(_Y, evtc.e4m3, group=10**30)
    q_ref, s_ref = evtc.quantize(_Y, evtc.e4m3, group=256)
    assert np.array_equal(q, q_ref) and np.array_equal(s, s_ref) and s.shape == (2, 1)
    tq, ts = evtc.quantize(torch.from_numpy(_Y).float(), evtc.e4m3, group=10**30)
    assert ts.shape == (2, 1) and np.array_equal(ts.numpy(), s.astype(np.float32))


@pytest.mark.parametrize("group", [1.5, True, 128.0, "128"])
def test_eager_torch_quantize_refuses_a_group_that_is_no_integer(group):
    # 1.5 escaped as torch's TypeError from new_zeros; True quantized groups of one element
    with pytest.raises(ArgumentError, match="group"):
        evtc.quantize(torch.ones(2, 128), evtc.e4m3, group=group)


def test_eager_torch_quantize_refuses_complex():
    with pytest.raises(ArgumentError, match="complex"):
        evtc.quantize(torch.ones(2, 128, dtype=torch.complex64), evtc.e4m3)


# ---- GroupedGemm ----------------------------------------------------------------------------------

LIN = "D = relu(acc + bias[n])"


@pytest.mark.parametrize("member", [["pp64x128"], {}])
def test_grouped_member_of_the_wrong_type(member):
    with pytest.raises(ConfigError, match="member"):  # was TypeError: unhashable type
        evtc.GroupedGemm(LIN, member=member)


def test_grouped_unknown_member_in_kernel_source_build():
    gg = evtc.GroupedGemm(LIN)
    for call in (lambda: gg.kernel("bogus"), lambda: gg.source("bogus"), lambda: gg.build(["bogus"])):
        with pytest.raises(ConfigError, match="'bogus' is not one of"):  # was KeyError
            call()


def test_grouped_build_takes_one_member_name_as_a_string():
    gg = evtc.GroupedGemm(LIN)
    with pytest.raises(ConfigError, match="'nope' is not one of"):  # "nope" was iterated: KeyError 'n'
        gg.build("nope")


@pytest.mark.parametrize("offs, needle", [
    ([0.5, 1.7], "0.5"),            # was truncated to [0, 1]
    ([True, True], "True"),         # was [1, 1]
    (["1", "2"], "'1'"),            # was ValueError: too many dimensions 'str'
    ([None, None], "None"),         # was TypeError
    ([2**40, 2**40], str(2**40)),   # was RuntimeError: overflow
])
def test_grouped_offsets_as_a_list_are_integers(offs, needle):
    with pytest.raises(ArgumentError) as e:
        _check_offs(offs, 2, 8, torch.device("cpu"), False, "ep")
    assert "offs" in str(e.value) and needle in str(e.value)


def test_grouped_offsets_as_a_list_of_integers_still_work():
    got = _check_offs([1, np.int64(2)], 2, 8, torch.device("cpu"), False, "ep")
    assert got.dtype == torch.int32 and got.tolist() == [1, 2]


# ---- what is no epilogue --------------------------------------------------------------------------


@pytest.mark.parametrize("make", [evtc.Gemm, evtc.GroupedGemm])
@pytest.mark.parametrize("epilogue", [None, 3, 2.5])
def test_no_epilogue_is_an_evtc_error(make, epilogue):
    with pytest.raises(ArgumentError, match="can't make an epilogue of") as e:  # was a bare TypeError
        make(epilogue)
    assert isinstance(e.value, TypeError)  # what the docstring promised still holds


# ---- gemm.tune and the Gemm's flags ---------------------------------------------------------------


@pytest.fixture(scope="module")
def gemm():
    return evtc.Gemm(LIN)


@pytest.mark.parametrize("kwargs, needle", [
    ({"shapes": [(-1, 128, 128)]}, "(-1, 128, 128)"),
    ({"shapes": [(0, 128, 128)]}, "(0, 128, 128)"),
    ({"shapes": [(128.0, 128, 128)]}, "(128.0, 128, 128)"),
    ({"shapes": [("128", 128, 128)]}, "('128', 128, 128)"),
    ({"shapes": [(True, 128, 128)]}, "(True, 128, 128)"),
    ({"shapes": [(1, 2, 3, 4, 5)]}, "(1, 2, 3, 4, 5)"),
    ({"shapes": [(1, 2)]}, "(1, 2)"),
    ({"shapes": [(128, 128, 128, 0)]}, "(128, 128, 128, 0)"),
    ({"shapes": [(10**30, 128, 128)]}, str(10**30)),
    ({"shapes": (128, 128, 128)}, "a list of shapes"),
    ({"shapes": None}, "shapes"),
    ({"shapes": "128x128x128"}, "shapes"),
    ({"shapes": []}, "no shape"),
    ({"iters": 0}, "iters=0"),
    ({"iters": 1.5}, "iters=1.5"),
    ({"iters": True}, "iters=True"),
    ({"limit_s": -1}, "limit_s=-1"),
    ({"limit_s": 0}, "limit_s=0"),
    ({"limit_s": float("nan")}, "limit_s=nan"),
    ({"limit_s": "2"}, "limit_s='2'"),
    ({"top": 0}, "top=0"),
    ({"top": -1}, "top=-1"),
    ({"top": 1.5}, "top=1.5"),
    ({"top": True}, "top=True"),
    ({"store": "no"}, "store='no'"),
    ({"verbose": "yes"}, "verbose='yes'"),
])
def test_tune_checks_its_arguments_before_looking_for_a_gpu(gemm, kwargs, needle):
    # every one of these was hidden behind NoDeviceError here, and reached the GPU's tuner there
    kwargs = {"shapes": [(128, 128, 128)], **kwargs}
    shapes = kwargs.pop("shapes")
    with pytest.raises(ArgumentError) as e:
        gemm.tune(shapes, **kwargs)
    assert needle in str(e.value), str(e.value)


def test_tune_without_a_gpu_still_says_so(gemm):
    from devices import HAS_GPU

    if HAS_GPU:
        pytest.skip("a GPU is here")
    with pytest.raises(evtc.errors.NoDeviceError):
        gemm.tune([(128, 128, 128), (64, 256, 512, 2)], iters=1, limit_s=0.5, top=None)


@pytest.mark.parametrize("flag", ["autotune", "batch_invariant"])
@pytest.mark.parametrize("value", ["false", "yes", 1, [], {"top": 2}])
def test_gemm_flags_are_booleans(flag, value):
    # autotune="false" was bool("false"): on
    with pytest.raises(ConfigError, match=f"{flag}="):
        evtc.Gemm(LIN, **{flag: value})


@pytest.mark.parametrize("flag", ["autotune", "batch_invariant"])
def test_gemm_flags_still_take_bools_and_none(flag):
    for value in (True, False, None, np.bool_(True)):
        evtc.Gemm(LIN, **{flag: value})


# ---- evtc emit -o ---------------------------------------------------------------------------------


def test_emit_output_ending_in_a_slash_is_a_folder(tmp_path):
    from evtc.cli import main

    r = CliRunner().invoke(main, ["emit", "--expr", LIN, "-o", str(tmp_path / "new") + "/"])
    assert r.exit_code == 2, r.output  # was: wrote a file named "new"
    assert "folder" in r.output and not (tmp_path / "new").exists()


# ---- the torch backend's options ------------------------------------------------------------------


@pytest.mark.parametrize("options, needle", [
    ("fuse_all", "a dict of option -> bool"),   # was ValueError: dictionary update sequence element
    ([1, 2], "a dict of option -> bool"),       # was TypeError
    (3, "a dict of option -> bool"),            # was TypeError: 'int' object is not iterable
    ({1: True}, "unknown option(s) 1"),         # was TypeError: expected str instance (the join)
    ({1: True, "x": True}, "unknown option"),   # was TypeError: '<' not supported (the sort)
])
def test_backend_options_that_are_no_dict_of_names(options, needle):
    from evtc.torch.backend import evtc_backend

    with pytest.raises(ArgumentError) as e:
        evtc_backend(None, [], options=options)
    assert needle in str(e.value), str(e.value)


def test_make_backend_fuse_all_is_a_bool():
    from evtc.torch.backend import make_backend

    with pytest.raises(ArgumentError, match="fuse_all='no'"):  # was truthy: every match fused
        make_backend(fuse_all="no")
    assert make_backend(fuse_all=True).fused == 0


# ---- Gemm.choose, Gemm.kernel, Gemm.set_unaligned_staging ------------------------------------------


@pytest.mark.parametrize("shape", [(-1, 128, 128), (0, 128, 128), (128, 128, 0), (128, 128, 128, 0), (1.5, 128, 128),
                                   ("128", 128, 128), (10**30, 128, 128)])
def test_choose_checks_the_problem(gemm, shape):
    # -1, 0 and L = 0 were the ranker's "math domain error", "128" a TypeError, 1.5 and 10**30 were ranked
    with pytest.raises(ArgumentError, match="each an integer from 1"):
        gemm.choose(*shape)
    assert gemm.choose(128, 128, 128, np.int64(2)).name in gemm.family


@pytest.mark.parametrize("spec", ["bogus", 3, None])
def test_kernel_of_no_member(gemm, spec):
    with pytest.raises(ConfigError, match="kernel"):  # was KeyError / AttributeError
        gemm.kernel(spec)
    assert gemm.kernel("unaligned").plan.config.unaligned


@pytest.mark.parametrize("how", [1, [], True])
def test_unaligned_staging_mode_of_the_wrong_type(gemm, how):
    with pytest.raises(ArgumentError, match="set_unaligned_staging"):  # was AttributeError: no 'strip'
        gemm.set_unaligned_staging(how)


def test_a_call_with_no_rows_is_no_math_domain_error():
    from fakecuda import FakeCuda

    g = evtc.Gemm(LIN, a="f16", d="f16")
    with pytest.raises(EvtcError):  # without a GPU or torch's allocator: some EvtcError, not ValueError
        g(FakeCuda((0, 64)), FakeCuda((64, 64)), bias=FakeCuda((64,), typestr="<f4"))


# ---- GroupedGemm.run_list ---------------------------------------------------------------------------

_BF = {"dtype": torch.bfloat16}


@pytest.mark.parametrize("As, Bs, inputs, needle", [
    ([1, 2], [torch.ones(8, 8, **_BF)] * 2, {}, "As[0] is a int"),                           # AttributeError .shape
    ([np.ones((2, 8))], [torch.ones(8, 8, **_BF)], {}, "As[0] is a ndarray"),               # torch.cat's TypeError
    (None, [], {}, "As is a NoneType"),                                                      # len(None)
    ([torch.tensor(1.0)], [torch.ones(8, 8, **_BF)], {}, "As[0] is ()"),                     # IndexError
    ([torch.ones(2, 8, **_BF), torch.ones(2, 16, **_BF)], [torch.ones(8, 8, **_BF)] * 2, {}, "As differ"),
    ([torch.ones(2, 8, **_BF)] * 2, [torch.ones(8, 8, **_BF), torch.ones(16, 8, **_BF)], {}, "Bs have the shapes"),
    ([torch.ones(2, 8, **_BF)], [torch.ones(8, 8, **_BF)], {"bias": [1]}, "input 'bias'[0] is a int"),
])
def test_run_list_checks_the_lists_before_packing_them(As, Bs, inputs, needle):
    gg = evtc.GroupedGemm(LIN)
    with pytest.raises(ArgumentError) as e:  # each was torch's or Python's own error from cat/stack/.shape
        gg.run_list(As, Bs, **inputs)
    assert needle in str(e.value), str(e.value)
    assert gg.run_list([], []) == []


@pytest.mark.parametrize("plan, needle", [
    ('{"direct": ' + "[" * 100000 + "]" * 100000 + "}", "nested too deeply"),  # was RecursionError
    ('{"stages_c": ' + "9" * 5000 + "}", "a number of 5000 digits"),             # was ValueError (int digits limit)
    ('{"stages_c": 2, "stages_c": 3}', "the key 'stages_c' is given twice"),     # was the last, silently
])
def test_cli_plan_json_that_python_cannot_or_should_not_read(plan, needle):
    from evtc.cli import main

    r = CliRunner().invoke(main, ["plan", "--expr", LIN, "--plan", plan])
    assert r.exit_code == 2 and (r.exception is None or isinstance(r.exception, SystemExit)), r.exception
    assert needle in r.output and len(r.output) < 2000, r.output[-500:]
