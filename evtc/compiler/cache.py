"""The build cache: emitted sources compiled once, found again without a compiler.

Input: a ``.cu`` source text, an arch name (``"sm90"``, ``"sm80"``) and extra nvcc flags.
Output: an :class:`Artifact` (a verified ``kernel.so`` with its kept source, log and metadata).

# NOTE [The cache key]

The key is the SHA-256 of the *key material*, everything that decides the binary that can be
known without running a compiler:

* the cache format, the source text (its SHA-256), the arch;
* evtc's flags for the arch (:data:`~evtc.compiler.nvcc.BASE_FLAGS` and
  :data:`~evtc.compiler.nvcc.ARCH_FLAGS`), the extra flags, and ``NVCC_PREPEND_FLAGS`` /
  ``NVCC_APPEND_FLAGS`` (nvcc applies them);
* the contents of the header trees on the include path: CUTLASS's (the wheel or
  ``CUTLASS_PATH``, the whole tree), and of the evtc headers (``codegen_templates/include``)
  the source includes, directly or through each other: a header only conv kernels include does
  not invalidate every GEMM's build (:mod:`evtc.compiler.fingerprint` keeps both cheap).

Include paths are not in it (they differ between machines), their contents are. The *toolchain*
(nvcc release, host compiler and its version) is recorded in the entry and names its folder
(:mod:`evtc.compiler.store`): a lookup needs no nvcc, so a kernel built on a machine with nvcc is
found on a serving machine without one (``evtc cache export``/``import`` carry it). With nvcc
present, an entry built by the local toolchain is preferred; with ``EVTC_CACHE_TOOLCHAIN=strict``
only such an entry is used and a kernel built by another toolchain is rebuilt.

Builds are safe with concurrent processes: a per-key file lock makes one process build while the
others wait (at most ``EVTC_LOCK_TIMEOUT`` seconds, default the build time limit plus a minute,
then a :class:`~evtc.errors.CacheError`) and then load its result. nvcc runs in a staging folder
that is renamed into place, so a half-built entry is never visible. A failed build keeps its
source and log in ``<cache>/failed/<key>/`` and names them in the
:class:`~evtc.errors.BuildError`.

``EVTC_DUMP_DIR`` copies every artifact out (``<name>-<key12>.{cu,so,log,json}``);
``EVTC_OVERRIDE_DIR`` swaps in a hand-edited ``<name>.cu`` for the emitted source (Triton).

:func:`build_many` builds on any :class:`concurrent.futures.Executor`: by default a local thread
pool (one nvcc per core, each through :func:`build`); given an executor (Dask's
``client.get_executor()``, a process pool, Ray), each job runs :func:`compile_remote` there and
returns the library's bytes, which are verified and installed in the local cache.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import json
import os
import re
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from evtc import knobs
from evtc.compiler import fingerprint, nvcc, store, store_entries
from evtc.compiler.progress import BuildProgress
from evtc.compiler.store import CACHE_FORMAT, CacheRoot, cache_dir, cache_root, verified_library_path
from evtc.errors import BuildError, EvtcError, NoDeviceError

__all__ = [
    "Artifact", "BuildJob", "CACHE_FORMAT", "RemoteBuild", "build", "build_many", "cache_dir", "cache_key",
    "compile_remote", "default_workers", "kernel_key", "key_material", "lookup", "verified_library_path",
]


# --------------------------------------------------------------------------------------------
# Key material
# --------------------------------------------------------------------------------------------

def _arch_name(arch: Any) -> str:
    """``"sm90"`` from ``"sm90"`` or from a planner Target (old callers passed one)."""
    name = getattr(arch, "arch", arch)
    if not isinstance(name, str):
        raise BuildError(f"arch must be 'sm90' or 'sm80', not {arch!r}")
    nvcc.arch_flags(name)  # validates
    return name


def _memo_dir(root: CacheRoot | None) -> Path | None:
    if root is None or root.shared or not root.path.is_dir():
        return None
    return root.sub("headers")


def key_material(source: str, *, arch: str, extra_flags: Sequence[str] = (), root: CacheRoot | None = None) -> dict:
    """Everything that decides the binary and can be known without a compiler (see the NOTE).

    Args:
        source: the ``.cu`` text.
        arch: ``"sm90"`` or ``"sm80"``.
        extra_flags: extra nvcc flags.
        root: the cache whose ``headers/`` keeps header hashes between processes.

    Returns:
        A JSON-able dict; its canonical JSON's SHA-256 is the key.

    Raises:
        BuildError: unknown arch or no CUTLASS headers.
    """
    cutlass = nvcc.cutlass_include_dirs()
    own = nvcc.evtc_include_dir()
    memo = _memo_dir(root)
    edited = bool(knobs.cutlass_path.get())  # a checkout may be edited in place; the wheel is not
    try:
        headers = {"cutlass": fingerprint.tree_hash(cutlass[0], memo, watch_files=edited),
                   "cutlass_util": fingerprint.tree_hash(cutlass[1], memo, watch_files=edited)
                   if cutlass[1].is_dir() else None,
                   "evtc": fingerprint.included_hash(source, own) if own is not None else None}
    except OSError as e:
        raise BuildError(f"can't read the headers to hash them: {e}") from None
    material = {
        "format": CACHE_FORMAT,
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
        "arch": arch,
        "flags": [*nvcc.BASE_FLAGS, *nvcc.arch_flags(arch)],
        "extra_flags": list(extra_flags),
        "env_flags": nvcc.env_flags(),
        "headers": headers,
    }
    if nvcc.supports_split_build(source):  # two halves and a link (NOTE [Split builds])
        material["build"] = nvcc.SPLIT_BUILD
    return material


def _key_of(material: dict) -> str:
    return hashlib.sha256(store.canonical_json(material).encode()).hexdigest()


def kernel_key(source: str, *, arch: Any, extra_flags: Sequence[str] = ()) -> str:
    """The cache key of ``source`` built for ``arch`` (64 hex digits); needs no nvcc.

    Raises:
        BuildError: unknown arch or no CUTLASS headers.
    """
    return _key_of(key_material(source, arch=_arch_name(arch), extra_flags=extra_flags,
                                root=cache_root(create=False)))


def cache_key(source: str, target: Any, extra: Sequence[str] = ()) -> str:
    """Deprecated spelling of :func:`kernel_key` (``target``: an arch name or a Target)."""
    return kernel_key(source, arch=target, extra_flags=extra)


# --------------------------------------------------------------------------------------------
# Artifacts
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Artifact:
    """A built kernel in the cache.

    Attributes:
        key: the cache key (64 hex digits).
        library: path of ``kernel.so`` (load it through :meth:`verified_library_path`).
        source: path of the kept ``kernel.cu`` (may be absent for imported kernels).
        log: path of nvcc's ``build.log`` (may be absent for imported kernels).
        seconds: build time in seconds (0 if it came from the cache).
        cached: True if nothing was compiled.
        toolchain_id: the entry's toolchain folder (16 hex digits).
        name: the kernel's readable name.
        arch: ``"sm90"`` or ``"sm80"``.
    """

    key: str
    library: Path
    source: Path
    log: Path
    seconds: float
    cached: bool
    toolchain_id: str = ""
    name: str = "kernel"
    arch: str = ""

    @property
    def entry(self) -> Path:
        """The entry's folder."""
        return self.library.parent

    @property
    def meta(self) -> dict:
        """The entry's ``meta.json`` (key material, toolchain, library hash, command line)."""
        return json.loads((self.entry / "meta.json").read_text())

    def verified_library_path(self) -> Path:
        """Check the entry again and return the path to ``dlopen`` (see
        :func:`evtc.compiler.store.verified_library_path`).

        Raises:
            CacheError: the entry fails verification now.
        """
        return verified_library_path(self.library)


