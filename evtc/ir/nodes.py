"""The node kinds of the epilogue IR: a small closed vocabulary.

Input: nothing (this module defines the vocabulary). Output: the frozen node classes.

One frozen, slotted dataclass per kind, named with CUTLASS's terms (and the EVT paper's):

=================  ====================================================  ======================
kind               meaning                                               CUTLASS sm90 visitor
=================  ====================================================  ======================
Accumulator        the GEMM accumulator tile ``acc`` (f32)                ``Sm90AccFetch``
Source             the source matrix ``C`` loaded by the collective       ``Sm90SrcFetch``
ScalarBroadcast    a runtime scalar (by value or device pointer)          ``Sm90ScalarBroadcast``
RowBroadcast       a length-N vector, the same for every row              ``Sm90RowBroadcast``
ColBroadcast       a length-M vector, the same for every column           ``Sm90ColBroadcast``
AuxLoad            another M x N input                                    ``Sm90AuxLoad``
Immediate          a compile-time constant                                (evtc ``Sm90Immediate``)
Compute            an elementwise op from the op table (``evtc.ops``)     ``Sm90Compute``
Store              an M x N output (D or an aux store)                    collective / ``Sm90AuxStore``
Reduction          an output reduced over N (row), M (column) or both     ``Sm90ColReduction``...
GroupScale         the scales of a per-token-group quantized D            (evtc ``Sm90GroupQuant``)
=================  ====================================================  ======================

Operand order lives in the node (``inputs`` is an ordered tuple), never in graph edge
weights, so ``x * x`` is simply ``Compute("mul", (x, x))``. Nodes compare by identity;
:class:`evtc.ir.graph.GraphBuilder` hash-conses them so that one graph never holds two
structurally equal nodes, and :meth:`evtc.ir.graph.Graph.__eq__` compares graphs by their
canonical text. ``loc`` (the user's source line) is carried along but never compared.

Shapes are not carried as numbers: every value has a *broadcast class* (see :class:`Bcast`),
M x N for matrices, M for column vectors, N for row vectors, scalar for scalars. Reductions
turn an M x N value into an M (``dim=1``, a *row reduction*: one value per row), N (``dim=0``,
a *column reduction*) or scalar (``dim=None``) output.
"""

from __future__ import annotations

import dataclasses
import math
import enum
from typing import Any, ClassVar

from evtc.dtypes import DType
from evtc.errors import SourceLoc


class Bcast(enum.Enum):
    """Broadcast class of a value: which of the M and N extents it varies along."""

    SCALAR = "scalar"
    ROW = "row"  # varies along N: a length-N row vector broadcast down the M rows
    COL = "col"  # varies along M: a length-M column vector broadcast across the N columns
    MN = "mn"

    def join(self, other: "Bcast") -> "Bcast":
        """The class of an elementwise result of two values of classes self and other."""
        if self is other:
            return self
        if self is Bcast.SCALAR:
            return other
        if other is Bcast.SCALAR:
            return self
        return Bcast.MN


# repr=False: every kind shares Node.__repr__, which shows inputs by kind and name only (the
# generated repr would recurse down the whole graph, and a 2000-node chain exhausts the stack).
_SLOTS = dict(frozen=True, eq=False, slots=True, repr=False)


class _Memo:
    """Slots for what a node derives from its fields, computed once per node (not dataclass
    fields: they take no part in construction, ``dataclasses.replace``, ``key()`` or ``repr``).

    ``_bcast`` is set at construction from the inputs' own (already computed) classes, so it
    costs O(arity) per node and no walk of the graph: a chain of reuse like ``x = x + gelu(x)``
    repeated n times is O(n), not O(2^n) (issue 10). ``_depth`` is set the same way, from the
    inputs' own depths (the epilogue's size limits read it: :mod:`evtc.ir.limits`). ``_key`` is
    filled on first use.
    """

    __slots__ = ("_bcast", "_key", "_depth")


def _rebuild(cls: type, fields: dict) -> "Node":
    """Unpickle/copy a node by constructing it again, so its memo slots are recomputed."""
    return cls(**fields)


