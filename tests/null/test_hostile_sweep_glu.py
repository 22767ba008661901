"""A hostile-input sweep of the gated (evtc.glu) surfaces, no GPU and no nvcc: evtc.glu eagerly,
evtc.interleave_gate_up, evtc.Gemm with a glu epilogue (configs, plan ranks, Gemm.choose, the
binder of a pinned kernel), evtc.GroupedGemm's call checks, the torch backend's gated rewrite,
and glu where no kernel has it (convolutions, plugin fragments). Each case is an input that
escaped as a raw Python exception, was accepted silently, or was rewritten into a wrong result
before its fix: now an EvtcError naming the argument, before any build (or no rewrite)."""

from __future__ import annotations

import numpy as np
import pytest

import evtc
from evtc.errors import ArgumentError, ConfigError, EvtcError, FragmentError, PlanError

torch = pytest.importorskip("torch")


@evtc.epilogue
def swiglu(acc, bias: evtc.RowVector[evtc.f32]):
    return evtc.glu(acc + bias, act="silu")


# ---- evtc.glu, eagerly --------------------------------------------------------------------------


def test_eager_glu_with_an_act_that_has_no_torch_rule_runs_through_float64():
    """gelu_grad has no torch rule: evtc.glu(tensor, act='gelu_grad') called None (a raw
    TypeError); it goes through float64 numpy and back, as the other eager functions do."""
    x = torch.linspace(-2, 2, 8, dtype=torch.float32).reshape(2, 4)
    y = evtc.glu(x, act="gelu_grad")
    assert isinstance(y, torch.Tensor) and y.dtype == torch.float32 and tuple(y.shape) == (2, 2)
    want = evtc.glu(x.double().numpy(), act="gelu_grad")
    assert np.allclose(y.double().numpy(), want, rtol=1e-6, atol=0)


@pytest.mark.parametrize("x", [
    np.array([["a", "b"]]),                      # ValueError: could not convert string to float
    np.array([[object(), object()]]),            # TypeError: float() argument must be...
    np.ones((2, 2), dtype=complex),              # the imaginary parts dropped silently (a ComplexWarning)
    torch.ones(2, 4, dtype=torch.int32),         # NotImplementedError: "silu_cpu" not implemented for 'Int'
    torch.ones(2, 4, dtype=torch.bool),
    torch.ones(2, 4, dtype=torch.complex64),
], ids=["str", "object", "complex", "torch-int", "torch-bool", "torch-complex"])
def test_eager_glu_refuses_values_that_are_not_real_numbers(x):
    with pytest.raises(ArgumentError, match="evtc.glu"):
        evtc.glu(x)


class _Shaped:
    shape = (2, 4)


class _ShapedStr:
    shape = "ab"


class _ShapedIndexable:
    shape = (2, 4)

    def __getitem__(self, k):
        return self


@pytest.mark.parametrize("x", [_Shaped(), _ShapedStr(), _ShapedIndexable()],
                         ids=["shape-only", "shape-str", "shape-getitem"])
def test_eager_glu_refuses_objects_that_only_look_like_arrays(x):
    """An object with a .shape was indexed as an array (TypeError 'not subscriptable', string
    formatting of shape[-1] % 2, 'setting an array element with a sequence')."""
    with pytest.raises(ArgumentError, match="evtc.glu"):
        evtc.glu(x)


def test_eager_glu_takes_nested_lists_like_the_other_functions():
    """Lists were refused ('evtc.glu of list with shape None') where every other evtc function
    reads them as arrays; a ragged one is still an ArgumentError (numpy's ValueError caught)."""
    assert np.allclose(evtc.glu([[1.0, 2.0]]), [[2.0 / (1.0 + np.exp(-1.0))]])
    assert evtc.glu(np.ones((2, 4), dtype=np.int32)).shape == (2, 2)
    with pytest.raises(ArgumentError, match="evtc.glu"):
        evtc.glu([[1.0, 2.0], [3.0]])


# ---- evtc.interleave_gate_up ------------------------------------------------------------------


