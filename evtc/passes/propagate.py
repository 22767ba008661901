"""Dtype and broadcast checking of the user's graph: the IR's rules, enforced always.

Input: a Graph from a frontend (or built by hand). Output: the same Graph, or a located error.

The rules are the IR verifier's (:data:`evtc.ir.verify.RULES`, stated there once): computes
take operands of any dtype and produce f32 (the compute type) except ``convert``, which produces
its target dtype; ``pow``'s exponent is a constant; every output's value varies along M and N
(its broadcast class, the join of its operands', is M x N); names are unique; every leaf is
declared. This pass runs first in every pipeline, whatever the verification setting, and raises
the first violation as the rule's user error class (:class:`~evtc.errors.EpilogueTypeError`
for types and broadcasts, :class:`~evtc.errors.UnsupportedOpError` for an unknown op,
:class:`~evtc.errors.IRVerificationError` for a malformed hand-built graph), located at the
node's line, with the IR around it when the node has no line.

Requires: nothing. Ensures: the graph satisfies every rule of :data:`evtc.ir.verify.RULES`.
Preserves: all (it changes nothing).
"""

from __future__ import annotations

from evtc.errors import IRVerificationError
from evtc.ir.graph import Graph
from evtc.ir.verify import format_violation, violations
from evtc.passes.manager import Pass, PassResult

__all__ = ["PROPAGATE", "propagate"]


def propagate(graph: Graph) -> PassResult:
    """Check ``graph`` against the IR's rules, raising the first violation as a user error.

    Args:
        graph: a Graph from a frontend or built by hand.

    Returns:
        ``graph`` unchanged.

    Raises:
        EpilogueTypeError: a dtype or broadcast rule is broken (e.g. an output that is a vector).
        UnsupportedOpError: a compute names an op that isn't in the op table.
        IRVerificationError: the graph is malformed (an undeclared leaf, a cycle, duplicate names).
    """
    for v in violations(graph):
        cls = v.user_error
        located = v.node is not None and v.node.loc is not None
        message = v.message if located and cls is not IRVerificationError else format_violation(graph, v)
        raise cls(message, loc=v.node.loc if v.node is not None else graph.loc, epilogue=graph.name, hint=v.hint)
    return PassResult(graph, False)


PROPAGATE = Pass("propagate", propagate)
