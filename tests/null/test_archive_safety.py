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


def test_export_makes_no_folders(cache, tmp_path):
    """A target whose folder does not exist is refused, in the library and the CLI (exit 2, no
    traceback, as `evtc emit -o` refuses it), and no folder is made; `cache export` used to make
    the parents (issue 37's sweep)."""
    with pytest.raises(CacheError, match="the folder .*new/sub does not exist"):
        cache_archive.export_entries(cache, tmp_path / "new" / "sub" / "a.tar.xz")
    r = cli("export", "new2/a.tar.xz", tmp_path=tmp_path)
    assert r.returncode == 2 and b"the folder new2 does not exist" in r.stderr and b"Traceback" not in r.stderr
    assert sorted(os.listdir(tmp_path)) == ["cache"]


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


def test_export_pipes_into_import(cache, tmp_path):
    exp = subprocess.Popen([sys.executable, "-m", "evtc", "cache", "export", "-"], cwd=tmp_path,
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env={**os.environ, "PYTHONPATH": str(SRC_ROOT), "EVTC_CACHE_DIR": str(tmp_path / "cache")})
    try:
        r = cli("import", "-", tmp_path=tmp_path, stdin=exp.stdout, cache_dir=tmp_path / "other")
    finally:
        exp.stdout.close()
        exp.wait(60)
    assert exp.returncode == 0 and r.returncode == 0, r.stderr.decode()
    assert b"imported 2" in r.stdout


def test_export_into_a_fifo_that_import_reads(cache, tmp_path, monkeypatch):
    fifo = tmp_path / "pipe"
    os.mkfifo(fifo)
    t = threading.Thread(target=lambda: cache_archive.export_entries(cache, fifo), daemon=True)
    t.start()
    s = in_thread(lambda: cache_archive.import_entries(fresh(tmp_path, monkeypatch), fifo))
    t.join(20)
    assert len(s.imported) == 2 and stat.S_ISFIFO(os.lstat(fifo).st_mode)


# ---- import: endless and huge streams end, at limits that are named --------------------------

def test_yes_into_import_ends(cache, tmp_path):
    """`yes | evtc cache import -` never returned."""
    yes = subprocess.Popen(["yes"], stdout=subprocess.PIPE)
    try:
        r = cli("import", "-", tmp_path=tmp_path, stdin=yes.stdout, timeout=60)
    finally:
        yes.kill()
        yes.stdout.close()
        yes.wait()
    assert r.returncode == 2 and b"CacheError" in r.stderr and b"not a tar archive" in r.stderr, r.stderr.decode()
    assert b"Traceback" not in r.stderr


def test_dev_zero_into_import_ends(cache):
    with pytest.raises(CacheError, match="/dev/zero is empty"):
        in_thread(lambda: cache_archive.import_entries(cache, "/dev/zero"))


@pytest.mark.parametrize("what", ["empty gzip members", "empty xz streams", "plain bytes"])
def test_an_endless_stream_stops_at_the_total_limit(cache, tmp_path, what):
    import lzma

    chunk = {"empty gzip members": gzip.compress(b""), "empty xz streams": lzma.compress(b""),
             "plain bytes": b""}[what]
    fifo = tmp_path / "endless"
    os.mkfifo(fifo)
    if what == "plain bytes":  # a good manifest, then directory members without end
        manifest = tar_members([(cache_archive.MANIFEST, json.dumps(
            {"format": cache_archive.EXPORT_FORMAT, "entries": []}).encode())])
        folder = tar_members([(_dir("kernels/"), b"")])
        chunks = itertools.chain([manifest], forever(folder))
        match = "more members than"
    else:
        chunks = forever(chunk * 100)
        match = "larger than the import limit of 1 MiB"
    feed_fifo(fifo, chunks)
    limits = cache_archive.ImportLimits(total_bytes=1 << 20)
    with pytest.raises(CacheError, match=match) as e:
        in_thread(lambda: cache_archive.import_entries(cache, fifo, limits=limits))
    assert str(fifo) in str(e.value)


