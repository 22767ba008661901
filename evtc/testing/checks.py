"""A Gemm run and checked: the oracle's two halves joined (``evtc run``, ``evtc demo``, the GPU tests).

Input: a built (or buildable) :class:`evtc.Gemm`, a :class:`~evtc.testing.inputs.Problem` and a
seed, or the inputs and outputs of a call the caller made. Output: output name ->
:class:`~evtc.testing.oracle.OutputCheck` (NOTE [The error bound] in :mod:`evtc.testing.oracle`).
"""

from __future__ import annotations

from typing import Any, Mapping

from evtc.ir.nodes import Store
from evtc.testing.inputs import Problem, _torch, make_inputs, padding_of, poisoned_outputs
from evtc.testing.oracle import (
    OutputCheck,
    _exact_accumulator,
    accumulator_error,
    fast_accumulation,
    to_numpy,
    verify,
)

__all__ = ["check", "check_outputs", "chosen_kernel"]


def check_outputs(gemm, inputs: Mapping[str, Any], outputs: Mapping[str, Any], *, padding: bool = True
                  ) -> dict[str, OutputCheck]:
    """Check outputs the caller ran ``gemm`` to (torch tensors) against the reference of
    ``inputs`` (``make_inputs``'s dict: A, B and the epilogue's inputs).

    Returns:
        Output name -> :class:`OutputCheck`.
    """
    graph = gemm.graph
    acc, sq = _exact_accumulator(inputs["A"], inputs["B"])
    K = int(inputs["A"].shape[-1])
    vals = {k: to_numpy(v) for k, v in inputs.items() if k not in ("A", "B")}
    got = {k: to_numpy(v) for k, v in outputs.items()}
    pads = {k: p for k, v in outputs.items() if padding and hasattr(v, "stride") and (p := padding_of(v)) is not None}
    acc_err = accumulator_error(sq, K, gemm.a, fast_accum=fast_accumulation(gemm))
    return verify(graph, got, acc, acc_err, vals, padding=pads)


def chosen_kernel(gemm, p: Problem, *, device: str | None = None):
    """The kernel (:class:`evtc.gemm.Kernel`, maybe not built) of the member :meth:`Gemm.choose
    <evtc.gemm.Gemm.choose>` picks for a call on :func:`make_inputs` data with
    :func:`poisoned_outputs` (as :func:`check` and :func:`evtc.testing.bench.bench_gemm` call): their rows
    are padded to 16 bytes, so only an M x N output whose N ends mid-vector makes the call
    unaligned (it then takes the unaligned member, or the padded staging route: NOTE [Padded
    staging for unaligned rows]).

    Args:
        gemm: the family (or pinned) Gemm.
        p: the problem.
        device: the GPU's name, for the tuner's stored choices (None: the heuristic's).
    """
    aligned_mn = all(p.N % max(1, 16 // o.dtype.bytes) == 0 for o in gemm.graph.outputs if isinstance(o, Store))
    return gemm.kernel(gemm.choose(p.M, p.N, p.K, p.L, aligned_mn=aligned_mn, device=device))


def check(gemm, p: Problem, *, seed=0, device="cuda", batched=None) -> dict[str, OutputCheck]:
    """Run ``gemm`` on fresh random data with NaN-poisoned outputs and compare every element
    with the reference (NOTE [The error bound]).

    Returns:
        Output name -> :class:`OutputCheck` (``.ok``; ``.describe()`` names the worst element).
        Each also unpacks as ``(excess, 1.0)`` for callers of the old ``(error, bound)`` form.
    """
    from evtc.errors import MisalignedError

    graph = gemm.graph
    ins = make_inputs(graph, gemm.a, gemm.b, p, device=device, seed=seed, batched=batched)
    outs = poisoned_outputs(graph, p, device=device, batched=batched)
    kwargs = {k: v for k, v in ins.items() if k not in ("A", "B")}
    try:
        gemm(ins["A"], ins["B"], out=outs, **kwargs)
    except MisalignedError:
        # a kernel that stores whole 16-byte vectors refuses outputs whose rows end mid-vector
        # (NOTE [Ragged N and TMA stores]): let it allocate them (no poison, no padding check)
        got = gemm(ins["A"], ins["B"], **kwargs)
        outs = got if isinstance(got, dict) else {graph.outputs[0].name: got}
        _torch().cuda.synchronize()
        return check_outputs(gemm, ins, outs, padding=False)  # evtc's own padding is not poisoned
    _torch().cuda.synchronize()
    return check_outputs(gemm, ins, outs)
