"""File trust: the one rule for files evtc reads back from its cache and then loads, unpickles
or believes (kernel libraries and their ``meta.json``, the construct memo, the header-hash memo,
the torch fast path), and the one way to parse JSON that came from outside the process.

Input: a path under a folder evtc trusts (the cache directory), or bytes of JSON. Output: the
checked ``stat`` or bytes, or the parsed value; else :class:`Untrusted` with the reason.

# NOTE [Trusted files]

A file evtc reads back from its cache is trusted when it and every folder between it and the
cache directory (the *trust root*) pass these checks:

* Links: nothing below the trust root is a symbolic link, file or folder (``lstat``; a file is
  opened with ``O_NOFOLLOW`` and the checks run on ``fstat`` of that very descriptor, so nothing
  can be swapped between the check and the read). The trust root itself is named by the user
  (``EVTC_CACHE_DIR``, ``~/.cache/evtc``) and may be a link; it is checked where it is
  configured (:func:`evtc.compiler.store.cache_root`), by ``stat``.
* Kind: a regular file where a file is expected, a folder where a folder is.
* Owner: the current user or root (root can write anything anyway). In a shared cache
  (``EVTC_SHARED_CACHE``) any owner.
* Mode: not writable by group or others; in a shared cache not writable by others.
* Size: at most the reader's cap, checked on ``fstat`` and again while reading.

Source: the verified cache's trust model (NOTE [The verified cache] in store.py); issue 35 (four
copies of this check disagreed on links and on root-owned files), issue 37.

# NOTE [Untrusted JSON]

JSON read from an archive or from the cache is parsed by :func:`load_json` only: invalid UTF-8 or
JSON, and nesting deeper than :data:`MAX_JSON_DEPTH` (the C parser raises RecursionError near
Python's recursion limit, and a value nested hundreds deep breaks every later
``json.dumps``), raise :class:`Untrusted` naming the file. The caller then checks the shape of
the value by hand (the type of every field it reads) before using it. Source: issue 37 (a
deeply nested ``meta.json`` made every lookup raise RecursionError).
"""

from __future__ import annotations

import json
import os
import pwd
import stat
from pathlib import Path
from typing import Any

__all__ = ["MAX_JSON_DEPTH", "Untrusted", "check", "check_below", "check_stat", "load_json", "open_checked", "read"]

#: Deepest nesting :func:`load_json` accepts (evtc's own JSON files nest 4 levels at most).
MAX_JSON_DEPTH = 32


class Untrusted(Exception):
    """A file or folder failed the trust rule (NOTE [Trusted files]) or its JSON could not be
    accepted (NOTE [Untrusted JSON]); ``str()`` is the reason, naming the path."""


def _user(uid: int) -> str:
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def check_stat(st: os.stat_result, path: Path | str, *, want_dir: bool = False, shared: bool = False) -> None:
    """Apply the rule of NOTE [Trusted files] to a ``stat`` result (of ``lstat`` or ``fstat``).

    Args:
        st: the result.
        path: what it is of (for the message).
        want_dir: a folder is expected (else a regular file).
        shared: the rule of a shared cache (any owner, group-writable allowed).

    Raises:
        Untrusted: the reason, e.g. ``<path> is writable by group or others (mode 775)``.
    """
    if stat.S_ISLNK(st.st_mode):
        raise Untrusted(f"{path} is a symbolic link")
    if want_dir and not stat.S_ISDIR(st.st_mode):
        raise Untrusted(f"{path} is not a folder")
    if not want_dir and not stat.S_ISREG(st.st_mode):
        raise Untrusted(f"{path} is not a regular file")
    mode = stat.S_IMODE(st.st_mode)
    if shared:
        if mode & 0o002:
            raise Untrusted(f"{path} is writable by everyone (mode {mode:o})")
        return
    if st.st_uid not in (os.geteuid(), 0):
        raise Untrusted(f"{path} belongs to {_user(st.st_uid)}, not to you")
    if mode & 0o022:
        raise Untrusted(f"{path} is writable by group or others (mode {mode:o})")


def check(path: Path | str, *, want_dir: bool = False, shared: bool = False) -> os.stat_result:
    """``lstat`` ``path`` and apply the rule (a link is refused, never followed).

    Returns:
        The ``lstat`` result.

    Raises:
        Untrusted: ``<name> is missing``, can't be read, or the rule's reason.
    """
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        raise Untrusted(f"{Path(path).name} is missing") from None
    except OSError as e:
        raise Untrusted(f"can't read {path}: {e.strerror}") from None
    check_stat(st, path, want_dir=want_dir, shared=shared)
    return st


