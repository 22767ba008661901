"""Regressions from an adversarial sweep of the day's features (sweep 7): the symbolic graph
fused once for every shape (NOTE [One fused graph for every shape] in evtc/torch/backend.py),
EVTC_MAX_SPECIALIZATIONS and the others. On the CPU, with evtc's float64 interpreter as the fused
op's kernel (tests/null/test_torch_backend.py)."""

import copy

import pytest

torch = pytest.importorskip("torch")
nn = torch.nn
F = torch.nn.functional

from test_torch_backend import register  # noqa: E402

from evtc.torch.backend import make_backend  # noqa: E402


def _run(model, inputs, **compile_kw):
    """``model`` compiled by the evtc backend (no Inductor), called on each of ``inputs``; every
    output checked against the float64 model; the backend."""
    torch._dynamo.reset()
    be = make_backend(allow_cpu=True, on_gemm=register, inductor=False)
    cm = torch.compile(model, backend=be, **compile_kw)
    ref_m = copy.deepcopy(model).double()
    with torch.no_grad():
        for args in inputs:
            want = ref_m(*[a.double() if torch.is_tensor(a) else a for a in args])
            got = cm(*args).double()
            assert (got - want).abs().max().item() <= 2 ** -7 * want.abs().max().item()
    return be


class ScaledByLength(nn.Module):
    """A region value times a size input (the KV length): a gated-pair candidate whose other
    factor is a SymInt in the symbolic trace."""

    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(64, 64)

    def forward(self, x, cache, pos):
        return torch.relu(self.fc(x)) * pos + cache[:, :pos].sum(1)


def test_a_region_times_a_size_input_is_fused_per_shape():
    """The symbolic trace of NOTE [One fused graph for every shape] has ``h * pos`` with ``pos`` a
    SymInt node: the gated matcher read its ``.shape`` (AttributeError inside torch.compile). The
    product stays outside the symbolic region, so each shape is specialized."""
    torch.manual_seed(0)
    cache = torch.randn(3, 48, 64).bfloat16()
    be = _run(ScaledByLength().bfloat16(), [(torch.randn(3, 64).bfloat16(), cache, pos) for pos in (1, 2, 3, 4)])
    assert be.fused == 4


class ChunkedGLU(nn.Module):
    """Phi-3's gate_up projection with the weight an input: under dynamic=True its rows (2I) are
    symbolic, and so is the split's size."""

    def forward(self, x, w):
        g, u = F.linear(x, w).chunk(2, -1)
        return F.silu(g) * u


@pytest.mark.parametrize("dynamic", [True, None])
def test_a_symbolic_split_of_a_projection_is_no_gated_pair(dynamic):
    """The split's size in the symbolic trace is an fx node (the symbolic I): the gated matcher
    took int() of it (TypeError inside torch.compile). Each shape is fused on its own."""
    torch.manual_seed(1)
    be = _run(ChunkedGLU().bfloat16(), [(torch.randn(8, 64).bfloat16(), torch.randn(rows, 64).bfloat16())
                                         for rows in (64, 80, 96)], dynamic=dynamic)
    assert be.fused == 3


@pytest.mark.parametrize("raw, want", [(" 7 ", 7), ("0", 0), ("00012", 12), ("9" * 40, int("9" * 40)),
                                       ("9" * 5000, None), ("-1", None), ("1e3", None), ("\u0663", None),
                                       ("\u00b2", None), ("+3", None), ("7_0", None)])
def test_max_specializations_reads_a_count_or_says_why_not(monkeypatch, raw, want):
    """EVTC_MAX_SPECIALIZATIONS (a 'count' knob): more digits than int() reads (4300) was
    Python's ValueError, not evtc's ConfigError naming the variable."""
    from evtc import knobs
    from evtc.errors import ConfigError

    monkeypatch.setenv("EVTC_MAX_SPECIALIZATIONS", raw)
    if want is not None:
        assert knobs.max_specializations.get() == want
        return
    with pytest.raises(ConfigError, match="EVTC_MAX_SPECIALIZATIONS=.* is not a whole number from 0") as e:
        knobs.max_specializations.get()
    assert len(str(e.value).splitlines()[0]) < 200


def test_cache_prune_takes_a_cache_on_a_volume_of_its_own(tmp_path):
    """NOTE [Prune only a cache]: a cache that is the root of a file system of its own (a mounted
    volume) holds lost+found, which prune never removes; it refused such a cache."""
    from click.testing import CliRunner

    from evtc.cli import main

    root = tmp_path / "cache"
    for d in ("lost+found", "tmp/leftover", "construct/ab", "tuning", "torch_fast/0123"):
        (root / d).mkdir(parents=True)
    root.chmod(0o700)
    r = CliRunner().invoke(main, ["cache", "--dir", str(root), "prune", "--all"])
    assert r.exit_code == 0, r.output
    assert (root / "lost+found").is_dir() and not (root / "construct").exists()
