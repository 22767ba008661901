"""A hostile-input sweep (third round) of surfaces the earlier sweeps left out, no GPU and no nvcc:
sm80 Gemms' planner options, atomic_sums against a pinned config, GemmConfig fields and the arch
of the wrong type, evtc.Conv's dims, the plugin fragment's bind and check, torch-written epilogues
that read a tensor's extent, and the `evtc cache` / `evtc demo` options. Each case is an input that
escaped as a raw Python exception, was accepted silently, or was imported into a wrong result
before its fix: now an EvtcError (or a usage error of the command line) naming the argument,
before any build."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import evtc
from evtc.errors import ConfigError, EvtcError, FragmentError, PlanError, TraceError

LIN = "D = relu(acc + bias[n])"
SUMS = "D = acc; s = sum(acc, dim=1)"


# ---- sm80 Gemms and the planner's options ---------------------------------------------------------


@pytest.mark.parametrize("kw, error, needle", [
    ({"plan": "cutlass"}, ConfigError, "plan='cutlass'"),
    ({"plan": {"stages_c": 2}}, ConfigError, "plan={'stages_c': 2}"),
    ({"plan_rank": 1}, ConfigError, "plan_rank=1"),
    ({"plan_rank": float("nan")}, ConfigError, "plan_rank=nan"),
    ({"plan_rank": "1"}, ConfigError, "plan_rank='1'"),
    ({"plan": 3}, PlanError, "planning policy 3"),
    ({"plan": {"policy": "x"}}, PlanError, "planning policy 'x'"),
    ({"plan": {1: 2}}, PlanError, "unknown plan decision [1]"),
])
def test_sm80_gemm_refuses_the_planner_options_it_would_ignore(kw, error, needle):
    # every one of these was accepted and dropped: sm80 kernels have no shared-memory plan
    # (evtc.Conv and `evtc emit --arch sm80 --plan` refused them already)
    with pytest.raises(error) as e:
        evtc.Gemm(LIN, arch="sm80", **kw)
    assert needle in str(e.value), str(e.value)


@pytest.mark.parametrize("plan", ["evtc", {}, {"policy": "evtc"}])
def test_sm80_gemm_still_takes_the_default_plan(plan):
    assert evtc.Gemm(LIN, arch="sm80", plan=plan, plan_rank=0).plan.arch == "sm80"


def test_make_plan_on_sm80_refuses_a_policy():
    from evtc.plan import make_plan

    g = evtc.Gemm(LIN, arch="sm80")
    with pytest.raises(ConfigError, match="plan='cutlass'"):
        make_plan(g.graph, "sm80", a=evtc.bf16, b=evtc.bf16, policy="cutlass")


# ---- atomic_sums against a pinned config ----------------------------------------------------------


def test_atomic_sums_with_a_pinned_config_that_keeps_sums_on_the_workspace():
    # the pinned atomic_reductions=False won silently: atomic_sums=True was ignored
    with pytest.raises(ConfigError, match="atomic_sums=True with a pinned config of atomic_reductions=False"):
        evtc.Gemm(SUMS, atomic_sums=True, config={"atomic_reductions": False})
    for cfg in ({"atomic_reductions": True}, {"tile": (128, 128, 64)}):
        assert evtc.Gemm(SUMS, atomic_sums=True, config=cfg).config.atomic_reductions is True


# ---- GemmConfig fields and the arch of the wrong type ----------------------------------------------


@pytest.mark.parametrize("field, value", [("schedule", ["pingpong"]), ("schedule", {}), ("scheduler", ["streamk"]),
                                          ("raster", {"along_n": 1}), ("decomposition", ["stream_k"])])
@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_config_choice_fields_of_the_wrong_type(field, value, arch):
    # schedule=['pingpong'] was "TypeError: unhashable type: 'list'" (the schedule table)
    with pytest.raises(ConfigError) as e:
        evtc.Gemm(LIN, arch=arch, config=evtc.GemmConfig(**{field: value}))
    assert f"{field} = {value!r}" in str(e.value), str(e.value)


def test_plugin_lower_with_a_schedule_of_the_wrong_type():
    import evtc.plugin

    with pytest.raises(ConfigError, match=r"schedule = \['pingpong'\]"):
        evtc.plugin.lower(LIN, tile=(128, 256, 64), a="bf16", schedule=["pingpong"])


@pytest.mark.parametrize("arch", [["sm90"], {"sm90": 1}, 90, None])
def test_gemm_arch_of_the_wrong_type(arch):
    with pytest.raises(ConfigError, match="unknown arch"):  # a list was TypeError: unhashable
        evtc.Gemm(LIN, arch=arch)


# ---- evtc.Conv's dims -----------------------------------------------------------------------------


@pytest.mark.parametrize("dims", [2.0, 3.0, "2", True])
def test_conv_dims_that_are_no_integer(dims):
    # 2.0 passed `dims in (2, 3)` and reached the emitter: TypeError (tuple indices must be integers)
    with pytest.raises(ConfigError, match=f"dims = {dims!r}"):
        evtc.Conv(LIN, dims=dims)


def test_conv_dims_as_a_numpy_integer():
    # np.int64(3) was planned and failed in the emitter: "Object of type int64 is not JSON serializable"
    conv = evtc.Conv(LIN, dims=np.int64(3))
    assert conv.dims == 3 and type(conv.dims) is int and "3-D" in conv.source


# ---- the plugin fragment: bind and check ----------------------------------------------------------


@pytest.fixture(scope="module")
def fragment():
    import evtc.plugin

    return evtc.plugin.lower(LIN, tile=(128, 256, 64), a="bf16")


@pytest.mark.parametrize("values", ["p_bias=x", 3, [("p_bias", "x")]])
def test_fragment_bind_of_no_dict(fragment, values):
    with pytest.raises(FragmentError, match="bind") as e:  # "x" was AttributeError: no attribute 'items'
        fragment.bind(values)
    assert "dict of placeholder name" in str(e.value)
    assert fragment.bind({p.name: "0" for p in fragment.placeholders})


@pytest.mark.parametrize("version", [True, 1.0, "1"])
def test_fragment_check_version_of_no_integer(fragment, version):
    # True == 1 and 1.0 == 1 passed as version 1
    with pytest.raises(FragmentError, match=f"version={version!r}"):
        fragment.check(version=version)
    fragment.check(version=fragment.version)


# ---- torch-written epilogues that read an extent --------------------------------------------------

torch = pytest.importorskip("torch")


def _shape0(acc):
    return torch.relu(acc) * acc.shape[0]


def _size(acc):
    return torch.relu(acc) / acc.size(-1)


def _sizes(acc):
    return torch.relu(acc) / acc.size()[1]


def _len(acc):
    return torch.relu(acc) / len(acc)


def _numel(acc):
    return torch.relu(acc) / acc.numel()


def _torch_numel(acc):
    return torch.relu(acc) / torch.numel(acc)


@pytest.mark.parametrize("fn, read", [(_shape0, ".shape"), (_size, "size()"), (_sizes, "size()"), (_len, "len()"),
                                      (_numel, "numel()"), (_torch_numel, "torch.numel()")])
def test_a_torch_epilogue_that_reads_an_extent_is_refused_at_its_line(fn, read):
    # acc.shape[0] was imported as the constant 5.0 (the fake tensors' M): mul(relu(acc), 5.0)
    with pytest.raises(TraceError) as e:
        evtc.Gemm(evtc.epilogue(fn))
    msg = str(e.value)
    assert f"extent ({read})" in msg and "scalar parameter" in msg, msg
    assert e.value.loc is not None and e.value.loc.line == fn.__code__.co_firstlineno + 1


def test_a_torch_epilogue_still_imports_ndim_and_functions_that_read_extents_inside_torch():
    import torch.nn.functional as F

    def fine(acc):
        return {"D": F.normalize(acc, dim=1) * 0 + F.silu(acc) * acc.ndim + F.leaky_relu(acc, 0.1),
                "m": acc.amax(dim=1)}

    with pytest.raises(EvtcError) as e:  # normalize is refused for what it computes, not for reading extents
        evtc.Gemm(evtc.epilogue(fine))
    assert "extent" not in str(e.value)

    def fine2(acc):
        return {"D": F.silu(acc) * acc.ndim + F.leaky_relu(acc, 0.1), "m": acc.amax(dim=1)}

    assert "mul(" in str(evtc.epilogue(fine2).graph)


# ---- evtc cache prune sizes and ages, evtc demo --out-dir -----------------------------------------


def _cli(args):
    from evtc.cli import main

    return CliRunner().invoke(main, args)


@pytest.mark.parametrize("option, value", [("--max-size", "9" * 80), ("--older-than", "9" * 400 + "w")])
def test_cache_prune_of_a_size_or_age_no_number_holds(tmp_path, option, value):
    # --max-size 9...9 (80 digits) was OverflowError: cannot convert float infinity to integer
    (tmp_path / "c").mkdir(mode=0o700)
    r = _cli(["cache", "--dir", str(tmp_path / "c"), "prune", option, value])
    assert r.exit_code == 2 and (r.exception is None or isinstance(r.exception, SystemExit)), r.exception
    assert "larger than any cache" in r.output or "longer than any cache" in r.output, r.output


def test_cache_prune_of_an_ordinary_size_still_runs(tmp_path):
    (tmp_path / "c").mkdir(mode=0o700)
    r = _cli(["cache", "--dir", str(tmp_path / "c"), "prune", "--max-size", "5G", "--older-than", "30d"])
    assert r.exit_code == 0, r.output


@pytest.mark.parametrize("out_dir", ["", "  "])
def test_demo_out_dir_that_is_empty(no_build, tmp_path, monkeypatch, out_dir):
    # --out-dir "" was Path(""): the demo wrote its .cu and pictures into the current folder (and built)
    monkeypatch.chdir(tmp_path)
    r = _cli(["demo", "--out-dir", out_dir])
    assert r.exit_code == 2 and "--out-dir" in r.output and "empty" in r.output, r.output
    assert list(tmp_path.iterdir()) == []


# ---- the stream of a call, before the build ---------------------------------------------------------


@pytest.mark.parametrize("stream, needle", [("x", "is a str"), (1.5, "is a float"), (7, "raw handle 0x7"),
                                            (-1, "raw handle -0x1"), (2**70, "raw handle 0x4")])
def test_a_bad_stream_is_refused_before_any_build(no_build, stream, needle):
    # the stream was read by the launcher, after the first call's kernel was built (minutes of nvcc)
    from test_runtime_launch import Fake, lin_args

    g = evtc.Gemm("D = relu(alpha*acc + C + bias[n])", a="f16", b="f16", c="f16", d="f16")
    A, B, kw = lin_args(64, 32, 16)
    with pytest.raises(evtc.ArgumentError, match="argument 'stream'") as e:
        g(A, B, out=Fake((64, 32)), stream=stream, **kw)
    assert needle in str(e.value)
    conv = evtc.Conv(LIN)
    with pytest.raises(evtc.ArgumentError, match="argument 'stream'"):
        conv(Fake((1, 8, 8, 64)), Fake((64, 3, 3, 64)), bias=Fake((64,), "<f4"), stream=stream)


# ---- dtypes: which argument ------------------------------------------------------------------------


@pytest.mark.parametrize("make", [evtc.Gemm, evtc.GroupedGemm, evtc.Conv], ids=["Gemm", "GroupedGemm", "Conv"])
@pytest.mark.parametrize("arg, value", [("a", "int8"), ("b", "i8"), ("c", "f64"), ("d", 3), ("d", "float64")])
def test_an_unknown_dtype_names_its_argument(make, arg, value):
    # "unknown dtype 'int8'" / "can't interpret 3 as a dtype" said neither a, b, c nor d
    with pytest.raises(evtc.UnknownDTypeError) as e:
        make(LIN, **{arg: value})
    assert str(e.value).startswith(f"{arg}={value!r}: "), str(e.value)


@pytest.mark.parametrize("arg", ["c", "d"])
def test_an_unknown_dtype_of_the_decorator_and_the_expression_names_its_argument(arg):
    def f(acc):
        return acc

    with pytest.raises(evtc.UnknownDTypeError, match=f"^{arg}='int8': unknown dtype"):
        evtc.epilogue(f, **{arg: "int8"})
    with pytest.raises(evtc.UnknownDTypeError, match=f"^{arg}='int8': unknown dtype"):
        evtc.epilogue(f).trace(**{arg: "int8"})
    with pytest.raises(evtc.errors.EpilogueTypeError, match=f"^{arg}='int8': unknown dtype"):
        evtc.from_expr("D = acc", **{arg: "int8"})


# ---- eager reductions and evtc.to ------------------------------------------------------------------


@pytest.mark.parametrize("fn", [evtc.sum, evtc.max, evtc.min, evtc.amax], ids=["sum", "max", "min", "amax"])
@pytest.mark.parametrize("dim", [2, -3, True, 1.0, "1", [0, 1], (0, 1)])
def test_eager_reductions_take_the_axes_the_traced_ones_take(fn, dim):
    # dim=2 reduced over M (2 % 2), dim=True over N, dim=1.0 over N; '1' and lists were TypeErrors
    # of the string formatting / modulo; the traced form refuses all of them
    with pytest.raises(evtc.ArgumentError, match=r"dim=.* is not a reduction axis"):
        fn(np.ones((2, 3)), dim=dim)
    assert np.array_equal(fn(np.ones((2, 3)), dim=np.int64(1)), fn(np.ones((2, 3)), dim=1))


@pytest.mark.parametrize("x", [None, "1.0", np.ones(3), 5.0], ids=["None", "str", "1-D", "number"])
def test_eager_reductions_of_what_is_no_matrix(x):
    # None and "1.0" escaped as numpy's AxisError; a 1-D array was reduced whole for dim=1
    with pytest.raises(EvtcError):
        evtc.sum(x, dim=1)


@pytest.mark.parametrize("x", [None, "1.0", 10**400], ids=["None", "str", "huge int"])
def test_eager_to_of_what_is_no_number(x):
    # None was nan, "1.0" was 1.0, 10**400 an OverflowError
    with pytest.raises(evtc.ArgumentError, match="evtc.to"):
        evtc.to(x, evtc.e4m3)


def test_a_torch_epilogue_s_reduction_axis_is_checked():
    # evtc.sum(acc, dim=2) in a torch-written epilogue was imported as a column reduction (2 % 2)
    def bad(acc):
        return {"D": torch.relu(acc), "s": evtc.sum(acc, dim=2)}

    with pytest.raises(evtc.ArgumentError, match="dim=2 is not a reduction axis"):
        evtc.Gemm(evtc.epilogue(bad))

    def good(acc):
        return {"D": torch.relu(acc), "s": evtc.sum(acc, dim=1), "m": evtc.amax(acc, dim=0)}

    assert "reduce_max(%1, dim=0)" in str(evtc.epilogue(good).graph)


# ---- environment knobs, before the build -----------------------------------------------------------


@pytest.mark.parametrize("name", ["EVTC_PHASE_SPLIT", "EVTC_PACKED_STORES", "EVTC_TORCH_FASTPATH", "EVTC_NVCC_TIMEOUT",
                                  "EVTC_LOCK_TIMEOUT", "EVTC_CACHE_TOOLCHAIN", "EVTC_PROGRESS"])
def test_a_knob_the_call_or_its_build_reads_later_is_checked_before_the_build(no_build, monkeypatch, name):
    # each was read after the first call's kernel was built (or, for the build's own, inside the
    # build: EVTC_LOCK_TIMEOUT after `nvcc --version`); EVTC_UNALIGNED_STAGING was already checked
    from test_runtime_launch import Fake, lin_args

    monkeypatch.setenv(name, "bogus")
    g = evtc.Gemm("D = relu(alpha*acc + C + bias[n])", a="f16", b="f16", c="f16", d="f16")
    A, B, kw = lin_args(64, 32, 16)
    with pytest.raises(EvtcError, match=f"{name}='bogus'"):
        g(A, B, out=Fake((64, 32)), **kw)


@pytest.mark.parametrize("name", ["EVTC_NVCC_TIMEOUT", "EVTC_LOCK_TIMEOUT", "EVTC_CACHE_TOOLCHAIN", "EVTC_PROGRESS"])
def test_a_build_knob_is_checked_before_nvcc_is_looked_for(monkeypatch, tmp_path, name):
    from evtc.compiler import cache, nvcc

    def no_nvcc(*a, **k):
        pytest.fail("nvcc was looked for before the build's knobs were checked")

    monkeypatch.setenv("EVTC_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(nvcc, "find_nvcc", no_nvcc)
    monkeypatch.setattr(nvcc, "toolchain", no_nvcc)
    monkeypatch.setenv(name, "-1" if "TIMEOUT" in name else "bogus")
    source = evtc.Gemm(LIN).source
    with pytest.raises(EvtcError, match=name):
        cache.build(source, "sm90", name="k")
    with pytest.raises(EvtcError, match=name):
        cache.build_many([(source, "sm90", "k")])
