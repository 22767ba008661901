"""A call's signature: its extents, its operands (pointers, alignment masks, spans), the outputs
to allocate and the reductions to fill, and the rules that make them.

Input: tensor views and the problem's extents, from a binder (:mod:`evtc.runtime.bind` for GEMMs,
:mod:`evtc.runtime.conv_bind` for convolutions). Output: :class:`Signature`, what the launch path
caches per call signature, and :class:`Operands`, the builder both binders fill.
"""

from __future__ import annotations

import dataclasses

from evtc.dtypes import DType
from evtc.runtime.tensors import TensorView

__all__ = ["ALIGN", "INT32_MAX", "INT64_MAX", "TMA_STRIDE_LIMIT", "Alloc", "Extents", "Fill", "Operand", "Operands",
           "Signature", "batch_count", "follows_packed_inputs", "self_overlapping"]

ALIGN = 16
INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1
#: cuTensorMapEncodeTiled: every global stride is below 2^40 bytes
TMA_STRIDE_LIMIT = 1 << 40


@dataclasses.dataclass(frozen=True)
class Operand:
    """One pointer of ``evtc_call_t`` as a signature sees it.

    Attributes:
        name: the argument's name in messages (``A``, ``C``, ``out['D']``).
        field: the ABI field (``p_A``...).
        output: True for an output.
        given: False for an output evtc allocates.
        mask: ``pointer & mask`` must be 0 (alignment), checked with ``needed``.
        needed: the pointer is dereferenced (the tensor has elements and the call launches or
            fills it): it must not be null.
        span: (lo, hi) bytes touched relative to the pointer.
        rows: (row stride, row bytes, batch stride, batches) in bytes, for M x N tensors (the
            side-by-side test of :func:`_disjoint`), else None.
        layout: (shape, strides, dtype name), for the exact in-place alias test.
        inplace: an M x N input or an aux store (may be an exact alias of each other).
    """

    name: str
    field: str
    output: bool
    given: bool
    mask: int
    needed: bool
    span: tuple[int, int]
    rows: tuple[int, int, int, int] | None
    layout: tuple
    inplace: bool


@dataclasses.dataclass(frozen=True)
class Alloc:
    """An output evtc allocates: its name, shape, strides (elements, rows padded to 16 bytes),
    dtype and index in the pointer list."""

    name: str
    shape: tuple[int, ...]
    strides: tuple[int, ...]
    dtype: DType
    index: int


@dataclasses.dataclass(frozen=True)
class Fill:
    """A reduction output filled with its identity (M or N = 0): index in the pointer list,
    elements per batch, batches, batch stride (elements), dtype, value."""

    index: int
    count: int
    batches: int
    batch_stride: int
    dtype: DType
    value: float


@dataclasses.dataclass
class Extents:
    """A call's problem, as the binder core fills the struct from it (a convolution's: its
    implicit GEMM, L = 1).

    Attributes:
        M, N, K, L: problem size (K as the user gave it).
        batched: outputs carry the L dimension.
        device: CUDA ordinal of every tensor.
        framework: A's framework (outputs are allocated with it).
        mode: ``launch``, ``empty`` (M, N or L = 0: nothing to compute) or ``k0`` (K = 0: the
            epilogue of a zero accumulator).
    """

    M: int
    N: int
    K: int
    L: int
    batched: bool
    device: int
    framework: str
    mode: str

    @property
    def launches(self) -> bool:
        return self.mode != "empty"


@dataclasses.dataclass
class Signature(Extents):
    """A checked call, minus the pointers' and scalars' values: its :class:`Extents` (problem
    size, device, framework, mode), then

    Attributes:
        operands: the pointers of ``evtc_call_t``, in order.
        values: every non-pointer, non-scalar field of ``evtc_args_t`` (name -> value).
        checks: (index, mask) of each pointer to check per call (non-null, aligned).
        overlaps: (i, j, exact_ok) pairs of given tensors to check for overlap per call.
        allocs: outputs evtc allocates.
        fills: reduction outputs to fill with their identity (mode ``empty``).
        kpad: K of the zero scratch A and B (mode ``k0``), elements.
        handle, workspace: the prepared problem in the library and its workspace bytes
            (set by :mod:`evtc.runtime.launch`).
    """

    operands: tuple[Operand, ...]
    values: dict[str, int]
    checks: tuple[tuple[int, int], ...]
    overlaps: tuple[tuple[int, int, bool], ...]
    allocs: tuple[Alloc, ...]
    fills: tuple[Fill, ...]
    kpad: int = 0
    handle: int = -1
    workspace: int = 0
    allocators: tuple = ()
    spans: tuple = ()

    def __post_init__(self) -> None:
        #: ``overlaps`` with the byte spans inlined, for the per-call test
        self.spans = tuple((i, j, *self.operands[i].span, *self.operands[j].span, ok) for i, j, ok in self.overlaps)


def batch_count(a_shape: tuple[int, ...], b_shape: tuple[int, ...]) -> int:
    """L, the batch count of a GEMM of A (M x K, or L x M x K) and B (N x K, or L x N x K): the
    larger leading extent of the 3-D operands (a 2-D one is shared by every batch), 1 where
    neither is 3-D. One rule for the Python path, the outputs evtc allocates and the torch op's
    fake implementation."""
    return max(a_shape[0] if len(a_shape) == 3 else 1, b_shape[0] if len(b_shape) == 3 else 1)