def _artifact(entry: store.Entry, cached: bool, seconds: float = 0.0) -> Artifact:
    meta = entry.meta
    return Artifact(entry.key, entry.library, entry.path / "kernel.cu", entry.path / "build.log", seconds, cached,
                    entry.toolchain_id, str(meta.get("name", "kernel")), str(meta.get("arch", "")))


def _safe_name(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:80] or "kernel"


def _override(name: str, source: str) -> str:
    d = knobs.override_dir.get()
    if d:
        p = Path(d) / f"{_safe_name(name)}.cu"
        if p.is_file():
            return p.read_text()
    return source


def _dump(name: str, art: Artifact) -> None:
    d = knobs.dump_dir.get()
    if not d:
        return
    out = Path(d)
    out.mkdir(parents=True, exist_ok=True)
    stem = f"{_safe_name(name)}-{art.key[:12]}"
    for src, ext in ((art.source, "cu"), (art.library, "so"), (art.log, "log"), (art.entry / "meta.json", "json")):
        if src.exists():
            shutil.copyfile(src, out / f"{stem}.{ext}")


def _strict() -> bool:
    return knobs.cache_toolchain.get() == "strict"


def _lock_timeout(build_timeout: float | None) -> float:
    value = knobs.lock_timeout.get()
    if value is not None:
        return value
    return (build_timeout if build_timeout is not None else nvcc.default_timeout()) + 60.0


