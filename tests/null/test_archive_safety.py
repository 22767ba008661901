"""``evtc cache export`` and ``evtc cache import`` against hostile targets and inputs (issue 37),
no GPU and no nvcc: export never replaces what is not a regular file (FIFOs, devices, links,
``-``); import reads endless or huge streams within limits that it names, and every bad shape
of a manifest or ``meta.json`` is a CacheError or a refused entry, never a traceback."""

from __future__ import annotations

import gzip
import io
import itertools
import json
import os
import pty
import socket
import stat
import subprocess
import sys
import tarfile
import threading
import time
from pathlib import Path

import pytest

from evtc.compiler import CacheError, store
from evtc.compiler import archive as cache_archive
from test_file_safety import CACHE_ENV, in_thread, make_entry, with_deep

SRC_ROOT = Path(store.__file__).resolve().parents[2]
DEEP = 5000


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """A private cache at ``tmp_path/cache`` holding the stand-in entries ``a`` and ``b``."""
    for v in CACHE_ENV:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("EVTC_CACHE_DIR", str(tmp_path / "cache"))
    root = store.cache_root()
    make_entry(root, "a")
    make_entry(root, "b")
    return root


@pytest.fixture
def good(cache, tmp_path) -> bytes:
    """A plain-tar export of the cache, as bytes."""
    p = tmp_path / "good.tar"
    cache_archive.export_entries(cache, p)
    return p.read_bytes()


def fresh(tmp_path: Path, monkeypatch, name: str = "fresh") -> store.CacheRoot:
    monkeypatch.setenv("EVTC_CACHE_DIR", str(tmp_path / name))
    return store.cache_root()


def members(data: bytes) -> list[tuple[tarfile.TarInfo, bytes]]:
    with tarfile.open(fileobj=io.BytesIO(data)) as tar:
        return [(m, tar.extractfile(m).read() if m.isreg() else b"") for m in tar]


def tar_members(items) -> bytes:
    """``(TarInfo or name, bytes)`` items as tar members (a TarInfo keeps its type and pax
    headers), without the end-of-archive blocks: more can follow."""
    out = []
    for info, data in items:
        if isinstance(info, str):
            info = tarfile.TarInfo(info)
        info.size = len(data)
        out += [info.tobuf(tarfile.PAX_FORMAT), data, b"\0" * (-len(data) % tarfile.BLOCKSIZE)]
    return b"".join(out)


def build_tar(items) -> bytes:
    """A plain tar of ``(TarInfo or name, bytes)`` items."""
    return tar_members(items) + b"\0" * (2 * tarfile.BLOCKSIZE)


def rewrite(data: bytes, edit) -> bytes:
    """``data`` with each (TarInfo, bytes) passed through ``edit`` (None drops it; a list adds)."""
    out = []
    for m, d in members(data):
        m.pax_headers = {}
        got = edit(m, d)
        if got is None:
            continue
        out.extend(got if isinstance(got, list) else [got])
    return build_tar(out)


def with_manifest(data: bytes, manifest: bytes) -> bytes:
    return rewrite(data, lambda m, d: (m, manifest) if m.name == cache_archive.MANIFEST else (m, d))


def manifest_of(data: bytes) -> dict:
    return json.loads(members(data)[0][1])


def import_bytes(root, tmp_path: Path, data: bytes, **kw):
    p = tmp_path / f"in-{time.monotonic_ns()}.tar"
    p.write_bytes(data)
    return cache_archive.import_entries(root, p, **kw)


def cli(*args, tmp_path: Path, stdin=None, stdout=subprocess.PIPE, input=None, cache_dir=None, timeout=60):
    """``python -m evtc cache ARGS`` in a subprocess (its file descriptors are its own)."""
    env = {k: v for k, v in os.environ.items() if k not in CACHE_ENV}
    env.update(EVTC_CACHE_DIR=str(cache_dir or tmp_path / "cache"),
               PYTHONPATH=os.pathsep.join(filter(None, [str(SRC_ROOT), os.environ.get("PYTHONPATH")])))
    return subprocess.run([sys.executable, "-m", "evtc", "cache", *args], env=env, cwd=tmp_path, stdin=stdin,
                          stdout=stdout, stderr=subprocess.PIPE, input=input, timeout=timeout)


def feed_fifo(path: Path, chunks) -> threading.Thread:
    """Write ``chunks`` (an iterable, maybe endless) into the FIFO ``path`` from a thread, until
    they end or the reader goes away."""
    def run():
        try:
            with open(path, "wb") as f:
                for c in chunks:
                    f.write(c)
        except (BrokenPipeError, OSError):
            pass

    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def forever(chunk: bytes):
    while True:
        yield chunk


# ---- export: never replace what is not a regular file ----------------------------------------

def test_export_streams_into_a_fifo_and_leaves_it_a_fifo(cache, tmp_path, monkeypatch):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    got: dict = {}

    def read():
        with open(fifo, "rb") as f:
            got["data"] = f.read()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    s = in_thread(lambda: cache_archive.export_entries(cache, fifo))
    reader.join(20)
    assert stat.S_ISFIFO(os.lstat(fifo).st_mode)
    assert s.streamed and len(s.exported) == 2 and s.bytes == len(got["data"])
    back = import_bytes(fresh(tmp_path, monkeypatch), tmp_path, got["data"])
    assert len(back.imported) == 2


