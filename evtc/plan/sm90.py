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
import functools
import itertools
import math
from typing import Any, Mapping

from evtc.dtypes import DType
from evtc.errors import ConfigError, IRVerificationError, PlanError
from evtc.ir.axes import ReduceAxis
from evtc.ir.graph import Graph
from evtc.ir.nodes import AuxLoad, Leaf, Reduction, RowBroadcast, ScalarBroadcast, Source, Store
from evtc.iterative import trampoline
from evtc.lower import Role, Tree, TreeLike, Visitor, VisitorTree, lower
from evtc.plan import cost as cost_model
from evtc.plan.config import GemmConfig, atomic_reduction, check_plan_decisions, column_reduction_tile_ok
from evtc.plan.model import Buffer, Plan
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
    """``alignment_for_swizzle`` of the smem layout atom CUTLASS picks for an epilogue buffer:
    ``ss_smem_selector`` takes the widest GMMA atom whose row (128, 64 or 32 bytes) divides the
    subtile's contiguous extent (``epi_n``: N for a row-major buffer, M for a column-major one
    under swap-AB, ``sm90_builder.inl``); ``Swizzle<B,4,3>`` aligns to ``2^(B+7)`` bytes
    (``cutlass/detail/layout.hpp``)."""
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

# NOTE [Bounded search]
# The search is exhaustive where it is small and greedy where it is not, so that planning time
# grows polynomially with the number of tensors (a 40-input epilogue plans in well under a
# second): every (C slot, D slot) pair while there are at most SLOT_PAIRS_EXHAUSTIVE of them, else
# one representative per element width (a slot's bytes and its C/D reuse depend only on that);
# every subset of register-direct aux tensors while there are at most DIRECT_EXHAUSTIVE of them,
# else the prefixes of the tensors ordered by the shared memory they free, largest first (the
# fewest tensors that make a plan fit), from the shortest prefix that fits (found by bisection:
# the storage shrinks with each tensor added) and DIRECT_EXTRA longer ones.
SLOT_PAIRS_EXHAUSTIVE = 16
DIRECT_EXHAUSTIVE = 6
DIRECT_EXTRA = 2


