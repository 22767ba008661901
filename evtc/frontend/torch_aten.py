"""The table of torch ops: ATen ops -> evtc builder calls, shared by the importer and the backend.

Input: a ``call_function`` node of an ATen fx graph (with ``meta["val"]``) and the builder
values of its arguments. Output: its builder value, through its row of :data:`ATEN`
(:class:`Lowering`), or why the table can't lower it (:func:`unsupported_reason`), located at
the user's line. :mod:`evtc.frontend.torch_import` (functions written with torch ops) and
:mod:`evtc.torch.backend` (regions of a ``torch.compile`` graph) drive it.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Any, Callable

from evtc.errors import SourceLoc, UnsupportedOpError
from evtc.frontend.builder import IRBuilder, Pending

__all__ = ["ATEN", "Lowering", "Row", "supported_ops", "target_name", "unsupported_reason", "user_ops"]

_TORCH_HINT = ("the torch importer takes elementwise ops, sum/amax/amin/max/min over dim=1, dim=0 or all, "
               "torch.where, torch.clamp and .to(dtype); see docs/torch.md#epilogues-written-with-torch")


# ---------------------------------------------------------------------------------------------
# The table: ATen op -> evtc builder calls
# ---------------------------------------------------------------------------------------------


class _Refused(Exception):
    """A row refused its node (a variant evtc has no op for); the message says why."""


@dataclasses.dataclass(frozen=True)
class Row:
    """One row of :data:`ATEN`.

    Attributes:
        lower: ``lower(L, args, loc) -> value``: ``args`` are the node's arguments bound to the
            op's schema names (``self``, ``other``, ``dim``...), fx nodes already mapped to
            builder values; returns a builder value (a Node, a Pending reduction, a constant).
        check: ``check(args, node) -> reason | None`` on the raw, unmapped arguments (fx
            nodes, with their ``meta["val"]``): why this use of the op is not supported, or
            None. Rows whose every use is supported have none.
        doc: how the row reads in evtc terms, for the docs.
        reduction: the op reduces over ``dim``; which evtc axis that is depends on the caller
            (:meth:`Lowering.reduce_dim`), and an axis it has none for refuses the node.
    """

    lower: Callable[["Lowering", dict, SourceLoc | None], Any]
    check: Callable[[dict, Any], str | None] | None = None
    doc: str = ""
    reduction: bool = False


ATEN: dict[str, Row] = {}


def _row(names: str, lower, check=None, doc: str = "", reduction: bool = False) -> None:
    for name in names.split():
        if name in ATEN:
            raise ValueError(f"ATen op {name} is already in the table")
        ATEN[name] = Row(lower, check, doc, reduction)


def _call(op: str, *names: str):
    return lambda L, a, loc: L.b.call(op, tuple(a[n] for n in names), loc)


def _binary(op: str):
    def lower(L, a, loc):
        other = a["other"]
        if a.get("alpha", 1) != 1:
            other = L.b.binary("mul", other, a["alpha"], loc)
        return L.b.binary(op, a["self"], other, loc)
    return lower


def _rsub(L, a, loc):
    this = a["self"] if a.get("alpha", 1) == 1 else L.b.binary("mul", a["self"], a["alpha"], loc)
    return L.b.binary("sub", a["other"], this, loc)


def _clamp(lo_name: str, hi_name: str):
    def lower(L, a, loc):
        x = a["self"]
        if a.get(lo_name) is not None:
            x = L.b.call("maximum", (x, a[lo_name]), loc)
        if a.get(hi_name) is not None:
            x = L.b.call("minimum", (x, a[hi_name]), loc)
        return x
    return lower


def _gelu(L, a, loc):
    return L.b.call({"none": "gelu", "tanh": "gelu_tanh"}[a.get("approximate") or "none"], (a["self"],), loc)


def _gelu_check(a, node):
    approx = a.get("approximate") or "none"
    return None if approx in ("none", "tanh") else f"gelu(approximate={approx!r})"


def _to_copy(L, a, loc):
    dtype = a.get("dtype")
    return a["self"] if dtype is None else L.b.convert(a["self"], dtype, loc)


def _identity(L, a, loc):
    return a["self"]


def _shape(x) -> tuple | None:
    v = getattr(x, "meta", {}).get("val") if hasattr(x, "meta") else None
    return tuple(v.shape) if v is not None and hasattr(v, "shape") else None


def _unit_view_check(a, node):
    """Views are identities in an elementwise epilogue only when they add or remove size-1
    dimensions (``bias[None, :]``, ``scale.view(-1, 1)`` of an (M, 1) vector)."""
    before, after = _shape(a["self"]), _shape(node)
    if before is None or after is None:
        return "a view whose shapes are unknown"
    if [s for s in before if s != 1] != [s for s in after if s != 1]:
        return f"a view from shape {list(before)} to {list(after)} (it moves elements; an epilogue is elementwise)"
    return None


def _expand_check(a, node):
    before, after = _shape(a["self"]), _shape(node)
    if before is None or after is None:
        return "an expand whose shapes are unknown"
    return None  # a broadcast, which every evtc operation does by itself


def _constant(L, a, loc):
    return a["s"]


def _reduce_dim(a, node) -> tuple[Any, str | None]:
    """The evtc ``dim`` (1, 0 or None) of a torch reduction of an ``(M, N)`` (or per batch, an
    ``(L, M, N)``) tensor, or why there is none: the last axis is N, the one before it M."""
    shape = _shape(a["self"])
    rank = len(shape) if shape is not None else 2
    dims = a.get("dim")
    if dims is None or dims == []:
        dims = list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    if rank < 2:
        return None, f"a reduction of a {rank}-d tensor (evtc reduces M x N values)"
    norm = sorted({int(d) % rank for d in dims})
    m_axis, n_axis = rank - 2, rank - 1
    if any(d < m_axis for d in norm):
        return None, f"a reduction over a batch dimension (dim={dims}; evtc reduces over M, N or both)"
    if norm == [n_axis]:
        return 1, None
    if norm == [m_axis]:
        return 0, None
    return None, None


def _reduction(op: str):
    def lower(L, a, loc):
        return L.b.reduce(op, a["self"], L.reduce_dim(L.raw, L.node)[0], loc)
    return lower


def _reduction_check(a, node):
    if a.get("dtype") not in (None,) and not _is_f32(a.get("dtype")):
        return f"a reduction accumulating in {a['dtype']} (evtc accumulates in f32)"
    return None


def _is_f32(dtype) -> bool:
    return str(dtype) == "torch.float32"


class _MaxDim:
    """``aten.max.dim``'s (values, indices): only the values can be used."""

    def __init__(self, pending: Pending) -> None:
        self.pending = pending