@dataclasses.dataclass(**_SLOTS)
class Node(_Memo):
    """Base of all node kinds.

    Attributes:
        dtype: the element type the value is produced in (compute nodes produce f32 unless
            they are conversions; stores and reductions have their output dtype).
        loc: where the user wrote it; excluded from comparisons and hashing.
    """

    dtype: DType
    loc: SourceLoc | None = dataclasses.field(default=None, kw_only=True, repr=False)

    #: short name of the kind in the canonical text form
    kind: ClassVar[str] = "node"

    def __post_init__(self) -> None:
        object.__setattr__(self, "_bcast", self._derive_bcast())
        object.__setattr__(self, "_depth", self._derive_depth())

    def _derive_depth(self) -> int:
        """One more than the deepest input (an input or constant is 0): O(arity), no walk."""
        return 1 + max((i._depth for i in self.inputs), default=0)

    @property
    def depth(self) -> int:
        """The longest chain of computes and outputs from an input to this node (an input or a
        constant is 0, ``relu(acc)`` 1): how deeply CUTLASS nests its visitor types."""
        return self._depth

    def _derive_bcast(self) -> Bcast | None:
        """The broadcast class from the fields (None for the abstract bases)."""
        return None

    @property
    def inputs(self) -> tuple["Node", ...]:
        return ()

    @property
    def bcast(self) -> Bcast:
        """The broadcast class of the value (computed once, at construction)."""
        b = self._bcast
        if b is None:
            raise NotImplementedError(f"{type(self).__name__} has no broadcast class")
        return b

    def key(self) -> tuple:
        """Structural identity, with inputs by object id (used for hash-consing); computed once."""
        try:
            return self._key
        except AttributeError:
            key = self._derive_key()
            object.__setattr__(self, "_key", key)
            return key

    def _derive_key(self) -> tuple:
        fields = tuple(
            getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("loc", "inputs", "input")
        )
        return (type(self).__name__, fields, tuple(id(i) for i in self.inputs))

    def __reduce__(self):
        return (_rebuild, (type(self), {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}))

    def __repr__(self) -> str:
        """The fields as a dataclass shows them, but inputs only by kind and name
        (``Compute(dtype=f32, op='relu', args=(<Accumulator acc>,), attrs=())``): one node, never
        the graph below it."""
        parts = []
        for f in dataclasses.fields(self):
            if not f.repr:
                continue
            v = getattr(self, f.name)
            if isinstance(v, Node):
                text = v._brief()
            elif f.name == "args" and isinstance(v, tuple):
                text = "(" + ", ".join(a._brief() if isinstance(a, Node) else repr(a) for a in v) + \
                    ("," if len(v) == 1 else "") + ")"
            else:
                text = repr(v)
            parts.append(f"{f.name}={text}")
        return f"{type(self).__name__}({', '.join(parts)})"

    def _brief(self) -> str:
        """``<Accumulator acc>``, ``<Compute relu>``, ``<Immediate 2.0>``: a node inside
        another's repr."""
        what = getattr(self, "name", "") or getattr(self, "op", "") or repr(getattr(self, "value", ""))
        return f"<{type(self).__name__} {what}>"


# ---- leaves: inputs of the epilogue ---------------------------------------------------------


@dataclasses.dataclass(**_SLOTS)
class Leaf(Node):
    """A value that comes from outside the epilogue. ``name`` is the parameter name."""

    name: str = ""
    #: how the leaf broadcasts over the M x N tile (each leaf class sets it; None: the abstract base)
    leaf_bcast: ClassVar[Bcast | None] = None

    def _derive_depth(self) -> int:
        return 0

    def _derive_bcast(self) -> Bcast | None:
        return self.leaf_bcast

    @property
    def is_tensor(self) -> bool:
        """True for inputs the caller passes as device tensors (or device scalar pointers)."""
        return True


@dataclasses.dataclass(**_SLOTS)
class Accumulator(Leaf):
    kind: ClassVar[str] = "accumulator"
    leaf_bcast: ClassVar[Bcast] = Bcast.MN

    @property
    def is_tensor(self) -> bool:
        return False


@dataclasses.dataclass(**_SLOTS)
class Source(Leaf):
    """The source matrix C (M x N), loaded by the collective epilogue on sm90."""

    kind: ClassVar[str] = "source"
    leaf_bcast: ClassVar[Bcast] = Bcast.MN


@dataclasses.dataclass(**_SLOTS)
class ScalarBroadcast(Leaf):
    """A runtime scalar. ``by_pointer`` scalars are read from device memory (one per batch)."""

    by_pointer: bool = False
    kind: ClassVar[str] = "scalar"
    leaf_bcast: ClassVar[Bcast] = Bcast.SCALAR

    @property
    def is_tensor(self) -> bool:
        return self.by_pointer


@dataclasses.dataclass(**_SLOTS)
class RowBroadcast(Leaf):
    """A length-N vector broadcast along M (CUTLASS ``RowBroadcast``), e.g. a bias ``bias[n]``."""

    kind: ClassVar[str] = "row"
    leaf_bcast: ClassVar[Bcast] = Bcast.ROW


