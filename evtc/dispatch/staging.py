"""The padded staging route for M x N tensors whose rows TMA can't address (issue 11).

Input: a family Gemm's call whose only misalignment is in its M x N tensors (source C, aux
loads, caller-given outputs: a row stride, batch stride or base address that is not a multiple
of 16 bytes, e.g. a packed vocabulary N = 50257 in bf16) while A and B are aligned. Output:
the same results, computed by an *aligned* family member on padded copies, when the cost model
says that is faster than the on-demand ``unaligned`` kernels (every M x N tensor read and
written register-direct, one element at a time).

# NOTE [Padded staging for unaligned rows]
Like Inductor's "comprehensive padding", the route pads the row stride instead of giving up
TMA:

* outputs evtc allocates itself already have a padded row stride (N rounded up to a 16-byte
  multiple, :class:`evtc.runtime.bind.Alloc`; batch stride M times that) and are returned as
  strided (.., M, N) views: nothing to copy, on every route; except after M x N inputs that are
  all contiguous with misaligned rows, where evtc allocates them packed (NOTE [The row layout of
  the outputs evtc allocates] in evtc/gemm.py) and they take this route as ``out=`` tensors;
* each misaligned M x N *input* (C, aux loads) is copied once into a fresh padded buffer of the
  framework (``strided_allocator``, then for torch evtc's row-copy kernel, NOTE [Copy kernels
  for staging], or one ``cudaMemcpy2DAsync`` of its rows, NOTE [Pitched copies for staging],
  both in :mod:`evtc.runtime.pitched_copy`, else ``copy_``; cupy ``copyto``);
* each misaligned output the caller passed with ``out=`` is computed into a padded output evtc
  allocates (as if the caller had passed none) and copied into the caller's tensor afterwards;
  in-place ``out=C`` works the same way (the kernel reads C's staged copy, writes a fresh
  output, and the copy-back overwrites C).

Everything runs on the call's stream (the framework's current one, or the caller's torch
stream), stream-ordered and capturable in a CUDA graph. The caller's arguments are checked
first by a binder that accepts any row stride (the rules of :mod:`evtc.runtime.bind`,
overlaps included), so a call the unaligned kernel would refuse is refused here too.

The cost model (bytes, H100 measured 2026-11, 4096 x 50257 x 4096 bf16 against the aligned
neighbour N = 50264; bench_shapes.py passes packed ``out=`` tensors):

* the unaligned kernel's penalty, per byte of each M x N tensor (all of them: it accesses even
  aligned ones register-direct): bias_relu (C load + D store) took 4.07 ms against 2.32 ms,
  +1.75 ms over 2 x 412 MB; rowmax (a D store, no C) 1.14x, +0.32 ms over 412 MB; aux_heavy (two
  aux loads, two stores) 2.34x, +3.1 ms. That fits ``LOAD_S_PER_BYTE`` = 3.4 ps for a load and
  ``STORE_S_PER_BYTE`` = 0.78 ps for a store (aux_heavy predicted +3.4 ms);
* staging: each copied tensor is read and written once, ``2 * bytes / copy_bandwidth``
  (2.5 TB/s, a strided copy on the H100's 3.35 TB/s HBM3) plus ``COPY_OVERHEAD_S`` (10 us: the
  copy's launch and allocation) per copy;
* stage when its cost is below ``MARGIN`` (0.8) times the penalty. So a packed C or aux load
  is staged from about 4 MB on (a 4096 x 50257 C: 0.33 ms of copy against 1.4 ms of penalty,
  expected ~1.14x the aligned time). A caller's packed output costs about as much to copy back
  as the unaligned kernel's store: an epilogue without M x N loads whose only misaligned tensor
  is such an output (rowmax) keeps the unaligned kernel and its 1.14x; with M x N loads (even
  aligned ones, which the unaligned kernel also reads one element at a time) it is staged.
  Small problems keep the unaligned kernel (the copies' fixed costs dominate).

Measured after (H100, 2026-11-25, docs/performance.md): at 4096 x 50257 x 4096 against N = 50264,
bias_relu 1.158x with outputs evtc allocates (1.78x on the unaligned kernel), 1.37x with packed
``out=`` outputs; aux_heavy 1.27x / 1.56x (2.32x). C's copy ran at about 2.2 TB/s (0.38 ms for
its 824 MB read and written), a little under the model's 2.5.

The decision is cached per call signature (the probe key of :mod:`evtc.runtime.launch`), switch
setting and base-address alignment: a call the route leaves on the unaligned kernel costs about
3 us more host time than before (10.4 against 7.6 us, CPU fakes); a staged call adds the copies'
launches and one more pass through the dispatch (83 against 7.8 us per call with fakes, the
fakes' own allocations included), small against the
milliseconds of the problems it is chosen for.

Tried and left out (H100, 2026-11-26): pipelining the copies with the kernel. M was split into
four chunks of whole tiles, each chunk one call of the Gemm on row slices, the other chunks'
inputs staged and the finished chunks' outputs copied back on a side stream (forked from and
joined to the call's stream). At 4096 x 50257 x 4096 with the caller's packed ``out=``: 1.207x
the aligned time with evtc's copy kernel on the side stream (1.204x without chunks), and with
``cudaMemcpy2DAsync`` there bias_relu 2.907 against 2.912 ms and aux_heavy 4.343 against 4.179
ms unchunked, in one session: no overlap. The persistent GEMM kernel holds every SM (its
registers and shared memory fill each one), so a copy kernel waits for it, and the pitched
device-to-device copies evidently run on SMs too. The GPU tests of that route passed (26); the
code is in the history (commit cc95adc). What could make it overlap: a GEMM launched on fewer
SMs than the device has (CUTLASS's ``KernelHardwareInfo::sm_count``), leaving a few to the side
stream's copies; not tried.

What a caller's packed ``out=`` still costs, and what could remove it (2026-11-26): bias_relu at
4096 x 50257 x 4096 with packed C and a packed ``out=`` D moves 824 MB for C's staging copy and
824 MB for D's copy back (about 0.31 + 0.37 ms at 2.2-2.6 TB/s) over a 2.37 ms GEMM, 1.23x the
aligned time; issue 11's 1.15x leaves 0.35 ms for both, which two copies can't meet even at
HBM's peak. What could: the epilogue storing D (and loading C) near TMA speed into rows that
are only 2-byte aligned. For odd N in 16-bit types row r starts 2 N r bytes in, so the rows of
one phase k = r mod 8 share an alignment; a TMA descriptor per phase, based at the phase's first
16-byte-aligned column c0(k) <= 7 with a row stride of 8 rows, addresses every element from
c0(k) on (TMA box coordinates need no alignment, only the base and strides), and the up to 7
columns before it go register-direct. The epilogue's shared-memory subtile would be written
with its rows grouped by phase, so each phase's rows form one TMA box.

Built and measured on the H100 (2026-11-26, branch ``wip/phased-stores``, not merged):
``evtc::Sm90AuxStorePhased``, ``GemmConfig.phased_stores``, a planner for it (void C and D in
the collective, TMA aux loads), the binder and this route writing the caller's outputs in place.
With every phase aligned (N = 2048, so c0 = 0) it was exact against the float64 reference on
all three test epilogues (a C load, an aux store, an atomic row max), cooperative and ping-pong.
With N = 2049 every launch faulted with an illegal instruction, also after the boxes that would
start left of their descriptor's base (a negative coordinate) were left to the register-direct
fringe, and again with a non-swizzled shared-memory box; without the TMA stores it ran
(compute-sanitizer: the fault is in the epilogue). What
is left is a box whose first column sits 2 to 14 bytes past a 16-byte boundary of its
descriptor: the evidence says TMA needs each box's start 16-byte aligned too, which a box over
a subtile (columns ``col0 .. col0 + EpiN``, ``col0`` a multiple of 32) can't give a phase whose
base is at c0 = 1..7. What could still work: each phase's rows written into shared memory
shifted by its c0, so that its boxes start on its aligned columns (a run-time shift, so no
stmatrix), with the columns a box borrows from the next subtile carried over; or the fringe of
this route as a fast register-direct store from shared memory, whole rows per warp.

The second is what the route does now, for epilogues with one M x N output: a caller's
misaligned output (16-bit or wider, any row stride, batch stride or element-aligned base, an
sm90 member that is not swap-AB) is written in place by the *packed-store variant* of the member
the aligned problem takes (NOTE [Stores into packed rows] in evtc/plan/sm90_buffers.py: the subtile
through shared memory as for a TMA store, then stored by the epilogue threads, 32 consecutive
elements of a row per store instruction), so only misaligned inputs are copied. Measured on the
H100 (2026-11-26, 4096 x 50257 x 4096 with the caller's packed tensors, time over the aligned
N = 50264 in the same run, docs/performance.md):

* rowmax (D and an atomic row max): 1.038 (the unaligned kernel, the route's pick before: 1.14;
  a copy back: 1.356); the same kernel with its copies left out: 0.993;
* bias_relu (C staged, D): 1.195 (a copy back: 1.280); C's staging alone: 1.117-1.126;
* aux_heavy (two aux loads staged, D and F): 2.725 (a copy back: 1.31). Even with its copies
  left out the two-output packed kernel took 1.649. It spills more registers than the aligned
  one (ptxas: 208-252 bytes of spill stores against 40), but that is not the cause: on the
  spill-free `large` and pp64x256 tiles its packed-store kernel took 1.9x too, and Nsight
  Compute puts 32 % of its stalls on instruction fetch (docs/performance.md); not worked out.

Tried and left out (H100, 2026-11-26, night; docs/performance.md, the patches in the history at
40446b7:benchmarks/experiments/packed_loads): reading the caller's packed *inputs* in the kernel instead of staging
them. Three designs, each exact and each slower than the copy for bias_relu (1.22-1.25x with C
staged): the epilogue threads loading rows into a subtile through the collective's barriers
(1.45-1.88x: the loads' latency sits in the epilogue, and the registers make ping-pong spill),
the producer load warp's ``cp.async`` from each row's 16-byte boundary with the consumers
reading shifted rows (1.44x: instructions and bank conflicts), and the same warp shifting the
rows back into the stock stages (1.99x: one warp does all of it). TMA itself faults on a box
that starts at a column whose byte offset is not a multiple of 16, so per-row-phase descriptors
don't remove the shift.

Since 2026-11-26 (late night) the route's first choice for large problems is not a copy at all:
the row-phase split (NOTE [Row-phase split] in :mod:`evtc.dispatch.phase_split`) runs a call whose
M x N tensors share one row layout as two batched launches of aligned members over strided views
of the caller's memory (bias_relu 1.03x, aux_heavy 1.03x at 4096 x 50257 x 4096 with the caller's
packed tensors, H100). :meth:`StagedLauncher.plan` takes it where it can run
(:meth:`StagedLauncher.split_geometry`) and its fixed cost (``SPLIT_OVERHEAD_S``) is below
``MARGIN`` times the unaligned kernel's penalty, with at least ``MIN_PHASE_ROWS`` rows a phase;
``EVTC_PHASE_SPLIT`` (``auto``, ``always``, ``never``) overrides it. Everything below is the route
for the calls it leaves.

So ``EVTC_PACKED_STORES`` selects: ``auto`` (default) the packed stores for epilogues with one
M x N output and copies back for more; ``always`` (or ``1``) the packed stores wherever they
can run; ``never`` (or ``0``) copies back.

``EVTC_UNALIGNED_STAGING`` (or :attr:`evtc.Gemm.unaligned_staging`) selects: ``auto`` (the
cost model, default), ``always`` (stage whenever it can), ``never`` (today's unaligned
kernels). The route needs torch or cupy tensors (to allocate and copy), an sm90 family Gemm
(not pinned), aligned A and B, and ``stream=None`` or a torch stream object; any other call
takes the unaligned kernel.
"""

