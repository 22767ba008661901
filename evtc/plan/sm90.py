"""The Hopper (sm90) planner: shared memory of the TMA warp-specialized epilogue.

Input: a Graph after passes, the Target, a GemmConfig and a policy. Output: a :class:`Plan`.

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
* aux store aliasing (below);

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
visitor owns its storage), so evtc emits ``evtc::Sm90AliasedAuxStore`` (an ``Sm90AuxStore`` with
``Stages = StagesC`` and no storage of its own) and wraps the tree in ``evtc::Sm90SmemAlias``,
which repoints the store at the load's buffer after construction
(``codegen_templates/sm90/visitors.hpp``). Conditions, checked here and in the template: reuse
is on, the load is TMA (not register-direct, not in the C slot), and both have the same element
type, so their smem layouts and copy partitions are the same and each warp reads its block
(ldmatrix) before writing it (stmatrix) in program order, as for C/D reuse.

# NOTE [Row broadcasts without shared memory]
Stock ``Sm90RowBroadcast`` copies the CTA-N slice of the row into shared memory at the start of
each output tile and reads each subtile's part from there. A thread only needs the elements of
its own accumulator columns, which every CTA of the tile column reads too (L1/L2 hits), so
``evtc::Sm90RowBroadcastDirect`` (``codegen_templates/sm90/visitors.hpp``) loads them from global
memory into registers, one subtile ahead: no shared memory, no barrier. The cost model times both
the same (the same bytes, one exposed load latency per tile), so the register-direct row wins on
bytes among otherwise equal candidates; where evtc keeps stock's plan (``STOCK_MARGIN``) the
stock row stays. All row broadcasts of a candidate go the same way.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Mapping

from evtc.dtypes import DType
from evtc.errors import PlanError
from evtc.ir.graph import Graph
from evtc.ir.nodes import AuxLoad, Leaf, Reduction, RowBroadcast, Source, Store
from evtc.passes.dag_to_tree import Topo, Tree, TreeLike, Visitor, VisitorTree, dag_to_tree
from evtc.plan import cost as cost_model
from evtc.plan.config import GemmConfig
from evtc.plan.plan import Buffer, Plan
from evtc.plan.smem import EMPTY, CType, array_aligned, cute_tuple, round_up, struct, union, with_alignas
from evtc.plan.target import Target

POLICIES = ("evtc", "cutlass")
MIN_MAINLOOP_STAGES = 2
# The cost model ranks plans to within a few percent (docs/planner.md); evtc departs from stock
# CUTLASS's plan only when the model expects it to be this much faster. Measured on the H100: the
# model's 2 % preference for StagesC = 2 without ReuseSmemC over stock's StagesC = 4 with it
# (bias_relu, linear_combination, row_stats: the same bytes and mainloop stages) was wrong by
# up to 7 % at 16384x4096x1024; its 3-5 % preferences (dgelu_bgrad, fp8_out) held.
STOCK_MARGIN = 0.025


# ---- CUTLASS's rules, one function each ---------------------------------------------------------


def swizzle_alignment(epi_n: int, elem_bytes: int) -> int:
    """``alignment_for_swizzle`` of the smem layout atom CUTLASS picks for a row-major (N-major)
    epilogue buffer: ``ss_smem_selector`` takes the widest K-major GMMA atom whose row (128, 64
    or 32 bytes) divides the subtile's N extent; ``Swizzle<B,4,3>`` aligns to ``2^(B+7)``
    bytes (``cutlass/detail/layout.hpp``)."""
    row = epi_n * elem_bytes
    for width, align in ((128, 1024), (64, 512), (32, 256)):
        if row % width == 0:
            return align
    return 128


def default_epilogue_tile(config: GemmConfig, d_bits: int) -> tuple[int, int]:
    """``sm90_compute_tile_shape_or_override`` with ``EpilogueTileAuto``."""
    tm, tn, _ = config.tile
    if config.schedule == "cooperative":
        return (min(128, tm), math.gcd(min(32, tn), tn))
    n_perf = 64 if d_bits == 8 and tn % 64 == 0 else 32
    return (min(64, tm), math.gcd(min(n_perf, tn), tn))


def stock_stages(epi_tiles: int, reuse: bool) -> tuple[int, int]:
    """(StagesC, StagesD) of ``sm90_get_tma_dispatch_policy``."""
    stages_d = min(epi_tiles, 2)
    stages_c = max(min(epi_tiles, 4), stages_d + 1) if reuse else min(epi_tiles, 4)
    return stages_c, stages_d


def column_reduction_fits(graph: Graph, config: GemmConfig, epilogue_tile: tuple[int, int], d_slot: Store) -> bool:
    """A column reduction (``Sm90RowReduction``: over M, one value per column) with several
    warps along M reduces across warps in shared memory, borrowing one stage of D's buffer:
    ``CTA_N x warps_M`` f32 values must fit in ``EPI_M x EPI_N`` elements of D
    (``sm90_visitor_store_tma_warpspecialized.hpp``: "smem reduction buffer not large enough").
    Each warp of the epilogue covers 16 rows of the accumulator, so warps_M = EPI_M / 16."""
    if not any(isinstance(o, Reduction) and o.dim == 0 for o in graph.outputs):
        return True
    em, en = epilogue_tile
    warps_m = em // 16
    return config.tile[1] * warps_m * 4 <= em * en * d_slot.dtype.bytes


def mainloop_stage_bytes(config: GemmConfig, a: DType, b: DType) -> int:
    """One mainloop stage: A and B tiles rounded to 128 bytes, plus the stage's barrier pair
    (``sizeof(PipelineTmaAsync<1>::SharedStorage)`` = 16; ``compute_stage_count_or_override``)."""
    tm, tn, tk = config.tile
    return round_up((a.bits * tm * tk + b.bits * tn * tk) // 8, 128) + 16


def mainloop_stages(capacity: int, epilogue_bytes: int, stage_bytes: int) -> int:
    """``StageCountAutoCarveout<epilogue_bytes>``: ``(capacity - carveout) / stage`` with both
    rounded to 128 bytes."""
    return (capacity // 128 * 128 - round_up(epilogue_bytes, 128)) // stage_bytes


# ---- the search space ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One point of the search: everything that changes the shared storage.

    ``alias`` holds (aux store, aux load) pairs whose store writes into the load's buffer
    (NOTE [Aux buffer sharing]); only with ``reuse``.
    """

    c_slot: Leaf | None
    d_slot: Store
    epilogue_tile: tuple[int, int]
    stages_c: int
    stages_d: int
    reuse: bool
    delay: bool
    direct: frozenset[str]  # aux loads/stores and row broadcasts that go register-direct
    alias: frozenset[tuple[str, str]] = frozenset()

    def matches(self, fixed: Mapping[str, Any]) -> bool:
        """Whether this candidate has every decision ``fixed`` asks for (see :func:`plan_sm90`)."""
        for key, want in fixed.items():
            if key == "c_slot":
                got = self.c_slot.name if self.c_slot is not None else None
            elif key == "d_slot":
                got = self.d_slot.name
            elif key == "direct":
                got, want = self.direct, frozenset(want)
            elif key == "alias":
                got = bool(self.alias) if isinstance(want, bool) else self.alias
                want = want if isinstance(want, bool) else frozenset(tuple(p) for p in want)
            elif key == "epilogue_tile":
                got, want = self.epilogue_tile, tuple(want)
            else:
                got = getattr(self, key)
            if got != want:
                return False
        return True


