"""Building emitted sources with nvcc, into a verified, portable kernel cache.

Input: a ``.cu`` text, an arch name and nvcc flags. Output: an
:class:`~evtc.compiler.cache.Artifact` (a verified ``kernel.so``).

Modules: :mod:`~evtc.compiler.nvcc` (the toolchain and the one nvcc command line),
:mod:`~evtc.compiler.cache` (keys, build, lookup, build_many), :mod:`~evtc.compiler.store`
(verified entries, list, prune), :mod:`~evtc.compiler.archive` (export, import),
:mod:`~evtc.compiler.fingerprint` (header and source hashes), :mod:`~evtc.compiler.trust`
(the file rule), :mod:`~evtc.compiler.progress` (the progress bar). The compiler takes sources and
flags, never IR or plan types (tests/null/test_layers.py): the construct memo, which pickles
graphs and plans, is the pipeline's (:mod:`evtc.pipeline.memo`). See docs/compiler.md.
"""

from evtc.compiler.cache import (
    Artifact,
    BuildJob,
    RemoteBuild,
    build,
    build_many,
    cache_dir,
    compile_remote,
    kernel_key,
    key_material,
    lookup,
)
from evtc.compiler.nvcc import cutlass_include_dirs, find_nvcc, include_dirs, nvcc_command
from evtc.compiler.store import CacheWarning, cache_root, verified_library_path
from evtc.errors import CacheError

__all__ = [
    "Artifact", "BuildJob", "CacheError", "CacheWarning", "RemoteBuild", "build", "build_many", "cache_dir", "cache_root",
    "compile_remote", "cutlass_include_dirs", "find_nvcc", "include_dirs", "kernel_key", "key_material", "lookup",
    "nvcc_command", "verified_library_path",
]