from __future__ import annotations

import dataclasses
import numbers
import sys
from typing import Any, Mapping

from evtc import knobs
from evtc.dtypes import DType
from evtc.errors import ArgumentError
from evtc.ir.nodes import AuxLoad, ColBroadcast, RowBroadcast, Source, Store
from evtc.dispatch import phase_split
from evtc.runtime import tensors
from evtc.runtime.tensors import TensorView

ALIGN = 16
ENV = "EVTC_UNALIGNED_STAGING"
#: when misaligned caller outputs take the packed-store variant instead of a copy back:
#: ``auto`` (default) for epilogues with one M x N output, ``always`` (or ``1``) wherever it can,
#: ``never`` (or ``0``) never (NOTE [Padded staging for unaligned rows])
PACKED_ENV = "EVTC_PACKED_STORES"
MODES = ("auto", "always", "never")
#: the row-phase split (NOTE [Row-phase split] in evtc.dispatch.phase_split): ``auto`` (default)
#: where its cost model takes it, ``always`` wherever it can run, ``never``
SPLIT_ENV = "EVTC_PHASE_SPLIT"

#: the unaligned kernel's extra time per byte of an M x N load / store (NOTE [Padded staging
#: for unaligned rows])
LOAD_S_PER_BYTE = 3.4e-12
STORE_S_PER_BYTE = 0.78e-12
#: a strided device copy's fixed cost (its bandwidth is the Target's ``copy_bandwidth``)
COPY_OVERHEAD_S = 10e-6
#: the frameworks the route allocates and copies with
FRAMEWORKS = ("torch", "cupy")
#: stage only when it costs less than this fraction of the unaligned kernel's penalty
MARGIN = 0.8


