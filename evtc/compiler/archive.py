"""Cache archives: verified entries written into a tar file and read back on another machine.

Input: a cache and (for export) a selection of keys, or (for import) an archive. Output: an
archive of ``evtc cache export``'s format, or entries added to the cache after their checks
(:func:`evtc.compiler.store.check_meta` and the library's SHA-256), like Triton's and Inductor's
cache artifacts. ``evtc cache export`` / ``evtc cache import`` call these.
"""

from __future__ import annotations

import dataclasses
import hashlib
import io
import json
import lzma
import os
import re
import tarfile
import tempfile
import time
import zlib
from pathlib import Path
from typing import Iterable

from evtc.compiler.store import (
    CACHE_FORMAT,
    CacheRoot,
    EntryInfo,
    EntryRejected,
    _abi_version,
    _signature,
    check_meta,
    install_entry,
    key_lock,
    list_entries,
    verify_entry,
)
from evtc.errors import CacheError

__all__ = ["EXPORT_FORMAT", "ExportSummary", "ImportSummary", "MANIFEST", "export_entries", "import_entries"]

#: ``format`` of an export archive's ``evtc-cache.json``.
EXPORT_FORMAT = "evtc-cache-export/1"
MANIFEST = "evtc-cache.json"
_MEMBER_RE = re.compile(r"kernels/([0-9a-f]{2})/([0-9a-f]{64})/([0-9a-f]{16})/(meta\.json|kernel\.so|kernel\.cu|build\.log)")
#: Largest file an import accepts (a kernel library is a few MB).
MAX_IMPORT_FILE_BYTES = 1 << 30


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


# --------------------------------------------------------------------------------------------

@dataclasses.dataclass
class ExportSummary:
    """What :func:`export_entries` wrote.

    Attributes:
        file: the archive.
        exported: the entries in it.
        refused: entries left out because they failed verification, with the reason.
        missing: requested keys (or prefixes) with no entry.
    """

    file: Path
    exported: list[EntryInfo] = dataclasses.field(default_factory=list)
    refused: list[tuple[EntryInfo, str]] = dataclasses.field(default_factory=list)
    missing: list[str] = dataclasses.field(default_factory=list)


def _tar_mode(path: Path, write: bool) -> str:
    name = path.name
    if name.endswith((".tar.gz", ".tgz")):
        comp = "gz"
    elif name.endswith(".tar"):
        comp = ""
    elif name.endswith((".tar.bz2", ".tbz2")):
        comp = "bz2"
    else:
        comp = "xz"
    return ("w:" + comp) if write else "r:*"


def _add_bytes(tar: tarfile.TarFile, name: str, data: bytes, mtime: float) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mtime = int(mtime)
    info.mode = 0o644
    info.uname = info.gname = ""
    tar.addfile(info, io.BytesIO(data))


def export_entries(root: CacheRoot, file: Path | str, keys: Iterable[str] | None = None,
                   include_sources: bool = True) -> ExportSummary:
    """Write verified entries into a tar archive (``.tar.xz`` unless the name ends in ``.tar``,
    ``.tar.gz``/``.tgz`` or ``.tar.bz2``) that :func:`import_entries` reads on another machine.

    The archive holds ``evtc-cache.json`` (a manifest: format, ABI version, evtc version, one row
    per entry with its library's SHA-256) and ``kernels/<xx>/<key>/<toolchain>/`` with
    ``meta.json``, ``kernel.so`` and (with ``include_sources``) ``kernel.cu`` and ``build.log``.

    Args:
        root: the cache.
        file: the archive to write (replaced atomically).
        keys: full keys or prefixes of at least 8 hex digits; None for every entry.
        include_sources: also carry ``kernel.cu`` and ``build.log``.

    Returns:
        An :class:`ExportSummary`.

    Raises:
        CacheError: a key prefix is too short or not hex, or the archive can't be written.
    """
    file = Path(file)
    wanted = None
    if keys is not None:
        wanted = []
        for k in keys:
            if not re.fullmatch(r"[0-9a-f]{8,64}", k):
                raise CacheError(f"'{k}' is not a cache key or a prefix of at least 8 hex digits")
            wanted.append(k)
    summary = ExportSummary(file)
    infos = list_entries(root, verify=False)
    if wanted is not None:
        summary.missing = [k for k in wanted if not any(e.key.startswith(k) for e in infos)]
        infos = [e for e in infos if any(e.key.startswith(k) for k in wanted)]
    try:
        file.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{file.name}.", dir=file.parent)
        os.close(fd)
    except OSError as e:
        raise CacheError(f"can't write {file}: {e.strerror}") from None
    rows = []
    try:
        with tarfile.open(tmp_name, _tar_mode(file, write=True)) as tar:
            chosen = []
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
                    p = entry.path / fname
                    if fname == "kernel.so":
                        data = lib
                    elif p.is_file() and not p.is_symlink():
                        data = p.read_bytes()
                    else:
                        continue
                    _add_bytes(tar, f"{base}/{fname}", data, info.created)
                summary.exported.append(info)
        os.chmod(tmp_name, 0o644 & ~_umask())
        os.replace(tmp_name, file)
    except BaseException:
        if os.path.exists(tmp_name):
            os.unlink(tmp_name)
        raise
    return summary


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


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