def _max_dim(op: str):
    def lower(L, a, loc):
        return _MaxDim(L.b.reduce(op, a["self"], L.reduce_dim(L.raw, L.node)[0], loc))
    return lower


def _mean(L, a, loc):
    dim = L.reduce_dim(L.raw, L.node)[0]
    extent = L.extent(dim)
    return L.b.reduce("sum", L.b.binary("mul", a["self"], 1.0 / extent, loc), dim, loc)


def _getitem(L, a, loc):
    seq, idx = a["self"], a["idx"]
    if isinstance(seq, _MaxDim) and idx == 0:
        return seq.pending
    raise _Refused("the indices of max/min(dim=...) (evtc has no argmax)")


def _getitem_check(a, node):
    return None if a["idx"] == 0 else "the indices of max/min(dim=...) (evtc has no argmax)"


for _op in "relu sigmoid tanh silu hardswish exp log sqrt rsqrt abs erf neg".split():
    _row(f"aten.{_op}.default", _call(_op, "self"), doc=f"{_op}(x)")
_row("aten.gelu.default", _gelu, _gelu_check, "gelu(x) (approximate='none'), gelu_tanh(x) (approximate='tanh')")


def _backward(op: str, grad: str, arg: str, output: bool = False):
    """The ``aten.<act>_backward`` of a training graph through evtc's own derivative rule
    (:data:`evtc.frontend.vjp.RULES`): ``grad * act'(x)``, or from the forward's ``output``
    where ATen passes that (sigmoid, tanh)."""
    def lower(L, a, loc):
        from evtc.frontend.vjp import RULES, _Ops

        if op == "gelu":
            rule = RULES[{"none": "gelu", "tanh": "gelu_tanh"}[a.get("approximate") or "none"]]
        else:
            rule = RULES[op]
        x = a[arg]
        return rule(_Ops(L.b, loc), a[grad], x if output else None, None if output else x)[0]
    return lower


_row("aten.gelu_backward.default", _backward("gelu", "grad_output", "self"), _gelu_check,
     "grad * gelu'(x) (training graphs; evtc.frontend.vjp's rule)")
_row("aten.silu_backward.default", _backward("silu", "grad_output", "self"), doc="grad * silu'(x)")
_row("aten.sigmoid_backward.default", _backward("sigmoid", "grad_output", "output", output=True),
     doc="grad * y (1 - y), y the forward's output")
