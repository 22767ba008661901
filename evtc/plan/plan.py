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
            ``shared`` (lives inside another buffer, see ``shares_with``).
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
        """(mode, stages) of the aux load or store ``name``."""
        b = self.buffer(name)
        if b is None:
            return ("direct", 0)
        return (b.mode, b.stages)

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


def format_plan(plan: Plan) -> str:
    """The plan as a fixed-width table (``evtc plan`` prints a rich version of the same)."""
    cfg = plan.config
    head = [
        f"plan ({plan.policy}) for {plan.arch}: tile {'x'.join(map(str, cfg.tile))}, "
        f"cluster {'x'.join(map(str, cfg.cluster[:2]))}, {cfg.schedule}",
    ]
    if plan.arch == "sm90":
        head.append(
            f"  epilogue tile {plan.epilogue_tile[0]}x{plan.epilogue_tile[1]}, StagesC={plan.stages_c}, "
            f"StagesD={plan.stages_d}, ReuseSmemC={plan.reuse_smem_c}, DelayTmaStore={plan.delay_tma_store}"
        )
        head.append(f"  C slot: {plan.c_slot or '(void)'}   D slot: {plan.d_slot}")
    rows = [("buffer", "role", "dtype", "mode", "stages", "bytes", "offset", "shares", "why")]
    for b in plan.buffers:
        rows.append((b.name, b.role, b.dtype.name, b.mode, str(b.stages), str(b.bytes),
                     str(b.offset) if b.offset >= 0 else "-", ",".join(b.shares_with) or "-", b.why))
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]) - 1)]
    lines = list(head)
    for r in rows:
        lines.append("  " + "  ".join(r[i].ljust(widths[i]) for i in range(len(widths))) + "  " + r[-1])
    lines.append(
        f"  epilogue smem: {plan.epilogue_smem_bytes} B   mainloop: {plan.mainloop_stages} stages x "
        f"{plan.mainloop_stage_bytes} B   capacity: {plan.smem_capacity} B"
    )
    for n in plan.notes:
        lines.append(f"  note: {n}")
    return "\n".join(lines) + "\n"
