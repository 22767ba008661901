"""Every environment variable evtc reads, declared once: its type, default, parser and doc line.

Input: the process environment. Output: typed values (``knobs.nvcc_timeout.get()`` -> a float or
None). Nothing else in the package reads ``os.environ`` (tests/null/test_knobs.py greps for it);
``evtc knobs`` lists them with their current values, and docs/knobs.md is generated from
:data:`KNOBS`.

One truthiness rule for every on/off variable (:func:`parse_bool`): ``1``, ``true``, ``yes``,
``on`` are on; ``0``, ``false``, ``no``, ``off`` and the empty string are off (case and blanks
ignored); anything else is an error that names the variable. A variable that is unset takes its
default. Modelled on Triton's ``knobs.py``.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any, Iterator

from evtc import errors

__all__ = ["BUILD_KNOBS", "CALL_KNOBS", "KNOBS", "Knob", "check", "parse_bool", "table"]

_TRUE = frozenset({"1", "true", "yes", "on"})
_FALSE = frozenset({"0", "false", "no", "off", ""})


def parse_bool(name: str, raw: str, error: type[errors.EvtcError] = errors.ConfigError) -> bool:
    """The one truthiness rule (see the module docstring).

    Raises:
        ``error``: ``raw`` is neither on nor off.
    """
    v = raw.strip().lower()
    if v in _TRUE:
        return True
    if v in _FALSE:
        return False
    raise error(f"{name}={raw!r} is neither on nor off", hint=f"set {name} to 1 (on) or 0 (off), or unset it")


@dataclasses.dataclass(frozen=True)
class Knob:
    """One environment variable.

    Attributes:
        name: the variable (``EVTC_NVCC_TIMEOUT``).
        kind: ``flag``, ``number``, ``count``, ``choice`` or ``text`` (what :meth:`get` returns:
            a bool, a float of seconds, an integer from 0, one of ``choices``, a string).
        default: the value while unset (None: none).
        doc: one line for ``evtc knobs`` and docs/knobs.md.
        choices: a ``choice`` knob's values; ``aliases`` map other spellings onto them.
        error: the EvtcError class a bad value raises.
        hint: the hint of that error.
    """

    name: str
    kind: str
    default: Any
    doc: str
    choices: tuple[str, ...] = ()
    aliases: tuple[tuple[str, str], ...] = ()
    error: type = errors.ConfigError
    hint: str | None = None

    def raw(self) -> str | None:
        """The variable's text, or None while unset."""
        return os.environ.get(self.name)

    def parse(self, raw: str) -> Any:
        """``raw`` read as this knob's kind.

        Raises:
            EvtcError (:attr:`error`): a value the kind doesn't take.
        """
        if self.kind == "flag":
            return parse_bool(self.name, raw, self.error)
        if self.kind == "number":
            try:
                value = float(raw)
            except ValueError:
                value = -1.0
            if not value > 0 or value != value or value == float("inf"):
                raise self.error(f"{self.name}={raw!r} is not a positive number of seconds",
                                 hint=self.hint or f"set {self.name} to a number of seconds, or unset it")
            return value
        if self.kind == "count":
            try:  # (int() refuses more than 4300 digits with a ValueError)
                value = int(raw.strip()) if raw.strip().isascii() and raw.strip().isdigit() else -1
            except ValueError:
                value = -1
            if value < 0:
                raise self.error(f"{self.name}={raw!r:.60} is not a whole number from 0",
                                 hint=self.hint or f"set {self.name} to a count such as 32, or unset it")
            return value
        if self.kind == "choice":
            v = raw.strip().lower()
            v = dict(self.aliases).get(v, v)
            if v not in self.choices:
                raise self.error(f"{self.name}={raw!r} is not one of {', '.join(self.choices)}",
                                 hint=self.hint or f"set {self.name} to one of {', '.join(self.choices)}, or unset it")
            return v
        return raw

    def get(self) -> Any:
        """The typed value (:attr:`default` while unset; an empty number, choice or path is unset
        too).

        Raises:
            EvtcError (:attr:`error`): the value doesn't parse.
        """
        raw = self.raw()
        if raw is None or (self.kind in ("number", "count", "text") and not raw.strip()):
            return self.default
        if self.kind == "choice" and not raw.strip():
            return self.default
        return self.parse(raw)

    def get_or_default(self) -> Any:
        """:meth:`get`, but the default where the value doesn't parse (for the error path, which
        must not raise another error)."""
        try:
            return self.get()
        except errors.EvtcError:
            return self.default

    def set(self, value: str | None) -> None:
        """Set (or with None unset) the variable for this process and its children."""
        if value is None:
            os.environ.pop(self.name, None)
        else:
            os.environ[self.name] = value

    @contextlib.contextmanager
    def scope(self, value: str | None) -> Iterator[None]:
        """The variable set to ``value`` (None: unset) inside the ``with`` block, restored after."""
        old = self.raw()
        self.set(value)
        try:
            yield
        finally:
            self.set(old)


