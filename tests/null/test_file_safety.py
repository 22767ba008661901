"""Files and folders of the kernel cache under hostile conditions (issue 37, issue 35), no GPU and
no nvcc: folders evtc did not create keep their mode, a cache entry of a bad shape (deep JSON, a
field of the wrong type, a FIFO or link for meta.json) is a miss and never a crash or a hang, the
four readers of cached files share one trust rule, and compilers die with the evtc process
that started them."""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import signal
import stat
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from pathlib import Path

import pytest

from evtc.compiler import CacheError, CacheWarning, store, store_entries, store_root

CACHE_ENV = ("EVTC_CACHE_DIR", "EVTC_SHARED_CACHE", "EVTC_CACHE_SECRET", "EVTC_NVCC", "EVTC_CONSTRUCT_MEMO")
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    """A private cache at ``tmp_path/cache`` (not created yet), nothing inherited."""
    for v in CACHE_ENV:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("EVTC_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def make_entry(root: store.CacheRoot, tag: str, library: bytes | None = None) -> store.Entry:
    """A verified cache entry with a stand-in library (bytes that are never loaded), installed
    the way a build installs one."""
    library = library if library is not None else b"\x7fELF stand-in " + tag.encode() * 20
    material = {"format": store.CACHE_FORMAT, "source_sha256": hashlib.sha256(tag.encode()).hexdigest(), "arch": "sm80"}
    key = hashlib.sha256(store.canonical_json(material).encode()).hexdigest()
    toolchain = {"nvcc": "cuda_0.0.test", "host_compiler": "gcc (test)", "ccbin": "gcc"}
    meta = store.make_meta(root, key=key, material=material, toolchain=toolchain, library=library, name=tag,
                           arch="sm80", command=["nvcc", tag], seconds=1.0)
    lock = store.key_lock(root, key, 5)
    try:
        return store.install_entry(root, meta, library, source=f"// {tag}\n", log="built\n")
    finally:
        lock.release()


def rewrite_meta(entry: store.Entry, edit) -> None:
    """Replace an entry's meta.json by ``edit(meta)`` (a dict, or bytes written as they are),
    keeping its mode."""
    p = entry.path / "meta.json"
    new = edit(json.loads(p.read_text()))
    data = new if isinstance(new, bytes) else json.dumps(new).encode()
    p.unlink()
    fd = os.open(p, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.write(fd, data)
    os.close(fd)


def with_deep(value, depth: int) -> bytes:
    """``value`` as JSON, with every ``"@DEEP@"`` replaced by a list nested ``depth`` deep (which
    json.dumps itself can't write)."""
    return json.dumps(value).replace('"@DEEP@"', "[" * depth + "0" + "]" * depth).encode()


def in_thread(fn, timeout: float = 20.0):
    """Run ``fn`` in a thread; fail (not hang) when it takes longer than ``timeout``."""
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # handed to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(timeout)
    assert not t.is_alive(), f"{fn} did not return within {timeout} s"
    if "error" in out:
        raise out["error"]
    return out.get("value")


# ---- modes of folders evtc did not create ----------------------------------------------------

@pytest.mark.parametrize("mode", [0o777, 0o1777, 0o775])
def test_an_existing_open_cache_folder_keeps_its_mode(cache_env, mode):
    """EVTC_CACHE_DIR=/tmp as root made /tmp 1755 for everyone: a folder evtc did not create
    keeps its mode; a warning says so; what evtc creates in it is private."""
    cache_env.mkdir()
    os.chmod(cache_env, mode)
    with pytest.warns(CacheWarning, match="leaves the mode"):
        root = store.cache_root()
    assert stat.S_IMODE(os.stat(cache_env).st_mode) == mode
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        entry = make_entry(store.cache_root(), "a")
        assert store.find_entry(root, entry.key)[0] == entry
    assert stat.S_IMODE(os.stat(cache_env).st_mode) == mode
    for d in (cache_env / "kernels", entry.path, cache_env / "locks", cache_env / "tmp"):
        assert stat.S_IMODE(os.stat(d).st_mode) == 0o700, d


def test_an_existing_open_folder_inside_the_cache_keeps_its_mode(cache_env):
    root = store.cache_root()
    (cache_env / "kernels" / "ab").mkdir(parents=True)
    os.chmod(cache_env / "kernels", 0o700)
    os.chmod(cache_env / "kernels" / "ab", 0o777)
    store_root._ensure_dir(root, root.sub("kernels", "ab"))
    store_root._ensure_dir(root, root.sub("kernels", "ab", "c" * 64))
    assert stat.S_IMODE(os.stat(cache_env / "kernels" / "ab").st_mode) == 0o777
    assert stat.S_IMODE(os.stat(cache_env / "kernels" / "ab" / ("c" * 64)).st_mode) == 0o700


def test_no_chmod_through_a_link_in_the_cache(cache_env, tmp_path):
    """A link planted in the cache (a shared cache's member, a careless script) must not make evtc
    chmod its target."""
    root = store.cache_root()
    outside = tmp_path / "outside"
    outside.mkdir()
    os.chmod(outside, 0o777)
    (cache_env / "tmp").symlink_to(outside)
    (cache_env / "locks").symlink_to(outside)
    try:
        store.staging_dir(root, "0" * 64)
    except CacheError:
        pass
    try:
        store.key_lock(root, "0" * 64, 1).release()
    except CacheError:
        pass
    assert stat.S_IMODE(os.stat(outside).st_mode) == 0o777


# ---- untrusted shapes in cache entries: a miss, never a crash --------------------------------

DEEP = 5000


@pytest.mark.parametrize("case, reason", [
    ("deep material", "nested deeper than 32 levels"),
    ("deep extra field", "nested deeper than 32 levels"),
    ("library_bytes a string", "field 'library_bytes' is a string, not an integer"),
    ("library_bytes true", "field 'library_bytes' is a boolean, not an integer"),
    ("created a string", "field 'created' is a string, not a number"),
    ("command of numbers", "field 'command' is not a list of strings"),
    ("name a list", "field 'name' is a list, not a string"),
    ("toolchain a list", "field 'toolchain' is a list, not an object"),
    ("NaN seconds", "not JSON"),
    ("a list", "is a list, not a JSON object"),
    ("not UTF-8", "not JSON"),
])
def test_a_bad_meta_json_is_a_miss_not_a_crash(cache_env, case, reason):
    root = store.cache_root()
    entry = make_entry(root, "a")

    def edit(meta):
        if case == "deep material":
            meta["material"] = {"flags": "@DEEP@"}
            return with_deep(meta, DEEP)
        elif case == "deep extra field":
            meta["extra"] = "@DEEP@"
            return with_deep(meta, DEEP)
        elif case == "library_bytes a string":
            meta["library_bytes"] = str(meta["library_bytes"])
        elif case == "library_bytes true":
            meta["library_bytes"] = True
        elif case == "created a string":
            meta["created"] = "yesterday"
        elif case == "command of numbers":
            meta["command"] = [1, 2]
        elif case == "name a list":
            meta["name"] = ["a"]
        elif case == "toolchain a list":
            meta["toolchain"] = [meta["toolchain"]]
        elif case == "NaN seconds":
            return json.dumps(meta).replace('"seconds": 1.0', '"seconds": NaN').encode()
        elif case == "a list":
            meta = [meta]
        elif case == "not UTF-8":
            return b"\xff\xfe" + json.dumps(meta).encode()
        return meta

    rewrite_meta(entry, edit)
    with pytest.warns(CacheWarning, match="refused kernel cache entry") as rec:
        found, refused = store.find_entry(root, entry.key)
    assert found is None and len(refused) == 1 and reason in refused[0][1], refused
    assert any(reason in str(w.message) for w in rec)
    with pytest.raises(CacheError, match="refused to load the cached kernel"):
        store.verified_library_path(entry.library)
    listed = store.list_entries(root, verify=False)
    assert [e.problem is not None and reason in e.problem for e in listed] == [True]
    assert store.list_entries(root)[0].problem is not None
    s = store.prune(root, bad=True)
    assert [e.key for e, _ in s.removed] == [entry.key] and not entry.path.exists()


@pytest.mark.parametrize("what", ["fifo", "link to /dev/zero", "huge"])
def test_meta_json_that_is_no_file_is_refused_without_hanging(cache_env, what):
    root = store.cache_root()
    entry = make_entry(root, "a")
    meta = entry.path / "meta.json"
    meta.unlink()
    if what == "fifo":
        os.mkfifo(meta, 0o600)
    elif what == "link to /dev/zero":
        meta.symlink_to("/dev/zero")
    else:
        with open(meta, "wb") as f:
            f.truncate(store.MAX_META_BYTES + 1)  # sparse: no disk used
        os.chmod(meta, 0o600)
    with pytest.warns(CacheWarning):
        found, refused = in_thread(lambda: store.find_entry(root, entry.key))
    assert found is None and refused
    listed = in_thread(lambda: store.list_entries(root, verify=False))
    assert listed[0].problem is not None


def test_a_cache_secret_that_is_a_fifo_is_refused_without_hanging(cache_env, tmp_path, monkeypatch):
    fifo = tmp_path / "secret"
    os.mkfifo(fifo, 0o600)
    monkeypatch.setenv("EVTC_CACHE_SECRET", str(fifo))
    with pytest.raises(CacheError, match="is not a regular file of at most 65536 bytes"):
        in_thread(store.cache_root)


# ---- one trust rule for the four readers of cached files (issue 35) --------------------------

def _readers(root: store.CacheRoot, tmp_path: Path):
    """(name, the file it reads, the folders the rule covers, read() -> accepted?) of each reader,
    set up with a good file."""
    from evtc.compiler import fingerprint
    from evtc.pipeline import memo
    from evtc.torch import fast as torch_fast

    entry = make_entry(root, "a")

    def store_reads() -> bool:
        try:
            store.verify_entry(root, entry.key, entry.toolchain_id)
            return True
        except store.EntryRejected:
            return False

    key = "ab" + "0" * 62
    memo._write(root, key, "source", b"payload")

    def memo_reads() -> bool:
        return memo._read(root, key, "source") == b"payload"

    headers = root.sub("headers")
    store_root._ensure_dir(root, headers)
    fp_file = fingerprint._memo_file(headers, "/some/tree", True)
    fingerprint._write_memo(fp_file, {"format": fingerprint._FORMAT, "root": "/some/tree", "hash": "f" * 64})

    def fingerprint_reads() -> bool:
        return fingerprint._read_memo(fp_file, "/some/tree") is not None

    tf = root.sub("torch_fast", "tag")
    store_root._ensure_dir(root, tf)
    for name in ("ext.so", "meta.json"):
        fd = os.open(tf / name, os.O_WRONLY | os.O_CREAT, 0o600)
        os.write(fd, b"{}")
        os.close(fd)

    def torch_fast_reads() -> bool:
        try:
            torch_fast._check_private(tf, tf / "ext.so", tf / "meta.json")
            return True
        except RuntimeError:
            return False

    return [("store", entry.library, store_reads), ("memo", memo._path(root, key, "source"), memo_reads),
            ("fingerprint", fp_file, fingerprint_reads), ("torch_fast", tf / "ext.so", torch_fast_reads)]


def _link_file(p: Path, tmp_path: Path) -> None:
    copy = tmp_path / f"copy-{p.name}-{time.monotonic_ns()}"
    shutil.copy2(p, copy)
    p.unlink()
    p.symlink_to(copy)


def _link_folder(p: Path, tmp_path: Path) -> None:
    d = p.parent
    copy = tmp_path / f"copy-{d.name}-{time.monotonic_ns()}"
    shutil.copytree(d, copy, symlinks=True)
    shutil.rmtree(d)
    d.symlink_to(copy)


def _open_grandparent(p: Path, tmp_path: Path) -> None:
    os.chmod(p.parent.parent, 0o707)


SITUATIONS = {
    "the file is a link": _link_file,
    "the file is group-writable": lambda p, _: os.chmod(p, 0o620),
    "the file is writable by others": lambda p, _: os.chmod(p, 0o602),
    "its folder is group-writable": lambda p, _: os.chmod(p.parent, 0o770),
    "its folder's folder is writable by others": _open_grandparent,
    "its folder is a link": _link_folder,
    "the file is a FIFO": lambda p, _: (p.unlink(), os.mkfifo(p, 0o600)),
}
if os.geteuid() == 0:
    SITUATIONS["the file is another user's"] = lambda p, _: os.chown(p, 65534, 65534)


def test_one_trust_rule_for_the_four_readers(cache_env, tmp_path):
    """The store, the construct memo, the header-hash memo and the torch fast path accept the
    same files and refuse the same files (NOTE [Trusted files])."""
    decisions = {}
    for situation, spoil in SITUATIONS.items():
        shutil.rmtree(cache_env, ignore_errors=True)
        root = store.cache_root()
        readers = _readers(root, tmp_path)
        for name, path, reads in readers:
            assert in_thread(reads), f"{name} refuses a good file"
        for name, path, reads in readers:
            if spoil is _open_grandparent and path.parent.parent == cache_env:
                continue  # the cache directory itself: the trust root, checked where it is configured
            spoil(path, tmp_path)
            decisions[(situation, name)] = in_thread(reads)
    accepted = sorted(k for k, ok in decisions.items() if ok)
    assert accepted == [], f"accepted: {accepted}"


def test_the_four_readers_call_the_one_rule(cache_env, tmp_path, monkeypatch):
    from evtc.compiler import trust

    root = store.cache_root()
    readers = _readers(root, tmp_path)
    calls = []

    def refuse(st, path, **kw):
        calls.append(str(path))
        raise trust.Untrusted(f"{path}: refused by the test")

    monkeypatch.setattr(trust, "check_stat", refuse)
    store_entries._HASHED.clear()
    for name, path, reads in readers:
        before = len(calls)
        assert not reads(), f"{name} did not ask trust.check_stat"
        assert len(calls) > before, name


# ---- compilers die with the process that started them ----------------------------------------

CHILD = textwrap.dedent("""\
    import sys, time
    from pathlib import Path
    from evtc.compiler import nvcc
    pids, log = sys.argv[1], Path(sys.argv[2])
    run = nvcc._Run("nvcc", ["sh", "-c", f"sleep 300 & echo $! >> {pids}; sh -c 'sleep 300' & echo $! >> {pids}; "
                                         f"echo $$ >> {pids}; wait"], log)
    with open(pids, "a") as f:
        f.write(f"{run.proc.pid}\\n")
    time.sleep(300)
    """)


def _state(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split(")")[-1].split()[0]
    except FileNotFoundError:
        return None


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_compilers_die_when_evtc_is_killed(tmp_path):
    """A build process killed with SIGKILL left nvcc and cicc running: the compiler's whole
    process group now dies with it."""
    pids = tmp_path / "pids"
    pids.touch()
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(store.__file__).parents[2]),
                                                        os.environ.get("PYTHONPATH", "")])}
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(pids), str(tmp_path / "log")], env=env)
    try:
        deadline = time.monotonic() + 30
        while len(pids.read_text().split()) < 4:
            assert time.monotonic() < deadline and child.poll() is None, "the child did not start its compiler"
            time.sleep(0.05)
        started = [int(p) for p in pids.read_text().split()]
        assert all(_state(p) not in (None, "Z") for p in started)
        os.kill(child.pid, signal.SIGKILL)
        child.wait()
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline and any(_state(p) not in (None, "Z") for p in started):
            time.sleep(0.05)
        alive = [(p, _state(p)) for p in started if _state(p) not in (None, "Z")]
    finally:
        if child.poll() is None:
            child.kill()
    for p, _ in alive:  # don't leave them behind when the test fails
        try:
            os.kill(p, signal.SIGKILL)
        except ProcessLookupError:
            pass
    assert alive == []


def test_spawn_keeps_exit_status_and_refuses_missing_programs(tmp_path):
    from evtc.compiler import nvcc

    out = tmp_path / "out"
    with open(out, "wb") as f:
        p = nvcc.spawn(["sh", "-c", "echo hello; exit 3"], stdout=f, stderr=subprocess.STDOUT)
        assert p.wait(timeout=30) == 3
    assert out.read_text() == "hello\n"
    p = nvcc.spawn(["sleep", "30"])
    try:
        assert os.getpgid(p.pid) == p.pid  # a group of its own, for killpg
    finally:
        nvcc._kill_group(p, grace_s=5)
    assert p.returncode is not None
    with pytest.raises(FileNotFoundError):
        nvcc.spawn([str(tmp_path / "no-such-nvcc"), "--version"])
