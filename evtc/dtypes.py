"""Element types evtc knows, with their CUTLASS, numpy, torch and DLPack names.

A :class:`DType` is a small frozen record; the instances below are the whole set. Sizes are in
bits. ``max`` is the largest finite value (used for saturating conversions, e.g. to fp8 e4m3,
whose range is +-448 per the OCP FP8 spec that ``cutlass::float_e4m3_t`` implements).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from evtc.errors import UnknownDTypeError


@dataclasses.dataclass(frozen=True, slots=True)
class DType:
    """An element type.

    Attributes:
        name: evtc's short name, used in the IR text (``f32``, ``bf16``, ``e4m3``...).
        bits: size of one element in bits.
        cutlass: the CUTLASS C++ type (``cutlass::bfloat16_t``).
        torch: the attribute name in ``torch`` (``bfloat16``); None if torch has none.
        dlpack: (type code, bits) in DLPack's ``DLDataType``.
        max: largest finite value.
        mantissa_bits: explicit mantissa bits; sets the relative error bound of a rounding.
    """

    name: str
    bits: int
    cutlass: str
    torch: str | None
    dlpack: tuple[int, int]
    max: float
    mantissa_bits: int

    @property
    def bytes(self) -> int:
        """Size of one element in bytes (fp8 is 1)."""
        return self.bits // 8

    @property
    def is_fp8(self) -> bool:
        return self.bits == 8

    @property
    def eps(self) -> float:
        """Unit roundoff of a round-to-nearest conversion into this type (2^-(mantissa+1))."""
        return 2.0 ** -(self.mantissa_bits + 1)

    def __repr__(self) -> str:
        return f"evtc.{self.name}"

    def __str__(self) -> str:
        return self.name

    # So that `evtc.Scalar[f32]` and friends read naturally and dtypes can key dicts.
    def __reduce__(self):
        return (by_name, (self.name,))


# DLPack type codes (dlpack.h): kDLFloat = 2, kDLBfloat = 4, kDLFloat8_e4m3fn = 10,
# kDLFloat8_e5m2 = 12.
f32 = DType("f32", 32, "float", "float32", (2, 32), float(np.finfo(np.float32).max), 23)
f16 = DType("f16", 16, "cutlass::half_t", "float16", (2, 16), 65504.0, 10)
bf16 = DType("bf16", 16, "cutlass::bfloat16_t", "bfloat16", (4, 16), 3.3895313892515355e38, 7)
e4m3 = DType("e4m3", 8, "cutlass::float_e4m3_t", "float8_e4m3fn", (10, 8), 448.0, 3)
e5m2 = DType("e5m2", 8, "cutlass::float_e5m2_t", "float8_e5m2", (12, 8), 57344.0, 2)

ALL: tuple[DType, ...] = (f32, f16, bf16, e4m3, e5m2)
_BY_NAME = {d.name: d for d in ALL}
_KNOWN_HINT = f"use one of {', '.join(_BY_NAME)}"
# Friendly aliases accepted wherever a dtype name is parsed (CLI, grammar, Gemm(a="bf16")).
_ALIASES = {
    "float32": f32, "float": f32, "fp32": f32,
    "float16": f16, "half": f16, "fp16": f16,
    "bfloat16": bf16,
    "float8_e4m3fn": e4m3, "fp8": e4m3, "fp8_e4m3": e4m3,
    "float8_e5m2": e5m2, "fp8_e5m2": e5m2,
}

#: dtypes A and B may have (per operand), by arch.
MAINLOOP_DTYPES = {"sm90": (f16, bf16, e4m3), "sm80": (f16, bf16)}
#: dtypes of C, D and M x N aux tensors.
TENSOR_DTYPES = (f32, f16, bf16, e4m3, e5m2)


def by_name(name: str) -> DType:
    """Look a dtype up by evtc name or common alias (``"bf16"``, ``"bfloat16"``).

    Raises:
        UnknownDTypeError (an EvtcError and a KeyError): the name is unknown; the message lists
        the known names.
    """
    key = name.strip().lower()
    if key in _BY_NAME:
        return _BY_NAME[key]
    if key in _ALIASES:
        return _ALIASES[key]
    raise UnknownDTypeError(f"unknown dtype '{name}'", hint=_KNOWN_HINT)


def coerce(value: "DType | str", arg: str | None = None) -> DType:
    """Accept a DType, an evtc name, or a torch dtype object (``torch.bfloat16``).

    Args:
        value: the dtype.
        arg: the argument it was given as (``"d"``), which an error then names first
            (``d='int8': unknown dtype 'int8'``): a call with several dtypes says which one.

    Raises:
        UnknownDTypeError: ``value`` names no dtype evtc handles.
    """
    if isinstance(value, DType):
        return value
    try:
        if isinstance(value, str):
            return by_name(value)
        text = str(value)  # torch.bfloat16 -> "torch.bfloat16"
        if text.startswith("torch."):
            return by_name(text[len("torch."):])
        raise UnknownDTypeError(f"can't interpret {value!r:.60} as a dtype", hint=_KNOWN_HINT)
    except UnknownDTypeError as e:
        if arg is not None:
            e.message = f"{arg}={value!r:.60}: {e.message}"
            e.args = (e.message,)
        raise


def from_dlpack(code: int, bits: int) -> DType | None:
    """The dtype for a DLPack (code, bits) pair, or None if evtc doesn't handle it."""
    for d in ALL:
        if d.dlpack == (code, bits):
            return d
    # Older exporters tag fp8 tensors as float8 with codes 7..13; accept the two evtc uses.
    return None