_row("aten.tanh_backward.default", _backward("tanh", "grad_output", "output", output=True),
     doc="grad * (1 - y^2), y the forward's output")
_row("aten.threshold_backward.default",
     lambda L, a, loc: L.b.call("where", (L.b.call("gt", (a["self"], a["threshold"]), loc), a["grad_output"], 0.0),
                                loc),
     doc="where(x > t, grad, 0) (relu's backward)")
_row("aten.reciprocal.default", lambda L, a, loc: L.b.binary("div", 1.0, a["self"], loc), doc="1.0 / x")
_row("aten.leaky_relu.default", _call("leaky_relu", "self", "negative_slope"), doc="leaky_relu(x, slope)")
_row("aten.hardtanh.default", _clamp("min_val", "max_val"), doc="minimum(maximum(x, lo), hi)")
_row("aten.clamp.default aten.clamp.Tensor", _clamp("min", "max"), doc="minimum(maximum(x, lo), hi)")
_row("aten.clamp_min.default aten.clamp_min.Tensor", _clamp("min", "-"), doc="maximum(x, lo)")
_row("aten.clamp_max.default aten.clamp_max.Tensor", _clamp("-", "max"), doc="minimum(x, hi)")
_row("aten.maximum.default", _call("maximum", "self", "other"), doc="maximum(a, b)")
_row("aten.minimum.default", _call("minimum", "self", "other"), doc="minimum(a, b)")
for _op in "add sub mul div".split():
    _row(f"aten.{_op}.Tensor aten.{_op}.Scalar", _binary(_op), doc=f"{_op}(a, b) (alpha: b * alpha)")
_row("aten.rsub.Tensor aten.rsub.Scalar", _rsub, doc="sub(b, a) (alpha: a * alpha)")
for _op in "gt ge lt le eq ne".split():
    _row(f"aten.{_op}.Tensor aten.{_op}.Scalar", _binary(_op), doc=f"{_op}(a, b): a 1.0/0.0 mask")
_row("aten.pow.Tensor_Scalar aten.pow.Tensor_Tensor",
     lambda L, a, loc: L.b.power(a["self"], a["exponent"], loc), doc="pow(x, c) (c a constant)")
_row("aten.pow.Scalar", lambda L, a, loc: L.b.power(a["self"], a["exponent"], loc), doc="pow(c, x)")
_row("aten.where.self", _call("where", "condition", "self", "other"), doc="where(cond, a, b)")
_row("aten._to_copy.default", _to_copy, doc="convert(x) : dtype (x.to(dtype), .half(), .bfloat16())")
_row("prims.convert_element_type.default", lambda L, a, loc: L.b.convert(a["a"], a["dtype"], loc),
     doc="convert(x) : dtype (the casts of Inductor's decompositions, in graphs after AOTAutograd)")
_row("aten.clone.default aten.alias.default aten.detach.default aten.lift_fresh_copy.default "
     "aten._local_scalar_dense.default", _identity, doc="x (no node)")
_row("aten.scalar_tensor.default", _constant, doc="the constant")
_row("aten.zeros_like.default", lambda L, a, loc: 0.0, doc="0.0 (broadcast by what uses it)")
_row("aten.ones_like.default", lambda L, a, loc: 1.0, doc="1.0 (broadcast by what uses it)")
_row("aten.full_like.default", lambda L, a, loc: a["fill_value"], doc="the fill value")
_row("aten.view.default aten._unsafe_view.default aten.reshape.default aten.unsqueeze.default aten.squeeze.dim "
     "aten.squeeze.default aten.squeeze.dims", _identity, _unit_view_check,
     doc="x, when only size-1 dimensions change")
_row("aten.expand.default", _identity, _expand_check, doc="x (evtc broadcasts by itself)")
_row("aten.sum.default aten.sum.dim_IntList", _reduction("sum"), _reduction_check, "reduce_sum(x, dim)", True)
_row("aten.amax.default aten.max.default", _reduction("max"), _reduction_check, "reduce_max(x, dim)", True)
_row("aten.amin.default aten.min.default", _reduction("min"), _reduction_check, "reduce_min(x, dim)", True)
_row("aten.max.dim", _max_dim("max"), _reduction_check, "reduce_max(x, dim) (.values only)", True)
_row("aten.min.dim", _max_dim("min"), _reduction_check, "reduce_min(x, dim) (.values only)", True)
_row("aten.mean.dim aten.mean.default", _mean, _reduction_check,
     "reduce_sum(mul(x, 1/extent), dim) (in the backend, where the extent is known)", True)
