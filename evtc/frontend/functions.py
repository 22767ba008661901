"""The ``evtc.*`` functions an epilogue calls: ``evtc.relu``, ``evtc.where``, ``evtc.sum``...

Input: traced values, torch tensors, numpy arrays or Python numbers. Output: a traced value
when any argument is traced; otherwise the function runs eagerly, so an epilogue function called
on real tensors computes the same result the kernel should (the second oracle of the tests).

Eager rules: torch tensors use torch (evtc never imports torch itself; it uses the module the
tensor came from), anything else uses the op's float64 numpy reference. In eager mode a column
vector must be shaped ``(M, 1)`` to broadcast, as usual in torch; reductions follow evtc's axes
(``dim=1`` over N, the last axis; ``dim=0`` over M, the second to last) and accumulate in float32
or wider.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

import numpy as np

from evtc import ops
from evtc.dtypes import DType
from evtc.errors import UnknownFunctionError, UnsupportedOpError
from evtc.frontend.builder import PYTHON, _shown, constant_reduction_error, is_constant, unknown_function_error
from evtc.frontend.trace import Reduced, Value, call, not_elementwise, reduce, user_loc
from evtc.frontend import trace as _trace

__all__ = [
    "relu", "sigmoid", "tanh", "gelu", "gelu_tanh", "gelu_grad", "silu", "hardswish",
    "exp", "log", "sqrt", "rsqrt", "abs", "erf", "pow", "maximum", "minimum", "clamp",
    "leaky_relu", "where", "multiply_add", "sum", "max", "min", "amax", "quantize", "glu",
    "gt", "ge", "lt", "le", "eq", "ne", "to",
]

#: the functions an epilogue calls as ``evtc.<name>`` (what an unknown name's error lists;
#: ``__all__`` is exactly these: ``evtc ops`` and docs/language.md are generated from it)
FUNCTIONS = tuple(__all__)


def unknown_function(name: str) -> UnknownFunctionError:
    """The error for ``evtc.<name>`` when the ``evtc`` module has no such attribute (its
    ``__getattr__`` raises it): located at the line that wrote it, with the close matches among
    the functions and evtc's other public names, and the list of functions (the expression form
    says the same for ``rleu(x)``: :func:`~evtc.frontend.builder.unknown_function_error`)."""
    import evtc

    public = [n for n in dir(evtc) if not n.startswith("_") and n not in FUNCTIONS]
    return unknown_function_error(name, FUNCTIONS, PYTHON, user_loc(), None,  # type: ignore[return-value]
                                  also=[*public, "Gemm", "Conv", "ConvProblem", "GemmConfig", "from_expr", "parse_ir"],
                                  cls=UnknownFunctionError)


def _is_traced(args) -> bool:
    return any(isinstance(a, (Value, Reduced)) for a in args)


def _torch_of(args):
    for a in args:
        mod = type(a).__module__
        if mod.startswith("torch"):
            return sys.modules["torch"]
    return None


#: ``hook``, set in this thread by the torch importer (:mod:`evtc.frontend.torch_import`) while it
#: traces a function: ``hook(name, args)`` records ``evtc.<name>(*args)`` on torch tensors as the
#: evtc op itself (other threads' eager calls are not affected)
TORCH_IMPORT = threading.local()


def _eager_operand(name: str, a: Any, torch) -> Any:
    """``a`` as an eager operand of ``evtc.<name>``: a floating point torch tensor as it is;
    anything else read as a numpy array of real numbers (numbers, nested lists, numpy arrays).

    Raises:
        ArgumentError: a string, object or complex array, a ragged list, a torch integer or
            complex tensor (torch's rules for those differ from the kernel's f32 ones).
    """
    from evtc.errors import ArgumentError

    if torch is not None and isinstance(a, torch.Tensor):
        if not a.dtype.is_floating_point and a.dtype != torch.bool:  # (a bool mask is where's condition)
            raise ArgumentError(f"evtc.{name} of a {a.dtype} tensor: the epilogue computes in floating point",
                                hint="convert it first, e.g. x.float()")
        return a
    if type(a).__module__.startswith("torch"):
        raise ArgumentError(f"evtc.{name} of a {type(a).__name__}: a tensor, an array or a number",
                            hint="pass a torch tensor, a numpy array or a number")
    try:
        with np.errstate(all="ignore"):
            arr = np.asarray(a)
    except (TypeError, ValueError) as e:  # a ragged list, an object numpy can't read
        raise ArgumentError(f"evtc.{name} of {type(a).__name__}: not an array of numbers ({e})",
                            hint="pass a torch tensor, a numpy array, nested lists of numbers or a number") from None
    if arr.dtype.kind not in "biuf":
        raise ArgumentError(f"evtc.{name} of {type(a).__name__} with dtype {arr.dtype}: real numbers",
                            hint="pass a torch tensor, a numpy array, nested lists of numbers or a number")
    return a


def _call(name: str, *args: Any):
    if _is_traced(args):
        return call(name, *args)
    op = ops.get(name)
    torch = _torch_of(args)
    hook = getattr(TORCH_IMPORT, "hook", None)
    if torch is not None and hook is not None:
        return hook(name, args)
    args = tuple(_eager_operand(name, a, torch) for a in args)
    try:
        if torch is not None and op.torch is not None:
            targs = [a if type(a).__module__.startswith("torch") else torch.as_tensor(a) for a in args]
            return op.torch(torch, *targs)
        if torch is not None:
            # No torch rule: go through float64 numpy on the host and come back.
            like = next(a for a in args if type(a).__module__.startswith("torch"))
            host = [a.detach().double().cpu().numpy() if type(a).__module__.startswith("torch") else a for a in args]
            return torch.as_tensor(op.numpy(*[np.asarray(h, dtype=np.float64) for h in host])).to(like.device,
                                                                                                   like.dtype)
        with np.errstate(all="ignore"):
            out = op.numpy(*[np.asarray(a, dtype=np.float64) for a in args])
    except (RuntimeError, ValueError, TypeError) as e:  # shapes that don't broadcast, tensors on two devices
        from evtc.errors import ArgumentError

        shapes = ", ".join(str(tuple(getattr(a, "shape", ()))) for a in args)
        raise ArgumentError(f"evtc.{name} of operands of shapes {shapes}: {str(e).splitlines()[0]}",
                            hint="operands broadcast as in torch (a column as (M, 1)) and live on one device") from None
    if all(is_constant(a) for a in args):  # a constant folded, as math.exp(1000) raises: the fold rule
        from evtc.passes.fold import check_fold

        check_fold(f"evtc.{name}({', '.join(map(_shown, args))})", args, out, loc=user_loc(), epilogue=None)
    return out


# ---- elementwise -------------------------------------------------------------------------------


def relu(x):
    """max(x, 0), NaN-propagating (``cutlass::epilogue::thread::ReLu``)."""
    return _call("relu", x)


def sigmoid(x):
    """1 / (1 + exp(-x))."""
    return _call("sigmoid", x)


def tanh(x):
    """Hyperbolic tangent."""
    return _call("tanh", x)


def gelu(x):
    """x * Phi(x), the exact (erf) form, not the tanh approximation; ``evtc::Gelu`` evaluates it
    within 5.31 u (|x| + |gelu(x)|) of float64 (u = 2^-24, measured over all float32 inputs) without
    calling erff (NOTE [GELU without erff] in codegen_templates/include/evtc/functors.hpp)."""
    return _call("gelu", x)


def gelu_tanh(x):
    """The tanh approximation of gelu (``GELU_taylor``; torch's ``approximate='tanh'``)."""
    return _call("gelu_tanh", x)


def gelu_grad(x):
    """d gelu(x) / dx for the erf form: Phi(x) + x * phi(x)."""
    return _call("gelu_grad", x)


def silu(x):
    """x * sigmoid(x)."""
    return _call("silu", x)


def hardswish(x):
    """x * relu6(x + 3) / 6."""
    return _call("hardswish", x)


def exp(x):
    """e ** x."""
    return _call("exp", x)


def log(x):
    """Natural logarithm."""
    return _call("log", x)


def sqrt(x):
    """Square root."""
    return _call("sqrt", x)


def rsqrt(x):
    """1 / sqrt(x)."""
    return _call("rsqrt", x)


def abs(x):  # noqa: A001 - mirrors torch.abs / numpy.abs
    """Absolute value."""
    return _call("abs", x)


def erf(x):
    """The error function."""
    return _call("erf", x)


def pow(x, exponent: float):  # noqa: A001
    """x ** exponent; the exponent must be a Python number."""
    return _call("pow", x, exponent)


def maximum(a, b):
    """Elementwise maximum."""
    return _call("maximum", a, b)


def minimum(a, b):
    """Elementwise minimum."""
    return _call("minimum", a, b)


def clamp(x, lo, hi):
    """min(max(x, lo), hi); ``lo`` and ``hi`` may be runtime scalars."""
    return minimum(maximum(x, lo), hi)


def leaky_relu(x, slope):
    """x where x > 0 else x * slope; ``slope`` may be a runtime scalar."""
    return _call("leaky_relu", x, slope)


def where(cond, a, b):
    """``a`` where ``cond`` is non-zero, else ``b`` (comparisons give 1.0/0.0 masks)."""
    return _call("where", cond, a, b)


def multiply_add(a, b, c):
    """a * b + c as one fused multiply-add."""
    return _call("multiply_add", a, b, c)


def gt(a, b):
    return _call("gt", a, b)


def ge(a, b):
    return _call("ge", a, b)


def lt(a, b):
    return _call("lt", a, b)


def le(a, b):
    return _call("le", a, b)


def eq(a, b):
    return _call("eq", a, b)


def ne(a, b):
    return _call("ne", a, b)


def to(x, dtype: DType | str):
    """``x.to(dtype)``: round to ``dtype`` (fp8 saturates to its finite range)."""
    if isinstance(x, (Value, Reduced)):
        return x.to(dtype)
    from evtc import dtypes as _dt

    dt = _dt.coerce(dtype, "dtype")
    torch = _torch_of((x,))
    x = _eager_operand("to", x, torch)  # (None was nan, "1.0" was 1.0, 10**400 an OverflowError)
    if torch is not None:
        out = x
        if dt.is_fp8:
            out = out.clamp(-dt.max, dt.max)
        return out.to(getattr(torch, dt.torch)).to(x.dtype)
    return _dt.round_to(np.asarray(x, dtype=np.float64), dt)


# ---- reductions ----------------------------------------------------------------------------------


def _reduce(op: str, x, dim: int | None):
    if isinstance(x, (Value, Reduced)):
        return reduce(op, x, dim)
    if is_constant(x):  # a number has no M x N tile (and numpy has no axis -1 to reduce)
        raise constant_reduction_error(user_loc(), None)
    from evtc.errors import ArgumentError
    from evtc.frontend.builder_rules import _DIM_HINT, is_reduction_dim, reduction_dim_message

    if not is_reduction_dim(dim):  # as the traced form (dim=2 was reduced over M: 2 % 2, dim=True over N)
        raise ArgumentError(f"evtc.{op}: {reduction_dim_message(dim)}", loc=user_loc(), hint=_DIM_HINT)
    torch = _torch_of((x,))
    x = _eager_operand(op, x, torch)
    ndim = x.ndim if torch is not None and isinstance(x, torch.Tensor) else np.ndim(x)  # (not .shape: NOTE
    if ndim < 2:  # [Extents are not known when an epilogue is imported] in evtc/frontend/torch_import.py)
        raise ArgumentError(f"evtc.{op} of a {ndim}-D value: a reduction takes an M x N matrix (or L of them)",
                            loc=user_loc(), hint="pass a 2-D (M, N) or 3-D (L, M, N) array or tensor")
    if op == "amax":
        x, op = abs(x), "max"
    axes = None if dim is None else ((-1,) if dim % 2 == 1 else (-2,))
    if axes is None:
        axes = (-2, -1)
    if torch is not None:
        xf = x.float()
        if op == "sum":
            return xf.sum(dim=axes)
        return xf.amax(dim=axes) if op == "max" else xf.amin(dim=axes)
    arr = np.asarray(x, dtype=np.float64)
    fn = {"sum": np.sum, "max": np.max, "min": np.min}[op]
    return fn(arr, axis=axes)


def sum(x, dim: int | None = None):  # noqa: A001
    """Sum over N (``dim=1``: a row reduction, one value per row), over M (``dim=0``: a column
    reduction), or over both (no ``dim``). Accumulates in f32; the output is f32 unless
    converted with ``.to(dtype)``."""
    return _reduce("sum", x, dim)


def max(x, *rest, dim: int | None = None):  # noqa: A001
    """Maximum over ``dim`` (see :func:`sum`). For an elementwise max use :func:`maximum`."""
    _no_elementwise("max", x, rest)
    return _reduce("max", x, dim)


def min(x, *rest, dim: int | None = None):  # noqa: A001
    """Minimum over ``dim`` (see :func:`sum`). For an elementwise min use :func:`minimum`."""
    _no_elementwise("min", x, rest)
    return _reduce("min", x, dim)


def amax(x, dim: int | None = None):
    """max(abs(x)) over ``dim`` (see :func:`sum`): the amax of fp8 scaling recipes."""
    if isinstance(x, (Value, Reduced)):
        return _reduce("max", abs(x), dim)
    return _reduce("amax", x, dim)


def quantize(x, dtype="e4m3", group: int = 128, convention: str = "vllm", scale_layout: str = "row_major"):
    """Per-token-group quantization: ``(q, scales)`` with one f32 scale per 1 x ``group`` group
    of a row and q = y / scale rounded to ``dtype`` (e4m3 or e5m2), as ``convention`` ("vllm",
    "sglang", "deepgemm") computes them (NOTE [Per-token-group quantization conventions] in
    evtc/testing/quant.py; docs/numerics.md). In an epilogue both must be returned as outputs:
    ``q, s = evtc.quantize(y, evtc.e4m3); return {"D": q, "D_scale": s}``; the scales' shape is
    (M, ceil(N / group)) per batch, laid out as ``scale_layout`` says: ``"row_major"``, or
    ``"col_major_tma"`` (DeepGEMM's: column-major, M padded to 4; :class:`evtc.testing.quant.
    ScaleLayout`), the type a caller's ``out=`` tensor must have. On torch tensors it runs
    :func:`evtc.testing.quant.quantize_per_token_group` (the reference); on numpy arrays or
    nested lists (M, N), the interpreter's :func:`evtc.ir.quant.quantize_groups` (the same bits,
    as float64 arrays).

    Raises:
        EvtcError: a dtype that is not fp8, a group other than 32, 64 or 128 (in an epilogue;
            the eager forms take any positive integer), an unknown convention or scale layout, or x
            that is no matrix of real numbers.
    """
    if isinstance(x, (Value, Reduced)):
        return _trace.quantize(x, dtype, group, convention, scale_layout)
    from evtc import dtypes as _dt
    from evtc.errors import ArgumentError
    from evtc.ir.nodes import QUANT_CONVENTIONS, QUANT_SCALE_LAYOUTS, scale_grid_strides

    dt = _dt.coerce(dtype)
    layout = getattr(scale_layout, "value", scale_layout)
    if not isinstance(layout, str) or layout not in QUANT_SCALE_LAYOUTS:
        raise ArgumentError(f"evtc.quantize scale_layout={scale_layout!r}: one of {', '.join(QUANT_SCALE_LAYOUTS)}",
                            hint="'row_major' is the default; 'col_major_tma' is what DeepGEMM's kernels read")
    if _torch_of((x,)) is not None:
        from evtc.testing.quant import ScaleLayout, allocate_scales, quantize_per_token_group

        q, s = quantize_per_token_group(x, group, dt.name, convention=convention)
        if layout == "row_major" or s.numel() == 0:  # (an empty grid has no layout to speak of)
            return q, s
        out = allocate_scales(s.shape[0], x.shape[-1], group, ScaleLayout(layout), device=s.device)
        return q, out.copy_(s)
    from evtc.ir.quant import quantize_groups

    try:
        arr = np.asarray(x)
        if np.iscomplexobj(arr):
            raise TypeError("complex")
        arr = arr.astype(np.float64)
    except (TypeError, ValueError) as e:
        raise ArgumentError(f"evtc.quantize of a {type(x).__name__} that is no matrix of real numbers ({e})",
                            hint="pass an (M, N) numpy array or torch tensor of real numbers") from None
    if arr.ndim != 2 or not dt.is_fp8 or convention not in QUANT_CONVENTIONS or isinstance(group, bool) \
            or not isinstance(group, (int, np.integer)) or group <= 0:
        raise ArgumentError(f"evtc.quantize of a {arr.ndim}-D array to {dt.name}, group={group!r}, "
                            f"convention={convention!r}: an (M, N) array, e4m3 or e5m2, a positive group, one of "
                            f"{', '.join(QUANT_CONVENTIONS)}")
    q, s = quantize_groups(arr[None], int(group), convention, dt)
    if layout == "row_major":
        return q[0], s[0]
    M, G = s.shape[1:]
    _, m4 = scale_grid_strides(layout, M, G)
    grid = np.zeros((G, m4))  # the (M, G) view of a (G, M rounded up to 4) array
    grid[:, :M] = s[0].T
    return q[0], grid[:, :M].T


def glu(x, act: str = "silu"):
    """The gated linear unit over interleaved columns: column j of the result is
    ``act(x[..., 2j]) * x[..., 2j + 1]``, N / 2 columns (SwiGLU with ``act="silu"``, GeGLU with
    ``"gelu"`` or ``"gelu_tanh"``, ReGLU with ``"relu"``; act is any unary op of ``evtc ops``).
    In an epilogue it is the one-GEMM gated form: the GEMM runs over ``[W_gate; W_up]`` with their
    rows interleaved (:func:`evtc.interleave_gate_up`), the epilogue pairs each gate column with
    its up column inside the tile and stores N / 2 columns, and its value can only be returned as
    an output (``return evtc.glu(acc + bias)``). On torch tensors (floating point) it runs eagerly
    in torch (through float64 numpy where the act has no torch rule, as ``gelu_grad``); anything
    else is taken as a numpy array of real numbers (nested lists included) and runs in float64.

    Raises:
        EvtcError: ``act`` is not a unary op; x is no matrix of real numbers with an even number
            of columns (a string, object or complex array, a torch integer, bool or complex
            tensor, an object that only has a ``shape``).
        UnsupportedOpError: called in an epilogue the torch importer reads (one written with
            torch ops), at its line.
    """
    if isinstance(x, (Value, Reduced)):
        return _trace.glu(x, act)
    from evtc.errors import ArgumentError
    from evtc.ir.nodes import is_glu_act

    if not is_glu_act(act):
        raise ArgumentError(f"evtc.glu act={act!r}: the name of a unary op (evtc ops)", hint="act='silu' is SwiGLU")
    op = ops.OPS[act]
    torch = _torch_of((x,))
    if torch is not None and getattr(TORCH_IMPORT, "hook", None) is not None:
        # (the importer's fake tensors have N = 7 columns, and its op table has no N / 2 op)
        raise UnsupportedOpError("evtc.glu in an epilogue read with torch ops (the torch importer): the gated form is "
                                 "evtc's tracer's", loc=user_loc(), hint="write the epilogue with evtc.* functions "
                                 "only, e.g. evtc.glu(evtc.relu(acc) + bias)")
    x = _eager_operand("glu", x, torch)  # (a floating point tensor, or numbers numpy reads as real)
    if torch is not None and not x.dtype.is_floating_point:  # a bool mask is no gate and up values
        raise ArgumentError(f"evtc.glu of a {x.dtype} tensor: gate and up values are floating point",
                            hint="convert it first, e.g. x.float()")
    if torch is None:
        x = np.asarray(x)
    shape = tuple(x.shape)
    if len(shape) < 2 or shape[-1] % 2:
        raise ArgumentError(f"evtc.glu of {type(x).__name__} with shape {shape}: a matrix with an even number of "
                            "columns (gate and up interleaved)", hint="build B with evtc.interleave_gate_up")
    g, u = x[..., 0::2], x[..., 1::2]
    if torch is not None and op.torch is not None:
        return op.torch(torch, g) * u
    if torch is not None:  # no torch rule: float64 numpy on the host and back, as _call does
        host = g.detach().double().cpu().numpy()
        return torch.as_tensor(op.numpy(host)).to(x.device, x.dtype) * u
    with np.errstate(all="ignore"):
        return op.numpy(np.asarray(g, dtype=np.float64)) * np.asarray(u, dtype=np.float64)


def _no_elementwise(name: str, x, rest) -> None:
    if rest:
        raise not_elementwise(name, (x, *rest))
