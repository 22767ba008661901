"""Content hashes of header trees (CUTLASS's, evtc's own), cheap enough for every cache lookup.

Input: a directory. Output: a SHA-256 over the relative path and bytes of every file under it,
which goes into the build cache key (the headers are not part of the emitted source text, yet
they change the binary).

Hashing the CUTLASS wheel's 857 headers (27 MB) takes about 55 ms, so it is done rarely:

* once per process and directory (an in-process memo; :func:`clear` forgets it, for a process
  that edits headers while it runs);
* across processes, a *snapshot* of the tree is compared with the one stored beside the hash in
  the cache (``<cache>/headers/<id>.json``): same snapshot, same hash. For a tree people edit
  (``CUTLASS_PATH``, evtc's headers) the snapshot has every entry's relative path, size, mtime
  and inode (about 16 ms for CUTLASS's 934 entries here): editing, adding, removing or replacing a
  header changes it. For the ``nvidia-cutlass`` wheel, which pip writes and replaces as a whole,
  it is the mtimes of its 65 folders, whose list is stored with the hash (65 ``stat`` calls, well
  under a millisecond): an added, removed or replaced header changes its folder's mtime; a header
  of the wheel edited in place is not seen (reinstall the wheel, or ``evtc cache prune --all``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import threading
from pathlib import Path

__all__ = ["clear", "included_hash", "snapshot", "sources_hash", "tree_hash", "tree_hash_uncached"]

_MEMO: dict[str, str] = {}
_LOCK = threading.Lock()
#: Format of the stored snapshot files and of the hash itself (bump to invalidate both).
_FORMAT = 1


def _walk(root: str):
    """(relative path, DirEntry) of every file and folder under ``root``, sorted by path;
    symlinked folders are listed, not entered."""
    stack = [""]
    out = []
    while stack:
        rel = stack.pop()
        with os.scandir(os.path.join(root, rel) if rel else root) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            r = f"{rel}/{e.name}" if rel else e.name
            out.append((r, e))
            if e.is_dir(follow_symlinks=False):
                stack.append(r)
    out.sort(key=lambda x: x[0])
    return out


def _folders(root: str) -> list[str]:
    """Every folder under ``root`` (``.`` first), relative, sorted; symlinked folders are not
    entered."""
    return ["."] + [rel for rel, e in _walk(root) if e.is_dir(follow_symlinks=False)]


def _folder_snapshot(root: str, folders: list[str]) -> str:
    h = hashlib.sha256(f"folders {_FORMAT}\n".encode())
    for rel in folders:
        st = os.stat(os.path.join(root, rel))
        h.update(f"{rel}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    return h.hexdigest()


def snapshot(root: Path | str, files: bool = True) -> str:
    """A digest of the names, sizes, mtimes and inodes under ``root`` (not the contents).

    Args:
        root: the tree.
        files: stat every file (sees in-place edits); False stats only the folders, whose
            mtimes change when a file is added, removed, renamed or replaced (how pip, git and
            most editors write). The folder list is stored with the hash, so checking a stored
            hash then costs one ``stat`` per folder and no directory listing.
    """
    root = str(root)
    if not files:
        return _folder_snapshot(root, _folders(root))
    h = hashlib.sha256(f"snapshot {_FORMAT}\n".encode())
    for rel, e in _walk(root):
        st = e.stat(follow_symlinks=False)
        h.update(f"{rel}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
    return h.hexdigest()


def tree_hash_uncached(root: Path | str) -> str:
    """SHA-256 of every file under ``root`` (relative path, size and bytes, in path order);
    a symlink counts as the file it points to.

    Raises:
        OSError: ``root`` or a file under it can't be read.
    """
    h = hashlib.sha256(f"tree {_FORMAT}\n".encode())
    for rel, e in _walk(str(root)):
        if e.is_dir(follow_symlinks=True):
            continue
        with open(e.path, "rb") as f:
            data = f.read()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()


def _memo_file(memo_dir: Path, root: str, watch_files: bool) -> Path:
    return memo_dir / (hashlib.sha256(f"{root}\0{watch_files}".encode()).hexdigest()[:24] + ".json")


#: Largest stored snapshot file read (CUTLASS's has 65 folder names: a few kB).
MAX_MEMO_BYTES = 4 << 20


def _read_memo(path: Path, root: str) -> dict | None:
    """The stored snapshot and hash, or None when missing or untrusted: the file and its folder
    (``memo_dir``) must pass NOTE [Trusted files] (evtc/compiler/trust.py)."""
    from evtc.compiler import trust

    try:
        data = trust.load_json(trust.read(path, max_bytes=MAX_MEMO_BYTES, root=path.parent.parent), str(path))
    except trust.Untrusted:
        return None  # missing, not ours, writable by others, a link, too big or not JSON: don't trust it
    if not isinstance(data, dict) or data.get("format") != _FORMAT or data.get("root") != root:
        return None
    value = data.get("hash")
    return data if isinstance(value, str) and len(value) == 64 else None


def _write_memo(path: Path, data: dict) -> None:
    try:
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.{threading.get_ident()}")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
        with os.fdopen(fd, "w") as f:
            json.dump(data, f)
        os.replace(tmp, path)
    except OSError:
        pass  # a read-only cache: recompute next time


def _stored(root: str, data: dict, watch_files: bool) -> str | None:
    """The stored hash if the tree still matches its stored snapshot."""
    try:
        if watch_files:
            snap = snapshot(root, True)
        else:
            folders = data.get("folders")
            if not isinstance(folders, list) or not all(isinstance(f, str) for f in folders):
                return None
            snap = _folder_snapshot(root, folders)
    except OSError:
        return None
    return data["hash"] if snap == data.get("snapshot") else None


def tree_hash(root: Path | str, memo_dir: Path | None = None, *, watch_files: bool = True) -> str:
    """The content hash of ``root`` (see the module docstring for how it is kept cheap).

    Args:
        root: a header directory.
        memo_dir: where snapshots and hashes persist between processes (the cache's
            ``headers/`` folder); None to keep them in this process only.
        watch_files: the snapshot stats every file (False: only folders; see :func:`snapshot`).

    Returns:
        64 hex digits.

    Raises:
        OSError: ``root`` can't be read.
    """
    key = os.path.abspath(root)
    memo_key = f"{key}\0{watch_files}"
    with _LOCK:
        hit = _MEMO.get(memo_key)
    if hit is not None:
        return hit
    value = None
    path = _memo_file(memo_dir, key, watch_files) if memo_dir is not None else None
    if path is not None:
        data = _read_memo(path, key)
        value = _stored(key, data, watch_files) if data is not None else None
    if value is None:
        if path is None:
            value = tree_hash_uncached(key)
        else:
            folders = None if watch_files else _folders(key)

            def snap() -> str:
                return snapshot(key, True) if watch_files else _folder_snapshot(key, folders)

            before = snap()
            value = tree_hash_uncached(key)
            if snap() == before:  # the tree did not change while it was hashed
                _write_memo(path, {"format": _FORMAT, "root": key, "snapshot": before, "hash": value,
                                   "folders": folders})
    with _LOCK:
        _MEMO[memo_key] = value
    return value


_INCLUDE = re.compile(r'^\s*#\s*include\s*[<"](evtc/[^>"]+)[>"]', re.M)
_FILE_MEMO: dict[tuple, tuple[str, tuple[str, ...]]] = {}


def _header(path: Path) -> tuple[str, tuple[str, ...]]:
    """(SHA-256, evtc includes) of one header, memoised on its path, size, mtime and inode."""
    st = path.stat()
    memo_key = (str(path), st.st_size, st.st_mtime_ns, st.st_ino)
    hit = _FILE_MEMO.get(memo_key)
    if hit is None:
        data = path.read_bytes()
        hit = hashlib.sha256(data).hexdigest(), tuple(_INCLUDE.findall(data.decode("utf-8", "replace")))
        with _LOCK:
            _FILE_MEMO[memo_key] = hit
    return hit


def included_hash(source: str, root: Path | str) -> str:
    """SHA-256 over the evtc headers under ``root`` that ``source`` includes (``#include
    <evtc/...>``), directly or through each other: their relative paths and contents.

    Only what a kernel includes goes into its key, so adding or editing a header another kind of
    kernel uses (the conv headers, for a GEMM) keeps the GEMM's cached builds valid.

    Raises:
        OSError: an included evtc header is missing or unreadable.
    """
    root = Path(root)
    todo = sorted(set(_INCLUDE.findall(source)))
    seen: dict[str, str] = {}
    while todo:
        rel = todo.pop()
        if rel in seen:
            continue
        digest, more = _header(root / rel)
        seen[rel] = digest
        todo.extend(m for m in more if m not in seen)
    h = hashlib.sha256(f"evtc-included-v{_FORMAT}\n".encode())
    for rel in sorted(seen):
        h.update(f"{rel}\0{seen[rel]}\n".encode())
    return h.hexdigest()


def _source_files(roots: dict[str, tuple[str, tuple[str, ...] | None]]) -> list[tuple[str, str, os.DirEntry]]:
    """(label, relative path, DirEntry) of the files :func:`sources_hash` covers, in order."""
    out = []
    for label in sorted(roots):
        root, suffixes = roots[label]
        for rel, e in _walk(root):
            if "__pycache__" in rel.split("/") or e.is_dir(follow_symlinks=False):
                continue
            if suffixes is None or rel.endswith(suffixes):
                out.append((label, rel, e))
    return out


def sources_hash(roots: dict[str, tuple[Path | str, tuple[str, ...] | None]], memo_dir: Path | None = None) -> str:
    """SHA-256 over the contents of selected files under several folders: evtc's own Python
    sources, templates and grammar, for keys of results those files decide (the construct memo,
    :mod:`evtc.pipeline.memo`).

    Kept cheap like :func:`tree_hash`: once per process, and across processes through a
    snapshot (path, mode, size, mtime, inode of every selected file; about 1 ms for evtc's 130
    files) stored beside the hash in ``memo_dir``.

    Args:
        roots: label -> (folder, file-name suffixes to take, or None for every file);
            ``__pycache__`` folders are skipped.
        memo_dir: the cache's ``headers/`` folder, or None to keep the hash in this process only.

    Returns:
        64 hex digits.

    Raises:
        OSError: a folder or file can't be read.
    """
    norm = {k: (os.path.abspath(r), tuple(sfx) if sfx is not None else None) for k, (r, sfx) in roots.items()}
    ident = "sources\0" + json.dumps(sorted((k, r, list(sfx) if sfx else None) for k, (r, sfx) in norm.items()))
    with _LOCK:
        hit = _MEMO.get(ident)
    if hit is not None:
        return hit

    def snap(files) -> str:
        h = hashlib.sha256(f"sources-snapshot {_FORMAT}\n".encode())
        for label, rel, e in files:
            st = e.stat(follow_symlinks=False)
            h.update(f"{label}\0{rel}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ino}\n".encode())
        return h.hexdigest()

    files = _source_files(norm)
    before = snap(files)
    path = memo_dir / (hashlib.sha256(ident.encode()).hexdigest()[:24] + ".json") if memo_dir is not None else None
    value = None
    if path is not None:
        data = _read_memo(path, ident)
        if data is not None and data.get("snapshot") == before:
            value = data["hash"]
    if value is None:
        h = hashlib.sha256(f"sources {_FORMAT}\n".encode())
        for label, rel, e in files:
            with open(e.path, "rb") as f:
                data_bytes = f.read()
            h.update(f"{label}\0{rel}\0{len(data_bytes)}\0".encode())
            h.update(data_bytes)
        value = h.hexdigest()
        if path is not None and snap(_source_files(norm)) == before:  # unchanged while it was read
            _write_memo(path, {"format": _FORMAT, "root": ident, "snapshot": before, "hash": value})
    with _LOCK:
        _MEMO[ident] = value
    return value


def clear() -> None:
    """Forget this process's hashes (the next lookup takes a new snapshot)."""
    with _LOCK:
        _MEMO.clear()
        _FILE_MEMO.clear()
