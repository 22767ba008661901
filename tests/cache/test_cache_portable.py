"""The portable cache: a kernel built with nvcc is found without one; export/import round trips;
archives that are not what they claim are refused; ``evtc cache`` on the command line."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

import pytest
from click.testing import CliRunner

from cache_helpers import copy_prebuilt, loaded_tag, needs_nvcc, tiny_source
from evtc.compiler import CacheError, CacheWarning, build, lookup, nvcc
from evtc.compiler import archive as cache_archive
from evtc.compiler import store

pytestmark = needs_nvcc
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache(cache_env, prebuilt):
    copy_prebuilt(prebuilt, cache_env)
    return cache_env


def test_lookup_without_nvcc_finds_a_kernel_built_with_nvcc(cache, monkeypatch):
    """In this process: no nvcc to find, and any attempt to start a program fails the test."""
    built = lookup(tiny_source("a"), "sm80", name="a")
    monkeypatch.setenv("EVTC_NVCC", "none")
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.setenv("CUDA_HOME", "/nonexistent")
    assert nvcc.find_nvcc() is None

    def no_programs(*a, **k):
        raise AssertionError(f"a lookup started a program: {a}")

    monkeypatch.setattr(subprocess, "Popen", no_programs)
    monkeypatch.setattr(subprocess, "run", no_programs)
    a = lookup(tiny_source("a"), "sm80", name="a")
    assert a is not None and a.library == built.library
    b = build(tiny_source("a"), "sm80", name="a")  # a hit: build() needs no nvcc either
    assert b.cached and loaded_tag(b.verified_library_path()) == "a"


NO_NVCC_CHILD = textwrap.dedent("""
    import sys
    from evtc.compiler import build, find_nvcc
    from evtc.runtime.launch import KernelLibrary
    assert find_nvcc() is None
    a = build(open(sys.argv[1]).read(), "sm80", name="a")
    print(a.cached, KernelLibrary(a.verified_library_path()).info["static"]["tag"])
