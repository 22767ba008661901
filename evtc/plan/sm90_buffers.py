"""The sm90 plan's buffers: a chosen candidate written out as a :class:`~evtc.plan.model.Plan`.

Input: a :class:`~evtc.plan.sm90_space.PlanRequest` and the chosen candidate with its storage
layout, mainloop stages and cost terms; or, for the two variants with void C and D (unaligned,
packed stores), the request alone. Output: the Plan: one :class:`~evtc.plan.model.Buffer` per
tensor (where it lives, how deep, why), reductions with their mode (NOTE [Atomic row and column
max]), and the notes.
"""

from __future__ import annotations

import dataclasses

from evtc.errors import ConfigError, PlanError
from evtc.ir.axes import ReduceAxis
from evtc.ir.nodes import AuxLoad, Reduction, ScalarBroadcast, is_gated
from evtc.lower import Role, Tree, Visitor, lower
from evtc.plan.config import GemmConfig, atomic_reduction
from evtc.plan.model import Buffer, Plan
from evtc.plan.sm90_layout import SLOT_C, SLOT_D, aux_label, row_label, shared_storage
from evtc.plan.sm90_space import (
    Candidate,
    PlanRequest,
    _aux_loads,
    _stores,
    column_reduction_fits,
    default_epilogue_tile,
    mainloop_stages,
    stock_stages,
)
from evtc.plan.smem import CType

__all__ = ["make_plan", "plan_glu", "plan_packed", "plan_unaligned", "reduction_mode"]

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
    if config.grouped:
        return "atomic", ("per group, float atomics through a per-group pointer, the output filled with the identity "
                          "first (evtc::Sm90ReductionGrouped: NOTE [Reductions in the grouped kernel])")
    if not atomic_reduction(n, config):
        return "workspace", _REDUCTION_WHY[axis]
    return "atomic", _REDUCTION_WHY[axis] if axis is ReduceAxis.SCALAR else _ATOMIC_WHY[axis]


def _group_scale_buffer(name: str, n) -> Buffer:
    """The plan's row for evtc.quantize's scales (a GroupScale ``n``): written from registers, in
    the layout the output declares."""
    return Buffer(name, "group_scale", n.dtype, "direct", 0, 0, -1, (),
                  f"register-direct: one f32 per row and group, {n.layout}, from the thread holding the "
                  "group's first column (evtc::Sm90GroupQuant)")


def make_plan(req: PlanRequest, cand: Candidate, storage: CType, stages: int, cost: dict,
              extra_notes: tuple[str, ...] = ()) -> Plan:
    """The Plan of ``cand``, the candidate the ranking chose, with its ``storage`` layout, the
    mainloop ``stages`` it leaves and its ``cost`` terms."""
    config, graph = req.config, req.graph
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
        elif v.role is Role.GROUP_SCALE:
            buffers.append(_group_scale_buffer(v.name, n))
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
        mainloop_stages=stages, smem_capacity=req.target.smem_capacity, cost=cost,
        notes=tuple(notes) + extra_notes, tree=tree,
    )


def plan_unaligned(req: PlanRequest) -> Plan:
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
        elif v.role is Role.GROUP_SCALE:
            buffers.append(_group_scale_buffer(v.name, n))
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


def _fit_load_stages(req: PlanRequest, tree, top, et, epi_tiles: int, direct: frozenset, variant: str):
    """(candidate, storage, mainloop stages) of a void-C-and-D variant with stock stage counts
    (``sm90_get_tma_dispatch_policy``), fewer load stages while the mainloop would keep fewer
    than it needs.

    Raises:
        PlanError: even one load stage leaves the mainloop too few (:func:`_void_cd_stages`).
    """
    stages_c0, stages_d = stock_stages(epi_tiles, False)
    cand = storage = None
    stages = 0
    for stages_c in range(stages_c0, 0, -1):
        cand = Candidate(None, top, et, stages_c, stages_d, False, False, direct)
        storage = shared_storage(tree, cand, req.config)
        stages = mainloop_stages(req.target.smem_capacity, storage.size, req.stage_bytes)
        if stages >= req.need:
            break
    return cand, storage, _void_cd_stages(req, variant, stages)


def _broadcast_buffer(v, buffers: list, sizes: dict, offsets: dict) -> Buffer | None:
    """The row of a void-C-and-D plan for a row or column broadcast visitor ``v`` not listed yet
    (a row broadcast in shared memory, a column broadcast in registers), else None."""
    if any(b.name == v.name for b in buffers):
        return None
    if v.role is Role.ROW:
        label = row_label(v.name)
        return Buffer(v.name, "row_broadcast", v.node.dtype, "smem", 0, sizes[label], offsets[label], (),
                      "one CTA-N row (Sm90RowBroadcast)")
    if v.role is Role.COL:
        return Buffer(v.name, "col_broadcast", v.node.dtype, "registers", 0, 0, -1, (),
                      "Sm90ColBroadcast: each thread loads its rows into registers")
    return None


def plan_packed(req: PlanRequest) -> Plan:
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
    cand, storage, stages = _fit_load_stages(req, tree, top, et, epi_tiles, frozenset(), "the packed-store variant")
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
        elif v.role in (Role.ROW, Role.COL):
            row = _broadcast_buffer(v, buffers, sizes, offsets)
            if row is not None:
                buffers.append(row)
        elif v.role is Role.GROUP_SCALE:
            buffers.append(_group_scale_buffer(v.name, n))
        elif v.role.is_reduction:
            mode, why = reduction_mode(n, config)
            buffers.append(Buffer(v.name, v.role.value, n.dtype, mode, 0, 0, -1, (), why))
    return _void_cd_plan(req, tree, et, cand, storage, stages, buffers,
                         f"packed-store variant: void C and D, '{top.name}' and every M x N output stored from "
                         "shared memory by the epilogue threads, row by row")


