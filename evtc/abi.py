"""The C ABI of an emitted kernel: flat structs of named arguments.

Input: a Graph. Output: the ordered list of :class:`AbiField` that both the emitted C structs
(``evtc_args_t``, ``evtc_call_t``; ``codegen_templates/common/c_abi_struct.j2``) and the Python
mirrors (:func:`ctypes_struct`, :class:`CallLayout`) are made from, so the two can't disagree.
The kernel's info call returns the same list as JSON, and the runtime checks it on load.

Two structs:

* ``evtc_args_t``: every field, for ``evtc_prepare`` / ``evtc_run`` (once per problem
  signature);
* ``evtc_call_t``: one launch of a prepared problem (``evtc_launch``): a header (``handle``,
  ``workspace``, ``workspace_bytes``, ``stream``), then the pointer fields, then the by-value
  scalar fields, each group in ``evtc_args_t``'s order (:func:`call_fields`). The runtime packs
  it with one ``struct.Struct.pack_into`` into a preallocated buffer (:class:`CallLayout`).

Layout: problem size, (sm90) the tile scheduler's run-time arguments, A, B, then every input
the epilogue uses (signature order), then every output (return order). A convolution's struct
(:func:`conv_abi_fields`) puts its extents after the problem size and has no scheduler fields. Field names carry a
prefix by what they hold, so no user name can collide with another field or a C keyword:
``p_`` pointer, ``ld_`` leading dimension (elements between rows), ``bs_`` batch stride
(elements between batches; 0 broadcasts one tensor to every batch), ``s_`` a by-value scalar.
"""

from __future__ import annotations

import ctypes
import dataclasses
import re
import struct

from evtc.ir.graph import Graph
from evtc.ir.nodes import (
    Accumulator,
    AuxLoad,
    ColBroadcast,
    GroupScale,
    Reduction,
    RowBroadcast,
    ScalarBroadcast,
    Source,
    Store,
)

__all__ = ["ABI_VERSION", "CONV_FIELDS", "CONV_KINDS", "CONV_OPERANDS", "AbiField", "CallLayout", "abi_fields",
           "call_fields", "conv_abi_fields", "ctypes_struct", "grouped_abi_fields", "kernel_abi_fields",
           "struct_format"]

ABI_VERSION = 3

CTYPES = {
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "float": ctypes.c_float,
    "const void*": ctypes.c_void_p,
    "void*": ctypes.c_void_p,
}


@dataclasses.dataclass(frozen=True)
class AbiField:
    """One field of ``evtc_args_t``.

    Attributes:
        name: C identifier.
        ctype: C type (``int32_t``, ``int64_t``, ``float``, ``const void*``, ``void*``).
        tensor: the operand it belongs to (``A``, ``B``, an input or output name), or None.
        what: ``ptr``, ``ld``, ``batch_stride``, ``group_stride`` (a quantization's scales:
            elements between a row's groups; ``ld`` is then the stride between rows), ``value``,
            ``dim``, ``scheduler`` (a tile scheduler argument) or ``conv`` (a convolution's extent,
            :data:`CONV_FIELDS`).
    """

    name: str
    ctype: str
    tensor: str | None
    what: str

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def abi_fields(graph: Graph, arch: str) -> tuple[AbiField, ...]:
    """The fields of ``evtc_args_t`` for ``graph`` built for ``arch`` (``sm90`` or ``sm80``)."""
    f: list[AbiField] = [AbiField(n, "int32_t", None, "dim") for n in ("M", "N", "K", "L")]
    if arch == "sm90":
        # sm90's persistent tile schedulers take the tile order at run time (their
        # Arguments::max_swizzle_size and raster_order), so one built kernel serves every order;
        # raster_order is the index in GemmConfig's RASTER_ORDERS (RasterOrderOptions' order).
        f += [AbiField("max_swizzle_size", "int32_t", None, "scheduler"),
              AbiField("raster_order", "int32_t", None, "scheduler"),
              # the stream-K scheduler's (ignored by the persistent one): K splits, and the
              # DecompositionMode / ReductionMode enumerator indices (tile_scheduler_detail.hpp)
              AbiField("splits", "int32_t", None, "scheduler"),
              AbiField("decomposition_mode", "int32_t", None, "scheduler"),
              AbiField("reduction_mode", "int32_t", None, "scheduler")]
    for op in ("A", "B"):
        f += [AbiField(f"p_{op}", "const void*", op, "ptr"), AbiField(f"ld_{op}", "int64_t", op, "ld"),
              AbiField(f"bs_{op}", "int64_t", op, "batch_stride")]
    for leaf in graph.used_inputs:
        n = leaf.name
        if isinstance(leaf, Accumulator):
            continue
        if isinstance(leaf, (Source, AuxLoad)):
            f += [AbiField(f"p_{n}", "const void*", n, "ptr"), AbiField(f"ld_{n}", "int64_t", n, "ld"),
                  AbiField(f"bs_{n}", "int64_t", n, "batch_stride")]
        elif isinstance(leaf, (RowBroadcast, ColBroadcast)) or (isinstance(leaf, ScalarBroadcast) and leaf.by_pointer):
            f += [AbiField(f"p_{n}", "const void*", n, "ptr"), AbiField(f"bs_{n}", "int64_t", n, "batch_stride")]
        elif isinstance(leaf, ScalarBroadcast):
            f.append(AbiField(f"s_{n}", "float", n, "value"))
    for out in graph.outputs:
        n = out.name
        if isinstance(out, Store):
            f += [AbiField(f"p_{n}", "void*", n, "ptr"), AbiField(f"ld_{n}", "int64_t", n, "ld"),
                  AbiField(f"bs_{n}", "int64_t", n, "batch_stride")]
        elif isinstance(out, GroupScale):  # its (M, G) grid's strides: ROW_MAJOR or COL_MAJOR_TMA
            f += [AbiField(f"p_{n}", "void*", n, "ptr"), AbiField(f"bs_{n}", "int64_t", n, "batch_stride"),
                  AbiField(f"ld_{n}", "int64_t", n, "ld"), AbiField(f"gs_{n}", "int64_t", n, "group_stride")]
        elif isinstance(out, Reduction):
            f += [AbiField(f"p_{n}", "void*", n, "ptr"), AbiField(f"bs_{n}", "int64_t", n, "batch_stride")]
    return tuple(f)