def _local_toolchain_id(extra_flags: Sequence[str]) -> Callable[[], str]:
    return lambda: nvcc.toolchain(extra_flags).id


def _find(root: CacheRoot, key: str, extra_flags: Sequence[str], *, prefer: str | None = None,
          on_refused: str, warn: bool = True) -> tuple[store.Entry | None, list[tuple[str, str]]]:
    if not root.path.is_dir():
        return None, []
    only = None
    if _strict() and nvcc.find_nvcc() is not None:
        only = prefer or nvcc.toolchain(extra_flags).id
    return store.find_entry(root, key, prefer=prefer, only=only, local_toolchain=_local_toolchain_id(extra_flags),
                            on_refused=on_refused, warn=warn)


# --------------------------------------------------------------------------------------------
# Building one kernel
# --------------------------------------------------------------------------------------------

def lookup(source: str, arch: Any = None, *, name: str = "kernel", extra_flags: Sequence[str] = (),
           extra: Sequence[str] | None = None) -> Artifact | None:
    """The cached, verified Artifact of ``source``, or None. Never compiles, needs no nvcc and
    writes nothing (a read-only cache works); an entry that fails verification is skipped with
    a :class:`~evtc.compiler.store.CacheWarning`.

    Raises:
        BuildError: unknown arch or no CUTLASS headers.
        CacheError: the cache directory is unusable (see :func:`~evtc.compiler.store.cache_root`).
    """
    arch = _arch_name(arch)
    flags = tuple(extra_flags) + tuple(extra or ())
    source = _override(name, source)
    root = cache_root(create=False)
    key = _key_of(key_material(source, arch=arch, extra_flags=flags, root=root))
    entry, _ = _find(root, key, flags, on_refused="not loaded")
    return _artifact(entry, cached=True) if entry is not None else None


def build(source: str, arch: Any = None, *, name: str = "kernel", extra_flags: Sequence[str] = (),
          timeout: float | None = None, extra: Sequence[str] | None = None, progress: bool | None = None) -> Artifact:
    """Compile ``source`` for ``arch`` unless the cache has it.

    Args:
        source: the ``.cu`` text.
        arch: ``"sm90"`` or ``"sm80"`` (a planner Target is still accepted).
        name: a readable name for logs, dumps and messages (the epilogue's).
        extra_flags: extra nvcc flags (part of the key). ``extra`` is the old name.
        timeout: seconds before nvcc is killed (default ``EVTC_NVCC_TIMEOUT`` or 600).
        progress: show a progress bar if the build takes over a second (default: when stderr
            is a terminal; see :mod:`evtc.compiler.progress`).

    Returns:
        The verified Artifact.

    Raises:
        BuildError: nvcc failed or timed out (source and log kept and named).
        NoDeviceError: the kernel is not cached and there is no nvcc (anchor ``no-nvcc``).
        CacheError: the cache can't be written, or another build of this kernel held its lock
            longer than ``EVTC_LOCK_TIMEOUT``.
    """
    arch = _arch_name(arch)
    knobs.check(knobs.BUILD_KNOBS)  # (EVTC_LOCK_TIMEOUT=x was read after nvcc --version, EVTC_NVCC_TIMEOUT at nvcc)
    flags = tuple(extra_flags) + tuple(extra or ())
    source = _override(name, source)
    root = cache_root(create=False)
    material = key_material(source, arch=arch, extra_flags=flags, root=root)
    key = _key_of(material)
    entry, _ = _find(root, key, flags, on_refused="it will be moved aside and rebuilt")
    if entry is not None:
        art = _artifact(entry, cached=True)
        _dump(name, art)
        return art
    compiler = nvcc.find_nvcc()
    if compiler is None:
        raise NoDeviceError(
            f"kernel {name} ({arch}, key {key[:16]}...) is not in the kernel cache {root.path}, and nvcc was not found",
            anchor="no-nvcc",
            hint="install the CUDA toolkit or set CUDA_HOME; or build it on a machine with nvcc and bring it here with "
                 "`evtc cache export FILE` there and `evtc cache import FILE` here")
    root = cache_root(create=True)
    if _memo_dir(root) is not None:  # the cache exists now: keep header hashes for the next process
        material = key_material(source, arch=arch, extra_flags=flags, root=root)
    tc = nvcc.toolchain(flags)
    with BuildProgress(1, f"building {name} ({arch})", enabled=progress if progress is not None else None) as bar:
        lock = store.key_lock(root, key, _lock_timeout(timeout), name)
        try:
            # another process may have built it while we waited for the lock
            entry, refused = _find(root, key, flags, prefer=tc.id, on_refused="", warn=False)
            if entry is not None:
                art = _artifact(entry, cached=True)
            else:
                for tcid, reason in refused:
                    store.quarantine(root, root.entry_dir(key, tcid), reason)
                art = _compile_into(root, key, material, tc, source, name, arch, flags, timeout, compiler)
        finally:
            lock.release()
        bar.advance(name)
    _dump(name, art)
    return art


