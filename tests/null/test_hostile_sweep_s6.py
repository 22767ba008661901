"""A hostile-input sweep (sixth round), no GPU and no nvcc: make_backend's flags and callbacks, the
torch backend's options that no Gemm can take together, Gemm.run's dict of arguments, `evtc cache
prune` in a folder that is not only a kernel cache, and `evtc cache export` into a name of another
format. Each case escaped as a raw Python exception, was accepted silently into something else
than asked, or removed files evtc never wrote before its fix: now an EvtcError naming the argument
or the folder."""

from __future__ import annotations

import os
import tarfile

import pytest
from click.testing import CliRunner

import evtc
from evtc.errors import ArgumentError

LIN = "D = relu(alpha*acc + C + bias[n])"


def _cli(args):
    from evtc.cli import main

    return CliRunner().invoke(main, args)


# ---- make_backend's flags and callbacks ---------------------------------------------------------------


@pytest.mark.parametrize("kw, needle", [
    ({"allow_cpu": "no"}, "allow_cpu='no'"),    # truthy: CPU matches fused, then NotImplementedError at the call
    ({"allow_cpu": 1}, "allow_cpu=1"),
    ({"inductor": "no"}, "inductor='no'"),      # truthy: compiled with Inductor
    ({"inductor": None}, "inductor=None"),
    ({"on_gemm": 3}, "on_gemm=3"),              # TypeError: 'int' object is not callable, at the first match
    ({"gate": "never"}, "gate='never'"),
])
def test_make_backend_checks_its_flags_and_callbacks(kw, needle):
    pytest.importorskip("torch")
    from evtc.torch.backend import make_backend

    with pytest.raises(ArgumentError) as e:
        make_backend(**kw)
    assert needle in str(e.value), str(e.value)
    assert make_backend(allow_cpu=True, inductor=False, on_gemm=print, gate=None).fused == 0


@pytest.mark.parametrize("how", ["options", "env"])
def test_backend_atomic_sums_with_batch_invariance_is_refused(monkeypatch, how):
    """Every Gemm the backend made refused the pair (ConfigError), the backend caught it and left
    every match unfused: torch.compile(..., options={'batch_invariant': True, 'atomic_sums': True})
    ran cuBLAS's kernels, which batch invariance was asked to rule out, without a word."""
    pytest.importorskip("torch")
    from evtc.torch.backend import evtc_backend, make_backend

    if how == "options":
        with pytest.raises(ArgumentError, match="atomic_sums=True and batch_invariant=True: float atomics"):
            evtc_backend(None, [], options={"batch_invariant": True, "atomic_sums": True})
    else:
        monkeypatch.setenv("EVTC_BATCH_INVARIANT", "1")
        with pytest.raises(ArgumentError, match=r"batch_invariant=True \(EVTC_BATCH_INVARIANT\)"):
            make_backend(gemm_options={"atomic_sums": True})
        assert make_backend(gemm_options={"atomic_sums": False}).fused == 0
        monkeypatch.delenv("EVTC_BATCH_INVARIANT")
    assert make_backend(gemm_options={"atomic_sums": True}, fuse_all=True).fused == 0


def test_backend_with_both_options_no_longer_leaves_matches_unfused_silently():
    torch = pytest.importorskip("torch")
    from evtc.torch.backend import make_backend

    torch._dynamo.reset()
    with pytest.raises(ArgumentError, match="choose one"):
        make_backend(allow_cpu=True, inductor=False, gemm_options={"batch_invariant": True, "atomic_sums": True})


# ---- Gemm.run's arguments --------------------------------------------------------------------------------


@pytest.mark.parametrize("kwargs", [None, [("alpha", 1.0)], "alpha=1.0", 3])
def test_gemm_run_takes_a_dict_of_arguments(no_build, kwargs):
    # None was "TypeError: object of type 'NoneType' has no len()"; a list of pairs
    # "unexpected argument ('alpha', 1.0)"
    from test_runtime_launch import Fake, lin_args

    g = evtc.Gemm(LIN, a="f16", b="f16", c="f16", d="f16")
    A, B, _ = lin_args(64, 32, 16)
    with pytest.raises(ArgumentError, match=r"kwargs is a \w+, not a dict of the epilogue's parameters"):
        g.run(A, B, kwargs, out=Fake((64, 32)))
    with pytest.raises(ArgumentError, match="missing argument"):  # a dict is read as before
        g.run(A, B, {"alpha": 1.0}, out=Fake((64, 32)))


# ---- evtc cache prune in a folder that is not only a cache -------------------------------------------------


def _tree(root):
    return sorted(os.path.relpath(os.path.join(d, n), root) for d, ds, fs in os.walk(root) for n in ds + fs)


@pytest.mark.parametrize("option", [["--all"], ["--bad"], ["--older-than", "1s"], ["--all", "--dry-run"]])
def test_cache_prune_refuses_a_folder_that_holds_more_than_a_cache(tmp_path, option):
    """`evtc cache --dir ~ prune --all` removed ~/tmp/*, ~/headers, ~/construct and every
    two-hex-digit folder of ~ (`--dir /`: everything in /tmp); `--bad` the files of ~/tmp older
    than an hour; `--older-than` old files under ~/construct."""
    home = tmp_path / "home"
    for d in ("tmp/work", "construct/notes", "headers", "ab", "docs"):
        (home / d).mkdir(parents=True)
    for f in ("tmp/work/draft.txt", "construct/notes/plan.txt", "headers/h.txt", "ab/x.txt", "notes.txt"):
        (home / f).write_text("mine")
        os.utime(home / f, (1, 1))
    os.utime(home / "tmp" / "work", (1, 1))
    before = _tree(home)
    r = _cli(["cache", "--dir", str(home), "prune", *option])
    assert r.exit_code == 2, r.output
    assert "won't prune" in r.output and "'docs', 'notes.txt'" in r.output, r.output
    assert _tree(home) == before


