"""Errors that evtc shows to its users.

Every error a user can cause is an :class:`EvtcError`. It carries the name of the epilogue,
the :class:`SourceLoc` of the user's line (or of the position in a textual expression), what
went wrong and what to do about it, and ends with an anchor into ``docs/errors.md``. The
formatting follows Triton's ``CompilationError`` (file:line:col, the line, a caret) and the
traceback filtering follows JAX's ``traceback_util``: frames inside the evtc package are
dropped from what the user sees unless ``EVTC_TRACEBACK=full`` is set.

Example::

    evtc.TraceError: a traced value was used as a Python bool
      in epilogue 'bad' at examples/bad.py:7:8
         7 |     if acc > 0:
           |        ^^^^^^^
      hint: Python control flow can't depend on tensor values; use evtc.where(cond, a, b)
      see docs/errors.md#trace-bool, or run: evtc errors trace-bool
"""

from __future__ import annotations

import dataclasses
import functools
import os
import types
from pathlib import Path
from typing import Callable, TypeVar

_PACKAGE_DIR = str(Path(__file__).resolve().parent)

DOCS_ERRORS = "docs/errors.md"

#: the most characters of a source line an error shows (a longer line shows a window of it)
_EXCERPT_WIDTH = 160


@dataclasses.dataclass(frozen=True, slots=True)
class SourceLoc:
    """A position in the user's code or in a textual epilogue.

    Attributes:
        file: path of the Python file, or ``"<expr>"`` for a textual expression.
        line: 1-based line number.
        col: 0-based column of the start of the span, or None when unknown.
        end_col: 0-based column one past the end of the span on the same line, or None.
        text: the source line itself (without the trailing newline), or None.
    """

    file: str
    line: int
    col: int | None = None
    end_col: int | None = None
    text: str | None = None

    def __str__(self) -> str:
        col = f":{self.col + 1}" if self.col is not None else ""
        return f"{self.file}:{self.line}{col}"

    def excerpt(self) -> str:
        """The source line with a caret under the span, indented for an error message."""
        if not self.text:
            return ""
        stripped = self.text.rstrip()
        col = self.col
        end = None
        if col is not None:
            end = self.end_col if self.end_col and self.end_col > col else col + 1
            end = min(end, max(len(stripped), col + 1))
        if len(stripped) > _EXCERPT_WIDTH:  # a window of a long line (a 100 KB expression) around the span
            start = max(0, min(col or 0, len(stripped) - _EXCERPT_WIDTH) - 20)
            shown = stripped[start:start + _EXCERPT_WIDTH]
            lead = "..." if start else ""
            stripped = lead + shown + ("..." if start + _EXCERPT_WIDTH < len(self.text.rstrip()) else "")
            if col is not None:
                col, end = col - start + len(lead), min(end, start + _EXCERPT_WIDTH) - start + len(lead)
        gutter = f"{self.line:>6} | "
        lines = [gutter + stripped]
        if col is not None:
            lines.append(" " * (len(gutter) - 2) + "| " + " " * col + "^" * max(1, end - col))
        return "\n".join(lines)


class EvtcError(Exception):
    """Base class of every error evtc raises on bad input.

    Args:
        message: one sentence saying what is wrong.
        loc: where in the user's epilogue (or expression) the problem is.
        epilogue: the name of the epilogue function or expression.
        hint: what to do about it.
        anchor: anchor in ``docs/errors.md``; defaults to the class's ``anchor``.
    """

    anchor = "evtc-error"

    def __init__(
        self,
        message: str,
        *,
        loc: SourceLoc | None = None,
        epilogue: str | None = None,
        hint: str | None = None,
        anchor: str | None = None,
    ) -> None:
        super().__init__(message)
        self.message = message
        self.loc = loc
        self.epilogue = epilogue
        self.hint = hint
        if anchor is not None:
            self.anchor = anchor

    def with_context(self, *, loc: SourceLoc | None = None, epilogue: str | None = None) -> "EvtcError":
        """Fill in the location and epilogue name if they are still unknown; returns self."""
        if self.loc is None and loc is not None:
            self.loc = loc
        if self.epilogue is None and epilogue is not None:
            self.epilogue = epilogue
        return self

    def __str__(self) -> str:
        parts = [self.message]
        where = []
        if self.epilogue:
            where.append(f"in epilogue '{self.epilogue}'")
        if self.loc is not None:
            where.append(f"at {self.loc}")
        if where:
            parts.append("  " + " ".join(where))
        if self.loc is not None and self.loc.text:
            parts.append(self.loc.excerpt())
        if self.hint:
            parts.append(f"  hint: {self.hint}")
        parts.append(f"  see {DOCS_ERRORS}#{self.anchor}, or run: evtc errors {self.anchor}")
        return "\n".join(parts)