def test_interleave_refuses_tensors_on_two_devices():
    """A meta gate and a cpu up escaped as torch.stack's RuntimeError ('Tensor on device cpu is
    not on the expected device meta!')."""
    with pytest.raises(ArgumentError, match="device"):
        evtc.interleave_gate_up(torch.ones(3, 4, device="meta"), torch.zeros(3, 4))


def test_interleave_refuses_sparse_tensors():
    """Sparse weights escaped as 'reshape is not implemented for sparse tensors'."""
    with pytest.raises(ArgumentError, match="dense"):
        evtc.interleave_gate_up(torch.ones(3, 4).to_sparse(), torch.zeros(3, 4).to_sparse())


def test_interleave_takes_a_parameter_and_a_tensor_and_numpy_integer_dims():
    """nn.Parameter beside a plain tensor (one a module's weight, one loaded) was refused as
    'two tensors of one shape' although the shapes were one; a numpy integer dim was refused."""
    w = evtc.interleave_gate_up(torch.nn.Parameter(torch.ones(3, 4)), torch.zeros(3, 4))
    assert tuple(w.shape) == (6, 4) and torch.equal(w[0::2], torch.ones(3, 4))
    assert evtc.interleave_gate_up(np.ones((3, 4)), np.zeros((3, 4)), dim=np.int64(0)).shape == (6, 4)
    with pytest.raises(ArgumentError):  # a torch tensor and a numpy array are still two kinds
        evtc.interleave_gate_up(torch.ones(3, 4), np.zeros((3, 4)))
    with pytest.raises(ArgumentError):  # and bools are no axes
        evtc.interleave_gate_up(np.ones((3, 4)), np.zeros((3, 4)), dim=np.bool_(True))


# ---- evtc.Gemm with evtc.glu: configurations --------------------------------------------------


@pytest.mark.parametrize("pinned", [False, True], ids=["family", "pinned"])
@pytest.mark.parametrize("rank", [1, 10 ** 9])
def test_a_plan_rank_past_the_gated_store_s_one_plan_is_refused(pinned, rank):
    """plan_glu ignored plan_rank: plan_rank=10**9 gave the rank-0 plan silently, where any other
    epilogue says how many legal plans there are (a tuner trusting rank k got rank 0)."""
    cfg = evtc.GemmConfig(tile=(128, 128, 64)) if pinned else None
    with pytest.raises(ConfigError, match=f"plan_rank={rank}"):
        evtc.Gemm(swiglu, config=cfg, plan_rank=rank).plan
    assert evtc.Gemm(swiglu, config=cfg, plan_rank=0).plan.d_slot is None


@pytest.mark.parametrize("ep", [swiglu, "D = acc + bias[n]"], ids=["glu", "plain"])
def test_gemm_refuses_the_grouped_kernel_s_config(ep):
    """GemmConfig(grouped=True) in evtc.Gemm emitted CUTLASS's pointer-array kernel behind the
    plain binder and launcher: refused, pointing at evtc.GroupedGemm."""
    with pytest.raises(ConfigError, match="GroupedGemm"):
        evtc.Gemm(ep, config=evtc.GemmConfig(tile=(128, 128, 64), grouped=True))
    with pytest.raises(ConfigError, match="GroupedGemm"):
        evtc.Gemm(ep, config={"tile": [128, 128, 64], "grouped": True})


# ---- Gemm.choose and Gemm.tune ------------------------------------------------------------------


@pytest.mark.parametrize("kw, needle", [
    (dict(sm_count=-5), "sm_count"),          # ZeroDivisionError in the ranker
    (dict(sm_count="a"), "sm_count"),         # TypeError: '<' not supported between int and str
    (dict(sm_count=0), "sm_count"),           # taken as the default silently (sm_count or ...)
    (dict(sm_count=True), "sm_count"),
    (dict(device=3), "device"),               # AttributeError: 'int' object has no attribute 'lower'
    (dict(aligned_mn="no"), "aligned_mn"),    # a truthy string taken as aligned
    (dict(aligned_k=None), "aligned_k"),
], ids=lambda v: str(v))
def test_choose_checks_its_options(kw, needle):
    g = evtc.Gemm(swiglu)
    with pytest.raises(ArgumentError, match=needle):
        g.choose(7, 48, 64, **kw)
    assert evtc.Gemm("D = acc + bias[n]").choose(7, 48, 64, sm_count=132, device="NVIDIA H200") is not None