def _compile_into(root: CacheRoot, key: str, material: dict, tc: nvcc.Toolchain, source: str, name: str, arch: str,
                  flags: Sequence[str], timeout: float | None, compiler: Path) -> Artifact:
    stage = store.staging_dir(root, key)
    try:
        store_entries._write(stage / "kernel.cu", source.encode(), root.file_mode)
        t0 = time.perf_counter()
        try:
            cmd = nvcc.compile_shared(stage / "kernel.cu", stage / "kernel.so", arch, stage / "build.log",
                                      extra_flags=flags, timeout=timeout, nvcc=compiler)
        except BuildError as e:
            failed = store.keep_failed(root, key, None, None, staged=stage)
            e.hint = (e.hint or "").replace(str(stage), str(failed))
            e.message = e.message.replace("kernel.cu", f"kernel {name} ({arch})", 1)
            e.args = (e.message,)
            raise
        seconds = time.perf_counter() - t0
        library = (stage / "kernel.so").read_bytes()
        os.unlink(stage / "kernel.so")
        meta = store.make_meta(root, key=key, material=material, toolchain=tc.to_json(), library=library, name=name,
                               arch=arch, command=cmd, seconds=seconds)
        entry = store.install_entry(root, meta, library, staged=stage)
    except BaseException:
        shutil.rmtree(stage, ignore_errors=True)
        raise
    return _artifact(entry, cached=False, seconds=seconds)


# --------------------------------------------------------------------------------------------
# Building many kernels, here or on any executor
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class BuildJob:
    """One kernel to build.

    Attributes:
        source: the ``.cu`` text.
        arch: ``"sm90"`` or ``"sm80"``.
        name: a readable name.
        extra_flags: extra nvcc flags.
    """

    source: str
    arch: str
    name: str = "kernel"
    extra_flags: tuple[str, ...] = ()


@dataclasses.dataclass
class RemoteBuild:
    """What :func:`compile_remote` sends back from an executor's worker.

    Attributes:
        key: the key the worker computed (must equal the caller's).
        material: the worker's key material (names what differs when the keys don't match).
        toolchain: the worker's toolchain (:class:`~evtc.compiler.nvcc.Toolchain` as JSON).
        library: the ``kernel.so`` bytes, or None when the build failed.
        library_sha256: their SHA-256, computed on the worker.
        log: nvcc's log.
        command: the command line.
        seconds: build time on the worker.
        host: the worker's host name.
        error: the failure's message, or None.
        error_hint: the failure's hint, or None.
    """

    key: str
    material: dict
    toolchain: dict | None
    library: bytes | None
    library_sha256: str
    log: str
    command: list[str]
    seconds: float
    host: str
    error: str | None = None
    error_hint: str | None = None