def plan_glu(req: PlanRequest) -> Plan:
    """The plan of a gated epilogue (``evtc.glu``: NOTE [The gated epilogue] in
    include/evtc/sm90_glu_store.hpp): void C and void D in the collective, the glu's store an
    ``evtc::Sm90GluStore`` wrapped around the tree of the glu's operand (the glu compute itself
    is that visitor's work, not a visitor), which writes each subtile's EpiM x EpiN/2 result into
    the collective's D buffer of the subtile (free, D being void) and stores it by TMA where the
    collective would store D; every M x N load (C included) a TMA aux load; stock stage counts
    (``sm90_get_tma_dispatch_policy``), fewer load stages if the mainloop would keep fewer than 2.

    Raises:
        PlanError: a configuration the gated store can't run (swap-AB, the unaligned or packed
            variants, fixed plan decisions), or an output row of the half subtile that is not a
            whole 16-byte TMA vector (the grouped kernel stores register-direct instead).
        ConfigError: a plan rank other than 0 (there is one plan).
    """
    graph, config = req.graph, req.config
    top = next(o for o in graph.outputs if is_gated(o))
    why = None
    if config.swap_ab:
        why = "swap-AB transposes the tile: a (gate, up) pair would lie along the accumulator's M, across threads"
    elif config.unaligned or config.packed_stores:
        why = "its store variant (unaligned or packed rows) stores full rows"
    elif req.fixed or req.policy != "evtc":
        why = "the gated store has one plan: no fixed decisions or stock policy"
    if why:
        raise PlanError(f"'{top.name}': evtc.glu can't run on this configuration: {why}", epilogue=graph.name,
                        hint="use a configuration without swap_ab, unaligned, packed_stores and plan decisions "
                             "(or let the family choose)")
    if req.rank:  # (as plan_sm90 refuses a rank past its last legal plan)
        raise ConfigError(f"plan_rank={req.rank}: the gated store has 1 legal plan for this configuration (rank 0)",
                          epilogue=graph.name, hint="leave plan_rank at 0 for an epilogue with evtc.glu")
    inner = lower(graph, top, None)
    root = inner.root
    if not (isinstance(root, Tree) and root.op.node is top.value and len(root.children) == 1):  # rule glu-store
        raise PlanError(f"'{top.name}': the glu's value is computed by more than its store (a bug in evtc)",
                        epilogue=graph.name)
    tree = dataclasses.replace(inner, root=Tree(Visitor(top, Role.GLU_STORE), root.children))
    et = config.epilogue_tile or default_epilogue_tile(config, top.dtype.bits)
    tm, tn, _ = config.tile
    if ((et[1] // 2) * top.dtype.bytes % 16 and not config.grouped) or et[1] % 2 or tn % et[1] or tm % et[0]:
        raise PlanError(f"'{top.name}': the gated store writes rows of EpiN / 2 = {et[1] // 2} {top.dtype.name} "
                        f"elements, which TMA stores only as whole 16-byte vectors", epilogue=graph.name,
                        hint=f"use an epilogue_tile N of {32 // top.dtype.bytes} or more")
    # the grouped kernel's M x N inputs: register-direct through per-group pointers (evtc/grouped.py)
    direct = frozenset(n.name for n in _aux_loads(graph)) if config.grouped else frozenset()
    cand, storage, stages = _fit_load_stages(req, tree, top, et, (tm // et[0]) * (tn // et[1]), direct,
                                             "the gated store")
    offsets, sizes, buffers = _void_d_buffers(storage, top, cand)
    buffers[0] = dataclasses.replace(buffers[0], why="the collective's (void) D buffer: each subtile's N / 2 gated "
                                                     "columns, row-major, stored from it by TMA (evtc::Sm90GluStore)")
    for v in tree.visitors():
        n = v.node
        if v.role is Role.AUX_LOAD and v.name in direct:
            buffers.append(Buffer(v.name, "aux_load", n.dtype, "direct", 0, 0, -1, (),
                                  "register-direct through a per-group pointer (evtc::Sm90AuxLoadGrouped)"))
        elif v.role is Role.AUX_LOAD:
            label = aux_label(v.name)
            buffers.append(Buffer(v.name, "aux_load", n.dtype, "tma", cand.stages_c, sizes[label], offsets[label], (),
                                  "TMA, StagesC deep"))
        elif v.role in (Role.ROW, Role.COL):
            row = _broadcast_buffer(v, buffers, sizes, offsets)
            if row is not None:
                buffers.append(row)
    if config.grouped:
        buffers.append(Buffer(top.name, "glu_store", top.dtype, "direct", 0, 0, -1, (),
                              "register-direct through a per-group pointer, N / 2 columns (evtc::Sm90GluStoreGrouped)"))
    return _void_cd_plan(req, tree, et, cand, storage, stages, buffers,
                         f"gated store: void C and D, '{top.name}' = {top.value.attr('act')}(gate) * up over "
                         "interleaved column pairs, N / 2 columns stored " +
                         ("register-direct per group" if config.grouped else "by TMA from D's buffer"))
