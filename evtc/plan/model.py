"""The Plan: every decision the emitters need, as one frozen, printable object.

Input: produced by :func:`evtc.plan.sm90.plan_sm90` or :func:`evtc.plan.sm80.plan_sm80`.
Output: read by the emitters (which never re-derive a tile or a stage count), printed by
``evtc plan``, serialised to JSON in the build cache and in the kernel's info call.
"""

from __future__ import annotations

import dataclasses
import json
from typing import Any

from evtc.dtypes import DType
from evtc.plan.config import GemmConfig


@dataclasses.dataclass(frozen=True)
class Buffer:
    """One shared-memory buffer of the epilogue (or a tensor that deliberately has none).

    Attributes:
        name: the graph input or output it holds (``C``, ``D`` or an aux name).
        role: ``C`` (the collective's source slot), ``D`` (its destination slot),
            ``aux_load``, ``aux_store``, ``row_broadcast``.
        dtype: element type.
        mode: ``tma`` (TMA through shared memory), ``direct`` (register-direct global
            accesses, ``Stages = 0``, no shared memory), ``smem`` (a row broadcast's CTA-N row),
            ``shared`` (lives inside another buffer, see ``shares_with``); for the tensors that own
            no epilogue buffer: ``registers`` (column broadcasts, device-pointer scalars),
            ``workspace`` (row and column reductions: per-tile partials in the kernel's
            workspace), ``atomic`` (scalar reductions: atomics into the output).
        stages: pipeline stages (0 for direct).
        bytes: bytes this buffer adds to the epilogue's shared storage (0 when shared/direct).
        offset: byte offset inside ``CollectiveEpilogue::SharedStorage`` (-1 if none).
        shares_with: names of the buffers it shares memory with.
        why: the reason for the decision, in words.
    """

    name: str
    role: str
    dtype: DType
    mode: str
    stages: int
    bytes: int
    offset: int
    shares_with: tuple[str, ...] = ()
    why: str = ""

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["dtype"] = self.dtype.name
        return d


@dataclasses.dataclass(frozen=True)
class Plan:
    """The planned kernel.

    Attributes:
        arch: ``sm90`` or ``sm80``.
        policy: ``evtc`` (evtc's planner) or ``cutlass`` (stock CUTLASS's additive rule).
        config: the GEMM configuration (tile, cluster, schedule...).
        operands: dtypes of A and B.
        epilogue_tile: (M, N) of one epilogue subtile.
        fragment_size: accumulator elements each thread visits per call (tile / threads).
        stages_c: ``StagesC`` of the collective (C and every TMA aux load).
        stages_d: ``StagesD`` of the collective (D and every TMA aux store).
        reuse_smem_c: D is written into C's buffer (``ReuseSmemC``).
        delay_tma_store: D's TMA store is issued one subtile late (``DelayTmaStore``).
        c_slot: the input loaded through the collective's C slot (None: void C).
        d_slot: the output stored through the collective's D slot.
        shares: (aux store, aux load) pairs whose store lives in the load's buffer (a buffer share).
        buffers: every M x N tensor and row broadcast with its decision.
        epilogue_smem_bytes: ``sizeof(CollectiveEpilogue::SharedStorage)``, in bytes.
        mainloop_stage_bytes: bytes of one mainloop stage (A and B tiles plus its barrier pair).
        mainloop_stages: mainloop stages left beside the epilogue.
        smem_capacity: the per-block limit the plan fits in.
        cost: the cost model's terms (estimated microseconds per output tile and totals).
        notes: anything worth telling the user (e.g. why a tensor went register-direct).
        tree: the visitor tree (not part of the JSON form).
    """

    arch: str
    policy: str
    config: GemmConfig
    operands: tuple[DType, DType]
    epilogue_tile: tuple[int, int]
    fragment_size: int
    stages_c: int
    stages_d: int
    reuse_smem_c: bool
    delay_tma_store: bool
    c_slot: str | None
    d_slot: str | None
    shares: tuple[tuple[str, str], ...]
    buffers: tuple[Buffer, ...]
    epilogue_smem_bytes: int
    mainloop_stage_bytes: int
    mainloop_stages: int
    smem_capacity: int
    cost: dict[str, float] = dataclasses.field(default_factory=dict, compare=False)
    notes: tuple[str, ...] = ()
    tree: Any = dataclasses.field(default=None, compare=False, repr=False)

    def buffer(self, name: str) -> Buffer | None:
        for b in self.buffers:
            if b.name == name:
                return b
        return None

    def aux_mode(self, name: str) -> tuple[str, int]:
        """(mode, stages) of the aux load, aux store or row broadcast ``name`` (not of the
        collective's C or D slot, which an output of the same name may sit beside)."""
        for b in self.buffers:
            if b.name == name and b.role not in ("C", "D"):
                return (b.mode, b.stages)
        return ("direct", 0)

    def to_json(self) -> dict:
        """A JSON-serialisable dict (the tree is omitted)."""
        return {
            "arch": self.arch,
            "policy": self.policy,
            "config": self.config.to_json(),
            "operands": [self.operands[0].name, self.operands[1].name],
            "epilogue_tile": list(self.epilogue_tile),
            "fragment_size": self.fragment_size,
            "stages_c": self.stages_c,
            "stages_d": self.stages_d,
            "reuse_smem_c": self.reuse_smem_c,
            "delay_tma_store": self.delay_tma_store,
            "c_slot": self.c_slot,
            "d_slot": self.d_slot,
            "shares": [list(p) for p in self.shares],
            "buffers": [b.to_json() for b in self.buffers],
            "epilogue_smem_bytes": self.epilogue_smem_bytes,
            "mainloop_stage_bytes": self.mainloop_stage_bytes,
            "mainloop_stages": self.mainloop_stages,
            "smem_capacity": self.smem_capacity,
            "cost": self.cost,
            "notes": list(self.notes),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=True)

    def __str__(self) -> str:
        return format_plan(self)