@dataclasses.dataclass(**_SLOTS)
class ColBroadcast(Leaf):
    """A length-M vector broadcast along N (CUTLASS ``ColBroadcast``), e.g. ``scale[m]``."""

    kind: ClassVar[str] = "col"
    leaf_bcast: ClassVar[Bcast] = Bcast.COL


@dataclasses.dataclass(**_SLOTS)
class AuxLoad(Leaf):
    """Another M x N input tensor (a residual, a saved pre-activation)."""

    kind: ClassVar[str] = "aux"
    leaf_bcast: ClassVar[Bcast] = Bcast.MN


@dataclasses.dataclass(**_SLOTS)
class Immediate(Node):
    """A compile-time constant, held in float64 and emitted in the compute dtype."""

    value: float = 0.0
    kind: ClassVar[str] = "const"

    def _derive_depth(self) -> int:
        return 0

    def _derive_bcast(self) -> Bcast:
        return Bcast.SCALAR

    def _derive_key(self) -> tuple:
        # the value by what it computes: every NaN is one constant (float('nan') != itself, so two
        # NaN literals would never merge), and 0.0 and -0.0 are two (they compare equal)
        return (type(self).__name__, (self.dtype, const_identity(self.value)), ())


def const_identity(value: float) -> tuple:
    """A constant's identity for merging and ordering: ``(is NaN, value, sign)``, so that every
    NaN is one constant and 0.0 and -0.0 are two; totally ordered (no NaN compares)."""
    v = float(value)
    if math.isnan(v):
        return (1, 0.0, 1.0)
    return (0, v, math.copysign(1.0, v))


# ---- interior nodes ---------------------------------------------------------------------------


