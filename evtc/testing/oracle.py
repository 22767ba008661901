"""The oracle's host half: a kernel's outputs checked element by element against the float64
reference, within per-element error bounds.

Input: an epilogue's Graph, its outputs and inputs as host arrays, the exact accumulator and its
error bound. Output: per output an :class:`OutputCheck`: how many elements lie outside their
bound, the worst one (index, got, expected, ulps) and a summary.

It needs only numpy, so the oracle is tested without a GPU (``tests/null/test_oracle.py``); the
device half (:mod:`evtc.testing.inputs`: random inputs, NaN-poisoned outputs;
:mod:`evtc.testing.checks`: run a Gemm and check it) uses torch.

NOTE [The error bound]
----------------------
An output element passes when

    |got - expected| <= ULPS * (ulp(expected) + ulp(v)) / 2 + E

``expected`` is the float64 reference (:func:`evtc.ir.interpret.interpret`) rounded to the
output dtype, ``ulp`` the spacing of the output dtype at a value (the subnormal spacing near
zero), ``ULPS = 1``, ``E`` a bound on how far the kernel's float32 value ``v`` before the final
rounding can be from the exact one, and ``ulp(v)`` the smaller of ``ulp(got)`` and the ulp at the
largest ``|v|`` that ``E`` allows. The ``ULPS`` term is the two final roundings, the reference's
and the kernel's, half an ulp each at its own value; nothing else is granted in ulps, so with
``E`` small an element two ulps off fails (two e4m3 ulps are 12 to 25 %, which the old
norm-wide bound ``4 * eps + 1e-4`` let through). ``E`` is computed per element by propagating
error bounds through the graph (:func:`reference_and_bounds`); that is the "floor near zero": an
element whose exact value cancels to nearly zero keeps the absolute error of the terms it was
computed from. Its sources:

* The accumulator. Products of bf16/f16/fp8 operands are exact in f32; the tensor cores add
  them in blocks of one instruction's K (32 bytes of operands: 16 for 16-bit, 32 for fp8) into
  the f32 accumulator, aligning to the largest term and truncating, so each of the
  ``ceil(K / k)`` steps loses at most one unit in the last kept place of the running sum. For
  16-bit operands that place is f32's (2^-23 relative). The running sum of zero-mean data
  stays within a few ``R = sqrt(sum_k a_k^2 b_k^2)`` (a random walk's scale), so
  ``E_acc = ACC_SAFETY * u_acc * ceil(K / k) * R`` with ``ACC_SAFETY = 4``, per element (``R``
  from the actual A and B). fp8 WGMMA keeps about 14 bits (DeepSeek-V3 technical report,
  section 3.3.2: ``u_fp8 = 2^-13`` relative), and which sum it keeps them of is the kernel's
  schedule (NOTE [fp8 accumulation] in :func:`accumulator_error`): over the whole K with
  ``GemmConfig(fast_accum=True)`` (CUTLASS's ``...FP8FastAccum`` schedules: the bound above
  with ``u_acc = u_fp8``), else over windows of 4 MMAs whose partial sums are promoted into an
  f32 sum, a bound about 5x smaller at K = 4096. :func:`make_inputs` draws zero-mean operands;
  other data need their own ``acc_error``.
* f32 arithmetic in the epilogue: each op adds its own rounding, ``F32_ERROR`` below (one
  rounding, 2^-24 relative, for IEEE add/mul/div/sqrt/fma; CUDA's documented ulp errors for
  ``expf`` (2), ``logf`` (1), ``erff`` (2), ``rsqrtf`` (2), ``powf``; PTX's ``tanh.approx.f32``,
  which CUTLASS's ``Tanh`` and ``GELU_taylor`` use, at 2^-10.987 relative; sums of those for
  the composite activations, ``gelu`` (evtc's ``x Phi(x)`` with ``Phi`` through one ``ex2``, NOTE
  [GELU without erff]) with an absolute error proportional to ``|x|``), and scaled input errors
  are carried to its result: by the op's Lipschitz constant (``LIPSCHITZ``: gelu, erf, tanh...)
  or, for every other op, by evaluating its float64 rule at the corners of its inputs' error
  intervals (exact for the monotone and bilinear ops; a comparison whose operands' intervals
  overlap may flip, and a ``where`` then allows the difference of its two branches).
* Reductions (row, column, scalar): a sum over n terms adds the terms' bounds and the f32
  rounding of the sum, ``LAMBDA * 2^-24 * sqrt(n) * (|sum| + 4 ||v||_2)``: the probabilistic
  bound of Higham and Mary (SIAM J. Sci. Comput. 41(5), 2019) with the partial sums of any
  summation order (tree, shuffles, atomics) bounded by the final sum plus a random-walk
  excursion, ``LAMBDA = 4``. A max or min adds nothing: its bound is the largest of its
  terms'.

A NaN, an infinity that the reference does not have, or an element left NaN-poisoned never
passes; a NaN in the reference fails the check too (the test's data are wrong). Elements of
the row padding that :func:`poisoned_outputs` adds after the last column must still be NaN
afterwards (a write past the ragged edge fails).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Callable, Iterator, Mapping

import numpy as np

from evtc import dtypes, ops
from evtc.dtypes import DType
from evtc.ir.graph import Graph
from evtc.ir.interpret import interpret
from evtc.ir.nodes import (
    Accumulator,
    AuxLoad,
    ColBroadcast,
    Compute,
    Immediate,
    Node,
    ReduceOp,
    Reduction,
    RowBroadcast,
    ScalarBroadcast,
    Source,
    Store,
)

__all__ = [
    "ACC_SAFETY", "F32_ERROR", "FP8_PROMOTION_INTERVAL", "LAMBDA", "LIPSCHITZ", "U_FP8_MMA", "ULPS", "OutputCheck",
    "accumulator_error", "compare", "failure_report", "fast_accumulation", "reference", "reference_and_bounds",
    "relative_error", "to_numpy", "tolerance", "ulp", "verify",
]

#: ulps of the output dtype granted on top of the propagated bound (NOTE [The error bound]).
ULPS = 1.0
#: safety factor on the accumulator's error model.
ACC_SAFETY = 4.0
#: the lambda of the probabilistic summation bound of reductions.
LAMBDA = 4.0

_U = 2.0 ** -24  # unit roundoff of f32
# smallest normal exponent of each dtype, for its ulp near zero (subnormal spacing)
_MIN_EXP = {"f32": -126, "f16": -14, "bf16": -126, "e4m3": -6, "e5m2": -14}


def ulp(x, dtype: DType) -> np.ndarray:
    """The spacing of ``dtype`` at ``|x|``: ``2^(floor(log2 |x|) - mantissa_bits)``, the subnormal
    spacing below the smallest normal (so ``ulp(0)`` is the smallest positive subnormal).

    Args:
        x: float64 array (finite values; infinities and NaN give inf).
        dtype: the output dtype.

    Returns:
        float64 array of the shape of ``x``.
    """
    a = np.asarray(x, dtype=np.float64)
    _, e = np.frexp(a)  # |a| = m 2^e with m in [0.5, 1): floor(log2 |a|) = e - 1; e = 0 for a = 0
    e = np.maximum(e - 1, _MIN_EXP[dtype.name])
    e = np.where(a == 0, _MIN_EXP[dtype.name], e)
    u = np.ldexp(1.0, e - dtype.mantissa_bits)
    return np.where(np.isfinite(a), u, np.inf)


# ---- the accumulator -------------------------------------------------------------------------------

#: unit of the sum an fp8 WGMMA keeps (about 14 bits: NOTE [The error bound]).
U_FP8_MMA = 2.0 ** -13
#: MMAs between two promotions of an fp8 kernel's tensor-core partial sum into its f32 sum:
#: CUTLASS's ``mma_promotion_interval`` default, which evtc's kernels keep (NOTE [fp8 accumulation]).
FP8_PROMOTION_INTERVAL = 4


def accumulator_error(sq_dot: np.ndarray, K: int, a: DType, *, fast_accum: bool = False) -> np.ndarray:
    """Bound on the error of the kernel's f32 accumulator (NOTE [The error bound]).

    NOTE [fp8 accumulation]: an fp8 GEMM's kernel schedule decides how it accumulates. The
    ``...FP8FastAccum`` schedules (``GemmConfig(fast_accum=True)``) run CUTLASS's plain mainloop
    (``sm90_mma_tma_gmma_ss_warpspecialized.hpp``): every WGMMA adds into one accumulator, so all
    ``ceil(K / 32)`` steps round at ``U_FP8_MMA`` relative to a sum of size ``R``. Every other
    schedule (the default, ``fast_accum=False``: ``KernelTmaWarpSpecialized{,Cooperative,
    Pingpong}``) gets ``MainloopSm90TmaGmmaWarpSpecializedFP8``
    (``sm90_mma_tma_gmma_ss_warpspecialized_fp8.hpp``) from the collective builder, whose
    ``GmmaFP8Accumulation`` (``fp8_accumulation.hpp``) lets the WGMMAs accumulate into a
    temporary that starts from zero (``ScaleOut::Zero``) and, every ``mma_promotion_interval``
    (4) MMAs, adds it to the f32 accumulator in f32 (``promote_core``: ``accum_(i) +=
    accum_temp_(i)``), the residue after the last k-tile too. So with ``m = 4`` MMAs of 32 K
    each, the ``W = ceil(K / 128)`` windows each lose at most ``m`` steps of ``U_FP8_MMA`` times
    their partial sum, which stays within a few ``R_w`` (the window's ``sqrt(sum a^2 b^2)``),
    and each promotion adds one f32 rounding (2^-23 relative, as for 16-bit operands) of the
    running sum (a few ``R``). With ``sum_w R_w <= sqrt(W) R`` (Cauchy-Schwarz):
    ``E_acc = ACC_SAFETY * R * (U_FP8_MMA * m * sqrt(W) + 2^-23 * W)``. At K = 4096 that is
    ``4 R (2^-13 * 4 * sqrt(32) + 2^-23 * 32) = 0.011 R`` against fast accumulation's
    ``4 R 2^-13 * 128 = 0.0625 R``.

    Args:
        sq_dot: ``sum_k A[..., m, k]^2 * B[..., n, k]^2`` in float64, (M, N) or (L, M, N).
        K: the GEMM's K.
        a: the operand dtype (bf16/f16: f32 accumulation; fp8: see ``fast_accum``).
        fast_accum: fp8 only: the kernel runs an ``FP8FastAccum`` schedule
            (:func:`fast_accumulation` of a Gemm says whether it may).

    Returns:
        float64 array of the shape of ``sq_dot``: ``ACC_SAFETY * u_acc * ceil(K / k) * R``, or the
        promoted fp8 bound above.
    """
    R = np.sqrt(np.asarray(sq_dot, dtype=np.float64))
    k = max(1, 32 // max(1, a.bytes))  # one MMA instruction's K: 32 bytes of operand
    if not a.is_fp8:
        return ACC_SAFETY * 2.0 ** -23 * math.ceil(K / k) * R
    if fast_accum:
        return ACC_SAFETY * U_FP8_MMA * math.ceil(K / k) * R
    windows = math.ceil(K / (k * FP8_PROMOTION_INTERVAL))
    return ACC_SAFETY * R * (U_FP8_MMA * FP8_PROMOTION_INTERVAL * math.sqrt(windows) + 2.0 ** -23 * windows)


def fast_accumulation(gemm) -> bool:
    """Whether a kernel of ``gemm`` (any member of its family, or its pinned configuration) may
    accumulate fp8 with an ``FP8FastAccum`` schedule (NOTE [fp8 accumulation]): then the oracle
    grants every call the fast-accumulation bound, as it can't tell which member ran."""
    a = getattr(gemm, "a", None)
    if a is None or not a.is_fp8:
        return False
    family = getattr(gemm, "family", None) or {}
    configs = [s.config for s in family.values()] or [getattr(gemm, "config", None)]
    return any(getattr(c, "fast_accum", False) for c in configs)


# ---- the error-propagation interpretation ------------------------------------------------------

def _abs(x):
    return np.abs(x)


#: op -> bound of the f32 implementation's own error, ``f(args, result) -> float64 array``
#: (absolute). See NOTE [The error bound] for the sources.
F32_ERROR: dict[str, Callable[..., Any]] = {
    "add": lambda a, r: _U * _abs(r), "sub": lambda a, r: _U * _abs(r), "mul": lambda a, r: _U * _abs(r),
    "div": lambda a, r: _U * _abs(r), "sqrt": lambda a, r: _U * _abs(r),
    "multiply_add": lambda a, r: _U * (_abs(a[0] * a[1]) + _abs(r)),  # fused or not
    "neg": lambda a, r: 0.0, "abs": lambda a, r: 0.0, "relu": lambda a, r: 0.0, "maximum": lambda a, r: 0.0,
    "minimum": lambda a, r: 0.0, "where": lambda a, r: 0.0, "first": lambda a, r: 0.0,
    "gt": lambda a, r: 0.0, "ge": lambda a, r: 0.0, "lt": lambda a, r: 0.0, "le": lambda a, r: 0.0,
    "eq": lambda a, r: 0.0, "ne": lambda a, r: 0.0,
    "leaky_relu": lambda a, r: _U * _abs(r),
    "exp": lambda a, r: 4 * _U * _abs(r),  # expf: 2 ulp (an ulp is at most 2u relative)
    "log": lambda a, r: 2 * _U * _abs(r),  # logf: 1 ulp
    "erf": lambda a, r: 4 * _U * _abs(r),  # erff: 2 ulp
    "rsqrt": lambda a, r: 4 * _U * _abs(r),  # rsqrtf: 2 ulp
    "pow": lambda a, r: 32 * _U * _abs(r),  # powf: a few ulp; 16 granted
    "tanh": lambda a, r: 2.0 ** -10 * _abs(r),  # tanh.approx.f32: 2^-10.987 relative
    "sigmoid": lambda a, r: 8 * _U * _abs(r) + 2.0 ** -126,  # 1 / (1 + expf(-x))
    "silu": lambda a, r: 12 * _U * _abs(r) + 2.0 ** -126,  # x * sigmoid(x)
    "hardswish": lambda a, r: 4 * _U * _abs(r),
    # 0.5 x + |x| (0.5 - h), h = 0.5 erfc(|x| / sqrt 2) within 7.2 u (evtc::Gelu, NOTE [GELU
    # without erff] in functors.hpp): 7.5 u |x| + u |r| / 2; granted as for erff's form,
    # 0.5 x (1 + erff(x / sqrt 2)) (2 ulp of a value up to 1 times |x| / 2, plus roundings)
    "gelu": lambda a, r: 8 * _U * (_abs(a[0]) + _abs(r)),
    # 0.5 x (1 + tanh.approx(...)): tanh's 2^-11 absolute times |x| / 2, doubled
    "gelu_tanh": lambda a, r: 2.0 ** -11 * _abs(a[0]) + 8 * _U * (_abs(a[0]) + _abs(r)),
    # 0.5 (1 + erff(x / sqrt 2)) + x phi(x) with expf
    "gelu_grad": lambda a, r: 16 * _U * (1.0 + _abs(a[0])) + 8 * _U * _abs(r),
}

#: unary op -> a bound of |f'| over the reals (|f(x) - f(y)| <= L |x - y|); checked numerically
#: by tests/null/test_oracle.py. Unary ops not listed use the corner rule.
LIPSCHITZ: dict[str, float] = {
    "neg": 1.0, "abs": 1.0, "relu": 1.0, "tanh": 1.0, "sigmoid": 0.25, "erf": 2.0 / math.sqrt(math.pi),
    "gelu": 1.129, "gelu_tanh": 1.13, "gelu_grad": 0.7979, "silu": 1.0999, "hardswish": 1.5,
}


def _propagate(op: str, args: list, errs: list, result) -> Any:
    """Bound on |f(args + errors) - f(args)| for ``op`` (without its own rounding)."""
    if op in LIPSCHITZ:
        return LIPSCHITZ[op] * errs[0]
    if op in ("add", "sub"):
        return errs[0] + errs[1]
    if op == "mul":
        return _abs(args[0]) * errs[1] + _abs(args[1]) * errs[0] + errs[0] * errs[1]
    if op == "multiply_add":
        return _abs(args[0]) * errs[1] + _abs(args[1]) * errs[0] + errs[0] * errs[1] + errs[2]
    if op in ("maximum", "minimum", "first"):
        return np.maximum(errs[0], errs[1]) if op != "first" else errs[0]
    # corners: the op's float64 rule at every combination of arg +- err (only args with errors)
    fn = ops.get(op).numpy
    varying = [i for i, e in enumerate(errs) if np.any(e)]
    worst = 0.0
    for corner in range(1 << len(varying)):
        shifted = list(args)
        for bit, i in enumerate(varying):
            shifted[i] = args[i] + (errs[i] if corner >> bit & 1 else -errs[i])
        with np.errstate(all="ignore"):
            dev = _abs(np.asarray(fn(*shifted), dtype=np.float64) - result)
        worst = np.maximum(worst, np.where(np.isnan(dev), np.inf, dev))
    return worst


def _batched(leaf: Node, value, L: int) -> np.ndarray:
    """A leaf's value with the (L, M, N) axes the interpreter uses (see its module docs)."""
    a = np.asarray(value, dtype=np.float64)
    if isinstance(leaf, (Accumulator, Source, AuxLoad)):
        return a if a.ndim == 3 else a[None]
    if isinstance(leaf, RowBroadcast):
        return a[:, None, :] if a.ndim == 2 else a[None, None, :]
    if isinstance(leaf, ColBroadcast):
        return a[:, :, None] if a.ndim == 2 else a[None, :, None]
    return a.reshape(-1, 1, 1) if a.ndim == 1 else a.reshape(1, 1, 1)


def _reduce_axis(node: Reduction):
    # Reduction.dim: 1 reduces over N (a row reduction), 0 over M, None over both
    return node.axis.numpy_axis


def _compute(node: Compute, args: list, aerr: list) -> tuple[Any, Any]:
    """A compute node's float64 value and the bound of its error, from its arguments' values and
    bounds: the propagated input errors plus the op's own f32 rounding (:data:`F32_ERROR`)."""
    if node.op == "convert":
        r = dtypes.round_to(args[0], node.dtype)
        lo = dtypes.round_to(args[0] - aerr[0], node.dtype)
        hi = dtypes.round_to(args[0] + aerr[0], node.dtype)
        return r, np.maximum(_abs(hi - r), _abs(r - lo))
    if node.op == "glu":  # act(gate) * up over the interleaved column pairs: the two ops' bounds in turn
        act = node.attr("act")
        g, u = (np.broadcast_to(args[0], np.shape(args[0]))[..., k::2] for k in (0, 1))
        eg, eu = (np.broadcast_to(aerr[0], np.shape(args[0]))[..., k::2] for k in (0, 1))
        ra = np.asarray(ops.get(act).numpy(g), dtype=np.float64)
        ea = _propagate(act, [g], [eg], ra) + F32_ERROR[act]([g], ra)
        r = ra * u
        return r, _propagate("mul", [ra, u], [ea, eu], r) + F32_ERROR["mul"]([ra, u], r)
    if node.op not in F32_ERROR:
        raise KeyError(f"op '{node.op}' has no row in evtc.testing.F32_ERROR (the error of its "
                       "f32 implementation): add one")
    r = np.asarray(ops.get(node.op).numpy(*args), dtype=np.float64)
    return r, _propagate(node.op, args, aerr, r) + F32_ERROR[node.op](args, r)


def _reduce(node: Reduction, v: np.ndarray, e: np.ndarray, mn: tuple[int, ...]) -> tuple[Any, Any]:
    """A reduction's float64 result (before its rounding) and its bound, from its (L, M, N) value
    ``v`` and bound ``e`` (NOTE [The error bound]: a sum adds the probabilistic rounding bound, a
    max or min nothing)."""
    axis = _reduce_axis(node)
    if node.op is ReduceOp.SUM:
        n = math.prod(mn[a] for a in (axis if isinstance(axis, tuple) else (axis,)))
        total = np.sum(v, axis=axis)
        norm2 = np.sqrt(np.square(v).sum(axis=axis))
        return total, e.sum(axis=axis) + LAMBDA * _U * math.sqrt(n) * (_abs(total) + 4 * norm2)
    total = (np.max if node.op is ReduceOp.MAX else np.min)(v, axis=axis)
    return total, e.max(axis=axis)


def reference_and_bounds(graph: Graph, acc: np.ndarray, acc_error,
                         inputs: Mapping[str, object]) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The float64 reference of every output and, per element, a bound ``E`` on |kernel value -
    exact value| before the output's final rounding (NOTE [The error bound]).

    The reference is the interpreter's (:func:`evtc.ir.interpret.interpret`), computed here on
    the way rather than a second time; tests/null/test_oracle.py checks that the two agree to the
    bit.

    Args:
        graph: the epilogue the kernel runs (``gemm.graph``, after the passes).
        acc: the exact accumulator, (M, N) or (L, M, N), float64.
        acc_error: bound of the kernel accumulator's error (:func:`accumulator_error`), an array
            broadcastable to ``acc`` or a number.
        inputs: the epilogue's other inputs by name, as for :func:`interpret`.

    Returns:
        (reference, bounds): output name -> float64 array with L leading ((L, M, N), (L, M),
        (L, N) or (L,)), the reference rounded to the output's dtype, the bound inf where it is
        not finite (an input interval crosses a pole).

    Raises:
        KeyError: an input the outputs need is missing, or an op has no row in
            :data:`F32_ERROR` (add one: its f32 implementation's error).
    """
    if any(getattr(o, "kind", "") == "group_scale" for o in graph.outputs):
        from evtc.errors import ArgumentError

        raise ArgumentError("the float64 oracle has no error bound for evtc.quantize's outputs (one ulp of "
                            "f32 can move a group's scale and every element by an fp8 step)", epilogue=graph.name,
                            hint="check them bitwise: store y in f32 beside them and compare with "
                                 "evtc.testing.quant.quantize_per_token_group(y) (tests/gpu/test_quantize_gpu.py)")
    acc = np.asarray(acc, dtype=np.float64)
    L = acc.shape[0] if acc.ndim == 3 else 1
    mn = (L,) + acc.shape[-2:]
    vals: dict[int, Any] = {}
    errs: dict[int, Any] = {}
    left = {k: len(v) for k, v in graph.users.items()}  # users not yet evaluated: free values early
    ref: dict[str, np.ndarray] = {}
    out: dict[str, np.ndarray] = {}
    with np.errstate(all="ignore"):
        for node in graph.nodes:
            if isinstance(node, Accumulator):
                vals[id(node)] = _batched(node, acc, L)
                errs[id(node)] = np.broadcast_to(np.asarray(acc_error, dtype=np.float64), acc.shape).reshape(mn)
            elif isinstance(node, (Source, AuxLoad, RowBroadcast, ColBroadcast, ScalarBroadcast)):
                if node.name not in inputs:
                    raise KeyError(f"the reference needs input '{node.name}'")
                vals[id(node)] = dtypes.round_to(_batched(node, inputs[node.name], L), node.dtype)
                errs[id(node)] = 0.0
            elif isinstance(node, Immediate):
                vals[id(node)] = np.float64(node.value)
                errs[id(node)] = abs(float(np.float32(node.value)) - node.value)  # emitted as f32
            elif isinstance(node, Compute):
                vals[id(node)], errs[id(node)] = _compute(node, [vals[id(a)] for a in node.args],
                                                          [errs[id(a)] for a in node.args])
            elif isinstance(node, Store):
                smn = mn[:2] + (node.columns(mn[2]),)  # (L, M, N), or N / 2 columns for evtc.glu's
                ref[node.name] = dtypes.round_to(np.array(np.broadcast_to(vals[id(node.value)], smn)), node.dtype)
                out[node.name] = np.array(np.broadcast_to(errs[id(node.value)], smn))
            elif isinstance(node, Reduction):
                total, out[node.name] = _reduce(node, np.broadcast_to(vals[id(node.value)], mn),
                                                np.broadcast_to(errs[id(node.value)], mn), mn)
                ref[node.name] = dtypes.round_to(total, node.dtype)
            else:  # pragma: no cover - every node kind is handled above
                raise TypeError(type(node).__name__)
            for i in node.inputs:  # drop values no later node needs
                left[id(i)] -= 1
                if left[id(i)] == 0:
                    vals.pop(id(i), None)
                    errs.pop(id(i), None)
    return ref, out


# ---- comparing one output --------------------------------------------------------------------------

@dataclasses.dataclass(frozen=True)
class OutputCheck:
    """The result of comparing one output with its reference (NOTE [The error bound]).

    Attributes:
        name: the output's name.
        dtype: its dtype (the ulps are this dtype's).
        total: number of elements compared.
        bad: number of elements outside their bound (NaN, unwritten and wrong ones).
        nan: how many of those are NaN (unwritten elements stay NaN-poisoned).
        padding_written: elements of the row padding after the last column that the kernel
            overwrote (a write past the ragged edge); each counts as bad.
        excess: the worst ``|got - expected| / allowed`` (<= 1 passes; inf for NaN).
        max_ulps: the largest ``|got - expected|`` in ulps of ``dtype`` at ``expected``.
        index: index of the worst element in the output's shape (None when there is none).
        got, expected: the worst element's values.
        ulps: the worst element's error in ulps of ``dtype`` at ``expected``.
        allowed_ulps: its bound, ``ULPS`` plus its propagated ``E``, in the same ulps.
        rel_err: ``||got - expected|| / ||expected||`` over the finite elements (informational).
        error: the worst element's ``|got - expected|``.
        allowed: its bound, ``ULPS * (ulp(expected) + ulp(v)) / 2 + E`` (``error <= allowed``
            passes).
    """

    name: str
    dtype: DType
    total: int
    bad: int
    nan: int
    padding_written: int
    excess: float
    max_ulps: float
    index: tuple[int, ...] | None
    got: float
    expected: float
    ulps: float
    allowed_ulps: float
    rel_err: float
    error: float = math.nan
    allowed: float = math.nan

    @property
    def ok(self) -> bool:
        return self.bad == 0 and self.padding_written == 0

    def __iter__(self) -> Iterator[float]:
        """``(excess, 1.0)``: so callers written for the old ``(error, bound)`` pairs keep working
        (``err <= tol`` is ``ok`` up to the padding check)."""
        return iter((self.excess if self.padding_written == 0 else math.inf, 1.0))

    def describe(self) -> str:
        """One line: the verdict and the worst element."""
        head = f"{self.name} ({self.dtype.name}): "
        if self.index is None:
            return head + "no elements"
        where = f"worst at {self.index}: got {self.got!r}, expected {self.expected!r}, " \
                f"{self.ulps:.3g} ulps (allowed {self.allowed_ulps:.3g})"
        pad = f", {self.padding_written} padding elements written past the last column" if self.padding_written else ""
        if self.ok:
            return head + f"ok, {self.total} elements, max {self.max_ulps:.3g} ulps; {where}"
        nan = f" ({self.nan} NaN: unwritten or invalid)" if self.nan else ""
        return head + f"FAILED, {self.bad} of {self.total} elements outside the bound{nan}{pad}; {where}"

    def summary(self) -> str:
        """One line for a report (``evtc run``, ``evtc demo``): the verdict, and the worst element
        (the largest ``error / allowed``) with its error and its allowed bound, absolute and in
        ulps of the output dtype at the expected value."""
        if self.ok:
            verdict = "ok"
        else:
            why = [f"{self.nan} NaN"] if self.nan else []
            why += [f"{self.padding_written} written past the last column"] if self.padding_written else []
            verdict = (f"FAILED: {self.bad} of {self.total} elements outside their bound"
                       + (f" ({', '.join(why)})" if why else ""))
        if self.index is None:
            return f"{self.name}: {verdict}, no elements"
        return (f"{self.name}: {verdict}; worst element {self.index}: error {self.error:.2e} "
                f"({self.ulps:.3g} ulps of {self.dtype.name}), allowed {self.allowed:.2e} ({self.allowed_ulps:.3g} ulps)")

    def to_json(self) -> dict:
        """The fields of ``EVTC_ERROR_REPORT``'s entries."""
        return {"output": self.name, "dtype": self.dtype.name, "ok": self.ok, "elements": self.total,
                "bad": self.bad, "nan": self.nan, "padding_written": self.padding_written,
                "excess": _json_float(self.excess), "max_ulps": _json_float(self.max_ulps),
                "rel_err": _json_float(self.rel_err),
                "worst": None if self.index is None else {
                    "index": list(self.index), "got": _json_float(self.got), "expected": _json_float(self.expected),
                    "ulps": _json_float(self.ulps), "allowed_ulps": _json_float(self.allowed_ulps),
                    "error": _json_float(self.error), "allowed": _json_float(self.allowed)}}


def _json_float(x: float):
    x = float(x)
    return x if math.isfinite(x) else str(x)


def compare(name: str, got, expected, dtype: DType, bound=0.0, *, padding=None) -> OutputCheck:
    """Compare one output with its reference, element by element.

    Args:
        name: the output's name (for the report).
        got: the kernel's output (any array-like; float64 after conversion).
        expected: the reference rounded to ``dtype``, of ``got``'s size (reshaped to its shape).
        dtype: the output dtype.
        bound: ``E``, the propagated bound before the final rounding (:func:`reference_and_bounds`),
            broadcastable to ``expected``; 0 for an exact comparison up to the roundings.
        padding: the output's row padding after the last column, which must still be NaN.

    Returns:
        An :class:`OutputCheck` (``.ok``, ``.describe()``).
    """
    got = np.atleast_1d(np.asarray(got, dtype=np.float64))  # a scalar reduction: one element
    exp = np.asarray(expected, dtype=np.float64)
    if exp.size != got.size:
        raise ValueError(f"output '{name}': the kernel's has shape {got.shape}, the reference's {exp.shape}")
    exp = exp.reshape(got.shape)
    E = np.asarray(bound, dtype=np.float64)
    E = np.broadcast_to(E if E.ndim == 0 else E.reshape(got.shape), got.shape)
    pad = 0 if padding is None else int(np.count_nonzero(~np.isnan(np.asarray(padding, dtype=np.float64))))
    if got.size == 0:
        return OutputCheck(name, dtype, 0, 0, 0, pad, 0.0, 0.0, None, math.nan, math.nan, 0.0, 0.0, 0.0)
    u_exp = ulp(exp, dtype)
    with np.errstate(all="ignore"):
        diff = np.abs(got - exp)
        # the kernel's rounding moved its value by at most half the ulp of that value, whose
        # magnitude is at most |expected| + u_exp / 2 + E (and which rounded to got)
        u_got = np.minimum(ulp(got, dtype), ulp(np.abs(exp) + 0.5 * u_exp + E, dtype))
        allowed = ULPS * 0.5 * (u_exp + u_got) + E
        excess = diff / allowed
        # equal infinities pass; NaN anywhere, an infinity the reference lacks, a bound that is
        # not finite: inf
        excess[np.isnan(excess) | ~np.isfinite(allowed)] = np.inf
        excess[np.isinf(got) & (got == exp)] = 0.0
        ulps = diff / u_exp
    finite = np.isfinite(got) & np.isfinite(exp)
    den = float(np.linalg.norm(exp[finite]))
    rel = float(np.linalg.norm(got[finite] - exp[finite]) / (den if den > 0 else 1.0)) if finite.all() else math.inf
    idx = np.unravel_index(int(np.argmax(excess)), got.shape)
    return OutputCheck(
        name=name, dtype=dtype, total=int(got.size), bad=int(np.count_nonzero(~(excess <= 1.0))),
        nan=int(np.count_nonzero(np.isnan(got))), padding_written=pad, excess=float(excess[idx]),
        max_ulps=float(np.max(np.where(finite, ulps, np.inf))), index=tuple(int(i) for i in idx),
        got=float(got[idx]), expected=float(exp[idx]), ulps=float(ulps[idx]),
        allowed_ulps=float(np.divide(allowed[idx], u_exp[idx])) if np.isfinite(u_exp[idx]) else math.inf,
        rel_err=rel, error=float(diff[idx]), allowed=float(allowed[idx]),
    )


def verify(graph: Graph, outputs: Mapping[str, Any], acc: np.ndarray, acc_error, inputs: Mapping[str, object],
           *, padding: Mapping[str, Any] | None = None) -> dict[str, OutputCheck]:
    """Check every output of ``graph`` (host arrays) against the reference.

    Args:
        graph: the epilogue the kernel runs.
        outputs: output name -> the kernel's values (numpy), of the shapes ``Gemm.__call__``
            returns ((M, N) or (L, M, N), reductions without L when unbatched).
        acc: the exact accumulator ``A @ B^T`` in float64, (M, N) or (L, M, N).
        acc_error: the accumulator's error bound (:func:`accumulator_error`).
        inputs: the epilogue's other inputs by name (numpy arrays or numbers).
        padding: output name -> the row padding after its last column (must be NaN).

    Returns:
        Output name -> :class:`OutputCheck`, in the graph's output order.

    Raises:
        ValueError: an output's shape does not match its reference's.
    """
    ref, bounds = reference_and_bounds(graph, acc, acc_error, inputs)
    padding = padding or {}
    return {o.name: compare(o.name, outputs[o.name], ref[o.name], o.dtype, bounds[o.name],
                            padding=padding.get(o.name)) for o in graph.outputs}


def failure_report(results: Mapping[str, OutputCheck], what: str = "", graph: Graph | None = None) -> str:
    """A message for a failed check: every output's line, then the epilogue's IR."""
    lines = [what] if what else []
    lines += ["  " + r.describe() for r in results.values()]
    if graph is not None:
        lines.append(str(graph))
    return "\n".join(lines)


def to_numpy(x) -> np.ndarray:
    """A torch tensor (any device, fp8 included), number or array as a float64 numpy array."""
    if isinstance(x, (int, float)):
        return np.float64(x)
    return x.detach().to(device="cpu").double().numpy() if hasattr(x, "detach") else np.asarray(x, dtype=np.float64)


def _exact_accumulator(A, B):
    """(acc, sum_k a^2 b^2) in float64, on A's device (float64 on the GPU: the same numbers,
    much sooner)."""
    if hasattr(A, "is_cuda"):
        A64, B64 = A.double(), B.double()
        acc = A64 @ B64.transpose(-1, -2)
        sq = (A64 * A64) @ (B64 * B64).transpose(-1, -2)
        return to_numpy(acc), to_numpy(sq)
    A64, B64 = to_numpy(A), to_numpy(B)
    return A64 @ np.swapaxes(B64, -1, -2), (A64 * A64) @ np.swapaxes(B64 * B64, -1, -2)


def reference(graph: Graph, inputs: dict[str, Any]) -> dict[str, np.ndarray]:
    """Float64 reference outputs for ``inputs`` (the interpreter on ``A @ B.T`` in float64),
    rounded to the output dtypes."""
    acc, _ = _exact_accumulator(inputs["A"], inputs["B"])
    vals = {k: to_numpy(v) for k, v in inputs.items() if k not in ("A", "B")}
    return interpret(graph, acc, vals)


def tolerance(dtype: DType) -> float:
    """The old norm-wide bound ``4 * eps + 1e-4`` for :func:`relative_error` (25 % for e4m3):
    kept for the GPU tests that still compare norms; check elementwise with
    :func:`check_outputs` or :func:`compare` instead (NOTE [The error bound])."""
    return 4 * dtype.eps + 1e-4


def relative_error(out: np.ndarray, ref: np.ndarray) -> float:
    """||out - ref|| / ||ref|| (informational: a norm hides single wrong elements; the oracle is
    :func:`compare`). inf/NaN anywhere in out gives inf."""
    out = np.asarray(out, dtype=np.float64)
    ref = np.asarray(ref, dtype=np.float64).reshape(out.shape)
    if not np.all(np.isfinite(out)):
        return float("inf")
    den = np.linalg.norm(ref)
    return float(np.linalg.norm(out - ref) / (den if den > 0 else 1.0))