def mode(value: str | None = None) -> str:
    """The route's mode: ``value`` if given, else ``EVTC_UNALIGNED_STAGING``, else ``auto``.

    Raises:
        ArgumentError: an unknown mode.
    """
    if value is None:
        return knobs.unaligned_staging.get()
    return _checked_mode(value, "unaligned staging mode {!r}",
                         f"set {ENV} (or Gemm.unaligned_staging) to auto, always or never")


def split_mode() -> str:
    """``EVTC_PHASE_SPLIT``: ``auto`` (default), ``always`` or ``never``.

    Raises:
        ArgumentError: another value.
    """
    return knobs.phase_split.get()


def packed_mode() -> str:
    """``EVTC_PACKED_STORES``: ``auto`` (default), ``always`` (or ``1``) or ``never`` (or ``0``).

    Raises:
        ArgumentError: another value.
    """
    return knobs.packed_stores.get()


def _checked_mode(raw: str, what: str, hint: str, aliases: Mapping[str, str] | None = None) -> str:
    """``raw`` stripped and lower-cased (empty: ``auto``; an alias: its mode), one of
    :data:`MODES`, else an ArgumentError saying ``what`` (formatted with the value) is not one of
    them."""
    m = raw.strip().lower() or "auto"
    m = (aliases or {}).get(m, m)
    if m not in MODES:
        raise ArgumentError(f"{what.format(m)} is not one of {', '.join(MODES)}", hint=hint)
    return m


