"""Cache export: verified entries written into a tar archive (``evtc cache export``).

Input: a cache and a selection of keys (or prefixes). Output: an archive of the format that
:mod:`evtc.compiler.archive_import` reads on another machine, written to a file, a pipe or
standard output (NOTE [Export targets]), and an :class:`ExportSummary`.

# NOTE [Export targets]

``export_entries`` never replaces what is not a regular file:

* ``-`` is standard output, streamed into (refused when it is a terminal);
* a path that does not exist, or a regular file, is written atomically: a temporary file beside
  it, renamed over it, so nobody reads half an archive; a path whose folder does not exist is
  refused (no folder is created, as ``evtc emit -o`` creates none);
* a FIFO or a character device (``/dev/null``, a named pipe) is opened for writing and streamed
  into: never created, truncated, renamed or removed;
* a symbolic link is followed, never replaced: a link to a regular file has that file replaced
  atomically at its real path (the link keeps pointing at it); a link to a FIFO or character
  device (``/dev/stdout`` in a pipe) is streamed into; a dangling link is refused;
* a folder, a block device (a disk) or a socket is refused.

The compression follows the name, case ignored (``.tar``, ``.tar.gz``/``.tgz``/``.gz``,
``.tar.bz2``/``.bz2``, else xz, ``-`` too); a name ending in another format's suffix (``.zip``,
``.tar.zst``, ...) is refused.
Source: issue 37 (as root, ``evtc cache export /dev/full`` replaced the device node with a tar
file; ``/dev/stdout`` replaced the link and wrote nothing into the pipe).
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import stat
import tarfile
import tempfile
import time
from pathlib import Path
from typing import BinaryIO, Iterable

from evtc.compiler import trust
from evtc.compiler.store_entries import verify_entry
from evtc.compiler.store_meta import CACHE_FORMAT, MAX_META_BYTES, EntryRejected, _abi_version, _sha256_bytes
from evtc.compiler.store_prune import EntryInfo, list_entries
from evtc.compiler.store_root import CacheRoot
from evtc.errors import CacheError

__all__ = ["EXPORT_FORMAT", "ExportSummary", "MANIFEST", "MAX_TEXT_BYTES", "export_entries"]

#: ``format`` of an export archive's ``evtc-cache.json``.
EXPORT_FORMAT = "evtc-cache-export/1"
MANIFEST = "evtc-cache.json"
#: The largest kernel.cu or build.log exported or imported (:attr:`ImportLimits.text_bytes`).
MAX_TEXT_BYTES = 64 << 20


# --------------------------------------------------------------------------------------------
# Export
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class ExportSummary:
    """What :func:`export_entries` wrote.

    Attributes:
        file: the archive (``-``: standard output).
        exported: the entries in it.
        refused: entries left out because they failed verification, with the reason.
        missing: requested keys (or prefixes) with no entry.
        bytes: the archive's size.
        streamed: it was streamed into standard output, a pipe or a device (NOTE [Export
            targets]), not written as a file.
    """

    file: Path
    exported: list[EntryInfo] = dataclasses.field(default_factory=list)
    refused: list[tuple[EntryInfo, str]] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)
    bytes: int = 0
    streamed: bool = False


#: suffixes of archive formats and compressions export does not write: a name ending so would hold
#: an xz tar under a name that says otherwise (``tar --zstd -xf k.tar.zst`` fails on it)
_OTHER_FORMATS = (".zst", ".tzst", ".zstd", ".zip", ".7z", ".lz4", ".lz", ".lzma", ".tlz", ".z", ".rar", ".br")


def _compression(name: str) -> str:
    """The compression ``name`` asks for (case ignored: ``K.TAR.GZ`` is gzip).

    Raises:
        CacheError: the name ends in another format's suffix (``.zip``, ``.tar.zst``, ...).
    """
    low = Path(name).name.lower()
    if low.endswith((".tar.gz", ".tgz", ".gz")):
        return "gz"
    if low.endswith(".tar"):
        return ""
    if low.endswith((".tar.bz2", ".tbz2", ".tbz", ".bz2")):
        return "bz2"
    other = next((x for x in _OTHER_FORMATS if low.endswith(x)), None)
    if other is not None:
        raise CacheError(f"won't write the cache archive {name}: its name ends in {Path(name).name[-len(other):]}, a format "
                         "evtc cache export does not write", hint="name it .tar.xz (the default), .tar.gz, .tar.bz2 "
                                                                  "or .tar")
    return "xz"


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(mtime)
    info.mode = 0o644
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def _write_error(file: str, e: OSError) -> CacheError:
    return CacheError(f"can't write the cache archive {file}: {e.strerror or e}")


def _refuse_target(file: str, what: str) -> CacheError:
    return CacheError(f"won't write the cache archive into {file}: it is {what}",
                      hint="name a regular file (replaced atomically), a pipe or character device (streamed into), "
                           "or - for standard output")


def _kind(st: os.stat_result) -> str | None:
    """What a target of this mode is called when it is refused; None when it can be written."""
    m = st.st_mode
    if stat.S_ISREG(m) or stat.S_ISFIFO(m) or stat.S_ISCHR(m):
        return None
    if stat.S_ISDIR(m):
        return "a folder"
    if stat.S_ISBLK(m):
        return "a block device (a disk)"
    if stat.S_ISSOCK(m):
        return "a socket"
    return "not a regular file, pipe or character device"


def _target(file: str) -> tuple[str, Path | None]:
    """Where ``file`` sends an export (NOTE [Export targets]).

    Returns:
        ``("file", path)``: write ``path`` atomically; ``("stream", path)``: open ``path`` (maybe
        through a link) and write into it; ``("stdout", None)``.

    Raises:
        CacheError: a target that is refused.
    """
    if file == "-":
        return "stdout", None
    p = Path(file)
    try:
        st = os.lstat(p)
    except FileNotFoundError:
        parent = p.parent if str(p.parent) else Path(".")
        if not parent.is_dir():
            raise CacheError(f"won't write the cache archive {file}: the folder {parent} does not exist",
                             hint="create the folder first: evtc makes no folders outside its cache "
                                  "(NOTE [Export targets])") from None
        return "file", p
    except OSError as e:
        raise _write_error(file, e) from None
    if stat.S_ISLNK(st.st_mode):
        try:
            st = os.stat(p)
        except FileNotFoundError:
            raise _refuse_target(file, f"a symbolic link to {os.readlink(p)!r}, which does not exist") from None
        except OSError as e:
            raise _write_error(file, e) from None
        if stat.S_ISREG(st.st_mode):
            real = Path(os.path.realpath(p))
            try:
                same = os.lstat(real)
            except OSError:
                same = None
            if same is None or (same.st_dev, same.st_ino) != (st.st_dev, st.st_ino):  # /proc/<pid>/fd/<n> of a deleted file
                raise _refuse_target(file, "a link whose target has no path of its own")
            return "file", real
    what = _kind(st)
    if what is not None:
        raise _refuse_target(file, what)
    return ("file" if stat.S_ISREG(st.st_mode) else "stream"), p


class _Out:
    """An export's destination (NOTE [Export targets]): :meth:`write`, then :meth:`commit` or
    :meth:`abort`."""

    def __init__(self, file: str) -> None:
        self.file, self.bytes, self._tmp, self._final = file, 0, None, None
        kind, path = _target(file)
        self.streamed = kind != "file"
        try:
            if kind == "file":
                assert path is not None
                fd, self._tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
                os.fchmod(fd, 0o644 & ~_umask())
                self._final = path
            elif kind == "stdout":
                fd = os.dup(1)
            else:  # never created or truncated: O_CREAT and O_TRUNC left out
                fd = os.open(path, os.O_WRONLY | os.O_NOCTTY | getattr(os, "O_CLOEXEC", 0))
        except OSError as e:
            raise _write_error(file, e) from None
        if kind != "file":
            st = os.fstat(fd)
            bad = "a terminal" if os.isatty(fd) else _kind(st)
            if kind == "stream" and stat.S_ISREG(st.st_mode):
                bad = "a regular file now (it changed while it was opened)"
            if bad is not None:
                os.close(fd)
                raise _refuse_target(file, bad)
        self._f: BinaryIO = os.fdopen(fd, "wb")

    def write(self, data) -> int:
        try:
            n = self._f.write(data)
        except OSError as e:
            raise _write_error(self.file, e) from None
        self.bytes += len(data)
        return n

    def commit(self) -> None:
        try:
            self._f.close()
            if self._final is not None:
                try:  # it may have appeared, or changed kind, since it was looked at
                    st = os.lstat(self._final)
                except FileNotFoundError:
                    st = None
                if st is not None and not stat.S_ISREG(st.st_mode):
                    raise _refuse_target(str(self._final), "not a regular file any more")
                os.replace(self._tmp, self._final)  # type: ignore[arg-type]
                self._tmp = None
        except OSError as e:
            raise _write_error(self.file, e) from None

    def abort(self) -> None:
        try:
            self._f.close()
        except OSError:
            pass
        if self._tmp is not None and os.path.lexists(self._tmp):
            os.unlink(self._tmp)


def _own_file(path: Path, max_bytes: int, shared: bool) -> bytes | None:
    """An entry's ``kernel.cu`` or ``build.log`` (NOTE [Trusted files]), or None."""
    try:
        return trust.read(path, max_bytes=max_bytes, shared=shared)
    except trust.Untrusted:
        return None


