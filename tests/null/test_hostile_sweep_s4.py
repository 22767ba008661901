"""A hostile-input sweep (fourth round), no GPU and no nvcc: evtc.GroupedGemm's call (offsets on
no device, outputs that overlap themselves, A or an input, N = 0 and K = 0), the torch ops of
Gemm and GroupedGemm (their arguments and their fake implementations under FakeTensorMode),
torch-written epilogues that slice, the torch backend's addmm / baddbmm with beta = 0, `evtc
plan --svg/--png`, and evtc.Conv's choose, member and ConvProblem. Each case escaped as a raw
Python exception, started a build, or was accepted into a wrong result before its fix: now an
EvtcError (or a usage error of the command line) naming the argument."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import evtc
from evtc.errors import ArgumentError, ConfigError, UnsupportedOpError

torch = pytest.importorskip("torch")

import evtc.grouped as grouped  # noqa: E402

bf = torch.bfloat16
T, K, E, N = 10, 64, 3, 48


class _Launched(Exception):
    """Raised where the grouped call would load its kernel: every check passed."""


@pytest.fixture
def on_cpu(no_build, monkeypatch):
    """GroupedGemm calls with CPU tensors standing in for CUDA ones (the device check lets them
    through) and a sentinel where the kernel would be loaded, after every check."""

    def on_cpu_too(t, what, device, name):
        if not isinstance(t, torch.Tensor):
            raise ArgumentError(f"{what} is a {type(t).__name__}, not a torch tensor")

    def launched(self, member):
        raise _Launched(member)

    monkeypatch.setattr("evtc.runtime.grouped_args.check_cuda", on_cpu_too)
    monkeypatch.setattr(grouped.GroupedGemm, "_loaded", launched)


def _operands(n=N, k=K):
    return torch.zeros(T, k, dtype=bf), torch.zeros(E, n, k, dtype=bf), torch.tensor([3, 6, 10], dtype=torch.int32)


# ---- GroupedGemm: offsets, zero extents -----------------------------------------------------------


def test_grouped_offsets_on_the_meta_device_are_refused(on_cpu):
    # NotImplementedError: Cannot copy out of meta tensor; no data!
    gg = evtc.GroupedGemm("D = relu(acc + bias[n])")
    A, B, _ = _operands()
    with pytest.raises(ArgumentError, match="offs is on meta"):
        gg.run_eager(A, B, torch.empty(E, dtype=torch.int32, device="meta"), bias=torch.zeros(E, N))
    with pytest.raises(_Launched):  # a CPU tensor is still checked and copied
        gg.run_eager(A, B, torch.tensor([3, 6, 10], dtype=torch.int32), bias=torch.zeros(E, N))


def test_grouped_n_zero_returns_empty_outputs_without_a_build(on_cpu):
    # N = 0 went on to the kernel's build and launch (T = 0 and E = 0 returned at once)
    gg = evtc.GroupedGemm("D = acc; s = sum(acc, dim=1)")
    A, B, offs = _operands(n=0)
    got = gg.run_eager(A, B, offs)
    assert tuple(got["D"].shape) == (T, 0)
    assert tuple(got["s"].shape) == (T,) and torch.equal(got["s"], torch.zeros(T))  # the sum's identity


def test_grouped_k_zero_says_so(on_cpu):
    # was: "A's row stride (1 elements) is not a multiple of 16 bytes"
    gg = evtc.GroupedGemm("D = relu(acc)")
    A, B, offs = _operands(k=0)
    with pytest.raises(ArgumentError, match="K = 0 .*no zero-K path"):
        gg.run_eager(A, B, offs)


# ---- GroupedGemm: outputs that overlap ------------------------------------------------------------


def test_grouped_out_that_is_a_reads_tensor_is_refused(on_cpu):
    # the mainloop read A while the epilogue stored into it: accepted, a race
    gg = evtc.GroupedGemm("D = relu(acc + bias[n])")
    buf = torch.zeros(T, K, dtype=bf)
    with pytest.raises(ArgumentError, match="out overlaps the input 'A'"):
        gg.run_eager(buf, torch.zeros(E, K, K, dtype=bf), _operands()[2], out=buf, bias=torch.zeros(K))


def test_grouped_out_that_overlaps_itself_is_refused(on_cpu):
    # an expanded (T, N) view of one row passed the 16-byte row check (stride 0)
    gg = evtc.GroupedGemm("D = relu(acc + bias[n])")
    A, B, offs = _operands()
    with pytest.raises(ArgumentError, match="out overlaps itself"):
        gg.run_eager(A, B, offs, out=torch.zeros(1, N, dtype=bf).expand(T, N), bias=torch.zeros(E, N))


def test_grouped_outputs_that_overlap_each_other_or_part_of_c_are_refused(on_cpu):
    A, B, offs = _operands()
    two = evtc.GroupedGemm("D = acc; F = acc * 2")
    big = torch.zeros(T, 2 * N, dtype=bf)
    with pytest.raises(ArgumentError, match=r"out\['F'\] overlaps an output out\['D'\]"):
        two.run_eager(A, B, offs, out={"D": big[:, :N], "F": big[:, 8:N + 8]})
    with pytest.raises(_Launched):  # two column blocks of one buffer lie side by side
        two.run_eager(A, B, offs, out={"D": big[:, :N], "F": big[:, N:]})
    src = evtc.GroupedGemm("D = acc + C")
    buf = torch.zeros(T + 1, N, dtype=bf)
    with pytest.raises(ArgumentError, match="out overlaps the input 'C'"):
        src.run_eager(A, B, offs, out=buf[1:], C=buf[:-1])
    C = torch.zeros(T, N, dtype=bf)
    with pytest.raises(_Launched):  # exactly C: in place
        src.run_eager(A, B, offs, out=C, C=C)


# ---- the torch ops' arguments and fake implementations ------------------------------------------


@pytest.fixture(scope="module")
def ops():
    g = evtc.Gemm("D = relu(alpha * acc + bias[n])")
    gg = evtc.GroupedGemm("D = relu(alpha * acc + bias[n])")
    return g.torch_op(), gg.torch_op()


@pytest.mark.parametrize("alpha", ["x", None, 1j, True, [1.0]], ids=["str", "None", "complex", "bool", "list"])
def test_torch_op_scalar_that_is_no_number(ops, alpha):
    # ValueError: could not convert string to float: 'x' (TypeError for None, 1j, a list; True taken as 1.0)
    from torch._subclasses.fake_tensor import FakeTensorMode

    op, gop = ops
    with FakeTensorMode():
        A, bias = torch.empty(16, 64, dtype=bf), torch.empty(48)
        with pytest.raises(ArgumentError, match="'alpha' .* is not a number"):
            op(A, torch.empty(48, 64, dtype=bf), alpha=alpha, bias=bias)
        with pytest.raises(ArgumentError, match="'alpha' .* is not a number"):
            gop(A, torch.empty(E, 48, 64, dtype=bf), torch.empty(E, dtype=torch.int32), alpha=alpha, bias=bias)


def test_torch_op_tensor_argument_that_is_no_tensor(ops):
    # RuntimeError from torch's schema ("Expected a value of type 'Tensor' for argument 'bias'")
    op, gop = ops
    with pytest.raises(ArgumentError, match="'bias' is a float, not a torch tensor"):
        op(torch.empty(16, 64, dtype=bf), torch.empty(48, 64, dtype=bf), alpha=1.0, bias=1.0)
    with pytest.raises(ArgumentError, match="'offs' is a list, not a torch tensor"):
        gop(torch.empty(16, 64, dtype=bf), torch.empty(E, 48, 64, dtype=bf), [3, 6, 10], alpha=1.0,
            bias=torch.empty(48))


def test_torch_op_scalars_that_are_numbers_still_run(ops):
    from torch._subclasses.fake_tensor import FakeTensorMode

    op, gop = ops
    with FakeTensorMode():
        for alpha in (2, 0.5, np.float32(0.5), torch.tensor(0.5)):
            D = op(torch.empty(16, 64, dtype=bf), torch.empty(48, 64, dtype=bf), alpha=alpha, bias=torch.empty(48))
            assert tuple(D.shape) == (16, 48)
            D = gop(torch.empty(T, 64, dtype=bf), torch.empty(E, 48, 64, dtype=bf), torch.empty(E, dtype=torch.int32),
                    alpha=alpha, bias=torch.empty(E, 48))
            assert tuple(D.shape) == (T, 48)


@pytest.mark.parametrize("a, b, needle", [
    ((64,), (48, 64), "2-D or 3-D"),              # IndexError: tuple index out of range
    ((2, 2, 16, 64), (48, 64), "2-D or 3-D"),     # a (16, 48) D
    ((16, 32), (48, 64), "K extents differ"),     # a (16, 48) D
    ((2, 16, 64), (3, 48, 64), "batch 2 .* batch 3"),  # a (3, 16, 48) D
])
def test_gemm_fake_checks_the_operands_extents(ops, a, b, needle):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        with pytest.raises(ArgumentError, match=needle):
            ops[0](torch.empty(a, dtype=bf), torch.empty(b, dtype=bf), alpha=1.0, bias=torch.empty(48))


@pytest.mark.parametrize("a, b, offs, needle", [
    ((T, 64), (48,), (E,), "A .* and B .*: the grouped GEMM takes"),       # ValueError: not enough values to unpack
    ((T, 64), (48, 64), (E,), "A .* and B .*: the grouped GEMM takes"),    # a (T, 64) D
    ((64,), (E, 48, 64), (E,), "A .* and B .*: the grouped GEMM takes"),   # a (64, 48) D
    ((T, 32), (E, 48, 64), (E,), "A .* and B .*: the grouped GEMM takes"),  # K differs: a (T, 48) D
    ((T, 64), (E, 48, 64), (E - 1,), "offs is torch.int32 \\(2,\\)"),
    ((T, 64), (E, 48, 64), "int64", "offs is torch.int64"),
])
def test_grouped_fake_checks_the_operands_and_offsets(ops, a, b, offs, needle):
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        o = torch.empty(E, dtype=torch.int64) if offs == "int64" else torch.empty(offs, dtype=torch.int32)
        with pytest.raises(ArgumentError, match=needle):
            ops[1](torch.empty(a, dtype=bf), torch.empty(b, dtype=bf), o, alpha=1.0, bias=torch.empty(48))


# ---- torch-written epilogues that slice -----------------------------------------------------------


def _slice_n8(acc):
    return acc[:, :8]


def _slice_rows(acc):
    return acc[:100] * 2


def _slice_start(acc, bias: evtc.RowVector[evtc.f32]):
    return acc + bias[1:]


def _slice_step(acc):
    return acc[:, ::2]


def _slice_big(acc):
    return acc[:, 0:2**40]


@pytest.mark.parametrize("fn, shown", [(_slice_n8, "[:8]"), (_slice_rows, "[:100]"), (_slice_start, "[1:]"),
                                       (_slice_step, "[::2]"), (_slice_big, f"[0:{2**40}]")])
def test_a_torch_epilogue_that_slices_is_refused_at_its_line(fn, shown):
    # acc[:, :8] covers the fake N = 7, so torch's indexing recorded nothing: imported as acc
    with pytest.raises(UnsupportedOpError) as e:
        evtc.Gemm(evtc.epilogue(fn, frontend="torch"))
    assert f"slices a tensor ({shown})" in e.value.message
    assert e.value.loc is not None and e.value.loc.text.strip().startswith("return")


def test_a_torch_epilogue_still_indexes_to_add_unit_dimensions():
    def unit(acc, bias: evtc.RowVector[evtc.f32], w: evtc.ColVector[evtc.f32]):
        return acc[..., :] * w[:, None][:, :] + bias[None, :] + acc[:, ::1] + acc[0:, :]

    text = str(evtc.Gemm(evtc.epilogue(unit, frontend="torch")).graph)
    assert "bias" in text and "w" in text


# ---- the torch backend: addmm and baddbmm with beta = 0 ------------------------------------------


@pytest.mark.parametrize("batched", [False, True])
def test_addmm_with_beta_zero_ignores_its_input(batched):
    """torch.addmm / baddbmm: "If beta is 0, then input will be ignored, and nan and inf in it will
    not be propagated"; the region computed 0 * input: a NaN input gave NaN everywhere."""
    from test_torch_backend import GEMMS, compiled

    x, w = torch.randn(16, 64).to(bf), torch.randn(32, 64).to(bf)
    if batched:
        x, w = x.expand(2, 16, 64).contiguous(), w.expand(2, 32, 64).contiguous()
        f = lambda x, w, c: torch.relu(torch.baddbmm(c, x, w.transpose(1, 2), beta=0.0, alpha=2.0))  # noqa: E731
        c = torch.full((2, 16, 32), float("nan")).to(bf)
    else:
        f = lambda x, w, c: torch.relu(torch.addmm(c, x, w.t(), beta=0, alpha=2.0))  # noqa: E731
        c = torch.full((32,), float("nan")).to(bf)
    got, fused = compiled(f, x, w, c)
    assert fused == 1 and torch.isfinite(got).all()
    with torch.no_grad():
        assert torch.allclose(got.double(), f(x, w, c).double(), rtol=0.02, atol=0.05)
    assert len(GEMMS[0].graph.used_inputs) == 1  # the accumulator alone: the input is not read


