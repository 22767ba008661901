"""The verified cache: entries that do not check out are refused before anything is dlopen'ed
(truncated, foreign, planted, incomplete, group-writable), then rebuilt; the cache directory is
private whatever the umask; unusable directories give a CacheError with the cause."""

from __future__ import annotations

import ctypes
import errno
import json
import os
import shutil
import stat
import warnings
from pathlib import Path

import pytest

from cache_helpers import copy_prebuilt, copying_nvcc, loaded_tag, needs_nvcc, prebuilt_library, tiny_source
from evtc.compiler import CacheError, CacheWarning, build, lookup, verified_library_path
from evtc.compiler import store, store_meta, store_root

pytestmark = needs_nvcc


@pytest.fixture
def cache(cache_env, prebuilt):
    """A private copy of the prebuilt cache (kernels ``a`` and ``b``)."""
    copy_prebuilt(prebuilt, cache_env)
    return cache_env


def art(tag: str):
    a = lookup(tiny_source(tag), "sm80", name=tag)
    assert a is not None, f"kernel {tag} should be cached"
    return a


@pytest.fixture
def no_dlopen(monkeypatch):
    """Record every ctypes.CDLL call; the refused libraries must never appear."""
    opened = []
    real = ctypes.CDLL

    def spy(name, *a, **k):
        opened.append(str(name))
        return real(name, *a, **k)

    monkeypatch.setattr(ctypes, "CDLL", spy)
    return opened


def refused_lookup(tag: str, reason: str) -> None:
    """lookup() skips the entry with a CacheWarning naming it and the reason."""
    with pytest.warns(CacheWarning) as rec:
        assert lookup(tiny_source(tag), "sm80", name=tag) is None
    messages = [str(w.message) for w in rec]
    assert any("refused kernel cache entry" in m and reason in m for m in messages), messages


def test_good_entry_loads_the_right_kernel(cache, no_dlopen):
    a = art("a")
    path = a.verified_library_path()
    assert path == a.library
    assert loaded_tag(path) == "a"
    assert no_dlopen == [str(a.library)]
    meta = a.meta
    assert meta["library_sha256"] == store_meta._sha256_bytes(a.library.read_bytes())
    assert meta["key"] == a.key and len(a.key) == 64


@pytest.fixture
def fast_rebuild(prebuilt, tmp_path, monkeypatch):
    """Rebuilds of kernel a copy its prebuilt library instead of running nvcc (seconds saved;
    real builds are tested in test_cache_build.py)."""
    monkeypatch.setenv("EVTC_NVCC", str(copying_nvcc(tmp_path, prebuilt_library(prebuilt, "a"))))


