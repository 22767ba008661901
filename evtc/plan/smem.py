"""A model of C++ object layout, enough to compute ``sizeof`` of CUTLASS's shared storage.

Input: descriptions of the structs, unions, arrays and ``cute::tuple``s that make up
``CollectiveEpilogue::SharedStorage``. Output: sizes, alignments and member offsets in bytes.

The rules are the Itanium C++ ABI's for standard-layout types (members at increasing offsets,
each aligned to its alignment, the size rounded up to the largest alignment; an empty class has
size 1 as a member) plus two CUTLASS specifics:

* ``cute::array_aligned<T, N>`` is ``alignas(16)`` (``cute/container/array_aligned.hpp``), and
  ``ArrayEngine<T, N>`` wraps one (``cute/tensor_impl.hpp``);
* ``cute::tuple<T...>`` stores only its non-empty elements, recursively as
  ``{ First first_; ESO<Rest...> rest_; }`` (the "empty storage optimization",
  ``cute/container/tuple.hpp``), so nesting changes padding and a tuple of empty elements is an
  empty class.

The planner builds the epilogue's shared storage from these pieces, and the emitted kernel
``static_assert``s that the compiler agrees (``sizeof(CollectiveEpilogue::SharedStorage)``).
"""

from __future__ import annotations

from typing import NamedTuple


def round_up(x: int, a: int) -> int:
    return (x + a - 1) // a * a


class CType(NamedTuple):
    """A C++ type's layout (a NamedTuple: the planner builds many of these per candidate).

    Attributes:
        name: for reports (``smem_C``, ``tuple<...>``).
        size: ``sizeof`` in bytes.
        align: ``alignof`` in bytes.
        empty: ``std::is_empty`` (no data members); its size is still 1.
        members: (member name, offset, type) of the direct members, for reports.
        buffer: the plan buffer this type holds, if it is one.
    """

    name: str
    size: int
    align: int
    empty: bool = False
    members: tuple[tuple[str, int, "CType"], ...] = ()
    buffer: str | None = None

    def leaves(self, base: int = 0) -> list[tuple[int, "CType"]]:
        """(absolute offset, type) of every member that holds a plan buffer, in member order."""
        out: list[tuple[int, CType]] = []
        stack: list[tuple[int, CType]] = [(base, self)]
        while stack:
            at, t = stack.pop()
            if t.buffer is not None:
                out.append((at, t))
            stack.extend((at + off, m) for _, off, m in reversed(t.members))
        return out


EMPTY = CType("empty", 1, 1, empty=True)


def array_aligned(name: str, elem_bytes: int, count: int, *, alignas: int = 16, buffer: str | None = None) -> CType:
    """``alignas(alignas) cute::array_aligned<T, count>`` (``array_aligned`` is itself 16-aligned)."""
    # sizeof(array_aligned) is a multiple of its own 16-byte alignment; a larger alignas on the
    # member moves it but doesn't change its sizeof.
    return CType(name, round_up(max(elem_bytes * count, 1), 16), max(16, alignas), buffer=buffer)


def struct(name: str, fields: list[tuple[str, CType]] | tuple[tuple[str, CType], ...]) -> CType:
    """A struct with ``fields`` in declaration order (an ``alignas`` on a member is part of the
    member's CType)."""
    if not fields:
        return EMPTY._replace(name=name)
    off = 0
    align = 1
    members = []
    for fname, t in fields:
        off = round_up(off, t.align)
        members.append((fname, off, t))
        off += t.size
        align = max(align, t.align)
    return CType(name, round_up(off, align), align, members=tuple(members))


def union(name: str, fields: list[tuple[str, CType]]) -> CType:
    align = max(t.align for _, t in fields)
    size = round_up(max(t.size for _, t in fields), align)
    return CType(name, size, align, members=tuple((n, 0, t) for n, t in fields))


def with_alignas(t: CType, alignas: int) -> CType:
    """``alignas(alignas) T member``: the member's alignment grows, its sizeof doesn't."""
    return t._replace(align=max(t.align, alignas))


def cute_tuple(name: str, elems: list[CType]) -> CType:
    """``cute::tuple<elems...>`` with the empty-storage optimization."""
    if all(e.empty for e in elems):
        return EMPTY._replace(name=name)
    # ESO<First, Rest...> = { First first_; ESO<Rest...> rest_; }, an empty First or an empty
    # Rest left out; built from the back (no recursion: a tuple may have thousands of elements)
    inner: CType | None = None  # ESO of the elements after i, when one of them is non-empty
    for first in reversed(elems):
        if first.empty:
            if inner is not None:
                inner = struct("ESO", [("rest_", inner)])
        elif inner is None:
            inner = struct("ESO", [("first_", first)])
        else:
            inner = struct("ESO", [("first_", first), ("rest_", inner)])
    assert inner is not None
    return inner._replace(name=name)
