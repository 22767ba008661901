"""The kernel store: verified cache entries on disk (export and import: :mod:`evtc.compiler.archive`).

Input: a cache key, and for a new entry the library bytes, source, log and the key material.
Output: an :class:`Entry` whose library has been checked (owner, mode, SHA-256) and may be
dlopen'ed, or a refusal that names the entry and the reason.

# NOTE [The verified cache]

Layout of a cache directory ``<root>``::

    <root>/kernels/<key[:2]>/<key>/<toolchain id>/{kernel.so, meta.json, kernel.cu, build.log}
    <root>/failed/<key>/{kernel.cu, build.log}     failed builds, named in the BuildError
    <root>/locks/<key>.lock                        one build of a key at a time
    <root>/tmp/, <root>/quarantine/                staging; refused entries moved aside
    <root>/headers/                                header-tree hashes (evtc.compiler.fingerprint)
    <root>/construct/                              the construct memo (evtc.compiler.memo)

``<key>`` is the SHA-256 of the *key material* (source, flags, header contents; see
:mod:`evtc.compiler.cache`), which needs no compiler to compute, so a machine without nvcc finds
kernels built elsewhere. The *toolchain* (nvcc release, host compiler) is recorded in the entry
and names its folder: a key may hold builds by several toolchains, and a lookup with nvcc present
prefers the one of the local toolchain.

``meta.json`` records the key, the key material, the toolchain, the SHA-256 and size of
``kernel.so``, the ABI version, the command line and the build time. Before a library is loaded,
:func:`verify_entry` checks:

* every folder from ``<root>/kernels`` down to the entry, and ``kernel.so`` and ``meta.json``,
  are real folders and regular files (no symlinks), owned by the current user (or root), and not
  writable by group or others (in a shared cache: not writable by others): the one rule of
  NOTE [Trusted files] (evtc/compiler/trust.py), which the memo and the torch fast path share;
* ``meta.json`` (at most 1 MiB, nested at most 32 deep, every field of its type: NOTE [Untrusted
  JSON]) is this cache format, names this key and toolchain, its key material hashes to the
  key, and its ABI version is :data:`evtc.abi.ABI_VERSION`;
* the SHA-256 of ``kernel.so`` is the recorded one (a truncated, replaced or foreign library
  fails here and is never dlopen'ed);
* with ``EVTC_CACHE_SECRET`` set, ``meta.json`` carries a valid HMAC-SHA256 under that secret.

A refused entry is skipped with a :class:`CacheWarning` naming it; a build moves it to
``quarantine/`` and rebuilds.

Trust model. The default cache is private: created 0700 (whatever the umask), and only files the
user (or root) owns and nobody else can write are loaded, so another local user can't plant a
library. ``EVTC_SHARED_CACHE=<dir>`` makes ``<dir>`` a shared cache for a team: entries may belong
to any user and folders may be group-writable (create the directory with the team's group, mode
2770); hashes are still verified, which catches corruption and mix-ups but not a team member who
writes a consistent bad entry: a shared cache trusts everyone who can write it, like a shared
site-packages. To trust only those who hold a secret, set ``EVTC_CACHE_SECRET=<file>`` (a key file
readable by the team only): entries are then signed with HMAC-SHA256 and unsigned ones refused.
In a shared cache, :func:`verified_library_path` hands the loader a private in-memory copy of the
bytes it hashed, so nothing can swap the file between the check and ``dlopen``.

A read-only cache serves the kernels in it (a lookup writes nothing); a build into it raises a
:class:`~evtc.errors.CacheError` with the cause. evtc never falls back to a temporary directory
on its own: a silent fallback would rebuild every kernel in every process.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import re
import shutil
import stat
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from evtc import knobs
from evtc.compiler import trust
from evtc.compiler.trust import Untrusted
from evtc.errors import CacheError

if TYPE_CHECKING:
    from filelock import FileLock

__all__ = [
    "CACHE_FORMAT", "CacheRoot", "CacheWarning", "Entry", "EntryInfo", "EntryRejected", "PruneSummary", "cache_dir",
    "cache_root", "canonical_json", "check_meta", "find_entry", "install_entry", "key_lock", "list_entries", "make_meta",
    "prune", "quarantine", "verified_library_path", "verify_entry",
]

#: Version of the entry layout and of ``meta.json`` (part of every key).
CACHE_FORMAT = 2
ENTRY_FILES = ("meta.json", "kernel.so", "kernel.cu", "build.log")
KEY_RE = re.compile(r"[0-9a-f]{64}")
TOOLCHAIN_RE = re.compile(r"[0-9a-f]{16}")


class CacheWarning(UserWarning):
    """A cache entry was refused (and skipped, or moved aside and rebuilt), or the cache
    directory is writable by group or others (and left so)."""


#: An entry failed verification (NOTE [Trusted files] in evtc/compiler/trust.py, :func:`check_meta`);
#: ``str()`` is the reason. The same class as :class:`evtc.compiler.trust.Untrusted`.
EntryRejected = Untrusted


def canonical_json(obj) -> str:
    """JSON with sorted keys and no spaces: the bytes that are hashed and signed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


