"""Reduction axes: the one place that knows what a reduction's ``dim`` means.

Input: a :class:`~evtc.ir.nodes.Reduction`'s ``dim`` (1, 0 or None). Output: a
:class:`ReduceAxis`, which knows the broadcast class of the result, its extent, the numpy axis of
an ``(L, M, N)`` array, the torch dims of an ``(..., M, N)`` tensor, and its transpose (swap-AB
turns a row reduction into a column reduction).

Vocabulary (evtc's, from the user's point of view of the M x N output):

==========  =====  =====================================  ========  ==================
axis        dim    reduces                                result    CUTLASS visitor
==========  =====  =====================================  ========  ==================
ROW         1      over N: one value per row              length M  ``*ColReduction``
COLUMN      0      over M: one value per column           length N  ``*RowReduction``
SCALAR      None   over M and N: one value per batch      scalar    ``*ScalarReduction``
==========  =====  =====================================  ========  ==================

CUTLASS names its reduction visitors by the shape of the *result* (a column vector for a
reduction over N), evtc by the shape it reduces (a row); the lowering's role table
(:mod:`evtc.lower.roles`) holds the CUTLASS class of each.
"""

from __future__ import annotations

import enum

from evtc.ir.nodes import Bcast

__all__ = ["ReduceAxis"]


class ReduceAxis(enum.Enum):
    """Which extents a reduction reduces (see the module docstring)."""

    ROW = 1
    COLUMN = 0
    SCALAR = None

    @classmethod
    def of(cls, dim: int | None) -> "ReduceAxis":
        """The axis of a Reduction's ``dim`` (1, 0 or None)."""
        return cls(dim)

    @property
    def dim(self) -> int | None:
        return self.value

    @property
    def word(self) -> str:
        """``row reduction``, ``column reduction`` or ``scalar reduction``."""
        return {1: "row reduction", 0: "column reduction", None: "scalar reduction"}[self.value]

    @property
    def bcast(self) -> Bcast:
        """Broadcast class of the result: a row reduction gives one value per row (a column
        vector, varying along M)."""
        return {1: Bcast.COL, 0: Bcast.ROW, None: Bcast.SCALAR}[self.value]

    @property
    def extent(self) -> str | None:
        """The extent of the result: ``"M"``, ``"N"`` or None (a scalar)."""
        return {1: "M", 0: "N", None: None}[self.value]

    def shape(self, M: int, N: int) -> tuple[int, ...]:
        """Shape of one batch of the result for an M x N tile of values."""
        return {1: (M,), 0: (N,), None: ()}[self.value]

    @property
    def numpy_axis(self) -> int | tuple[int, int]:
        """Axis argument of ``np.sum`` etc. on an ``(L, M, N)`` array."""
        return {1: 2, 0: 1, None: (1, 2)}[self.value]

    @property
    def torch_dims(self) -> tuple[int, ...]:
        """Dims to reduce of an ``(..., M, N)`` tensor."""
        return {1: (-1,), 0: (-2,), None: (-2, -1)}[self.value]

    def transposed(self) -> "ReduceAxis":
        """The axis of the same reduction on the transposed problem (swap-AB)."""
        return {ReduceAxis.ROW: ReduceAxis.COLUMN, ReduceAxis.COLUMN: ReduceAxis.ROW}.get(self, self)
