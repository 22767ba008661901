"""``@evtc.epilogue``: the object a user's epilogue function becomes.

Input: a Python function. Output: :class:`Epilogue`, which traces lazily (per C/D dtype) into a
Graph and still runs eagerly when called on tensors.

Two frontends read a function: evtc's tracer (:mod:`evtc.frontend.trace`: ``evtc.relu``,
``evtc.sum``...) and the torch importer (:mod:`evtc.frontend.torch_import`: ``torch.relu``,
``x.amax(dim=1)``...). ``frontend="auto"`` (the default) traces with evtc's tracer and, when the
function calls a torch function or a ``torch.Tensor`` method on a traced value (and torch is
installed), imports it with the torch importer instead; ``"evtc"`` and ``"torch"`` pick one.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from evtc import dtypes
from evtc.dtypes import DType
from evtc.errors import EpilogueSignatureError, EvtcError, api_boundary
from evtc.frontend.trace import default_name, signature_kinds, trace
from evtc.ir.graph import Graph


class Epilogue:
    """An epilogue function, traced on demand.

    Attributes:
        fn: the original function; calling the Epilogue calls it (eagerly, on tensors).
        name: the epilogue's name, used in errors, the IR and the emitted code: ``name=`` or
            the function's name (:func:`~evtc.frontend.trace.default_name`). It must be an
            identifier that can reach C++ (:mod:`evtc.ir.names`); tracing checks it.

    Example::

        @evtc.epilogue
        def bias_relu(acc, C, alpha: float, beta: float, bias: evtc.RowVector[evtc.f32]):
            return evtc.relu(alpha * acc + beta * C + bias)

        print(bias_relu.graph)              # the canonical IR text
        bias_relu.trace(c=evtc.f16, d=evtc.f16)

        @evtc.epilogue                      # written with torch ops: imported through torch.fx
        def bias_gelu(acc, bias: evtc.RowVector[evtc.f32]):
            return torch.nn.functional.gelu(acc + bias, approximate="tanh")
    """

    def __init__(self, fn: Callable, *, name: str | None = None, c: DType | str | None = None,
                 d: DType | str = dtypes.bf16, frontend: str = "auto") -> None:
        if not callable(fn):
            raise EpilogueSignatureError(f"evtc.epilogue takes a function, not {type(fn).__name__} {fn!r:.40}",
                                         hint="decorate a def (or pass a lambda) whose parameters are the inputs")
        if frontend not in FRONTENDS:
            raise EpilogueSignatureError(f"frontend={frontend!r} is not one of {', '.join(map(repr, FRONTENDS))}",
                                         hint="'auto' reads evtc.* and torch epilogues; 'evtc' or 'torch' picks one")
        functools.update_wrapper(self, fn)  # first: it copies fn.__dict__, which must not hide ours
        self.fn = fn
        self.name = name or default_name(fn)
        self.default_c = dtypes.coerce(c, "c") if c is not None else None
        self.default_d = dtypes.coerce(d, "d")
        self.frontend = frontend
        self._cache: dict[tuple, Graph] = {}

    @api_boundary
    def trace(self, *, c: DType | str | None = None, d: DType | str | None = None) -> Graph:
        """The traced Graph for these dtypes of C and D (cached).

        Args:
            c: dtype of C when the function takes ``C`` without annotating it (default: ``d``).
            d: dtype of M x N outputs without an explicit ``.to(dtype)``, and of bare
                ``evtc.Matrix`` inputs (default: the decorator's ``d``, else bf16).

        Raises:
            EpilogueSignatureError, TraceError, EpilogueTypeError: located at the user's line;
            UnsupportedOpError: a torch op the torch importer can't lower, at its line.
        """
        dd = dtypes.coerce(d, "d") if d is not None else self.default_d
        cc = dtypes.coerce(c, "c") if c is not None else (self.default_c or dd)
        key = (cc, dd)
        if key not in self._cache:
            self._cache[key] = self._trace(cc, dd)
        return self._cache[key]

    def _trace(self, c: DType, d: DType) -> Graph:
        if self.frontend == "torch":
            return _import_torch(self.fn, c=c, d=d, name=self.name)
        try:
            return trace(self.fn, c=c, d=d, name=self.name)
        except EvtcError as err:
            if self.frontend == "auto" and getattr(err, "torch_written", False):
                return _import_torch(self.fn, c=c, d=d, name=self.name)
            raise

    @property
    @api_boundary
    def graph(self) -> Graph:
        """The Graph traced with the default dtypes."""
        return self.trace()

    @property
    @api_boundary
    def parameters(self) -> list[tuple[str, Any]]:
        """(name, kind) of each parameter, in order."""
        return signature_kinds(self.fn, self.name)

    def __call__(self, *args, **kwargs):
        return self.fn(*args, **kwargs)

    def __str__(self) -> str:
        return str(self.graph)

    def __repr__(self) -> str:
        return f"<evtc.Epilogue {self.name}>"


def _import_torch(fn: Callable, **kw) -> Graph:
    from evtc.frontend.torch_import import import_torch

    return import_torch(fn, **kw)


#: the values of ``frontend=``
FRONTENDS = ("auto", "evtc", "torch")


def epilogue(fn: Callable | None = None, *, name: str | None = None, c: DType | str | None = None,
             d: DType | str = dtypes.bf16, frontend: str = "auto"):
    """Decorator that turns a function into an :class:`Epilogue`.

    Usable bare (``@evtc.epilogue``) or with options (``@evtc.epilogue(d=evtc.f16)``,
    ``evtc.epilogue(fn, frontend="torch")``).

    Args:
        frontend: ``"auto"`` (evtc's tracer; a function that calls torch on its values is
            imported with the torch importer), ``"evtc"`` (the tracer only) or ``"torch"`` (the
            torch importer, :mod:`evtc.frontend.torch_import`; needs torch).

    Raises:
        EpilogueSignatureError: ``fn`` is not callable, or ``frontend`` is not one of the three.
    """
    if fn is None:
        return lambda f: Epilogue(f, name=name, c=c, d=d, frontend=frontend)
    return Epilogue(fn, name=name, c=c, d=d, frontend=frontend)