_user = trust._user


# --------------------------------------------------------------------------------------------
# The cache directory
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class CacheRoot:
    """A cache directory and how far it is trusted.

    Attributes:
        path: the directory.
        shared: a shared cache (``EVTC_SHARED_CACHE``): entries of any owner, group-writable
            folders allowed, hashes still verified.
        secret: the HMAC key of ``EVTC_CACHE_SECRET``, or None.
    """

    path: Path
    shared: bool = False
    secret: bytes | None = dataclasses.field(default=None, repr=False)

    @property
    def dir_mode(self) -> int:
        return 0o2770 if self.shared else 0o700

    @property
    def file_mode(self) -> int:
        return 0o640 if self.shared else 0o600

    def sub(self, *parts: str) -> Path:
        return self.path.joinpath(*parts)

    def entry_dir(self, key: str, toolchain_id: str) -> Path:
        return self.path / "kernels" / key[:2] / key / toolchain_id


def _configured() -> tuple[Path, bool]:
    shared = knobs.shared_cache.get()
    if shared:
        return Path(shared).expanduser(), True
    root = knobs.cache_dir.get()
    if root:
        return Path(root).expanduser(), False
    xdg = knobs.xdg_cache_home.get()
    try:
        base = Path(xdg) if xdg else Path.home() / ".cache"
    except RuntimeError as e:  # no HOME and no passwd entry
        raise CacheError(f"can't find a cache directory: {e}", hint="set EVTC_CACHE_DIR to a directory of yours") from None
    return base / "evtc", False


_MAX_SECRET_BYTES = 1 << 16


def _secret() -> bytes | None:
    path = knobs.cache_secret.get()
    if not path:
        return None
    try:  # a bounded read of a regular file: not a FIFO that blocks, nor /dev/zero
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        try:
            st = os.fstat(fd)
            data = os.read(fd, _MAX_SECRET_BYTES + 1) if stat.S_ISREG(st.st_mode) else b""
        finally:
            os.close(fd)
    except OSError as e:
        raise CacheError(f"can't read EVTC_CACHE_SECRET {path}: {e.strerror}") from None
    if not stat.S_ISREG(st.st_mode) or len(data) > _MAX_SECRET_BYTES:
        raise CacheError(f"the cache secret {path} is not a regular file of at most {_MAX_SECRET_BYTES} bytes",
                         hint=f"make one with: head -c 32 /dev/urandom | base64 > {path}")
    data = data.strip()
    if st.st_mode & 0o004:
        raise CacheError(f"the cache secret {path} is readable by everyone (mode {stat.S_IMODE(st.st_mode):o})",
                         hint=f"chmod o-rwx {path}")
    if len(data) < 16:
        raise CacheError(f"the cache secret {path} is shorter than 16 bytes",
                         hint=f"make one with: head -c 32 /dev/urandom | base64 > {path}")
    return data


# NOTE [Modes of folders evtc did not create]
# evtc sets the mode only of a folder it has just created itself (to undo the umask), through a
# descriptor opened with O_NOFOLLOW, so never through a link. A folder that already exists, the
# cache directory the user names included, keeps its mode, however open: what lies under it is
# verified before use anyway (NOTE [Trusted files]). Source: issue 37 (as root, EVTC_CACHE_DIR=/tmp
# turned /tmp from 1777 into 1755 for everyone).

