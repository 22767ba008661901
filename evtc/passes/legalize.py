"""Per-arch legalization: the target rules, stated here and nowhere else.

Input: a Graph and the :class:`ArchRules` of its target. Output: the same Graph, or a located
:class:`~evtc.errors.LegalizeError`.

The IR knows no target (:mod:`evtc.ir.verify` checks IR invariants only); what a target can
emit is this table, one row per arch (:data:`ARCH_RULES`):

* **the collective stores D** (sm90): the TMA warp-specialized collective epilogue
  (``sm90_epilogue_tma_warpspecialized.hpp``) always stores one M x N output, so the epilogue
  needs at least one; sm80's visitors have no collective, so an epilogue of reductions only is
  legal there.
* **scalar reductions are f32** (sm90 and sm80): ``Sm90ScalarReduction`` has only an atomic
  implementation (``static_assert(IsAtomic, "non-atomic scalar reduction not supported yet")``
  in ``sm90_visitor_store_tma_warpspecialized.hpp``), and so has sm80's
  ``VisitorScalarReduction``; evtc emits them with ``atomicAdd``/``atomicMax``/``atomicMin`` on
  float.
* **reductions are f32, f16 or bf16** (sm90 and sm80): the sm90 row and column reductions
  combine partial results with atomics "performed in the output type"
  (``sm90_visitor_store_tma_warpspecialized.hpp``), and CUDA has no fp8 atomics; the sm80
  kernels round a float workspace into f16 and bf16 outputs only.
* **per-token-group quantization** (``evtc.quantize``, sm90 only): the sm90 collective hands
  the root visitor a whole epilogue subtile in registers before it converts and stores it
  (``reduce(..., visit_results)`` in ``sm90_epilogue_tma_warpspecialized.hpp``), where a group's
  amax can feed back into its own elements (NOTE [Per-token-group quantization in the
  epilogue], include/evtc/sm90_group_quant.hpp); sm80's visitors see one fragment at a time and
  have no such hook.

These rules hold for every user, whatever the verification setting: the pass manager always
runs this pass when it is given an arch (``evtc.Gemm`` always gives one).

Requires: propagate. Ensures: nothing beyond its checks. Preserves: all (it changes nothing).
"""

from __future__ import annotations

import dataclasses
import functools

from evtc import dtypes
from evtc.dtypes import DType
from evtc.errors import ConfigError, LegalizeError
from evtc.ir.graph import Graph
from evtc.ir.nodes import GroupScale, Reduction, Store, is_gated
from evtc.passes.manager import Pass, PassResult, visit

__all__ = ["ARCH_RULES", "ArchRules", "legalize", "legalize_pass"]


@dataclasses.dataclass(frozen=True)
class ArchRules:
    """What an arch's emitter can express (module docs give the sources).

    Attributes:
        arch: ``"sm90"`` or ``"sm80"``.
        collective_stores_d: the epilogue needs an M x N output (the collective stores D).
        reduction_dtypes: dtypes a row or column reduction can be written in.
        scalar_reduction_dtypes: dtypes a scalar reduction can be written in.
        group_quant: ``evtc.quantize`` (a per-token-group quantized D) can be emitted.
        glu: ``evtc.glu`` (the one-GEMM gated form: pairs of columns, N / 2 stored) can be
            emitted.
    """

    arch: str
    collective_stores_d: bool
    reduction_dtypes: tuple[DType, ...]
    scalar_reduction_dtypes: tuple[DType, ...]
    group_quant: bool = False
    glu: bool = False


_REDUCTION_DTYPES = (dtypes.f32, dtypes.f16, dtypes.bf16)

#: the rules of each arch
ARCH_RULES: dict[str, ArchRules] = {
    "sm90": ArchRules("sm90", True, _REDUCTION_DTYPES, (dtypes.f32,), group_quant=True, glu=True),
    "sm80": ArchRules("sm80", False, _REDUCTION_DTYPES, (dtypes.f32,)),
}


def _names(ds: tuple[DType, ...]) -> str:
    names = [d.name for d in ds]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]


def legalize(graph: Graph, rules: ArchRules) -> PassResult:
    """Check ``graph`` against ``rules``.

    Args:
        graph: a propagated Graph.
        rules: the target's row of :data:`ARCH_RULES`.

    Returns:
        ``graph`` unchanged.

    Raises:
        LegalizeError: the first broken rule, located at the node (or the epilogue's ``def``).

    Example::

        legalize(g, ARCH_RULES["sm90"])   # LegalizeError for an epilogue of reductions only
    """
    if rules.collective_stores_d and not any(isinstance(o, Store) for o in graph.outputs):
        raise LegalizeError(
            f"on {rules.arch} the collective epilogue stores D: this epilogue has no M x N output",
            loc=graph.loc, epilogue=graph.name,
            hint="return the M x N value the reductions are computed from, e.g. {'D': d, 'row_max': evtc.max(d, dim=1)}",
        )
    for node in visit(graph.outputs):
        if is_gated(node) and not rules.glu:
            raise LegalizeError(
                f"'{node.name}': evtc.glu (the one-GEMM gated form) is built for sm90 only, not {rules.arch}",
                loc=node.loc, epilogue=graph.name,
                hint="on this arch run the gate and up GEMMs apart: the up GEMM's epilogue takes the gate GEMM's "
                     "output as an aux load, evtc.silu(gate) * acc")
        if not isinstance(node, Reduction):
            continue
        if isinstance(node, GroupScale):
            if not rules.group_quant:
                raise LegalizeError(
                    f"'{node.name}': evtc.quantize (per-token-group quantization) is built for sm90 only, "
                    f"not {rules.arch}", loc=node.loc, epilogue=graph.name,
                    hint="quantize after the GEMM on this arch (evtc.testing.quant.quantize_per_token_group "
                         "computes the same bits)")
            continue
        if node.dim is None and node.dtype not in rules.scalar_reduction_dtypes:
            raise LegalizeError(
                f"scalar reduction '{node.name}' must be {_names(rules.scalar_reduction_dtypes)} "
                "(it accumulates with float atomics)",
                loc=node.loc, epilogue=graph.name, hint="drop the .to(...) on the reduction",
            )
        if node.dtype not in rules.reduction_dtypes:
            raise LegalizeError(
                f"{node.role} '{node.name}' can't be written as {node.dtype}: reductions are "
                f"{_names(rules.reduction_dtypes)} on {rules.arch} (they combine partial results with atomics, "
                f"and there are no {node.dtype} atomics)",
                loc=node.loc, epilogue=graph.name,
                hint=f"reduce into one of {_names(rules.reduction_dtypes)} (drop the .to(...) on the reduction) "
                     "and convert the result after the GEMM",
            )
    return PassResult(graph, False)


def legalize_pass(arch: str) -> Pass:
    """The legalize pass for ``arch``, its rules bound (``Graph -> PassResult`` like every pass).

    Raises:
        ConfigError: ``arch`` is not one of :data:`ARCH_RULES`.
    """
    if arch not in ARCH_RULES:
        raise ConfigError(f"unknown arch '{arch}'", hint=f"use one of {', '.join(ARCH_RULES)}")
    return Pass("legalize", functools.partial(legalize, rules=ARCH_RULES[arch]), requires=("propagate",))
