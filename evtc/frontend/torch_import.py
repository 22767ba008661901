"""The torch importer: epilogues written with torch operations, read through torch.fx.

Input: a Python function written with torch ops (``torch.relu``, ``F.gelu``, ``torch.where``,
``x.amax(dim=1)``, ``.to(torch.float8_e4m3fn)``...) whose parameters carry evtc's annotations;
or, for the ``torch.compile`` backend (:mod:`evtc.torch.backend`), a region of an ATen FX graph.
Output: :class:`evtc.ir.graph.Graph`, built by the one IR builder
(:mod:`evtc.frontend.builder`), so an epilogue written with torch ops and the same epilogue
written with ``evtc.*`` give the same graph, and the same IR text.

How a function is imported (:func:`import_torch`):

1. Its parameters are classified as the tracer does (:func:`evtc.frontend.trace.classify_parameter`:
   ``acc``, ``C``, ``alpha: float``, ``bias: evtc.RowVector[f32]``...) and declared with the builder.
2. ``make_fx`` runs it on fake float32 tensors shaped as each kind broadcasts: ``(M, N)`` for
   ``acc``, ``C`` and aux inputs, ``(N,)`` for row vectors, ``(M, 1)`` for column vectors and
   ``()`` for scalars (M and N are small and distinct, :data:`FAKE_M`, :data:`FAKE_N`). Scalars are
   0-d tensors, so they are graph inputs, never constants baked into the graph. Every value
   computes in f32, as in the kernel; only an explicit ``.to(dtype)`` rounds.
3. Each ATen node is lowered by its row of :data:`ATEN` (the one table of torch ops -> evtc
   builder calls, shared with the backend), located at the user's line: a
   ``TorchFunctionMode`` records the innermost frame outside torch and evtc for each torch call,
   and ``torch.fx.traceback`` copies it onto every ATen node that call makes.
4. The return value (a tensor: the output ``D``; or a dict of named outputs) gives the outputs.

Reductions: ``sum``, ``amax``, ``amin``, ``max``, ``min`` (``x.max(dim=1).values`` too) over
the last axis (``dim=1``/``-1``: a row reduction, one value per row), the one before
(``dim=0``/``-2``: a column reduction) or both (no dim: a scalar reduction); ``keepdim`` is
accepted (evtc returns the reduced vector). ``mean`` needs the extent reduced, which the
importer does not know (the backend does, and lowers it as a sum of ``x / N``).

What it refuses, with an :class:`~evtc.errors.UnsupportedOpError` at the user's line that names
the ATen op and the supported ones: any op not in :data:`ATEN` (``cumsum``, ``softmax``,
``var``, ``matmul``...), in-place ops (``x.relu_()``), views other than adding or removing
size-1 dimensions, and tensor constants with more than one element. Python control flow on a
traced value is a :class:`~evtc.errors.TraceError` (use ``torch.where``). torch is imported
only when a function is imported: ``import evtc`` does not import it.

The table of ATen ops and the :class:`Lowering` that applies it are
:mod:`evtc.frontend.torch_aten` (re-exported here); this module reads a function: source
locations, ``make_fx``, the outputs.
"""

from __future__ import annotations

import inspect
import linecache
import logging
import os
import re
import sys
from typing import Any, Callable

from evtc import dtypes
from evtc.dtypes import DType
from evtc.errors import EvtcError, SourceLoc, TraceError, UnsupportedOpError
from evtc.frontend.builder import PYTHON, IRBuilder, Pending
from evtc.frontend.torch_aten import (ATEN, Lowering, Row, _evtc_call, _evtc_op, supported_ops, target_name,
                                     unsupported_reason, user_ops)
from evtc.ir.graph import Graph
from evtc.ir.nodes import ColBroadcast, Node, RowBroadcast, ScalarBroadcast

__all__ = ["ATEN", "FAKE_M", "FAKE_N", "Row", "Lowering", "import_torch", "unsupported_reason", "supported_ops",
           "user_ops", "target_name", "loc_from_stack_trace"]

#: the extents of the fake tensors a function is traced with (distinct, so that a row vector
#: used where a column vector belongs fails to broadcast as it would at run time)
FAKE_M, FAKE_N = 5, 7


# ---------------------------------------------------------------------------------------------
# Source locations
# ---------------------------------------------------------------------------------------------

_FILE_LINE = re.compile(r'File "(?P<file>[^"]+)", line (?P<line>\d+)')


