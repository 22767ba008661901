"""nvcc: the toolchain, the one nvcc command line per arch, and a bounded compile.

Input: a ``.cu`` file and an arch name (``"sm90"``, ``"sm80"``). Output: a shared library, or a
:class:`~evtc.errors.BuildError` that names the kept source and the compiler's log.

The flags are this module's (:data:`BASE_FLAGS`, :data:`ARCH_FLAGS`), never the planner's:
:func:`nvcc_command` is the single place that says how evtc compiles a kernel; ``evtc emit
--print-nvcc`` prints it and a CI test compares the README's line with it.

Include directories, in search order:

1. evtc's own C++ headers, ``codegen_templates/include`` (shipped in the wheel as
   ``evtc/_data/codegen_templates/include``; emitted sources ``#include <evtc/...hpp>``);
2. the CUTLASS headers of the ``nvidia-cutlass`` wheel (``cutlass_library/source/include`` and
   ``source/tools/util/include``), or of a CUTLASS checkout named by ``CUTLASS_PATH``.

nvcc is ``$EVTC_NVCC`` (a path; ``EVTC_NVCC=none`` means "there is none"), else
``$CUDA_HOME/bin/nvcc`` (or ``$CUDA_PATH``), else the first ``nvcc`` on ``PATH``, else
``/usr/local/cuda/bin/nvcc``. nvcc runs in its own process group with a time limit
(``EVTC_NVCC_TIMEOUT``, default 600 s); on timeout the whole group (nvcc, cicc, ptxas, the host
compiler) is killed, and on Linux the group also dies with the evtc process that started it,
even one killed with SIGKILL (NOTE [Compilers die with evtc]), so nothing outlives the build.
"""

from __future__ import annotations

import dataclasses
import errno
import functools
import hashlib
import importlib.util
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from evtc import knobs
from evtc.errors import BuildError, NoDeviceError

__all__ = [
    "ARCH_FLAGS", "BASE_FLAGS", "DEFAULT_TIMEOUT_S", "Toolchain", "arch_flags", "compile_shared", "cutlass_include_dirs",
    "cutlass_version", "default_timeout", "env_flags", "evtc_include_dir", "find_nvcc", "include_dirs", "nvcc_command",
    "nvcc_version", "require_nvcc", "spawn", "split_build_commands", "supports_split_build", "toolchain",
]

#: Flags of every evtc build, in order. ``-DNDEBUG`` matters: without it the library keeps
#: ``__assertfail`` and ptxas serializes wgmma across the call (warning C7510).
BASE_FLAGS: tuple[str, ...] = (
    "-std=c++17",
    "-O3",
    "-DNDEBUG",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-fvisibility=hidden",
    "-shared",
    "-lineinfo",
)

#: Per-arch code generation. sm90 needs the arch-specific ``sm_90a`` target for WGMMA, TMA
#: multicast and ``setmaxnreg`` (PTX ISA, "Architecture-specific features"); sm80 embeds
#: ``compute_80`` PTX beside the ``sm_80`` cubin so the driver can JIT it for newer GPUs.
ARCH_FLAGS: dict[str, tuple[str, ...]] = {
    "sm90": ("-gencode=arch=compute_90a,code=sm_90a",),
    "sm80": ("-gencode=arch=compute_80,code=[sm_80,compute_80]",),
}

#: Seconds before a build is killed when neither the caller nor ``EVTC_NVCC_TIMEOUT`` says.
DEFAULT_TIMEOUT_S = 600.0

#: Environment variables nvcc itself reads as extra flags (CUDA Compiler Driver manual,
#: "NVCC_PREPEND_FLAGS and NVCC_APPEND_FLAGS"); they change the binary, so they are key material.
ENV_FLAG_VARS = ("NVCC_PREPEND_FLAGS", "NVCC_APPEND_FLAGS")


def arch_flags(arch: str) -> tuple[str, ...]:
    """The ``-gencode`` flags of ``arch``.

    Raises:
        BuildError: ``arch`` is not one evtc builds for.
    """
    try:
        return ARCH_FLAGS[arch]
    except KeyError:
        raise BuildError(f"no nvcc flags for arch '{arch}'", hint=f"evtc builds for {', '.join(ARCH_FLAGS)}") from None


