"""Pack the cached kernels of prebuild groups into one xz tarball, to carry to the GPU machine
(whose device time is short) instead of building them there.

    python benchmarks/pack_cache.py tests bias_relu -o .carry/k1.tar.xz
    # on the GPU machine:  mkdir -p $EVTC_CACHE_DIR && tar -xJf .carry/k1.tar.xz -C $EVTC_CACHE_DIR

Only ``kernel.so`` and ``meta.json`` of each entry travel (a library is about 3 MB, 0.7 MB packed).
Kernels of a group that are not built yet are listed and left out.
"""

from __future__ import annotations

import argparse
import sys
import tarfile

import prebuild

from evtc.compiler.cache import cache_dir, cache_key


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("groups", nargs="+", help=f"prebuild groups ({', '.join(sorted(prebuild.GROUPS))}), GROUP:ARG too")
    ap.add_argument("-o", "--output", required=True)
    args = ap.parse_args()
    gemms = {g.source: g for g in prebuild.gemms_of(args.groups)}
    root, packed, missing = cache_dir(), 0, []
    with tarfile.open(args.output, "w:xz") as tar:
        for g in gemms.values():
            key = cache_key(g.source, g.target)
            entry = root / key[:2] / key
            if not (entry / "kernel.so").exists():
                missing.append(repr(g))
                continue
            for f in ("kernel.so", "meta.json"):
                tar.add(entry / f, arcname=f"{key[:2]}/{key}/{f}")
            packed += 1
    print(f"packed {packed} kernels into {args.output}; {len(missing)} not built yet", file=sys.stderr)
    for m in missing:
        print(f"  missing: {m}", file=sys.stderr)


if __name__ == "__main__":
    main()
