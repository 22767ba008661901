"""The ``meta.json`` of a cache entry: made for a new entry, checked for a found one.

Input: a parsed ``meta.json`` and the key and toolchain folder it sits under, or for a new entry
the key material, toolchain and library bytes.
Output: the checked dict (or :class:`EntryRejected` with the reason), or a new, signed
``meta.json`` dict (NOTE [The verified cache] in evtc/compiler/store.py).
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import re
import time
from typing import TYPE_CHECKING

from evtc.compiler.trust import Untrusted

if TYPE_CHECKING:
    from evtc.compiler.store_root import CacheRoot

__all__ = ["CACHE_FORMAT", "EntryRejected", "MAX_META_BYTES", "canonical_json", "check_meta", "check_meta_shape",
           "make_meta"]

#: Version of the entry layout and of ``meta.json`` (part of every key).
CACHE_FORMAT = 2


#: An entry failed verification (NOTE [Trusted files] in evtc/compiler/trust.py, :func:`check_meta`);
#: ``str()`` is the reason. The same class as :class:`evtc.compiler.trust.Untrusted`.
EntryRejected = Untrusted


def canonical_json(obj) -> str:
    """JSON with sorted keys and no spaces: the bytes that are hashed and signed."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))


def _sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


#: Largest ``meta.json`` read (an entry's is about 2 kB).
MAX_META_BYTES = 1 << 20


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