def compile_remote(job: BuildJob, timeout: float | None = None) -> RemoteBuild:
    """Build one job in a private temporary folder and return the library's bytes (the function
    :func:`build_many` submits to an executor; it runs on the worker and touches no cache).

    Args:
        job: the kernel.
        timeout: nvcc's time limit in seconds.

    Returns:
        A :class:`RemoteBuild`; a failed build is returned (``error`` set), not raised.
    """
    import socket

    host = socket.gethostname()
    material = key_material(job.source, arch=job.arch, extra_flags=job.extra_flags)
    key = _key_of(material)
    try:
        tc = nvcc.toolchain(job.extra_flags)
    except EvtcError as e:
        return RemoteBuild(key, material, None, None, "", "", [], 0.0, host, e.message, e.hint)
    with tempfile.TemporaryDirectory(prefix="evtc-build-") as d:
        src, lib, log = Path(d) / "kernel.cu", Path(d) / "kernel.so", Path(d) / "build.log"
        src.write_text(job.source)
        t0 = time.perf_counter()
        try:
            cmd = nvcc.compile_shared(src, lib, job.arch, log, extra_flags=job.extra_flags, timeout=timeout)
        except EvtcError as e:
            text = log.read_text(errors="replace") if log.exists() else ""
            return RemoteBuild(key, material, tc.to_json(), None, "", text, [], time.perf_counter() - t0, host,
                               e.message, None)
        data = lib.read_bytes()
        return RemoteBuild(key, material, tc.to_json(), data, hashlib.sha256(data).hexdigest(),
                           log.read_text(errors="replace"), cmd, time.perf_counter() - t0, host)


def _insert_remote(root: CacheRoot, job: BuildJob, material: dict, key: str, rb: RemoteBuild,
                   timeout: float | None) -> Artifact:
    """Verify a worker's result and install it in the local cache."""
    if rb.key != key:
        differ = sorted(k for k in set(material) | set(rb.material) if material.get(k) != rb.material.get(k))
        raise BuildError(f"the worker on {rb.host} computed another key for kernel {job.name} ({job.arch}): its "
                         f"{', '.join(differ)} differ from this machine's",
                         hint="give the workers the same evtc, nvidia-cutlass (or CUTLASS_PATH contents) and NVCC_*_FLAGS")
    if rb.error is not None or rb.library is None:
        failed = store.keep_failed(root, key, job.source, rb.log)
        raise BuildError(f"{rb.error or 'the build failed'} (kernel {job.name}, {job.arch}, built on {rb.host})",
                         hint=(f"{rb.error_hint}\n  " if rb.error_hint else "")
                         + f"the source and the full log are kept:\n    source: {failed / 'kernel.cu'}\n"
                           f"    log:    {failed / 'build.log'}")
    if hashlib.sha256(rb.library).hexdigest() != rb.library_sha256:
        raise BuildError(f"the library of kernel {job.name} from {rb.host} was corrupted on its way here (SHA-256 differs)")
    assert rb.toolchain is not None
    meta = store.make_meta(root, key=key, material=material, toolchain=rb.toolchain, library=rb.library, name=job.name,
                           arch=job.arch, command=rb.command, seconds=rb.seconds, built_on=rb.host)
    lock = store.key_lock(root, key, _lock_timeout(timeout), job.name)
    try:
        entry = store.install_entry(root, meta, rb.library, source=job.source, log=rb.log)
    finally:
        lock.release()
    return _artifact(entry, cached=False, seconds=rb.seconds)


def _as_job(j: Any, extra: Sequence[str]) -> BuildJob:
    if isinstance(j, BuildJob):
        return dataclasses.replace(j, extra_flags=tuple(j.extra_flags) + tuple(extra)) if extra else j
    if isinstance(j, (tuple, list)) and 2 <= len(j) <= 4:
        source, arch, *rest = j
        name = rest[0] if rest else "kernel"
        flags = tuple(rest[1]) if len(rest) > 1 else ()
        return BuildJob(source, _arch_name(arch), str(name), flags + tuple(extra))
    raise BuildError(f"a build job is a BuildJob or (source, arch, name[, extra_flags]), not {type(j).__name__}")