def _check_imported(files: dict[str, bytes], key: str, tc: str, rows: dict) -> dict:
    if "meta.json" not in files or "kernel.so" not in files:
        raise EntryRejected("the archive lacks its " + ("meta.json" if "meta.json" not in files else "kernel.so"))
    try:
        meta = json.loads(files["meta.json"])
    except ValueError as e:
        raise EntryRejected(f"meta.json is not JSON: {e}") from None
    check_meta(meta, key, tc, None)  # the exporting machine's signature is not ours to check
    lib = files["kernel.so"]
    if len(lib) != meta.get("library_bytes") or _sha256_bytes(lib) != meta["library_sha256"]:
        raise EntryRejected("the SHA-256 of kernel.so is not the one meta.json records (corrupted or replaced)")
    row = rows.get((key, tc))
    if row is None or row.get("library_sha256") != meta["library_sha256"]:
        raise EntryRejected("the entry is not listed in the archive's manifest with this library")
    return meta


def import_entries(root: CacheRoot, file: Path | str, lock_timeout: float = 600.0) -> ImportSummary:
    """Add the entries of an archive written by :func:`export_entries`, each checked first.

    The archive is read as data, never extracted: its manifest must come first and be this
    export format; every other member must be a regular file at
    ``kernels/<xx>/<key>/<toolchain>/{meta.json,kernel.so,kernel.cu,build.log}``. Each entry's
    ``meta.json`` must be this cache format and ABI version, its key material must hash to its
    key, and its ``kernel.so`` must have the recorded SHA-256; a refused entry is reported and
    skipped. Entries are installed like builds (atomic rename, private modes, signed when
    ``EVTC_CACHE_SECRET`` is set).

    Args:
        root: the cache (created if missing).
        file: the archive.
        lock_timeout: seconds to wait for a key's lock.

    Returns:
        An :class:`ImportSummary`.

    Raises:
        CacheError: the file can't be read, is not a tar archive, or is not an evtc cache export
            (no manifest, another format, a member outside the layout, a link).
    """
    file = Path(file)
    summary = ImportSummary(file)
    try:
        tar = tarfile.open(file, _tar_mode(file, write=False))
    except (OSError, tarfile.TarError) as e:
        raise CacheError(f"can't read the cache archive {file}: {e}") from None
    with tar:
        rows: dict = {}
        pending: tuple[str, str] | None = None
        files: dict[str, bytes] = {}
        done: set[tuple[str, str]] = set()

        def finish() -> None:
            if pending is None:
                return
            key, tc = pending
            name = "?"
            try:
                meta = _check_imported(files, key, tc, rows)
                name = str(meta.get("name", "?"))
            except EntryRejected as e:
                try:
                    name = str(json.loads(files.get("meta.json", b"{}")).get("name", "?"))
                except (ValueError, AttributeError):
                    pass
                summary.refused.append((key, tc, name, str(e)))
                return
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

        try:
            first = True
            for m in tar:
                if first:
                    first = False
                    if m.name != MANIFEST or not m.isreg():
                        raise CacheError(f"{file} is not an evtc cache export: it does not start with {MANIFEST}",
                                         hint="write archives with `evtc cache export FILE` (archives of the old "
                                              "benchmarks/pack_cache.py must be rebuilt)")
                    try:
                        manifest = json.loads(tar.extractfile(m).read(MAX_IMPORT_FILE_BYTES))  # type: ignore[union-attr]
                    except ValueError as e:
                        raise CacheError(f"{file}: {MANIFEST} is not JSON: {e}") from None
                    if not isinstance(manifest, dict) or manifest.get("format") != EXPORT_FORMAT:
                        raise CacheError(f"{file} is export format {manifest.get('format') if isinstance(manifest, dict) else '?'!r}; "
                                         f"this evtc reads {EXPORT_FORMAT}")
                    rows = {(r.get("key"), r.get("toolchain_id")): r for r in manifest.get("entries", [])
                            if isinstance(r, dict)}
                    continue
                if m.isdir() and re.fullmatch(r"kernels(/[0-9a-f]{2}(/[0-9a-f]{64}(/[0-9a-f]{16})?)?)?/?", m.name):
                    continue
                match = _MEMBER_RE.fullmatch(m.name)
                if match is None or not m.isreg():
                    raise CacheError(f"{file} is not an evtc cache export: unexpected member {m.name!r}"
                                     + ("" if m.isreg() else " (not a regular file)"))
                xx, key, tc, fname = match.groups()
                if key[:2] != xx:
                    raise CacheError(f"{file}: member {m.name!r} is under the wrong prefix")
                if m.size > MAX_IMPORT_FILE_BYTES:
                    raise CacheError(f"{file}: member {m.name!r} is {m.size} bytes")
                if pending != (key, tc):
                    finish()
                    if (key, tc) in done:
                        raise CacheError(f"{file}: the files of entry {key[:16]}.../{tc} are not together")
                    pending, files = (key, tc), {}
                    done.add((key, tc))
                if fname in files:
                    raise CacheError(f"{file}: {m.name!r} appears twice")
                files[fname] = tar.extractfile(m).read()  # type: ignore[union-attr]
            finish()
        except (tarfile.TarError, EOFError, OSError, lzma.LZMAError, zlib.error) as e:
            raise CacheError(f"can't read the cache archive {file}: {e}") from None
        if first:
            raise CacheError(f"{file} is empty")
    return summary
