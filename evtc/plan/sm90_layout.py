"""The sm90 layout model: a candidate's ``CollectiveEpilogue::SharedStorage`` as C++ types.

Input: a lowered visitor tree, a :class:`~evtc.plan.sm90_space.Candidate` and the GemmConfig.
Output: the :class:`~evtc.plan.smem.CType` of the shared storage (its size, alignment and the
offset of every labelled buffer), which the emitted kernel ``static_assert``s equal to
``sizeof(CollectiveEpilogue::SharedStorage)`` (NOTE [Epilogue shared memory on sm90]).
"""

from __future__ import annotations

import functools
from typing import Any

from evtc.iterative import trampoline
from evtc.lower import Role, Tree, TreeLike, Visitor, VisitorTree
from evtc.plan.config import GemmConfig
from evtc.plan.sm90_space import Candidate, swizzle_alignment
from evtc.plan.smem import EMPTY, CType, array_aligned, cute_tuple, struct, union, with_alignas

__all__ = ["SLOT_C", "SLOT_D", "aux_label", "collective_storage", "contiguous_extent", "fusion_storage", "row_label",
           "shared_storage", "visitor_storage"]

# Buffer labels in the layout model: the collective's slots and each visitor's tensor, so that an
# output named "D" that is an aux store is never confused with the buffer of the D slot.
SLOT_C, SLOT_D = "slot:C", "slot:D"



#: bytes of one ``cute::TmaDescriptor`` (CUtensorMap: 128 bytes, 64-aligned; cuda.h)
TMA_DESCRIPTOR_BYTES = 128
#: epilogue warpgroups of CUTLASS's pointer-array schedules (``PtrArrayTmaWarpSpecializedCooperative``
#: and ``...Pingpong``: 2, epilogue/dispatch_policy.hpp)
GROUPED_EPILOGUE_WARP_GROUPS = 2
#: the pointer-array mainloop's carve-out from the block's shared memory: A's and B's tensor maps
#: (``KernelSmemCarveout``, gemm/collective/builders/sm90_gmma_builder.inl)
GROUPED_MAINLOOP_CARVEOUT = 2 * TMA_DESCRIPTOR_BYTES

def aux_label(name: str) -> str:
    return f"aux:{name}"


def row_label(name: str) -> str:
    return f"row:{name}"


def contiguous_extent(cand: Candidate, config: GemmConfig) -> int:
    """The epilogue subtile's contiguous extent: N, or M for the column-major tensors of swap-AB."""
    return cand.epilogue_tile[0] if config.swap_ab else cand.epilogue_tile[1]


def visitor_storage(v: Visitor, cand: Candidate, config: GemmConfig) -> CType:
    """``SharedStorage`` of one visitor."""
    em, en = cand.epilogue_tile
    if v.role is Role.ROW:
        if v.name in cand.direct:
            return EMPTY  # evtc::Sm90RowBroadcastDirect
        return struct("Sm90RowBroadcast::SharedStorage",
                      [("smem", array_aligned(v.name, v.node.dtype.bytes, config.tile[1], buffer=row_label(v.name)))])
    if v.node is cand.c_slot:
        return EMPTY  # the collective's C (Sm90SrcFetch)
    if v.role is Role.AUX_STORE and any(st == v.name for st, _ in cand.shares):
        return EMPTY  # evtc::Sm90SharedAuxStore: lives in its aux load's buffer
    if v.role.is_aux and v.name not in cand.direct:
        stages = cand.stages_c if v.role is Role.AUX_LOAD else cand.stages_d
        b = v.node.dtype.bytes
        arr = array_aligned(v.name, b, em * en * stages, alignas=swizzle_alignment(contiguous_extent(cand, config), b),
                            buffer=aux_label(v.name))
        return struct(f"{v.role.value}::SharedStorage", [("smem_aux", arr)])
    return EMPTY


_STORAGE_ROLES = frozenset({Role.ROW, Role.AUX_LOAD, Role.AUX_STORE})


@functools.lru_cache(maxsize=64)
def _layout_program(root: TreeLike) -> tuple[tuple[str, Any], ...]:
    """The tree's ``SharedStorage`` nesting as a post-order program: ``("v", visitor)`` pushes a
    visitor's storage, ``("t", k)`` pops ``k`` and pushes their ``cute::tuple``, ``("e", None)``
    pushes an empty class (a subtree none of whose visitors can own shared memory). Built once
    per tree, it makes the per-candidate layout a flat loop."""
    program: list[tuple[str, Any]] = []

    def walk(t: TreeLike):
        start = len(program)
        if isinstance(t, Tree):
            for c in t.children:
                yield c
            program.append(("v", t.op))
            if t.children:
                program.append(("t", len(t.children) + 1))
        else:
            for o in t.ops:
                yield o
            program.append(("t", len(t.ops)))
        if not any(op == "v" and arg.role in _STORAGE_ROLES for op, arg in program[start:]):
            del program[start:]
            program.append(("e", None))
        return None

    trampoline(walk, root)
    return tuple(program)