_row("getitem", _getitem, _getitem_check, "the values of max/min(dim=...)")
_row("evtc_import.op.default", lambda L, a, loc: L.b.call(a["name"], tuple(a["args"]), loc),
     doc="evtc.<op>(...) called on tensors in a torch-written epilogue: the evtc op itself")


_EVTC_OP = None


def _evtc_op():
    """``torch.ops.evtc_import.op(name, tensors)``: an ``evtc.<name>`` call inside a function the
    importer traces (``evtc.gelu_grad(F)`` has no torch op), recorded as one node that the row
    ``evtc_import.op.default`` turns back into the evtc op. Its fake implementation broadcasts;
    its eager one is the op's float64 reference (only reached if someone calls it directly)."""
    global _EVTC_OP
    if _EVTC_OP is None:
        import numpy as np
        import torch

        from evtc import ops

        def run(name: str, args: list[torch.Tensor]) -> torch.Tensor:
            ref = ops.get(name).numpy(*[a.detach().double().cpu().numpy() for a in args])
            return torch.as_tensor(np.asarray(ref), dtype=torch.float32)

        op = torch.library.custom_op("evtc_import::op", run, mutates_args=(),
                                     schema="(str name, Tensor[] args) -> Tensor")

        @op.register_fake
        def _(name, args):
            return args[0].new_empty(torch.broadcast_shapes(*[a.shape for a in args]), dtype=torch.float32)

        _EVTC_OP = op
    return _EVTC_OP


def _evtc_call(name: str, args: tuple):
    import torch

    op = _evtc_op()
    return op(name, [a if torch.is_tensor(a) else torch.tensor(float(a)) for a in args])


def supported_ops() -> list[str]:
    """The ATen ops of :data:`ATEN`, sorted (``aten.relu.default``, ...)."""
    return sorted(ATEN)


def target_name(node) -> str:
    """The table key of an fx node's target: ``aten.relu.default``, ``getitem``, or its repr."""
    t = node.target
    if getattr(t, "__module__", None) == "_operator":
        return t.__name__
    return str(t)


def _bind(node) -> dict:
    """The node's arguments by schema name (defaults filled in); ``getitem``: self, idx."""
    if target_name(node) == "getitem":
        return {"self": node.args[0], "idx": node.args[1]}
    schema = node.target._schema
    out = {}
    for i, arg in enumerate(schema.arguments):
        if i < len(node.args):
            out[arg.name] = node.args[i]
        elif arg.name in node.kwargs:
            out[arg.name] = node.kwargs[arg.name]
        elif arg.has_default_value():
            out[arg.name] = arg.default_value
        else:
            out[arg.name] = None
    return out


#: the reason :func:`unsupported_reason` gives for an op the table has no row for
_NO_ROW = "not in the table of torch ops"


def unsupported_reason(node, *, extents_known: bool = False, reduce_dim=_reduce_dim) -> str | None:
    """Why the ATen fx ``node`` can't be lowered by :data:`ATEN` (None: it can).

    Args:
        node: a ``call_function`` node of an ATen graph (with ``meta["val"]``).
        extents_known: the caller knows the extents of reductions (the backend); ``mean``
            needs them.
        reduce_dim: ``reduce_dim(args, node) -> (dim, why)``, the evtc axis of a reduction
            (:meth:`Lowering.reduce_dim`).
    """
    name = target_name(node)
    row = ATEN.get(name)
    if row is None:
        if re.search(r"[a-z0-9]_\.\w+$", name):
            return f"the in-place op {name.split('.')[1]} (write x = torch.{name.split('.')[1][:-1]}(x) instead)"
        if name.split(".")[1:2] in (["permute"], ["transpose"], ["t"], ["numpy_T"], ["mT"]):
            # (acc.T named 'torch op aten.permute.default', an op the user did not write)
            return ("a transpose (.T, .t(), permute, transpose): an epilogue computes each element of the "
                    "M x N tile in place; transpose the GEMM's operands instead (B.T as B)")
        return _NO_ROW
    if "mean" in name and not extents_known:
        return "mean (the importer does not know the extent: return the sum and divide it by N outside)"
    try:
        args = _bind(node)
        why = row.check(args, node) if row.check is not None else None
        if why is None and row.reduction:
            why = reduce_dim(args, node)[1]
        return why
    except Exception as e:  # noqa: BLE001 - a check that can't read the node refuses it
        return f"this use of it ({type(e).__name__}: {e})"


# ---------------------------------------------------------------------------------------------
# Lowering fx nodes with the table
# ---------------------------------------------------------------------------------------------


