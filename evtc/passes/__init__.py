"""Passes over the epilogue graph, one file each, and the manager that runs them.

Input: a Graph from a frontend. Output: a Graph ready for planning.

The pipeline, in order (each pass's docstring states what it requires and guarantees):

==============  ==============================================  ====================
pass            does                                            requires
==============  ==============================================  ====================
propagate       checks dtype and broadcast rules                -
fold            folds all-constant computes                     propagate
simplify        local rewrite rules, sympy on arithmetic trees  fold
lower           pow special cases; checks every op has a        fold
                functor
cse             commutative operand order, merges duplicates    -
dce             keeps only what the outputs reach               -
legalize        per-arch rules                                  propagate
==============  ==============================================  ====================

The next stage, :mod:`evtc.lower` (the graph -> CUTLASS's visitor tree), runs inside the
planner, which first decides which output takes the D slot.

With ``verify=True`` (the default under pytest, or with ``EVTC_VERIFY=1``) the manager runs the
IR verifier after every pass; a failure names the pass and the ones before it.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Callable

from evtc.errors import IRVerificationError
from evtc.ir.graph import Graph
from evtc.ir.verify import verify as verify_graph
from evtc.passes.cse import cse
from evtc.passes.dce import dce
from evtc.passes.fold import fold
from evtc.passes.legalize import legalize
from evtc.passes.lower import lower
from evtc.passes.propagate import propagate
from evtc.passes.simplify import simplify


@dataclasses.dataclass(frozen=True)
class Pass:
    name: str
    fn: Callable[[Graph, str | None], Graph]
    requires: tuple[str, ...] = ()


PIPELINE: tuple[Pass, ...] = (
    Pass("propagate", propagate),
    Pass("fold", fold, ("propagate",)),
    Pass("simplify", simplify, ("fold",)),
    Pass("lower", lower, ("fold",)),
    Pass("cse", cse),
    Pass("dce", dce),
    Pass("legalize", legalize, ("propagate",)),
)


def _check_order(pipeline: tuple[Pass, ...]) -> None:
    seen: set[str] = set()
    for p in pipeline:
        missing = [r for r in p.requires if r not in seen]
        if missing:
            raise AssertionError(f"pass '{p.name}' requires {missing} to run before it")
        seen.add(p.name)


_check_order(PIPELINE)


def _verify_default() -> bool:
    return os.environ.get("EVTC_VERIFY", "") == "1" or "pytest" in sys.modules


def run(graph: Graph, arch: str | None = None, *, verify: bool | None = None,
        pipeline: tuple[Pass, ...] = PIPELINE) -> Graph:
    """Run the pass pipeline on ``graph``.

    Args:
        graph: a Graph from a frontend.
        arch: ``"sm90"``/``"sm80"`` for legalization; None skips the arch rules.
        verify: run the verifier after every pass (default: under pytest or EVTC_VERIFY=1).
        pipeline: the passes to run (default :data:`PIPELINE`).

    Returns:
        The simplified, legalized Graph.

    Raises:
        EvtcError subclasses from the passes (located at the user's line), or
        IRVerificationError naming the pass that broke an invariant.
    """
    if verify is None:
        verify = _verify_default()
    if verify:
        verify_graph(graph)
    done: list[str] = []
    for p in pipeline:
        graph = p.fn(graph, arch)
        done.append(p.name)
        if verify:
            try:
                verify_graph(graph, after=p.name)
            except IRVerificationError as e:
                e.message += f" (passes run: {', '.join(done)})"
                raise
    if arch is not None and verify:
        verify_graph(graph, arch)
    return graph


__all__ = ["PIPELINE", "Pass", "cse", "dce", "fold", "legalize", "lower", "propagate", "run", "simplify"]