# ---- printing -------------------------------------------------------------------------------------
#
# NOTE [The plan on one screen]
# ``print(plan)`` and ``evtc plan`` print the same text (the CLI only adds colour on a terminal):
# at most 80 columns, and for every reference epilogue at most 24 lines (tests/null/
# test_plan_print.py). Three header lines (configuration, epilogue stages, the shared-memory
# budget), a table with one row per tensor the epilogue reads or writes through memory (the
# Buffers of the plan, plus the column broadcasts, device-pointer scalars and reductions, which
# own no epilogue shared memory of their own but do live somewhere: registers, D's buffer, the
# workspace), then the reasons, grouped, and the planner's notes, wrapped at 80 columns.

WIDTH = 80

#: Short role names for the table.
ROLE_LABELS = {
    "C": "C slot", "D": "D slot", "aux_load": "aux load", "aux_store": "aux store",
    "row_broadcast": "row bcast", "col_broadcast": "col bcast", "scalar": "scalar ptr",
    "row_reduction": "row reduction", "col_reduction": "col reduction", "scalar_reduction": "scalar reduction",
}


@dataclasses.dataclass(frozen=True)
class PlanRow:
    """One row of the printed plan (and of the pictures).

    Attributes:
        name: the tensor's name in the epilogue.
        role: a key of :data:`ROLE_LABELS` (``C``, ``D``, ``aux_load``, ``row_reduction``...).
        dtype: its element type's name.
        mode: where it lives: ``tma`` (TMA through shared memory), ``smem`` (a shared-memory
            row or reduction buffer), ``shared`` (inside another buffer, ``host``),
            ``direct`` (register-direct global accesses), ``registers`` (read into registers
            once), ``workspace`` (partial results in the GEMM's workspace), ``atomic``
            (atomics into the output).
        where: ``mode`` in words for the table, e.g. ``smem, TMA``, ``in X``, ``registers``.
        stages: pipeline stages (0: none).
        bytes: bytes it adds to the epilogue's shared storage.
        offset: byte offset in ``CollectiveEpilogue::SharedStorage`` (-1: none).
        host: the buffer it lives in when ``mode`` is ``shared``.
        why: the reason for the decision, one line.
    """

    name: str
    role: str
    dtype: str
    mode: str
    where: str
    stages: int
    bytes: int
    offset: int
    host: str | None
    why: str