def _dir(name: str) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE
    return info


def _header_only(name: str, size: int) -> bytes:
    """A tar header that announces ``size`` bytes, without them."""
    info = tarfile.TarInfo(name)
    info.size = size
    return info.tobuf(tarfile.PAX_FORMAT)


@pytest.mark.parametrize("fname, limit", [("kernel.so", "256 MiB"), ("meta.json", "1 MiB"), ("kernel.cu", "64 MiB"),
                                          ("build.log", "64 MiB")])
def test_a_member_over_its_limit_is_refused_before_it_is_read(good, cache, tmp_path, monkeypatch, fname, limit):
    """An archive of 13 MB with 1 GiB zero members held 3.1 GB before it was refused: the header
    alone now decides (here it is followed by 1 MiB, not the 1 GiB it announces)."""
    first = members(good)
    base = first[1][0].name.rsplit("/", 1)[0]
    head = [(m, d) for m, d in first if m.name.startswith(base + "/") and m.name.split("/")[-1] in
            {"kernel.so": ["meta.json"], "meta.json": [], "kernel.cu": ["meta.json", "kernel.so"],
             "build.log": ["meta.json", "kernel.so", "kernel.cu"]}[fname]]
    data = tar_members([first[0], *head]) + _header_only(f"{base}/{fname}", 1 << 30) + b"\0" * (1 << 20)
    with pytest.raises(CacheError, match=f"is 1073741824 bytes, more than the import limit of {limit} for a {fname}"):
        import_bytes(fresh(tmp_path, monkeypatch), tmp_path, data)


def test_the_total_limit_is_named_and_can_be_raised(good, cache, tmp_path, monkeypatch):
    small = cache_archive.ImportLimits(total_bytes=4096)
    with pytest.raises(CacheError, match="larger than the import limit of 4 KiB") as e:
        import_bytes(fresh(tmp_path, monkeypatch), tmp_path, good, limits=small)
    assert "--max-bytes" in str(e.value)
    p = tmp_path / "good.tar"
    r = cli("import", "--max-bytes", "4k", str(p), tmp_path=tmp_path, cache_dir=tmp_path / "c2")
    assert r.returncode == 2 and b"import limit of 4 KiB" in r.stderr, r.stderr.decode()
    r = cli("import", "--max-bytes", "1G", str(p), tmp_path=tmp_path, cache_dir=tmp_path / "c3")
    assert r.returncode == 0 and b"imported 2" in r.stdout, r.stderr.decode()


def test_a_huge_pax_header_is_refused(good, cache, tmp_path, monkeypatch):
    def edit(m, d):
        if m.name.endswith("kernel.cu"):
            m.pax_headers = {"comment": "x" * (2 << 20)}
        return m, d

    with pytest.raises(CacheError, match="a tar header is larger than the import limit of 64 KiB"):
        import_bytes(fresh(tmp_path, monkeypatch), tmp_path, rewrite(good, edit))


# ---- import: every shape of a manifest is checked ---------------------------------------------

def _set(path, value):
    def edit(m):
        target = m
        for k in path[:-1]:
            target = target[k]
        if value is KeyError:
            del target[path[-1]]
        else:
            target[path[-1]] = value
        return m
    return edit