def _mkdirs(path: Path, mode: int) -> list[Path]:
    """Create ``path`` and missing parents with exactly ``mode`` (umask ignored); folders that
    exist are left alone (NOTE [Modes of folders evtc did not create]).

    Returns:
        The folders created, outermost first.
    """
    missing = []
    p = path
    while not os.path.lexists(p):
        missing.append(p)
        if p.parent == p:
            break
        p = p.parent
    created = []
    for d in reversed(missing):
        try:
            os.mkdir(d, mode)
        except FileExistsError:
            continue
        created.append(d)
        fd = os.open(d, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
        try:
            os.fchmod(fd, mode)
        finally:
            os.close(fd)
    return created


def _cache_error(what: str, path: Path, e: OSError) -> CacheError:
    return CacheError(f"{what} {path}: {e.strerror or e}",
                      hint="set EVTC_CACHE_DIR to a writable directory of yours (a read-only cache still serves the "
                           "kernels in it; builds need a writable one)")


def cache_root(create: bool = True) -> CacheRoot:
    """The configured cache directory, checked.

    ``EVTC_SHARED_CACHE`` (a shared cache), else ``EVTC_CACHE_DIR``, else
    ``$XDG_CACHE_HOME/evtc``, else ``~/.cache/evtc``. A private cache that does not exist is
    created with mode 0700 (parents too, whatever the umask); one that exists is never chmod'ed
    (NOTE [Modes of folders evtc did not create]): if it is yours but writable by group or others,
    a :class:`CacheWarning` says so, entries in it are still verified one by one, and the
    construct memo stays off.

    Args:
        create: create the directory if missing (else a missing one is returned unchecked).

    Raises:
        CacheError: it can't be created (read-only file system, unwritable HOME), is not a
            folder, belongs to another user (private cache), or is writable by everyone
            (shared cache).
    """
    path, shared = _configured()
    root = CacheRoot(path, shared, _secret())
    try:
        st = os.stat(path)
    except FileNotFoundError:
        if not create:
            return root
        try:
            _mkdirs(path, root.dir_mode if shared else 0o700)
            st = os.stat(path)
        except OSError as e:
            raise _cache_error("can't create the kernel cache", path, e) from None
    except OSError as e:
        raise _cache_error("can't use the kernel cache", path, e) from None
    if not stat.S_ISDIR(st.st_mode):
        raise CacheError(f"the kernel cache {path} is not a folder", hint="set EVTC_CACHE_DIR to a folder")
    mode = stat.S_IMODE(st.st_mode)
    if shared:
        if mode & 0o002:
            raise CacheError(f"the shared kernel cache {path} is writable by everyone (mode {mode:o})",
                             hint=f"chmod o-w {path} (a shared cache is for one group: chgrp it, mode 2770)")
        return root
    if st.st_uid not in (os.geteuid(), 0):
        raise CacheError(f"the kernel cache {path} belongs to {_user(st.st_uid)}, not to you",
                         hint="set EVTC_CACHE_DIR to a directory of yours, or EVTC_SHARED_CACHE to use it as a shared cache")
    if mode & 0o022:
        if st.st_uid != os.geteuid():
            raise CacheError(f"the kernel cache {path} is writable by others (mode {mode:o})",
                             hint="set EVTC_CACHE_DIR to a private directory of yours")
        warnings.warn(f"the kernel cache {path} is writable by group or others (mode {mode:o}); evtc leaves the mode "
                      f"of a folder it did not create alone: every entry in it is still verified before it is loaded, "
                      f"and the construct memo is off (chmod go-w {path}, or set EVTC_CACHE_DIR to a private folder)",
                      CacheWarning, stacklevel=2)
    return root


def cache_dir() -> Path:
    """The cache directory (created private if missing). Kept for old callers; see
    :func:`cache_root`.

    Raises:
        CacheError: see :func:`cache_root`.
    """
    return cache_root(create=True).path


def _ensure_dir(root: CacheRoot, path: Path) -> None:
    """Create a folder inside the cache (and missing parents) with the cache's mode; one that
    exists keeps its mode (NOTE [Modes of folders evtc did not create]: entries under a folder
    that fails NOTE [Trusted files] are refused, not fixed)."""
    try:
        _mkdirs(path, root.dir_mode)
    except OSError as e:
        raise _cache_error("can't write to the kernel cache", path, e) from None


# --------------------------------------------------------------------------------------------
# Verification
# --------------------------------------------------------------------------------------------

#: Largest ``meta.json`` read (an entry's is about 2 kB).
MAX_META_BYTES = 1 << 20


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


def _signature(secret: bytes, meta: dict) -> str:
    body = {k: v for k, v in meta.items() if k != "signature"}
    return hmac.new(secret, canonical_json(body).encode(), hashlib.sha256).hexdigest()


def _abi_version() -> int:
    from evtc.abi import ABI_VERSION

    return ABI_VERSION


_INT, _NUMBER = "an integer", "a number"
#: The fields of ``meta.json`` and their JSON types: required ones, then those checked when present.
_META_REQUIRED = {"format": _INT, "key": str, "material": dict, "toolchain": dict, "toolchain_id": str,
                  "library_sha256": str, "library_bytes": _INT, "abi_version": _INT}
_META_OPTIONAL = {"name": str, "arch": str, "command": list, "seconds": _NUMBER, "created": _NUMBER, "built_on": str,
                  "evtc_version": str, "signature": str}
_TYPE_NAMES = {str: "a string", dict: "an object", list: "a list"}


def _json_type(v) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "a boolean"
    if isinstance(v, (int, float)):
        return "a number"
    return _TYPE_NAMES.get(type(v), type(v).__name__)


def _has_type(v, want) -> bool:
    if want == _INT:
        return isinstance(v, int) and not isinstance(v, bool)
    if want == _NUMBER:
        return isinstance(v, (int, float)) and not isinstance(v, bool)
    return isinstance(v, want)


def check_meta_shape(meta, what: str = "meta.json") -> dict:
    """Check the type of every field of a ``meta.json`` (NOTE [Untrusted JSON]).

    Args:
        meta: the parsed value.
        what: names the file in the message.

    Returns:
        ``meta``, a dict whose known fields have their types.

    Raises:
        EntryRejected: ``<what>: field '<f>' is <type>, not <type>`` (or missing).
    """
    if not isinstance(meta, dict):
        raise EntryRejected(f"{what} is {_json_type(meta)}, not a JSON object")
    if meta.get("format") != CACHE_FORMAT:  # first: an older entry says so, not that a field is missing
        raise EntryRejected(f"{what} has cache format {str(meta.get('format'))[:20]!r}, this evtc reads {CACHE_FORMAT}")
    for table, required in ((_META_REQUIRED, True), (_META_OPTIONAL, False)):
        for name, want in table.items():
            if name not in meta:
                if required:
                    raise EntryRejected(f"{what}: field '{name}' is missing")
                continue
            if not _has_type(meta[name], want):
                raise EntryRejected(f"{what}: field '{name}' is {_json_type(meta[name])}, not "
                                    f"{want if isinstance(want, str) else _TYPE_NAMES[want]}")
    if meta["library_bytes"] < 0:
        raise EntryRejected(f"{what}: field 'library_bytes' is negative")
    if not all(isinstance(c, str) for c in meta.get("command", [])):
        raise EntryRejected(f"{what}: field 'command' is not a list of strings")
    return meta


def check_meta(meta: dict, key: str, toolchain_id: str, secret: bytes | None = None) -> None:
    """Check a ``meta.json`` against the key and toolchain folder it sits under (its shape first:
    :func:`check_meta_shape`).

    Raises:
        EntryRejected: it doesn't match (the reason says how).
    """
    check_meta_shape(meta)
    if meta["key"] != key:
        raise EntryRejected(f"meta.json names key {meta['key'][:16]}..., not {key[:16]}... "
                            "(an entry of another kernel placed under this key)")
    if _sha256_bytes(canonical_json(meta["material"]).encode()) != key:
        raise EntryRejected("the key material in meta.json does not hash to the key")
    if meta["toolchain_id"] != toolchain_id or \
            _sha256_bytes(canonical_json(meta["toolchain"]).encode())[:16] != toolchain_id:
        raise EntryRejected("the toolchain in meta.json does not match the entry's folder")
    if meta["abi_version"] != _abi_version():
        raise EntryRejected(f"built for C ABI {meta['abi_version']!r}, this evtc speaks {_abi_version()}")
    if not re.fullmatch(r"[0-9a-f]{64}", meta["library_sha256"]):
        raise EntryRejected("meta.json: field 'library_sha256' is not 64 hex digits")
    if secret is not None:
        sig = meta.get("signature")
        if not isinstance(sig, str) or not hmac.compare_digest(sig, _signature(secret, meta)):
            raise EntryRejected("meta.json is not signed with EVTC_CACHE_SECRET")


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


def make_meta(root: CacheRoot, *, key: str, material: dict, toolchain: dict, library: bytes, name: str, arch: str,
              command: list[str], seconds: float, built_on: str | None = None, created: float | None = None) -> dict:
    """The ``meta.json`` of a new entry (signed when ``EVTC_CACHE_SECRET`` is set)."""
    from evtc._version import __version__ as evtc_version

    meta = {
        "format": CACHE_FORMAT,
        "key": key,
        "material": material,
        "toolchain": toolchain,
        "toolchain_id": _sha256_bytes(canonical_json(toolchain).encode())[:16],
        "library_sha256": _sha256_bytes(library),
        "library_bytes": len(library),
        "abi_version": _abi_version(),
        "name": name,
        "arch": arch,
        "command": command,
        "seconds": round(seconds, 2),
        "created": created if created is not None else time.time(),
        "built_on": built_on or os.uname().nodename,
        "evtc_version": evtc_version,
    }
    if root.secret is not None:
        meta["signature"] = _signature(root.secret, meta)
    return meta


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


# --------------------------------------------------------------------------------------------
# Listing and pruning
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class EntryInfo:
    """One entry as ``evtc cache list`` shows it.

    Attributes:
        key, toolchain_id: where it is.
        path: its folder.
        name, arch: the kernel's (from meta.json; ``?`` if unreadable).
        nvcc: the nvcc release that built it.
        bytes: total size of its files.
        created: build time (Unix seconds).
        last_used: last lookup (the folder's mtime, Unix seconds).
        problem: why it would be refused, or None when it verifies.
    """

    key: str
    toolchain_id: str
    path: Path
    name: str
    arch: str
    nvcc: str
    bytes: int
    created: float
    last_used: float
    problem: str | None


def _dir_bytes(path: Path) -> int:
    total = 0
    for dirpath, _dirs, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(dirpath, f)).st_size
            except OSError:
                pass
    return total


