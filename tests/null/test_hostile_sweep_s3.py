"""A hostile-input sweep (third round) of surfaces the earlier sweeps left out, no GPU and no nvcc:
sm80 Gemms' planner options, atomic_sums against a pinned config, GemmConfig fields and the arch
of the wrong type, evtc.Conv's dims, the plugin fragment's bind and check, torch-written epilogues
that read a tensor's extent, and the `evtc cache` / `evtc demo` options. Each case is an input that
escaped as a raw Python exception, was accepted silently, or was imported into a wrong result
before its fix: now an EvtcError (or a usage error of the command line) naming the argument,
before any build."""

from __future__ import annotations

import pytest

import evtc
from evtc.errors import ConfigError, EvtcError, PlanError, TraceError

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