def test_cache_prune_still_prunes_a_cache(tmp_path):
    from evtc.compiler import store

    root = tmp_path / "cache"
    for d in ("tmp/leftover", "construct/ab", "headers", "failed/k", "quarantine", "locks", "tuning", ".hidden"):
        (root / d).mkdir(parents=True)
    root.chmod(0o700)
    r = _cli(["cache", "--dir", str(root), "prune", "--all"])
    assert r.exit_code == 0, r.output
    assert not (root / "construct").exists() and not list((root / "tmp").iterdir())
    assert (root / "locks").is_dir() and (root / ".hidden").is_dir()
    assert store.prune(store.CacheRoot(root), bad=True).kept == 0


# ---- evtc cache export into a name of another format --------------------------------------------------------


@pytest.mark.parametrize("name", ["k.zip", "k.tar.zst", "k.tzst", "k.7z", "k.tar.lz4", "K.ZIP"])
def test_cache_export_refuses_the_name_of_another_format(tmp_path, name):
    # each was written as an xz tar under that name (`tar --zstd -xf k.tar.zst` fails on it)
    (tmp_path / "cache").mkdir(mode=0o700)
    r = _cli(["cache", "--dir", str(tmp_path / "cache"), "export", str(tmp_path / name)])
    assert r.exit_code == 2 and "a format evtc cache export does not write" in r.output, r.output
    assert not (tmp_path / name).exists()


@pytest.mark.parametrize("name, magic", [("k.TAR.GZ", b"\x1f\x8b"), ("k.tgz", b"\x1f\x8b"), ("k.gz", b"\x1f\x8b"),
                                         ("k.TAR.BZ2", b"BZh"), ("k.TAR", None), ("k.tar.xz", b"\xfd7zXZ"),
                                         ("k.archive", b"\xfd7zXZ")])
def test_cache_export_compression_follows_the_name_in_any_case(tmp_path, name, magic):
    # K.TAR.GZ was written as xz
    (tmp_path / "cache").mkdir(mode=0o700)
    r = _cli(["cache", "--dir", str(tmp_path / "cache"), "export", str(tmp_path / name)])
    assert r.exit_code == 0, r.output
    data = (tmp_path / name).read_bytes()
    if magic is None:
        assert tarfile.is_tarfile(tmp_path / name) and data[257:262] == b"ustar"
    else:
        assert data.startswith(magic)
    from evtc.compiler import archive, store

    s = archive.import_entries(store.CacheRoot(tmp_path / "cache"), tmp_path / name)  # (and it reads back)
    assert not s.refused and not s.imported


# ---- the torch ops on CPU tensors ---------------------------------------------------------------------------


def test_a_torch_op_called_with_cpu_tensors_names_the_argument():
    # NotImplementedError: Could not run 'evtc::expr_...' with arguments from the 'CPU' backend
    # (the Gemm's own call says "argument 'A' is in host memory")
    torch = pytest.importorskip("torch")
    bf = torch.bfloat16
    op = evtc.Gemm("D = relu(alpha*acc + bias[n])").torch_op()
    with pytest.raises(ArgumentError, match="argument 'A' is on cpu: evtc's op runs its kernel on CUDA tensors"):
        op(torch.zeros(16, 64, dtype=bf), torch.zeros(32, 64, dtype=bf), alpha=1.0, bias=torch.zeros(32))
    gop = evtc.GroupedGemm("D = relu(alpha*acc + bias[n])").torch_op()
    with pytest.raises(ArgumentError, match="argument 'A' is on cpu"):
        gop(torch.zeros(10, 64, dtype=bf), torch.zeros(3, 32, 64, dtype=bf), torch.tensor([3, 6, 10], dtype=torch.int32),
            alpha=1.0, bias=torch.zeros(3, 32))
    meta = {"device": "meta"}  # (meta tensors still take the fake implementation)
    D = op(torch.zeros(16, 64, dtype=bf, **meta), torch.zeros(32, 64, dtype=bf, **meta), alpha=1.0,
           bias=torch.zeros(32, **meta))
    assert tuple(D.shape) == (16, 32)


# ---- the cache folder of a ~user of no user -------------------------------------------------------------------


@pytest.mark.parametrize("var", ["EVTC_CACHE_DIR", "EVTC_SHARED_CACHE"])
def test_a_cache_folder_under_the_home_of_no_user_is_a_cache_error(monkeypatch, var):
    # RuntimeError: Could not determine home directory. (pathlib's expanduser), from the first
    # build or lookup and from every `evtc cache` command
    from evtc.compiler import store
    from evtc.errors import CacheError

    for v in ("EVTC_CACHE_DIR", "EVTC_SHARED_CACHE"):
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv(var, "~no_such_user_evtc/cache")
    with pytest.raises(CacheError, match=f"{var}='~no_such_user_evtc/cache': '~no_such_user_evtc' names no user"):
        store.cache_root()
    r = _cli(["cache", "list"])
    assert r.exit_code == 2 and "names no user's home folder" in r.output, r.output