def default_timeout() -> float:
    """The build time limit in seconds: ``$EVTC_NVCC_TIMEOUT``, else :data:`DEFAULT_TIMEOUT_S`.

    Raises:
        BuildError: ``EVTC_NVCC_TIMEOUT`` is not a positive number.
    """
    value = knobs.nvcc_timeout.get()
    return DEFAULT_TIMEOUT_S if value is None else value


def find_nvcc() -> Path | None:
    """Path of nvcc (see the module docstring for the search order), or None if there is none."""
    explicit = knobs.nvcc.raw()
    if explicit is not None:
        if explicit.strip().lower() in ("", "none"):
            return None
        p = Path(explicit)
        return p if p.is_file() and os.access(p, os.X_OK) else None
    candidates = []
    home = knobs.cuda_home.get() or knobs.cuda_path.get()
    if home:
        candidates.append(Path(home) / "bin" / "nvcc")
    which = shutil.which("nvcc")
    if which:
        candidates.append(Path(which))
    candidates.append(Path("/usr/local/cuda/bin/nvcc"))
    for c in candidates:
        if c.is_file() and os.access(c, os.X_OK):
            return c
    return None


def require_nvcc() -> Path:
    """Path of nvcc.

    Raises:
        NoDeviceError: there is none (anchor ``no-nvcc``).
    """
    nvcc = find_nvcc()
    if nvcc is None:
        raise NoDeviceError("nvcc was not found", anchor="no-nvcc",
                            hint="install the CUDA toolkit or set CUDA_HOME (or EVTC_NVCC); kernels built elsewhere "
                                 "can be brought here with `evtc cache export`/`evtc cache import`")
    return nvcc