def _flag(name, default, doc, **kw) -> Knob:
    return Knob(name, "flag", default, doc, **kw)


def _number(name, doc, error=errors.ConfigError) -> Knob:
    return Knob(name, "number", None, doc, error=error)


def _count(name, default, doc) -> Knob:
    return Knob(name, "count", default, doc)


def _choice(name, default, choices, doc, aliases=(), error=errors.ConfigError, hint=None) -> Knob:
    return Knob(name, "choice", default, doc, tuple(choices), tuple(aliases), error, hint)


def _text(name, doc, default=None) -> Knob:
    return Knob(name, "text", default, doc)


_ON_OFF = (("true", "1"), ("yes", "1"), ("on", "1"), ("false", "0"), ("no", "0"), ("off", "0"))
_MODES = ("auto", "always", "never")

# ---- the cache ---------------------------------------------------------------------------------
cache_dir = _text("EVTC_CACHE_DIR", "the kernel cache folder (default: $XDG_CACHE_HOME/evtc or ~/.cache/evtc)")
shared_cache = _text("EVTC_SHARED_CACHE", "a read-only cache shared by several users (takes precedence)")
cache_secret = _text("EVTC_CACHE_SECRET", "a file whose contents key the cache entries' HMACs")
cache_toolchain = _choice("EVTC_CACHE_TOOLCHAIN", "prefer", ("prefer", "strict"),
                          "'strict': use only kernels this machine's toolchain built", error=errors.CacheError)
lock_timeout = _number("EVTC_LOCK_TIMEOUT", "seconds to wait for another process's build of the same kernel",
                       error=errors.CacheError)
construct_memo = _flag("EVTC_CONSTRUCT_MEMO", True, "keep the passes', planner's and emitter's results on disk")
override_dir = _text("EVTC_OVERRIDE_DIR", "a folder of hand-edited <name>.cu that replace the emitted ones")
dump_dir = _text("EVTC_DUMP_DIR", "a folder to copy each built kernel's .cu, log and library into")
# ---- the compiler ------------------------------------------------------------------------------
nvcc = _text("EVTC_NVCC", "the nvcc to use ('none': no nvcc)")
nvcc_timeout = _number("EVTC_NVCC_TIMEOUT", "seconds before an nvcc is killed", error=errors.BuildError)
progress = _choice("EVTC_PROGRESS", "auto", ("auto", "0", "1"),
                   "build progress bars: 1 always, 0 never, auto on a terminal", aliases=_ON_OFF)
