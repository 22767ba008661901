"""The kernel store: verified cache entries on disk (export and import: :mod:`evtc.compiler.archive`).

Input: a cache key, and for a new entry the library bytes, source, log and the key material.
Output: an :class:`Entry` whose library has been checked (owner, mode, SHA-256) and may be
dlopen'ed, or a refusal that names the entry and the reason.

This module is the store's one import path; the work is in four modules, in layers:
:mod:`~evtc.compiler.store_root` (the cache folder and its trust), :mod:`~evtc.compiler.store_meta`
(``meta.json``), :mod:`~evtc.compiler.store_entries` (verify, find, write, load) and
:mod:`~evtc.compiler.store_prune` (list, prune).

# NOTE [The verified cache]

Layout of a cache directory ``<root>``::

    <root>/kernels/<key[:2]>/<key>/<toolchain id>/{kernel.so, meta.json, kernel.cu, build.log}
    <root>/failed/<key>/{kernel.cu, build.log}     failed builds, named in the BuildError
    <root>/locks/<key>.lock                        one build of a key at a time
    <root>/tmp/, <root>/quarantine/                staging; refused entries moved aside
    <root>/headers/                                header-tree hashes (evtc.compiler.fingerprint)
    <root>/construct/                              the construct memo (evtc.pipeline.memo)

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

from evtc.compiler.store_entries import (ENTRY_FILES, KEY_RE, TOOLCHAIN_RE, Entry, find_entry, install_entry,
                                         keep_failed, key_lock, quarantine, staging_dir, toolchain_ids,
                                         verified_library_path, verify_entry)
from evtc.compiler.store_meta import (CACHE_FORMAT, MAX_META_BYTES, EntryRejected, canonical_json, check_meta,
                                      check_meta_shape, make_meta)
from evtc.compiler.store_prune import EntryInfo, PruneSummary, list_entries, prune
from evtc.compiler.store_root import _configured  # noqa: F401  (evtc.pipeline.memo reads it)
from evtc.compiler.store_root import CacheRoot, CacheWarning, cache_dir, cache_root

__all__ = [
    "CACHE_FORMAT", "ENTRY_FILES", "KEY_RE", "MAX_META_BYTES", "TOOLCHAIN_RE", "CacheRoot", "CacheWarning", "Entry",
    "EntryInfo", "EntryRejected", "PruneSummary", "cache_dir", "cache_root", "canonical_json", "check_meta",
    "check_meta_shape", "find_entry", "install_entry", "keep_failed", "key_lock", "list_entries", "make_meta", "prune",
    "quarantine", "staging_dir", "toolchain_ids", "verified_library_path", "verify_entry",
]
