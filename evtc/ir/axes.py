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

from evtc.ir.nodes import ReduceAxis

__all__ = ["ReduceAxis"]