def grouped_abi_fields(graph: Graph) -> tuple[AbiField, ...]:
    """The fields of a grouped kernel's ``evtc_args_t`` (:class:`evtc.GroupedGemm`): the sm90
    GEMM's (:func:`abi_fields`; M is the total token count T, L the group count E, ``bs_B`` the
    elements between groups' B, a row broadcast's ``bs_`` those between its groups' rows, a
    scalar by pointer's ``bs_`` 1 for one scalar per group) and two pointers: ``p_offs``, the E
    int32 cumulative token counts on the device, and ``p_groups``, the group table the kernel's
    setup writes (``evtc_group_table_bytes(E)`` bytes)."""
    return abi_fields(graph, "sm90") + (AbiField("p_offs", "const void*", "offs", "ptr"),
                                        AbiField("p_groups", "void*", "groups", "ptr"))


def kernel_abi_fields(graph: Graph, arch: str, *, grouped: bool = False) -> tuple[AbiField, ...]:
    """:func:`grouped_abi_fields` for a grouped kernel, else :func:`abi_fields`."""
    return grouped_abi_fields(graph) if grouped else abi_fields(graph, arch)


# ---- convolutions ------------------------------------------------------------------------------------

#: (A, B, output) of each kind of convolution, by their names in messages and comments: the
#: GEMM's A and B operands (CUTLASS's ``ConvProblemShape::set_shape_stride_ABC``: fprop x, w -> y;
#: dgrad dy, w -> dx; wgrad dy, x -> dw)
CONV_OPERANDS = {"fprop": ("x", "w", "y"), "dgrad": ("dy", "w", "dx"), "wgrad": ("dy", "x", "dw")}
CONV_KINDS = tuple(CONV_OPERANDS)

#: The convolution's fields of ``evtc_args_t`` (after M, N, K, L): the activation's extents
#: (n, d, h, w, c), the filter's (k, t, r, s), the output's (z, p, q), symmetric padding,
#: traversal stride and dilation per spatial dimension (2-D problems: d = t = z = 1, pad_d = 0,
#: stride_d = dilation_d = 1).
CONV_FIELDS = ("conv_n", "conv_d", "conv_h", "conv_w", "conv_c", "conv_k", "conv_t", "conv_r", "conv_s",
               "conv_z", "conv_p", "conv_q", "pad_d", "pad_h", "pad_w", "stride_d", "stride_h", "stride_w",
               "dilation_d", "dilation_h", "dilation_w")