def _iter_entry_dirs(root: CacheRoot) -> Iterator[tuple[str, str]]:
    kernels = root.sub("kernels")
    try:
        prefixes = sorted(os.listdir(kernels))
    except OSError:
        return
    for xx in prefixes:
        try:
            keys = sorted(os.listdir(kernels / xx))
        except OSError:
            continue
        for key in keys:
            if not KEY_RE.fullmatch(key):
                continue
            for tc in toolchain_ids(root, key):
                yield key, tc


def list_entries(root: CacheRoot, verify: bool = True) -> list[EntryInfo]:
    """Every entry of the cache, oldest first, each verified unless ``verify`` is False."""
    out = []
    for key, tc in _iter_entry_dirs(root):
        path = root.entry_dir(key, tc)
        problem = None
        try:  # read like verify_entry (bounded, no links, shape checked): a listing never crashes or hangs
            meta = check_meta_shape(trust.load_json(
                trust.read(path / "meta.json", max_bytes=MAX_META_BYTES, shared=root.shared), "meta.json"))
        except EntryRejected as e:
            meta, problem = {}, str(e)
        if verify and problem is None:
            try:
                verify_entry(root, key, tc)
            except EntryRejected as e:
                problem = str(e)
        try:
            last_used = os.lstat(path).st_mtime
        except OSError:
            last_used = 0.0
        tool = meta.get("toolchain", {})
        out.append(EntryInfo(key, tc, path, str(meta.get("name", "?")), str(meta.get("arch", "?")),
                             str(tool.get("nvcc", "?"))[:200], _dir_bytes(path), float(meta.get("created", last_used)),
                             last_used, problem))
    out.sort(key=lambda e: (e.created, e.key))
    return out