def padded_row(N: int, eb: int) -> int:
    """N rounded up so that a row of ``eb``-byte elements is a multiple of 16 bytes."""
    per = max(1, ALIGN // eb)
    return (N + per - 1) // per * per


def padded_strides(shape: tuple[int, ...], eb: int) -> tuple[int, ...]:
    """The strides (elements) evtc gives an M x N tensor of ``shape`` ((M, N) or (L, M, N)):
    rows padded to 16 bytes, batches packed (what :class:`evtc.runtime.bind.Binder` allocates)."""
    M, N = shape[-2], shape[-1]
    ld = padded_row(N, eb)
    return (M * ld, ld, 1) if len(shape) == 3 else (ld, 1)


def misaligned(v: TensorView, eb: int, *, output: bool = False) -> bool:
    """Whether an M x N tensor can't go through TMA: its base address, row stride or batch
    stride (bytes) is not a multiple of 16, or (an output) its rows end inside a 16-byte vector
    (the TMA store writes whole vectors: NOTE [Ragged N and TMA stores])."""
    if any(s == 0 for s in v.shape):
        return False
    if v.ptr % ALIGN:
        return True
    if len(v.shape) >= 2 and v.shape[-2] > 1 and (v.strides[-2] * eb) % ALIGN:
        return True
    if len(v.shape) == 3 and v.shape[0] > 1 and (v.strides[0] * eb) % ALIGN:
        return True
    return output and (v.shape[-1] * eb) % ALIGN != 0


@dataclasses.dataclass(frozen=True)
class Decision:
    """The cost model's answer for one call: ``stage`` or not, with the names to copy and the
    two estimates (seconds)."""

    stage: bool
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    stage_s: float
    penalty_s: float
    #: the misaligned caller outputs are written in place by the packed-store variant of this
    #: aligned member (NOTE [Stores into packed rows]) instead of being copied back; None: copied
    packed: Any = None
    #: the call runs on the row-phase split (:mod:`evtc.dispatch.phase_split`) with this geometry:
    #: nothing is copied (``inputs`` and ``outputs`` are only what the other routes would copy)
    split: Any = None


def mn_tensors(graph) -> tuple[dict[str, DType], dict[str, DType]]:
    """The M x N tensors of an epilogue Graph: (inputs it reads: source C and aux loads, outputs it
    writes: D and aux stores), name -> dtype."""
    return ({n.name: n.dtype for n in graph.used_inputs if isinstance(n, (Source, AuxLoad))},
            {o.name: o.dtype for o in graph.outputs if isinstance(o, Store)})


def split_taken(geom, penalty_s: float, how: str) -> bool:
    """Whether the route takes the row-phase split ``geom`` (a :class:`phase_split.Geometry`) for a
    call whose unaligned kernel would cost ``penalty_s`` seconds more than the aligned one (a
    :class:`Decision`'s ``penalty_s``) under staging mode ``how``: ``EVTC_PHASE_SPLIT=always``
    wherever it can run; else with at least ``MIN_PHASE_ROWS`` rows a phase, where ``how`` is
    ``always`` or the split's fixed cost is below ``MARGIN`` times the penalty (NOTE [Row-phase
    split] in :mod:`evtc.dispatch.phase_split`)."""
    if split_mode() == "always":
        return True
    return geom.rows >= phase_split.MIN_PHASE_ROWS and \
        (how == "always" or phase_split.SPLIT_OVERHEAD_S < MARGIN * penalty_s)


def decide(M: int, N: int, L: int, loads: Mapping[str, DType], stores: Mapping[str, DType],
           staged_inputs: tuple[str, ...], staged_outputs: tuple[str, ...], how: str = "auto",
           target=None) -> Decision:
    """Stage or not (NOTE [Padded staging for unaligned rows]).

    Args:
        M, N, L: the problem.
        loads: every M x N input the epilogue reads (name -> dtype).
        stores: every M x N output it writes (name -> dtype).
        staged_inputs, staged_outputs: the misaligned inputs and caller-given outputs that the
            route would copy.
        how: ``auto``, ``always`` or ``never``.
        target: the device's :class:`~evtc.plan.target.Target` (its ``copy_bandwidth``; default
            the sm90 reference part's).
    """
    from evtc.plan.target import SM90

    copy_bandwidth = (target or SM90).copy_bandwidth
    elems = M * N * max(L, 1)
    penalty = sum(elems * dt.bytes for dt in loads.values()) * LOAD_S_PER_BYTE + \
        sum(elems * dt.bytes for dt in stores.values()) * STORE_S_PER_BYTE
    copied = [loads[n] for n in staged_inputs] + [stores[n] for n in staged_outputs]
    cost = sum(2 * elems * dt.bytes / copy_bandwidth + COPY_OVERHEAD_S for dt in copied)
    stage = how == "always" or (how == "auto" and cost < MARGIN * penalty)
    return Decision(stage, tuple(staged_inputs), tuple(staged_outputs), cost, penalty)


def _stream_context(framework: str, stream: Any):
    """A context that makes ``stream`` current for the framework's copies and allocations, or
    None when the route can't follow it (a raw handle or another framework's stream)."""
    import contextlib

    if stream is None:
        return contextlib.nullcontext()
    if framework == "torch":
        torch = sys.modules["torch"]
        if isinstance(stream, torch.cuda.Stream):
            return torch.cuda.stream(stream)
    return None


def _copy(framework: str, dst: Any, src: Any) -> None:
    if framework == "torch":
        from evtc.runtime.pitched_copy import copy_rows

        if not copy_rows(dst, src):  # NOTE [Pitched copies for staging]
            dst.copy_(src)
    else:  # cupy (the only other framework evtc allocates with)
        sys.modules["cupy"].copyto(dst, src)


def _given(graph, out: Any) -> dict[str, Any]:
    if out is None:
        return {}
    if isinstance(out, Mapping):
        return {k: v for k, v in out.items() if v is not None}
    return {graph.outputs[0].name: out}


class StagedLauncher:
    """Runs a call through the padded staging route (NOTE [Padded staging for unaligned rows]),
    or through the unaligned kernel where the route can't follow the call; the same interface
    as :class:`evtc.runtime.launch.Launcher` (``run`` after a probe, ``__call__``).

    Args:
        dispatch: the family Gemm's :class:`~evtc.dispatch.dispatcher.Dispatcher`.
        fallback: the unaligned member's KernelSpec (built only if a call needs it).
        checker: a Binder of the Gemm's graph that accepts any row stride (``mn_tma=False``).
    """

    def __init__(self, dispatch, fallback, checker) -> None:
        self.dispatch = dispatch
        self.family = dispatch.family
        self.fallback = fallback
        self.checker = checker
        g = self.graph = dispatch.graph
        self.loads, self.stores = mn_tensors(g)
        self._sigs: dict[tuple, Any] = {}
        #: probe key -> (indices of the M x N pointers, {(switches, their low bits): Decision})
        self._plans: dict[tuple, tuple[tuple[int, ...], dict]] = {}
        self._fallback_launcher = None
        #: calls staged / sent to the unaligned kernel / of the staged, those whose outputs the
        #: packed-store variant wrote (tests, benchmarks)
        self.staged = 0
        self.unstaged = 0
        self.packed_calls = 0
        #: calls on the row-phase split (NOTE [Row-phase split])
        self.split_calls = 0
        self._kinds = {n.name: n for n in g.inputs}
        self._rows = {n.name for n in g.inputs if isinstance(n, RowBroadcast)}
        self._cols = {n.name for n in g.inputs if isinstance(n, ColBroadcast)}

    def __call__(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any = None, stream: Any = None):
        from evtc.runtime.launch import probe_call

        key, ptrs = probe_call(self.checker, A, B, kwargs, out)
        return self.run(key, ptrs, A, B, kwargs, out, stream)

    def _unaligned(self, key, ptrs, A, B, kwargs, out, stream):
        self.unstaged += 1
        launcher = self._fallback_launcher
        if launcher is None:
            launcher = self._fallback_launcher = self.family.launcher(self.fallback)
        return launcher.run(key, ptrs, A, B, kwargs, out, stream)

    def _decision(self, key, ptrs, A, B, kwargs, out, sig) -> Decision:
        """:meth:`plan`, cached per probe key, switch setting and base-address alignment of the
        M x N tensors (what else it depends on, the key determines)."""
        if key is None:
            return self.plan(A, B, kwargs, out, sig)
        entry = self._plans.get(key)
        if entry is None:
            if len(self._plans) >= 1024:
                self._plans.clear()
            mn = set(self.loads) | set(self.stores)
            entry = self._plans[key] = (tuple(i for i, op in enumerate(sig.operands) if op.field[2:] in mn), {})
        idx, by = entry
        k = (self.dispatch.unaligned_staging, knobs.unaligned_staging.raw(), knobs.packed_stores.raw(),
             knobs.phase_split.raw(),
             tuple(ptrs[i] & (ALIGN - 1) for i in idx))
        d = by.get(k)
        if d is None:
            d = by[k] = self.plan(A, B, kwargs, out, sig)
        return d

    def _check(self, key, ptrs, A, B, kwargs, out):
        """The caller's call, checked as the unaligned kernel would (cached per signature; the
        pointer checks on every call)."""
        b = self.checker
        sig = self._sigs.get(key) if key is not None else None
        if sig is None:
            sig, _ = b.signature(A, B, kwargs, out)
            if key is not None:
                if len(self._sigs) >= 1024:
                    self._sigs.clear()
                self._sigs[key] = sig
            return sig
        b.check_pointers(sig, ptrs)
        return sig

    def plan(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any, sig=None) -> Decision:
        """The cost model's decision for this call (which tensors it would copy)."""
        g = self.graph
        if sig is None:
            sig, _ = self.checker.signature(A, B, kwargs, out)
        views = {n: tensors.view(kwargs[n], n, g.name) for n in self.loads}
        given = _given(g, out)
        gviews = {n: tensors.view(x, n, g.name) for n, x in given.items() if n in self.stores}
        ins = tuple(n for n, v in views.items() if misaligned(v, self.loads[n].bytes))
        outs = tuple(n for n, v in gviews.items() if misaligned(v, self.stores[n].bytes, output=True))
        how = mode(self.dispatch.unaligned_staging)
        frameworks = {v.framework for v in (*views.values(), *gviews.values())} | {sig.framework}
        # evtc's own views (a Conv's 1x1 route) have no framework methods to copy with
        views_only = any(type(kwargs[n]) is TensorView for n in ins) or any(type(given[n]) is TensorView for n in outs)
        if how == "never" or sig.mode != "launch" or not (ins or outs) or not frameworks <= set(FRAMEWORKS) \
                or len(frameworks) > 1 or views_only:
            return Decision(False, ins, outs, 0.0, 0.0)
        if sig.framework == "cupy" and any(dt.torch not in ("float32", "float16")
                                           for dt in (*self.loads.values(), *self.stores.values())):
            return Decision(False, ins, outs, 0.0, 0.0)
        split = self.split_geometry(sig, kwargs, given, views, gviews)
        if split is not None:
            d = decide(sig.M, sig.N, sig.L, self.loads, self.stores, ins, outs, how, self._target(sig))
            if split_taken(split, d.penalty_s, how):
                return dataclasses.replace(d, stage=True, stage_s=phase_split.SPLIT_OVERHEAD_S, split=split)
        spec = self.packed_spec(sig, gviews) if outs else None
        if spec is not None:
            # the outputs cost nothing more than aligned ones: only the inputs are copied
            d = decide(sig.M, sig.N, sig.L, self.loads, self.stores, ins, (), how, self._target(sig))
            return dataclasses.replace(d, outputs=outs, packed=spec)
        return decide(sig.M, sig.N, sig.L, self.loads, self.stores, ins, outs, how, self._target(sig))

    def _target(self, sig):
        """The Target of the call's device (its copy bandwidth)."""
        return self.family.target_for(tensors.device_name(sig.device) if sig.device >= 0 else None)

    def split_geometry(self, sig, kwargs: Mapping[str, Any], given: Mapping[str, Any],
                       views: Mapping[str, TensorView], gviews: Mapping[str, TensorView]):
        """The row-phase split of this call (NOTE [Row-phase split] in
        :mod:`evtc.dispatch.phase_split`) if it can take it, else None: ``EVTC_PHASE_SPLIT`` is not
        ``never``; torch tensors; an unbatched problem; an epilogue without reductions; every
        M x N output passed by the caller (``out=``); 2-D M x N tensors with unit column stride,
        1-D broadcasts; one split that fits the rows of every M x N input and output."""
        g = self.graph
        if split_mode() == "never" or sig.framework != "torch" or sig.batched or sig.L != 1 or \
                any(not isinstance(o, Store) for o in g.outputs) or any(n not in given for n in self.stores):
            # every output is in out= here: the caller's, or evtc's packed ones after packed inputs
            # (NOTE [The row layout of the outputs evtc allocates], evtc/gemm.py); others are padded
            return None
        mn = [*views.values(), *gviews.values()]
        if any(len(v.shape) != 2 or v.strides[1] != 1 or v.dtype is None for v in mn):
            return None
        for n, x in kwargs.items():
            node = self._kinds.get(n)
            if isinstance(node, (RowBroadcast, ColBroadcast)) and len(tensors.view(x, n, g.name).shape) != 1:
                return None
        torch = sys.modules.get("torch")
        if torch is None or not all(isinstance(x, (torch.Tensor, numbers.Number))
                                    for x in (*kwargs.values(), *given.values())):
            return None
        return phase_split.find_geometry(sig.M, sig.N, [(v.ptr, v.strides[0], v.dtype.bytes) for v in mn],
                                         align_bytes=[dt.bytes for dt in self.stores.values()])

    def packed_spec(self, sig, gviews: Mapping[str, TensorView]):
        """The packed-store variant (NOTE [Stores into packed rows], evtc/plan/sm90_buffers.py) of the member
        the aligned problem runs on, when it can write this call's outputs in place and
        ``EVTC_PACKED_STORES`` allows it: an sm90 member that is not swap-AB, outputs of 16 bits
        or more (fp8 outputs are copied back) whose base addresses are element-aligned, and under
        ``auto`` an epilogue with one M x N output (with two, aux_heavy at 4096 x 50257 x 4096
        took 2.7x the aligned time against 1.3x with copies back, H100: NOTE [Padded staging for
        unaligned rows]); else None."""
        fam = self.family
        how = packed_mode()
        if fam.arch != "sm90" or how == "never" or (how == "auto" and len(self.stores) != 1):
            return None
        for n, v in gviews.items():
            eb = self.stores[n].bytes
            if eb < 2 or v.ptr % eb:
                return None
        spec = fam.choose(sig.M, sig.N, sig.K, sig.L)
        if spec.arch != "sm90" or spec.config.swap_ab or spec.config.unaligned:
            return None
        return spec.packed_variant()

    def run(self, key, ptrs, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any = None, stream: Any = None):
        sig = self._check(key, ptrs, A, B, kwargs, out)
        d = self._decision(key, ptrs, A, B, kwargs, out, sig)
        ctx = _stream_context(sig.framework, stream) if d.stage else None
        if ctx is None:
            return self._unaligned(key, ptrs, A, B, kwargs, out, stream)
        g = self.graph
        fw, dev = sig.framework, sig.device
        given = _given(g, out)
        if d.split is not None:
            self.split_calls += 1
            with ctx:
                return phase_split.run(self.dispatch, d.split, A, B, kwargs, given, stream, loads=self.loads,
                                       stores=self.stores, rows=self._rows, cols=self._cols)
        self.staged += 1
        with ctx:
            kw = dict(kwargs)
            for n in d.inputs:
                v = tensors.view(kwargs[n], n, g.name)
                obj, _ = tensors.strided_allocator(fw, dev, v.shape, padded_strides(v.shape, v.dtype.bytes),
                                                   v.dtype)()
                _copy(fw, obj, kwargs[n])
                kw[n] = obj
            if d.packed is not None:  # NOTE [Stores into packed rows]: the caller's outputs in place
                self.packed_calls += 1
                return self.family.launcher(d.packed)(A, B, kw, out, stream)
            # a staged output is left to evtc's allocation (rows already padded, and its ragged N
            # is padding there: NOTE [Ragged N and TMA stores]), then copied into the caller's
            if out is None or not d.outputs:
                out2 = out
            elif isinstance(out, Mapping):
                out2 = {n: x for n, x in out.items() if n not in d.outputs} or None
            else:
                out2 = None
            res = self.dispatch.run(A, B, kw, out2, stream)
            got = res if isinstance(res, dict) else {g.outputs[0].name: res}
            for n in d.outputs:
                _copy(fw, given[n], got[n])
        if not d.outputs:
            return res
        if isinstance(res, dict):
            return {n: (given[n] if n in d.outputs else x) for n, x in res.items()}
        return given[g.outputs[0].name]