def round_to(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Round float64 values to ``dtype`` (round to nearest even, saturating fp8 to +-max, as
    CUTLASS's ``NumericConverter`` with ``cvt.rn.satfinite`` does), returned as float64.

    Used by the reference interpreter to model every conversion the kernel makes.
    """
    x = np.asarray(x, dtype=np.float64)
    if dtype is f32:
        return x.astype(np.float32).astype(np.float64)
    if dtype is f16:
        return x.astype(np.float16).astype(np.float64)
    if dtype is bf16:
        return _round_bf16(x)
    return _round_mantissa(x, dtype)


def _round_bf16(x: np.ndarray) -> np.ndarray:
    """float64 -> float32 -> bf16 with round-to-nearest-even on the float32 bits (what
    ``__float2bfloat16_rn`` does to the kernel's float32 values), back to float64. Rounding
    through float32 first differs from rounding float64 directly only when the float32 rounding
    lands exactly on a bf16 tie: at most one bf16 ulp, on a vanishing fraction of values."""
    with np.errstate(over="ignore"):  # beyond float32: inf, as the kernel would have it
        f = np.array(x, dtype=np.float32)
    u = f.view(np.uint32)
    r = ((u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) & np.uint32(0xFFFF0000)).view(np.float32)
    return np.where(np.isnan(f), f, r).astype(np.float64)


def _round_mantissa(x: np.ndarray, dtype: DType) -> np.ndarray:
    """Round to a float type with ``dtype.mantissa_bits`` explicit bits and the exponent range
    of bf16/fp8, by scaling to the target's ulp (exact in float64 for these widths)."""
    if dtype is bf16:
        min_normal_exp = -126
    elif dtype is e4m3:
        min_normal_exp = -6
    elif dtype is e5m2:
        min_normal_exp = -14
    else:  # pragma: no cover - every dtype is handled above
        raise AssertionError(dtype)
    out = np.array(x, dtype=np.float64, copy=True)
    finite = np.isfinite(out) & (out != 0)
    v = out[finite]
    exp = np.floor(np.log2(np.abs(v)))
    exp = np.maximum(exp, min_normal_exp)  # subnormals share the smallest normal's ulp
    ulp = np.exp2(exp - dtype.mantissa_bits)
    v = np.round(v / ulp) * ulp  # numpy rounds half to even
    out[finite] = v
    if dtype.is_fp8:
        out = np.clip(out, -dtype.max, dtype.max)  # satfinite; NaN stays NaN
    return out
