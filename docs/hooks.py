"""mkdocs hook: refuse to build the site from stale generated docs (see docs/gen_docs.py)."""

from __future__ import annotations

import sys
from pathlib import Path


def on_pre_build(config, **kwargs) -> None:
    from mkdocs.exceptions import PluginError

    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import gen_docs

    stale = gen_docs.stale()
    if stale:
        names = ", ".join(str(p.relative_to(gen_docs.ROOT)) for p in stale)
        raise PluginError(f"generated docs are out of date ({names}): run python docs/gen_docs.py")
