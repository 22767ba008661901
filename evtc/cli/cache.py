"""``evtc cache``: list, prune, export and import the kernel cache.

Input: the cache directory (``EVTC_CACHE_DIR``, ``EVTC_SHARED_CACHE`` or ``--dir``) and, for
``export``/``import``, an archive. Output: tables on the terminal, an archive, or new entries.

    evtc cache list                         # every kernel: name, arch, toolchain, size, age, status
    evtc cache export kernels.tar.xz        # every verified kernel (or --key PREFIX ...)
    evtc cache import kernels.tar.xz        # on the machine without nvcc: checked, then added
    evtc cache export - | ssh gpu evtc cache import -     # - is standard output / input
    evtc cache prune --older-than 30d       # or --max-size 5G, --bad, --all (and --dry-run)

Registered in :mod:`evtc.cli` as the ``cache`` command group. Errors are evtc errors (exit status
2); ``import`` exits with 1 when it refused an entry.
"""

from __future__ import annotations

import json
import os
import re
import sys
import time
import warnings

import click

from evtc import knobs
from evtc.errors import EvtcError

__all__ = ["cache", "parse_duration", "parse_size"]

_UNITS_S = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_UNITS_B = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}
#: the largest size parse_size reads (2**63: a file offset)
_MAX_BYTES = 1 << 63