FIXABLE = ("c_slot", "d_slot", "epilogue_tile", "stages_c", "stages_d", "reuse", "direct", "alias")


def _bits(leaf_or_store) -> int:
    return leaf_or_store.dtype.bits


def _aux_loads(graph: Graph) -> list[Leaf]:
    return [n for n in graph.used_inputs if isinstance(n, (AuxLoad, Source))]


def _stores(graph: Graph) -> list[Store]:
    return [o for o in graph.outputs if isinstance(o, Store)]


def slot_choices(graph: Graph, policy: str) -> list[tuple[Leaf | None, Store]]:
    """(C slot, D slot) pairs to consider."""
    stores = _stores(graph)
    if not stores:
        raise PlanError("on sm90 the collective stores D: the epilogue needs an M x N output",
                        epilogue=graph.name)
    sources = [n for n in graph.used_inputs if isinstance(n, Source)]
    named_d = next((s for s in stores if s.name == "D"), stores[0])
    if policy == "cutlass":
        return [(sources[0] if sources else None, named_d)]
    c_options: list[Leaf | None] = list(sources) if sources else [None, *_aux_loads(graph)]
    return [(c, d) for c in c_options for d in stores]


def alias_pairs(graph: Graph, c_slot: Leaf | None, d_slot: Store, direct: frozenset[str]) -> frozenset[tuple[str, str]]:
    """Greedy pairing of TMA aux stores with TMA aux loads of the same element type, one store per
    load, in graph order (NOTE [Aux buffer sharing])."""
    loads = [n for n in _aux_loads(graph) if n is not c_slot and n.name not in direct]
    pairs = []
    for st in _stores(graph):
        if st is d_slot or st.name in direct:
            continue
        host = next((ld for ld in loads if ld.dtype is st.dtype), None)
        if host is not None:
            loads.remove(host)
            pairs.append((st.name, host.name))
    return frozenset(pairs)