@dataclasses.dataclass(**_SLOTS)
class Compute(Node):
    """An elementwise op of the op table applied to ordered inputs.

    Attributes:
        op: the op's name in :mod:`evtc.ops` (``add``, ``relu``, ``convert``...).
        args: the ordered operands.
        attrs: constant attributes as sorted (name, value) pairs, e.g. ``(("exponent", 2.0),)``.
    """

    op: str = ""
    args: tuple[Node, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()
    kind: ClassVar[str] = "compute"

    @property
    def inputs(self) -> tuple[Node, ...]:
        return self.args

    def _derive_bcast(self) -> Bcast:
        out = Bcast.SCALAR
        for a in self.args:
            out = out.join(a.bcast)  # the argument's stored class: O(arity), no walk
        return out

    def attr(self, name: str, default: Any = None) -> Any:
        for k, v in self.attrs:
            if k == name:
                return v
        return default

    def _derive_key(self) -> tuple:
        return ("Compute", self.op, self.dtype, self.attrs, tuple(id(a) for a in self.args))


# ---- outputs ---------------------------------------------------------------------------------


@dataclasses.dataclass(**_SLOTS)
class Output(Node):
    """Base of the nodes that write a result of the epilogue. ``name`` is the output name."""

    name: str = ""
    value: Node | None = None

    @property
    def inputs(self) -> tuple[Node, ...]:
        return (self.value,) if self.value is not None else ()

    def _derive_key(self) -> tuple:
        fields = tuple(
            getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("loc", "value")
        )
        return (type(self).__name__, fields, (id(self.value),))


@dataclasses.dataclass(**_SLOTS)
class Store(Output):
    """An M x N output: D (stored by the collective on sm90) or an aux store. The store of a
    ``glu`` value (:func:`is_gated`) is M x N/2: one column per (gate, up) pair."""

    kind: ClassVar[str] = "store"

    def _derive_bcast(self) -> Bcast:
        return Bcast.MN

    def columns(self, N: int) -> int:
        """Its columns for a GEMM of N columns: N, or N // 2 for a gated store."""
        return N // 2 if is_gated(self) else N


#: the activations a ``glu`` (``evtc.glu``) may apply to the gate: unary ops of the table
#: (evtc.ops) that are elementwise math, not plumbing
GLU_EXCLUDED_OPS = ("convert", "group_quant", "glu", "first")


def glu_acts() -> list[str]:
    """The names ``evtc.glu``'s act may take: the unary ops of the table but plumbing, sorted."""
    from evtc import ops

    return sorted(n for n, o in ops.OPS.items() if o.arity == 1 and n not in GLU_EXCLUDED_OPS)


def is_glu_act(act: Any) -> bool:
    """Whether ``act`` names an activation ``evtc.glu`` takes (:func:`glu_acts`)."""
    from evtc import ops

    o = ops.OPS.get(act) if isinstance(act, str) else None
    return o is not None and o.arity == 1 and act not in GLU_EXCLUDED_OPS


def is_gated(out: Node) -> bool:
    """Whether ``out`` is the store of a ``glu`` value: an M x N/2 output whose column j is
    ``act(y[:, 2j]) * y[:, 2j + 1]`` (NOTE [The gated epilogue] in include/evtc/sm90_glu_store.hpp)."""
    v = getattr(out, "value", None)
    return isinstance(out, Store) and isinstance(v, Compute) and v.op == "glu"


class ReduceOp(str, enum.Enum):
    """Reduction operators, with their identities (the value outputs are initialised to)."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"

    @property
    def identity(self) -> float:
        return {"sum": 0.0, "max": float("-inf"), "min": float("inf")}[self.value]


class ReduceAxis(enum.Enum):
    """Which extents a reduction reduces (see the module docstring)."""

    ROW = 1
    COLUMN = 0
    SCALAR = None

    @classmethod
    def of(cls, dim: int | None) -> "ReduceAxis":
        """The axis of a Reduction's ``dim`` (1, 0 or None)."""
        return cls(dim)

    @property
    def dim(self) -> int | None:
        return self.value

    @property
    def word(self) -> str:
        """``row reduction``, ``column reduction`` or ``scalar reduction``."""
        return {1: "row reduction", 0: "column reduction", None: "scalar reduction"}[self.value]

    @property
    def bcast(self) -> Bcast:
        """Broadcast class of the result: a row reduction gives one value per row (a column
        vector, varying along M)."""
        return {1: Bcast.COL, 0: Bcast.ROW, None: Bcast.SCALAR}[self.value]

    @property
    def extent(self) -> str | None:
        """The extent of the result: ``"M"``, ``"N"`` or None (a scalar)."""
        return {1: "M", 0: "N", None: None}[self.value]

    def shape(self, M: int, N: int) -> tuple[int, ...]:
        """Shape of one batch of the result for an M x N tile of values."""
        return {1: (M,), 0: (N,), None: ()}[self.value]

    @property
    def numpy_axis(self) -> int | tuple[int, int]:
        """Axis argument of ``np.sum`` etc. on an ``(L, M, N)`` array."""
        return {1: 2, 0: 1, None: (1, 2)}[self.value]

    @property
    def torch_dims(self) -> tuple[int, ...]:
        """Dims to reduce of an ``(..., M, N)`` tensor."""
        return {1: (-1,), 0: (-2,), None: (-2, -1)}[self.value]

    def transposed(self) -> "ReduceAxis":
        """The axis of the same reduction on the transposed problem (swap-AB)."""
        return {ReduceAxis.ROW: ReduceAxis.COLUMN, ReduceAxis.COLUMN: ReduceAxis.ROW}.get(self, self)


@dataclasses.dataclass(**_SLOTS)
class Reduction(Output):
    """A reduction output.

    Attributes:
        op: sum, max or min; accumulation is in f32 whatever ``dtype`` is.
        dim: 1 reduces over N (a *row reduction*, one value per row: length M), 0 reduces over
            M (a *column reduction*: length N), None reduces over both (a scalar per batch).
    """

    op: ReduceOp = ReduceOp.SUM
    dim: int | None = None
    kind: ClassVar[str] = "reduce"
    #: whether tiles combine their partials (through the workspace or atomics); a
    #: :class:`GroupScale` is whole inside one epilogue subtile
    cross_tile: ClassVar[bool] = True

    def _derive_bcast(self) -> Bcast | None:
        try:
            return ReduceAxis(self.dim).bcast
        except ValueError:  # a malformed dim (the verifier reports it)
            return None

    @property
    def axis(self) -> "ReduceAxis":
        """The :class:`ReduceAxis` of ``dim``."""
        return ReduceAxis(self.dim)

    @property
    def role(self) -> str:
        return self.axis.word

    @property
    def atomic_capable(self) -> bool:
        """A row or column max or min into f32: what the sm90 planner may reduce across tiles with
        ``red.global`` atomics instead of the workspace (NOTE [Atomic row and column max] in
        evtc/plan/sm90_buffers.py; PTX ISA, ``red``: max/min on 32-bit integers, which order IEEE floats
        of one sign)."""
        return self.cross_tile and self.dim in (0, 1) and self.op in (ReduceOp.MAX, ReduceOp.MIN) \
            and self.dtype.name == "f32"

    @property
    def atomic_sum_capable(self) -> bool:
        """A row or column sum into f32: what the sm90 planner reduces across tiles with float
        ``red.global.add`` atomics when a configuration asks for it (``GemmConfig.atomic_reductions
        = True``; never by default: float adds in the order the tiles finish are not bit-for-bit
        reproducible, NOTE [Atomic row and column sums] in evtc/plan/config.py)."""
        return self.cross_tile and self.dim in (0, 1) and self.op is ReduceOp.SUM and self.dtype.name == "f32"


#: the per-token-group quantizations :class:`GroupScale` knows (NOTE [Per-token-group
#: quantization conventions] in evtc/testing/quant.py gives each one's f32 operations and source)
QUANT_CONVENTIONS = ("vllm", "sglang", "deepgemm")
#: the group sizes (elements of a row per scale) the sm90 epilogue quantizes: one epilogue
#: subtile's N (NOTE [Per-token-group quantization in the epilogue], evtc/plan/sm90_space.py)
QUANT_GROUPS = (32, 64, 128)
#: how a GroupScale's (M, G) grid lies in memory (:class:`evtc.testing.quant.ScaleLayout`'s values
#: that sm90 writes): row-major (M, G), or DeepGEMM's column-major one with M padded to 4
QUANT_SCALE_LAYOUTS = ("row_major", "col_major_tma")


@dataclasses.dataclass(**_SLOTS)
class GroupScale(Reduction):
    """The f32 scales of a per-token-group quantized output: one per 1 x ``group`` group of a
    row, shape (M, ceil(N / group)) per batch, in ``layout``. ``value`` is the ``group_quant``
    :class:`Compute` whose result D is; ``evtc.quantize`` makes the pair.

    It is a row reduction (a max of ``abs`` over each group of a row, then the convention's
    scale), so the machinery of reductions carries it (an output that is not M x N, no value
    inside the epilogue), but the kernel computes it inside one epilogue subtile, with no
    workspace, and the quantization of D's subtile waits for it
    (``include/evtc/sm90_group_quant.hpp``).

    Attributes:
        group: elements per group (:data:`QUANT_GROUPS`).
        convention: :data:`QUANT_CONVENTIONS`.
        layout: :data:`QUANT_SCALE_LAYOUTS`: part of the output's type (what evtc allocates and
            what a caller's ``out=`` must be); the kernel writes either through run-time strides.
    """

    group: int = 128
    convention: str = "vllm"
    layout: str = "row_major"
    kind: ClassVar[str] = "group_scale"
    #: no tile combines with another: no workspace, no atomics, so every decomposition (stream-K,
    #: split-K: the epilogue runs once per tile on the reduced accumulator) and every epilogue class
    #: rule treats the quantization like a pointwise epilogue
    cross_tile: ClassVar[bool] = False

    def groups(self, N: int) -> int:
        """G = ceil(N / group), the scales per row."""
        return -(-N // self.group)

    def strides(self, M: int, N: int) -> tuple[int, int]:
        """(row stride, group stride) of the (M, G) grid in elements (:func:`scale_grid_strides`)."""
        return scale_grid_strides(self.layout, M, self.groups(N))

    def tensor_strides(self, M: int, N: int, batched: bool) -> tuple[int, ...]:
        """The strides (elements) of the (M, G) grid, or of (L, M, G) with batches one
        :meth:`storage` apart: what evtc allocates and the test helpers poison."""
        rows, groups = self.strides(M, N)
        return (self.storage(M, N), rows, groups) if batched else (rows, groups)

    def storage(self, M: int, N: int) -> int:
        """Elements one batch's grid spans (the batch stride of an allocation): its rows, or its
        padded columns."""
        rows, groups = self.strides(M, N)
        return M * rows if self.layout == "row_major" else self.groups(N) * groups


def scale_grid_strides(layout: str, M: int, G: int) -> tuple[int, int]:
    """(row stride, group stride), in elements, of an (M, G) grid of scales laid out as
    ``layout`` (:data:`QUANT_SCALE_LAYOUTS`): (G, 1) row-major; (1, M rounded up to 4) for
    ``col_major_tma``, whose columns start 16-byte aligned (DeepGEMM's ``get_tma_aligned_size``)."""
    if layout == "col_major_tma":
        return 1, -(-M // 4) * 4
    return G, 1


#: leaf kinds by the word used for them in the canonical text form
LEAF_KINDS: dict[str, type[Leaf]] = {
    cls.kind: cls for cls in (Accumulator, Source, ScalarBroadcast, RowBroadcast, ColBroadcast, AuxLoad)
}