def test_addmm_with_beta_still_adds_its_input():
    from test_torch_backend import compiled

    x, w, b = torch.randn(16, 64).to(bf), torch.randn(32, 64).to(bf), torch.randn(32).to(bf)
    f = lambda x, w, b: torch.addmm(b, x, w.t(), beta=0.5)  # noqa: E731
    # (fuse_all: an addmm with nothing after it stays torch's, NOTE [A bare GEMM stays torch's])
    got, fused = compiled(f, x, w, b, fuse_all=True)
    with torch.no_grad():
        assert fused == 1 and torch.allclose(got.double(), f(x, w, b).double(), rtol=0.02, atol=0.05)


# ---- evtc plan --svg / --png ------------------------------------------------------------------------


@pytest.mark.parametrize("args, needle", [
    (["--png", "p.svg"], "name it p.png"),          # wrote an SVG file for --png
    (["--svg", "p.png"], "name it p.svg"),
    (["--svg", "p"], "name it p.svg"),              # was refused only after planning
    (["--svg", "p.svg", "--dot", "p.svg"], "same file"),  # the second overwrote the first
])
def test_cli_plan_picture_options_name_their_format(tmp_path, monkeypatch, args, needle):
    from evtc.cli import main

    monkeypatch.chdir(tmp_path)
    r = CliRunner().invoke(main, ["plan", "--expr", "D = relu(acc)", *args])
    assert r.exit_code == 2, r.output
    assert needle in r.output and "Traceback" not in r.output
    assert not list(tmp_path.iterdir())