cutlass_path = _text("CUTLASS_PATH", "a CUTLASS checkout to use instead of the nvidia-cutlass wheel")
cuda_home = _text("CUDA_HOME", "the CUDA toolkit (bin/nvcc), before PATH")
cuda_path = _text("CUDA_PATH", "the CUDA toolkit, where CUDA_HOME is unset")
nvcc_ccbin = _text("NVCC_CCBIN", "nvcc's host compiler", default="gcc")
nvcc_prepend_flags = _text("NVCC_PREPEND_FLAGS", "flags nvcc itself prepends (part of the cache key)", "")
nvcc_append_flags = _text("NVCC_APPEND_FLAGS", "flags nvcc itself appends (part of the cache key)", "")
path = _text("PATH", "where nvcc and the host compiler are found", "")
cxx = _text("CXX", "the C++ compiler of the torch fast path's extension", "c++")
xdg_cache_home = _text("XDG_CACHE_HOME", "the user's cache folder, under which evtc/ is the default cache")
# ---- the passes --------------------------------------------------------------------------------
verify = _flag("EVTC_VERIFY", None, "verify the IR after every pass (tests set it)")
debug = _flag("EVTC_DEBUG", None, "debug mode: verification on unless EVTC_VERIFY says otherwise")
# ---- the call path -----------------------------------------------------------------------------
unaligned_staging = _choice("EVTC_UNALIGNED_STAGING", "auto", _MODES,
                            "padded staging of M x N rows TMA can't address: a cost model, always, never",
                            error=errors.ArgumentError,
                            hint="set EVTC_UNALIGNED_STAGING (or Gemm.unaligned_staging) to auto, always or never")
phase_split = _choice("EVTC_PHASE_SPLIT", "auto", _MODES, "the row-phase split of packed unaligned rows",
                      error=errors.ArgumentError,
                      hint="set EVTC_PHASE_SPLIT to auto, always or never (or unset it)")
packed_stores = _choice("EVTC_PACKED_STORES", "auto", _MODES, "the packed-store variant for packed outputs",
                        aliases=(("1", "always"), ("0", "never")), error=errors.ArgumentError,
                        hint="set EVTC_PACKED_STORES to auto, always or never (or unset it)")
torch_fastpath = _choice("EVTC_TORCH_FASTPATH", "1", ("0", "1", "sync"),
                         "the torch fast path: 1 built in the background, sync in the foreground, 0 off",
                         aliases=_ON_OFF)
autotune = _flag("EVTC_AUTOTUNE", False, "time the model's best candidates on a new shape bucket's first call")
batch_invariant = _flag("EVTC_BATCH_INVARIANT", False,
                        "Gemms default to batch_invariant=True: a row's bits independent of M, L, member and run")
max_specializations = _count("EVTC_MAX_SPECIALIZATIONS", 32,
                             "torch backend: shapes a symbolic graph is fused for; later ones run it unfused")
# ---- errors ------------------------------------------------------------------------------------
traceback = _choice("EVTC_TRACEBACK", "short", ("short", "full"),
                    "'full': keep evtc's frames in tracebacks (and the CLI prints them)",
                    aliases=(("1", "full"), ("true", "full"), ("on", "full"), ("0", "short"), ("", "short")))
no_color = _text("NO_COLOR", "set: no colour in the command line's output")
error_report = _text("EVTC_ERROR_REPORT", "tests/gpu: a JSON file for every output's error and bound")

#: every knob, in the order above
KNOBS: tuple[Knob, ...] = tuple(v for v in list(globals().values()) if isinstance(v, Knob))

#: the knobs a kernel build reads (checked before nvcc runs: :func:`evtc.compiler.cache.build`)
BUILD_KNOBS: tuple[Knob, ...] = (cache_toolchain, lock_timeout, nvcc_timeout, progress)
#: the knobs a call reads after its kernel is built (checked before the build: NOTE [Checks before
#: builds] in evtc/dispatch/dispatcher.py)
CALL_KNOBS: tuple[Knob, ...] = (unaligned_staging, phase_split, packed_stores, torch_fastpath)


def check(knobs: tuple[Knob, ...]) -> None:
    """Read each of ``knobs``, so that a value it doesn't take raises now, before the work that
    reads it later (a build of minutes).

    Raises:
        EvtcError (the knob's class): the first value that doesn't parse, naming the variable.
    """
    for k in knobs:
        k.get()


def table() -> list[dict[str, str]]:
    """One row per knob: name, kind, default, current value (or the error its value raises), doc."""
    rows = []
    for k in KNOBS:
        try:
            value = k.get()
            shown = "" if k.raw() is None else repr(value)
        except errors.EvtcError as e:
            shown = f"invalid: {e.args[0] if e.args else e}"
        rows.append({"name": k.name, "kind": k.kind + (f" ({'/'.join(k.choices)})" if k.choices else ""),
                     "default": "" if k.default is None else str(k.default), "value": shown, "doc": k.doc})
    return rows
