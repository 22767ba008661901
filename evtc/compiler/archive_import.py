"""Cache import: an archive of :mod:`evtc.compiler.archive_export` read back into a cache.

Input: a cache and an archive (a file, ``-`` for standard input, a pipe or a FIFO) read as
untrusted data within :class:`ImportLimits`. Output: the entries that pass their checks
(:func:`evtc.compiler.store_meta.check_meta` and the library's SHA-256) added to the cache, and
an :class:`ImportSummary` of those imported, present and refused.

# NOTE [Import limits]

``import_entries`` reads an archive as untrusted data, once, front to back (so ``-``, a pipe or a
FIFO work like a file), and holds at most one entry's files at a time:

* the input is decompressed here (xz, gzip or bzip2, told by their magic bytes; anything else is
  read as a plain tar) and every byte counts against :attr:`ImportLimits.total_bytes` (16 GiB,
  ``--max-bytes``), the compressed ones too, so an endless stream (``yes |``, ``/dev/zero``,
  endless empty gzip members) or a decompression bomb ends in a :class:`CacheError` naming the
  limit;
* ``evtc-cache.json`` comes first (at most 16 MiB, JSON nested at most 32 deep) and every field
  of it is checked before any other member is read;
* every other member must be a regular file of an entry the manifest lists, no bigger than its
  kind allows (``meta.json`` 1 MiB, ``kernel.so`` 256 MiB, ``kernel.cu`` and ``build.log``
  64 MiB), with a tar header (pax records included) of at most 64 KiB, checked before its bytes
  are read; a member over a limit is a :class:`CacheError` naming the limit;
* an entry's ``meta.json`` comes first and is checked (shape, key, toolchain, the manifest's
  SHA-256) before its other files are read; ``kernel.so`` must have the size ``meta.json``
  records; the files of a refused entry are skipped, not held.

Source: issue 37 (an endless stream never returned; an archive of 13 MB with three 1 GiB members
held 3.1 GB before it was refused; four manifest shapes raised TypeError or RecursionError).
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import lzma
import os
import re
import stat
import tarfile
import zlib
from pathlib import Path
from typing import Any, BinaryIO

from evtc.compiler import trust
from evtc.compiler.archive_export import EXPORT_FORMAT, MANIFEST, MAX_TEXT_BYTES, _kind
from evtc.compiler.store_entries import KEY_RE, TOOLCHAIN_RE, install_entry, key_lock, verify_entry
from evtc.compiler.store_meta import MAX_META_BYTES, EntryRejected, _json_type, _sha256_bytes, _signature, check_meta
from evtc.compiler.store_root import CacheRoot
from evtc.errors import CacheError

__all__ = ["ImportLimits", "ImportSummary", "MAX_IMPORT_FILE_BYTES", "import_entries"]

_MEMBER_RE = re.compile(r"kernels/([0-9a-f]{2})/([0-9a-f]{64})/([0-9a-f]{16})/(meta\.json|kernel\.so|kernel\.cu|build\.log)")
_DIR_RE = re.compile(r"kernels(/[0-9a-f]{2}(/[0-9a-f]{64}(/[0-9a-f]{16})?)?)?/?")
#: The largest kernel.so an import accepts by default (:attr:`ImportLimits.library_bytes`; a kernel
#: library is a few MB).
MAX_IMPORT_FILE_BYTES = 256 << 20


def _size(n: int) -> str:
    for unit, div in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= div:
            return f"{n / div:g} {unit}"
    return f"{n} bytes"


@dataclasses.dataclass
class ImportSummary:
    """What :func:`import_entries` did.

    Attributes:
        file: the archive.
        imported: (key, toolchain id, name) of each entry added.
        present: entries already in the cache (verified).
        refused: (key, toolchain id, name, reason) of each entry that failed its checks.
    """

    file: Path
    imported: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    present: list[tuple[str, str, str]] = dataclasses.field(default_factory=list)
    refused: list[tuple[str, str, str, str]] = dataclasses.field(default_factory=list)


@dataclasses.dataclass(frozen=True)
class ImportLimits:
    """The caps of :func:`import_entries` (NOTE [Import limits]); tests lower them.

    Attributes:
        total_bytes: the whole archive, uncompressed (and its compressed bytes).
        manifest_bytes: ``evtc-cache.json``.
        meta_bytes: one ``meta.json``.
        library_bytes: one ``kernel.so``.
        text_bytes: one ``kernel.cu`` or ``build.log``.
        header_bytes: one member's tar header, its pax or GNU long-name records included.
        entries: rows of the manifest.
    """

    total_bytes: int = 16 << 30
    manifest_bytes: int = 16 << 20
    meta_bytes: int = MAX_META_BYTES
    library_bytes: int = MAX_IMPORT_FILE_BYTES
    text_bytes: int = MAX_TEXT_BYTES
    header_bytes: int = 64 << 10
    entries: int = 100_000

    def member_cap(self, fname: str) -> int:
        return {"meta.json": self.meta_bytes, "kernel.so": self.library_bytes}.get(fname, self.text_bytes)


#: What tarfile reads past a member or a header before it stops (two records and a block's padding).
_SLACK = 2 * tarfile.RECORDSIZE + tarfile.BLOCKSIZE
_MAGIC = {b"\xfd7zXZ\x00": "xz", b"\x1f\x8b": "gz", b"BZh": "bz2"}


class _Counted:
    """A stream whose bytes count against a cap (NOTE [Import limits]); a read past the cap, or
    past the window :meth:`allow` opened, raises a :class:`CacheError` naming the limit. Bytes
    put back with ``unread`` are served again without counting."""

    def __init__(self, inner, cap: int, file: str, what: str, shown: int | None = None) -> None:
        self.inner, self.cap, self.left, self.file, self.what = inner, shown or cap, cap, file, what
        self.window: int | None = None
        self.window_error = ""
        self.unread = b""

    def allow(self, n: int, error: str) -> None:
        """Let the next ``n`` bytes through; more raise ``CacheError(error)``."""
        self.window, self.window_error = n, error

    def readable(self) -> bool:
        return True

    def read(self, n: int = -1) -> bytes:
        if n is None or n < 0:
            n = 1 << 16
        if self.unread:
            data, self.unread = self.unread[:n], self.unread[n:]
            return data
        data = self.inner.read(n)
        self.left -= len(data)
        if self.left < 0:
            raise CacheError(f"{self.file}: the archive is larger than the import limit of {_size(self.cap)} "
                             f"({self.what})", hint="an archive of more kernels than that: raise the limit with "
                                                    "`evtc cache import --max-bytes SIZE`")
        if self.window is not None:
            self.window -= len(data)
            if self.window < 0:
                raise CacheError(f"{self.file}: {self.window_error}")
        return data


def _open_source(file: str) -> BinaryIO:
    """The archive's bytes: ``-`` is standard input; a file, FIFO or character device is opened
    (through links: the user named it); a folder, block device or socket is refused."""
    if file == "-":
        try:
            return os.fdopen(os.dup(0), "rb")
        except OSError as e:
            raise CacheError(f"can't read the cache archive from standard input: {e.strerror}") from None
    try:
        st = os.stat(file)
        if not (stat.S_ISREG(st.st_mode) or stat.S_ISFIFO(st.st_mode) or stat.S_ISCHR(st.st_mode)):
            raise CacheError(f"can't read the cache archive {file}: it is {_kind(st)}",
                             hint="name the archive file, a pipe, or - for standard input")
        return open(file, "rb")
    except OSError as e:
        raise CacheError(f"can't read the cache archive {file}: {e.strerror or e}") from None


def _decompressed(source: BinaryIO, file: str, limits: ImportLimits) -> _Counted:
    """The uncompressed bytes of ``source``, both sides counted (NOTE [Import limits])."""
    raw = _Counted(source, limits.total_bytes + limits.total_bytes // 8 + (1 << 20), file, "compressed",
                   shown=limits.total_bytes)  # (xz of random bytes is a little larger than its input)
    head = b""
    while len(head) < 6:
        chunk = raw.read(6 - len(head))
        if not chunk:
            break
        head += chunk
    raw.unread = head
    comp = next((c for magic, c in _MAGIC.items() if head.startswith(magic)), None)
    dec: Any = raw
    if comp == "xz":
        dec = lzma.LZMAFile(raw, "rb", format=lzma.FORMAT_XZ)  # not FORMAT_AUTO: zeros are an endless .lzma
    elif comp == "gz":
        dec = gzip.GzipFile(fileobj=raw, mode="rb")  # type: ignore[arg-type]
    elif comp == "bz2":
        dec = bz2.BZ2File(raw, "rb")
    return _Counted(dec, limits.total_bytes, file, "uncompressed")


def _member_file(m: tarfile.TarInfo) -> bool:
    return m.type in (tarfile.REGTYPE, tarfile.AREGTYPE)


def _read_member(tar: tarfile.TarFile, m: tarfile.TarInfo) -> bytes:
    f = tar.extractfile(m)
    assert f is not None
    return f.read()


def _skip_member(tar: tarfile.TarFile, m: tarfile.TarInfo) -> None:
    f = tar.extractfile(m)
    assert f is not None
    while f.read(1 << 20):
        pass


def _check_manifest(manifest: Any, file: str, limits: ImportLimits) -> dict[tuple[str, str], dict]:
    """Rows of a manifest by (key, toolchain id), every field checked (NOTE [Untrusted JSON]).

    Raises:
        CacheError: another format, or a field of the wrong type or form (named).
    """
    where = f"{file}: {MANIFEST}"
    if not isinstance(manifest, dict):
        raise CacheError(f"{where} is {_json_type(manifest)}, not a JSON object: {file} is not an evtc cache export")
    fmt = manifest.get("format")
    if fmt != EXPORT_FORMAT:
        raise CacheError(f"{file} is export format {str(fmt)[:40]!r}; this evtc reads {EXPORT_FORMAT}")
    for name, ok in (("cache_format", int), ("abi_version", int), ("created", (int, float))):
        v = manifest.get(name, 0)
        if not isinstance(v, ok) or isinstance(v, bool):
            raise CacheError(f"{where}: field '{name}' is {_json_type(v)}, not a number")
    entries = manifest.get("entries")
    if not isinstance(entries, list):
        raise CacheError(f"{where}: field 'entries' is {_json_type(entries)}, not a list")
    if len(entries) > limits.entries:
        raise CacheError(f"{where} lists {len(entries)} entries, more than the import limit of {limits.entries}")
    rows: dict[tuple[str, str], dict] = {}
    for i, row in enumerate(entries):
        at = f"{where}: entries[{i}]"
        if not isinstance(row, dict):
            raise CacheError(f"{at} is {_json_type(row)}, not an object")
        for name, form, what in (("key", KEY_RE, "64 hex digits"), ("toolchain_id", TOOLCHAIN_RE, "16 hex digits"),
                                 ("library_sha256", KEY_RE, "64 hex digits")):
            v = row.get(name)
            if not isinstance(v, str):
                raise CacheError(f"{at}.{name} is {_json_type(v)}, not a string of {what}")
            if not form.fullmatch(v):
                raise CacheError(f"{at}.{name} is not {what}")
        for name in ("name", "arch"):
            if not isinstance(row.get(name, ""), str):
                raise CacheError(f"{at}.{name} is {_json_type(row[name])}, not a string")
        ident = (row["key"], row["toolchain_id"])
        if ident in rows:
            raise CacheError(f"{at} lists entry {ident[0][:16]}.../{ident[1]} a second time")
        rows[ident] = row
    return rows


@dataclasses.dataclass
class _Pending:
    """The entry whose members are being read."""

    key: str
    toolchain_id: str
    name: str
    meta: dict | None = None
    reason: str | None = None
    files: dict[str, bytes] = dataclasses.field(default_factory=dict)
    seen: set[str] = dataclasses.field(default_factory=set)


def import_entries(root: CacheRoot, file: Path | str, lock_timeout: float = 600.0,
                   limits: ImportLimits | None = None) -> ImportSummary:
    """Add the entries of an archive written by :func:`export_entries`, each checked first.

    The archive is read as data, front to back, never extracted, within limits (NOTE [Import
    limits]): its manifest must come first and be this export format with every field of its
    type; every other member must be a regular file at
    ``kernels/<xx>/<key>/<toolchain>/{meta.json,kernel.so,kernel.cu,build.log}`` of an entry the
    manifest lists. Each entry's ``meta.json`` (first) must be this cache format and ABI version,
    its key material must hash to its key, and its ``kernel.so`` must have the recorded size and
    SHA-256; a refused entry is reported and skipped. Entries are installed like builds (atomic
    rename, private modes, signed when ``EVTC_CACHE_SECRET`` is set).

    Args:
        root: the cache (created if missing).
        file: the archive: a file, a pipe or FIFO, or ``-`` for standard input.
        lock_timeout: seconds to wait for a key's lock.
        limits: the caps (default :class:`ImportLimits`).

    Returns:
        An :class:`ImportSummary`.

    Raises:
        CacheError: the file can't be read, is not a tar archive, is not an evtc cache export
            (no manifest, another format, a field of the wrong type, a member outside the layout
            or not listed, a link), or passes a limit (the message names it).
    """
    name = str(file)
    limits = limits or ImportLimits()
    summary = ImportSummary(Path(file))
    source = _open_source(name)
    try:
        with source:
            _import(root, name, _decompressed(source, name, limits), limits, summary, lock_timeout)
    except (tarfile.TarError, EOFError, OSError, lzma.LZMAError, zlib.error) as e:
        raise CacheError(f"can't read the cache archive {name}: {e}") from None
    except RecursionError:  # tarfile reads a chain of pax headers recursively (bounded by header_bytes anyway)
        raise CacheError(f"can't read the cache archive {name}: its tar headers are chained too deep") from None
    return summary


def _import(root: CacheRoot, file: str, stream: _Counted, limits: ImportLimits, summary: ImportSummary,
            lock_timeout: float) -> None:
    header_error = f"a tar header is larger than the import limit of {_size(limits.header_bytes)}"
    stream.allow(limits.header_bytes + _SLACK, header_error)
    try:
        tar = tarfile.open(fileobj=stream, mode="r|")  # type: ignore[call-overload]
    except tarfile.ReadError as e:
        raise CacheError(f"can't read the cache archive {file}: it is not a tar archive ({e})") from None
    with tar:
        m = tar.next()
        if m is None:
            raise CacheError(f"{file} is empty")
        if m.name != MANIFEST or not _member_file(m):
            raise CacheError(f"{file} is not an evtc cache export: it does not start with {MANIFEST}",
                             hint="write archives with `evtc cache export FILE` (archives of the old "
                                  "benchmarks/pack_cache.py must be rebuilt)")
        if m.size > limits.manifest_bytes:
            raise CacheError(f"{file}: {MANIFEST} is {m.size} bytes, more than the import limit of "
                             f"{_size(limits.manifest_bytes)}")
        stream.allow(m.size + _SLACK, f"{MANIFEST} is longer than its tar header says")
        try:
            manifest = trust.load_json(_read_member(tar, m), f"{file}: {MANIFEST}")
        except trust.Untrusted as e:
            raise CacheError(str(e)) from None
        rows = _check_manifest(manifest, file, limits)
        most = 8 * len(rows) + 300  # 4 files and 3 folders per entry, kernels/ and its 256 prefixes
        count = 1
        pending: _Pending | None = None
        done: set[tuple[str, str]] = set()
        while True:
            stream.allow(limits.header_bytes + _SLACK, header_error)
            tar.members.clear()  # tarfile keeps every member it read: not needed here
            m = tar.next()
            if m is None:
                break
            count += 1
            if count > most:
                raise CacheError(f"{file} has more members than the {len(rows)} entries {MANIFEST} lists can have")
            if m.isdir() and _DIR_RE.fullmatch(m.name):
                continue
            match = _MEMBER_RE.fullmatch(m.name)
            if match is None or not _member_file(m):
                raise CacheError(f"{file} is not an evtc cache export: unexpected member {m.name[:300]!r}"
                                 + ("" if _member_file(m) else " (not a regular file)"))
            xx, key, tc, fname = match.groups()
            if key[:2] != xx:
                raise CacheError(f"{file}: member {m.name!r} is under the wrong prefix")
            row = rows.get((key, tc))
            if row is None:
                raise CacheError(f"{file}: member {m.name!r} belongs to an entry {MANIFEST} does not list")
            cap = limits.member_cap(fname)
            if m.size > cap:
                raise CacheError(f"{file}: member {m.name!r} is {m.size} bytes, more than the import limit of "
                                 f"{_size(cap)} for a {fname}")
            if pending is None or (pending.key, pending.toolchain_id) != (key, tc):
                _finish(root, pending, summary, lock_timeout)
                if (key, tc) in done:
                    raise CacheError(f"{file}: the files of entry {key[:16]}.../{tc} are not together")
                pending = _Pending(key, tc, row.get("name", "?"))
                done.add((key, tc))
            if fname in pending.seen:
                raise CacheError(f"{file}: {m.name!r} appears twice")
            pending.seen.add(fname)
            stream.allow(m.size + _SLACK, f"member {m.name!r} is longer than its tar header says")
            if pending.reason is None and fname != "meta.json" and pending.meta is None:
                pending.reason = f"{fname} comes before meta.json in the archive"
            if pending.reason is None and fname == "kernel.so" and m.size != pending.meta["library_bytes"]:  # type: ignore[index]
                pending.reason = (f"kernel.so has {m.size} bytes, meta.json records "
                                  f"{pending.meta['library_bytes']} (truncated or replaced)")  # type: ignore[index]
            if pending.reason is not None:
                _skip_member(tar, m)  # a refused entry's files are not held
                continue
            data = _read_member(tar, m)
            if fname == "meta.json":
                _check_entry_meta(pending, data, row)
            else:
                pending.files[fname] = data
        _finish(root, pending, summary, lock_timeout)


def _check_entry_meta(pending: _Pending, data: bytes, row: dict) -> None:
    try:
        meta = trust.load_json(data, "meta.json")
        if isinstance(meta, dict) and isinstance(meta.get("name"), str):
            pending.name = meta["name"]
        check_meta(meta, pending.key, pending.toolchain_id, None)  # the exporting machine's signature is not ours to check
        if meta["library_sha256"] != row["library_sha256"]:
            raise EntryRejected("the entry is not listed in the archive's manifest with this library")
    except EntryRejected as e:
        pending.reason = str(e)
        return
    pending.meta = meta


def _finish(root: CacheRoot, pending: _Pending | None, summary: ImportSummary, lock_timeout: float) -> None:
    """Install the entry just read, or report why it is refused."""
    if pending is None:
        return
    key, tc, name, meta, files = pending.key, pending.toolchain_id, pending.name, pending.meta, pending.files
    reason = pending.reason
    if reason is None and meta is None:
        reason = "the archive lacks its meta.json"
    elif reason is None and "kernel.so" not in files:
        reason = "the archive lacks its kernel.so"
    elif reason is None and _sha256_bytes(files["kernel.so"]) != meta["library_sha256"]:  # type: ignore[index]
        reason = "the SHA-256 of kernel.so is not the one meta.json records (corrupted or replaced)"
    if reason is not None:
        summary.refused.append((key, tc, name, reason))
        return
    assert meta is not None
    lock = key_lock(root, key, lock_timeout, name)
    try:
        if os.path.lexists(root.entry_dir(key, tc)):
            try:
                verify_entry(root, key, tc)
                summary.present.append((key, tc, name))
                return
            except EntryRejected:
                pass  # install_entry quarantines it
        meta.pop("signature", None)
        if root.secret is not None:
            meta["signature"] = _signature(root.secret, meta)
        src = files.get("kernel.cu")
        log = files.get("build.log")
        install_entry(root, meta, files["kernel.so"], source=src.decode(errors="replace") if src else None,
                      log=log.decode(errors="replace") if log else None)
        summary.imported.append((key, tc, name))
    finally:
        lock.release()

