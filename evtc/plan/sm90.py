"""The Hopper (sm90) planner: shared memory of the TMA warp-specialized epilogue.

Input: a Graph after passes, the Target, a GemmConfig and a policy. Output: a :class:`Plan`.

This module ranks the candidates and keeps stock CUTLASS's plan within ``STOCK_MARGIN``; the
search space and CUTLASS's sizing rules are :mod:`evtc.plan.sm90_space`, the layout model
:mod:`evtc.plan.sm90_layout`, the Plan's buffers and the void-C-and-D variants
:mod:`evtc.plan.sm90_buffers` (NOTE [Atomic row and column max], NOTE [Stores into packed rows]).

# NOTE [Epilogue shared memory on sm90]
Every byte of ``CollectiveEpilogue::SharedStorage`` comes out of the mainloop's pipeline: the
mainloop gets ``(232448 - epilogue bytes) / stage bytes`` stages
(``StageCountAutoCarveout``, ``sm90_gmma_builder.inl``). Stock CUTLASS sizes the epilogue
additively (``sm90_builder.inl``, ``sm90_epilogue_tma_warpspecialized.hpp``,
``fusion/sm90_visitor_*.hpp``):

* C: ``StagesC`` epilogue subtiles; D: ``StagesD`` subtiles, or none when D reuses C's buffer
  (``ReuseSmemC``: C and D of one bit width above 8);
* each TMA aux load: ``StagesC`` subtiles (its slot index is ``load_iteration % Stages`` and the
  producer runs up to ``StagesC`` iterations ahead, so it needs at least ``StagesC``);
* each TMA aux store: ``StagesD`` subtiles (the store pipeline keeps at most ``StagesD - 1``
  stores in flight, so at least ``StagesD``);
* each row broadcast: one CTA-N row; column broadcasts, reductions and computes: nothing;
* stage counts from the subtile count: ``StagesD = min(EpiTiles, 2)``,
  ``StagesC = min(EpiTiles, 4)`` (at least ``StagesD + 1`` with reuse).

The ``cutlass`` policy reproduces exactly that (with the collective's C slot for the source C
only and D for the output named ``D``). The ``evtc`` policy searches, for the same kernel:

* slot promotion: with no source C, an aux load is loaded through the C slot, and the output
  whose bit width matches the C slot takes the D slot, so that D can reuse C's buffer;
* ``StagesC``/``StagesD``/reuse (legal relations from the collective's static_asserts:
  ``StagesD <= StagesC`` with reuse, ``StagesC > StagesD`` when the store is also delayed);
* TMA or register-direct (``Stages = 0``) per aux load and aux store;
* row broadcasts in shared memory (stock) or register-direct (NOTE [Row broadcasts without shared
  memory]);
* the epilogue tile's N (16, 32, 64);
* buffer shares: an aux store in an aux load's buffer (below);

and ranks the legal candidates with the cost model of :mod:`evtc.plan.cost`. The byte counts
come from a layout model of the C++ types (:mod:`evtc.plan.smem`) and the emitted kernel
``static_assert``s that they equal ``sizeof(CollectiveEpilogue::SharedStorage)``.

# NOTE [Aux buffer sharing]
Within one epilogue subtile an aux load's smem slot is dead once the consumer warps have copied
it to registers (``previsit``), and an aux store's slot is born when they copy their result into
it (``postreduce``) and dies when its TMA store has read it. With ``ReuseSmemC`` the collective
already exploits this for C and D: the store of subtile i writes slot i % StagesC, and the load
pipeline releases that slot only after the TMA store from it completed (the release follows the
store pipeline). Every TMA aux store commits in the same bulk group as D's store, so the same
ordering covers an aux store placed in an aux load's slot. Stock CUTLASS can't say this (each
visitor owns its storage), so evtc emits ``evtc::Sm90SharedAuxStore`` (an ``Sm90AuxStore`` with
``Stages = StagesC`` and no storage of its own) and wraps the tree in ``evtc::Sm90SmemShare``,
which repoints the store at the load's buffer after construction
(``codegen_templates/include/evtc/sm90_visitors.hpp``). Conditions, checked here and in the template: reuse
is on, the load is TMA (not register-direct, not in the C slot), and both have the same element
type, so their smem layouts and copy partitions are the same and each warp reads its block
(ldmatrix) before writing it (stmatrix) in program order, as for C/D reuse.

# NOTE [Row broadcasts without shared memory]
Stock ``Sm90RowBroadcast`` copies the CTA-N slice of the row into shared memory at the start of
each output tile and reads each subtile's part from there. A thread only needs the elements of
its own accumulator columns, which every CTA of the tile column reads too (L1/L2 hits), so
``evtc::Sm90RowBroadcastDirect`` (``codegen_templates/include/evtc/sm90_visitors.hpp``) loads them from global
memory into registers, one subtile ahead: no shared memory, no barrier. The cost model times both
the same (the same bytes, one exposed load latency per tile), so the register-direct row wins on
bytes among otherwise equal candidates; where evtc keeps stock's plan (``STOCK_MARGIN``) the
stock row stays. All row broadcasts of a candidate go the same way.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Mapping

from evtc.dtypes import DType
from evtc.errors import ConfigError, PlanError
from evtc.ir.graph import Graph
from evtc.lower import VisitorTree, lower
from evtc.plan import cost as cost_model
from evtc.plan.config import GemmConfig, check_plan_decisions, column_reduction_tile_ok
from evtc.plan.model import Plan
from evtc.ir.nodes import is_gated
from evtc.plan.sm90_buffers import make_plan, plan_glu, plan_packed, plan_unaligned, reduction_mode
from evtc.plan.sm90_layout import GROUPED_MAINLOOP_CARVEOUT, SLOT_C, SLOT_D, aux_label, row_label, shared_storage
from evtc.plan.sm90_space import (Candidate, PlanRequest, candidates, group_quant_tile, group_scale_of,
                                  mainloop_stages)
from evtc.plan.smem import CType
from evtc.plan.target import Target

# SLOT_C, SLOT_D, aux_label, row_label (evtc.emit.sm90) and reduction_mode are re-exported: the
# planner's names stay importable from here.
__all__ = ["POLICIES", "SLOT_C", "SLOT_D", "STOCK_MARGIN", "aux_label", "plan_sm90", "reduction_mode", "row_label"]

POLICIES = ("evtc", "cutlass")
# The cost model ranks plans to within a few percent (docs/planner.md); evtc departs from stock
# CUTLASS's plan only when the model expects it to be this much faster. Measured on the H100: the
# model's 2 % preference for StagesC = 2 without ReuseSmemC over stock's StagesC = 4 with it
# (bias_relu, linear_combination, row_stats: the same bytes and mainloop stages) was wrong by
# up to 7 % at 16384x4096x1024; its 3-5 % preferences (dgelu_bgrad, fp8_out) held.
STOCK_MARGIN = 0.025


# ---- the planner ------------------------------------------------------------------------------------


def plan_sm90(graph: Graph, target: Target, config: GemmConfig, *, a: DType, b: DType,
              policy: str = "evtc", rank: int = 0, fixed: Mapping[str, Any] | None = None) -> Plan:
    """Plan the sm90 epilogue of ``graph``.

    Args:
        graph: the epilogue after passes, legalized for sm90.
        target: the sm90 Target.
        config: GEMM configuration (its ``epilogue_tile`` and ``stages``, when set, are kept).
        a, b: operand dtypes (they size the mainloop stages).
        policy: ``"evtc"`` (search, cost model; stock CUTLASS's plan is kept unless the best
            candidate is estimated more than ``STOCK_MARGIN`` faster) or ``"cutlass"`` (stock
            CUTLASS's rule).
        rank: take the ``rank``-th best candidate instead of the best (for the autotuner); a
            non-negative integer.
        fixed: decisions the caller imposes (the user or the autotuner overriding the cost
            model), any of ``c_slot``, ``d_slot`` (names), ``epilogue_tile``, ``stages_c``,
            ``stages_d``, ``reuse``, ``direct`` (names of the register-direct aux tensors and row
            broadcasts; ``[]`` keeps all of them in shared memory), ``share``
            (True/False, or the (store, load) pairs). Only candidates with all of them compete.

    Returns:
        The Plan.

    Raises:
        PlanError: no candidate leaves the mainloop 2 stages (or ``config.stages``), with the
            smallest epilogue found and what to try; an unknown policy or fixed decision.
        ConfigError: ``rank`` is not a non-negative integer, or past the last legal plan.
    """
    if policy not in POLICIES:
        raise PlanError(f"unknown planning policy '{policy}'", hint=f"use one of {POLICIES}")
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ConfigError(f"plan_rank={rank!r}: the rank of a plan in the cost model's order is an integer >= 0",
                          epilogue=graph.name)
    fixed = check_plan_decisions(fixed or {}, policy=False, epilogue=graph.name)
    if not column_reduction_tile_ok(graph, config):
        raise PlanError(f"tile N = {config.tile[1]}: a column reduction (over M, one value per column) needs a "
                        "tile N of at most 32 or a multiple of 64 (CUTLASS's Sm90RowReduction divides each lane's "
                        "share of the row evenly: sm90_visitor_store_tma_warpspecialized.hpp)", epilogue=graph.name,
                        hint="use a tile N of 64, 128, 192 or 256")
    _check_group_quant(graph, config, fixed)
    if config.grouped:
        # the pointer-array mainloop keeps A's and B's tensor maps in shared memory too
        target = dataclasses.replace(target, smem_capacity=target.smem_capacity - GROUPED_MAINLOOP_CARVEOUT)
    req = PlanRequest(graph, target, config, a, b, policy, fixed, rank)
    if any(is_gated(o) for o in graph.outputs):
        return plan_glu(req)
    if config.unaligned:
        return plan_unaligned(req)
    if config.packed_stores:
        return plan_packed(req)
    # Register-direct aux tensors need N to be a multiple of their 16-byte vector (evtc checks
    # at call time), so the planner only uses them when asked to or when nothing fits without.
    first = not fixed.get("direct")
    for allow_direct in ((False, True) if first else (True,)):
        search = _search(req, allow_direct)
        if search.scored:
            break
    if not search.scored:
        size = search.smallest[0] if search.smallest else 0
        raise PlanError(
            f"no {policy} plan leaves the mainloop {req.need} stages at tile {config.tile}: the smallest epilogue "
            f"takes {size} B of {target.smem_capacity} B, one mainloop stage {req.stage_bytes} B",
            epilogue=graph.name,
            hint="use a smaller tile (e.g. GemmConfig(tile=(128, 128, 64))) or plan='evtc', which can send aux tensors register-direct",
        )
    if rank >= len(search.scored):
        raise ConfigError(f"plan_rank={rank}: the cost model has {len(search.scored)} legal plan"
                          f"{'s' if len(search.scored) > 1 else ''} for this configuration (ranks 0 to "
                          f"{len(search.scored) - 1})", epilogue=graph.name,
                          hint="plan_rank=0 is the cost model's best, 1 the next")
    best = search.scored[rank]
    notes: tuple[str, ...] = ()
    if policy == "evtc" and rank == 0 and not fixed:
        stock = _search(dataclasses.replace(req, policy="cutlass", fixed={}), False)
        if stock.scored:
            s = stock.scored[0]
            if s.stages >= best.stages and best.terms["total_us"] >= (1 - STOCK_MARGIN) * s.terms["total_us"]:
                notes = (f"kept stock CUTLASS's decisions: the cost model's best ({best.terms['total_us']:.0f} us) is "
                         f"within {STOCK_MARGIN:.1%} of them ({s.terms['total_us']:.0f} us)",)
                best = s
    return make_plan(req, best.cand, best.storage, best.stages, best.terms, notes)


def _check_group_quant(graph: Graph, config: GemmConfig, fixed: Mapping[str, Any] | None = None) -> None:
    """What a quantizing epilogue (``evtc.quantize``) needs of the kernel (NOTE [Per-token-group
    quantization in the epilogue], evtc/plan/sm90_space.py).

    Raises:
        PlanError: naming the configuration and what to use instead.
    """
    scales = group_scale_of(graph)
    if scales is None:
        return
    g, tn = scales.group, config.tile[1]
    why = None
    if config.swap_ab:
        why = "swap-AB transposes the tile: a row's groups would lie along the accumulator's M"
    elif config.unaligned or config.packed_stores:
        why = "its store variant (unaligned or packed rows) has no collective D store to quantize"
    elif config.grouped:
        why = "the grouped kernel does not quantize yet"
    elif tn % g:
        why = f"the tile N {tn} is not a multiple of the group {g}"
    elif config.epilogue_tile is not None and tuple(config.epilogue_tile) != group_quant_tile(config, scales):
        why = f"epilogue_tile {tuple(config.epilogue_tile)} is not one group wide ({group_quant_tile(config, scales)})"
    elif (fixed or {}).get("epilogue_tile") is not None and \
            tuple(fixed["epilogue_tile"]) != group_quant_tile(config, scales):
        why = (f"plan={{'epilogue_tile': {tuple(fixed['epilogue_tile'])}}} is not one group wide "
               f"({group_quant_tile(config, scales)})")
    if why:
        raise PlanError(f"'{scales.name}': evtc.quantize with group {g} can't run on this configuration: {why}",
                        epilogue=graph.name, hint=f"use a tile N that is a multiple of {g}, without swap-AB and "
                        "without epilogue_tile (or let the family choose)")


@dataclasses.dataclass(frozen=True)
class _Scored:
    """A candidate that fits, with its layout, mainloop stages and cost terms."""

    key: tuple
    cand: Candidate
    storage: CType
    stages: int
    terms: dict


@dataclasses.dataclass
class _Search:
    scored: list[_Scored]
    smallest: tuple[int, Candidate] | None


def _search(req: PlanRequest, allow_direct: bool) -> _Search:
    """Score every candidate that fits, best first: estimates within 0.1 % tie, ties go to the
    smaller epilogue, then to the earlier candidate."""
    trees: dict[int, VisitorTree] = {}  # by id of the D slot: the C slot only changes a leaf's role

    def tree_of(cand: Candidate) -> VisitorTree:
        key = id(cand.d_slot)
        if key not in trees:
            trees[key] = lower(req.graph, cand.d_slot, None)
        return trees[key]

    memo: dict = {}

    def storage_size(cand: Candidate) -> int:
        return shared_storage(tree_of(cand), cand, req.config, memo).size

    scored: list[_Scored] = []
    smallest: tuple[int, Candidate] | None = None
    matched = False
    for k, cand in enumerate(candidates(req, allow_direct=allow_direct, storage_size=storage_size)):
        if not cand.matches(req.fixed):
            continue
        matched = True
        storage = shared_storage(tree_of(cand), cand, req.config, memo)
        stages = mainloop_stages(req.target.smem_capacity, storage.size, req.stage_bytes)
        if smallest is None or storage.size < smallest[0]:
            smallest = (storage.size, cand)
        if stages < req.need:
            continue
        stages = req.config.stages or stages
        terms = cost_model.estimate(req.graph, cand, req.config, req.target, req.a, req.b, stages)
        bucket = math.floor(math.log(max(terms["total_us"], 1e-9)) / math.log(1.001))
        scored.append(_Scored((bucket, storage.size, k), cand, storage, stages, terms))
    if not matched and allow_direct:
        raise PlanError(f"no {req.policy} plan has the decisions {dict(req.fixed)}", epilogue=req.graph.name,
                        hint="check the names and that the combination is legal (e.g. share needs reuse)")
    scored.sort(key=lambda s: s.key)
    return _Search(scored, smallest)