def export_entries(root: CacheRoot, file: Path | str, keys: Iterable[str] | None = None,
                   include_sources: bool = True) -> ExportSummary:
    """Write verified entries into a tar archive (``.tar.xz`` unless the name ends in ``.tar``,
    ``.tar.gz``/``.tgz`` or ``.tar.bz2``, case ignored; another format's suffix such as ``.zip``
    or ``.tar.zst`` is refused) that
    :func:`~evtc.compiler.archive_import.import_entries` reads on another machine.

    The archive holds ``evtc-cache.json`` (a manifest: format, ABI version, evtc version, one row
    per entry with its library's SHA-256) and ``kernels/<xx>/<key>/<toolchain>/`` with
    ``meta.json``, ``kernel.so`` and (with ``include_sources``) ``kernel.cu`` and ``build.log``.

    Args:
        root: the cache.
        file: the archive: a regular file (replaced atomically), ``-`` (standard output), a pipe
            or character device (streamed into), or a link to one of those (NOTE [Export
            targets]).
        keys: full keys or prefixes of at least 8 hex digits; None for every entry.
        include_sources: also carry ``kernel.cu`` and ``build.log``.

    Returns:
        An :class:`ExportSummary`.

    Raises:
        CacheError: a key prefix is too short or not hex, the target is refused (a folder, a
            block device, a socket, a terminal, a dangling link, a name with the suffix of a
            format export does not write), or the archive can't be written.
    """
    name = str(file)
    compression = _compression(name)  # (before the target is opened)
    summary = ExportSummary(Path(file))
    infos = _selected(root, keys, summary)
    out = _Out(name)
    summary.streamed = out.streamed
    try:
        with tarfile.open(fileobj=out, mode="w|" + compression) as tar:  # type: ignore[call-overload]
            _write_entries(tar, root, infos, summary, include_sources)
        out.commit()
    except OSError as e:
        out.abort()
        raise _write_error(name, e) from None
    except BaseException:
        out.abort()
        raise
    summary.bytes = out.bytes
    return summary


