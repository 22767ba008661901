"""Compiling the plugin examples (examples/hopper_gemm, examples/cutlass_library_gemm.py).

Input: a ``.cu`` file, the folders of the fragment headers it includes, and the fragments (for
their nvcc flags and include directories). Output: a shared library, cached under ``out_dir`` by
a hash of everything that goes into the build (the source, every header in the given folders,
evtc's helper headers, the flags and include paths), so a second call with nothing changed costs
nothing.

This is the consumers' own build, not evtc's: one nvcc command assembled from
``fragment.nvcc_flags`` and ``fragment.include_dirs`` (docs/plugin.md, "Building").
"""

from __future__ import annotations

import hashlib
import os
import shlex
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

__all__ = ["build_cutlass_library_example", "build_hopper_example", "examples_dir", "find_nvcc", "nvcc_shared"]

#: nvcc's time limit for one example build, in seconds (a full sm90 GEMM takes a few minutes).
TIMEOUT_S = 1800


def find_nvcc() -> str:
    """nvcc: ``$CUDA_HOME/bin/nvcc``, else the one on PATH, else ``/usr/local/cuda/bin/nvcc``.

    Raises:
        FileNotFoundError: none of them exists.
    """
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    for c in ([os.path.join(home, "bin", "nvcc")] if home else []) + [shutil.which("nvcc") or "",
                                                                     "/usr/local/cuda/bin/nvcc"]:
        if c and os.path.isfile(c) and os.access(c, os.X_OK):
            return c
    raise FileNotFoundError("nvcc was not found (set CUDA_HOME or put nvcc on PATH)")


def nvcc_shared(source: Path, out_dir: Path, *, fragment, header_dirs: Sequence[Path] = (), name: str,
                timeout: float = TIMEOUT_S) -> Path:
    """Build ``source`` into ``out_dir/<name>-<hash>.so`` (or return it if it is there).

    Args:
        source: the ``.cu`` file.
        out_dir: where the library (and the build log, on failure) goes.
        fragment: any of the fragments the source includes (its ``nvcc_flags`` and
            ``include_dirs`` are the same for every sm90 fragment).
        header_dirs: folders of the headers ``source`` includes by name (``-I``, hashed).
        name: the library's base name.
        timeout: nvcc's time limit in seconds.

    Returns:
        The library's path.

    Raises:
        RuntimeError: nvcc failed or timed out; the message names the log.
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    includes = [str(d) for d in header_dirs] + list(fragment.include_dirs)
    flags = [*fragment.nvcc_flags, "-shared", "-Xcompiler=-fPIC", "-Xcompiler=-fvisibility=hidden",
             *(f"-I{d}" for d in includes)]
    h = hashlib.sha256()
    h.update(Path(source).read_bytes())
    h.update("\0".join(flags).encode())
    for d in [*header_dirs, Path(fragment.include_dirs[0])]:
        for p in sorted(Path(d).rglob("*.h*")):
            h.update(str(p.relative_to(d)).encode() + b"\0" + p.read_bytes())
    lib = out_dir / f"{name}-{h.hexdigest()[:16]}.so"
    if lib.exists():
        return lib
    cmd = [find_nvcc(), *flags]
    log = out_dir / f"{name}.log"
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        tmp_lib = Path(tmp) / lib.name
        full = cmd + ["-o", str(tmp_lib), str(source)]
        try:
            proc = subprocess.run(full, capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            log.write_text(shlex.join(full) + f"\n\ntimed out after {timeout} s\n")
            raise RuntimeError(f"nvcc timed out after {timeout} s building {source}; see {log}") from None
        log.write_text(shlex.join(full) + "\n\n" + proc.stdout + proc.stderr)
        if proc.returncode != 0 or not tmp_lib.exists():
            first = next((line for line in (proc.stdout + proc.stderr).splitlines() if "error" in line), "")
            raise RuntimeError(f"nvcc failed ({proc.returncode}) building {source}: {first.strip()[:300]}; see {log}")
        os.replace(tmp_lib, lib)
    return lib


# ---- the two examples, as the tests build them ----------------------------------------------------

def examples_dir(default: Path) -> Path:
    """Where the tests build the examples: ``$EVTC_PLUGIN_EXAMPLES_DIR`` (kept between runs: the
    builds are cached by content), else ``default`` (the test session's temporary folder)."""
    return Path(os.environ.get("EVTC_PLUGIN_EXAMPLES_DIR") or default)


def _load(path: Path, name: str):
    """An example's module by path (examples/hopper_gemm/build.py is not in a package)."""
    import importlib.util
    import sys

    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, path)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod
        spec.loader.exec_module(mod)
    return sys.modules[name]


def build_hopper_example(base: Path):
    """Build examples/hopper_gemm under ``base/hopper_gemm``.

    Returns:
        (library path, header file -> fragment).
    """
    here = Path(__file__).resolve().parent
    return _load(here / "hopper_gemm" / "build.py", "hopper_gemm_build").build(Path(base) / "hopper_gemm")


def build_cutlass_library_example(base: Path):
    """Generate and build the cutlass_library GEMM of ``many_aux`` (bf16, 128x256x64, cluster
    2x1, cooperative) under ``base/cutlass_library_gemm``.

    Returns:
        (library path, fragment, the examples/cutlass_library_gemm.py module).
    """
    here = Path(__file__).resolve().parent
    import sys

    sys.path.insert(0, str(here))
    import epilogues

    gen = _load(here / "cutlass_library_gemm.py", "cutlass_library_gemm")
    lib, frag = gen.build(Path(base) / "cutlass_library_gemm", epilogues.many_aux, tile=(128, 256, 64),
                          cluster=(2, 1, 1), a="bf16", d="bf16", name="ManyAux", namespace="cl_evtc")
    return lib, frag, gen