def loc_from_stack_trace(stack_trace: str | None, known: dict[str, SourceLoc] | None = None) -> SourceLoc | None:
    """The user's line of an fx node's ``meta["stack_trace"]``: one recorded by this module
    (in ``known``, with its columns), else the last ``File "...", line N`` of a Python
    traceback (Dynamo's), with the line's text and no column."""
    if not stack_trace:
        return None
    if known is not None and stack_trace in known:
        return known[stack_trace]
    found = list(_FILE_LINE.finditer(stack_trace))
    if not found:
        return None
    file, line = found[-1]["file"], int(found[-1]["line"])
    text = linecache.getline(file, line).rstrip("\n") or None
    return SourceLoc(file, line, None, None, text)


def _torch_dir() -> str:
    import torch

    return os.path.dirname(os.path.abspath(torch.__file__)) + os.sep


def _user_frame_loc(torch_dir: str) -> SourceLoc | None:
    from evtc.frontend.trace import _frame_loc, _is_evtc_file

    frame = sys._getframe(1)
    while frame is not None and (_is_evtc_file(frame.f_code.co_filename)
                                 or os.path.abspath(frame.f_code.co_filename).startswith(torch_dir)):
        frame = frame.f_back
    return None if frame is None else _frame_loc(frame.f_code, frame.f_lineno, frame.f_lasti)


def _loc_mode(locs: dict[str, SourceLoc]):
    """A TorchFunctionMode that stamps each torch call's user line on the fx nodes it makes
    (through ``torch.fx.traceback.set_stack_trace``, under ``preserve_node_meta``); ``locs``
    maps the stamp to the full SourceLoc (with its columns)."""
    import torch
    import torch.fx.traceback as fx_traceback

    torch_dir = _torch_dir()

    extents = _extent_reads(torch)

    class LocMode(torch.overrides.TorchFunctionMode):
        def __torch_function__(self, func, types, args=(), kwargs=None):
            loc = _user_frame_loc(torch_dir)
            if loc is not None:
                key = f'File "{loc.file}", line {loc.line}, col {loc.col} [evtc {len(locs)}]'
                locs[key] = loc
                fx_traceback.set_stack_trace([key])
            bounded = _bounded_slice(func, args, torch)
            if bounded is not None and not _evtc_caller(torch_dir):  # NOTE [Extents are not known when ...]
                raise UnsupportedOpError(f"the epilogue slices a tensor ({bounded}): an epilogue is elementwise over "
                                         "all of M x N, and a slice's bounds depend on M and N, which are not known "
                                         f"when it is imported (it is traced on fake tensors of M={FAKE_M}, "
                                         f"N={FAKE_N})", loc=loc,
                                         hint="slice the GEMM's output outside the epilogue; an index may only add "
                                              "size-1 dimensions (bias[None, :])")
            read = _extent_read(func, extents)
            if read is not None and not _evtc_caller(torch_dir):  # NOTE [Extents are not known when an epilogue is imported]
                raise TraceError(f"the epilogue reads a tensor's extent ({read}): it is traced once on fake tensors of "
                                 f"M={FAKE_M}, N={FAKE_N}, so the kernel would compute with those numbers for every "
                                 "problem", loc=loc, anchor="trace-error",
                                 hint="M and N are known only when the GEMM runs: pass what you need as a scalar "
                                      "parameter (e.g. inv_n: float, given 1 / N at the call)")
            return func(*args, **(kwargs or {}))

    global _LOC_MODE_CODE
    _LOC_MODE_CODE = frozenset({LocMode.__torch_function__.__code__})
    return LocMode()


# NOTE [Extents are not known when an epilogue is imported]
# make_fx runs the function once on fake tensors of M = FAKE_M, N = FAKE_N, and a Python number
# read from them (``acc.shape[-1]``, ``acc.size(1)``, ``len(acc)``, ``acc.numel()``) becomes a
# constant of the graph: ``acc / acc.shape[-1]`` was imported as ``div(acc, 7.0)`` and run so for
# every N. The mode sees each torch call the user's code makes (a torch function written in
# Python, F.normalize, reads extents under torch's own handler, not through the mode), so a read
# of an extent it sees is the user's; ``ndim`` and ``dim()`` don't depend on M or N.


def _extent_reads(torch) -> dict:
    """The torch functions that read a tensor's extents -> how an error shows the read."""
    return {torch.Tensor.size: "size()", torch.Tensor.numel: "numel()", torch.numel: "torch.numel()",
            torch.Tensor.nelement: "nelement()", torch.Tensor.stride: "stride()", torch.Tensor.__len__: "len()"}


def _evtc_caller(torch_dir: str) -> bool:
    """Whether the torch call the mode sees was made by evtc's own code (an evtc function reading
    a tensor's rank), not by the user's: the first frame outside torch below the mode's."""
    from evtc.frontend.trace import _is_evtc_file

    frame = sys._getframe(2)  # (this function's caller is the mode's __torch_function__)
    while frame is not None and os.path.abspath(frame.f_code.co_filename).startswith(torch_dir):
        frame = frame.f_back
    return frame is not None and _is_evtc_file(frame.f_code.co_filename)


