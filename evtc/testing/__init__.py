"""The correctness oracle of the GPU tests, ``evtc run`` and ``evtc demo``, and the timing
harness of the benchmarks.

Input: a :class:`evtc.Gemm` (or a Graph), a problem size and a seed. Output: fresh random inputs
(never zeros), NaN-poisoned outputs, and per output an :class:`OutputCheck`: how many elements
lie outside their bound, the worst one (index, got, expected, ulps) and a summary.

Modules: :mod:`~evtc.testing.oracle` (the host half, numpy only: the float64 reference, the
per-element error bounds of NOTE [The error bound], :func:`compare`, :func:`verify`),
:mod:`~evtc.testing.inputs` (the device half: :class:`Problem`, :func:`make_inputs`,
:func:`poisoned_outputs`), :mod:`~evtc.testing.checks` (:func:`check`: a Gemm run and checked)
and :mod:`~evtc.testing.bench` (CUDA-event and CUDA-graph timing; not re-exported here).
"""

from evtc.testing.checks import check, check_outputs, chosen_kernel
from evtc.testing.inputs import Problem, make_inputs, padded_empty, padding_of, poisoned_outputs, random_tensor
from evtc.testing.oracle import (
    ACC_SAFETY,
    F32_ERROR,
    FP8_PROMOTION_INTERVAL,
    LAMBDA,
    LIPSCHITZ,
    U_FP8_MMA,
    ULPS,
    OutputCheck,
    accumulator_error,
    compare,
    failure_report,
    fast_accumulation,
    reference,
    reference_and_bounds,
    relative_error,
    to_numpy,
    tolerance,
    ulp,
    verify,
)

__all__ = [
    "ACC_SAFETY", "F32_ERROR", "FP8_PROMOTION_INTERVAL", "LAMBDA", "LIPSCHITZ", "U_FP8_MMA", "ULPS", "OutputCheck",
    "Problem", "accumulator_error", "check", "check_outputs", "chosen_kernel", "compare", "failure_report",
    "fast_accumulation", "make_inputs", "padded_empty", "padding_of", "poisoned_outputs", "random_tensor",
    "reference", "reference_and_bounds", "relative_error", "to_numpy", "tolerance", "ulp", "verify",
]