@pytest.mark.parametrize("N", [47, 1])
def test_choose_and_tune_refuse_an_odd_n_for_glu(N):
    """Gemm.choose picked a member for an odd N (whose call the binder refuses), and Gemm.tune
    would have built candidates for it before the binder's refusal."""
    g = evtc.Gemm(swiglu)
    with pytest.raises(ArgumentError, match="must be even"):
        g.choose(7, N, 64)
    with pytest.raises(ArgumentError, match="must be even"):
        g.tune([(64, 64, 64), (7, N, 64)])
    assert evtc.Gemm("D = acc + bias[n]").choose(7, N, 64) is not None


# ---- a pinned kernel's alignment rules, before its build ------------------------------------------


def _fake():
    from test_runtime_launch import Fake

    return Fake


@pytest.mark.parametrize("case", ["glu N/2 = 9", "glu out misaligned", "plain out misaligned", "plain A misaligned"])
def test_a_pinned_kernel_s_alignment_is_checked_before_its_build(no_build, case):
    """A pinned Gemm checked a call before its first build without the alignment rules (they
    depend on the route, which a pinned family knows): an evtc.glu output of N / 2 = 9 f16
    columns, or an out= / A starting 2 bytes past a 16-byte boundary, started nvcc and was
    refused only after the build."""
    Fake = _fake()
    M, K = 7, 64
    cfg = evtc.GemmConfig(tile=(128, 128, 64))
    if case.startswith("glu"):
        g = evtc.Gemm(swiglu, a=evtc.f16, d=evtc.f16, config=cfg)
        N = 18 if case == "glu N/2 = 9" else 48
        kw = {"bias": Fake((N,), "<f4")}
        out = Fake((M, N // 2), ptr=(1 << 41) + 2 if "misaligned" in case else None)
        A = Fake((M, K))
    else:
        g = evtc.Gemm("D = acc + bias[n]", a=evtc.f16, d=evtc.f16, config=cfg)
        N = 48
        kw = {"bias": Fake((N,), "<f4")}
        out = Fake((M, N), ptr=(1 << 41) + 2 if case == "plain out misaligned" else None)
        A = Fake((M, K), ptr=(1 << 42) + 2 if case == "plain A misaligned" else None)
    with pytest.raises(ArgumentError, match="16"):
        g(A, Fake((N, K)), out=out, **kw)


# ---- evtc.GroupedGemm's call checks ---------------------------------------------------------------


@pytest.mark.parametrize("kw, needle", [
    (dict(member=["coop128x128"]), "member"),   # TypeError: unhashable type: 'list'
    (dict(member={"a": 1}), "member"),
    (dict(check_offs="yes"), "check_offs"),     # a truthy string taken silently
    (dict(check_offs=None), "check_offs"),
], ids=["member-list", "member-dict", "check_offs-str", "check_offs-None"])
def test_grouped_call_checks_member_and_check_offs(no_build, monkeypatch, kw, needle):
    """(cpu tensors let through the device check, so that nothing else refuses the call first;
    before the fix a check_offs string reached the build, which no_build fails)"""
    import evtc.grouped as grouped

    def on_cpu_too(t, what, device, name):
        if not isinstance(t, torch.Tensor):
            raise ArgumentError(f"{what} is not a tensor")

    monkeypatch.setattr("evtc.runtime.grouped_args.check_cuda", on_cpu_too)
    gg = evtc.GroupedGemm(swiglu)
    A = torch.zeros(10, 64, dtype=torch.bfloat16)
    B = torch.zeros(3, 48, 64, dtype=torch.bfloat16)
    offs = torch.tensor([3, 6, 10], dtype=torch.int32)
    with pytest.raises(ArgumentError, match=needle):
        gg.run_eager(A, B, offs, bias=torch.zeros(48), **kw)


# ---- the torch backend's gated rewrite --------------------------------------------------------------


class _ViewedHalves(torch.nn.Module):
    """One projection's output viewed with another last dimension before chunk(2, -1): its halves
    are not the projection's first and last I columns (Phi-3's chunk is over the unviewed rows)."""

    def __init__(self, view, d=64, ffn=96):
        super().__init__()
        self.gate_up_proj = torch.nn.Linear(d, 2 * ffn, bias=False)
        self.view = view

    def forward(self, x):
        gate, up = self.gate_up_proj(x).view(*self.view).chunk(2, dim=-1)
        return torch.nn.functional.silu(gate) * up


@pytest.mark.parametrize("view", [(40, 2, 96), (20, 384), (80, 96)], ids=["M-2-I", "merged-rows", "split-rows"])
def test_a_chunk_of_a_view_with_another_last_dim_is_not_rewritten_wrongly(view):
    """fuse_gated took the halves of y.view(...) with another last dimension for the halves of
    y's columns: the compiled model returned silu(x W_gate^T) * (x W_up^T) where eager's gate and
    up were other columns (errors of 1.7 on values of 1.5). Only a view that keeps the last
    dimension (the rows of a 3-D input) is the same pairing, and is still rewritten."""
    from test_torch_backend import GEMMS, compiled, ir

    for v, rewritten in ((view, False), ((2, 20, 192), True)):
        torch.manual_seed(0)
        m = _ViewedHalves(v).to(torch.bfloat16)
        x = torch.randn(40, 64).bfloat16()
        with torch.no_grad():
            ref = m.double()(x.double())
            m.to(torch.bfloat16)
        out, _ = compiled(m, x)
        assert (out.double() - ref).abs().max().item() <= 2.0 ** -6 * ref.abs().max().item(), v
        assert any("glu" in ir(i) for i in range(len(GEMMS))) == rewritten, [ir(i) for i in range(len(GEMMS))]


# ---- evtc.glu where no kernel has its gated store ---------------------------------------------------


@pytest.mark.parametrize("kind", ["fprop", "dgrad", "wgrad"])
def test_a_convolution_refuses_glu(kind):
    """evtc.Conv (and `evtc emit --conv`) of a glu epilogue planned the gated store's void D and
    then asked the conv emitter for output None: a raw KeyError."""
    with pytest.raises(PlanError, match="evtc.glu"):
        evtc.Conv("D = glu(acc + bias[n])", kind=kind)


def test_a_plugin_fragment_refuses_glu():
    """evtc.plugin.lower (and `evtc emit --fragment`) of a glu epilogue: a raw KeyError from
    graph.output(None), the gated plan having no D slot."""
    import evtc.plugin

    with pytest.raises(FragmentError, match="evtc.glu"):
        evtc.plugin.lower(swiglu, tile=(128, 128, 64), a=evtc.bf16, d=evtc.bf16)


@pytest.mark.parametrize("args", [["--conv", "fprop"], ["--conv", "wgrad"], ["--conv", "fprop", "--dims", "3"],
                                  ["--fragment"]], ids=" ".join)
def test_cli_emit_of_glu_where_no_kernel_has_it_is_a_usage_error(args):
    from click.testing import CliRunner

    from evtc.cli import main

    r = CliRunner().invoke(main, ["emit", "--expr", "D = glu(acc + bias[n])", *args])
    assert r.exit_code == 2 and "evtc.glu" in r.output, (r.exit_code, r.output, r.exception)
    assert "Traceback" not in r.output and not isinstance(r.exception, KeyError)


def test_glu_in_an_epilogue_read_with_torch_ops_is_refused_at_its_line():
    """An epilogue mixing torch ops with evtc.glu goes to the torch importer, which ran evtc.glu
    eagerly on its fake (5, 7) tensor: 'evtc.glu of FakeTensor with shape (5, 7): a matrix with an
    even number of columns', hint 'build B with evtc.interleave_gate_up', nothing to do with B."""
    @evtc.epilogue
    def torch_written(acc, bias: evtc.RowVector[evtc.f32]):
        return evtc.glu(torch.relu(acc) + bias)

    with pytest.raises(evtc.UnsupportedOpError, match="torch importer") as e:
        evtc.Gemm(torch_written)
    assert "FakeTensor" not in str(e.value) and e.value.loc is not None and "evtc.glu(" in (e.value.loc.text or "")


def test_run_list_gives_each_group_its_own_column_and_scalar_reductions(no_build, monkeypatch):
    """run_list split every output by the groups' token counts: a column reduction (E, N) and a
    scalar one (E,) have a row per group, not per token (torch.split's raw RuntimeError 'split_with
    _sizes expects split_sizes to sum exactly to 3', or group e given other groups' rows). Run here
    with every group empty (no kernel runs; the device check lets cpu tensors through)."""
    from examples import epilogues as E

    import evtc.grouped as grouped

    def on_cpu_too(t, what, device, name):
        if not isinstance(t, torch.Tensor):
            raise ArgumentError(f"{what} is not a tensor")

    monkeypatch.setattr("evtc.runtime.grouped_args.check_cuda", on_cpu_too)
    gg = evtc.GroupedGemm(E.dgelu_bgrad)
    As = [torch.zeros(0, 64, dtype=torch.bfloat16) for _ in range(3)]
    Bs = [torch.zeros(48, 64, dtype=torch.bfloat16) for _ in range(3)]
    got = gg.run_list(As, Bs, F=[torch.zeros(0, 48, dtype=torch.bfloat16) for _ in range(3)])
    assert len(got) == 3
    for e in range(3):
        assert tuple(got[e]["D"].shape) == (0, 48) and tuple(got[e]["dbias"].shape) == (48,)
    gf = evtc.GroupedGemm(E.fp8_out)
    got = gf.run_list(As, Bs, scale_a=1.0, scale_b=1.0, scale_d=1.0, bias=torch.zeros(48))
    assert [tuple(g["amax"].shape) for g in got] == [(), (), ()]


# ---- the expression form ---------------------------------------------------------------------------


@pytest.mark.parametrize("expr", ["D = glu(acc, act=relu)", "D = glu(acc, act=gelu)", "D = glu(acc + bias[n], act=silu)",
                                  "D = glu(acc, act=gelu_tanh)"])
def test_expression_glu_with_an_act_keyword_says_what_to_do(expr):
    """glu(acc, act=relu), the natural way to ask for ReGLU, said "'relu' is a function: call it,
    e.g. 'relu(x)'" (the keyword's value read as an input first): the glu keyword error, which
    says where another activation is written, never showed for an act naming a function."""
    with pytest.raises(evtc.GrammarError, match="glu\\(\\) takes no keyword arguments") as e:
        evtc.Gemm(expr)
    assert "evtc.glu(x, act=" in (e.value.hint or "")


# ---- the other eager functions (the helper's sweep found glu's leaks in them too) ----------------

@pytest.mark.parametrize("bad", ["string array", "complex array", "ragged list", "object", "torch int", "torch complex"])
def test_eager_functions_refuse_what_is_no_real_number(bad):
    import numpy as np

    torch = pytest.importorskip("torch")
    value = {"string array": np.array(["a"]), "complex array": np.array([1 + 2j]), "ragged list": [[1, 2], [3]],
             "object": object(), "torch int": torch.tensor([1, 2]),
             "torch complex": torch.ones(3, dtype=torch.complex64)}[bad]
    for fn in (evtc.relu, evtc.exp, evtc.gelu_grad):
        with pytest.raises(evtc.ArgumentError, match=fn.__name__):
            fn(value)


def test_eager_functions_name_operands_that_do_not_broadcast():
    import numpy as np

    torch = pytest.importorskip("torch")
    for args in ((torch.ones(3), torch.ones(4)), (np.ones(3), np.ones(4))):
        with pytest.raises(evtc.ArgumentError, match=r"evtc.maximum of operands of shapes \(3,\), \(4,\)"):
            evtc.maximum(*args)
    # what stays accepted: numbers, nested lists, bool arrays, a torch bool mask as where's condition
    assert evtc.relu([[-1, 2]]).tolist() == [[0.0, 2.0]]
    assert evtc.relu(np.array([True, False])).tolist() == [1.0, 0.0]
    assert evtc.where(torch.tensor([True, False]), torch.ones(2), torch.zeros(2)).tolist() == [1.0, 0.0]
