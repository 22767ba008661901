"""Dispatch: a call -> the launcher that runs it, decided once per call signature.

Input: a call's tensors and scalars (A, B, the epilogue's arguments, ``out=``) and a
:class:`~evtc.dispatch.family.GemmFamily`. Output: the call's outputs, run by the launcher
:meth:`Dispatcher.route` chose for its signature: a pinned family's one kernel, a member chosen
for the problem, or the padded staging route (with the row-phase split) for M x N rows TMA can't
address. Calls with torch tensors on a signature the Python path has checked run through the
torch fast path (NOTE [The torch fast path] in :mod:`evtc.torch.fast`), which the Gemm hands in.
"""

from __future__ import annotations

import json
import math
import sys
from typing import Any, Callable, Mapping

from evtc import knobs
from evtc.abi import abi_fields, ctypes_struct
from evtc.dispatch.family import GemmFamily, kernel_key
from evtc.dtypes import DType
from evtc.errors import ArgumentError, MisalignedError
from evtc.family.spec import KernelSpec, Problem
from evtc.ir.nodes import AuxLoad, Source, Store
from evtc.runtime import tensors
from evtc.runtime.bind import ALIGN, Binder, batch_count, follows_packed_inputs
from evtc.runtime.launch import EmptyLauncher, Launcher, probe_call
from evtc.runtime.tensors import contiguous_strides

__all__ = ["Dispatcher", "NoFastPath", "aligned_rows", "call_problem"]


def aligned_rows(v: tensors.TensorView, eb: int) -> bool:
    """TMA can read ``v``: 16-byte aligned base, row and batch strides."""
    if v.ptr % ALIGN:
        return False
    if len(v.shape) >= 2 and v.shape[-2] > 1 and (v.strides[-2] * eb) % ALIGN:
        return False
    return not (len(v.shape) == 3 and v.shape[0] > 1 and (v.strides[0] * eb) % ALIGN)


