"""Pack the cached kernels of prebuild groups into one archive, to carry to the GPU machine
(whose device time is short) instead of building them there: a thin wrapper over
``evtc cache export`` that selects the kernels by prebuild group.

    python benchmarks/pack_cache.py tests bias_relu -o .carry/k1.tar.xz
    # on the GPU machine (benchmarks/gpu_suite.sh does this for .carry/*.tar.xz):
    evtc cache import .carry/k1.tar.xz

The archive is ``evtc cache export``'s (manifest, ``meta.json`` and ``kernel.so`` of each entry;
a library is about 3 MB, 0.7 MB packed); ``evtc cache import`` checks every entry (format, ABI
version, key, SHA-256) before adding it. Kernels of a group that are not built yet are listed
and left out.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path


def pack(jobs, output: Path | str, include_sources: bool = False):
    """Export the cached kernels of ``jobs`` (:class:`evtc.compiler.BuildJob` s, or
    ``(source, arch, name)`` tuples) into ``output``.

    Returns:
        The :class:`evtc.compiler.store.ExportSummary` plus the names of the jobs not built yet.
    """
    from evtc.compiler import BuildJob, kernel_key
    from evtc.compiler.archive import export_entries
    from evtc.compiler.store import cache_root

    jobs = [j if hasattr(j, "source") else BuildJob(*j) for j in jobs]
    keys = {kernel_key(j.source, arch=j.arch): j.name for j in jobs}
    summary = export_entries(cache_root(), output, keys=sorted(keys), include_sources=include_sources)
    return summary, [keys[k] for k in summary.missing]


def main() -> None:
    import prebuild

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("groups", nargs="+", help=f"prebuild groups ({', '.join(sorted(prebuild.GROUPS))}), GROUP:ARG too")
    ap.add_argument("-o", "--output", required=True)
    ap.add_argument("--sources", action="store_true", help="also carry kernel.cu and build.log")
    args = ap.parse_args()
    gemms = prebuild.gemms_of(args.groups)
    import common

    summary, missing = pack([j for _, j in common.unique_jobs(gemms)], args.output, args.sources)
    print(f"packed {len(summary.exported)} kernels into {args.output}; {len(missing)} not built yet", file=sys.stderr)
    for name in missing:
        print(f"  missing: {name}", file=sys.stderr)
    for info, why in summary.refused:
        print(f"  refused: {info.name} {info.key[:12]}: {why}", file=sys.stderr)


if __name__ == "__main__":
    main()
