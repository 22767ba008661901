"""nvcc: finding it, the CUTLASS include paths, and compiling one source to a shared library.

Input: a ``.cu`` file and a Target. Output: a ``.so`` file, or a :class:`BuildError` that names
the kept source and the compiler's log.

The CUTLASS headers come from the ``nvidia-cutlass`` wheel (``cutlass_library/source/include``
and ``source/tools/util/include``); ``CUTLASS_PATH`` (a CUTLASS checkout) overrides them.
nvcc is ``$CUDA_HOME/bin/nvcc``, else the first ``nvcc`` on ``PATH``, else
``/usr/local/cuda/bin/nvcc``.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path

from evtc.errors import BuildError, NoDeviceError

BASE_FLAGS = (
    "-std=c++17",
    "-O3",
    "-DNDEBUG",
    "--expt-relaxed-constexpr",
    "-Xcompiler=-fPIC",
    "-Xcompiler=-fvisibility=hidden",
    "-shared",
    "-lineinfo",
)


@functools.lru_cache(maxsize=None)
def find_nvcc() -> Path | None:
    """Path of nvcc, or None if there is none."""
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    candidates = []
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
    nvcc = find_nvcc()
    if nvcc is None:
        raise NoDeviceError("nvcc was not found", hint="install the CUDA toolkit or set CUDA_HOME", anchor="no-nvcc")
    return nvcc


@functools.lru_cache(maxsize=None)
def nvcc_version() -> str:
    """nvcc's release line, e.g. ``cuda_13.0.r13.0/compiler.36424714_0``; ``none`` without nvcc."""
    nvcc = find_nvcc()
    if nvcc is None:
        return "none"
    out = subprocess.run([str(nvcc), "--version"], capture_output=True, text=True).stdout
    m = re.search(r"Build (\S+)", out)
    return m.group(1) if m else out.strip().splitlines()[-1]


@functools.lru_cache(maxsize=None)
def cutlass_include_dirs() -> tuple[Path, ...]:
    """The CUTLASS include directories (see the module docstring).

    Raises:
        BuildError: neither ``CUTLASS_PATH`` nor the ``nvidia-cutlass`` wheel is available.
    """
    root = os.environ.get("CUTLASS_PATH")
    if root:
        base = Path(root)
        dirs = (base / "include", base / "tools" / "util" / "include")
    else:
        try:
            import cutlass_library  # type: ignore[import-not-found]
        except ImportError:
            raise BuildError("the CUTLASS headers were not found",
                             hint="pip install nvidia-cutlass==4.2.0.0, or set CUTLASS_PATH to a CUTLASS checkout") from None
        base = Path(cutlass_library.__file__).resolve().parent / "source"
        dirs = (base / "include", base / "tools" / "util" / "include")
    if not (dirs[0] / "cutlass" / "cutlass.h").is_file():
        raise BuildError(f"no cutlass/cutlass.h under {dirs[0]}", hint="check CUTLASS_PATH or the nvidia-cutlass install")
    return dirs


def evtc_include_dir() -> Path:
    """evtc's own C++ headers (``#include <evtc/...>`` in emitted sources)."""
    from evtc.resources import data_path

    return data_path("codegen_templates", "include")


@functools.lru_cache(maxsize=None)
def cutlass_version() -> str:
    """CUTLASS's version from ``cutlass/version.h`` (part of the build cache key)."""
    text = (cutlass_include_dirs()[0] / "cutlass" / "version.h").read_text()
    parts = [re.search(rf"#define CUTLASS_{k}\s+(\d+)", text) for k in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(p.group(1) if p else "?" for p in parts)


def compile_command(source: Path, output: Path, gencode: tuple[str, ...], extra: tuple[str, ...] = ()) -> list[str]:
    """The nvcc command line that builds ``source`` into the shared library ``output``."""
    cmd = [str(require_nvcc()), *BASE_FLAGS, *gencode]
    for d in (*cutlass_include_dirs(), evtc_include_dir()):
        cmd.append(f"-I{d}")
    cmd += [*extra, "-o", str(output), str(source)]
    return cmd


def compile_shared(source: Path, output: Path, gencode: tuple[str, ...], log: Path,
                   extra: tuple[str, ...] = (), timeout: float | None = None) -> None:
    """Compile ``source`` into ``output``, writing nvcc's output to ``log``.

    Raises:
        BuildError: nvcc failed or timed out; the message names ``source`` and ``log`` (both
            kept) and quotes the first error line.
        NoDeviceError: there is no nvcc.
    """
    cmd = compile_command(source, output, gencode, extra)
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired:
        log.write_text(" ".join(cmd) + f"\n\ntimed out after {timeout} s\n")
        raise BuildError(f"nvcc timed out after {timeout} s", hint=f"source: {source}\n  log: {log}") from None
    log.write_text(" ".join(cmd) + "\n\n" + proc.stdout + proc.stderr)
    if proc.returncode != 0 or not output.exists():
        first = next((l for l in (proc.stderr + proc.stdout).splitlines() if "error" in l), "")
        raise BuildError(
            f"nvcc failed ({proc.returncode}) building {source.name}" + (f": {first.strip()[:300]}" if first else ""),
            hint=f"the source and the full log are kept:\n    source: {source}\n    log:    {log}",
        )