def test_truncated_library_is_refused_then_rebuilt(cache, no_dlopen, fast_rebuild):
    a = art("a")
    size = a.library.stat().st_size
    with open(a.library, "r+b") as f:
        f.truncate(size // 2)  # what made the process die with SIGBUS
    refused_lookup("a", "truncated or replaced")
    with pytest.raises(CacheError, match="refused to load the cached kernel"):
        verified_library_path(a.library)
    assert no_dlopen == []
    with pytest.warns(CacheWarning, match="moved aside and rebuilt"):
        b = build(tiny_source("a"), "sm80", name="a")
    assert not b.cached and b.library == a.library
    assert loaded_tag(b.verified_library_path()) == "a"
    quarantined = list((cache / "quarantine").iterdir())
    assert [p.name.split("-")[:2] for p in quarantined if p.is_dir()] == [[a.key[:16], a.toolchain_id]]


def test_corrupted_library_same_size_is_refused(cache, no_dlopen):
    a = art("a")
    data = bytearray(a.library.read_bytes())
    data[len(data) // 2] ^= 0xFF
    a.library.chmod(0o600)
    a.library.write_bytes(bytes(data))
    refused_lookup("a", "SHA-256 of kernel.so")
    assert no_dlopen == []


def test_library_of_another_kernel_is_refused(cache, no_dlopen):
    a, b = art("a"), art("b")
    shutil.copyfile(b.library, a.library)  # a valid library of a different kernel under a's key
    refused_lookup("a", "kernel.so")
    with pytest.raises(CacheError):
        verified_library_path(a.library)
    assert no_dlopen == []


def test_entry_of_another_kernel_is_refused(cache, no_dlopen):
    a, b = art("a"), art("b")
    shutil.rmtree(a.entry)
    shutil.copytree(b.entry, a.entry)  # the whole entry (meta.json too) moved under a's key
    refused_lookup("a", "another kernel placed under this key")
    assert no_dlopen == []


def test_entry_without_library_is_rebuilt_not_errno_39(cache, fast_rebuild):
    a = art("a")
    a.library.unlink()
    refused_lookup("a", "kernel.so is missing")
    with pytest.warns(CacheWarning):
        b = build(tiny_source("a"), "sm80", name="a")
    assert not b.cached and loaded_tag(b.verified_library_path()) == "a"


def test_planted_library_of_another_user_is_refused(cache, no_dlopen):
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    a = art("a")
    os.chown(a.library, 65534, 65534)
    refused_lookup("a", "not to you")
    os.chown(a.library, 0, 0)
    os.chown(a.entry, 65534, 65534)
    refused_lookup("a", "not to you")
    assert no_dlopen == []


def test_symlinked_library_is_refused(cache, tmp_path, no_dlopen):
    a, b = art("a"), art("b")
    planted = tmp_path / "planted.so"
    shutil.copyfile(b.library, planted)
    a.library.unlink()
    a.library.symlink_to(planted)
    refused_lookup("a", "symbolic link")
    assert no_dlopen == []


@pytest.mark.parametrize("what", ["library", "meta", "entry", "key folder"])
def test_group_writable_entries_are_refused(cache, what, no_dlopen):
    a = art("a")
    path = {"library": a.library, "meta": a.entry / "meta.json", "entry": a.entry, "key folder": a.entry.parent}[what]
    path.chmod(stat.S_IMODE(path.stat().st_mode) | stat.S_IWGRP)
    refused_lookup("a", "writable by group or others")
    assert no_dlopen == []


def test_tampered_meta_is_refused(cache):
    a = art("a")
    meta = json.loads((a.entry / "meta.json").read_text())
    meta["material"]["extra_flags"] = ["-G"]  # claims other key material
    (a.entry / "meta.json").write_text(json.dumps(meta))
    refused_lookup("a", "does not hash to the key")


def test_other_abi_is_refused(cache):
    a = art("a")
    meta = json.loads((a.entry / "meta.json").read_text())
    meta["abi_version"] = -1
    (a.entry / "meta.json").write_text(json.dumps(meta))
    refused_lookup("a", "built for C ABI -1")


def test_private_cache_under_umask_000(cache_env):
    old = os.umask(0)
    try:
        root = store.cache_root(create=True)
        store_root._ensure_dir(root, root.sub("kernels", "ab"))
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(cache_env).st_mode) == 0o700
    assert stat.S_IMODE(os.stat(cache_env / "kernels" / "ab").st_mode) == 0o700


def test_built_entry_is_private_under_umask_000(cache_env, fast_rebuild):
    old = os.umask(0)
    try:
        a = build(tiny_source("a"), "sm80", name="a")
    finally:
        os.umask(old)
    assert not a.cached
    for p in [cache_env, *cache_env.rglob("*")]:
        mode = stat.S_IMODE(p.lstat().st_mode)
        assert mode & 0o077 == 0, f"{p} has mode {mode:o}"
    assert loaded_tag(a.verified_library_path()) == "a"


def test_open_cache_dir_of_ours_keeps_its_mode(cache):
    """evtc changes the mode only of folders it creates (NOTE [Modes of folders evtc did not
    create]): an open cache directory is reported, and its entries are still verified and used."""
    cache.chmod(0o777)
    with pytest.warns(CacheWarning, match="writable by group or others.*leaves the mode"):
        store.cache_root()
    assert stat.S_IMODE(cache.stat().st_mode) == 0o777
    with pytest.warns(CacheWarning):
        assert lookup(tiny_source("a"), "sm80", name="a") is not None


def test_cache_dir_of_another_user_is_an_error(cache):
    if os.geteuid() != 0:
        pytest.skip("chown to another user needs root")
    os.chown(cache, 65534, 65534)
    with pytest.raises(CacheError, match="belongs to .*not to you"):
        build(tiny_source("a"), "sm80", name="a")


def test_unwritable_home_is_a_cache_error(monkeypatch, cache_env):
    monkeypatch.delenv("EVTC_CACHE_DIR")
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.setenv("HOME", "/proc/evtc-no-home")
    with pytest.raises(CacheError) as e:
        build(tiny_source("home"), "sm80", name="home")
    assert "/proc/evtc-no-home/.cache/evtc" in str(e.value) and "EVTC_CACHE_DIR" in str(e.value)


def test_cache_dir_that_is_a_file_is_a_cache_error(cache_env):
    cache_env.parent.mkdir(exist_ok=True)
    cache_env.write_text("not a folder")
    with pytest.raises(CacheError, match="is not a folder"):
        build(tiny_source("file"), "sm80", name="file")


def test_read_only_cache_serves_hits_and_refuses_builds(cache, monkeypatch):
    """A read-only file system (simulated: every write fails with EROFS; root ignores modes)."""
    def erofs(*a, **k):
        raise OSError(errno.EROFS, "Read-only file system", str(a[0]) if a else "")

    for name in ("mkdir", "rename", "replace", "utime"):
        monkeypatch.setattr(os, name, erofs)
    real_open = os.open

    def ro_open(path, flags, *a, **k):
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT):
            erofs(path)
        return real_open(path, flags, *a, **k)

    monkeypatch.setattr(os, "open", ro_open)
    a = build(tiny_source("a"), "sm80", name="a")  # a hit: writes nothing
    assert a.cached
    with pytest.raises(CacheError, match="Read-only file system") as e:
        build(tiny_source("new"), "sm80", name="new")
    assert "EVTC_CACHE_DIR" in str(e.value)