def test_cli_plan_still_draws_both_pictures(tmp_path):
    pytest.importorskip("matplotlib")
    from evtc.cli import main

    svg, png = tmp_path / "p.SVG", tmp_path / "p.png"
    r = CliRunner().invoke(main, ["plan", "--expr", "D = relu(acc)", "--svg", str(svg), "--png", str(png)])
    assert r.exit_code == 0, r.output
    assert svg.read_bytes().lstrip().startswith(b"<") and png.read_bytes().startswith(b"\x89PNG")


# ---- evtc.Conv: choose, member, ConvProblem -------------------------------------------------------


@pytest.fixture(scope="module")
def conv():
    return evtc.Conv("D = relu(acc)")


@pytest.mark.parametrize("args, kw, needle", [
    (("64", 64, 576), {}, "choose\\('64', 64, 576\\)"),   # TypeError: '<' not supported
    ((-1, 64, 576), {}, "choose\\(-1, 64, 576\\)"),       # chose a member
    ((64.5, 64, 576), {}, "choose\\(64.5, 64, 576\\)"),
    ((True, 64, 576), {}, "choose\\(True, 64, 576\\)"),
    ((64, 64, 576), {"sm_count": 0}, "sm_count=0"),
    ((64, 64, 576), {"channels": -1}, "channels=-1"),
    ((64, 64, 576), {"channels": "64"}, "channels='64'"),
])
def test_conv_choose_checks_its_problem(conv, args, kw, needle):
    with pytest.raises(ArgumentError, match=needle):
        conv.choose(*args, **kw)


