"""The sm90 planner's search space: CUTLASS's sizing rules and the candidates a plan is chosen from.

Input: a :class:`PlanRequest` (the graph after passes, the Target, the GemmConfig, the operand
dtypes, the policy and any fixed decisions). Output: the :class:`Candidate` s of the search, in
its order, before the capacity check (NOTE [Bounded search]), and the CUTLASS rules that size
mainloop stages and epilogue stages (one function each). :mod:`evtc.plan.sm90` ranks them.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Mapping

from evtc.dtypes import DType
from evtc.errors import IRVerificationError
from evtc.ir.graph import Graph
from evtc.ir.nodes import AuxLoad, GroupScale, Leaf, Reduction, RowBroadcast, Source, Store
from evtc.plan.config import GemmConfig
from evtc.plan.smem import round_up
from evtc.plan.target import Target

__all__ = [
    "Candidate", "DIRECT_EXHAUSTIVE", "DIRECT_EXTRA", "FIXABLE", "MIN_MAINLOOP_STAGES", "PlanRequest",
    "SLOT_PAIRS_EXHAUSTIVE", "candidates", "column_reduction_fits", "default_epilogue_tile", "mainloop_stage_bytes",
    "mainloop_stages", "share_pairs", "slot_choices", "stock_stages", "swizzle_alignment",
]

MIN_MAINLOOP_STAGES = 2


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


def group_scale_of(graph: Graph) -> GroupScale | None:
    """The scales output of ``evtc.quantize``, if the epilogue quantizes D (at most one:
    the quantization is D's)."""
    return next((o for o in graph.outputs if isinstance(o, GroupScale)), None)


def group_quant_tile(config: GemmConfig, scales: GroupScale) -> tuple[int, int]:
    """The epilogue subtile of a quantizing epilogue: the schedule's rows by one group.

    NOTE [Per-token-group quantization in the epilogue]: the collective hands the root visitor
    one subtile's values in registers before it converts them to D's type and stores them
    (``reduce(..., visit_results)`` in ``sm90_epilogue_tma_warpspecialized.hpp``). A subtile N
    wide of exactly one group (32, 64 or 128 columns, aligned to the group since the tile N is a
    multiple of it) holds every element of each of its row's groups, so the group's amax is a
    reduction over the subtile's row: over the thread's own elements of that row, then across
    the four lanes of a quad, which hold a row's columns in the WGMMA accumulator layout (PTX
    ISA, "Register fragment wgmma .m64nNk16": row = 16 warp + lane / 4 (+ 8), column = 2 (lane
    % 4) (+ 1, + 8 j)). The scale then quantizes the subtile in place before the conversion,
    and D's TMA store writes fp8 (include/evtc/sm90_group_quant.hpp)."""
    tm = config.tile[0]
    return (min(128, tm) if config.schedule == "cooperative" else min(64, tm), scales.group)


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


@dataclasses.dataclass(frozen=True)
class Candidate(_Base):
    """One point of the search: everything that changes the shared storage (a :class:`_Base`
    and the following two fields).

    ``shares`` holds (aux store, aux load) pairs whose store writes into the load's buffer
    (NOTE [Aux buffer sharing]); only with ``reuse``.
    """

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
    scales = group_scale_of(graph)
    if scales is not None:  # the quantized output is D (NOTE [Per-token-group quantization in the epilogue])
        named_d = next(s for s in stores if s.value is scales.value)
        stores = [named_d]
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


def _bases(req: PlanRequest):
    """Every base candidate the policy allows, in the search's order."""
    graph, config, fixed = req.graph, req.config, req.fixed
    tm, tn, _ = config.tile
    scales = group_scale_of(graph)
    quant_tile = group_quant_tile(config, scales) if scales is not None else None
    for c_slot, d_slot in slot_choices(graph, req.policy, fixed):
        reuse_ok = c_slot is not None and _bits(c_slot) == _bits(d_slot) and _bits(d_slot) > 8
        if req.policy == "cutlass":
            et = quant_tile or config.epilogue_tile or default_epilogue_tile(config, d_slot.dtype.bits)
            epi_tiles = (tm // et[0]) * (tn // et[1])
            sc, sd = stock_stages(epi_tiles, reuse_ok)
            if column_reduction_fits(graph, config, et, d_slot):
                yield _Base(c_slot, d_slot, et, sc, sd, reuse_ok, c_slot is None and not config.grouped)
            continue
        tiles = [quant_tile] if quant_tile else [config.epilogue_tile] if config.epilogue_tile else _tile_options(config)
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
                        # (never in the grouped kernel: CUTLASS's builder turns it off for
                        # pointer-array schedules, sm90_get_tma_dispatch_policy in sm90_builder.inl)
                        delay = c_slot is None and not req.config.grouped
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