def test_verified_library_path_rejects_paths_outside_a_cache(tmp_path):
    p = tmp_path / "kernel.so"
    p.write_bytes(b"\x7fELF")
    with pytest.raises(CacheError, match="not a kernel in an evtc cache"):
        verified_library_path(p)


def test_shared_cache_allows_group_and_verifies(cache, monkeypatch, no_dlopen):
    monkeypatch.delenv("EVTC_CACHE_DIR")
    monkeypatch.setenv("EVTC_SHARED_CACHE", str(cache))
    a = art("a")
    for p in (a.entry, a.library):
        p.chmod(stat.S_IMODE(p.stat().st_mode) | stat.S_IWGRP | stat.S_IRGRP)
    path = verified_library_path(a.library)
    assert str(path).startswith("/proc/self/fd/")  # the bytes that were hashed, in memory
    assert Path(path).read_bytes() == a.library.read_bytes()
    assert loaded_tag(path) == "a"
    a.library.chmod(0o666)
    with pytest.raises(CacheError, match="writable by everyone"):
        verified_library_path(a.library)
    cache.chmod(0o777)
    with pytest.raises(CacheError, match="writable by everyone"):
        store.cache_root()


def test_signed_cache_refuses_unsigned_entries(cache, tmp_path, monkeypatch, fast_rebuild):
    secret = tmp_path / "secret"
    secret.write_text("0123456789abcdef0123456789abcdef")
    secret.chmod(0o600)
    monkeypatch.setenv("EVTC_CACHE_SECRET", str(secret))
    refused_lookup("a", "not signed with EVTC_CACHE_SECRET")
    with pytest.warns(CacheWarning):
        b = build(tiny_source("a"), "sm80", name="a")  # rebuilt and signed
    assert "signature" in b.meta
    assert lookup(tiny_source("a"), "sm80", name="a") is not None
    monkeypatch.setenv("EVTC_CACHE_SECRET", str(tmp_path / "other"))
    (tmp_path / "other").write_text("another secret of 32 bytes......")
    (tmp_path / "other").chmod(0o600)
    refused_lookup("a", "not signed")


def test_prune_bad_removes_refused_entries(cache):
    a = art("a")
    a.library.chmod(0o600)
    a.library.write_bytes(b"junk")
    s = store.prune(store.cache_root(), bad=True)
    assert [e.name for e, _ in s.removed] == ["a"] and s.kept == 1
    assert not a.entry.exists()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lookup(tiny_source("b"), "sm80", name="b") is not None