""")


def test_machine_without_nvcc_imports_and_loads(cache, tmp_path):
    """Another process, with nvcc nowhere to be found, imports an archive and loads from it."""
    archive = tmp_path / "k.tar.xz"
    cache_archive.export_entries(store.cache_root(), archive)
    src = tmp_path / "a.cu"
    src.write_text(tiny_source("a"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("CUDA", "EVTC_", "NVCC"))}
    env.update(PATH="/usr/bin:/bin", EVTC_NVCC="none", EVTC_CACHE_DIR=str(tmp_path / "serving"), PYTHONPATH=str(ROOT))
    r = subprocess.run([sys.executable, "-m", "evtc", "cache", "import", str(archive)], env=env, cwd=ROOT,
                       capture_output=True, text=True)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "imported 2" in r.stdout
    r = subprocess.run([sys.executable, "-c", NO_NVCC_CHILD, str(src)], env=env, cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["True", "a"]


def test_export_import_round_trip(cache, tmp_path, monkeypatch):
    root = store.cache_root()
    a, b = lookup(tiny_source("a"), "sm80", name="a"), lookup(tiny_source("b"), "sm80", name="b")
    archive = tmp_path / "out" / "kernels.tar.xz"
    archive.parent.mkdir()  # export makes no folders (NOTE [Export targets])
    s = cache_archive.export_entries(root, archive)
    assert sorted(e.name for e in s.exported) == ["a", "b"] and not s.refused and not s.missing
    with tarfile.open(archive) as tar:
        names = tar.getnames()
    assert names[0] == "evtc-cache.json"
    assert f"kernels/{a.key[:2]}/{a.key}/{a.toolchain_id}/kernel.so" in names
    monkeypatch.setenv("EVTC_CACHE_DIR", str(tmp_path / "other"))
    other = store.cache_root()
    s = cache_archive.import_entries(other, archive)
    assert sorted(n for _, _, n in s.imported) == ["a", "b"] and not s.refused and not s.present
    for old in (a, b):
        new = lookup(tiny_source(old.name), "sm80", name=old.name)
        assert new is not None and new.key == old.key and new.library.read_bytes() == old.library.read_bytes()
        assert new.source.read_text() == tiny_source(old.name)
        assert loaded_tag(new.verified_library_path()) == old.name
        assert new.meta["created"] == old.meta["created"]
    s = cache_archive.import_entries(other, archive)
    assert len(s.present) == 2 and not s.imported


def test_export_selected_keys(cache, tmp_path):
    a = lookup(tiny_source("a"), "sm80", name="a")
    s = cache_archive.export_entries(store.cache_root(), tmp_path / "a.tar.gz", keys=[a.key[:10], "deadbeef00"],
                             include_sources=False)
    assert [e.name for e in s.exported] == ["a"] and s.missing == ["deadbeef00"]
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        assert not any(n.endswith(("kernel.cu", "build.log")) for n in tar.getnames())
    with pytest.raises(CacheError, match="not a cache key"):
        cache_archive.export_entries(store.cache_root(), tmp_path / "x.tar", keys=["abc"])


def _rewrite(archive: Path, out: Path, edit) -> None:
    """Copy a tar archive, passing each (TarInfo, bytes) through ``edit`` (None drops it)."""
    with tarfile.open(archive) as src, tarfile.open(out, "w") as dst:
        for m in src:
            data = src.extractfile(m).read() if m.isreg() else b""
            got = edit(m, data)
            if got is None:
                continue
            m2, data2 = got
            m2.size = len(data2)
            m2.pax_headers = {}  # a long name read back sits in a pax header that would win over m2.name
            dst.addfile(m2, io.BytesIO(data2))


@pytest.fixture
def archive(cache, tmp_path):
    p = tmp_path / "good.tar"
    cache_archive.export_entries(store.cache_root(), p)
    return p


def _import_fresh(tmp_path, monkeypatch, archive):
    monkeypatch.setenv("EVTC_CACHE_DIR", str(tmp_path / "fresh"))
    return cache_archive.import_entries(store.cache_root(), archive)


def test_import_refuses_a_tampered_library(archive, tmp_path, monkeypatch):
    bad = tmp_path / "bad.tar"

    def edit(m, data):
        if m.name.endswith("kernel.so"):
            data = data[:-100] + b"\0" * 100
        return m, data

    _rewrite(archive, bad, edit)
    s = _import_fresh(tmp_path, monkeypatch, bad)
    assert len(s.refused) == 2 and not s.imported
    assert all("SHA-256 of kernel.so" in why for *_, why in s.refused)
    assert not (tmp_path / "fresh" / "kernels").exists() or not any((tmp_path / "fresh" / "kernels").rglob("kernel.so"))


def test_import_refuses_another_abi(archive, tmp_path, monkeypatch):
    bad = tmp_path / "abi.tar"

    def edit(m, data):
        if m.name.endswith("meta.json"):
            meta = json.loads(data)
            meta["abi_version"] = 999
            data = json.dumps(meta).encode()
        return m, data

    _rewrite(archive, bad, edit)
    s = _import_fresh(tmp_path, monkeypatch, bad)
    assert len(s.refused) == 2 and all("built for C ABI 999" in why for *_, why in s.refused)


def test_import_refuses_an_entry_under_another_key(archive, tmp_path, monkeypatch):
    """b's files renamed under a's key (meta.json still names b's key)."""
    with tarfile.open(archive) as tar:
        dirs = sorted({m.name.rsplit("/", 1)[0] for m in tar if m.name.startswith("kernels/")})
    a_dir, b_dir = dirs
    bad = tmp_path / "swap.tar"

    def edit(m, data):
        if m.name.startswith(a_dir):
            return None
        if m.name.startswith(b_dir):
            m.name = a_dir + m.name[len(b_dir):]
        return m, data

    _rewrite(archive, bad, edit)
    s = _import_fresh(tmp_path, monkeypatch, bad)
    assert len(s.refused) == 1 and "another kernel placed under this key" in s.refused[0][3]


@pytest.mark.parametrize("case", ["no manifest", "other format", "path escape", "symlink", "junk"])
def test_import_refuses_what_is_not_an_export(archive, tmp_path, monkeypatch, case):
    bad = tmp_path / "bad.tar"
    if case == "junk":
        bad.write_bytes(b"this is not a tar file" * 100)
    else:
        def edit(m, data):
            if case == "no manifest" and m.name == "evtc-cache.json":
                return None
            if case == "other format" and m.name == "evtc-cache.json":
                return m, json.dumps({"format": "someone-else/7"}).encode()
            if case == "path escape" and m.name.endswith("build.log"):
                m.name = "kernels/../../evil.sh"
            if case == "symlink" and m.name.endswith("kernel.cu"):
                m.type = tarfile.SYMTYPE
                m.linkname = "/etc/passwd"
                return m, b""
            return m, data

        _rewrite(archive, bad, edit)
    with pytest.raises(CacheError) as e:
        _import_fresh(tmp_path, monkeypatch, bad)
    expected = {"no manifest": "does not start with evtc-cache.json", "other format": "someone-else/7",
                "path escape": "unexpected member", "symlink": "not a regular file", "junk": "can't read"}[case]
    assert expected in str(e.value)
    assert not list((tmp_path / "fresh").rglob("evil.sh"))


def test_lookup_prefers_the_local_toolchain(cache, monkeypatch):
    """Two builds of one key by different toolchains: with nvcc, the local one wins; without,
    any verified one is used."""
    root = store.cache_root()
    a = lookup(tiny_source("a"), "sm80", name="a")
    lib = a.library.read_bytes()
    meta = a.meta
    foreign = dict(meta["toolchain"], nvcc="cuda_1.0.foreign")
    m2 = store.make_meta(root, key=a.key, material=meta["material"], toolchain=foreign, library=lib, name="a",
                         arch="sm80", command=[], seconds=1.0)
    lock = store.key_lock(root, a.key, 5)
    try:
        store.install_entry(root, m2, lib)
    finally:
        lock.release()
    assert sorted(store.toolchain_ids(root, a.key)) == sorted([a.toolchain_id, m2["toolchain_id"]])
    assert lookup(tiny_source("a"), "sm80", name="a").toolchain_id == a.toolchain_id == nvcc.toolchain().id
    monkeypatch.setenv("EVTC_NVCC", "none")
    assert lookup(tiny_source("a"), "sm80", name="a").toolchain_id in (a.toolchain_id, m2["toolchain_id"])
    # the local toolchain's entry refused: the other one serves
    monkeypatch.delenv("EVTC_NVCC")
    a.library.chmod(0o600)
    a.library.write_bytes(b"junk")
    with pytest.warns(CacheWarning):
        assert lookup(tiny_source("a"), "sm80", name="a").toolchain_id == m2["toolchain_id"]


# ---- the command line ----------------------------------------------------------------------

def test_cli_list_export_import_prune(cache, tmp_path):
    from evtc.cli import main

    runner = CliRunner()
    r = runner.invoke(main, ["cache", "list"])
    assert r.exit_code == 0, r.output
    assert str(cache) in r.output and "private" in r.output and r.output.count(" ok") == 2
    r = runner.invoke(main, ["cache", "list", "--json"])
    data = json.loads(r.output)
    assert sorted(e["name"] for e in data["entries"]) == ["a", "b"] and all(e["ok"] for e in data["entries"])
    out = tmp_path / "k.tar.xz"
    r = runner.invoke(main, ["cache", "export", str(out)])
    assert r.exit_code == 0 and "exported 2 kernels" in r.output, r.output
    r = runner.invoke(main, ["cache", "--dir", str(tmp_path / "b"), "import", str(out)])
    assert r.exit_code == 0 and "imported 2" in r.output, r.output
    r = runner.invoke(main, ["cache", "--dir", str(tmp_path / "b"), "prune", "--all", "--dry-run"])
    assert "would remove 2 kernels" in r.output and (tmp_path / "b" / "kernels").exists()
    r = runner.invoke(main, ["cache", "--dir", str(tmp_path / "b"), "prune", "--max-size", "1k"])
    assert r.exit_code == 0 and "removed 2 kernels" in r.output, r.output
    r = runner.invoke(main, ["cache", "--dir", str(tmp_path / "b"), "prune"])
    assert r.exit_code == 2 and "say what to remove" in r.output
    r = runner.invoke(main, ["cache", "prune", "--older-than", "soon"])
    assert r.exit_code == 2 and "not a duration" in r.output


def test_cli_import_of_a_foreign_file_is_an_evtc_error(cache, tmp_path):
    from evtc.cli import main

    bad = tmp_path / "x.tar"
    with tarfile.open(bad, "w") as tar:
        info = tarfile.TarInfo("hello.txt")
        info.size = 2
        tar.addfile(info, io.BytesIO(b"hi"))
    r = CliRunner().invoke(main, ["cache", "import", str(bad)])
    assert r.exit_code == 2 and "CacheError" in r.output and "not an evtc cache export" in r.output


def test_cli_import_reports_refused_entries_and_exits_1(cache, tmp_path):
    from evtc.cli import main

    good = tmp_path / "good.tar"
    cache_archive.export_entries(store.cache_root(), good)
    bad = tmp_path / "bad.tar"
    _rewrite(good, bad, lambda m, d: (m, d[:-1] + b"\1") if m.name.endswith("kernel.so") else (m, d))
    r = CliRunner().invoke(main, ["cache", "--dir", str(tmp_path / "c"), "import", str(bad)])
    assert r.exit_code == 1 and r.output.count("refused") >= 2 and "imported 0" in r.output, r.output


def test_pack_cache_is_a_thin_wrapper_over_export(cache, tmp_path):
    """benchmarks/pack_cache.py packs named kernels with the same archive format."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    try:
        import pack_cache
    finally:
        sys.path.pop(0)
    a = lookup(tiny_source("a"), "sm80", name="a")
    out = tmp_path / "p.tar.xz"
    pack_cache.pack([(tiny_source("a"), "sm80", "a"), (tiny_source("zzz"), "sm80", "zzz")], out)
    with tarfile.open(out) as tar:
        names = tar.getnames()
    assert names[0] == "evtc-cache.json" and any(a.key in n for n in names) and len(names) == 3
