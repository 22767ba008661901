"""The row-phase split: a caller's packed M x N tensors on the aligned TMA kernels (issue 11).

Input: a family Gemm's call (torch tensors, unbatched, an epilogue without reductions, every
M x N output passed with ``out=``) whose M x N tensors (source C, aux loads, the outputs) have
rows TMA can't address, e.g. a packed vocabulary N = 50257 in bf16 (rows 100514 bytes apart),
all with one row layout. Output: the same results, written in place into the caller's tensors,
computed by launches of *aligned* family members on strided views of the caller's own memory:
no copy of the M x N tensors. (Outputs evtc allocates after packed inputs are packed too and
are passed here as the caller's: NOTE [The row layout of the outputs evtc allocates] in
evtc/gemm.py.)

# NOTE [Row-phase split]
TMA needs a tensor's base address and every stride to be multiples of 16 bytes
(``cuTensorMapEncodeTiled``), and a box's first column too (a box starting 2 bytes past a
16-byte boundary faults with an illegal instruction on the H100: NOTE [Padded staging for
unaligned rows] in :mod:`evtc.dispatch.staging`). Rows of N = 50257 bf16 elements start at
every even byte offset mod 16, but row r and row r + 8 start at the same offset (8 rows are
8 x 100514 = 804112 bytes, a multiple of 16). So, with ``G`` the smallest count of rows whose
stride is a multiple of 16 bytes, the rows ``l, l + G, l + 2G, ...`` ("phase" ``l``) all start
at one offset, and from that phase's first 16-byte-aligned column ``c0(l)`` on, they form an
ordinary TMA-addressable matrix with row stride ``G`` rows.

The split makes the phases the batches of one batched GEMM. Batch ``l`` is rows ``l + G i``
(``i < M / G``) and columns ``c0(l) .. c0(l) + Nb``; the column start moves by ``step``
elements per phase, ``c0(l) = shift + l step``, chosen so the batch stride (one row plus
``step`` elements) is a multiple of 16 bytes, and so are the base (``shift``) and the row stride
(``G`` rows). A is viewed as ``(G, M/G, K)`` with batch stride one row and row stride ``G``
rows; B as ``(G, Nb, K)`` starting at its row ``shift`` with batch stride ``step`` rows (B's row
``n`` makes D's column ``n``); every M x N tensor as ``(G, M/G, Nb)`` with strides
``(row + step, G rows, 1)``; a row broadcast as ``(G, Nb)`` with strides ``(step, 1)``; a
column broadcast is copied into ``(G, M/G)`` (M elements). ``Nb`` is rounded down to whole
16-byte vectors (a TMA store writes each row's last vector whole: NOTE [Ragged N and TMA
stores]). Every view is of the caller's own memory, aligned as TMA wants, so the batched call
runs the aligned family member the problem ``(M/G, Nb, K, L = G)`` takes.

What is left for row ``r`` of phase ``l`` are ``F = N - Nb`` columns: ``c0(l) + Nb .. N``
(right) and ``0 .. c0(l)`` (left), at most ``shift + (G - 1) step + 7`` (56 for N = 50257
bf16). Laid out as ``B``'s rows ``N - R .. N`` followed by its rows ``0 .. cmax`` (``R`` the
right band of phase 0, ``cmax = c0(G - 1)``), phase ``l``'s columns are the ``F`` consecutive
positions ``l step .. l step + F`` of that list: the fringe is a second batched GEMM of the same
form, ``(M/G, F, K, L = G)``, over a gathered copy of B's ``R + cmax`` rows (0.9 MB for
N = 50257, K = 4096) and the gathered fringe elements of each M x N input, into scratch
outputs that are then scattered into the caller's tensors (``take``/``put_`` with one pair of
index tensors, cached per problem). The gathers run first (so an in-place ``out=C`` has its
fringe read before the main call writes C) and the scatter last.

The price is B read once per phase: with CUTLASS's tile order the batches are the scheduler's
outermost loop, so each phase reads all of B (a 50257 x 4096 B is 412 MB, larger than L2). Where
those reads hide under the tensor cores' time (:func:`reread_ok`: G reads of B at
the Target's ``mem_bandwidth`` within ``REREAD_FRACTION`` of the MMAs at its ``mma_flops``; 4096 rows of a
50257 x 4096 problem) the main call keeps the member's own order, which measured faster there;
elsewhere it runs the member's batch-inner variant (``scheduler="batch_inner"``, NOTE
[Batch-inner tile order] in ``codegen_templates/include/evtc/sm90_batch_inner.hpp``), which
visits the G phases of one output tile one after another so that B comes from HBM once. A
member with a 2x1 cluster runs without it where a phase has an odd number of its M tiles (the
cluster's second CTA would compute rows past the phase), and the fringe, a few tiles with the
whole K each, runs on ``kheavy`` with split-K (:func:`members`), on a side stream beside the main
call's last wave (NOTE [The fringe in the main call's tail]). The auto route takes the split from
``MIN_PHASE_ROWS`` rows a phase on.

Measured on the H100 (2026-11-26, ``benchmarks/bench_unaligned.py``; the caller's packed C or
aux loads and ``out=`` tensors; time over the aligned neighbour, back-to-back / CUDA graphs;
docs/performance.md), against the staging route it replaces:

* 4096 x 50257 x 4096: bias_relu 1.027 / 1.017 (1.191), aux_heavy (two aux loads, two outputs)
  1.032 / 1.031 (1.427);
* 2048 x 32001 x 4096: 1.090 / 1.076 (1.170) and 1.231 / 1.206 (1.522), batch-inner;
* 1024 x 50257 x 4096 (before the side stream): 1.179 / 1.179 (1.192) and 1.255 / 1.195 (1.507),
  batch-inner, 1x1 cluster;
* 512 x 32001 x 4096 (64 rows a phase): 3.6x and 3.9x (1.27 and 1.48): not taken.
"""