def _storage_key(v: Visitor, cand: Candidate) -> tuple:
    """What :func:`visitor_storage` depends on besides the config."""
    stages = cand.stages_c if v.role is Role.AUX_LOAD else cand.stages_d
    return (id(v), cand.epilogue_tile, stages, v.name in cand.direct, v.node is cand.c_slot,
            any(st == v.name for st, _ in cand.shares))


def fusion_storage(root: TreeLike, cand: Candidate, config: GemmConfig, memo: dict | None = None) -> CType:
    """``FusionCallbacks::SharedStorage`` of a visitor tree (``Sm90VisitorImplBase``: a
    ``cute::tuple`` of the children's storages then the node's own). ``memo`` caches visitor
    storages across the candidates of one search (one config)."""
    stack: list[CType] = []
    for op, arg in _layout_program(root):
        if op == "v":
            if memo is None:
                stack.append(visitor_storage(arg, cand, config))
            else:
                key = _storage_key(arg, cand)
                got = memo.get(key)
                if got is None:
                    got = memo[key] = visitor_storage(arg, cand, config)
                stack.append(got)
        elif op == "e":
            stack.append(EMPTY)
        else:
            parts = stack[len(stack) - arg:]
            del stack[len(stack) - arg:]
            stack.append(cute_tuple("tuple", parts))
    (out,) = stack
    return out


def collective_storage(cand: Candidate, config: GemmConfig) -> CType:
    """``CollectiveEpilogue::SharedStorage::TensorStorage::collective``."""
    em, en = cand.epilogue_tile
    contiguous = contiguous_extent(cand, config)
    d = cand.d_slot.dtype  # with a void D (the unaligned variant): the root store's, its ElementAux
    align_d = swizzle_alignment(contiguous, d.bytes)
    d_stages = cand.stages_c if cand.reuse else cand.stages_d
    smem_d = array_aligned("D", d.bytes, em * en * d_stages, buffer=SLOT_D)
    if cand.c_slot is None:
        empty_c = EMPTY._replace(name="smem_C")  # cute::array<T, 0>
        return union("CollectiveStorageWithoutC", [("smem_C", empty_c), ("smem_D", with_alignas(smem_d, align_d))])
    c = cand.c_slot.dtype
    align_c = swizzle_alignment(contiguous, c.bytes)
    smem_c = array_aligned("C", c.bytes, em * en * cand.stages_c, buffer=SLOT_C)
    if cand.reuse:
        a = max(align_c, align_d)
        return union("CollectiveStorageReuseC", [("smem_C", with_alignas(smem_c, a)), ("smem_D", with_alignas(smem_d, a))])
    return struct("CollectiveStorageWithC", [("smem_C", with_alignas(smem_c, align_c)), ("smem_D", with_alignas(smem_d, align_d))])


def shared_storage(tree: VisitorTree, cand: Candidate, config: GemmConfig, memo: dict | None = None) -> CType:
    """``sizeof(CollectiveEpilogue::SharedStorage)``'s model: ``{ {collective, thread} tensors;
    LoadPipeline::SharedStorage pipeline; }`` with ``PipelineTransactionAsync<StagesC>``'s two
    arrays of 8-byte barriers. ``tree`` may have been lowered with another C slot than
    ``cand``'s: the C slot's leaf has no storage of its own either way."""
    tensors = struct("TensorStorage", [("collective", collective_storage(cand, config)),
                                       ("thread", fusion_storage(tree.root, cand, config, memo))])
    pipeline = CType("PipelineStorage", 16 * cand.stages_c, 8)
    if config.grouped:
        # the pointer-array collective's TensorMapStorage (sm90_epilogue_array_tma_warpspecialized.hpp):
        # 128-aligned, C's descriptor and one D descriptor per epilogue warpgroup (two: both
        # pointer-array schedules have NumEpilogueWarpGroups = 2, epilogue/dispatch_policy.hpp)
        tensormaps = CType("TensorMapStorage", TMA_DESCRIPTOR_BYTES * (1 + GROUPED_EPILOGUE_WARP_GROUPS), 128)
        return struct("SharedStorage", [("tensors", tensors), ("tensormaps", tensormaps), ("pipeline", pipeline)])
    return struct("SharedStorage", [("tensors", tensors), ("pipeline", pipeline)])
