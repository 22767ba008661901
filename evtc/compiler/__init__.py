"""Building emitted sources with nvcc, with a content-hash cache.

Input: a ``.cu`` text and a Target. Output: an :class:`~evtc.compiler.cache.Artifact` (a ``.so``).
"""

from evtc.compiler.cache import Artifact, build, build_many, cache_dir, lookup
from evtc.compiler.nvcc import cutlass_include_dirs, find_nvcc

__all__ = ["Artifact", "build", "build_many", "cache_dir", "cutlass_include_dirs", "find_nvcc", "lookup"]