def _bits_word(dt: DType) -> str:
    return f"{dt.bits}-bit"


def _why_sm90(plan: Plan, b: Buffer) -> str:
    """The reason for one sm90 buffer's decision, from the plan's facts (one line)."""
    c = plan.buffer(plan.c_slot) if plan.c_slot else None
    if b.role == "C":
        if plan.policy == "evtc" and any("takes the C slot" in n for n in plan.notes) or b.why.startswith("aux load"):
            why = f"no source C: aux load {b.name} is loaded through the collective's empty C slot"
            return why + (", so D can reuse its buffer" if plan.reuse_smem_c else "")
        return f"the source C, loaded by the collective's TMA pipeline (StagesC={plan.stages_c})"
    if b.role == "D" and plan.d_slot is None and any(n.startswith("gated store") for n in plan.notes):
        return b.why  # the gated store's void D buffer: what it holds (evtc/plan/sm90_buffers.py plan_glu)
    if b.role == "D":
        took = "" if b.name == "D" else "took the D slot: "
        if plan.reuse_smem_c and c is not None:
            return took + f"{_bits_word(b.dtype)} like {c.name}, so written into its buffer once read (ReuseSmemC)"
        if c is None:
            return took + f"no C slot to share: its own StagesD={plan.stages_d} buffer"
        if c.dtype.bits != b.dtype.bits or b.dtype.bits <= 8:
            return (took + f"C is {_bits_word(c.dtype)}, D {_bits_word(b.dtype)}: no ReuseSmemC "
                    "(the union needs one width above 8 bits)")
        return took + "own buffer: the cost model prefers separate C and D buffers here"
    if b.mode == "shared":
        return "written into the aux load's slot once it is read (evtc::Sm90AliasedAuxStore)"
    if b.role == "row_broadcast":
        if b.mode == "direct":
            return "each thread loads its columns a subtile ahead, no smem (evtc)"
        return "one CTA-N row in shared memory (stock Sm90RowBroadcast)"
    if b.role in ("group_scale", "glu_store"):
        return b.why
    if b.mode == "direct":
        return "register-direct (Stages=0): frees its buffer for mainloop stages"
    if b.mode == "packed":
        return b.why
    if b.role == "aux_load":
        return f"TMA through shared memory, StagesC={plan.stages_c} deep like C"
    if b.role == "aux_store":
        return f"TMA through shared memory, StagesD={plan.stages_d} deep like D"
    return b.why


_WHERE = {"tma": "smem, TMA", "smem": "smem", "direct": "registers", "packed": "smem, thread stores"}

_EXTRA_SM90 = {
    # role: (mode, where, why)
    "col_broadcast": ("registers", "registers", "each thread loads its rows once per tile (Sm90ColBroadcast)"),
    "scalar": ("registers", "registers", "read once from device memory (Sm90ScalarBroadcast)"),
    "row_reduction": ("workspace", "regs, wksp", "warp shuffles, tiles combined in the workspace (Sm90ColReduction)"),
    "col_reduction": ("workspace", "D smem, wksp", "warps meet in D's smem, tiles in the workspace (Sm90RowReduction)"),
    "scalar_reduction": ("atomic", "regs, atomics", "atomics into the output, set to the identity first"),
}

_ATOMIC_WHY = {
    "row_reduction": "warp shuffles, one float atomic per row and tile into the output, set to the identity first",
    "col_reduction": "warps meet in D's smem, one float atomic per column and tile into the output, set to the "
                     "identity first",
}