def call_problem(family: GemmFamily, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any) -> tuple[Problem, int]:
    """The :class:`~evtc.family.spec.Problem` of a call (M, N, K, L and the alignment of A, B and
    every M x N tensor the caller passes) and its device ordinal (-1: host memory).

    Raises:
        ArgumentError: A or B is not a 2-D or 3-D device tensor (named).
    """
    g = family.graph
    va, vb = tensors.view(A, "A", g.name), tensors.view(B, "B", g.name)
    if len(va.shape) not in (2, 3) or len(vb.shape) not in (2, 3):
        raise ArgumentError(f"A and B must be 2-D or 3-D, got A {tuple(va.shape)} and B {tuple(vb.shape)}",
                            epilogue=g.name)
    M, K = va.shape[-2:]
    N = vb.shape[-2]
    L = batch_count(va.shape, vb.shape)
    aligned_k = aligned_rows(va, family.a.bytes) and aligned_rows(vb, family.b.bytes)
    aligned_mn = True
    for n in g.used_inputs:
        if isinstance(n, (Source, AuxLoad)) and n.name in kwargs and \
                not aligned_rows(tensors.view(kwargs[n.name], "tensor", g.name), n.dtype.bytes):
            aligned_mn = False
    given = out if isinstance(out, Mapping) else ({g.outputs[0].name: out} if out is not None else {})
    for o in g.outputs:
        x = given.get(o.name) if isinstance(o, Store) else None
        # a caller's output must also end its rows on a 16-byte vector for the TMA store
        # (NOTE [Ragged N and TMA stores] in evtc.runtime.bind)
        if x is not None and (not aligned_rows(tensors.view(x, "tensor", g.name), o.dtype.bytes)
                              or N % (ALIGN // o.dtype.bytes)):
            aligned_mn = False
    sms = family.target_for(tensors.device_name(va.device) if va.device >= 0 else None).sm_count
    return Problem(M, N, K, L, aligned_mn, aligned_k, sms), va.device


class Dispatcher:
    """Runs a Gemm's calls: probes each, finds its signature's launcher, else routes it once.

    Args:
        family: the Gemm's kernels.
        c: the Gemm's source dtype (the row-phase split's packed rows).
        d: the Gemm's output dtype.
        fast_path: makes the Dispatcher's side of a call fast path from the Dispatcher
            (:class:`evtc.torch.fast.FastPathHook`, which :class:`evtc.Gemm` passes); None: none.

    Attributes:
        family: the :class:`~evtc.dispatch.family.GemmFamily`.
        prober: the primary kernel's argument checker (probe keys; the full checks of a
            malformed call).
        unaligned_staging: the padded staging route's mode (``auto``, ``always``, ``never``, or
            None for ``EVTC_UNALIGNED_STAGING``; NOTE [Padded staging for unaligned rows]).
        autotune: whether the first call of a new shape bucket times the selection model's best
            candidates and keeps the fastest (never while a CUDA graph is captured).
    """

    def __init__(self, family: GemmFamily, *, c: DType | None, d: DType,
                 fast_path: Callable[[Dispatcher], Any] | None = None) -> None:
        self.family = family
        self.c, self.d = c, d
        g = self.graph = family.graph
        self.prober = Binder(g, family.a, family.b, ctypes_struct(abi_fields(g, family.arch)), arch=family.arch)
        # NOTE [Checks before builds]: a call's first kernel may take minutes of nvcc to build, so
        # every check that holds whichever kernel runs it (names, dtypes, devices, shapes, strides,
        # scalars, overlaps) runs first, on this binder: the graph's ABI without a library, and no
        # alignment rule (those depend on the route: TMA members, the unaligned ones, sm80's)
        self.precheck = Binder(g, family.a, family.b, ctypes_struct(abi_fields(g, "sm80")), arch="sm80",
                               mn_tma=False)
        self.unaligned_staging: str | None = None
        #: time the model's first ``autotune_top`` candidates on a new shape bucket's first call
        #: (NOTE [The selection model]; :class:`evtc.Gemm`'s ``autotune``)
        self.autotune = False
        self.autotune_top = 4
        self._routes: dict[tuple, Launcher] = {}
        self._single: Launcher | None = None  # a pinned family's launcher, once built
        # NOTE [The row layout of the outputs evtc allocates]: the M x N inputs by name and
        # element bytes, the M x N outputs by name and dtype
        self.mn_loads = tuple((n.name, n.dtype.bytes) for n in g.used_inputs if isinstance(n, (Source, AuxLoad)))
        self.mn_stores = tuple((o.name, o.dtype) for o in g.outputs if isinstance(o, Store))
        # rows of a multiple of this many elements are 16-byte multiples in every M x N input
        self.mn_row_quantum = max([ALIGN // math.gcd(ALIGN, eb) for _, eb in self.mn_loads] or [1])
        self.fast = (fast_path or NoFastPath)(self)

    # ---- the route ---------------------------------------------------------------------------

    def choose(self, p: Problem, device: int) -> KernelSpec:
        """The member for problem ``p`` on device ordinal ``device`` (its tuned choice first)."""
        return self.family.choose(p.M, p.N, p.K, p.L, aligned_mn=p.aligned_mn, aligned_k=p.aligned_k,
                                  sm_count=p.sm_count,
                                  device=tensors.device_name(device) if device >= 0 else None)

    def route(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any) -> Launcher:
        """The launcher of a call: the one function that decides a route.

        A pinned family has one; otherwise the member :meth:`choose` picks for the call's
        problem, except that M x N rows TMA can't address (with A and B rows it can) on an sm90
        member go to the padded staging route where it is not ``never``, which decides per call
        between copies, the row-phase split, the packed-store variant and the unaligned kernel
        (NOTE [Padded staging for unaligned rows] in :mod:`evtc.dispatch.staging`).

        Raises:
            ArgumentError: a malformed call (the full checks of the primary kernel's binder; on a
                pinned family, alignment included, before its kernel is built).
            BuildError: the chosen kernel did not build.
        """
        fam = self.family
        if fam.pinned:
            spec = fam.members["pinned"]
        else:
            try:
                p, device = call_problem(fam, A, B, kwargs, out)
            except ArgumentError:
                self.prober.signature(A, B, kwargs, out)  # says what is wrong, where it can
                raise
            if self.autotune and p.aligned_mn and p.aligned_k and device >= 0:
                self._autotune(p, device)
            spec = self.choose(p, device)
        if fam.kernel(spec).library is None:
            # NOTE [Checks before builds]: every argument is checked before a build starts; a
            # pinned family's route is its one kernel, so its binder's alignment rules too (the
            # ones its launcher applies after the build: a caller's rows or base address TMA
            # can't use), after the rules of every route
            self.precheck.signature(A, B, kwargs, out)
            knobs.check(knobs.CALL_KNOBS + knobs.BUILD_KNOBS)  # the environment's too
            if fam.pinned:
                fam.binder(spec, fam.kernel(spec)).signature(A, B, kwargs, out)
            elif 0 in (p.M, p.N, p.L):  # NOTE [An empty call builds nothing] (evtc/runtime/launch.py)
                return EmptyLauncher(fam.binder(spec, fam.kernel(spec)), fam.name)
        if not fam.pinned and not p.aligned_mn and p.aligned_k and spec.config.unaligned and spec.arch == "sm90":
            from evtc.dispatch import staging

            # (never for a batch-invariant family: its per-call choice depends on M)
            if staging.mode(self.unaligned_staging) != "never" and fam.invariance is None:
                return self._staged_launcher(spec)
        return fam.launcher(spec)

    def _autotune(self, p: Problem, device: int) -> None:
        """Time the model's best-ranked candidates of ``p``'s shape bucket on this device and store
        the fastest (:mod:`evtc.dispatch.tune`), unless the store has it or a CUDA graph is being
        captured (the first call of a bucket then takes the model's choice)."""
        from evtc.dispatch import tune

        name = tensors.device_name(device)
        if self.family.tuned_choice(p, name) is not None:
            return
        torch = sys.modules.get("torch")
        if torch is None or torch.cuda.is_current_stream_capturing():
            return
        with torch.cuda.device(device):
            tune.tune(self, [(p.M, p.N, p.K, p.L)], iters=10, top=self.autotune_top)

    def _staged_launcher(self, fallback: KernelSpec):
        from evtc.dispatch import staging

        key = ("staged", kernel_key(fallback), json.dumps(fallback.config.to_json(), sort_keys=True))
        launcher = self.family.launchers.get(key)
        if launcher is None:
            fam = self.family
            checker = Binder(self.graph, fam.a, fam.b, ctypes_struct(abi_fields(self.graph, fam.arch)),
                             arch=fam.arch, mn_tma=False)
            launcher = self.family.launchers[key] = staging.StagedLauncher(self, fallback, checker)
        return launcher

    def set_unaligned_staging(self, how: str | None) -> None:
        """Select the padded staging route for every later call (see :attr:`unaligned_staging`).

        Raises:
            ConfigError: an unknown mode.
        """
        if how is not None:
            from evtc.dispatch import staging

            staging.mode(how)  # validate
        self.unaligned_staging = how
        self.forget()

    def forget(self) -> None:
        """Drop every call signature's route (and the torch fast path's copies of them): the next
        call of each signature is routed again (after tuning, or a new staging setting)."""
        self._routes.clear()
        self.fast.clear()
        if "evtc.dispatch.phase_split" in sys.modules:  # the row-phase split's members, chosen again
            sys.modules["evtc.dispatch.phase_split"].forget(self)

    # ---- running -----------------------------------------------------------------------------

    def run(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any = None, stream: Any = None):
        """Run a call (the torch fast path first, where it knows the call's signature).

        Raises:
            ArgumentError: a missing, extra or malformed argument (named).
            LaunchError: CUDA reported an error.
        """
        fast = self.fast.call
        if fast is not None and out is None and stream is None:
            r = fast(A, B, kwargs)
            if r is not None:
                return r
        return self.run_checked(A, B, kwargs, out, stream)

    def run_checked(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Any, stream: Any):
        """:meth:`run` on the Python launch path: checks, routes (once per signature), launches,
        and registers the call with the fast path."""
        if stream is not None:  # NOTE [Checks before builds]: the stream too (the launcher reads it after the build)
            tensors.stream_handle(stream, None, self.family.name)
        if self.mn_loads and (out is None or isinstance(out, Mapping)):
            out = self.packed_outputs(A, B, kwargs, out)
        single = self._single
        if single is None and self.family.pinned:
            single = self._single = self.route(A, B, kwargs, out)
        if single is not None:  # one launcher, which probes with its own binder (its kernel's ABI)
            launcher = single
            key, ptrs = single._probe(A, B, kwargs, out)
        else:
            key, ptrs = probe_call(self.prober, A, B, kwargs, out)
            launcher = self._routes.get(key) if key is not None else None
            if launcher is None:
                launcher = self.route(A, B, kwargs, out)
                if key is not None:
                    self._routes[key] = launcher
        try:
            result = launcher.run(key, ptrs, A, B, kwargs, out, stream)
        except MisalignedError:
            if single is not None:
                raise
            # a base address TMA can't use, with strides it can: this call (only) goes to the
            # member chosen from its real alignment
            return self.route(A, B, kwargs, out)(A, B, kwargs, out, stream)
        if out is None and stream is None and key is not None:
            self.fast.register(launcher, key, A, B, kwargs)
        return result

    def packed_outputs(self, A: Any, B: Any, kwargs: Mapping[str, Any], out: Mapping[str, Any] | None):
        """``out`` with the M x N outputs the caller did not pass allocated with packed rows, where
        NOTE [The row layout of the outputs evtc allocates] says so; else ``out`` unchanged.

        # NOTE [The row layout of the outputs evtc allocates]
        An M x N output evtc allocates has rows padded to 16 bytes (N = 50257 bf16: row stride
        50264), so that the TMA store and the next call's TMA loads address it; except where the
        call's M x N inputs (source C, aux loads) are all contiguous and their rows are not
        16-byte multiples (a packed vocabulary N = 50257 in bf16): then its outputs are
        contiguous too, like the result of a torch elementwise op on those inputs, and the call
        runs as if the caller had passed them with ``out=``. That lets such a call take the
        row-phase split (:mod:`evtc.dispatch.phase_split`: every M x N tensor in one row layout,
        no copies; 1.03x the aligned neighbour at 4096 x 50257 x 4096, docs/performance.md).
        Shapes and strides alone decide it (:func:`evtc.runtime.bind.follows_packed_inputs`),
        so the torch op's fake implementation gives the same strides.
        """
        name = self.graph.name
        try:
            shape = getattr(B, "shape", None)  # torch, cupy: without a view (the common, aligned case)
            vb = tensors.view(B, "B", name) if shape is None else None
            shape = vb.shape if vb is not None else shape
            if len(shape) in (2, 3) and shape[-2] % self.mn_row_quantum == 0:
                return out  # rows of N elements are 16-byte multiples: padding changes nothing
            missing = [(n, dt) for n, dt in self.mn_stores if out is None or out.get(n) is None]
            if not missing:
                return out
            va, vb = tensors.view(A, "A", name), vb or tensors.view(B, "B", name)
            mn = []
            for n, eb in self.mn_loads:
                x = kwargs.get(n)
                if x is None:
                    return out
                v = tensors.view(x, n, name)
                mn.append((tuple(v.shape), tuple(v.strides), eb))
        except (ArgumentError, TypeError, ValueError, IndexError):
            return out  # a malformed call: the binder says what is wrong with it
        if len(va.shape) not in (2, 3) or len(vb.shape) not in (2, 3) or va.device < 0 or \
                not follows_packed_inputs(vb.shape[-2], mn):
            return out
        M, N = va.shape[-2], vb.shape[-2]
        batched = len(va.shape) == 3 or len(vb.shape) == 3
        shape = (batch_count(va.shape, vb.shape), M, N) if batched else (M, N)
        got = dict(out or {})
        for n, dt in missing:
            got[n], _ = tensors.strided_allocator(va.framework, va.device, shape, contiguous_strides(shape), dt)()
        return got


class NoFastPath:
    """The fast-path hook of a Dispatcher made without one: every call takes the Python path
    (:class:`evtc.torch.fast.FastPathHook` is the one :class:`evtc.Gemm` gives)."""

    call = None

    def __init__(self, dispatcher: Dispatcher) -> None:
        self.dispatcher = dispatcher

    def clear(self) -> None:
        pass

    def register(self, launcher: Launcher, key: tuple, A: Any, B: Any, kwargs: Mapping[str, Any]) -> None:
        pass
