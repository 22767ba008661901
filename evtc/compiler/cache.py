"""The build cache: emitted sources compiled once, keyed by a hash of everything that matters.

Input: a ``.cu`` source text, a Target and compile flags. Output: an :class:`Artifact` (the
``.so`` and its kept source, log and metadata).

Key: SHA-256 of (source text, gencode, extra flags, nvcc release, CUTLASS version, evtc's
cache format). Layout: ``<cache>/<key[:2]>/<key>/{kernel.cu, kernel.so, build.log, meta.json}``.
``<cache>`` is ``$EVTC_CACHE_DIR``, else ``$XDG_CACHE_HOME/evtc``, else ``~/.cache/evtc``.

Builds are safe with concurrent processes: a per-key file lock makes one process build while
the others wait; the build happens in a temporary folder beside the final one and is renamed
into place (atomic on POSIX), so a half-built entry is never visible. A failed build keeps its
source and log in ``<cache>/failed/<key>/`` and names them in the :class:`BuildError`.

``EVTC_DUMP_DIR`` copies every artifact out (``<name>-<key12>.{cu,so,log,json}``);
``EVTC_OVERRIDE_DIR`` swaps in a hand-edited ``<name>.cu`` for the emitted source (Triton).
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Callable, Sequence

from filelock import FileLock

from evtc.compiler import nvcc
from evtc.errors import BuildError
from evtc.plan.target import Target

CACHE_FORMAT = "1"


def cache_dir() -> Path:
    root = os.environ.get("EVTC_CACHE_DIR")
    if root:
        p = Path(root)
    else:
        xdg = os.environ.get("XDG_CACHE_HOME")
        p = (Path(xdg) if xdg else Path.home() / ".cache") / "evtc"
    p.mkdir(parents=True, exist_ok=True)
    return p


@dataclasses.dataclass(frozen=True)
class Artifact:
    """A built kernel.

    Attributes:
        key: the cache key (hex SHA-256).
        library: path of the shared library.
        source: path of the kept source.
        log: path of nvcc's log.
        seconds: build time (0 if it came from the cache).
        cached: True if nothing was compiled.
    """

    key: str
    library: Path
    source: Path
    log: Path
    seconds: float
    cached: bool


def cache_key(source: str, target: Target, extra: Sequence[str] = ()) -> str:
    h = hashlib.sha256()
    for part in (CACHE_FORMAT, source, " ".join(target.gencode), " ".join(extra), nvcc.nvcc_version(),
                 nvcc.cutlass_version()):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


def _override(name: str, source: str) -> str:
    d = os.environ.get("EVTC_OVERRIDE_DIR")
    if d:
        p = Path(d) / f"{name}.cu"
        if p.is_file():
            return p.read_text()
    return source


def _dump(name: str, art: Artifact) -> None:
    d = os.environ.get("EVTC_DUMP_DIR")
    if not d:
        return
    out = Path(d)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{name}-{art.key[:12]}"
    for src, ext in ((art.source, "cu"), (art.library, "so"), (art.log, "log"), (art.library.parent / "meta.json", "json")):
        if src.exists():
            shutil.copyfile(src, out / f"{stem}.{ext}")


def build(source: str, target: Target, *, name: str = "kernel", extra: Sequence[str] = (),
          timeout: float | None = None) -> Artifact:
    """Compile ``source`` for ``target`` unless the cache has it.

    Args:
        source: the ``.cu`` text.
        target: sm90 or sm80 Target (its gencode flags).
        name: a readable name for logs and dumps (the epilogue's).
        extra: extra nvcc flags (part of the key).
        timeout: seconds before nvcc is killed.

    Returns:
        The Artifact.

    Raises:
        BuildError: nvcc failed (source and log kept and named).
        NoDeviceError: no nvcc.
    """
    source = _override(name, source)
    key = cache_key(source, target, extra)
    root = cache_dir()
    final = root / key[:2] / key
    lib = final / "kernel.so"
    if lib.exists():
        art = Artifact(key, lib, final / "kernel.cu", final / "build.log", 0.0, True)
        _dump(name, art)
        return art
    final.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(final) + ".lock"):
        if lib.exists():  # another process built it while we waited
            art = Artifact(key, lib, final / "kernel.cu", final / "build.log", 0.0, True)
            _dump(name, art)
            return art
        tmp = Path(tempfile.mkdtemp(prefix=f".{key[:12]}-", dir=final.parent))
        src = tmp / "kernel.cu"
        src.write_text(source)
        t0 = time.perf_counter()
        try:
            nvcc.compile_shared(src, tmp / "kernel.so", target.gencode, tmp / "build.log", tuple(extra), timeout)
        except BuildError as e:
            failed = root / "failed" / key
            if failed.exists():
                shutil.rmtree(failed, ignore_errors=True)
            failed.parent.mkdir(parents=True, exist_ok=True)
            os.replace(tmp, failed)
            e.hint = (f"the source and the full log are kept:\n    source: {failed / 'kernel.cu'}\n"
                      f"    log:    {failed / 'build.log'}")
            raise
        seconds = time.perf_counter() - t0
        (tmp / "meta.json").write_text(json.dumps({
            "name": name, "key": key, "gencode": list(target.gencode), "extra": list(extra),
            "nvcc": nvcc.nvcc_version(), "cutlass": nvcc.cutlass_version(), "seconds": round(seconds, 1),
        }, indent=2))
        os.replace(tmp, final)
    art = Artifact(key, lib, final / "kernel.cu", final / "build.log", seconds, False)
    _dump(name, art)
    return art


def lookup(source: str, target: Target, *, name: str = "kernel", extra: Sequence[str] = ()) -> Artifact | None:
    """The cached Artifact for ``source``, or None (never compiles)."""
    key = cache_key(_override(name, source), target, extra)
    final = cache_dir() / key[:2] / key
    if (final / "kernel.so").exists():
        return Artifact(key, final / "kernel.so", final / "kernel.cu", final / "build.log", 0.0, True)
    return None


def build_many(jobs: Sequence[tuple[str, Target, str]], *, workers: int | None = None,
               on_done: Callable[[int, Artifact | BuildError], None] | None = None,
               extra: Sequence[str] = ()) -> list[Artifact | BuildError]:
    """Build several (source, target, name) jobs in parallel, one nvcc per worker.

    Args:
        jobs: the sources to build.
        workers: parallel nvcc processes (default: the CPU count; each sm90 build needs about
            3.6 GB of memory, so lower it on small machines).
        on_done: called with (index, result) as each job finishes (progress display).

    Returns:
        One Artifact or BuildError per job, in order (errors are returned, not raised).
    """
    workers = workers or max(1, os.cpu_count() or 1)
    results: list[Artifact | BuildError] = [None] * len(jobs)  # type: ignore[list-item]
    with concurrent.futures.ThreadPoolExecutor(max_workers=workers) as pool:
        futs = {pool.submit(build, src, tgt, name=nm, extra=extra): i for i, (src, tgt, nm) in enumerate(jobs)}
        for fut in concurrent.futures.as_completed(futs):
            i = futs[fut]
            try:
                results[i] = fut.result()
            except BuildError as e:
                results[i] = e
            if on_done is not None:
                on_done(i, results[i])
    return results