from __future__ import annotations

import dataclasses
import sys
import threading
import weakref
from typing import Any, Mapping

ALIGN = 16
#: the main call keeps the member's own tile order where reading B once per phase costs at most
#: this fraction of the MMA time (at the Target's bandwidth and tensor-core rate), else it takes
#: the batch-inner order (NOTE [Row-phase split])
REREAD_FRACTION = 0.6
#: the auto route splits only where each phase has this many rows: at 512 x 32001 x 4096 (64 rows a
#: phase) the split took 3.5x the aligned time, at 1024 x 50257 x 4096 (128) 1.16-1.25x against
#: 1.22-1.49x on the staging route (H100, CUDA graphs; docs/performance.md)
MIN_PHASE_ROWS = 128
#: the split's fixed cost (s): the fringe GEMM, the gathers and the scatter (H100, measured at
#: 4096 x 50257 x 4096; NOTE [Row-phase split])
SPLIT_OVERHEAD_S = 60e-6
#: the main call's tile order: None (default) batch-inner where B's reads would not hide
#: (:func:`members`), True always batch-inner (NOTE [Batch-inner tile order]), False the member's own
#: persistent order (benchmarks compare them)
BATCH_INNER: bool | None = None


@dataclasses.dataclass(frozen=True)
class Geometry:
    """How an (M, N) problem splits by row phase (NOTE [Row-phase split]); columns in elements.

    Attributes:
        M, N: the problem.
        groups: G, the number of phases (batches); rows ``l + G i`` form phase ``l``.
        step: how far the column start moves per phase.
        shift: phase 0's column start.
        align: Nb and the fringe call's N are multiples of this many elements (16 bytes of the
            narrowest output: a TMA store writes each row's last 16 bytes whole).
    """

    M: int
    N: int
    groups: int
    step: int
    shift: int
    align: int

    @property
    def rows(self) -> int:
        """M / G: each phase's rows."""
        return self.M // self.groups

    @property
    def cmax(self) -> int:
        """The last phase's column start, ``c0(G - 1)``."""
        return self.shift + (self.groups - 1) * self.step

    @property
    def main_n(self) -> int:
        """Nb: the main call's columns per phase (a multiple of ``align``)."""
        return (self.N - self.cmax) // self.align * self.align

    @property
    def fringe(self) -> int:
        """F = N - Nb: the columns of each row the fringe call computes."""
        return self.N - self.main_n

    @property
    def fringe_n(self) -> int:
        """The fringe call's N: F rounded up to ``align`` (the extra columns are discarded)."""
        return -(-self.fringe // self.align) * self.align

    @property
    def right(self) -> int:
        """R: phase 0's right band, the gathered list's first R columns (``N - R .. N``)."""
        return self.N - self.main_n - self.shift

    @property
    def width(self) -> int:
        """W: the gathered fringe columns, with room for the discarded ones."""
        return self.right + self.cmax + (self.fringe_n - self.fringe)

    def start(self, phase: int) -> int:
        """c0(l): phase ``l``'s first main column."""
        return self.shift + phase * self.step


def find_geometry(M: int, N: int, tensors: list[tuple[int, int, int]], *, align_bytes: list[int]) -> Geometry | None:
    """The split of an (M, N) problem whose M x N tensors are ``(address, row stride in elements,
    element bytes)``, or None when there is none (M not a multiple of G, no common step or
    shift, N too small).

    Args:
        align_bytes: the element sizes of the outputs (Nb and the fringe are whole 16-byte
            vectors of each, and each needs a row stride that :func:`fits`).
    """
    if not tensors:
        return None
    G = next((g for g in (1, 2, 4, 8, 16) if all((g * s * e) % ALIGN == 0 for _, s, e in tensors)), None)
    if G is None or M % G:
        return None
    step = next((t for t in range(ALIGN) if all(((s + t) * e) % ALIGN == 0 for _, s, e in tensors)), None)
    shift = next((c for c in range(ALIGN) if all((p + c * e) % ALIGN == 0 for p, _, e in tensors)), None)
    if step is None or shift is None or (G > 1 and step == 0):
        return None
    align = max([ALIGN // e for e in align_bytes] or [1])
    geom = Geometry(M, N, G, step, shift, align)
    if geom.main_n <= 0:
        return None
    # an output evtc allocates (or its scratch) needs a row stride of its own element size that
    # takes the views: none for fp8 beside odd-N bf16 rows (step 7 wants an odd stride, G = 8 an even one)
    if any(not any(fits(geom, ld, e) for ld in range(ALIGN)) for e in align_bytes):
        return None
    return geom


def fits(geom: Geometry, row_stride: int, eb: int) -> bool:
    """Whether rows ``row_stride`` elements of ``eb`` bytes apart take the split's views."""
    return (geom.groups * row_stride * eb) % ALIGN == 0 and ((row_stride + geom.step) * eb) % ALIGN == 0


def row_stride_for(geom: Geometry, columns: int, eb: int) -> int:
    """The smallest row stride >= ``columns`` (elements of ``eb`` bytes) that :func:`fits`."""
    for ld in range(columns, columns + ALIGN + 1):
        if fits(geom, ld, eb):
            return ld
    raise AssertionError(f"no row stride fits {geom}")  # find_geometry chose a step some stride fits


def reread_ok(M: int, N: int, K: int, groups: int, b_bytes: int, target=None) -> bool:
    """Whether reading B ``groups`` times hides under the MMA time on ``target`` (default: the
    sm90 reference part; NOTE [Row-phase split])."""
    from evtc.plan.target import SM90

    t = target or SM90
    return groups * N * K * b_bytes / t.mem_bandwidth <= REREAD_FRACTION * 2.0 * M * N * K / t.mma_flops


def members(dispatch, geom: Geometry, K: int):
    """(main, fringe): the KernelSpecs the split's two batched calls run on (to prebuild them, or
    to name the route in a benchmark).

    * main: the member the family picks for ``(M/G, Nb, K, L = G)`` (without its 2x1 cluster
      where a phase has few and an odd number of its M tiles: NOTE [Cluster padding] in
      evtc/family/spec.py; half the machine at M/G = 128 otherwise); with the batch-inner tile
      order (NOTE [Batch-inner tile order]) where reading B once per phase would not hide
      under the MMAs (:func:`reread_ok`), the member's own order otherwise (measured faster
      there: 1.036 against 1.073 at 4096 x 50257 x 4096 bias_relu, H100);
    * fringe: ``(M/G, F, K, L = G)`` is a few tiles with the whole K each; on the ``kheavy``
      member with split-K where its tiles fill less than half the SMs.
    """
    from evtc.family.spec import _tiles, split_count

    fam = dispatch.family
    G, Mb = geom.groups, geom.rows
    main = fam.choose(Mb, geom.main_n, K, G)  # without its cluster where that pads (NOTE [Cluster padding])
    inner = BATCH_INNER if BATCH_INNER is not None else not reread_ok(geom.M, geom.N, K, G, fam.b.bytes, fam.target)
    if G > 1 and inner:
        main = main.batch_inner_variant()
    fringe = fam.choose(Mb, geom.fringe_n, K, G)
    kheavy = fam.members.get("kheavy")
    sms = fam.target.sm_count
    if kheavy is not None and kheavy.config.scheduler == "streamk":
        tiles = _tiles(Mb, geom.fringe_n, G, kheavy.config.tile)
        splits = split_count(tiles, -(-K // kheavy.config.tile[2]), sms, min_k_tiles=4)
        if 2 * tiles < sms and splits >= 2:
            fringe = kheavy.with_runtime(split_k=splits, decomposition="split_k")
    return main, fringe


def packed_geometry(dispatch, M: int, N: int, K: int) -> Geometry | None:
    """The split the route takes for a call whose M x N tensors are all packed (row stride N,
    16-byte-aligned bases) in the Gemm's C and D dtypes, or None: no split fits, or the route's
    rule (:func:`evtc.dispatch.staging.split_taken`, the one a call applies) doesn't take it."""
    from evtc.dispatch import staging
    from evtc.ir.nodes import Store

    g = dispatch.graph
    if any(not isinstance(o, Store) for o in g.outputs) or staging.split_mode() == "never":
        return None
    ts = [(0, N, dt.bytes) for dt in (dispatch.c, dispatch.d) if dt is not None]
    geom = find_geometry(M, N, ts, align_bytes=[dispatch.d.bytes])
    if geom is None:
        return None
    loads, stores = staging.mn_tensors(g)
    how = staging.mode(dispatch.unaligned_staging)
    penalty = staging.decide(M, N, 1, loads, stores, (), (), how).penalty_s
    return geom if how != "never" and staging.split_taken(geom, penalty, how) else None


#: dispatcher -> {(geom, K, BATCH_INNER): (main launcher, fringe launcher)}: choosing the members and
#: finding their launchers costs about 110 us of host time a call (CPU machine), more than the
#: rest of the split's host work
_LAUNCHERS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def launchers(dispatch, geom: Geometry, K: int):
    """(main, fringe) launchers of :func:`members`, cached per dispatcher, split and K."""
    key = (geom, K, BATCH_INNER)
    try:
        per = _LAUNCHERS.setdefault(dispatch, {})
    except TypeError:  # not weak-referenceable (a test's stand-in): no cache
        per = {}
    hit = per.get(key)
    if hit is None:
        if len(per) >= 64:
            per.clear()
        main, fringe = members(dispatch, geom, K)
        hit = per[key] = (dispatch.family.launcher(main), dispatch.family.launcher(fringe))
    return hit


def forget(dispatch) -> None:
    """Drop the cached members of ``dispatch``'s splits (after tuning changed its choices)."""
    try:
        _LAUNCHERS.pop(dispatch, None)
    except TypeError:
        pass


#: NOTE [The fringe in the main call's tail]: the fringe call runs on a side stream forked from
#: the call's stream after the gathers and joined before the scatter, launched after the main
#: call: the main call's persistent CTAs hold every SM (their shared memory), so the fringe's CTAs
#: start on the SMs its last wave leaves idle. H100: bias_relu 1.025 against 1.041 with the fringe
#: first on one stream at 4096 x 50257 x 4096, 1.088 against 1.122 at 2048 x 32001 x 4096;
#: aux_heavy unchanged (1.036 / 1.029, 1.228 / 1.222). False: one stream, fringe first.
OVERLAP_FRINGE = True
_SIDE: dict[int, Any] = {}


def _side_stream(torch, device):
    """The side stream of ``device`` (one per device, made once)."""
    i = device.index if device.index is not None else torch.cuda.current_device()
    s = _SIDE.get(i)
    if s is None:
        s = _SIDE[i] = torch.cuda.Stream(device=i)
    return s


_INDEX_LOCK = threading.Lock()
_INDEX: dict[tuple, tuple[Any, Any]] = {}


def index_math(geom: Geometry, r, t, where):
    """:func:`fringe_indices` on arrays of any library: ``r`` the rows (M, 1), ``t`` the fringe
    positions (F,), ``where`` its select; row r's position t is column w = (r mod G) step + t of
    the gathered list, the caller's column ``N - R + w`` (right band) or ``w - R`` (left)."""
    w = (r % geom.groups) * geom.step + t
    R = geom.right
    col = where(w < R, w + (geom.N - R), w - R)
    return (r * geom.N + col).reshape(-1), (r * geom.width + w).reshape(-1)


def fringe_indices(torch, geom: Geometry, device) -> tuple[Any, Any]:
    """(columns in the caller's (M, N) tensor, positions in the gathered (M, W) scratch) of every
    fringe element, as flat row-major int64 indices of M * F elements; cached per problem,
    except while a CUDA graph is being captured (its kernels only run at replay)."""
    key = (geom, str(device))
    hit = _INDEX.get(key)
    if hit is not None:
        return hit
    r = torch.arange(geom.M, device=device, dtype=torch.int64)[:, None]
    pair = index_math(geom, r, torch.arange(geom.fringe, device=device, dtype=torch.int64), torch.where)
    if not (r.is_cuda and torch.cuda.is_current_stream_capturing()):
        with _INDEX_LOCK:
            if len(_INDEX) >= 16:
                _INDEX.clear()
            _INDEX[key] = pair
    return pair


def _bits(torch, t):
    """``t`` viewed as integers of its element size (take/put_ copy bits; fp8 included)."""
    return t.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[t.element_size()])


def _launch(torch, dev, stream, main, fringe) -> None:
    """The main and fringe calls (``main(stream)``, ``fringe(stream)``). The gathers ran first, so
    the two are independent (an in-place out=C: the fringe reads C's gathered copy, the main call
    C itself): on CUDA the fringe runs on a side stream in the main call's tail (NOTE [The fringe
    in the main call's tail]), else one after the other on ``stream``."""
    if OVERLAP_FRINGE and dev.type == "cuda":
        cur = torch.cuda.current_stream(dev)
        side = _side_stream(torch, dev)
        side.wait_stream(cur)
        main(cur)
        with torch.cuda.stream(side):
            fringe(side)
        cur.wait_stream(side)
    else:
        fringe(stream)
        main(stream)


def run(dispatch, geom: Geometry, A, B, kwargs: Mapping[str, Any], given: Mapping[str, Any], stream: Any, *,
        loads: Mapping[str, Any], stores: Mapping[str, Any], rows: set[str], cols: set[str]):
    """One call on the split (inside the call's stream context): the gathers, the main and fringe
    calls, the scatter; returns what :meth:`evtc.Gemm.__call__` would (the caller's outputs,
    written in place).

    Args:
        dispatch: the family Gemm's Dispatcher.
        geom: the split.
        A: (M, K) torch tensor; B: (N, K).
        kwargs: the epilogue's arguments (M x N loads fit ``geom``).
        given: the caller's outputs by name, every M x N output of the epilogue (they fit ``geom``).
        loads, stores: the M x N inputs and outputs by name (their evtc dtypes).
        rows, cols: the names of the row and column broadcasts.
    """
    torch = sys.modules["torch"]
    G, Mb, Nb, Fn, W, R, cmax = (geom.groups, geom.rows, geom.main_n, geom.fringe_n, geom.width, geom.right,
                                 geom.cmax)
    N, step, shift = geom.N, geom.step, geom.shift
    dev = A.device
    K = A.shape[1]
    dst, src = fringe_indices(torch, geom, dev)

    def main_mn(X):
        s = X.stride(0)
        return X.as_strided((G, Mb, Nb), (s + step, G * s, 1), X.storage_offset() + shift)

    def scratch(dtype, eb):
        ld = row_stride_for(geom, W, eb)
        buf = torch.empty((geom.M, ld), dtype=dtype, device=dev)
        return buf, buf.as_strided((G, Mb, Fn), (ld + step, G * ld, 1))

    def gathered(x):
        """The gathered list of ``x``'s N rows (B) or elements (a row broadcast): its rows
        ``N - R .. N``, then ``0 .. cmax``, then zeros up to W (they feed discarded columns)."""
        pad = [x.new_zeros((W - R - cmax,) + tuple(x.shape[1:]))] if W > R + cmax else []
        return torch.cat([x[N - R:], x[:cmax], *pad])

    sA, sB = A.stride(0), B.stride(0)
    A3 = A.as_strided((G, Mb, K), (sA, G * sA, 1), A.storage_offset())
    B3 = B.as_strided((G, Nb, K), (step * sB, sB, 1), B.storage_offset() + shift * sB)
    Bw = gathered(B)
    Bf = Bw.as_strided((G, Fn, K), (step * Bw.stride(0), Bw.stride(0), 1))
    kw_main: dict[str, Any] = {}
    kw_fringe: dict[str, Any] = {}
    for n, x in kwargs.items():
        if n in loads:
            kw_main[n] = main_mn(x)
            buf, view = scratch(x.dtype, x.element_size())
            _bits(torch, buf[:, :W]).put_(src, _bits(torch, x).take(dst))
            kw_fringe[n] = view
        elif n in rows:
            v = x.reshape(-1)
            kw_main[n] = v.as_strided((G, Nb), (step * v.stride(0), v.stride(0)), v.storage_offset() + shift * v.stride(0))
            kw_fringe[n] = gathered(v).as_strided((G, Fn), (step, 1))
        elif n in cols:
            v = x.reshape(-1)
            kw_main[n] = kw_fringe[n] = v.as_strided((G, Mb), (v.stride(0), G * v.stride(0))).contiguous()
        else:
            if hasattr(x, "dim") and x.dim() == 1 and x.numel() == 1:
                x = x.reshape(())
            kw_main[n] = kw_fringe[n] = x
    outs, out_main, out_fringe, bufs = {}, {}, {}, {}
    for n, dt in stores.items():
        y = outs[n] = given[n]
        out_main[n] = main_mn(y)
        bufs[n], out_fringe[n] = scratch(y.dtype, dt.bytes)
    main, fringe = launchers(dispatch, geom, K)
    _launch(torch, dev, stream, lambda st: main(A3, B3, kw_main, out_main, st),
            lambda st: fringe(A3, Bf, kw_fringe, out_fringe, st))
    for n, y in outs.items():
        _bits(torch, y).put_(dst, _bits(torch, bufs[n][:, :W]).take(src))
    if len(outs) == 1 and len(dispatch.graph.outputs) == 1:
        return next(iter(outs.values()))
    return {o.name: outs[o.name] for o in dispatch.graph.outputs}
