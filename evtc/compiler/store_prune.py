"""Listing and pruning the kernel cache (``evtc cache list``, ``evtc cache prune``).

Input: a :class:`~evtc.compiler.store_root.CacheRoot` and what to remove (everything, unused
for a time, over a size, refused entries).
Output: :class:`EntryInfo` rows, oldest first, and a :class:`PruneSummary` of what was removed.
"""

from __future__ import annotations

import dataclasses
import os
import re
import shutil
import time
from pathlib import Path
from typing import Iterator

from evtc.compiler import trust
from evtc.compiler.store_entries import KEY_RE, toolchain_ids, verify_entry
from evtc.compiler.store_meta import MAX_META_BYTES, EntryRejected, check_meta_shape
from evtc.compiler.store_root import CacheRoot
from evtc.errors import CacheError

__all__ = ["EntryInfo", "PruneSummary", "list_entries", "prune"]


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


def _choose(entries: list[EntryInfo], summary: PruneSummary, now: float, *, everything: bool,
            older_than_s: float | None, max_bytes: int | None, bad: bool) -> list[EntryInfo]:
    """Add the entries :func:`prune` removes to ``summary.removed``, with the reason; return the
    others."""
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
    return keep


def _other_paths(root: CacheRoot, now: float, *, everything: bool, older_than_s: float | None,
                 bad: bool) -> list[Path]:
    """The folders and files besides entries that :func:`prune` removes."""
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
        # construct-memo entries (evtc.pipeline.memo) not read or written for that long
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
    return others


# NOTE [Prune only a cache]
# prune removes folders by name (tmp/*, failed/*, quarantine/*, construct/, headers/ and the
# two-hex-digit folders of the format-1 layout), so it runs only in a folder that holds nothing but
# what evtc keeps there: `evtc cache --dir ~ prune --all` would otherwise remove ~/tmp/*, ~/headers
# and every ~/ab, and `--dir /` all of /tmp (names starting with '.' are left out of the check, and
# so is lost+found: a cache on a file system of its own, a mounted volume, has one it never prunes).
_LAYOUT = frozenset({"kernels", "failed", "locks", "tmp", "quarantine", "headers", "construct", "tuning", "torch_fast",
                     "lost+found"})


def _check_is_cache(root: CacheRoot) -> None:
    """NOTE [Prune only a cache].

    Raises:
        CacheError: the folder holds something evtc never writes there (named).
    """
    try:
        names = sorted(os.listdir(root.path))
    except OSError:
        return
    foreign = [n for n in names if n not in _LAYOUT and not n.startswith(".") and not re.fullmatch(r"[0-9a-f]{2}", n)]
    if foreign:
        shown = ", ".join(repr(n) for n in foreign[:5]) + (f" and {len(foreign) - 5} more" if len(foreign) > 5 else "")
        raise CacheError(f"won't prune {root.path}: it is not only an evtc kernel cache (it holds {shown}, which evtc "
                         "never writes there), and prune removes folders by name (tmp/, failed/, construct/, ...)",
                         hint="name the kernel cache folder itself (--dir, EVTC_CACHE_DIR), or move what is yours "
                              "out of it")


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
        CacheError: something can't be removed; the folder is not only a cache (NOTE [Prune only
            a cache]).
    """
    _check_is_cache(root)
    summary = PruneSummary()
    now = time.time()
    entries = list_entries(root, verify=bad or everything)
    keep = _choose(entries, summary, now, everything=everything, older_than_s=older_than_s, max_bytes=max_bytes,
                   bad=bad)
    summary.kept = len(keep)
    others = _other_paths(root, now, everything=everything, older_than_s=older_than_s, bad=bad)
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
