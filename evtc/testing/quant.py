"""Reference quantizers and typed scale layouts: per-token-group 8-bit quantization as the
serving stacks and DeepGEMM compute it, and OCP MX block scaling, bit for bit, on the CPU.

Input: an f32 (or 16-bit) tensor of shape (M, N), a group along N, an element dtype, a
convention. Output: the quantized tensor (M, N) and its scales (M, ceil(N / group)), f32 or
e8m0, in a :class:`ScaleLayout`. A fused epilogue that quantizes its output is correct when its
data and scales are *bitwise* equal to these on the same f32 values.

# NOTE [Per-token-group quantization conventions]
The libraries agree on the idea (one scale per 1 x G group of a row, scale = amax / max of the
element type) and disagree in the bits: which reciprocal is rounded, the epsilon, whether the
quotient is clamped before the cast. Each convention here does the f32 operations of its source
in its order (every operation correctly rounded, as torch does them on the CPU):

* ``"vllm"``: vLLM's ``_per_token_group_quant_fp8`` (vllm/model_executor/layers/quantization/
  utils/fp8_utils.py, 2025): ``amax = max(max|y|, eps)`` (eps 1e-10), ``scale = amax * (1 /
  fp8_max)``, with ``ue8m0`` ``scale = 2^ceil(log2(scale))``, ``q = clamp(y / scale, -max, max)``.
* ``"sglang"``: SGLang's ``_per_token_group_quant_8bit`` (python/sglang/srt/layers/quantization/
  fp8_kernel.py): ``scale = amax / max``, ``q = clamp(y * (1 / scale), -max, max)``; eps 1e-10.
* ``"deepgemm"``: DeepGEMM's ``per_token_cast_to_fp8`` (its tests' and benchmarks' reference):
  ``amax = max(max|y|, 1e-4)``, ``q = y * (448 / amax)`` cast without a clamp, ``scale = amax /
  448``. (No ``ue8m0`` form here: only vLLM's is written down above.)

The cast to fp8 rounds to nearest even (torch's ``Float8_e4m3fn`` conversion, which also takes
DeepGEMM's unclamped quotients just above 448 back to 448: only values from 464 up become NaN).
NaN in a group: ``amax`` is NaN (torch's ``amax`` and ``maximum`` propagate it), so are the
scale and every element of the group; inf: the scale is inf, finite elements quantize to 0 and
infinite ones to NaN (inf / inf). That is torch's semantics, so DeepGEMM's reference (torch code)
gives it; vLLM's and SGLang's Triton reductions need not propagate NaN, so for groups holding NaN
or inf these define the result rather than reproduce those kernels.

# NOTE [MX scales]
OCP Microscaling Formats v1.0 (2023), section 6.3: a block of k = 32 elements shares the scale
``X = 2^(floor(log2(amax)) - emax_elem)`` (emax_elem: the element type's largest normal exponent,
8 for E4M3, 15 for E5M2), stored as E8M0 (a biased exponent, 127 = 2^0, 255 = NaN) and clamped to its range
[2^-127, 2^127]; ``P_i = cast(V_i / X)`` with results beyond the largest normal clamped to it.
``rounding="floor"`` is that rule; ``rounding="ceil"`` is the one NVIDIA's libraries and vLLM's
``ue8m0`` use (``X = 2^ceil(log2(amax / max_elem))``: the quotient never needs the clamp).
amax = 0 gives the smallest scale, 2^-127, and zero elements; a NaN or inf amax gives the NaN
scale (E8M0 255) and NaN elements.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from typing import Any

import numpy as np

from evtc.errors import ArgumentError

__all__ = ["ELEMENT_MAX", "MX_EMAX", "ScaleLayout", "allocate_scales", "check_scales", "e8m0_decode",
           "e8m0_encode", "quantize_mx", "quantize_per_token_group"]

#: the largest finite value of each element dtype (OCP 8-bit Floating Point v1.0: e4m3 448, e5m2 57344)
ELEMENT_MAX = {"e4m3": 448.0, "e5m2": 57344.0}
#: emax_elem of OCP MX v1.0, table 1 (the largest normal's exponent)
MX_EMAX = {"e4m3": 8, "e5m2": 15}
CONVENTIONS = ("vllm", "sglang", "deepgemm")
EPS = {"vllm": 1e-10, "sglang": 1e-10, "deepgemm": 1e-4}


class ScaleLayout(enum.Enum):
    """How a (M, G) grid of scales (G = ceil(N / group)) lies in memory; part of a quantized
    output's type.

    * ``ROW_MAJOR``: (M, G) contiguous: vLLM's and SGLang's default.
    * ``COL_MAJOR_TMA``: column-major with M padded to a multiple of 4 (16 bytes of f32): the
      (M, G) view of a (G, ceil4(M)) tensor, strides (1, ceil4(M)); what DeepGEMM's sm90 kernels
      read through TMA (``get_mn_major_tma_aligned_tensor`` / ``get_tma_aligned_size``).
    * ``MX_SM100_SWIZZLED``: Blackwell's block-scaled MMA layout (128 x 4 tiles of e8m0 scales,
      interleaved 32 x 16 bytes; CUTLASS ``Sm1xxBlockScaledConfig``), on paper only: sm90 has no
      block-scaled MMA, so evtc neither writes nor reads it yet.
    """

    ROW_MAJOR = "row_major"
    COL_MAJOR_TMA = "col_major_tma"
    MX_SM100_SWIZZLED = "mx_sm100_swizzled"


def _torch():
    import torch

    return torch


def _dtype(name: str):
    torch = _torch()
    table = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
    if name not in table:
        raise ArgumentError(f"dtype '{name}': the quantizers take {', '.join(table)}")
    return table[name]


def _groups(x, group: int):
    """x (M, N) as (M, G, group) f32, the last group padded with zeros (they never raise amax,
    and their quotients are dropped), and G."""
    torch = _torch()
    if isinstance(group, bool) or not isinstance(group, (int, np.integer)) or group <= 0:
        raise ArgumentError(f"group = {group!r}: a positive number of elements", hint="pass an integer, e.g. group=128")
    if x.dim() != 2:
        raise ArgumentError(f"x of shape {tuple(x.shape)}: an (M, N) tensor is expected")
    if x.is_complex():
        raise ArgumentError(f"x is {x.dtype}: the quantizers take real numbers", hint="pass x.real or x.abs()")
    M, N = x.shape
    group = min(int(group), max(N, 1))  # a group wider than a row is the row (the same bits)
    G = -(-N // group)
    pad = G * group - N
    xf = x.float()
    if pad:
        xf = torch.cat([xf, xf.new_zeros(M, pad)], dim=1)
    return xf.reshape(M, G, group), G


def _cast(q, dtype: str):
    return q.to(_dtype(dtype))


def _ue8m0(scale):
    """2^ceil(log2(scale)), in f32 (vLLM's ``exp2(ceil(log2(s)))``)."""
    torch = _torch()
    return torch.exp2(torch.ceil(torch.log2(scale)))


def _amax(g):
    """Per-group max |y| that propagates NaN (torch.amax does)."""
    return g.abs().amax(dim=2)


def quantize_per_token_group(x: Any, group: int = 128, dtype: str = "e4m3", *, convention: str = "vllm",
                             ue8m0: bool = False, eps: float | None = None) -> tuple[Any, Any]:
    """Per-token-group quantization of ``x`` (NOTE [Per-token-group quantization conventions]).

    Args:
        x: (M, N) torch tensor (f32, bf16 or f16; the arithmetic is f32).
        group: G, elements per group along N (32, 64, 128); a last, partial group is allowed.
        dtype: ``"e4m3"`` or ``"e5m2"``.
        convention: ``"vllm"``, ``"sglang"`` or ``"deepgemm"``.
        ue8m0: round each scale up to a power of two (vLLM's ``use_ue8m0``; vllm only).
        eps: the floor of amax (default: the convention's).

    Returns:
        ``(q, scales)``: q (M, N) of ``dtype``; scales (M, ceil(N / group)) f32, row-major.

    Raises:
        ArgumentError: an unknown convention or dtype, ``ue8m0`` outside vllm, a group <= 0, or
            x not 2-D.
    """
    torch = _torch()
    if convention not in CONVENTIONS:
        raise ArgumentError(f"convention '{convention}': one of {', '.join(CONVENTIONS)}")
    if ue8m0 and convention != "vllm":
        raise ArgumentError(f"ue8m0=True with convention '{convention}': only vLLM's power-of-two scales are "
                            "written down here", hint="use convention='vllm', or quantize_mx(rounding='ceil')")
    _dtype(dtype)
    dev = x.device  # the constants beside x: the reference runs on the CPU or the GPU alike
    qmax = torch.tensor(ELEMENT_MAX[dtype], dtype=torch.float32, device=dev)
    eps_t = torch.tensor(EPS[convention] if eps is None else eps, dtype=torch.float32, device=dev)
    g, G = _groups(x, group)
    M, N = x.shape
    amax = torch.maximum(_amax(g), eps_t)  # NaN propagates through torch.maximum
    one = torch.tensor(1.0, dtype=torch.float32, device=dev)
    if convention == "vllm":
        scale = amax * (one / qmax)
        if ue8m0:
            scale = _ue8m0(scale)
        q = torch.clamp(g / scale[..., None], -qmax, qmax)
    elif convention == "sglang":
        scale = amax / qmax
        q = torch.clamp(g * (one / scale)[..., None], -qmax, qmax)
    else:  # deepgemm
        q = g * (qmax / amax)[..., None]
        scale = amax / qmax
    q = _cast(q.reshape(M, G * g.shape[2])[:, :N], dtype)
    return q, scale.reshape(M, G)


def e8m0_encode(scale: Any) -> Any:
    """Power-of-two f32 scales -> E8M0 bytes (uint8: the biased exponent, 255 for NaN).

    Raises:
        ArgumentError: a finite scale that is not a power of two in [2^-127, 2^127].
    """
    torch = _torch()
    s = scale.float()
    nan = ~torch.isfinite(s)
    e = torch.log2(torch.where(nan, torch.ones_like(s), s))
    if not torch.equal(e, torch.round(e)) or bool(((e < -127) | (e > 127)).any()):
        raise ArgumentError("e8m0_encode: every finite scale must be a power of two in [2^-127, 2^127]")
    return torch.where(nan, torch.full_like(e, 255), e + 127).to(torch.uint8)


def e8m0_decode(code: Any) -> Any:
    """E8M0 bytes -> f32 scales (255 -> NaN; 0 -> 2^-127, a subnormal f32)."""
    torch = _torch()
    c = code.to(torch.int32)
    out = torch.exp2((c - 127).float())
    return torch.where(c == 255, torch.full_like(out, float("nan")), out)


def quantize_mx(x: Any, dtype: str = "e4m3", *, block: int = 32, rounding: str = "floor") -> tuple[Any, Any]:
    """OCP MX block quantization of the rows of ``x`` (NOTE [MX scales]).

    Args:
        x: (M, N) torch tensor.
        dtype: the element type, ``"e4m3"`` or ``"e5m2"``.
        block: k, elements per block along N (32 in the spec); a last, partial block is allowed.
        rounding: ``"floor"`` (the spec's ``floor(log2(amax)) - emax_elem``) or ``"ceil"``
            (``ceil(log2(amax / max_elem))``: NVIDIA's and vLLM's ue8m0).

    Returns:
        ``(q, scales)``: q (M, N) of ``dtype``; scales (M, ceil(N / block)) E8M0 codes (uint8).

    Raises:
        ArgumentError: an unknown dtype or rounding, a block <= 0, or x not 2-D.
    """
    torch = _torch()
    if rounding not in ("floor", "ceil"):
        raise ArgumentError(f"rounding '{rounding}': 'floor' (OCP MX v1.0) or 'ceil'")
    _dtype(dtype)
    g, G = _groups(x, block)
    M, N = x.shape
    amax = _amax(g)
    qmax = torch.tensor(ELEMENT_MAX[dtype], dtype=torch.float32)
    bad = ~torch.isfinite(amax)
    safe = torch.where(bad | (amax == 0), torch.ones_like(amax), amax)
    if rounding == "floor":
        e = torch.floor(torch.log2(safe)) - MX_EMAX[dtype]
    else:
        e = torch.ceil(torch.log2(safe / qmax))
    e = torch.where(amax == 0, torch.full_like(e, -127.0), e).clamp(-127, 127)
    scale = torch.exp2(e)
    q = torch.clamp(g / scale[..., None], -qmax, qmax)
    q = torch.where(bad[..., None], torch.full_like(q, float("nan")), q)
    q = _cast(q.reshape(M, G * g.shape[2])[:, :N], dtype)
    code = torch.where(bad, torch.full_like(e, 255), e + 127).to(torch.uint8)
    return q, code.reshape(M, G)


@dataclasses.dataclass(frozen=True)
class _Expected:
    shape: tuple[int, int]
    strides: tuple[int, int]
    storage_rows: int


def _expected(layout: ScaleLayout, M: int, G: int) -> _Expected:
    if layout is ScaleLayout.ROW_MAJOR:
        return _Expected((M, G), (G, 1) if G > 1 else (1, 1), M)
    if layout is ScaleLayout.COL_MAJOR_TMA:
        m4 = -(-M // 4) * 4
        return _Expected((M, G), (1, m4), m4)
    raise ArgumentError(f"scale layout {layout.value}: Blackwell's block-scaled layout is not written or read "
                        "on sm90", hint="use ScaleLayout.ROW_MAJOR or ScaleLayout.COL_MAJOR_TMA")


def allocate_scales(M: int, N: int, group: int, layout: ScaleLayout, *, dtype: str = "f32", device="cpu") -> Any:
    """An (M, ceil(N / group)) tensor of scales in ``layout`` (f32, or ``"e8m0"`` bytes).

    Raises:
        ArgumentError: the sm100 layout, or a non-positive extent.
    """
    torch = _torch()
    if M < 0 or N <= 0 or group <= 0:
        raise ArgumentError(f"allocate_scales: M = {M}, N = {N}, group = {group}")
    G = -(-N // group)
    want = _expected(layout, M, G)
    tdt = torch.float32 if dtype == "f32" else torch.uint8
    if layout is ScaleLayout.ROW_MAJOR:
        return torch.empty((M, G), dtype=tdt, device=device)
    return torch.empty((G, want.storage_rows), dtype=tdt, device=device).t()[:M]


def _layout_of(t, M: int, G: int) -> str:
    """The layout ``t``'s strides say it has (for the error message)."""
    s = tuple(t.stride())
    for layout in (ScaleLayout.ROW_MAJOR, ScaleLayout.COL_MAJOR_TMA):
        if s == _expected(layout, M, G).strides or (G == 1 and layout is ScaleLayout.ROW_MAJOR and s[0] == 1):
            return layout.value
    if s[0] == 1:
        return f"column-major with a column stride of {s[1]} (not {-(-M // 4) * 4}: M padded to 4)"
    return f"strides {s}"


def check_scales(t: Any, layout: ScaleLayout, M: int, N: int, group: int, *, dtype: str = "f32",
                 name: str = "scales") -> None:
    """Check a caller's scale tensor (``out=``) against the type a quantized output declares.

    Raises:
        ArgumentError: a wrong shape, dtype or layout, naming the one expected and the one given.
    """
    torch = _torch()
    G = -(-N // group)
    want = _expected(layout, M, G)
    tdt = torch.float32 if dtype == "f32" else torch.uint8
    if tuple(t.shape) != want.shape:
        raise ArgumentError(f"{name} has shape {tuple(t.shape)}; a {layout.value} grid of scales for M = {M}, "
                            f"N = {N}, groups of {group} is {want.shape}")
    if t.dtype != tdt:
        raise ArgumentError(f"{name} is {str(t.dtype).replace('torch.', '')}; {layout.value} {dtype} scales are "
                            f"{str(tdt).replace('torch.', '')}")
    s = tuple(t.stride())
    ok = s == want.strides or (M <= 1 and s[1] == want.strides[1]) or (G == 1 and s[0] == want.strides[0])
    if not ok:
        raise ArgumentError(f"{name} is laid out as {_layout_of(t, M, G)}, but the output's scale layout is "
                            f"{layout.value} (strides {want.strides})",
                            hint="allocate it with evtc.testing.quant.allocate_scales(M, N, group, layout)")


def groups_for(N: int, group: int) -> int:
    """ceil(N / group): the scale columns of a row."""
    return math.ceil(N / group)