def follows_packed_inputs(N: int, mn: list[tuple[tuple[int, ...], tuple[int, ...], int]]) -> bool:
    """Whether the M x N outputs evtc allocates for a call take packed rows (contiguous strides)
    instead of rows padded to 16 bytes: NOTE [The row layout of the outputs evtc allocates].

    Args:
        N: the problem's N.
        mn: (shape, strides in elements, element bytes) of each M x N input of the call (source
            C, aux loads), (M, N) or (L, M, N).

    Returns:
        True when there is at least one M x N input, every one is contiguous (torch's and numpy's
        C order; a dimension of extent 1 may have any stride) and at least one has more than one
        row and rows TMA can't address (``N * bytes`` not a multiple of 16). Only shapes and
        strides decide it, never addresses, so the torch op's fake implementation
        (:mod:`evtc.torch.ops`) gives the strides the real call returns.
    """
    found = False
    for shape, strides, eb in mn:
        want = 1
        for extent, stride in zip(reversed(shape), reversed(strides)):
            if extent != 1 and stride != want:
                return False
            want *= extent
        if len(shape) >= 2 and shape[-2] > 1 and (N * eb) % ALIGN:
            found = True
    return found


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _span(shape: tuple[int, ...], strides: tuple[int, ...], eb: int) -> tuple[int, int]:
    if not shape:
        return 0, eb
    if any(s == 0 for s in shape):
        return 0, 0
    return 0, sum((s - 1) * st for s, st in zip(shape, strides)) * eb + eb  # strides are >= 0 (checked)


def self_overlapping(shape: tuple[int, ...], strides: tuple[int, ...]) -> bool:
    """True unless the strided layout is provably one-to-one: the dimensions of extent > 1,
    sorted by stride, each step over all the earlier ones (the usual sufficient test)."""
    dims = sorted((abs(st), s) for s, st in zip(shape, strides) if s > 1)
    reach = 0
    for st, s in dims:
        if st <= reach:
            return True
        reach += (s - 1) * st
    return False


def _disjoint(pa: int, a: Operand, pb: int, b: Operand) -> bool:
    """Two M x N tensors whose byte ranges intersect but that lie side by side (same row
    stride, columns of one within the gap of the other in every row), e.g. two column blocks
    of one buffer."""
    if a.rows is None or b.rows is None:
        return False
    ra, wa, ba, la = a.rows
    rb, wb, bb, lb = b.rows
    if ra != rb or ra <= 0:
        return False
    if (la > 1 and ba % ra) or (lb > 1 and bb % rb):
        return False
    d = (pb - pa) % ra
    return wa <= d and d + wb <= ra


def _quoted(name: str) -> str:
    return name if name.startswith("out[") else f"'{name}'"


class Operands:
    """The pointers of ``evtc_call_t`` as a signature collects them, in order: an
    :class:`Operand` and this call's pointer each (0 for an output evtc allocates).

    Args:
        launches: the call runs the kernel (not an empty problem): inputs with elements are
            dereferenced.
    """

    def __init__(self, launches: bool) -> None:
        self.ops: list[Operand] = []
        self.ptrs: list[int] = []
        self.launches = launches

    def add(self, v: TensorView, name: str, field: str, dtype: DType, *, output: bool, mask: int, mn: bool,
            inplace: bool) -> None:
        """A given tensor; ``mn``: an M x N tensor (its rows, for the side-by-side overlap test)."""
        eb = dtype.bytes
        has = all(s > 0 for s in v.shape)
        rows = None
        if mn and has:
            bs = v.strides[0] * eb if len(v.shape) == 3 else 0
            lcount = v.shape[0] if len(v.shape) == 3 else 1
            rows = ((v.strides[-2] if v.shape[-2] > 1 else v.shape[-1]) * eb, v.shape[-1] * eb, bs, lcount)
        self.ops.append(Operand(name, field, output, True, mask, has and (self.launches or output),
                                _span(v.shape, v.strides, eb), rows, (tuple(v.shape), tuple(v.strides), v.dtype_name),
                                inplace))
        self.ptrs.append(v.ptr)

    def allocated(self, name: str, field: str) -> None:
        """An output evtc allocates (its pointer is filled in at launch)."""
        self.ops.append(Operand(name, field, True, False, 0, False, (0, 0), None, (), False))
        self.ptrs.append(0)

    def need(self, index: int) -> None:
        """The given output at ``index`` is written even though the call doesn't launch (a fill)."""
        self.ops[index] = dataclasses.replace(self.ops[index], needed=True)

    def checks(self) -> tuple[tuple[int, int], ...]:
        """(index, mask) of each pointer to check per call: the given tensors that are dereferenced."""
        return tuple((i, op.mask) for i, op in enumerate(self.ops) if op.given and op.needed)

    def overlaps(self) -> tuple[tuple[int, int, bool], ...]:
        """(i, j, exact_ok) of each pair to test for overlap per call: every given output against
        every other given tensor (each pair of outputs once); ``exact_ok``: an output may be
        exactly an M x N input."""
        out = []
        for i, oi in enumerate(self.ops):
            if not (oi.output and oi.given and oi.needed):
                continue
            for j, oj in enumerate(self.ops):
                if j == i or not (oj.given and oj.needed) or (oj.output and j < i):
                    continue
                exact_ok = (not oj.output and oi.inplace and oj.inplace and oi.layout == oj.layout)
                out.append((i, j, exact_ok))
        return tuple(out)