_WHY_SM80 = {
    "aux_load": "predicated vector loads into registers (VisitorAuxLoad)",
    "aux_store": "predicated vector stores from registers (VisitorAuxStore)",
    "row_broadcast": "the thread's columns, loaded once into registers (VisitorRowBroadcast)",
    "col_broadcast": "the thread's rows, loaded once into registers (VisitorColBroadcast)",
    "scalar": "read once per batch (VisitorScalarBroadcast)",
    "row_reduction": "warp shuffles, a float atomic per row and tile (VisitorColReduction)",
    "col_reduction": "rows meet in smem, a float atomic per column and tile (VisitorRowReduction)",
    "scalar_reduction": "warp shuffles, one float atomic per warp (evtc::Sm80ScalarReduction)",
}


def _extra_tensors(plan: Plan, known: set[str]) -> list[tuple[str, str, DType]]:
    """(name, role, dtype) of the column broadcasts, device-pointer scalars and reductions of the
    plan's visitor tree that have no Buffer (sm90's Buffers cover C, D, aux and row broadcasts)."""
    from evtc.ir.nodes import ColBroadcast, GroupScale, Reduction, ScalarBroadcast

    tree = plan.tree
    if tree is None or not hasattr(tree, "visitors"):
        return []
    out: list[tuple[str, str, DType]] = []
    for v in tree.visitors():
        n = v.node
        name = getattr(n, "name", "")
        if not name or name in known:
            continue
        if isinstance(n, ColBroadcast):
            role = "col_broadcast"
        elif isinstance(n, ScalarBroadcast) and n.by_pointer:
            role = "scalar"
        elif isinstance(n, GroupScale):
            role = "group_scale"
        elif isinstance(n, Reduction):
            role = {"M": "row_reduction", "N": "col_reduction", None: "scalar_reduction"}[n.axis.extent]
        else:
            continue
        known.add(name)
        out.append((name, role, n.dtype))
    return out


def plan_rows(plan: Plan) -> list[PlanRow]:
    """Every tensor of the plan with where it lives and why, in the plan's buffer order followed
    by the tensors that own no epilogue buffer (column broadcasts, device-pointer scalars,
    reductions)."""
    rows: list[PlanRow] = []
    known = {b.name for b in plan.buffers}
    sm90 = plan.arch == "sm90"
    for b in plan.buffers:
        if b.mode == "shared":
            host = b.shares_with[0] if b.shares_with else None
            where = f"in {host}" if host else "shared"
        elif not sm90 and b.role in ("row_reduction", "col_reduction", "scalar_reduction"):
            host = None
            where = ("smem, " if b.mode == "smem" else "regs, ") + "atomics"
        else:
            host = None
            where = _WHERE.get(b.mode, b.mode)
        if sm90 and b.role in _EXTRA_SM90:
            mode, where, why = _EXTRA_SM90[b.role]
            if b.mode == "atomic" and mode != "atomic":  # NOTE [Atomic row and column max]
                mode, where, why = "atomic", where.replace("wksp", "atomics"), _ATOMIC_WHY[b.role]
            rows.append(PlanRow(b.name, b.role, b.dtype.name, mode, where, 0, 0, -1, None, why))
            continue
        if sm90:
            why = _why_sm90(plan, b)
        else:
            why = _WHY_SM80.get(b.role, b.why)
            if "workspace" in b.why:
                why += "; f32 workspace"
        rows.append(PlanRow(b.name, b.role, b.dtype.name, b.mode, where, b.stages, b.bytes, b.offset, host, why))
    for name, role, dt in _extra_tensors(plan, known):
        if sm90:
            mode, where, why = _EXTRA_SM90[role]
        else:
            mode, where, why = "registers", "registers", _WHY_SM80[role]
        rows.append(PlanRow(name, role, dt.name, mode, where, 0, 0, -1, None, why))
    return rows


def _wrap(first: str, text: str, rest: str) -> list[str]:
    import textwrap

    return textwrap.wrap(text, WIDTH, initial_indent=first, subsequent_indent=rest, break_on_hyphens=False) or [first]