class TraceError(EvtcError):
    """The epilogue function did something that can't be traced (Python control flow on a
    traced value, an unsupported builtin, a non-traced return value)."""

    anchor = "trace-error"


class EpilogueSignatureError(EvtcError):
    """A parameter of the epilogue function has no kind evtc can infer (accumulator, source,
    scalar, row/column broadcast or aux load)."""

    anchor = "signature"


class UnsupportedOpError(EvtcError):
    """An operation has no entry in the op table (``evtc/ops.py``) or no lowering for the arch."""

    anchor = "unsupported-op"


class UnknownFunctionError(UnsupportedOpError, AttributeError):
    """``evtc.<name>`` for a name evtc doesn't have (a typo such as ``evtc.rleu``): raised by the
    ``evtc`` module's ``__getattr__`` at the user's line, with the close matches and the list of
    functions, the same message the expression form gives for ``rleu(x)``. It is also an
    ``AttributeError``, so ``hasattr(evtc, name)`` and ``from evtc import name`` behave as for any
    module."""

    anchor = "unsupported-op"


class GraphTooLargeError(EvtcError):
    """An epilogue beyond evtc's size limits (:data:`evtc.ir.limits.LIMITS`: nodes, nesting
    depth, outputs, parameters), raised by the frontend at the line that crossed the limit (or
    by ``evtc.passes.run`` for a graph built by hand). The message names the limit and the
    epilogue."""

    anchor = "too-large"


class EpilogueTypeError(EvtcError):
    """Mismatched dtypes or broadcast shapes inside the epilogue."""

    anchor = "type-error"


class UnknownDTypeError(EvtcError, KeyError):
    """A dtype name (``"bf16"``, ``torch.float8_e4m3fn``...) evtc doesn't know."""

    anchor = "type-error"

    def __str__(self) -> str:  # KeyError would quote the message
        return EvtcError.__str__(self)


class LegalizeError(EvtcError):
    """The epilogue can't run on the requested architecture (e.g. fp8 mainloop on sm80)."""

    anchor = "legalize"


class GrammarError(EvtcError):
    """A syntax error in a textual epilogue (``evtc emit --expr`` or the canonical IR text)."""

    anchor = "grammar"


class IRVerificationError(EvtcError):
    """An IR invariant broke. When raised after a pass, the message names the pass: that is
    a bug in evtc, please report it with the IR shown."""

    anchor = "verify"


class PlanError(EvtcError):
    """No legal shared-memory plan or GEMM configuration exists for the request."""

    anchor = "plan"


class ConfigError(EvtcError):
    """A GEMM configuration (tile, cluster, schedule) that CUTLASS can't build."""

    anchor = "config"


class BuildError(EvtcError):
    """nvcc failed. The message names the kept source and log files."""

    anchor = "build"


class CacheError(EvtcError):
    """The kernel cache can't be used: its directory can't be created or written, belongs to
    another user or is writable by others, a cached kernel failed verification when loaded, a
    build lock was held too long, or an imported archive is not an evtc cache export. The
    message names the directory, entry or file and the cause."""

    anchor = "cache"


class ArgumentError(EvtcError, TypeError):
    """A runtime argument (tensor or scalar) is missing, extra, or has the wrong shape, dtype,
    stride, alignment or device. The message names the argument."""

    anchor = "arguments"


