"""Passes over the epilogue graph, one file each, and the manager that runs them.

Input: a Graph from a frontend. Output: a Graph ready for lowering to the visitor tree.

Every pass is a function ``Graph -> PassResult(graph, changed)`` (:mod:`evtc.passes.manager`)
whose module docstring states what it requires, ensures and preserves. The pipeline, in order:

============  ===================================================  ===========  ==================
pass          does                                                 requires     ensures (checked)
============  ===================================================  ===========  ==================
propagate     the IR's rules on the user's graph, located errors   -            -
fold          folds all-constant computes; refuses f32 overflow    propagate    no constant compute
simplify      local algebra rules (``IDENTITIES``, named rows)     fold         no rule matches
canonicalize  sympy canonical form of arithmetic trees             simplify     no rule matches
fuse          ``store(convert(x))``, ``a*b+c -> multiply_add``     canonicalize no rule matches
lower         ``pow`` special cases; every op has a functor        fold         no rule matches
cse           commutative operand order, merges duplicates         -            no duplicates
dce           keeps only what the outputs reach                    -            -
legalize      the target's rules (given an arch)                   propagate    -
============  ===================================================  ===========  ==================

``propagate`` and ``legalize`` always run (the rules a user can break hold without a debug
flag); with verification on (NOTE [Verification setting] in :mod:`evtc.passes.manager`:
``EVTC_VERIFY=1``, ``EVTC_DEBUG=1`` or ``verify=True``) the manager also runs the IR verifier
and each pass's ``ensures`` after every pass. Only legalize knows the target: the pipeline for
an arch binds its rules (:func:`pipeline`).

The next stage, :mod:`evtc.lower` (the graph -> CUTLASS's visitor tree), runs inside the
planner, which first decides which output takes the D slot.

Example::

    g = evtc.passes.run(bias_relu.trace(), "sm90")                  # Graph
    result = evtc.passes.PassManager(evtc.passes.pipeline("sm90"))(graph)
    result.graph, result.changed                                     # PassResult
"""

from __future__ import annotations

from evtc.ir import limits
from evtc.ir.graph import Graph
from evtc.passes.canonicalize import CANONICALIZE, canonicalize
from evtc.passes.cse import CSE, cse
from evtc.passes.dce import DCE, dce
from evtc.passes.fold import FOLD, fold
from evtc.passes.fuse import FUSE, fuse
from evtc.passes.legalize import ARCH_RULES, legalize, legalize_pass
from evtc.passes.lower import LOWER, lower
from evtc.passes.manager import Pass, PassManager, PassResult, verification_enabled
from evtc.passes.propagate import PROPAGATE, propagate
from evtc.passes.simplify import SIMPLIFY, simplify

__all__ = [
    "ARCH_RULES", "PIPELINE", "Pass", "PassManager", "PassResult", "canonicalize", "cse", "dce", "fold", "fuse",
    "legalize", "lower", "pipeline", "propagate", "run", "simplify", "verification_enabled",
]

#: the target-independent passes, in order (:func:`pipeline` appends legalize for an arch)
PIPELINE: tuple[Pass, ...] = (PROPAGATE, FOLD, SIMPLIFY, CANONICALIZE, FUSE, LOWER, CSE, DCE)


def pipeline(arch: str | None) -> tuple[Pass, ...]:
    """The passes for ``arch``: :data:`PIPELINE`, then legalize with the arch's rules.

    Args:
        arch: ``"sm90"``, ``"sm80"``, or None for no target (the IR as the frontends see it,
            e.g. for printing; nothing arch-specific is checked).

    Raises:
        ConfigError: an unknown arch.
    """
    if arch is None:
        return PIPELINE
    return PIPELINE + (legalize_pass(arch),)


def run(graph: Graph, arch: str | None = None, *, verify: bool | None = None,
        pipeline: tuple[Pass, ...] | None = None) -> Graph:
    """Run the pass pipeline on ``graph``.

    Args:
        graph: a Graph from a frontend (or built by hand).
        arch: ``"sm90"``/``"sm80"``, whose rules legalize checks; None skips them.
        verify: run the verifier and each pass's ``ensures`` after every pass; None reads the
            setting (``EVTC_VERIFY``, ``EVTC_DEBUG``; see :mod:`evtc.passes.manager`).
        pipeline: the passes to run instead of ``pipeline(arch)``.

    Returns:
        The simplified, legalized Graph (:class:`PassManager` gives the :class:`PassResult`).

    Raises:
        GraphTooLargeError: the graph is beyond :data:`evtc.ir.limits.LIMITS`.
        EvtcError subclasses from the passes, located at the user's line (type, constant
        folding, legalization); IRVerificationError naming the pass that broke an invariant;
        PassError for an internal failure inside a pass, naming it.
    """
    limits.check(graph)  # a graph built by hand never met a frontend's checks
    passes = _pipeline_for(arch) if pipeline is None else pipeline
    return PassManager(passes, verify=verify)(graph).graph


_pipeline_for = pipeline
