"""Where evtc's data files are: the grammar, the C++ templates, the bundled examples, the errors page.

In a wheel they live in ``evtc/_data/`` (``pyproject.toml`` force-includes the top-level
``grammar/``, ``codegen_templates/``, ``examples/epilogues.py`` and ``docs/errors.md`` there); in a source checkout
or an editable install they are read from the repository's top level.
"""

from __future__ import annotations

from pathlib import Path

_PKG = Path(__file__).resolve().parent


def data_path(*parts: str) -> Path:
    """Path of a data file or folder, e.g. ``data_path("grammar", "epilogue.lark")``.

    Raises:
        FileNotFoundError: neither the packaged nor the source-tree copy exists.
    """
    for base in (_PKG / "_data", _PKG.parent):
        p = base.joinpath(*parts)
        if p.exists():
            return p
    raise FileNotFoundError(f"evtc data file {'/'.join(parts)} is missing (broken installation?)")