def format_plan(plan: Plan) -> str:
    """The plan as text of at most 80 columns (NOTE [The plan on one screen]).

    ``print(plan)`` and ``evtc plan`` show this text. Example (``examples/epilogues.py:gelu_aux``)::

        plan (evtc) for sm90: tile 128x256x64, cluster 2x1, cooperative, persistent
        epilogue tile 128x32, StagesC=4, StagesD=2, ReuseSmemC=false, DelayTmaStore=true
        epilogue smem: 34304 B + 4 mainloop stages x 49168 B = 230976 of 232448 B
        tensor  role       dtype  where      stages  bytes  offset
        ...

    Returns:
        The text, ending with a newline.
    """
    cfg = plan.config
    tile = "x".join(map(str, cfg.tile))
    lines = []
    if plan.arch == "sm90":
        lines.append(f"plan ({plan.policy}) for sm90: tile {tile}, cluster {'x'.join(map(str, cfg.cluster[:2]))}, "
                     f"{cfg.schedule}, {cfg.scheduler}")
        em, en = plan.epilogue_tile
        lines.append(f"epilogue tile {em}x{en}, StagesC={plan.stages_c}, StagesD={plan.stages_d}, "
                     f"ReuseSmemC={str(plan.reuse_smem_c).lower()}, DelayTmaStore={str(plan.delay_tma_store).lower()}")
    else:
        lines.append(f"plan for {plan.arch}: tile {tile}, {cfg.schedule}, {cfg.scheduler}")
        warp = getattr(plan, "warp_tile", None)
        mma = getattr(plan, "instruction_shape", None)
        lines.append((f"warp tile {'x'.join(map(str, warp))}, " if warp else "") +
                     (f"mma {'x'.join(map(str, mma))}, " if mma else "") +
                     f"epilogue steps of {plan.epilogue_tile[0]}x{plan.epilogue_tile[1]}")
    used = plan.epilogue_smem_bytes + plan.mainloop_stages * plan.mainloop_stage_bytes
    lines.append(f"epilogue smem: {plan.epilogue_smem_bytes} B + {plan.mainloop_stages} mainloop stages x "
                 f"{plan.mainloop_stage_bytes} B = {used} of {plan.smem_capacity} B")
    rows = plan_rows(plan)
    table = [("tensor", "role", "dtype", "where", "stages", "bytes", "offset")]
    for r in rows:
        table.append((r.name, ROLE_LABELS.get(r.role, r.role), r.dtype, r.where, str(r.stages) if r.stages else "-",
                      str(r.bytes) if r.bytes else "-", str(r.offset) if r.offset >= 0 else "-"))
    widths = [max(len(t[i]) for t in table) for i in range(len(table[0]))]
    # a long tensor name is what can push the table past 80 columns: cut it, keeping its end
    over = sum(widths) + 2 * (len(widths) - 1) - WIDTH
    if over > 0:
        widths[0] = max(6, widths[0] - over)
    right = {4, 5, 6}
    for t in table:
        cells = []
        for i, cell in enumerate(t):
            if len(cell) > widths[i]:
                cell = "…" + cell[-(widths[i] - 1):]
            cells.append(cell.rjust(widths[i]) if i in right else cell.ljust(widths[i]))
        lines.append("  ".join(cells).rstrip())
    # reasons, grouped: tensors with the same reason share a line
    groups: dict[str, list[str]] = {}
    for r in rows:
        groups.setdefault(r.why, []).append(r.name)
    label = "why: "
    for why, names in groups.items():
        lines += _wrap(f"{label}{', '.join(names)}: ", why, " " * 7)
        label = "     "
    variants = getattr(plan, "variants", ())
    if variants:
        parts = [f"{v.name} (A/B {v.alignment_ab}, epilogue {v.epilogue_access}, {v.stages} stages)" for v in variants]
        lines += _wrap("variants by alignment, picked at run time: ", ", ".join(parts), " " * 7)
    for n in plan.notes:
        # notes that restate a row's reason (the planner's wording) are left out
        if (variants and n.startswith("kernel variants")) or "takes the C slot" in n or "shares aux load" in n:
            continue
        lines += _wrap("note: ", n, " " * 6)
    return "\n".join(lines) + "\n"
