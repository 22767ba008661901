"""Cache entries: verified, found, written and handed to the loader.

Input: a :class:`~evtc.compiler.store_root.CacheRoot` and a cache key, and for a new entry its
``meta.json`` (:func:`~evtc.compiler.store_meta.make_meta`), library bytes, source and log.
Output: an :class:`Entry` whose library has been checked (owner, mode, SHA-256) and may be
dlopen'ed, or a refusal that names the entry and the reason (NOTE [The verified cache] in
evtc/compiler/store.py).
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

from evtc.compiler import trust
from evtc.compiler.store_meta import MAX_META_BYTES, EntryRejected, _sha256_bytes, check_meta
from evtc.compiler.store_root import CacheRoot, CacheWarning, _cache_error, _configured, _ensure_dir, _secret
from evtc.errors import CacheError

if TYPE_CHECKING:
    from filelock import FileLock

__all__ = ["ENTRY_FILES", "Entry", "KEY_RE", "TOOLCHAIN_RE", "find_entry", "install_entry", "keep_failed", "key_lock",
           "quarantine", "staging_dir", "toolchain_ids", "verified_library_path", "verify_entry"]

ENTRY_FILES = ("meta.json", "kernel.so", "kernel.cu", "build.log")
KEY_RE = re.compile(r"[0-9a-f]{64}")
TOOLCHAIN_RE = re.compile(r"[0-9a-f]{16}")


# --------------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------------

#: (dev, inode) -> (size, mtime_ns, ctime_ns, sha256): libraries this process already hashed.
#: ctime changes on every write, rename-over or chmod and can't be set by users, so an unchanged
#: identity means unchanged bytes.
_HASHED: dict[tuple[int, int], tuple[int, int, int, str]] = {}
_HASHED_LOCK = threading.Lock()


def _file_sha256(path: Path, st: os.stat_result, shared: bool = False) -> str:
    """SHA-256 of ``path``, whose ``lstat`` was ``st``, read through a checked descriptor
    (NOTE [Trusted files]) that must be that same file."""
    ident = (st.st_dev, st.st_ino)
    stamp = (st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    with _HASHED_LOCK:
        hit = _HASHED.get(ident)
    if hit is not None and hit[:3] == stamp:
        return hit[3]
    fd, fst = trust.open_checked(path, shared=shared)
    with os.fdopen(fd, "rb") as f:
        if (fst.st_dev, fst.st_ino) != ident:
            raise EntryRejected(f"{path} was replaced while it was checked")
        digest = hashlib.file_digest(f, "sha256").hexdigest()
    with _HASHED_LOCK:
        _HASHED[ident] = (*stamp, digest)
    return digest


@dataclasses.dataclass(frozen=True)
class Entry:
    """A verified cache entry.

    Attributes:
        root: its cache.
        key: the cache key (64 hex digits).
        toolchain_id: its toolchain folder (16 hex digits).
        meta: the parsed ``meta.json``.
    """

    root: CacheRoot
    key: str
    toolchain_id: str
    meta: dict = dataclasses.field(compare=False, repr=False)

    @property
    def path(self) -> Path:
        return self.root.entry_dir(self.key, self.toolchain_id)

    @property
    def library(self) -> Path:
        return self.path / "kernel.so"


def verify_entry(root: CacheRoot, key: str, toolchain_id: str) -> Entry:
    """Check an entry (see the module docstring) without loading anything.

    Costs about 0.1 ms when this process already hashed the library, plus the SHA-256 of
    ``kernel.so`` (about 1 ms per MB) the first time.

    Raises:
        EntryRejected: the reason.
    """
    if not KEY_RE.fullmatch(key) or not TOOLCHAIN_RE.fullmatch(toolchain_id):
        raise EntryRejected(f"{key}/{toolchain_id} is not a key and toolchain id")
    entry = root.entry_dir(key, toolchain_id)
    trust.check_below(root.path, entry, want_dir=True, shared=root.shared)
    meta_bytes = trust.read(entry / "meta.json", max_bytes=MAX_META_BYTES, shared=root.shared)
    lib_st = trust.check(entry / "kernel.so", shared=root.shared)
    meta = trust.load_json(meta_bytes, "meta.json")
    check_meta(meta, key, toolchain_id, root.secret)
    if lib_st.st_size != meta["library_bytes"]:
        raise EntryRejected(f"kernel.so has {lib_st.st_size} bytes, meta.json records {meta.get('library_bytes')} "
                            "(truncated or replaced)")
    try:
        digest = _file_sha256(entry / "kernel.so", lib_st, root.shared)
    except OSError as e:
        raise EntryRejected(f"kernel.so can't be read: {e.strerror}") from None
    if digest != meta["library_sha256"]:
        raise EntryRejected("the SHA-256 of kernel.so is not the one meta.json records (corrupted or replaced)")
    return Entry(root, key, toolchain_id, meta)


def _warn_refused(path: Path, reason: str, action: str) -> None:
    warnings.warn(f"refused kernel cache entry {path}: {reason}; {action}", CacheWarning, stacklevel=3)


def toolchain_ids(root: CacheRoot, key: str) -> list[str]:
    """The toolchain folders under ``key`` (unverified)."""
    try:
        names = os.listdir(root.path / "kernels" / key[:2] / key)
    except (FileNotFoundError, NotADirectoryError):
        return []
    except OSError:
        return []
    return sorted(n for n in names if TOOLCHAIN_RE.fullmatch(n))


_TOUCHED: set[Path] = set()


def _touch(entry: Entry) -> None:
    """Record a use (the entry folder's mtime; ``evtc cache prune --older-than`` reads it), once
    per process; a read-only cache is left alone."""
    p = entry.path
    if p in _TOUCHED:
        return
    _TOUCHED.add(p)
    try:
        os.utime(p)
    except OSError:
        pass


def find_entry(root: CacheRoot, key: str, *, prefer: str | None = None, only: str | None = None,
               local_toolchain=None, on_refused: str = "skipped",
               warn: bool = True) -> tuple[Entry | None, list[tuple[str, str]]]:
    """The best verified entry of ``key``.

    Args:
        root: the cache.
        key: the cache key.
        prefer: toolchain id to try first.
        only: accept only this toolchain id (strict mode).
        local_toolchain: a callable returning the local toolchain id, called only when the key
            has entries of several toolchains and ``prefer`` is None (it runs nvcc once).
        on_refused: what the warning says happens to a refused entry.
        warn: warn about refused entries (a :class:`CacheWarning` naming each).

    Returns:
        (the entry or None, [(toolchain id, reason) of each refused entry]).
    """
    ids = toolchain_ids(root, key)
    if only is not None:
        ids = [only] if only in ids else []
    elif len(ids) > 1:
        if prefer is None and local_toolchain is not None:
            try:
                prefer = local_toolchain()
            except Exception:  # no nvcc: any toolchain will do
                prefer = None
        if prefer in ids:
            ids = [prefer] + [i for i in ids if i != prefer]
    refused = []
    for tc in ids:
        try:
            entry = verify_entry(root, key, tc)
        except EntryRejected as e:
            if warn:
                _warn_refused(root.entry_dir(key, tc), str(e), on_refused)
            refused.append((tc, str(e)))
            continue
        _touch(entry)
        return entry, refused
    return None, refused


def quarantine(root: CacheRoot, path: Path, reason: str) -> Path | None:
    """Move a refused entry (or anything else) out of the way to ``<root>/quarantine/``.

    Returns:
        Where it went, or None if it was already gone.

    Raises:
        CacheError: it can't be moved (e.g. a folder of another user).
    """
    if not os.path.lexists(path):
        return None
    qdir = root.sub("quarantine")
    _ensure_dir(root, qdir)
    dest = qdir / f"{path.parent.name[:16]}-{path.name}-{time.strftime('%Y%m%dT%H%M%S')}-{os.getpid()}"
    try:
        os.rename(path, dest)
    except OSError as e:
        raise CacheError(f"can't move the refused cache entry {path} aside ({reason}): {e.strerror}",
                         hint=f"remove it by hand: rm -rf {path}") from None
    with open(dest.with_suffix(".reason"), "w") as f:
        f.write(reason + "\n")
    return dest


# --------------------------------------------------------------------------------------------
# Writing entries
# --------------------------------------------------------------------------------------------

def key_lock(root: CacheRoot, key: str, timeout: float, what: str = "") -> FileLock:
    """The lock that makes one process at a time build or install ``key``.

    Returns:
        An acquired :class:`filelock.FileLock` (a context manager; release it).

    Raises:
        CacheError: waited ``timeout`` seconds (another build of this kernel hangs or is very
            slow), or the lock file can't be created (read-only cache).
    """
    from filelock import FileLock, Timeout  # only builds take locks: a cache hit needn't import it

    locks = root.sub("locks")
    _ensure_dir(root, locks)
    path = locks / f"{key}.lock"
    lock = FileLock(str(path), timeout=timeout, mode=root.file_mode)
    try:
        lock.acquire()
    except Timeout:
        raise CacheError(f"waited {timeout:g} s for the build lock {path}: another process is building "
                         f"{what or 'this kernel'} (key {key[:16]}...) and has not finished",
                         hint="wait for that build, or raise EVTC_LOCK_TIMEOUT; a lock held by a process that died "
                              "is released by the OS, so no lock file needs deleting", anchor="cache") from None
    except OSError as e:
        raise _cache_error("can't create the build lock", path, e) from None
    return lock


def _write(path: Path, data: bytes, mode: int, sync: bool = False) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, mode)
    try:
        os.fchmod(fd, mode)
        view = memoryview(data)
        while view:
            n = os.write(fd, view)
            view = view[n:]
        if sync:
            os.fsync(fd)
    finally:
        os.close(fd)


def staging_dir(root: CacheRoot, key: str) -> Path:
    """A fresh private folder in ``<root>/tmp`` (same file system as the entries, so it can be
    renamed into place atomically)."""
    tmp = root.sub("tmp")
    _ensure_dir(root, tmp)
    try:
        d = Path(tempfile.mkdtemp(prefix=f"{key[:12]}-", dir=tmp))
        os.chmod(d, root.dir_mode)
    except OSError as e:
        raise _cache_error("can't write to the kernel cache", tmp, e) from None
    return d


def install_entry(root: CacheRoot, meta: dict, library: bytes, *, source: str | None = None, log: str | None = None,
                  staged: Path | None = None) -> Entry:
    """Write an entry atomically (a staging folder renamed into place). The caller holds
    :func:`key_lock`. A refused entry in the way is quarantined with a warning; a valid one in
    the way is kept (the new one is dropped).

    Args:
        root: the cache.
        meta: from :func:`make_meta`.
        library: the ``kernel.so`` bytes (hashed again here).
        source, log: ``kernel.cu`` and ``build.log`` texts, unless already in ``staged``.
        staged: a folder from :func:`staging_dir` holding some of the files already.

    Returns:
        The verified entry.

    Raises:
        CacheError: the cache can't be written, or the new entry fails its own verification.
    """
    key, tc = meta["key"], meta["toolchain_id"]
    if _sha256_bytes(library) != meta["library_sha256"]:
        raise CacheError(f"the library of kernel {meta.get('name')} changed while it was stored (key {key[:16]}...)")
    final = root.entry_dir(key, tc)
    stage = staged or staging_dir(root, key)
    try:
        files = {"kernel.so": library, "meta.json": (json.dumps(meta, indent=1, sort_keys=True) + "\n").encode()}
        if source is not None:
            files["kernel.cu"] = source.encode()
        if log is not None:
            files["build.log"] = log.encode()
        for fname, data in files.items():
            p = stage / fname
            if p.exists():
                p.unlink()
            _write(p, data, root.file_mode, sync=fname in ("kernel.so", "meta.json"))
        for p in stage.iterdir():  # written in this staging folder just now (not through a link)
            if not p.is_symlink():
                os.chmod(p, root.file_mode)
        os.chmod(stage, root.dir_mode)
        _ensure_dir(root, final.parent)
        if os.path.lexists(final):
            try:
                existing = verify_entry(root, key, tc)
            except EntryRejected as e:
                _warn_refused(final, str(e), "moved to quarantine/ and replaced")
                quarantine(root, final, str(e))
            else:
                shutil.rmtree(stage, ignore_errors=True)
                return existing
        os.rename(stage, final)
    except OSError as e:
        shutil.rmtree(stage, ignore_errors=True)
        raise _cache_error("can't write the cache entry", final, e) from None
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    try:
        return verify_entry(root, key, tc)
    except EntryRejected as e:
        raise CacheError(f"the new cache entry {final} fails verification: {e}",
                         hint="evtc sets modes only of folders it creates: fix the named folder's owner or mode, or "
                              "remove it (`evtc cache prune --bad`)") from None


def keep_failed(root: CacheRoot, key: str, source: str | None, log: str | None, staged: Path | None = None) -> Path:
    """Keep a failed build's source and log in ``<root>/failed/<key>/`` and return that folder."""
    failed = root.sub("failed", key)
    _ensure_dir(root, failed.parent)
    if os.path.lexists(failed):
        shutil.rmtree(failed, ignore_errors=True)
    if staged is not None:
        os.rename(staged, failed)
    else:
        _ensure_dir(root, failed)
    for fname, text in (("kernel.cu", source), ("build.log", log)):
        if text is not None:
            p = failed / fname
            if p.exists():
                p.unlink()
            _write(p, text.encode(), root.file_mode)
    return failed


# --------------------------------------------------------------------------------------------
# Loading
# --------------------------------------------------------------------------------------------

_MEMFDS: dict[tuple[str, str], int] = {}


def _private_copy(data: bytes, label: str, digest: str) -> Path:
    """A path whose bytes are ``data`` and that nobody else can change: a memfd (Linux), else a
    0600 temporary file."""
    k = (label, digest)
    fd = _MEMFDS.get(k)
    if fd is None:
        if hasattr(os, "memfd_create"):
            fd = os.memfd_create(f"evtc-{label}", 0)
            os.write(fd, data)
        else:  # pragma: no cover (not Linux)
            fd, _ = tempfile.mkstemp(prefix="evtc-", suffix=".so")
            os.write(fd, data)
        _MEMFDS[k] = fd
    return Path(f"/proc/self/fd/{fd}")


def verified_library_path(library) -> Path:
    """The path to ``dlopen`` for a cached kernel, after checking its entry right now.

    The loader (:class:`evtc.runtime.launch.KernelLibrary`) calls this for every library that
    comes from the cache, immediately before ``ctypes.CDLL``, and loads the path it returns (not
    the one it was given): in a private cache that is the entry's ``kernel.so``; in a shared
    cache it is an in-memory copy of the very bytes that were hashed.

    Args:
        library: an :class:`~evtc.compiler.cache.Artifact`, or the path of a ``kernel.so`` in a
            cache (``<root>/kernels/<xx>/<key>/<toolchain>/kernel.so``).

    Returns:
        The path to load.

    Raises:
        CacheError: the path is not a cache entry's library, or the entry fails verification
            (the message names the entry and the reason; nothing was loaded).
    """
    p = Path(getattr(library, "library", library)).absolute()
    parts = p.parts
    if len(parts) < 6 or parts[-1] != "kernel.so" or parts[-5] != "kernels" or not KEY_RE.fullmatch(parts[-3]) \
            or not TOOLCHAIN_RE.fullmatch(parts[-2]) or parts[-4] != parts[-3][:2]:
        raise CacheError(f"{p} is not a kernel in an evtc cache (<cache>/kernels/<xx>/<key>/<toolchain>/kernel.so)")
    root_path = p.parents[4]
    conf_path, shared = _configured()
    shared = shared and os.path.realpath(conf_path) == os.path.realpath(root_path)
    root = CacheRoot(root_path, shared, _secret())
    try:
        entry = verify_entry(root, parts[-3], parts[-2])
    except EntryRejected as e:
        raise CacheError(f"refused to load the cached kernel {p.parent}: {e}",
                         hint="nothing was loaded; gemm.build() moves a refused entry aside and rebuilds it, "
                              "`evtc cache prune --bad` removes refused entries") from None
    if not root.shared:
        return entry.library
    data = entry.library.read_bytes()
    if _sha256_bytes(data) != entry.meta["library_sha256"]:
        raise CacheError(f"refused to load the cached kernel {p.parent}: kernel.so changed while it was read")
    return _private_copy(data, str(entry.meta.get("name", "kernel"))[:40], entry.meta["library_sha256"])
