"""``evtc emit --fragment``: a CLI request -> an epilogue fragment header.

Input: the :class:`evtc.cli.GemmRequest` of ``evtc emit`` (epilogue, arch, dtypes, tile,
cluster, schedule, stages, epilogue tile, plan) and the C++ name and namespace. Output: the
header text of :func:`evtc.plugin.lower`'s fragment, on stdout or in ``-o``'s file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import click

from evtc.plugin.fragment import EpilogueFragment
from evtc.plugin.lowering import lower

__all__ = ["emit_fragment", "fragment_for"]


def fragment_for(request, *, name: str, namespace: str) -> EpilogueFragment:
    """The fragment of a ``GemmRequest``: its configuration's tile, cluster, schedule, stages and
    epilogue tile (the arch's defaults where the command line gave none) and its plan policy.

    Raises:
        EvtcError: as :func:`evtc.plugin.lower`.
    """
    cfg = request.config()
    return lower(request.epilogue(), arch=request.arch, tile=cfg.tile, epilogue_tile=cfg.epilogue_tile,
                 schedule=cfg.schedule, cluster=cfg.cluster, a=request.a, b=request.b or request.a, c=request.c,
                 d=request.d, stages=cfg.stages, plan=request.plan_arg, name=name, namespace=namespace)


def emit_fragment(request, output: Path | None, name: str, namespace: str, write: Callable[[Path, str], None]) -> None:
    """Write the fragment header to ``output`` (reporting it on stderr) or to stdout."""
    frag = fragment_for(request, name=name, namespace=namespace)
    text = frag.header()
    if output is None:
        click.echo(text, nl=False)
        return
    write(output, text)
    click.echo(f"wrote {output}: fragment {frag.qualified_name} of {frag.epilogue}, tile {'x'.join(map(str, frag.tile))} "
               f"{frag.schedule}, epilogue smem {frag.smem_bytes} B, {frag.mainloop_stages} mainloop stages", err=True)