#: Memory one sm90 build holds at its peak (bytes): a split build's device half (cicc, about 3.6 GB
#: for a GEMM) and host half (about 1.4 GB) at once, measured with /usr/bin/time on the CPU machine.
BUILD_PEAK_BYTES = 5 << 30


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes, or None where there is none (not Linux)."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def default_workers() -> int:
    """Local parallel builds when the caller names none: the CPU count, but no more than the
    available memory holds at :data:`BUILD_PEAK_BYTES` each (a 16 GB laptop with 8 cores builds
    two at a time instead of swapping), at least 1."""
    cpus = max(1, os.cpu_count() or 1)
    avail = _available_memory()
    return cpus if avail is None else max(1, min(cpus, avail // BUILD_PEAK_BYTES))


def build_many(jobs: Sequence[Any], *, executor: concurrent.futures.Executor | None = None, workers: int | None = None,
               on_done: Callable[[int, Artifact | EvtcError], None] | None = None, timeout: float | None = None,
               extra: Sequence[str] = (), progress: bool | None = None) -> list[Artifact | EvtcError]:
    """Build several kernels in parallel; cached ones are not rebuilt.

    Args:
        jobs: :class:`BuildJob` s, or ``(source, arch, name[, extra_flags])`` tuples (``arch``
            may be a planner Target, as old callers passed).
        executor: where to build. None: a local thread pool, one nvcc per worker, each job
            through :func:`build` (locks, concurrent processes). Any other
            :class:`concurrent.futures.Executor` (``distributed.Client.get_executor()``, a
            ``ProcessPoolExecutor``, Ray through ``ObjectRef.future()``): each cache miss runs
            :func:`compile_remote` there (the worker needs evtc, nvcc and the same headers), and
            the returned bytes are verified and installed here.
        workers: local parallel builds (default: :func:`default_workers`: the CPU count, fewer
            where memory is short). Ignored with ``executor``.
        on_done: called with (index, result) as each job finishes.
        timeout: nvcc's time limit per kernel in seconds.
        extra: extra nvcc flags for every job (old spelling).
        progress: show a progress bar after a second (default: when stderr is a terminal).

    Returns:
        One Artifact or error (BuildError, NoDeviceError, CacheError) per job, in order; errors
        are returned, not raised.

    Raises:
        EvtcError: a build knob (:data:`evtc.knobs.BUILD_KNOBS`) holds a value it doesn't take,
            before any job starts.
    """
    knobs.check(knobs.BUILD_KNOBS)  # raised once, not returned per job after each nvcc
    norm = [_as_job(j, extra) for j in jobs]
    results: list[Any] = [None] * len(norm)

    def finish(i: int, res: Any, bar: BuildProgress) -> None:
        results[i] = res
        bar.advance(norm[i].name, ok=not isinstance(res, BaseException))
        if on_done is not None:
            on_done(i, res)

    with BuildProgress(len(norm), "building", enabled=progress) as bar:
        if executor is None:
            nworkers = workers or default_workers()
            with concurrent.futures.ThreadPoolExecutor(max_workers=nworkers) as pool:
                futs = {pool.submit(build, j.source, j.arch, name=j.name, extra_flags=j.extra_flags, timeout=timeout,
                                    progress=False): i for i, j in enumerate(norm)}
                for fut in concurrent.futures.as_completed(futs):
                    try:
                        res: Any = fut.result()
                    except EvtcError as e:
                        res = e
                    finish(futs[fut], res, bar)
            return results
        _remote(norm, executor, timeout, bar, finish)
    return results


def _remote(norm: list[BuildJob], executor: concurrent.futures.Executor, timeout: float | None, bar: BuildProgress,
            finish: Callable[[int, Any, BuildProgress], None]) -> None:
    root = cache_root(create=True)
    pending: dict[str, list[int]] = {}
    materials: dict[str, dict] = {}
    for i, j in enumerate(norm):
        try:
            src = _override(j.name, j.source)
            material = key_material(src, arch=j.arch, extra_flags=j.extra_flags, root=root)
            key = _key_of(material)
            entry, _ = _find(root, key, j.extra_flags, on_refused="it will be rebuilt")
        except EvtcError as e:
            finish(i, e, bar)
            continue
        if entry is not None:
            finish(i, _artifact(entry, cached=True), bar)
            continue
        if key not in pending:
            norm[i] = dataclasses.replace(j, source=src)
            materials[key] = material
        pending.setdefault(key, []).append(i)
    futs = {}
    for key, idx in pending.items():
        futs[executor.submit(compile_remote, norm[idx[0]], timeout)] = key
    for fut in concurrent.futures.as_completed(futs):
        key = futs[fut]
        idx = pending[key]
        job = norm[idx[0]]
        try:
            rb = fut.result()
            res: Any = _insert_remote(root, job, materials[key], key, rb, timeout)
        except EvtcError as e:
            res = e
        except Exception as e:  # the executor's own failure (a lost worker, a pickling error)
            res = BuildError(f"the executor failed to build kernel {job.name} ({job.arch}): {type(e).__name__}: {e}")
        for i in idx:
            finish(i, res, bar)