def test_export_writes_through_a_link_to_dev_null(cache, tmp_path):
    link = tmp_path / "null"
    link.symlink_to("/dev/null")
    s = cache_archive.export_entries(cache, link)
    assert s.streamed and len(s.exported) == 2 and s.bytes > 0
    assert os.readlink(link) == "/dev/null" and stat.S_ISCHR(os.stat("/dev/null").st_mode)


def _mknod(path: Path, kind: int, major: int, minor: int) -> None:
    if os.geteuid() != 0:
        pytest.skip("device nodes need root")
    try:
        os.mknod(path, kind | 0o666, os.makedev(major, minor))
    except PermissionError:
        pytest.skip("this container can't make device nodes")


def test_export_into_device_nodes_keeps_them(cache, tmp_path):
    """As root, `evtc cache export /dev/full` replaced the device node with a tar file."""
    full, null = tmp_path / "full", tmp_path / "null"
    _mknod(full, stat.S_IFCHR, 1, 7)
    _mknod(null, stat.S_IFCHR, 1, 3)
    with pytest.raises(CacheError, match="can't write the cache archive .*full: No space left on device"):
        cache_archive.export_entries(cache, full)
    assert cache_archive.export_entries(cache, null).streamed
    for p, minor in ((full, 7), (null, 3)):
        st = os.lstat(p)
        assert stat.S_ISCHR(st.st_mode) and os.minor(st.st_rdev) == minor, p
    assert sorted(os.listdir(tmp_path)) == ["cache", "full", "null"]  # no temporary file left


def test_export_through_a_link_to_a_regular_file_keeps_the_link(cache, tmp_path, monkeypatch):
    target = tmp_path / "kept" / "kernels.tar.gz"
    target.parent.mkdir()
    target.write_bytes(b"old")
    link = tmp_path / "latest.tar.gz"
    link.symlink_to(target)
    s = cache_archive.export_entries(cache, link)
    assert not s.streamed and os.readlink(link) == str(target)
    with tarfile.open(target) as tar:
        assert tar.getnames()[0] == cache_archive.MANIFEST
    assert len(import_bytes(fresh(tmp_path, monkeypatch), tmp_path, target.read_bytes()).imported) == 2


@pytest.mark.parametrize("what", ["folder", "dangling link", "socket", "block device"])
def test_export_refuses_targets_it_cant_stream_into(cache, tmp_path, what):
    p = tmp_path / "target"
    if what == "folder":
        p.mkdir()
    elif what == "dangling link":
        p.symlink_to(tmp_path / "nowhere")
    elif what == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(p))
        s.close()
    else:
        _mknod(p, stat.S_IFBLK, 7, 200)
    before = os.lstat(p)
    with pytest.raises(CacheError, match="won't write the cache archive into .*: it is a") as e:
        cache_archive.export_entries(cache, p)
    assert {"folder": "a folder", "dangling link": "which does not exist", "socket": "a socket",
            "block device": "a block device"}[what] in str(e.value)
    after = os.lstat(p)
    assert (after.st_mode, after.st_ino) == (before.st_mode, before.st_ino)
    assert sorted(os.listdir(tmp_path)) == ["cache", "target"]


def test_export_dash_is_standard_output(cache, tmp_path):
    r = cli("export", "-", tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    with tarfile.open(fileobj=io.BytesIO(r.stdout), mode="r:xz") as tar:
        assert tar.getnames()[0] == cache_archive.MANIFEST
    assert b"exported 2 kernels" in r.stderr and not (tmp_path / "-").exists()


def test_export_through_a_dev_stdout_link_streams_into_the_pipe(cache, tmp_path):
    """`evtc cache export /dev/stdout | ...` replaced the link and wrote nothing to the pipe (a
    link of our own to /proc/self/fd/1 stands in for /dev/stdout)."""
    link = tmp_path / "stdout"
    link.symlink_to("/proc/self/fd/1")
    r = cli("export", str(link), tmp_path=tmp_path)
    assert r.returncode == 0, r.stderr.decode()
    assert os.readlink(link) == "/proc/self/fd/1"
    with tarfile.open(fileobj=io.BytesIO(r.stdout), mode="r:xz") as tar:
        assert len([n for n in tar.getnames() if n.endswith("kernel.so")]) == 2
    assert b"exported 2 kernels" in r.stderr  # the report went to stderr, not into the archive


def test_export_to_a_terminal_is_refused(cache, tmp_path):
    leader, follower = pty.openpty()
    try:
        r = cli("export", "-", tmp_path=tmp_path, stdout=follower)
    finally:
        os.close(follower)
        os.close(leader)
    assert r.returncode == 2 and b"it is a terminal" in r.stderr, r.stderr.decode()
    assert not (tmp_path / "-").exists()