def parse_duration(text: str) -> float:
    """Seconds in ``30d``, ``12h``, ``90m``, ``45s``, ``2w`` (a bare number is days).

    Raises:
        click.BadParameter: not a duration.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*", text.lower())
    if not m:
        raise click.BadParameter(f"'{text}' is not a duration like 30d, 12h, 90m")
    seconds = float(m.group(1)) * _UNITS_S[m.group(2) or "d"]
    if seconds == float("inf"):
        raise click.BadParameter(f"'{text:.40}{'...' if len(text) > 40 else ''}' is longer than any cache has existed")
    return seconds


def parse_size(text: str) -> int:
    """Bytes in ``5G``, ``500M``, ``1.5GB``, ``200k``, ``1000`` (powers of 1024).

    Raises:
        click.BadParameter: not a size.
    """
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([kmgt]?)i?b?\s*", text.lower())
    if not m:
        raise click.BadParameter(f"'{text}' is not a size like 5G, 500M")
    size = float(m.group(1)) * _UNITS_B[m.group(2)]
    if not size < _MAX_BYTES:  # (an 80-digit size was float infinity: int() raised OverflowError)
        raise click.BadParameter(f"'{text:.40}{'...' if len(text) > 40 else ''}' is larger than any cache (at most "
                                 f"{_MAX_BYTES >> 60} EB)")
    return int(size)


def _size(n: int) -> str:
    for unit, div in (("GB", 1 << 30), ("MB", 1 << 20), ("kB", 1 << 10)):
        if n >= div:
            return f"{n / div:.1f} {unit}"
    return f"{n} B"


def _count(n: int) -> str:
    return f"{n} kernel" + ("" if n == 1 else "s")


def _age(t: float) -> str:
    s = max(0.0, time.time() - t)
    for unit, div in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= div:
            return f"{s / div:.0f}{unit} ago"
    return f"{s:.0f}s ago"


def _console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=True)


class _CacheGroup(click.Group):
    """Turns evtc errors into a message and exit status 2, and cache warnings into lines."""

    def invoke(self, ctx):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                return super().invoke(ctx)
            except EvtcError as e:
                if knobs.traceback.get_or_default() == "full":
                    raise
                click.echo(f"evtc: {type(e).__name__}: {e}", err=True)
                sys.exit(2)
            finally:
                for w in caught:
                    click.echo(f"warning: {w.message}", err=True)


@click.group(cls=_CacheGroup)
@click.option("--dir", "cache_dir", type=click.Path(file_okay=False), default=None,
              help="the cache directory (default: EVTC_SHARED_CACHE, EVTC_CACHE_DIR, ~/.cache/evtc)")
def cache(cache_dir):
    """List, prune, export and import built kernels (the kernel cache).

    A kernel built where nvcc is can be used where it is not: `evtc cache export FILE` there,
    `evtc cache import FILE` here. Every entry is verified (owner, mode, SHA-256, ABI version)
    before it is loaded or imported.
    """
    if cache_dir:
        knobs.cache_dir.set(cache_dir)
        knobs.shared_cache.set(None)


def _root(create: bool = False):
    from evtc.compiler.store import cache_root

    return cache_root(create=create)


@cache.command("list")
@click.option("--json", "as_json", is_flag=True, help="print JSON instead of a table")
@click.option("--no-verify", is_flag=True, help="don't hash the libraries (faster for big caches)")
def list_cmd(as_json, no_verify):
    """List the cached kernels, each verified (status: ok, or why it would be refused)."""
    from evtc.compiler.store import list_entries

    root = _root()
    entries = list_entries(root, verify=not no_verify) if root.path.is_dir() else []
    if as_json:
        click.echo(json.dumps({"cache": str(root.path), "shared": root.shared, "entries": [
            {"key": e.key, "toolchain_id": e.toolchain_id, "name": e.name, "arch": e.arch, "nvcc": e.nvcc,
             "bytes": e.bytes, "created": e.created, "last_used": e.last_used, "path": str(e.path),
             "ok": e.problem is None if not no_verify else None, "problem": e.problem} for e in entries]}, indent=1))
        return
    from rich.table import Table

    con = _console()
    mode = oct(os.stat(root.path).st_mode & 0o7777)[2:] if root.path.is_dir() else "missing"
    kind = "shared" if root.shared else "private"
    con.print(f"[bold]kernel cache[/bold] {root.path} ({kind}, mode {mode}): {_count(len(entries))}, "
              f"{_size(sum(e.bytes for e in entries))}")
    if not entries:
        return
    t = Table(show_edge=False, pad_edge=False)
    for col in ("key", "name", "arch", "nvcc", "size", "built", "used", "status"):
        t.add_column(col, overflow="fold")
    for e in entries:
        nvcc_short = re.sub(r"^cuda_([\d.]+)\..*", r"\1", e.nvcc)
        status = "[green]ok[/green]" if e.problem is None else f"[red]refused[/red]: {e.problem}"
        if no_verify and e.problem is None:
            status = "-"
        t.add_row(e.key[:12], e.name, e.arch, f"{nvcc_short} {e.toolchain_id[:6]}", _size(e.bytes), _age(e.created),
                  _age(e.last_used), status)
    con.print(t)
    others = [(n, len(list(root.sub(n).iterdir()))) for n in ("failed", "quarantine") if root.sub(n).is_dir()]
    others = [(n, c) for n, c in others if c]
    if others:
        con.print("also: " + ", ".join(f"{c} in {n}/" for n, c in others) + " (evtc cache prune --bad removes them)")


@cache.command()
@click.option("--all", "everything", is_flag=True, help="remove everything in the cache")
@click.option("--older-than", "older", default=None, help="remove kernels not used for this long (30d, 12h)")
@click.option("--max-size", "max_size", default=None, help="then remove least recently used kernels down to this (5G)")
@click.option("--bad", is_flag=True, help="remove refused entries, failed builds, the quarantine and leftovers")
@click.option("--dry-run", is_flag=True, help="only say what would be removed")
def prune(everything, older, max_size, bad, dry_run):
    """Remove kernels from the cache: all, by age, down to a size, or those that fail verification."""
    from evtc.compiler.store import prune as do_prune

    if not (everything or older or max_size or bad):
        raise click.UsageError("say what to remove: --all, --older-than AGE, --max-size SIZE or --bad")
    # (read before the cache is looked for: a malformed size or age is an error with or without one)
    older_than_s = parse_duration(older) if older else None
    max_bytes = parse_size(max_size) if max_size else None
    root = _root()
    if not root.path.is_dir():
        click.echo(f"no kernel cache at {root.path}")
        return
    s = do_prune(root, everything=everything, older_than_s=older_than_s, max_bytes=max_bytes, bad=bad,
                 dry_run=dry_run)
    con = _console()
    verb = "would remove" if dry_run else "removed"
    for e, why in s.removed:
        con.print(f"{verb} {e.key[:12]} {e.name} ({e.arch}, {_size(e.bytes)}): {why}")
    for p in s.other:
        con.print(f"{verb} {p}")
    con.print(f"[bold]{verb} {_count(len(s.removed))}[/bold] and {len(s.other)} other items, {_size(s.freed_bytes)}; "
              f"{_count(s.kept)} kept")


@cache.command()
@click.argument("file", type=click.Path(dir_okay=False, allow_dash=True))
@click.option("--key", "keys", multiple=True, help="only this key (or a prefix of 8+ hex digits); repeatable")
@click.option("--no-sources", is_flag=True, help="leave out kernel.cu and build.log")
def export(file, keys, no_sources):
    """Write verified kernels into an archive FILE (.tar.xz, .tar.gz or .tar) for `evtc cache import`.

    FILE may be - (standard output), a pipe or a character device: the archive is streamed into
    it. A regular file is replaced atomically; a link is written through, never replaced.
    """
    from evtc.compiler.archive import export_entries

    root = _root()
    s = export_entries(root, file, keys=list(keys) or None, include_sources=not no_sources)
    con = _console()
    if s.streamed:  # the archive went to stdout, a pipe or a device: the report must not join it
        from rich.console import Console

        con = Console(highlight=False, soft_wrap=True, stderr=True)
    for e, why in s.refused:
        con.print(f"[red]left out[/red] {e.key[:12]} {e.name}: {why}")
    for k in s.missing:
        con.print(f"[yellow]not in the cache[/yellow]: {k}")
    con.print(f"[bold]exported {_count(len(s.exported))}[/bold] into {file} ({_size(s.bytes)})"
              + (f"; {len(s.refused)} refused" if s.refused else "") + (f"; {len(s.missing)} missing" if s.missing else ""))
    if s.missing or s.refused:
        sys.exit(1)


@cache.command("import")
@click.argument("files", nargs=-1, required=True, type=click.Path(exists=True, dir_okay=False, allow_dash=True))
@click.option("--max-bytes", "max_bytes", default=None,
              help="refuse an archive larger than this, uncompressed (default 16G)")
def import_cmd(files, max_bytes):
    """Add the kernels of archives written by `evtc cache export`, each checked first (format, ABI
    version, key, SHA-256 of the library). FILES may be - (standard input) or pipes. Exits with 1
    if any entry was refused."""
    from evtc.compiler.archive import ImportLimits, import_entries

    limits = ImportLimits(total_bytes=parse_size(max_bytes)) if max_bytes else ImportLimits()
    root = _root(create=True)
    con = _console()
    refused = 0
    for f in files:
        s = import_entries(root, f, limits=limits)
        for key, tc, name, why in s.refused:
            con.print(f"[red]refused[/red] {key[:12]} {name} ({tc}): {why}")
        refused += len(s.refused)
        con.print(f"[bold]{f}[/bold]: imported {len(s.imported)}, already present {len(s.present)}, "
                  f"refused {len(s.refused)} (cache {root.path})")
    if refused:
        sys.exit(1)