def _bounded_slice(func, args, torch) -> str | None:
    """How an indexing call ``func(*args)`` slices with bounds (``x[:, :8]``, ``x[2:]``,
    ``x[::2]``), or None. Such a slice depends on the extents (NOTE [Extents are not known when
    an epilogue is imported]), and torch's indexing drops one that covers the fake tensor
    (``acc[:, :8]`` of N = 7 recorded nothing: imported as ``acc``)."""
    if func is not torch.Tensor.__getitem__ or len(args) < 2:
        return None
    index = args[1] if isinstance(args[1], tuple) else (args[1],)
    for part in index:
        if isinstance(part, slice) and (part.start not in (None, 0) or part.stop is not None
                                        or part.step not in (None, 1)):
            ends = ["" if v is None else repr(v) for v in (part.start, part.stop)]
            return f"[{':'.join(ends)}{'' if part.step is None else f':{part.step!r}'}]"
    return None


def _extent_read(func, extents: dict) -> str | None:
    """How the call ``func`` reads an extent (``.shape``, ``size()``...), or None if it doesn't."""
    if getattr(func, "__name__", None) == "__get__":  # a property: Tensor.shape's getter
        return ".shape" if getattr(getattr(func, "__self__", None), "__name__", None) == "shape" else None
    try:
        return extents.get(func)
    except TypeError:  # an unhashable callable
        return None


#: the code of the mode's ``__torch_function__``: an error raised under it is torch's, not evtc's
_LOC_MODE_CODE: frozenset = frozenset()


# ---------------------------------------------------------------------------------------------
# Importing a function
# ---------------------------------------------------------------------------------------------


def _fake_shape(leaf) -> tuple[int, ...]:
    if isinstance(leaf, ScalarBroadcast):
        return ()
    if isinstance(leaf, RowBroadcast):
        return (FAKE_N,)
    if isinstance(leaf, ColBroadcast):
        return (FAKE_M, 1)
    return (FAKE_M, FAKE_N)  # acc, C, aux loads


def _is_data_dependent(err: BaseException) -> bool:
    names = {c.__name__ for c in type(err).__mro__}
    return any("DataDependent" in n or n == "GuardOnDataDependentSymNode" for n in names)


def import_torch(fn: Callable, *, c: DType | None = None, d: DType = dtypes.bf16, name: str | None = None) -> Graph:
    """Import an epilogue written with torch ops into a Graph.

    Args:
        fn: the epilogue function; its parameters are annotated as for the tracer
            (``acc``, ``C``, ``alpha: float``, ``bias: evtc.RowVector[f32]``,
            ``R: evtc.Matrix[bf16]``...). It is called once, by ``make_fx``, on fake f32
            tensors: ``(M, N)`` for acc/C/aux, ``(N,)`` row vectors, ``(M, 1)`` column
            vectors, ``()`` scalars (runtime scalar parameters, not constants).
        c: dtype of an unannotated ``C`` (default ``d``).
        d: dtype of M x N outputs without ``.to(dtype)`` and of bare ``evtc.Matrix`` inputs.
        name: the epilogue's name (default: the function's).

    Returns:
        The Graph, as :func:`evtc.frontend.trace.trace` returns it for the same epilogue
        written with ``evtc.*`` (outputs: a returned tensor is ``D``, a dict names them).

    Raises:
        ImportError: torch is not installed.
        UnsupportedOpError: an ATen op (or a use of one) evtc can't lower, at the user's line.
        TraceError: the function raised, or branched on a traced value, at the user's line;
            it returned something other than a tensor or a dict of tensors.
        EpilogueSignatureError, EpilogueTypeError: as for the tracer (kinds, dtypes, outputs).
    """
    from evtc.frontend.trace import _def_loc, _parameters, default_name

    epilogue = name or default_name(fn)
    builder = IRBuilder(epilogue, c=c or d, d=d, dialect=PYTHON, loc=_def_loc(fn))
    params = _parameters(fn, builder)
    leaves = []
    for p, kind, ploc in params:
        leaves.append(builder.input(p.name, kind.leaf, kind.dtype, by_pointer=kind.by_pointer, loc=ploc))
    locs: dict[str, SourceLoc] = {}
    gm = _make_fx(fn, params, leaves, locs, epilogue)

    def loc_of(node):
        return loc_from_stack_trace(node.meta.get("stack_trace"), locs) or builder.loc

    env: dict = {}
    lowering = Lowering(builder, env, loc_of)
    placeholders = iter(leaves)
    result = None
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            env[node] = next(placeholders)
        elif node.op == "get_attr":
            env[node] = _tensor_constant(getattr(gm, node.target), builder, loc_of(node))
        elif node.op == "call_function":
            lowering.lower(node)
        elif node.op == "output":
            result = node.args[0]
    _outputs(builder, lowering, result)
    return builder.graph()