def conv_abi_fields(graph: Graph) -> tuple[AbiField, ...]:
    """The fields of a convolution kernel's ``evtc_args_t``: the GEMM's (:func:`abi_fields`
    without the sm90 tile-scheduler arguments: the conv kernels take none) with
    :data:`CONV_FIELDS` after M, N, K, L. ``ld_A``/``bs_A``/``ld_B``/``bs_B`` are unused (0): the
    operands are packed and described by the conv fields."""
    base = abi_fields(graph, "sm80")
    conv = tuple(AbiField(n, "int32_t", None, "conv") for n in CONV_FIELDS)
    return base[:4] + conv + base[4:]


# ---- the Python mirrors --------------------------------------------------------------------------------


def ctypes_struct(fields: tuple[AbiField, ...]) -> type[ctypes.Structure]:
    """A ctypes Structure with the same layout as the emitted ``evtc_args_t``."""
    return type("evtc_args_t", (ctypes.Structure,), {"_fields_": [(x.name, CTYPES[x.ctype]) for x in fields]})


#: ``evtc_call_t``'s header, before the pointer and scalar fields (name, C type).
CALL_HEADER = (("handle", "int64_t"), ("workspace", "void*"), ("workspace_bytes", "uint64_t"), ("stream", "void*"))

_STRUCT_CODES = {"int32_t": "i", "int64_t": "q", "uint64_t": "Q", "float": "f", "const void*": "Q", "void*": "Q"}
_CTYPES_ALL = {**CTYPES, "uint64_t": ctypes.c_uint64}


def call_fields(fields: tuple[AbiField, ...]) -> tuple[AbiField, ...]:
    """The per-call fields of ``evtc_call_t`` after its header: every pointer, then every
    by-value scalar, each in ``fields``' order."""
    return tuple(f for f in fields if f.what == "ptr") + tuple(f for f in fields if f.what == "value")


def struct_format(members: list[tuple[str, str]]) -> tuple[str, int]:
    """A ``struct`` format (standard sizes, explicit padding) with the layout the C compiler
    gives ``members`` (name, C type) on x86-64/aarch64 Linux, and its size in bytes. The offsets
    come from ctypes, which follows the platform's C ABI."""
    cls = type("_layout", (ctypes.Structure,), {"_fields_": [(n, _CTYPES_ALL[t]) for n, t in members]})
    fmt, at = "<", 0
    for name, ctype in members:
        off = getattr(cls, name).offset
        if off > at:
            fmt += f"{off - at}x"
        fmt += _STRUCT_CODES[ctype]
        at = off + struct.calcsize("<" + _STRUCT_CODES[ctype])
    size = ctypes.sizeof(cls)
    if size > at:
        fmt += f"{size - at}x"
    return fmt, size


@dataclasses.dataclass(frozen=True)
class CallLayout:
    """The byte layout of ``evtc_call_t`` for one kernel.

    Attributes:
        pointers: names of the pointer fields, in order (``p_A``, ``p_B``, inputs, outputs).
        scalars: names of the by-value scalar fields, in order.
        packer: packs ``(handle, workspace, workspace_bytes, stream, *pointers, *scalars)``
            (pointers as unsigned ints, scalars as f32; a scalar beyond f32's range raises
            ``OverflowError``, a negative pointer ``struct.error``).
        size: ``sizeof(evtc_call_t)`` in bytes.
    """

    pointers: tuple[str, ...]
    scalars: tuple[str, ...]
    packer: struct.Struct
    size: int

    @classmethod
    def of(cls, fields: tuple[AbiField, ...]) -> "CallLayout":
        per_call = call_fields(fields)
        members = list(CALL_HEADER) + [(f.name, f.ctype) for f in per_call]
        fmt, size = struct_format(members)
        return cls(tuple(f.name for f in per_call if f.what == "ptr"),
                   tuple(f.name for f in per_call if f.what == "value"), struct.Struct(fmt), size)

    def offsets(self) -> dict[str, int]:
        """Byte offset of every field of ``evtc_call_t`` (the header's, then pointers' and
        scalars'), read back from :attr:`packer`'s format (for code that packs the struct
        itself: evtc/torch/fast.cpp)."""
        names = [n for n, _ in CALL_HEADER] + list(self.pointers) + list(self.scalars)
        out, at, i = {}, 0, 0
        for code in re.findall(r"(\d*)([a-zA-Z])", self.packer.format.lstrip("<")):
            count, kind = int(code[0] or 1), code[1]
            if kind == "x":
                at += count
                continue
            for _ in range(count):
                out[names[i]] = at
                at += struct.calcsize("<" + kind)
                i += 1
        if i != len(names) or at > self.size:
            raise ValueError(f"call layout {self.packer.format} does not hold {names}")
        return out
