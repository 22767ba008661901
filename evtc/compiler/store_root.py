"""The kernel cache's folder: where it is, how far it is trusted, and folders created in it.

Input: the configuration (``EVTC_SHARED_CACHE``, ``EVTC_CACHE_DIR``, ``XDG_CACHE_HOME``,
``EVTC_CACHE_SECRET``).
Output: a checked :class:`CacheRoot` (path, shared or private, secret), or a
:class:`~evtc.errors.CacheError` with the cause. The trust model is NOTE [The verified cache]
(evtc/compiler/store.py).
"""

from __future__ import annotations

import dataclasses
import os
import stat
import warnings
from pathlib import Path

from evtc import knobs
from evtc.compiler import trust
from evtc.errors import CacheError

__all__ = ["CacheRoot", "CacheWarning", "cache_dir", "cache_root"]


class CacheWarning(UserWarning):
    """A cache entry was refused (and skipped, or moved aside and rebuilt), or the cache
    directory is writable by group or others (and left so)."""


_user = trust._user


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


def _expanded(knob: knobs.Knob, value: str) -> Path:
    try:
        return Path(value).expanduser()
    except RuntimeError:  # ~user of no user (pathlib's "Could not determine home directory.")
        raise CacheError(f"{knob.name}={value!r}: {value.split('/')[0]!r} names no user's home folder",
                         hint=f"set {knob.name} to a folder's path") from None


def _configured() -> tuple[Path, bool]:
    shared = knobs.shared_cache.get()
    if shared:
        return _expanded(knobs.shared_cache, shared), True
    root = knobs.cache_dir.get()
    if root:
        return _expanded(knobs.cache_dir, root), False
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