def check_below(root: Path, path: Path, *, want_dir: bool = False, shared: bool = False) -> os.stat_result:
    """Check every folder from ``root`` (the trust root, not itself checked) down to ``path``,
    and ``path``.

    Returns:
        The ``lstat`` result of ``path``.

    Raises:
        Untrusted: ``path`` is not under ``root``, or the first failing folder's or file's reason.
    """
    _check_folders(root, path, shared)
    return check(path, want_dir=want_dir, shared=shared)


def _check_folders(root: Path, path: Path | str, shared: bool) -> None:
    """Check the folders strictly between ``root`` and ``path``."""
    try:
        parts = Path(path).relative_to(root).parts
    except ValueError:
        raise Untrusted(f"{path} is not under {root}") from None
    cur = Path(root)
    for part in parts[:-1]:
        cur = cur / part
        check(cur, want_dir=True, shared=shared)


def open_checked(path: Path | str, *, shared: bool = False) -> tuple[int, os.stat_result]:
    """Open a regular file for reading without following a link (and without blocking on a
    FIFO) and apply the rule to ``fstat`` of the descriptor.

    Returns:
        (the descriptor, its ``fstat``); the caller closes it.

    Raises:
        Untrusted: missing, a link, not a regular file, or the rule's reason.
    """
    flags = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)
    try:
        fd = os.open(path, flags)
    except FileNotFoundError:
        raise Untrusted(f"{Path(path).name} is missing") from None
    except OSError as e:
        if stat.S_ISLNK(_lstat_mode(path)):
            raise Untrusted(f"{path} is a symbolic link") from None
        raise Untrusted(f"can't read {path}: {e.strerror}") from None
    try:
        st = os.fstat(fd)
        check_stat(st, path, shared=shared)
    except BaseException:
        os.close(fd)
        raise
    return fd, st


def _lstat_mode(path: Path | str) -> int:
    try:
        return os.lstat(path).st_mode
    except OSError:
        return 0


def read(path: Path | str, *, max_bytes: int, shared: bool = False, root: Path | None = None) -> bytes:
    """The bytes of a trusted regular file (NOTE [Trusted files]), at most ``max_bytes``.

    Args:
        path: the file.
        max_bytes: the cap; a larger file is refused (checked before and while reading).
        shared: the rule of a shared cache.
        root: the trust root; every folder below it down to ``path`` is checked too.

    Raises:
        Untrusted: the reason.
    """
    if root is not None:
        _check_folders(root, path, shared)
    fd, st = open_checked(path, shared=shared)
    try:
        if st.st_size > max_bytes:
            raise Untrusted(f"{path} is {st.st_size} bytes, more than the {max_bytes} a file of its kind may have")
        chunks, size = [], 0
        while True:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - size))
            if not chunk:
                break
            chunks.append(chunk)
            size += len(chunk)
            if size > max_bytes:
                raise Untrusted(f"{path} grew past {max_bytes} bytes while it was read")
    except OSError as e:
        raise Untrusted(f"can't read {path}: {e.strerror}") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def _depth_over(value: Any, limit: int) -> bool:
    """Whether ``value`` nests deeper than ``limit`` (iterative: no recursion of its own)."""
    stack = [(value, 1)]
    while stack:
        v, d = stack.pop()
        if isinstance(v, dict):
            items = v.values()
        elif isinstance(v, list):
            items = v
        else:
            continue
        if d > limit:
            return True
        stack.extend((x, d + 1) for x in items if isinstance(x, (dict, list)))
    return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def load_json(data: bytes | str, what: str, *, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """Parse JSON that came from outside the process (NOTE [Untrusted JSON]).

    Args:
        data: the text.
        what: names it in the message (a path, or ``archive: member``).
        max_depth: the deepest nesting accepted (a scalar is depth 0, ``[1]`` depth 1).

    Returns:
        The value.

    Raises:
        Untrusted: ``<what> is not JSON: <cause>`` or ``<what> is nested deeper than <n> levels``.

    Example::

        >>> load_json(b'{"a": [1]}', "x.json")
        {'a': [1]}
    """
    try:
        value = json.loads(data, parse_constant=_no_constant)
    except RecursionError:
        raise Untrusted(f"{what} is nested deeper than {max_depth} levels") from None
    except (ValueError, TypeError) as e:  # UnicodeDecodeError is a ValueError
        raise Untrusted(f"{what} is not JSON: {e}") from None
    if _depth_over(value, max_depth):
        raise Untrusted(f"{what} is nested deeper than {max_depth} levels")
    return value