def test_conv_choose_still_takes_integers(conv):
    assert conv.choose(np.int64(4096), 64, 576, channels=np.int32(64), sm_count=132) == \
        conv.choose(4096, 64, 576, channels=64, sm_count=132)


@pytest.mark.parametrize("name", [["base"], {"a": 1}, None])
def test_conv_member_of_no_name(conv, name):
    # TypeError: unhashable type: 'list'
    with pytest.raises(ConfigError, match="is not a member's name"):
        conv.member(name)


def test_conv_problem_takes_numpy_integers():
    # np.int64(2) was "not an int or a sequence of 2 ints", where torch's conv2d takes it
    spec = evtc.ConvProblem(stride=np.int64(2), padding=(np.int32(1), 1), dilation=1).normalize(2)
    assert spec.stride == (2, 2) and spec.padding == (1, 1) and all(type(v) is int for v in spec.stride + spec.padding)
    with pytest.raises(ArgumentError, match="stride = True"):
        evtc.ConvProblem(stride=True).normalize(2)
    with pytest.raises(ArgumentError, match="needs 2 ints"):
        evtc.ConvProblem(stride=(np.float64(1.0), 1)).normalize(2)


def test_python_arithmetic_on_an_item_is_named_as_such():
    """`alpha.item() * 3` in a torch-written epilogue was refused as "torch op mul has no evtc
    lowering", an op the table has; it is Python arithmetic on a number read out of a tensor."""
    import evtc
    from evtc.errors import UnsupportedOpError

    def ep(acc, alpha: float):
        return acc * (alpha.item() * 3)

    with pytest.raises(UnsupportedOpError, match=r"Python mul on a number read out of a tensor") as e:
        evtc.Gemm(evtc.epilogue(ep, frontend="torch"), a="bf16")
    assert "alpha * 3" in str(e.value)