def _selected(root: CacheRoot, keys: Iterable[str] | None, summary: ExportSummary) -> list[EntryInfo]:
    """The entries of ``root`` whose key starts with one of ``keys`` (every entry for None);
    the keys that match none go to ``summary.missing``."""
    wanted = None
    if keys is not None:
        wanted = []
        for k in keys:
            if not re.fullmatch(r"[0-9a-f]{8,64}", k):
                raise CacheError(f"'{k}' is not a cache key or a prefix of at least 8 hex digits")
            wanted.append(k)
    infos = list_entries(root, verify=False)
    if wanted is not None:
        summary.missing = [k for k in wanted if not any(e.key.startswith(k) for e in infos)]
        infos = [e for e in infos if any(e.key.startswith(k) for k in wanted)]
    return infos


def _write_entries(tar: tarfile.TarFile, root: CacheRoot, infos: list[EntryInfo], summary: ExportSummary,
                   include_sources: bool) -> None:
    """Write the manifest, then the files of each entry that verifies, into ``tar``; refused
    entries go to ``summary.refused``, written ones to ``summary.exported``."""
    rows, chosen = [], []
    for info in infos:
        try:
            entry = verify_entry(root, info.key, info.toolchain_id)
        except EntryRejected as e:
            summary.refused.append((info, str(e)))
            continue
        chosen.append((info, entry))
        rows.append({"key": info.key, "toolchain_id": info.toolchain_id, "name": info.name, "arch": info.arch,
                     "library_sha256": entry.meta["library_sha256"]})
    manifest = {"format": EXPORT_FORMAT, "cache_format": CACHE_FORMAT, "abi_version": _abi_version(),
                "created": time.time(), "entries": rows}
    _add_bytes(tar, MANIFEST, (json.dumps(manifest, indent=1) + "\n").encode(), time.time())
    for info, entry in chosen:
        base = f"kernels/{info.key[:2]}/{info.key}/{info.toolchain_id}"
        lib = entry.library.read_bytes()
        if _sha256_bytes(lib) != entry.meta["library_sha256"]:
            summary.refused.append((info, "kernel.so changed while it was exported"))
            continue
        names = ["meta.json", "kernel.so"] + (["kernel.cu", "build.log"] if include_sources else [])
        for fname in names:
            if fname == "kernel.so":
                data: bytes | None = lib
            else:
                cap = MAX_META_BYTES if fname == "meta.json" else MAX_TEXT_BYTES
                data = _own_file(entry.path / fname, cap, root.shared)
                if data is None:
                    continue
            _add_bytes(tar, f"{base}/{fname}", data, info.created)
        summary.exported.append(info)


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m