class MisalignedError(ArgumentError):
    """A tensor's base address is not aligned as the kernel's TMA accesses need (16 bytes). A
    kernel family retries such a call on a member that needs no TMA for that tensor; a pinned
    kernel raises it."""

    anchor = "arguments"


class LaunchError(EvtcError, RuntimeError):
    """CUDA or CUTLASS reported an error while launching the kernel."""

    anchor = "launch"


class NoDeviceError(EvtcError, RuntimeError):
    """A GPU (or nvcc) is needed for this call and none was found."""

    anchor = "no-device"


class ConstantFoldError(EvtcError):
    """A constant subexpression of finite constants evaluates to a value the compute type can't
    hold (an overflow such as ``exp(1000)``, or NaN such as ``log(-1.0)``), at the user's line:
    one rule (``check_fold`` in ``evtc/passes/fold.py``) for the ``fold`` pass, the expression
    form's folding and ``evtc.*`` functions called on numbers. Fix the constant, or make it a
    runtime scalar parameter if its value is only known at run time."""

    anchor = "constant-fold"


class PassError(EvtcError):
    """A pass failed with an internal exception (a bug in evtc). The message names the pass,
    the passes run before it and shows the IR around the node the pass was working on; the
    original exception is chained as ``__cause__`` (``EVTC_TRACEBACK=full`` shows it). Report
    it with the IR shown; writing the marked line differently usually avoids the failure."""

    anchor = "pass-error"


class FragmentError(EvtcError):
    """An epilogue fragment (``evtc.plugin``) and what a kernel generator asks of it disagree: a
    tile, schedule, epilogue tile, cluster or dtype other than those the fragment was planned
    for, a C++ name that is not an identifier, a placeholder left unbound or bound twice, or an
    arch without fragments. The message names the argument and the value the fragment allows;
    lower the epilogue again with the generator's values (docs/plugin.md)."""

    anchor = "fragment"


# --------------------------------------------------------------------------------------------
# Traceback filtering (JAX traceback_util)
# --------------------------------------------------------------------------------------------

F = TypeVar("F", bound=Callable)


def _is_internal(frame: types.FrameType) -> bool:
    # The package folder with its separator: a checkout under a folder named 'tests', or a
    # sibling folder 'evtc_examples', is not evtc.
    return frame.f_code.co_filename.startswith(_PACKAGE_DIR + os.sep)


def filter_traceback(tb: types.TracebackType | None) -> types.TracebackType | None:
    """Return a copy of ``tb`` without the frames that belong to the evtc package."""
    frames = []
    while tb is not None:
        if not _is_internal(tb.tb_frame):
            frames.append((tb.tb_frame, tb.tb_lasti, tb.tb_lineno))
        tb = tb.tb_next
    new_tb = None
    for frame, lasti, lineno in reversed(frames):
        new_tb = types.TracebackType(new_tb, frame, lasti, lineno)
    return new_tb


# The wrapper is compiled under the pseudo-file "<evtc>" so that the one frame the boundary
# itself adds to a traceback shows as "<evtc>" rather than as a path inside the package.
_BOUNDARY_SRC = """
def make_wrapper(fn, EvtcError, filter_traceback, os):
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except EvtcError as err:
            from evtc import knobs  # (knobs imports this module)

            if knobs.traceback.get_or_default() == "full":
                raise
            raise err.with_traceback(filter_traceback(err.__traceback__)) from None
    return wrapper
"""
_boundary_ns: dict = {}
exec(compile(_BOUNDARY_SRC, "<evtc>", "exec"), _boundary_ns)


def api_boundary(fn: F) -> F:
    """Decorator for public entry points: an :class:`EvtcError` leaves with the evtc frames
    removed from its traceback and without the chained internal exception, so the user sees
    their own line and the message. ``EVTC_TRACEBACK=full`` keeps everything (for debugging
    evtc itself)."""
    wrapper = _boundary_ns["make_wrapper"](fn, EvtcError, filter_traceback, os)
    return functools.wraps(fn)(wrapper)  # type: ignore[return-value]