def _make_fx(fn: Callable, params: list, leaves: list, locs: dict[str, SourceLoc], epilogue: str):
    """The ATen fx graph of ``fn`` run by ``make_fx`` on fake f32 tensors shaped as its
    ``leaves`` broadcast, with each node's user line recorded in ``locs`` (its dead code
    eliminated). The function's own errors are located at its line."""
    import torch
    import torch.fx.traceback as fx_traceback
    from torch.fx.experimental.proxy_tensor import make_fx

    from evtc.frontend import functions

    positional = [p.kind is inspect.Parameter.POSITIONAL_ONLY for p, _, _ in params]
    names = [p.name for p, _, _ in params]

    def flat(*tensors):
        args = [t for t, pos in zip(tensors, positional) if pos]
        kwargs = {n: t for n, t, pos in zip(names, tensors, positional) if not pos}
        with _loc_mode(locs):
            return fn(*args, **kwargs)

    examples = [torch.zeros(_fake_shape(leaf), dtype=torch.float32) for leaf in leaves]
    _evtc_op()
    saved = getattr(functions.TORCH_IMPORT, "hook", None)
    functions.TORCH_IMPORT.hook = _evtc_call
    # (fake tensors log the user's own errors, a broadcast mismatch, before raising them to us)
    fake_log = logging.getLogger("torch._subclasses.fake_tensor")
    saved_level = fake_log.level
    fake_log.setLevel(logging.CRITICAL)
    try:
        with fx_traceback.preserve_node_meta():
            gm = make_fx(flat, tracing_mode="fake")(*examples)
    except EvtcError as err:
        raise err.with_context(epilogue=epilogue)
    except (Exception, SystemExit) as err:  # noqa: BLE001 - the user's own error, located at their line
        raise _located(err, epilogue) from err
    finally:
        functions.TORCH_IMPORT.hook = saved
        fake_log.setLevel(saved_level)
    gm.graph.eliminate_dead_code()  # (the unused indices of max(dim=...), values never returned)
    return gm


def _located(err: BaseException, epilogue: str) -> EvtcError:
    """The error to raise for the user's own ``err`` while ``make_fx`` ran their function."""
    from evtc.frontend.trace import _raised_by_the_function

    located = _raised_by_the_function(err, epilogue, _LOC_MODE_CODE)
    if isinstance(err, RuntimeError) and ("must match the size of tensor" in str(err)
                                           or "Attempting to broadcast a dimension" in str(err)):
        return TraceError(f"{located.message}; the epilogue is traced with M={FAKE_M}, N={FAKE_N}", loc=located.loc,
                          epilogue=epilogue,
                          hint="evtc passes acc, C and evtc.Matrix inputs as (M, N), evtc.RowVector as (N,), "
                               "evtc.ColVector as (M, 1) and scalars as (): check each parameter's annotation")
    if _is_data_dependent(err):
        return TraceError("a traced value was used as a Python value (if, bool(), float(), .item()...)",
                          loc=located.loc, epilogue=epilogue, anchor="trace-bool",
                          hint="Python control flow can't depend on tensor values; use torch.where(cond, a, b)")
    return located


def _tensor_constant(t, builder: IRBuilder, loc: SourceLoc | None) -> float:
    if t.numel() != 1:
        builder.fail(UnsupportedOpError, f"a tensor constant of shape {list(t.shape)} in the epilogue", loc,
                     hint="pass tensors as parameters (evtc.RowVector, evtc.ColVector, evtc.Matrix); "
                          "only numbers can be constants")
    return float(t.item())


def _outputs(builder: IRBuilder, lowering: Lowering, result: Any) -> None:
    loc = builder.loc
    if isinstance(result, dict):
        items = list(result.items())
        if not items:
            builder.fail(TraceError, "the epilogue returned an empty dict", loc, anchor="trace-return",
                         hint="return a tensor (the output D) or a dict of named outputs")
    elif isinstance(result, (tuple, list)):
        builder.fail(TraceError, f"the epilogue returned a {type(result).__name__}; outputs need names", loc,
                     anchor="trace-return", hint='return a dict: {"D": d, "row_max": d.amax(dim=1)}')
    else:
        items = [("D", result)]
    for key, val in items:
        builder.check_output_name(key, loc)
        if not (hasattr(val, "op") and hasattr(val, "users")):
            builder.fail(TraceError, f"output '{key}' is {type(val).__name__} {val!r:.40}, not a traced tensor",
                         loc, anchor="trace-return", hint="every output must be computed from the parameters")
        value = lowering.env[val]
        builder.output(key, value, lowering.loc_of(val) if isinstance(value, (Node, Pending)) else loc)