@dataclasses.dataclass
class PruneSummary:
    """What :func:`prune` removed (or would remove, with ``dry_run``).

    Attributes:
        removed: entries removed, with the reason.
        other: other folders removed (failed builds, quarantine, staging leftovers, entries of
            the old format-1 layout).
        freed_bytes: bytes freed.
        kept: entries kept.
    """

    removed: list[tuple[EntryInfo, str]] = dataclasses.field(default_factory=list)
    other: list[Path] = dataclasses.field(default_factory=list)
    freed_bytes: int = 0
    kept: int = 0


def _rm(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    else:
        path.unlink()


def prune(root: CacheRoot, *, everything: bool = False, older_than_s: float | None = None,
          max_bytes: int | None = None, bad: bool = False, dry_run: bool = False) -> PruneSummary:
    """Remove entries from the cache.

    Args:
        root: the cache.
        everything: remove every entry, failed build and leftover, the header hashes and the
            construct memo (lock files stay: deleting one that another process waits on would
            let two builds of a key run at once).
        older_than_s: remove entries (and construct-memo entries) not used for this many seconds.
        max_bytes: then remove least recently used entries until the entries take at most this.
        bad: remove entries that fail verification, failed builds, the quarantine and leftovers
            of interrupted builds (older than an hour).
        dry_run: only report.

    Returns:
        A :class:`PruneSummary`.

    Raises:
        CacheError: something can't be removed.
    """
    summary = PruneSummary()
    now = time.time()
    entries = list_entries(root, verify=bad or everything)
    keep: list[EntryInfo] = []
    for e in entries:
        reason = None
        if everything:
            reason = "all"
        elif bad and e.problem:
            reason = e.problem
        elif older_than_s is not None and now - e.last_used > older_than_s:
            reason = f"unused for {(now - e.last_used) / 86400:.1f} days"
        if reason:
            summary.removed.append((e, reason))
        else:
            keep.append(e)
    if max_bytes is not None:
        total = sum(e.bytes for e in keep)
        for e in sorted(keep, key=lambda e: e.last_used):
            if total <= max_bytes:
                break
            summary.removed.append((e, f"over the size limit ({total} B > {max_bytes} B)"))
            total -= e.bytes
            keep.remove(e)
    summary.kept = len(keep)
    others: list[Path] = []
    if everything or bad:
        for sub in ("failed", "quarantine"):
            d = root.sub(sub)
            if d.is_dir():
                others += sorted(d.iterdir())
        tmp = root.sub("tmp")
        if tmp.is_dir():
            others += [p for p in sorted(tmp.iterdir()) if everything or now - p.lstat().st_mtime > 3600]
    if older_than_s is not None and not everything and root.sub("construct").is_dir():
        # construct-memo entries (evtc.compiler.memo) not read or written for that long
        others += [p for p in sorted(root.sub("construct").rglob("*"))
                   if p.is_file() and now - p.lstat().st_mtime > older_than_s]
    if everything:
        # entries of the format-1 layout (<root>/<xx>/<key>/), the header hashes, the construct memo
        for p in sorted(root.path.iterdir()) if root.path.is_dir() else []:
            if re.fullmatch(r"[0-9a-f]{2}", p.name) and p.is_dir():
                others.append(p)
        for sub in ("headers", "construct"):
            if root.sub(sub).is_dir():
                others.append(root.sub(sub))
    summary.other = others
    summary.freed_bytes = sum(e.bytes for e, _ in summary.removed) + sum(
        _dir_bytes(p) if p.is_dir() else p.lstat().st_size for p in others)
    if dry_run:
        return summary
    try:
        for e, _ in summary.removed:
            _rm(e.path)
            parent = e.path.parent
            if parent.is_dir() and not any(parent.iterdir()):
                parent.rmdir()
        for p in others:
            if os.path.lexists(p):
                _rm(p)
    except OSError as err:
        raise CacheError(f"can't remove {err.filename}: {err.strerror}") from None
    return summary