class Lowering:
    """Lowers ATen fx nodes to builder calls through :data:`ATEN`.

    Args:
        builder: the :class:`~evtc.frontend.builder.IRBuilder` of the epilogue.
        env: fx node -> builder value for the nodes already mapped (inputs first).
        loc_of: fx node -> its :class:`~evtc.errors.SourceLoc` (the user's line), or None.
        extent: ``extent(node, dim)``: the number of elements a ``mean`` over evtc ``dim``
            divides by (the backend knows it; the importer gives None and refuses ``mean``).
        reduce_dim: ``reduce_dim(args, node) -> (dim, why)``: the evtc axis of a reduction
            (default: the last axis is N, the one before it M, any before that a batch, refused;
            the backend passes its own, where leading axes may all be M).
    """

    def __init__(self, builder: IRBuilder, env: dict, loc_of: Callable[[Any], SourceLoc | None],
                 extent: Callable[[Any, Any], int] | None = None,
                 reduce_dim: Callable[[dict, Any], tuple[Any, str | None]] | None = None) -> None:
        self.b = builder
        self.env = env
        self.loc_of = loc_of
        self._extent = extent
        self._reduce_dim = reduce_dim or _reduce_dim
        #: the node being lowered and its unmapped arguments (rows that need shapes read them)
        self.node = None
        self.raw: dict = {}
        self._loc: SourceLoc | None = None

    def reduce_dim(self, args: dict, node) -> tuple[Any, str | None]:
        """The evtc ``dim`` (1, 0 or None) of the reduction ``node`` (its unmapped ``args``), or
        why it has none (see the ``reduce_dim`` argument)."""
        return self._reduce_dim(args, node)

    def extent(self, dim) -> int:
        """The number of elements the reduction of the current node over evtc ``dim`` takes."""
        if self._extent is None:
            raise _Refused("mean (the extent it divides by is unknown)")
        return self._extent(self.node, dim)

    def value(self, x: Any) -> Any:
        """The builder value of an fx argument: a mapped node, a number, a list of them."""
        if isinstance(x, (list, tuple)):
            return type(x)(self.value(v) for v in x)
        if hasattr(x, "op") and hasattr(x, "target") and hasattr(x, "users"):
            v = self.env[x]
            # A reduction used by this node: the error (it can only be an output) points here.
            return v.at(self._loc) if isinstance(v, Pending) else v
        return x

    def lower(self, node) -> Any:
        """Lower one ``call_function`` node (its inputs already in ``env``) and record its value.

        Raises:
            UnsupportedOpError: the node has no row, or its row refuses it, located at the
                node's user line; and whatever the builder raises (located the same way).
        """
        loc = self._loc = self.loc_of(node)
        why = unsupported_reason(node, extents_known=self._extent is not None, reduce_dim=self.reduce_dim)
        if why is not None:
            self._refuse(node, None if why is _NO_ROW else why, loc)
        name = target_name(node)
        self.node, self.raw = node, _bind(node)
        args = {k: self.value(v) for k, v in self.raw.items()}
        try:
            out = ATEN[name].lower(self, args, loc)
        except _Refused as e:
            self._refuse(node, str(e), loc)
        self.env[node] = out
        return out

    def _refuse(self, node, why: str | None, loc: SourceLoc | None):
        name = target_name(node)
        if why is None and getattr(node.target, "__module__", None) == "_operator":
            # Python arithmetic on a number read out of a tensor (alpha.item() * 3): "torch op mul
            # has no evtc lowering" named an op the table has
            raise UnsupportedOpError(f"Python {name} on a number read out of a tensor (.item(), float(), int()): "
                                     "the epilogue's values are traced as tensors", loc=loc,
                                     epilogue=self.b.epilogue,
                                     hint="compute with the tensor itself (alpha * 3, not alpha.item() * 3)")
        message = f"torch op {name} has no evtc lowering" if why is None else f"evtc can't lower {why} ({name})"
        raise UnsupportedOpError(message, loc=loc, epilogue=self.b.epilogue,
                                 hint=f"{_TORCH_HINT}; supported: {', '.join(user_ops())}")


#: ATen ops of the table that are plumbing, not something a user writes
_PLUMBING = {"_local_scalar_dense", "_to_copy", "_unsafe_view", "alias", "clone", "detach", "expand",
             "lift_fresh_copy", "scalar_tensor", "reshape", "squeeze", "unsqueeze", "view", "rsub"}


def user_ops() -> list[str]:
    """The torch functions the table lowers, by their ATen names (``relu``, ``amax``...), without
    the plumbing (views, copies, constants)."""
    return sorted({k.split(".")[1] for k in ATEN if k.startswith("aten.")} - _PLUMBING)