@functools.lru_cache(maxsize=None)
def _nvcc_release(path: str, mtime_ns: int) -> str:
    try:
        out = subprocess.run([path, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        raise BuildError(f"can't run {path} --version: {e}") from None
    m = re.search(r"Build (\S+)", out)
    return m.group(1) if m else (out.strip().splitlines() or ["unknown"])[-1]


def nvcc_version() -> str:
    """nvcc's release line, e.g. ``cuda_13.0.r13.0/compiler.36424714_0``; ``none`` without nvcc."""
    nvcc = find_nvcc()
    if nvcc is None:
        return "none"
    return _nvcc_release(str(nvcc), nvcc.stat().st_mtime_ns)


# --------------------------------------------------------------------------------------------
# Include directories
# --------------------------------------------------------------------------------------------

@functools.lru_cache(maxsize=None)
def _cutlass_dirs(cutlass_path: str | None) -> tuple[Path, ...]:
    if cutlass_path:
        base = Path(cutlass_path)
        dirs = (base / "include", base / "tools" / "util" / "include")
    else:
        # find the package without importing it (its import costs about 60 ms)
        spec = importlib.util.find_spec("cutlass_library")
        if spec is None or not spec.submodule_search_locations:
            raise BuildError("the CUTLASS headers were not found",
                             hint="pip install nvidia-cutlass==4.2.0.0, or set CUTLASS_PATH to a CUTLASS checkout")
        base = Path(list(spec.submodule_search_locations)[0]).resolve() / "source"
        dirs = (base / "include", base / "tools" / "util" / "include")
    if not (dirs[0] / "cutlass" / "cutlass.h").is_file():
        raise BuildError(f"no cutlass/cutlass.h under {dirs[0]}", hint="check CUTLASS_PATH or the nvidia-cutlass install")
    return dirs


def cutlass_include_dirs() -> tuple[Path, ...]:
    """The CUTLASS include directories (see the module docstring).

    Raises:
        BuildError: neither ``CUTLASS_PATH`` nor the ``nvidia-cutlass`` wheel is available.
    """
    return _cutlass_dirs(knobs.cutlass_path.get())


def evtc_include_dir() -> Path | None:
    """evtc's own header directory (``codegen_templates/include``), or None in a tree that has
    none yet."""
    from evtc.resources import data_path

    try:
        return data_path("codegen_templates", "include")
    except FileNotFoundError:
        return None


def include_dirs() -> tuple[Path, ...]:
    """Every ``-I`` directory of a build, in search order (evtc's headers, then CUTLASS's)."""
    own = evtc_include_dir()
    return ((own,) if own is not None else ()) + cutlass_include_dirs()


@functools.lru_cache(maxsize=None)
def _cutlass_version(include: Path) -> str:
    text = (include / "cutlass" / "version.h").read_text()
    parts = [re.search(rf"#define CUTLASS_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(p.group(1) if p else "?" for p in parts)


def cutlass_version() -> str:
    """CUTLASS's version from ``cutlass/version.h`` (shown in ``evtc cache list``; the key hashes
    the headers' contents instead)."""
    return _cutlass_version(cutlass_include_dirs()[0])


# --------------------------------------------------------------------------------------------
# The command line
# --------------------------------------------------------------------------------------------

def env_flags() -> dict[str, str]:
    """``NVCC_PREPEND_FLAGS`` and ``NVCC_APPEND_FLAGS`` as nvcc will see them ("" when unset)."""
    return {k.name: k.raw() or "" for k in (knobs.nvcc_prepend_flags, knobs.nvcc_append_flags)}


def nvcc_command(arch: str, source: str | Path = "k.cu", output: str | Path = "k.so", *,
                 extra_flags: Sequence[str] = (), includes: bool = True, nvcc: str | Path = "nvcc") -> list[str]:
    """The exact nvcc command line that builds ``source`` into the shared library ``output``.

    This is the one definition of how evtc compiles: the builder runs it (with ``nvcc`` set to
    the found compiler), or for a source that supports it the same flags as two halves at once
    (:func:`split_build_commands`, NOTE [Split builds]), and ``evtc emit --print-nvcc`` prints it
    for a standalone ``.cu``.

    Args:
        arch: ``"sm90"`` or ``"sm80"``.
        source: the ``.cu`` file.
        output: the ``.so`` to write.
        extra_flags: more nvcc flags, after evtc's (part of the cache key).
        includes: add the ``-I`` flags of :func:`include_dirs` (machine-specific paths); without
            them the line is the same on every machine (``$(evtc emit --print-includes)`` gives
            them).
        nvcc: the program (default ``nvcc``, as a user types it).

    Returns:
        ``[nvcc, *BASE_FLAGS, *ARCH_FLAGS[arch], -I..., *extra_flags, "-o", output, source]``.

    Raises:
        BuildError: unknown arch, or (with ``includes``) no CUTLASS headers.

    Example::

        >>> " ".join(nvcc_command("sm90", includes=False))
        'nvcc -std=c++17 -O3 -DNDEBUG --expt-relaxed-constexpr -Xcompiler=-fPIC -Xcompiler=-fvisibility=hidden -shared -lineinfo -gencode=arch=compute_90a,code=sm_90a -o k.so k.cu'
    """
    cmd = [str(nvcc), *BASE_FLAGS, *arch_flags(arch)]
    if includes:
        cmd += [f"-I{d}" for d in include_dirs()]
    cmd += [*extra_flags, "-o", str(output), str(source)]
    return cmd


def compile_command(source: Path, output: Path, gencode: Sequence[str], extra: Sequence[str] = ()) -> list[str]:
    """Deprecated: :func:`nvcc_command` with ``-gencode`` flags given by hand (kept for old
    callers; evtc itself no longer uses it)."""
    cmd = [str(require_nvcc()), *BASE_FLAGS, *gencode]
    cmd += [f"-I{d}" for d in include_dirs()]
    return cmd + [*extra, "-o", str(output), str(source)]


# --------------------------------------------------------------------------------------------
# The toolchain (recorded in each cache entry; not needed to look one up)
# --------------------------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class Toolchain:
    """What compiled a kernel, beyond its flags: recorded in the cache entry.

    Attributes:
        nvcc: nvcc's release line (:func:`nvcc_version`).
        host_compiler: the first line of the host compiler's ``--version``.
        ccbin: the host compiler nvcc runs (``-ccbin``/``NVCC_CCBIN``, else ``gcc`` on PATH).
    """

    nvcc: str
    host_compiler: str
    ccbin: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @property
    def id(self) -> str:
        """16 hex digits naming the toolchain (the entry's folder under its key)."""
        canonical = json.dumps(self.to_json(), sort_keys=True, separators=(",", ":"))
        return hashlib.sha256(canonical.encode()).hexdigest()[:16]


def _ccbin(flags: Sequence[str]) -> str:
    flags = list(flags)
    for i, f in enumerate(flags):
        for opt in ("-ccbin", "--compiler-bindir"):
            if f == opt and i + 1 < len(flags):
                return flags[i + 1]
            if f.startswith(opt + "="):
                return f.split("=", 1)[1]
    return knobs.nvcc_ccbin.get()


def _build_ccbin(extra_flags: Sequence[str]) -> str:
    """The host compiler nvcc runs for a build with ``extra_flags``: ``-ccbin`` (or
    ``--compiler-bindir``) in ``NVCC_PREPEND_FLAGS``, the flags or ``NVCC_APPEND_FLAGS``, else
    ``NVCC_CCBIN``, else ``gcc``."""
    env = env_flags()
    return _ccbin([*shlex.split(env["NVCC_PREPEND_FLAGS"]), *extra_flags, *shlex.split(env["NVCC_APPEND_FLAGS"])])


def _ccbin_program(ccbin: str, path_env: str | None = None) -> str | None:
    """The program ``ccbin`` names (a folder: its ``gcc``, as nvcc's manual allows), found on
    ``path_env`` (default ``PATH``), or None."""
    return shutil.which(os.path.join(ccbin, "gcc") if os.path.isdir(ccbin) else ccbin, path=path_env)


@functools.lru_cache(maxsize=None)
def _host_compiler_version(ccbin: str, path_env: str) -> str:
    found = _ccbin_program(ccbin, path_env)
    if found is None:
        return f"{ccbin}: not found"
    try:
        out = subprocess.run([found, "--version"], capture_output=True, text=True, timeout=60).stdout
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"{found}: {e}"
    return (out.strip().splitlines() or [found])[0]


def toolchain(extra_flags: Sequence[str] = ()) -> Toolchain:
    """The toolchain a build with ``extra_flags`` would use here (runs ``nvcc --version`` and the
    host compiler's ``--version`` once per process).

    Raises:
        NoDeviceError: there is no nvcc.
    """
    nvcc = require_nvcc()
    ccbin = _build_ccbin(extra_flags)
    return Toolchain(_nvcc_release(str(nvcc), nvcc.stat().st_mtime_ns),
                     _host_compiler_version(ccbin, knobs.path.raw() or ""), ccbin)


# --------------------------------------------------------------------------------------------
# Compiling
# --------------------------------------------------------------------------------------------

def _kill_group(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """SIGTERM the process group of ``proc`` (nvcc and everything it started), then SIGKILL
    whatever is left after ``grace_s``."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace_s)
        except subprocess.TimeoutExpired:
            continue
        # nvcc is gone; its children may not be: SIGKILL the group in any case
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        return


# NOTE [Split builds]
# nvcc compiles a .cu in one chain: the device half (gcc -E, cicc, ptxas) and then the host half
# (gcc -E, cudafe++, a cicc parse, gcc), one after the other, because the host object embeds the
# device code. Measured with `nvcc --time` on one sm90 bias_relu kernel (2-core CPU machine,
# 2026-11-26): cicc 19.6 s of device code generation, then cudafe++ 5.3 s and gcc 4.3 s of host
# code, 31.3 s in all. The two halves share nothing but the source, so a source that says it can
# (`#define EVTC_SUPPORTS_SPLIT_BUILD 1`: the sm90 GEMM and conv templates, through
# codegen_templates/common/split_kernel.j2) is compiled twice at once:
#
#   nvcc ... -DEVTC_SPLIT_DEVICE -fatbin -o kernel.fatbin kernel.cu  the kernel only, as extern "C"
#                                                                    evtc_gemm_kernel (evtc_conv_kernel)
#   nvcc ... -DEVTC_SPLIT_HOST   -c      -o host.o kernel.cu         the host code only
#
# then the fatbin is linked into the library as the bytes of a hidden symbol, evtc_device_image
# (one `.incbin` assembled by the host compiler: no copy of the bytes through C source), and the
# host code loads it once per process with cudaLibraryLoadData and launches the cudaKernel_t it
# gets (cuda_runtime_api.h: cudaLaunchKernel, cudaLaunchKernelExC and cudaFuncSetAttribute take a
# cudaKernel_t cast to void*). The wall time is the longer half (20.6 s there, against 31.3 s):
# the library is still one self-contained kernel.so, so the cache, export and import are
# unchanged. The same source built by the one command of nvcc_command (`evtc emit --print-nvcc`)
# is an ordinary CUDA library with cutlass::device_kernel<GemmKernel> in it. The split is part of
# the key (key_material's "build"), so the two builds of one source are different entries. A
# fatbin, not a bare cubin, so that sm80's PTX beside its cubin survives the split too.

SPLIT_MARKER = "\n#define EVTC_SUPPORTS_SPLIT_BUILD 1\n"

#: Names the split build's recipe in the cache key (change it when split_build_commands changes).
SPLIT_BUILD = "split-1"

_IMAGE_ASM = """\
\t.section .rodata.evtc_device_image,"a",@progbits
\t.balign 128
\t.globl evtc_device_image
\t.hidden evtc_device_image
\t.type evtc_device_image, @object
evtc_device_image:
\t.incbin "{image}"
\t.byte 0
\t.size evtc_device_image, . - evtc_device_image
\t.section .note.GNU-stack,"",@progbits
"""


def supports_split_build(source_text: str) -> bool:
    """Whether ``source_text`` (a ``.cu``) can be built in two halves at once (NOTE [Split builds]):
    it defines ``EVTC_SUPPORTS_SPLIT_BUILD`` on a line of its own."""
    return SPLIT_MARKER in source_text


def split_build_commands(arch: str, source: Path, output: Path, work: Path, *, extra_flags: Sequence[str] = (),
                         nvcc: str | Path = "nvcc") -> dict[str, list[str]]:
    """The commands of a split build of ``source`` into ``output`` (NOTE [Split builds]).

    Args:
        arch: ``"sm90"`` or ``"sm80"``.
        source: the ``.cu`` file (it must :func:`support <supports_split_build>` the split).
        output: the ``.so`` to write.
        work: a private folder for ``kernel.fatbin``, ``host.o``, ``image.S`` and ``image.o``.
        extra_flags: more nvcc flags, given to both halves and the link.
        nvcc: the program.

    Returns:
        ``{"device": [...], "host": [...], "image": [...], "link": [...]}``: the first two run at
        once, then the other two, in that order.

    Raises:
        BuildError: unknown arch, or no CUTLASS headers.
    """
    compile_flags = [f for f in BASE_FLAGS if f != "-shared"]
    incs = [f"-I{d}" for d in include_dirs()]
    gencode = list(arch_flags(arch))
    ccbin = _build_ccbin(extra_flags)
    ccbin = _ccbin_program(ccbin) or ccbin
    return {
        "device": [str(nvcc), *compile_flags, *gencode, *incs, *extra_flags, "-DEVTC_SPLIT_DEVICE", "-fatbin",
                   "-o", str(work / "kernel.fatbin"), str(source)],
        "host": [str(nvcc), *compile_flags, *gencode, *incs, *extra_flags, "-DEVTC_SPLIT_HOST", "-c",
                 "-o", str(work / "host.o"), str(source)],
        "image": [ccbin, "-c", "-o", "image.o", "image.S"],  # run in ``work``
        "link": [str(nvcc), *BASE_FLAGS, *gencode, *extra_flags, "-o", str(output), str(work / "host.o"),
                 str(work / "image.o")],
    }


# NOTE [Compilers die with evtc]
# spawn() starts every compiler in a session (process group) of its own, so a time limit or an
# interrupt kills nvcc and all it started (cicc, ptxas, the host compiler) with one killpg. A
# process killed with SIGKILL runs no cleanup, though, and its compilers ran on for minutes. So on
# Linux the command runs under a small sh that the kernel signals (SIGTERM, prctl
# PR_SET_PDEATHSIG, set between fork and exec) when the thread that started it dies; its trap
# kills the whole group. The signal goes to sh and not to nvcc because the setting is not
# inherited by nvcc's own children (prctl(2)): only a process that kills the group reaches cicc.
# The starting thread waits for the build, so it outlives it. Source: issue 37.

_PR_SET_PDEATHSIG = 1
#: sh -c GUARD evtc-guard CMD...: run CMD in the background, wait for it and exit with its status;
#: on SIGTERM (the parent's death, a killpg) kill the whole process group
_GUARD = 'trap "trap - TERM; kill -KILL 0" TERM; "$@" & wait $!'


@functools.lru_cache(maxsize=1)
def _prctl():
    """libc's ``prctl`` through ctypes (Linux), or None."""
    if not sys.platform.startswith("linux"):
        return None
    import ctypes

    try:
        fn = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    fn.restype = ctypes.c_int
    return fn


def spawn(cmd: Sequence[str], *, stdout=None, stderr=None, cwd: Path | None = None) -> subprocess.Popen:
    """Start a compiler process that can't outlive evtc (NOTE [Compilers die with evtc]): in a new
    session (its own process group: :func:`_kill_group` kills all it started) and, on Linux,
    under a guard that kills that group when the starting thread dies, even by SIGKILL.

    Args:
        cmd: the program and its arguments.
        stdout, stderr: as for :class:`subprocess.Popen`; stdin is ``/dev/null``.
        cwd: the working folder.

    Returns:
        The process (with the guard, the guard's: its exit status is the command's, or 128 plus
        the signal that killed it).

    Raises:
        OSError: the program can't be found or started.
    """
    cmd = [str(c) for c in cmd]
    prctl = _prctl()
    if prctl is None:
        return subprocess.Popen(cmd, stdout=stdout, stderr=stderr, stdin=subprocess.DEVNULL, start_new_session=True,
                                cwd=cwd)
    program = cmd[0] if os.sep in cmd[0] else shutil.which(cmd[0])
    if program is None or not os.access(os.path.join(cwd or "", program), os.X_OK):
        raise FileNotFoundError(errno.ENOENT, "No such file or directory (or not executable)", cmd[0])
    parent = os.getpid()

    def die_with_parent() -> None:  # runs in the child, between fork and exec
        prctl(_PR_SET_PDEATHSIG, signal.SIGTERM, 0, 0, 0)
        if os.getppid() != parent:  # the parent died before the prctl: nobody will signal us
            os.kill(os.getpid(), signal.SIGKILL)

    return subprocess.Popen(["/bin/sh", "-c", _GUARD, "evtc-guard", *cmd], stdout=stdout, stderr=stderr,
                            stdin=subprocess.DEVNULL, start_new_session=True, cwd=cwd, preexec_fn=die_with_parent)


class _Run:
    """One compiler process started by :func:`spawn`, its output collected in a file."""

    def __init__(self, step: str, cmd: list[str], out: Path, cwd: Path | None = None):
        self.step, self.cmd, self.out = step, cmd, out
        self._fh = open(out, "wb")
        try:
            self.proc = spawn(cmd, stdout=self._fh, stderr=subprocess.STDOUT, cwd=cwd)
        except OSError:
            self._fh.close()
            raise

    def kill(self, grace_s: float = 5.0) -> None:
        if self.proc.poll() is None:
            _kill_group(self.proc, grace_s)

    def text(self) -> str:
        self._fh.close()
        return self.out.read_text(errors="replace")


def _wait_all(runs: list[_Run], deadline: float) -> tuple[_Run | None, bool]:
    """Wait for ``runs``; the first to fail, or the deadline, kills the others.

    Returns:
        (the run that failed first, or None; whether the deadline passed).
    """
    while True:
        failed = next((r for r in runs if r.proc.poll() not in (None, 0)), None)
        if failed is not None or all(r.proc.poll() == 0 for r in runs):
            break
        if time.monotonic() > deadline:
            for r in runs:
                r.kill()
            return None, True
        time.sleep(0.05)
    if failed is not None:
        for r in runs:
            r.kill(grace_s=1.0)
    return failed, False


#: what a failed step of a build is called in its BuildError ("nvcc": the one-command build)
_STEP_NAMES = {"device": "the device half", "host": "the host half", "image": "the device image", "link": "the link"}


def _run_build(groups: list[list[tuple[str, list[str], Path | None]]], source: Path, work: Path, log: Path,
               timeout: float) -> None:
    """Run a build's steps: each group's ``(step, command, cwd)`` at once, the groups one after
    the other; every process in its own session, killed (with its children) when the time limit
    passes, when a step beside it fails, or on an interrupt. The log gets each command and its
    output (the command on the first line for a one-step build).

    Raises:
        BuildError: a step failed (the message quotes its first error line and names the step
            in a multi-step build; the hint names ``source`` and ``log``), the time limit passed,
            or a compiler could not be started.
    """
    kept = f"the source and the full log are kept:\n    source: {source}\n    log:    {log}"
    one = len(groups) == 1 and len(groups[0]) == 1
    t0 = time.monotonic()
    deadline = t0 + timeout
    sections: list[str] = []
    runs: list[_Run] = []
    failed, timed_out = None, False
    try:
        for group in groups:
            started = [_Run(step, cmd, work / f"{step}.log", cwd=cwd) for step, cmd, cwd in group]
            runs += started
            failed, timed_out = _wait_all(started, deadline)
            for r in started:
                sections.append(("" if one else f"# {r.step}\n") + f"{shlex.join(r.cmd)}\n\n{r.text()}")
            if failed is not None or timed_out:
                break
    except OSError as e:
        for r in runs:
            r.kill(grace_s=1.0)
        log.write_text("\n".join(sections) + f"\n\ncan't start the compiler: {e}\n")
        raise BuildError(f"can't start the compiler: {e}", hint=kept) from None
    except BaseException:  # KeyboardInterrupt: leave no compiler running
        for r in runs:
            r.kill(grace_s=1.0)
        raise
    if timed_out:
        log.write_text("\n".join(sections) + f"\n\nkilled after {timeout:g} s (EVTC_NVCC_TIMEOUT)\n")
        raise BuildError(f"nvcc timed out after {timeout:g} s building {source.name}; it and its children were killed",
                         hint=kept + "\n  raise the limit with build(timeout=...) or EVTC_NVCC_TIMEOUT")
    note = "" if one else " (a split build: NOTE [Split builds])"
    log.write_text("\n".join(sections) + f"\n# {time.monotonic() - t0:.1f} s{note}\n")
    if failed is not None:
        text = failed.out.read_text(errors="replace")
        first = next((line for line in text.splitlines() if "error" in line), "")
        what = "" if one else f" ({_STEP_NAMES[failed.step]})"
        raise BuildError(f"nvcc failed ({failed.proc.returncode}) building {source.name}{what}"
                         + (f": {first.strip()[:300]}" if first else ""), hint=kept)


def compile_shared(source: Path, output: Path, arch: str, log: Path, *, extra_flags: Sequence[str] = (),
                   timeout: float | None = None, nvcc: Path | None = None, split: bool | None = None) -> list[str]:
    """Compile ``source`` into ``output``, writing the command and nvcc's output to ``log``.

    nvcc runs in a new session (its own process group); on timeout or interrupt the whole group
    is killed (SIGTERM, then SIGKILL after 5 s), and the group dies with this process (NOTE
    [Compilers die with evtc]).

    Args:
        source: the ``.cu`` file.
        output: the ``.so`` to write.
        arch: ``"sm90"`` or ``"sm80"``.
        log: where the command line and nvcc's output go.
        extra_flags: more nvcc flags.
        timeout: seconds before the build is killed (default :func:`default_timeout`).
        nvcc: the compiler (default :func:`require_nvcc`).
        split: build the device and host halves at once (NOTE [Split builds]); default: when the
            source :func:`supports <supports_split_build>` it. ``False`` runs the one command of
            :func:`nvcc_command`.

    Returns:
        The command line that ran (for a split build, the four commands with ``&`` between the
        two halves and ``&&`` before the image and the link).

    Raises:
        BuildError: nvcc failed or timed out; the message quotes the first error line and the
            hint names ``source`` and ``log``.
        NoDeviceError: there is no nvcc.
    """
    timeout = default_timeout() if timeout is None else timeout
    compiler = nvcc or require_nvcc()
    if split is None:
        split = supports_split_build(source.read_text(errors="replace"))
    with tempfile.TemporaryDirectory(prefix=".nvcc-", dir=output.parent) as d:
        work = Path(d)
        if split:
            cmds = split_build_commands(arch, source, output, work, extra_flags=extra_flags, nvcc=compiler)
            # relative: the assembler runs in work
            (work / "image.S").write_text(_IMAGE_ASM.format(image="kernel.fatbin"))
            groups = [[("device", cmds["device"], None), ("host", cmds["host"], None)],  # the two halves at once
                      [("image", cmds["image"], work)], [("link", cmds["link"], None)]]
            flat = [*cmds["device"], "&", *cmds["host"], "&&", *cmds["image"], "&&", *cmds["link"]]
        else:
            flat = nvcc_command(arch, source, output, extra_flags=extra_flags, nvcc=compiler)
            groups = [[("nvcc", flat, None)]]
        _run_build(groups, source, work, log, timeout)
    if not output.exists():
        raise BuildError(f"nvcc failed (0) building {source.name}: it wrote no {output.name}",
                         hint=f"the source and the full log are kept:\n    source: {source}\n    log:    {log}")
    return flat