MANIFEST_SHAPES = [
    ("entries is a number", _set(["entries"], 5), "field 'entries' is a number, not a list"),
    ("entries is an object", _set(["entries"], {"a": 1}), "field 'entries' is an object, not a list"),
    ("a key that is a list", _set(["entries", 0, "key"], [1, 2]), "entries[0].key is a list, not a string"),
    ("a key that is an object", _set(["entries", 0, "key"], {"k": 1}), "entries[0].key is an object, not a string"),
    ("a short key", _set(["entries", 0, "key"], "abc"), "entries[0].key is not 64 hex digits"),
    ("a toolchain id that is a number", _set(["entries", 0, "toolchain_id"], 12345),
     "entries[0].toolchain_id is a number, not a string"),
    ("no library hash", _set(["entries", 0, "library_sha256"], KeyError), "entries[0].library_sha256 is null"),
    ("a name that is a number", _set(["entries", 0, "name"], 7), "entries[0].name is a number, not a string"),
    ("a row that is a string", _set(["entries", 0], "kernel"), "entries[0] is a string, not an object"),
    ("a row twice", lambda m: {**m, "entries": m["entries"] + m["entries"][:1]}, "a second time"),
    ("created is a string", _set(["created"], "today"), "field 'created' is a string, not a number"),
    ("a list", lambda m: [m], "evtc-cache.json is a list, not a JSON object"),
    ("deep inside a row", _set(["entries", 0, "name"], "@DEEP@"), "evtc-cache.json is nested deeper than 32 levels"),
    ("deep at the top", lambda m: "@DEEP@", "evtc-cache.json is nested deeper than 32 levels"),
    ("NaN", lambda m: {**m, "created": float("nan")}, "NaN is not a JSON number"),
]


@pytest.mark.parametrize("case, edit, message", MANIFEST_SHAPES, ids=[c for c, _, _ in MANIFEST_SHAPES])
def test_a_manifest_of_a_bad_shape_is_a_cache_error(good, cache, tmp_path, monkeypatch, case, edit, message):
    manifest = edit(manifest_of(good))
    data = with_manifest(good, with_deep(manifest, DEEP))
    with pytest.raises(CacheError) as e:
        import_bytes(fresh(tmp_path, monkeypatch), tmp_path, data)
    assert message in str(e.value) and "in-" in str(e.value), str(e.value)  # names the file and the field


def test_too_many_manifest_rows_is_a_cache_error(good, cache, tmp_path, monkeypatch):
    with pytest.raises(CacheError, match="lists 2 entries, more than the import limit of 1"):
        import_bytes(fresh(tmp_path, monkeypatch), tmp_path, good, limits=cache_archive.ImportLimits(entries=1))


def test_a_member_the_manifest_does_not_list_is_refused(good, cache, tmp_path, monkeypatch):
    m = manifest_of(good)
    m["entries"] = m["entries"][:1]
    with pytest.raises(CacheError, match="belongs to an entry evtc-cache.json does not list"):
        import_bytes(fresh(tmp_path, monkeypatch), tmp_path, with_manifest(good, json.dumps(m).encode()))


# ---- import: an entry's meta.json first, every shape checked -----------------------------------

@pytest.mark.parametrize("case, reason", [
    ("deep meta.json", "meta.json is nested deeper than 32 levels"),
    ("library_bytes a string", "field 'library_bytes' is a string, not an integer"),
    ("kernel.so shorter than recorded", "kernel.so has"),
    ("kernel.so before meta.json", "kernel.so comes before meta.json"),
])
def test_an_entry_of_a_bad_shape_is_refused_not_a_crash(good, cache, tmp_path, monkeypatch, case, reason):
    def edit(m, d):
        if m.name.endswith("meta.json"):
            meta = json.loads(d)
            if case == "deep meta.json":
                meta["material"] = {"deep": "@DEEP@"}
                return m, with_deep(meta, DEEP)
            if case == "library_bytes a string":
                meta["library_bytes"] = str(meta["library_bytes"])
            return m, json.dumps(meta).encode()
        if m.name.endswith("kernel.so") and case == "kernel.so shorter than recorded":
            return m, d[:-10]
        return m, d

    data = rewrite(good, edit)
    if case == "kernel.so before meta.json":
        items = members(data)
        for i in range(len(items) - 1):
            if items[i][0].name.endswith("meta.json") and items[i + 1][0].name.endswith("kernel.so"):
                items[i], items[i + 1] = items[i + 1], items[i]
        data = build_tar(items)
    s = import_bytes(fresh(tmp_path, monkeypatch), tmp_path, data)
    assert len(s.refused) == 2 and not s.imported, s
    assert all(reason in why for *_, why in s.refused), s.refused
    assert sorted(name for _, _, name, _ in s.refused) == ["a", "b"]