@dataclasses.dataclass(frozen=True)
class Candidate:
    """One point of the search: everything that changes the shared storage.

    ``shares`` holds (aux store, aux load) pairs whose store writes into the load's buffer
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
    shares: frozenset[tuple[str, str]] = frozenset()

    def matches(self, fixed: Mapping[str, Any]) -> bool:
        """Whether this candidate has every decision ``fixed`` asks for (see :func:`plan_sm90`)."""
        for key, want in fixed.items():
            if key == "c_slot":
                got = self.c_slot.name if self.c_slot is not None else None
            elif key == "d_slot":
                got = self.d_slot.name
            elif key == "direct":
                got, want = self.direct, frozenset(want)
            elif key == "share":
                got = bool(self.shares) if isinstance(want, bool) else self.shares
                want = want if isinstance(want, bool) else frozenset(tuple(p) for p in want)
            elif key == "epilogue_tile":
                got, want = self.epilogue_tile, tuple(want)
            else:
                got = getattr(self, key)
            if got != want:
                return False
        return True


FIXABLE = ("c_slot", "d_slot", "epilogue_tile", "stages_c", "stages_d", "reuse", "direct", "share")


@dataclasses.dataclass(frozen=True)
class PlanRequest:
    """What a plan is asked for: the values every step of the sm90 planner shares.

    Attributes:
        graph: the epilogue after passes, legalized for sm90 (it has an M x N output).
        target: the sm90 Target (shared-memory capacity, the cost model's rates).
        config: the validated GemmConfig.
        a, b: operand dtypes (they size the mainloop stages).
        policy: ``"evtc"`` or ``"cutlass"`` (stock CUTLASS's rule).
        fixed: decisions imposed on the search (:data:`FIXABLE` keys).
        rank: take the ``rank``-th best candidate.
    """

    graph: Graph
    target: Target
    config: GemmConfig
    a: DType
    b: DType
    policy: str = "evtc"
    fixed: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    rank: int = 0

    @property
    def stage_bytes(self) -> int:
        return mainloop_stage_bytes(self.config, self.a, self.b)

    @property
    def need(self) -> int:
        """Mainloop stages a plan must leave."""
        return self.config.stages or MIN_MAINLOOP_STAGES


def _bits(leaf_or_store) -> int:
    return leaf_or_store.dtype.bits


def _aux_loads(graph: Graph) -> list[Leaf]:
    return [n for n in graph.used_inputs if isinstance(n, (AuxLoad, Source))]


def _stores(graph: Graph) -> list[Store]:
    return [o for o in graph.outputs if isinstance(o, Store)]


def _by_width(items: list, keep_first=None) -> list:
    """One item per element width, the first of each (``keep_first`` ahead of the others)."""
    out, seen = [], set()
    for x in sorted(items, key=lambda x: x is not keep_first) if keep_first is not None else items:
        bits = x.dtype.bits if x is not None else None
        if bits not in seen:
            seen.add(bits)
            out.append(x)
    return out


def slot_choices(graph: Graph, policy: str, fixed: Mapping[str, Any] = {}) -> list[tuple[Leaf | None, Store]]:
    """(C slot, D slot) pairs to consider (NOTE [Bounded search])."""
    stores = _stores(graph)
    if not stores:
        raise IRVerificationError("the sm90 planner needs a graph legalized for sm90 (one with an M x N output)",
                                  epilogue=graph.name)
    sources = [n for n in graph.used_inputs if isinstance(n, Source)]
    named_d = next((s for s in stores if s.name == "D"), stores[0])
    if policy == "cutlass":
        return [(sources[0] if sources else None, named_d)]
    c_options: list[Leaf | None] = list(sources) if sources else [None, *_aux_loads(graph)]
    d_options: list[Store] = stores
    if len(c_options) * len(d_options) > SLOT_PAIRS_EXHAUSTIVE:
        want_c = fixed.get("c_slot", ...)
        want_d = fixed.get("d_slot", ...)
        keep_c = next((c for c in c_options if (c.name if c is not None else None) == want_c), None) \
            if want_c is not ... else None
        keep_d = next((d for d in d_options if d.name == want_d), named_d)
        c_options = ([None] if None in c_options else []) + _by_width([c for c in c_options if c is not None], keep_c)
        d_options = _by_width(d_options, keep_d)
    return [(c, d) for c in c_options for d in d_options]


def share_pairs(graph: Graph, c_slot: Leaf | None, d_slot: Store, direct: frozenset[str]) -> frozenset[tuple[str, str]]:
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


@dataclasses.dataclass(frozen=True)
class _Base:
    """A candidate without its register-direct set and buffer shares."""

    c_slot: Leaf | None
    d_slot: Store
    epilogue_tile: tuple[int, int]
    stages_c: int
    stages_d: int
    reuse: bool
    delay: bool

    def with_direct(self, direct: frozenset[str], shares: frozenset[tuple[str, str]] = frozenset()) -> Candidate:
        return Candidate(self.c_slot, self.d_slot, self.epilogue_tile, self.stages_c, self.stages_d, self.reuse,
                         self.delay, direct, shares)


def _bases(req: PlanRequest):
    """Every base candidate the policy allows, in the search's order."""
    graph, config, fixed = req.graph, req.config, req.fixed
    tm, tn, _ = config.tile
    for c_slot, d_slot in slot_choices(graph, req.policy, fixed):
        reuse_ok = c_slot is not None and _bits(c_slot) == _bits(d_slot) and _bits(d_slot) > 8
        if req.policy == "cutlass":
            et = config.epilogue_tile or default_epilogue_tile(config, d_slot.dtype.bits)
            epi_tiles = (tm // et[0]) * (tn // et[1])
            sc, sd = stock_stages(epi_tiles, reuse_ok)
            if column_reduction_fits(graph, config, et, d_slot):
                yield _Base(c_slot, d_slot, et, sc, sd, reuse_ok, c_slot is None)
            continue
        tiles = [config.epilogue_tile] if config.epilogue_tile else _tile_options(config)
        has_loads = c_slot is not None or bool(_aux_loads(graph))
        for et in tiles:
            if not column_reduction_fits(graph, config, et, d_slot):
                continue
            epi_tiles = (tm // et[0]) * (tn // et[1])
            # StagesD = 1 serializes the stores and StagesC = 1 the loads (measured slower, and
            # never needed for fit): searched only when asked for with `fixed`.
            sds = sorted({1, min(2, epi_tiles)}) if "stages_d" in fixed else [min(2, epi_tiles)]
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
                        yield _Base(c_slot, d_slot, et, sc, sd, reuse, delay)


def _aux_names(graph: Graph, base: _Base) -> list[str]:
    """The aux loads and stores that could go register-direct, in graph order."""
    return [n.name for n in _aux_loads(graph) if n is not base.c_slot] + \
           [s.name for s in _stores(graph) if s is not base.d_slot]


def _freed_order(graph: Graph, base: _Base) -> list[str]:
    """Aux tensors by the shared memory going register-direct frees, largest first."""
    em, en = base.epilogue_tile
    size = {n.name: n.dtype.bytes * em * en * base.stages_c for n in _aux_loads(graph)}
    size.update({s.name: s.dtype.bytes * em * en * base.stages_d for s in _stores(graph)})
    names = _aux_names(graph, base)
    return sorted(names, key=lambda x: (-size[x], names.index(x)))


def _with_shares(req: PlanRequest, base: _Base, direct: frozenset[str]):
    yield base.with_direct(direct)
    pairs = share_pairs(req.graph, base.c_slot, base.d_slot, direct) if base.reuse else frozenset()
    if pairs:
        yield base.with_direct(direct, pairs)


def candidates(req: PlanRequest, *, allow_direct: bool = True, storage_size=None):
    """Every candidate of the search (NOTE [Bounded search]), before the capacity check; with
    ``allow_direct`` False, only those that keep every aux tensor on TMA. ``storage_size(cand)``
    (bytes) lets the greedy part bisect for the shortest register-direct prefix that fits."""
    graph = req.graph
    rows = frozenset(n.name for n in graph.used_inputs if isinstance(n, RowBroadcast))
    # every row broadcast in shared memory (stock) or every one register-direct
    row_options = [frozenset(), rows] if rows else [frozenset()]
    for base in _bases(req):
        if req.policy == "cutlass":
            yield base.with_direct(frozenset())
            continue
        aux = _aux_names(graph, base)
        if not allow_direct:
            subsets = [()]
        elif len(aux) <= DIRECT_EXHAUSTIVE:
            subsets = [d for k in range(len(aux) + 1) for d in itertools.combinations(aux, k)]
        else:
            order = _freed_order(graph, base)
            subsets = [tuple(order[:k]) for k in _prefix_lengths(req, base, order, row_options, storage_size)]
        for direct in subsets:
            for row in row_options:
                yield from _with_shares(req, base, frozenset(direct) | row)


def _prefix_lengths(req: PlanRequest, base: _Base, order: list[str], row_options, storage_size) -> list[int]:
    """Lengths of the register-direct prefixes of ``order`` to try: from the shortest that fits
    (bisection on the smallest storage of the prefix, which shrinks as the prefix grows)."""
    if storage_size is None:
        return list(range(len(order) + 1))
    limit = req.target.smem_capacity // 128 * 128 - req.need * req.stage_bytes

    def fits(k: int) -> bool:
        direct = frozenset(order[:k]) | row_options[-1]
        return round_up(min(storage_size(c) for c in _with_shares(req, base, direct)), 128) <= limit

    lo, hi = 0, len(order)
    if not fits(hi):
        return [hi]  # nothing fits: the smallest, for the error message
    while lo < hi:
        mid = (lo + hi) // 2
        if fits(mid):
            hi = mid
        else:
            lo = mid + 1
    return list(range(lo, min(len(order), lo + DIRECT_EXTRA) + 1))


def _tile_options(config: GemmConfig) -> list[tuple[int, int]]:
    """Epilogue subtiles to search: M is fixed by the schedule (128 cooperative, 64 ping-pong);
    N 16, 32 and, for cooperative, 64. Ping-pong 64x64 subtiles measured 5 % slower than 64x32
    for bias_relu at 16384x4096x1024 (docs/performance.md), so they are not searched."""
    tm, tn, _ = config.tile
    if config.schedule == "cooperative":
        return [(min(128, tm), en) for en in (16, 32, 64) if tn % en == 0]
    return [(min(64, tm), en) for en in (16, 32) if tn % en == 0]


# ---- layout ----------------------------------------------------------------------------------------

# Buffer labels in the layout model: the collective's slots and each visitor's tensor, so that an
# output named "D" that is an aux store is never confused with the buffer of the D slot.
SLOT_C, SLOT_D = "slot:C", "slot:D"


def aux_label(name: str) -> str:
    return f"aux:{name}"


def row_label(name: str) -> str:
    return f"row:{name}"


def contiguous_extent(cand: Candidate, config: GemmConfig) -> int:
    """The epilogue subtile's contiguous extent: N, or M for the column-major tensors of swap-AB."""
    return cand.epilogue_tile[0] if config.swap_ab else cand.epilogue_tile[1]


def visitor_storage(v: Visitor, cand: Candidate, config: GemmConfig) -> CType:
    """``SharedStorage`` of one visitor."""
    em, en = cand.epilogue_tile
    if v.role is Role.ROW:
        if v.name in cand.direct:
            return EMPTY  # evtc::Sm90RowBroadcastDirect
        return struct("Sm90RowBroadcast::SharedStorage",
                      [("smem", array_aligned(v.name, v.node.dtype.bytes, config.tile[1], buffer=row_label(v.name)))])
    if v.node is cand.c_slot:
        return EMPTY  # the collective's C (Sm90SrcFetch)
    if v.role is Role.AUX_STORE and any(st == v.name for st, _ in cand.shares):
        return EMPTY  # evtc::Sm90SharedAuxStore: lives in its aux load's buffer
    if v.role.is_aux and v.name not in cand.direct:
        stages = cand.stages_c if v.role is Role.AUX_LOAD else cand.stages_d
        b = v.node.dtype.bytes
        arr = array_aligned(v.name, b, em * en * stages, alignas=swizzle_alignment(contiguous_extent(cand, config), b),
                            buffer=aux_label(v.name))
        return struct(f"{v.role.value}::SharedStorage", [("smem_aux", arr)])
    return EMPTY


_STORAGE_ROLES = frozenset({Role.ROW, Role.AUX_LOAD, Role.AUX_STORE})


@functools.lru_cache(maxsize=64)
def _layout_program(root: TreeLike) -> tuple[tuple[str, Any], ...]:
    """The tree's ``SharedStorage`` nesting as a post-order program: ``("v", visitor)`` pushes a
    visitor's storage, ``("t", k)`` pops ``k`` and pushes their ``cute::tuple``, ``("e", None)``
    pushes an empty class (a subtree none of whose visitors can own shared memory). Built once
    per tree, it makes the per-candidate layout a flat loop."""
    program: list[tuple[str, Any]] = []

    def walk(t: TreeLike):
        start = len(program)
        if isinstance(t, Tree):
            for c in t.children:
                yield c
            program.append(("v", t.op))
            if t.children:
                program.append(("t", len(t.children) + 1))
        else:
            for o in t.ops:
                yield o
            program.append(("t", len(t.ops)))
        if not any(op == "v" and arg.role in _STORAGE_ROLES for op, arg in program[start:]):
            del program[start:]
            program.append(("e", None))
        return None

    trampoline(walk, root)
    return tuple(program)


def _storage_key(v: Visitor, cand: Candidate) -> tuple:
    """What :func:`visitor_storage` depends on besides the config."""
    stages = cand.stages_c if v.role is Role.AUX_LOAD else cand.stages_d
    return (id(v), cand.epilogue_tile, stages, v.name in cand.direct, v.node is cand.c_slot,
            any(st == v.name for st, _ in cand.shares))


def fusion_storage(root: TreeLike, cand: Candidate, config: GemmConfig, memo: dict | None = None) -> CType:
    """``FusionCallbacks::SharedStorage`` of a visitor tree (``Sm90VisitorImplBase``: a
    ``cute::tuple`` of the children's storages then the node's own). ``memo`` caches visitor
    storages across the candidates of one search (one config)."""
    stack: list[CType] = []
    for op, arg in _layout_program(root):
        if op == "v":
            if memo is None:
                stack.append(visitor_storage(arg, cand, config))
            else:
                key = _storage_key(arg, cand)
                got = memo.get(key)
                if got is None:
                    got = memo[key] = visitor_storage(arg, cand, config)
                stack.append(got)
        elif op == "e":
            stack.append(EMPTY)
        else:
            parts = stack[len(stack) - arg:]
            del stack[len(stack) - arg:]
            stack.append(cute_tuple("tuple", parts))
    (out,) = stack
    return out


def collective_storage(cand: Candidate, config: GemmConfig) -> CType:
    """``CollectiveEpilogue::SharedStorage::TensorStorage::collective``."""
    em, en = cand.epilogue_tile
    contiguous = contiguous_extent(cand, config)
    d = cand.d_slot.dtype  # with a void D (the unaligned variant): the root store's, its ElementAux
    align_d = swizzle_alignment(contiguous, d.bytes)
    d_stages = cand.stages_c if cand.reuse else cand.stages_d
    smem_d = array_aligned("D", d.bytes, em * en * d_stages, buffer=SLOT_D)
    if cand.c_slot is None:
        empty_c = EMPTY._replace(name="smem_C")  # cute::array<T, 0>
        return union("CollectiveStorageWithoutC", [("smem_C", empty_c), ("smem_D", with_alignas(smem_d, align_d))])
    c = cand.c_slot.dtype
    align_c = swizzle_alignment(contiguous, c.bytes)
    smem_c = array_aligned("C", c.bytes, em * en * cand.stages_c, buffer=SLOT_C)
    if cand.reuse:
        a = max(align_c, align_d)
        return union("CollectiveStorageReuseC", [("smem_C", with_alignas(smem_c, a)), ("smem_D", with_alignas(smem_d, a))])
    return struct("CollectiveStorageWithC", [("smem_C", with_alignas(smem_c, align_c)), ("smem_D", with_alignas(smem_d, align_d))])


def shared_storage(tree: VisitorTree, cand: Candidate, config: GemmConfig, memo: dict | None = None) -> CType:
    """``sizeof(CollectiveEpilogue::SharedStorage)``'s model: ``{ {collective, thread} tensors;
    LoadPipeline::SharedStorage pipeline; }`` with ``PipelineTransactionAsync<StagesC>``'s two
    arrays of 8-byte barriers. ``tree`` may have been lowered with another C slot than
    ``cand``'s: the C slot's leaf has no storage of its own either way."""
    tensors = struct("TensorStorage", [("collective", collective_storage(cand, config)),
                                       ("thread", fusion_storage(tree.root, cand, config, memo))])
    pipeline = CType("PipelineStorage", 16 * cand.stages_c, 8)
    return struct("SharedStorage", [("tensors", tensors), ("pipeline", pipeline)])


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
        ConfigError: ``rank`` is not a non-negative integer.
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
    req = PlanRequest(graph, target, config, a, b, policy, fixed, rank)
    if config.unaligned:
        return _plan_unaligned(req)
    if config.packed_stores:
        return _plan_packed(req)
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
    best = search.scored[min(rank, len(search.scored) - 1)]
    notes: tuple[str, ...] = ()
    if policy == "evtc" and rank == 0 and not fixed:
        stock = _search(dataclasses.replace(req, policy="cutlass", fixed={}), False)
        if stock.scored:
            s = stock.scored[0]
            if s.stages >= best.stages and best.terms["total_us"] >= (1 - STOCK_MARGIN) * s.terms["total_us"]:
                notes = (f"kept stock CUTLASS's decisions: the cost model's best ({best.terms['total_us']:.0f} us) is "
                         f"within {STOCK_MARGIN:.1%} of them ({s.terms['total_us']:.0f} us)",)
                best = s
    return _make_plan(req, best, notes)


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


_REDUCTION_WHY = {
    ReduceAxis.ROW: "Sm90ColReduction: warp shuffles per row, per-tile partials in a float workspace, "
                    "reduced by the last tile of each row with all its threads (evtc::Sm90ColReductionParallel)",
    ReduceAxis.COLUMN: "Sm90RowReduction: across warps through one stage of D's buffer, per-tile partials "
                       "in a float workspace, reduced by the last tile of each column with all its threads "
                       "(evtc::Sm90RowReductionParallel)",
    ReduceAxis.SCALAR: "Sm90ScalarReduction: warp shuffles, one float atomic per warp",
}
_ATOMIC_WHY = {
    ReduceAxis.ROW: "Sm90ColReduction: warp shuffles per row, one float atomic max/min per row and tile into "
                    "the output (set to the identity first): no per-tile fence or tile counter",
    ReduceAxis.COLUMN: "Sm90RowReduction: across warps through one stage of D's buffer, one float atomic max/min "
                       "per column and tile into the output (set to the identity first)",
}


def reduction_mode(n: Reduction, config: GemmConfig) -> tuple[str, str]:
    """(mode, why) of a reduction output on sm90: ``atomic`` or ``workspace``.

    NOTE [Atomic row and column max]: a row or column max (min) into an f32 output goes through
    CUTLASS's atomic path (``Sm90ColReduction`` / ``Sm90RowReduction`` with an atomic
    GmemReduceFn: ``cutlass::atomic_maximum<float>``, sign-aware integer atomics): each tile's
    reduced lanes issue one ``red`` per row (column) into the output, which
    ``initialize_workspace`` fills with the identity on the stream first. The workspace path
    instead writes per-tile partials, ``__threadfence()``s, bumps a tile counter and waits on three
    CTA barriers in every tile, which at 16384x4096x1024 (2048 tiles, a short mainloop) cost the
    row max 1.41x cuBLAS against bias_relu's 0.92x (docs/performance.md). Max and min are exact
    and order-free, so atomics give the same bits in any order (for inputs without NaN: a NaN
    partial is kept or dropped depending on its sign bit by the integer atomics, and on the
    order of the partials on the workspace path); sums stay on the workspace (a fixed order:
    deterministic), and so does any non-f32 output (no 16-bit float atomic max).
    Scalar reductions are always atomic (Sm90ScalarReduction has no other implementation).
    Where ``config.atomic_reductions`` is None, members with the stream-K scheduler keep the
    workspace: CUTLASS's atomic scalar reduction came out wrong under the stream-K decomposition
    on the H100 (NOTE [Scalar reductions and stream-K], evtc/gemm.py), which row and column
    reductions through the workspace did not, so a kernel with atomic reductions never runs that
    decomposition; the default family sets True on its stream-K-scheduler members (``streamk``,
    ``kheavy``) for an epilogue whose row and column reductions are all atomic-capable, which then
    run data-parallel or split-K (NOTE [Atomic reductions in the stream-K members],
    evtc/family/spec.py).
    """
    axis = ReduceAxis.of(n.dim)
    if not atomic_reduction(n, config):
        return "workspace", _REDUCTION_WHY[axis]
    return "atomic", _REDUCTION_WHY[axis] if axis is ReduceAxis.SCALAR else _ATOMIC_WHY[axis]


def _make_plan(req: PlanRequest, best: _Scored, extra_notes: tuple[str, ...] = ()) -> Plan:
    cand, storage, config, graph = best.cand, best.storage, req.config, req.graph
    tree = lower(graph, cand.d_slot, cand.c_slot)
    em, en = cand.epilogue_tile
    offsets = {t.buffer: off for off, t in storage.leaves() if t.buffer}
    sizes = {t.buffer: t.size for _, t in storage.leaves() if t.buffer}
    buffers: list[Buffer] = []
    c_name = cand.c_slot.name if cand.c_slot is not None else None
    d_name = cand.d_slot.name
    if cand.c_slot is not None:
        promoted = isinstance(cand.c_slot, AuxLoad)
        why = ("aux load promoted into the empty C slot" if promoted else "the source C") + \
              (f"; D reuses it ({cand.c_slot.dtype.bits}-bit C and D)" if cand.reuse else "")
        buffers.append(Buffer(c_name, "C", cand.c_slot.dtype, "tma", cand.stages_c, sizes[SLOT_C], offsets[SLOT_C],
                              (d_name,) if cand.reuse else (), why))
    d_stages = cand.stages_c if cand.reuse else cand.stages_d
    d_why = "written into C's buffer (ReuseSmemC)" if cand.reuse else "the collective's D"
    if d_name != "D" and any(s.name == "D" for s in _stores(graph)):
        d_why += f"; '{d_name}' takes the D slot so that it can reuse C's buffer" if cand.reuse else \
            f"; '{d_name}' takes the D slot"
    buffers.append(Buffer(d_name, "D", cand.d_slot.dtype, "shared" if cand.reuse else "tma", d_stages,
                          0 if cand.reuse else sizes[SLOT_D], offsets[SLOT_D], (c_name,) if cand.reuse else (), d_why))
    shares = dict(cand.shares)
    for v in tree.visitors():
        n = v.node
        if v.role is Role.ROW:
            if any(bb.name == v.name for bb in buffers):
                continue
            if v.name in cand.direct:
                buffers.append(Buffer(v.name, "row_broadcast", n.dtype, "direct", 0, 0, -1, (),
                                      "register-direct: each thread loads its columns a subtile ahead "
                                      "(evtc::Sm90RowBroadcastDirect)"))
            else:
                label = row_label(v.name)
                buffers.append(Buffer(v.name, "row_broadcast", n.dtype, "smem", 0, sizes[label], offsets[label],
                                      (), "one CTA-N row (Sm90RowBroadcast)"))
        elif v.role is Role.AUX_STORE and v.name in shares:
            host = shares[v.name]
            buffers.append(Buffer(v.name, "aux_store", n.dtype, "shared", cand.stages_c, 0, offsets[aux_label(host)],
                                  (host,), f"written into aux load {host}'s buffer once it is read "
                                           "(evtc::Sm90SharedAuxStore)"))
        elif v.role.is_aux:
            if v.name in cand.direct:
                buffers.append(Buffer(v.name, v.role.value, n.dtype, "direct", 0, 0, -1, (),
                                      "register-direct (Stages = 0): frees its buffer for mainloop stages"))
            else:
                st = cand.stages_c if v.role is Role.AUX_LOAD else cand.stages_d
                label = aux_label(v.name)
                buffers.append(Buffer(v.name, v.role.value, n.dtype, "tma", st, sizes[label], offsets[label], (),
                                      f"TMA, {'StagesC' if v.role is Role.AUX_LOAD else 'StagesD'} deep"))
        elif v.role is Role.COL and not any(bb.name == v.name for bb in buffers):
            buffers.append(Buffer(v.name, "col_broadcast", n.dtype, "registers", 0, 0, -1, (),
                                  "Sm90ColBroadcast: each thread loads its rows into registers"))
        elif v.role is Role.SCALAR and isinstance(n, ScalarBroadcast) and n.by_pointer \
                and not any(bb.name == v.name for bb in buffers):
            buffers.append(Buffer(v.name, "scalar", n.dtype, "registers", 0, 0, -1, (),
                                  "Sm90ScalarBroadcast: read once per batch"))
        elif v.role.is_reduction:
            mode, why = reduction_mode(n, config)
            buffers.append(Buffer(v.name, v.role.value, n.dtype, mode, 0, 0, -1, (), why))
    threads = 256 if config.schedule == "cooperative" else 128
    notes = []
    if req.policy == "evtc" and isinstance(cand.c_slot, AuxLoad):
        notes.append(f"aux load '{c_name}' takes the C slot (the epilogue has no source C)")
    for st, ld in sorted(cand.shares):
        notes.append(f"aux store {st} shares aux load {ld}'s buffer (disjoint lifetimes within each subtile)")
    return Plan(
        arch="sm90", policy=req.policy, config=config, operands=(req.a, req.b), epilogue_tile=(em, en),
        fragment_size=em * en // threads, stages_c=cand.stages_c, stages_d=cand.stages_d, reuse_smem_c=cand.reuse,
        delay_tma_store=cand.delay, c_slot=c_name, d_slot=d_name, shares=tuple(sorted(cand.shares)),
        buffers=tuple(buffers), epilogue_smem_bytes=storage.size, mainloop_stage_bytes=req.stage_bytes,
        mainloop_stages=best.stages, smem_capacity=req.target.smem_capacity, cost=best.terms,
        notes=tuple(notes) + extra_notes, tree=tree,
    )


def _plan_unaligned(req: PlanRequest) -> Plan:
    """The plan of the unaligned variant (``GemmConfig.unaligned``): void C and void D in the
    collective, every M x N tensor register-direct with per-element predicates, the output that
    would take the D slot stored by an ``Sm90AuxStore<0>`` wrapped around the whole tree (its
    ``ElementAux`` is what the collective falls back to for its buffer types,
    ``sm90_callbacks_tma_warpspecialized.hpp`` ``get_element_aux``). The collective still holds
    ``smem_D`` (``CollectiveStorageWithoutC``): the column reductions' scratch. Row broadcasts
    stay stock (``Sm90RowBroadcast`` predicates each element)."""
    graph, config = req.graph, req.config
    stores, top, tree, et, epi_tiles = _void_cd_tree(req, "the unaligned variant")
    direct = frozenset(n.name for n in _aux_loads(graph)) | frozenset(s.name for s in stores)
    cand = Candidate(None, top, et, 1, min(2, epi_tiles), False, False, direct)
    storage = shared_storage(tree, cand, config)
    stages = _void_cd_stages(req, "the unaligned variant",
                             mainloop_stages(req.target.smem_capacity, storage.size, req.stage_bytes))
    offsets, sizes, buffers = _void_d_buffers(storage, top, cand)
    for v in tree.visitors():
        n = v.node
        if v.role.is_aux:
            buffers.append(Buffer(v.name, v.role.value, n.dtype, "direct", 0, 0, -1, (),
                                  "register-direct, one element per access: rows need no 16-byte alignment"))
        elif v.role is Role.ROW and not any(b.name == v.name for b in buffers):
            label = row_label(v.name)
            buffers.append(Buffer(v.name, "row_broadcast", n.dtype, "smem", 0, sizes[label], offsets[label], (),
                                  "one CTA-N row (Sm90RowBroadcast, element-wise predicated)"))
        elif v.role.is_reduction:
            mode, why = reduction_mode(n, config)
            buffers.append(Buffer(v.name, v.role.value, n.dtype, mode, 0, 0, -1, (), why))
    return _void_cd_plan(req, tree, et, cand, storage, stages, buffers,
                         f"unaligned variant: void C and D, '{top.name}' and every M x N tensor register-direct")


def _void_cd_tree(req: PlanRequest, variant: str):
    """The tree of a variant with void C and D in the collective (unaligned, packed stores): the
    output that would take the D slot stored by an aux store wrapped around the whole tree.
    Returns (stores, that output, the tree, the epilogue tile, subtiles per CTA tile)."""
    graph, config = req.graph, req.config
    if req.fixed or req.policy != "evtc":
        raise PlanError(f"{variant} has one plan: no fixed decisions or stock policy", epilogue=graph.name)
    stores = _stores(graph)
    top = next((s for s in stores if s.name == "D"), stores[0])
    inner = lower(graph, top, None)
    tree = dataclasses.replace(inner, root=Tree(Visitor(top, Role.AUX_STORE), (inner.root,)))
    et = config.epilogue_tile or default_epilogue_tile(config, top.dtype.bits)
    tm, tn, _ = config.tile
    if not column_reduction_fits(graph, config, et, top):
        raise PlanError(f"the column reductions need more than the epilogue tile {et} of '{top.name}' as scratch",
                        epilogue=graph.name, hint="use a larger epilogue_tile")
    return stores, top, tree, et, (tm // et[0]) * (tn // et[1])


def _void_cd_stages(req: PlanRequest, variant: str, stages: int) -> int:
    """The mainloop stages of a void-C-and-D variant: ``config.stages`` if pinned, else the
    ``stages`` its epilogue leaves, which must be at least the mainloop's minimum.

    Raises:
        PlanError: fewer stages are left than the mainloop needs.
    """
    if stages < req.need:
        raise PlanError(f"{variant} leaves {stages} mainloop stages at tile {req.config.tile}",
                        epilogue=req.graph.name, hint="use a smaller tile")
    return req.config.stages or stages


def _void_d_buffers(storage, top, cand: Candidate):
    """(offsets, sizes, [the collective's void D buffer]) of a void-C-and-D plan's storage."""
    offsets = {t.buffer: o for o, t in storage.leaves() if t.buffer}
    sizes = {t.buffer: t.size for _, t in storage.leaves() if t.buffer}
    return offsets, sizes, [Buffer(top.name, "D", top.dtype, "smem", cand.stages_d, sizes[SLOT_D], offsets[SLOT_D], (),
                                   "the collective's (void) D buffer: not stored from, the column reductions' "
                                   "scratch")]


def _void_cd_plan(req: PlanRequest, tree, et, cand: Candidate, storage, stages: int, buffers: list,
                  note: str) -> Plan:
    config = req.config
    threads = 256 if config.schedule == "cooperative" else 128
    return Plan(
        arch="sm90", policy="evtc", config=config, operands=(req.a, req.b), epilogue_tile=et,
        fragment_size=et[0] * et[1] // threads, stages_c=cand.stages_c, stages_d=cand.stages_d, reuse_smem_c=False,
        delay_tma_store=False, c_slot=None, d_slot=None, shares=(), buffers=tuple(buffers),
        epilogue_smem_bytes=storage.size, mainloop_stage_bytes=req.stage_bytes, mainloop_stages=stages,
        smem_capacity=req.target.smem_capacity, cost={}, notes=(note,), tree=tree,
    )


def _plan_packed(req: PlanRequest) -> Plan:
    """The plan of the packed-store variant (``GemmConfig.packed_stores``).

    NOTE [Stores into packed rows]: a caller's packed M x N output whose rows are not 16-byte
    aligned (N = 50257 in bf16) can't take CUTLASS's TMA store, whose descriptor needs a 16-byte
    aligned base and 16-byte multiples for every global stride (cuTensorMapEncodeTiled). Eight
    descriptors, one per row phase (row mod 8, whose rows share an alignment), faulted on the
    H100 wherever a box's first column was not 16-byte aligned (docs/performance.md,
    2026-11-26), and the unaligned variant's register-direct stores (the accumulator fragment's
    layout: a warp's store touches 8 rows, 2 bytes each) cost 14 % at 4096 x 50257 x 4096.
    ``evtc::Sm90AuxStorePacked`` (codegen_templates/include/evtc/sm90_packed_store.hpp) writes each
    epilogue subtile to shared memory as a TMA store would (stmatrix, the stock swizzled layout),
    and where CUTLASS's collective would issue the TMA store (between two barriers of all epilogue
    threads) the epilogue threads store it: each warp a band of rows, each lane every 32nd column,
    so one store instruction writes 32 consecutive elements of a row, predicated on M and N
    (nothing outside the tensor is written whatever the alignment), with shared-memory addresses
    that need no layout arithmetic per element (the header says why and what was measured).
    On the H100 at 4096 x 50257 x 4096 (caller's packed tensors, over the aligned N = 50264): a
    row-max epilogue 1.04x, bias_relu 1.20x (its staged C alone 1.12x); an epilogue with two
    outputs and two loads 2.7x (1.65x without any copy; 1.9x on the spill-free `large` and
    pp64x256 tiles, so not its spills: Nsight Compute puts 32 % of its stalls on instruction
    fetch, docs/performance.md), which the staging route therefore copies back by default
    (``EVTC_PACKED_STORES``, evtc/dispatch/staging.py).

    The plan: void C and void D in the collective (as the unaligned variant), the output that
    would take the D slot stored by a packed store wrapped around the whole tree, every other M x
    N store packed too, every M x N load (C included) a TMA aux load (its rows must be 16-byte
    aligned: the staging route copies misaligned ones, evtc/dispatch/staging.py), stock stage
    counts (``sm90_get_tma_dispatch_policy``: StagesC = min(subtiles, 4), StagesD = min(subtiles,
    2)), fewer load stages if the mainloop would keep fewer than 2."""
    graph, config = req.graph, req.config
    stores, top, tree, et, epi_tiles = _void_cd_tree(req, "the packed-store variant")
    bad = [s.name for s in stores if s.dtype.bits < 8]
    if bad:
        raise PlanError(f"packed stores write whole bytes; {bad} have elements of fewer than 8 bits",
                        epilogue=graph.name, hint="let evtc allocate the outputs (rows padded to 16 bytes)")
    vec = 128 // top.dtype.bits
    if et[1] % vec:
        raise PlanError(f"packed stores need an epilogue tile N that is a multiple of the 16-byte vector ({vec} "
                        f"elements of {top.dtype.name}), not {et[1]}", epilogue=graph.name,
                        hint=f"use an epilogue_tile N of {max(vec, 32)}")
    stages_c0, stages_d = stock_stages(epi_tiles, False)
    cand = storage = None
    stages = 0
    for stages_c in range(stages_c0, 0, -1):
        cand = Candidate(None, top, et, stages_c, stages_d, False, False, frozenset())
        storage = shared_storage(tree, cand, config)
        stages = mainloop_stages(req.target.smem_capacity, storage.size, req.stage_bytes)
        if stages >= req.need:
            break
    stages = _void_cd_stages(req, "the packed-store variant", stages)
    offsets, sizes, buffers = _void_d_buffers(storage, top, cand)
    for v in tree.visitors():
        n = v.node
        if v.role is Role.AUX_LOAD:
            label = aux_label(v.name)
            buffers.append(Buffer(v.name, "aux_load", n.dtype, "tma", cand.stages_c, sizes[label], offsets[label], (),
                                  "TMA, StagesC deep (rows 16-byte aligned)"))
        elif v.role is Role.AUX_STORE:
            label = aux_label(v.name)
            buffers.append(Buffer(v.name, "aux_store", n.dtype, "packed", cand.stages_d, sizes[label], offsets[label],
                                  (), "shared memory, then stored by the epilogue threads, 32 consecutive "
                                      "elements of a row per instruction: rows need only be element-aligned "
                                      "(evtc::Sm90AuxStorePacked)"))
        elif v.role is Role.ROW and not any(b.name == v.name for b in buffers):
            label = row_label(v.name)
            buffers.append(Buffer(v.name, "row_broadcast", n.dtype, "smem", 0, sizes[label], offsets[label], (),
                                  "one CTA-N row (Sm90RowBroadcast)"))
        elif v.role is Role.COL and not any(b.name == v.name for b in buffers):
            buffers.append(Buffer(v.name, "col_broadcast", n.dtype, "registers", 0, 0, -1, (),
                                  "Sm90ColBroadcast: each thread loads its rows into registers"))
        elif v.role.is_reduction:
            mode, why = reduction_mode(n, config)
            buffers.append(Buffer(v.name, v.role.value, n.dtype, mode, 0, 0, -1, (), why))
    return _void_cd_plan(req, tree, et, cand, storage, stages, buffers,
                         f"packed-store variant: void C and D, '{top.name}' and every M x N output stored from "
                         "shared memory by the epilogue threads, row by row")