def candidates(graph: Graph, config: GemmConfig, policy: str, *, allow_direct: bool = True,
               fixed: Mapping[str, Any] = {}) -> list[Candidate]:
    """Every candidate the policy allows (before the capacity check); with ``allow_direct``
    False, only those that keep every aux tensor on TMA."""
    tm, tn, _ = config.tile
    out: list[Candidate] = []
    rows = frozenset(n.name for n in graph.used_inputs if isinstance(n, RowBroadcast))
    # every row broadcast in shared memory (stock) or every one register-direct
    row_options = [frozenset(), rows] if rows else [frozenset()]
    for c_slot, d_slot in slot_choices(graph, policy):
        reuse_ok = c_slot is not None and _bits(c_slot) == _bits(d_slot) and _bits(d_slot) > 8
        aux = [n.name for n in _aux_loads(graph) if n is not c_slot] + \
              [s.name for s in _stores(graph) if s is not d_slot]
        if policy == "cutlass":
            et = config.epilogue_tile or default_epilogue_tile(config, d_slot.dtype.bits)
            epi_tiles = (tm // et[0]) * (tn // et[1])
            sc, sd = stock_stages(epi_tiles, reuse_ok)
            if not column_reduction_fits(graph, config, et, d_slot):
                continue
            out.append(Candidate(c_slot, d_slot, et, sc, sd, reuse_ok, c_slot is None, frozenset()))
            continue
        tiles = [config.epilogue_tile] if config.epilogue_tile else _tile_options(config)
        for et in tiles:
            if not column_reduction_fits(graph, config, et, d_slot):
                continue
            epi_tiles = (tm // et[0]) * (tn // et[1])
            # StagesD = 1 serializes the stores and StagesC = 1 the loads (measured slower, and
            # never needed for fit): searched only when asked for with `fixed`.
            sds = sorted({1, min(2, epi_tiles)}) if "stages_d" in fixed else [min(2, epi_tiles)]
            has_loads = c_slot is not None or bool(_aux_loads(graph))
            scs = sorted({min(s, epi_tiles) for s in ((1, 2, 3, 4) if "stages_c" in fixed or not has_loads else (2, 3, 4))})
            for sd in sds:
                for sc in scs:
                    for reuse in ((False, True) if reuse_ok else (False,)):
                        if reuse and sd > sc:
                            continue
                        # without C the store may be delayed a subtile (the collective's
                        # default); with reuse that needs StagesC > StagesD or it deadlocks.
                        delay = c_slot is None
                        if delay and reuse and sc <= sd:
                            continue
                        if c_slot is None and not _aux_loads(graph) and sc > 1:
                            continue  # nothing is loaded: StagesC only sizes the barriers
                        for k in range(len(aux) + 1 if allow_direct else 1):
                            for direct, row in itertools.product(itertools.combinations(aux, k), row_options):
                                d = frozenset(direct) | row
                                out.append(Candidate(c_slot, d_slot, et, sc, sd, reuse, delay, d))
                                pairs = alias_pairs(graph, c_slot, d_slot, d) if reuse else frozenset()
                                if pairs:
                                    out.append(Candidate(c_slot, d_slot, et, sc, sd, reuse, delay, d, pairs))
    return out


def _tile_options(config: GemmConfig) -> list[tuple[int, int]]:
    """Epilogue subtiles to search: M is fixed by the schedule (128 cooperative, 64 ping-pong);
    N 16, 32 and, for cooperative, 64. Ping-pong 64x64 subtiles measured 5 % slower than 64x32
    for bias_relu at 16384x4096x1024 (docs/performance.md), so they are not searched."""
    tm, tn, _ = config.tile
    if config.schedule == "cooperative":
        return [(min(128, tm), en) for en in (16, 32, 64) if tn % en == 0]
    return [(min(64, tm), en) for en in (16, 32) if tn % en == 0]


# ---- layout ----------------------------------------------------------------------------------------


def visitor_storage(v: Visitor, cand: Candidate, config: GemmConfig) -> CType:
    """``SharedStorage`` of one visitor."""
    em, en = cand.epilogue_tile
    if v.role == "row":
        if v.name in cand.direct:
            return EMPTY  # evtc::Sm90RowBroadcastDirect
        return struct("Sm90RowBroadcast::SharedStorage",
                      [("smem", array_aligned(v.name, v.node.dtype.bytes, config.tile[1], buffer=v.name))])
    if v.role == "aux_store" and any(st == v.name for st, _ in cand.alias):
        return EMPTY  # evtc::Sm90AliasedAuxStore: lives in its aux load's buffer
    if v.role in ("aux_load", "aux_store") and v.name not in cand.direct:
        stages = cand.stages_c if v.role == "aux_load" else cand.stages_d
        b = v.node.dtype.bytes
        arr = array_aligned(v.name, b, em * en * stages, alignas=swizzle_alignment(en, b), buffer=v.name)
        return struct(f"{v.role}::SharedStorage", [("smem_aux", arr)])
    return EMPTY


def fusion_storage(t: TreeLike, cand: Candidate, config: GemmConfig) -> CType:
    """``FusionCallbacks::SharedStorage`` of a visitor tree (``Sm90VisitorImplBase``: a
    ``cute::tuple`` of the children's storages then the node's own)."""
    if isinstance(t, Tree):
        if not t.children:
            return visitor_storage(t.op, cand, config)
        parts = [fusion_storage(c, cand, config) for c in t.children] + [visitor_storage(t.op, cand, config)]
        return cute_tuple("tuple", parts)
    return cute_tuple("tuple", [fusion_storage(o, cand, config) for o in t.ops])


def collective_storage(cand: Candidate) -> CType:
    """``CollectiveEpilogue::SharedStorage::TensorStorage::collective``."""
    em, en = cand.epilogue_tile
    d = cand.d_slot.dtype
    align_d = swizzle_alignment(en, d.bytes)
    d_stages = cand.stages_c if cand.reuse else cand.stages_d
    smem_d = array_aligned("D", d.bytes, em * en * d_stages, buffer="D")
    if cand.c_slot is None:
        empty_c = dataclasses.replace(EMPTY, name="smem_C")  # cute::array<T, 0>
        return union("CollectiveStorageWithoutC", [("smem_C", empty_c), ("smem_D", with_alignas(smem_d, align_d))])
    c = cand.c_slot.dtype
    align_c = swizzle_alignment(en, c.bytes)
    smem_c = array_aligned("C", c.bytes, em * en * cand.stages_c, buffer="C")
    if cand.reuse:
        a = max(align_c, align_d)
        return union("CollectiveStorageReuseC", [("smem_C", with_alignas(smem_c, a)), ("smem_D", with_alignas(smem_d, a))])
    return struct("CollectiveStorageWithC", [("smem_C", with_alignas(smem_c, align_c)), ("smem_D", with_alignas(smem_d, align_d))])


def shared_storage(tree: VisitorTree, cand: Candidate, config: GemmConfig) -> CType:
    """``sizeof(CollectiveEpilogue::SharedStorage)``'s model: ``{ {collective, thread} tensors;
    LoadPipeline::SharedStorage pipeline; }`` with ``PipelineTransactionAsync<StagesC>``'s two
    arrays of 8-byte barriers."""
    tensors = struct("TensorStorage", [("collective", collective_storage(cand)),
                                       ("thread", fusion_storage(tree.root, cand, config))])
    pipeline = CType("PipelineStorage", 16 * cand.stages_c, 8)
    return struct("SharedStorage", [("tensors", tensors), ("pipeline", pipeline)])


# ---- the planner ------------------------------------------------------------------------------------


def plan_sm90(graph: Graph, target: Target, config: GemmConfig, *, a: DType, b: DType,
              policy: str = "evtc", rank: int = 0, fixed: Mapping[str, Any] | None = None) -> Plan:
    """Plan the sm90 epilogue of ``graph``.

    Args:
        graph: the epilogue after passes.
        target: the sm90 Target.
        config: GEMM configuration (its ``epilogue_tile`` and ``stages``, when set, are kept).
        a, b: operand dtypes (they size the mainloop stages).
        policy: ``"evtc"`` (search, cost model; stock CUTLASS's plan is kept unless the best
            candidate is estimated more than ``STOCK_MARGIN`` faster) or ``"cutlass"`` (stock
            CUTLASS's rule).
        rank: take the ``rank``-th best candidate instead of the best (for the autotuner).
        fixed: decisions the caller imposes (the user or the autotuner overriding the cost
            model), any of ``c_slot``, ``d_slot`` (names), ``epilogue_tile``, ``stages_c``,
            ``stages_d``, ``reuse``, ``direct`` (names of the register-direct aux tensors and row
            broadcasts; ``[]`` keeps all of them in shared memory), ``alias``
            (True/False, or the (store, load) pairs). Only candidates with all of them compete.

    Returns:
        The Plan.

    Raises:
        PlanError: no candidate leaves the mainloop 2 stages (or ``config.stages``), with the
            smallest epilogue found and what to try.
    """
    if policy not in POLICIES:
        raise PlanError(f"unknown planning policy '{policy}'", hint=f"use one of {POLICIES}")
    fixed = dict(fixed or {})
    unknown = sorted(set(fixed) - set(FIXABLE))
    if unknown:
        raise PlanError(f"unknown plan decision{'s' if len(unknown) > 1 else ''} {unknown}", epilogue=graph.name,
                        hint=f"fixable decisions: {', '.join(FIXABLE)}")
    stage_bytes = mainloop_stage_bytes(config, a, b)
    need = config.stages or MIN_MAINLOOP_STAGES
    # Register-direct aux tensors need N to be a multiple of their 16-byte vector (evtc checks
    # at call time), so the planner only uses them when asked to or when nothing fits without.
    first = not fixed.get("direct")
    for allow_direct in ((False, True) if first else (True,)):
        scored, smallest, trees = _score(graph, target, config, policy, fixed, allow_direct, a, b, stage_bytes, need)
        if scored:
            break
    if not scored:
        size = smallest[0] if smallest else 0
        raise PlanError(
            f"no {policy} plan leaves the mainloop {need} stages at tile {config.tile}: the smallest epilogue "
            f"takes {size} B of {target.smem_capacity} B, one mainloop stage {stage_bytes} B",
            epilogue=graph.name,
            hint="use a smaller tile (e.g. GemmConfig(tile=(128, 128, 64))) or plan='evtc', which can send aux tensors register-direct",
        )
    scored.sort(key=lambda s: s[:3])
    _, _, _, cand, storage, stages, terms = scored[min(rank, len(scored) - 1)]
    tree = trees[(id(cand.c_slot), id(cand.d_slot))]
    notes: tuple[str, ...] = ()
    if policy == "evtc" and rank == 0 and not fixed:
        stock, _, stock_trees = _score(graph, target, config, "cutlass", {}, False, a, b, stage_bytes, need)
        if stock:
            _, _, _, s_cand, s_storage, s_stages, s_terms = stock[0]
            if s_stages >= stages and terms["total_us"] >= (1 - STOCK_MARGIN) * s_terms["total_us"]:
                notes = (f"kept stock CUTLASS's decisions: the cost model's best ({terms['total_us']:.0f} us) is "
                         f"within {STOCK_MARGIN:.1%} of them ({s_terms['total_us']:.0f} us)",)
                cand, storage, stages, terms = s_cand, s_storage, s_stages, s_terms
                tree = stock_trees[(id(cand.c_slot), id(cand.d_slot))]
    return _make_plan(graph, target, config, policy, cand, storage, stages, stage_bytes, terms, tree, (a, b), notes)


def _score(graph, target, config, policy, fixed, allow_direct, a, b, stage_bytes, need):
    """(scored candidates, smallest storage seen, visitor trees by slot pair)."""
    trees: dict[tuple[int, int], VisitorTree] = {}
    scored: list[tuple[float, int, int, Candidate, CType, int, dict]] = []
    smallest: tuple[int, Candidate] | None = None
    pool = [c for c in candidates(graph, config, policy, allow_direct=allow_direct, fixed=fixed) if c.matches(fixed)]
    if not pool and allow_direct:
        raise PlanError(f"no {policy} plan has the decisions {fixed}", epilogue=graph.name,
                        hint="check the names and that the combination is legal (e.g. alias needs reuse)")
    for k, cand in enumerate(pool):
        key = (id(cand.c_slot), id(cand.d_slot))
        if key not in trees:
            trees[key] = dag_to_tree(graph, cand.d_slot, cand.c_slot)
        storage = shared_storage(trees[key], cand, config)
        stages = mainloop_stages(target.smem_capacity, storage.size, stage_bytes)
        if smallest is None or storage.size < smallest[0]:
            smallest = (storage.size, cand)
        if stages < need:
            continue
        stages = config.stages or stages
        terms = cost_model.estimate(graph, cand, config, target, a, b, stages)
        # estimates within 0.1 % tie; ties go to the smaller epilogue, then to the earlier candidate
        bucket = math.floor(math.log(max(terms["total_us"], 1e-9)) / math.log(1.001))
        scored.append((bucket, storage.size, k, cand, storage, stages, terms))
    return scored, smallest, trees


def _make_plan(graph, target, config, policy, cand: Candidate, storage: CType, stages: int,
               stage_bytes: int, terms: dict, tree: VisitorTree, operands: tuple[DType, DType],
               extra_notes: tuple[str, ...] = ()) -> Plan:
    em, en = cand.epilogue_tile
    offsets = {t.buffer: off for off, t in storage.leaves() if t.buffer}
    sizes = {t.buffer: t.size for _, t in storage.leaves() if t.buffer}
    buffers: list[Buffer] = []
    c_name = cand.c_slot.name if cand.c_slot is not None else None
    if cand.c_slot is not None:
        promoted = isinstance(cand.c_slot, AuxLoad)
        why = ("aux load promoted into the empty C slot" if promoted else "the source C") + \
              (f"; D reuses it ({cand.c_slot.dtype.bits}-bit C and D)" if cand.reuse else "")
        buffers.append(Buffer(c_name, "C", cand.c_slot.dtype, "tma", cand.stages_c, sizes["C"], offsets["C"],
                              (cand.d_slot.name,) if cand.reuse else (), why))
    d_stages = cand.stages_c if cand.reuse else cand.stages_d
    buffers.append(Buffer(cand.d_slot.name, "D", cand.d_slot.dtype, "shared" if cand.reuse else "tma", d_stages,
                          0 if cand.reuse else sizes["D"], offsets["D"], (c_name,) if cand.reuse else (),
                          "written into C's buffer (ReuseSmemC)" if cand.reuse else "the collective's D"))
    for v in tree.visitors():
        if v.role == "row":
            if any(bb.name == v.name for bb in buffers):
                continue
            if v.name in cand.direct:
                buffers.append(Buffer(v.name, "row_broadcast", v.node.dtype, "direct", 0, 0, -1, (),
                                      "register-direct: each thread loads its columns a subtile ahead "
                                      "(evtc::Sm90RowBroadcastDirect)"))
            else:
                buffers.append(Buffer(v.name, "row_broadcast", v.node.dtype, "smem", 0, sizes[v.name], offsets[v.name],
                                      (), "one CTA-N row (Sm90RowBroadcast)"))
        elif v.role == "aux_store" and any(st == v.name for st, _ in cand.alias):
            host = next(ld for st, ld in cand.alias if st == v.name)
            buffers.append(Buffer(v.name, v.role, v.node.dtype, "shared", cand.stages_c, 0, offsets[host], (host,),
                                  f"written into aux load {host}'s buffer once it is read (evtc::Sm90AliasedAuxStore)"))
        elif v.role in ("aux_load", "aux_store"):
            if v.name in cand.direct:
                buffers.append(Buffer(v.name, v.role, v.node.dtype, "direct", 0, 0, -1, (),
                                      "register-direct (Stages = 0): frees its buffer for mainloop stages"))
            else:
                st = cand.stages_c if v.role == "aux_load" else cand.stages_d
                buffers.append(Buffer(v.name, v.role, v.node.dtype, "tma", st, sizes[v.name], offsets[v.name], (),
                                      f"TMA, {'StagesC' if v.role == 'aux_load' else 'StagesD'} deep"))
    threads = 256 if config.schedule == "cooperative" else 128
    notes = []
    if policy == "evtc" and isinstance(cand.c_slot, AuxLoad):
        notes.append(f"aux load '{c_name}' takes the C slot (the epilogue has no source C)")
    for st, ld in sorted(cand.alias):
        notes.append(f"aux store {st} shares aux load {ld}'s buffer (disjoint lifetimes within each subtile)")
    return Plan(
        arch="sm90", policy=policy, config=config, operands=operands, epilogue_tile=(em, en), fragment_size=em * en // threads,
        stages_c=cand.stages_c, stages_d=cand.stages_d, reuse_smem_c=cand.reuse, delay_tma_store=cand.delay,
        c_slot=c_name, d_slot=cand.d_slot.name, alias=tuple(sorted(cand.alias)), buffers=tuple(buffers), epilogue_smem_bytes=storage.size,
        mainloop_stage_bytes=stage_bytes, mainloop_stages=stages, smem_capacity=target.smem_capacity,
        cost=terms, notes=tuple(notes) + extra_notes, tree=tree,
    )
