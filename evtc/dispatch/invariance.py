"""Batch invariance: the members of a family whose outputs' bits for a row do not depend on how
many other rows (M), batches (L) or runs there are, or on which of them the selection picks.

Input: the epilogue after passes and the arch. Output: :class:`Invariance`, which
:class:`~evtc.dispatch.family.GemmFamily` asks which members and candidates it may run
(:class:`evtc.Gemm`'s ``batch_invariant=True``).

NOTE [Batch invariance]
What decides the bits of one output element of an evtc kernel:

* The order its accumulator sums over K. CUTLASS's sm90 mainloops issue the K tiles in order and
  WGMMA steps K by 16 (8-bit: 32) inside a tile (``collective/sm90_mma_*_warpspecialized*.hpp``),
  so one tile K gives one order; fp8's promotion into f32 every few K tiles is fixed by the same
  tile K. Split-K (partial sums added in a fixup), stream-K (a tile's K range cut between CTAs by
  the run-time scheduler: ``DecompositionMode`` in ``tile_scheduler_detail.hpp``; CUTLASS's
  ``"heuristic"`` picks it from the problem) and swap-AB (the transposed problem's MMA) change
  it. The tile's M and N, the cluster, the schedule and the tile order do not: each WGMMA
  computes each element of its m64nNk16 result from the same 16 products whatever N is (the
  claim tests/gpu/test_batch_invariance_gpu.py checks bit for bit).
* The epilogue: elementwise, the same code on every member.
* Row reductions (``dim=1``, over N: CUTLASS's ``Sm90ColReduction``) fold a thread's values over
  the epilogue subtiles, then across the lanes that share a row, then across N tiles through the
  workspace in tile order (``end()`` in ``sm90_visitor_store_tma_warpspecialized.hpp``): their
  bits depend on tile N, the epilogue tile and the schedule, so every member must share them.
* Column reductions (``dim=0``, over M) sum over M: they depend on M by definition, and are
  reduced in tile order (the same final reduction), so a run repeats its bits.
* Scalar sums: ``Sm90ScalarReduction`` has only an atomic implementation ("non-atomic scalar
  reduction not supported yet"): the order the CTAs add in is the run's, so they are refused.
  Max and min give the same bits in any order (atomic or not).
* sm80's register visitors reduce across tiles with atomics (``AtomicReduceFn``,
  ``visitor_store.hpp``): every sum reduction is refused there.

So a batch-invariant family keeps the members with split-K 1, the data-parallel decomposition
(stream-K-scheduler members pinned to it), no swap-AB and one tile K; with a row reduction, also
one (tile N, schedule, epilogue tile). M x N rows TMA can't address take the cooperative
``unaligned`` kernel (never the ping-pong one, which the M-dependent rule picks), and the padded
staging route is off (its per-call choice between copies and kernels depends on M).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Iterable

from evtc.errors import ConfigError
from evtc.family.spec import KernelSpec
from evtc.ir.graph import Graph
from evtc.ir.nodes import ReduceOp, Reduction

__all__ = ["Invariance", "pinned_order"]


def pinned_order(spec: KernelSpec) -> KernelSpec | None:
    """``spec`` with a K order fixed whatever the problem (a stream-K-scheduler member pinned to
    the data-parallel decomposition), or None where it can't be (swap-AB, split-K > 1, an
    explicit stream-K or split-K decomposition)."""
    cfg = spec.config
    if cfg.swap_ab or cfg.split_k != 1:
        return None
    if spec.arch == "sm90" and cfg.scheduler == "streamk":
        if cfg.decomposition not in ("heuristic", "data_parallel"):
            return None
        return spec.with_runtime(decomposition="data_parallel") if cfg.decomposition != "data_parallel" else spec
    return spec


@dataclasses.dataclass(frozen=True)
class Invariance:
    """The batch-invariant subset of a family (NOTE [Batch invariance]).

    Attributes:
        arch: ``sm90`` or ``sm80``.
        row_keyed: the epilogue has a row reduction (``dim=1``): members must share tile N, the
            schedule and the epilogue tile, not only tile K.
        key: what every admitted kernel shares (set by :meth:`members`).
    """

    arch: str
    row_keyed: bool
    key: tuple | None = None

    @classmethod
    def of(cls, graph: Graph, arch: str) -> Invariance:
        """The rule for an epilogue.

        Raises:
            ConfigError: a reduction whose bits depend on the run: a scalar sum (sm90: CUTLASS's
                scalar reduction is atomic), or any sum on sm80 (atomics across tiles).
        """
        for o in graph.outputs:
            if not isinstance(o, Reduction) or o.op != ReduceOp.SUM:
                continue
            if o.dim is None or arch != "sm90":
                where = "a scalar sum is added with atomics (CUTLASS's Sm90ScalarReduction)" if arch == "sm90" \
                    else "sm80's register visitors add partial sums across tiles with atomics"
                raise ConfigError(f"batch_invariant=True: the sum reduction '{o.name}' can't be made "
                                  f"deterministic: {where}, in the order the CTAs finish",
                                  epilogue=graph.name,
                                  hint="reduce per row (dim=1) and sum those on the host, use max/min, or "
                                       "drop batch_invariant" + (", or use arch='sm90'" if arch != "sm90" else ""))
        return cls(arch, any(isinstance(o, Reduction) and o.dim == 1 for o in graph.outputs))

    def _key(self, spec: KernelSpec, epilogue_tile: Callable[[KernelSpec], tuple | None]) -> tuple:
        cfg = spec.config
        if not self.row_keyed:
            return (spec.arch, cfg.tile[2])
        return (spec.arch, cfg.tile[2], cfg.tile[1], cfg.schedule, epilogue_tile(spec))

    def members(self, members: Iterable[KernelSpec],
                epilogue_tile: Callable[[KernelSpec], tuple | None]) -> tuple[Invariance, dict[str, KernelSpec]]:
        """The admitted members of a family (in its order) and the rule with its key set: the
        members whose K order :func:`pinned_order` fixes, of the key the most of them share (ties:
        the earliest member's).

        Args:
            members: the family's members, the primary first.
            epilogue_tile: a member's planned epilogue tile (M, N) (planning it: only asked when
                the epilogue has a row reduction).

        Raises:
            ConfigError: no member can be pinned (a family of swap-AB or split-K members only).
        """
        fixed = [s for s in (pinned_order(s) for s in members) if s is not None]
        if not fixed:
            raise ConfigError("batch_invariant=True: every member of the family splits K or swaps A and B, so "
                              "no member has one K order for every M",
                              hint="pin a configuration with split_k=1, swap_ab=False")
        groups: dict[tuple, list[KernelSpec]] = {}
        for s in fixed:
            groups.setdefault(self._key(s, epilogue_tile), []).append(s)
        key = max(groups, key=lambda k: len(groups[k]))  # max() keeps the first of equals
        rule = dataclasses.replace(self, key=key)
        return rule, {s.name: s for s in groups[key]}

    def admits(self, spec: KernelSpec, epilogue_tile: Callable[[KernelSpec], tuple | None]) -> bool:
        """Whether a candidate (a member, a cluster-less variant, a run-time variant) keeps the
        family's bits: its K order is fixed and it has the family's key."""
        fixed = pinned_order(spec)
        return fixed is not None and fixed == spec and self._key(spec, epilogue_tile) == self.key
