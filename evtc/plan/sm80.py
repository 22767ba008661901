"""The Ampere (sm80) planner: register-only visitors, kernel variants per alignment.

Input: a Graph after passes, the SM80 Target, a GemmConfig and the operand dtypes.
Output: an :class:`Sm80Plan` (a :class:`~evtc.plan.model.Plan` with ``arch="sm80"`` and
``policy="evtc"``: there is no stock rule to compare with on sm80) that the sm80 emitter prints as CUTLASS 2.x visitor GEMMs.

# NOTE [The sm80 epilogue]
The kernel is ``cutlass::gemm::kernel::DefaultGemmWithVisitor``
(``gemm/kernel/default_gemm_universal_with_visitor.h``): a multistage ``cp.async`` mainloop
(``MmaMultistage``; ``MmaPipelined`` for 2 stages) and ``EpilogueWithVisitorCallbacks``
(``epilogue/threadblock/epilogue_with_visitor_callbacks.h``), which stages the accumulators
through shared memory that is a *union* with the mainloop's (``GemmUniversal::SharedStorage``),
so the epilogue costs the mainloop no stages. Every visitor reads and writes global memory from
registers (``epilogue/threadblock/fusion/visitor_*.hpp``): there is no collective, so C is an
aux load and D an aux store like any other (the tree from
:func:`evtc.lower.lower` with ``c_input=None``, wrapped in D's store).
The only shared memory a visitor owns is ``VisitorRowReduction``'s (CUTLASS's *row* reduction
reduces over M into a length-N row: evtc's **column** reduction), one float per element of the
thread map's compacted tile (:func:`row_reduction_floats`).

# NOTE [Ragged shapes on sm80]
A visitor accesses a row in vectors of the thread map's ``kElementsPerAccess`` elements (at most
16 bytes per access) and predicates each vector on its *first* coordinate
(``elem_less(coord, problem_shape)``), and the mainloop's ``cp.async`` copies predicate whole
vectors along K the same way. A vector that starts inside a row and ends past it reads or writes
the elements after the row's end: another tensor's data in a strided view, unmapped memory at
the end of an allocation. So a vectorized kernel is only right when N and K (and every row
stride, batch stride and base address) are multiples of its vectors. The plan therefore lists
*kernel variants*, all compiled into one library and picked at run time on the actual N, K,
strides and pointers (the first variant whose requirements hold):

1. ``vector``: 16-byte mainloop accesses, epilogue vectors of 16 bytes of the thread map's
   element (8 elements for 16 bits, 4 for f32), the configured stages;
2. ``ragged_n``: the same mainloop, epilogue vectors of one element (any N);
3. ``ragged``: one-element mainloop accesses (``PredicatedTileIterator`` with an access of one
   element, the 2-stage ``MmaPipelined`` mainloop, since ``cp.async`` copies 4, 8 or 16 bytes,
   ``arch/memory_sm80.h``) and one-element epilogue vectors: any N, K, stride or address.
"""

from __future__ import annotations

import dataclasses

from evtc.dtypes import DType, f32
from evtc.errors import PlanError
from evtc.ir.graph import Graph
from evtc.ir.nodes import AuxLoad, Output, Reduction, RowBroadcast, ScalarBroadcast, Source, Store
from evtc.iterative import trampoline
from evtc.lower import Role, Topo, Tree, TreeLike, Visitor, VisitorTree, lower, role_of
from evtc.plan.config import GemmConfig
from evtc.plan.model import Buffer, Plan, format_plan
from evtc.plan.smem import EMPTY, CType, cute_tuple, round_up, struct
from evtc.plan.target import Target

#: ``mma.sync`` shape for 16-bit operands (``cutlass/arch/mma_sm80.h``: m16n8k16 for f16/bf16)
INSTRUCTION_SHAPE = (16, 8, 16)
#: CUTLASS's EVT epilogue stages (``OutputTileThreadLayout`` allows 1 or 2; 1 is what CUTLASS's
#: Python EVT emits and keeps the epilogue's accumulator staging single-buffered)
EPILOGUE_STAGES = 1
#: widest access of the mainloop and of a visitor, in bytes (``cp.async`` of 16 bytes,
#: ``VecType = uint_bit_t<min(128, vec_bits)>`` in ``visitor_load.hpp``/``visitor_store.hpp``)
MAX_ACCESS_BYTES = 16


# ---- CUTLASS's rules, one function each ---------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class ThreadMap:
    """``OutputTileThreadLayout`` = ``OutputTileOptimalThreadMap`` of ``DefaultThreadMapTensorOp``
    (``epilogue/threadblock/output_tile_thread_map.h``, ``default_thread_map_tensor_op.h``,
    ``fusion/visitor_2x.hpp``), the numbers evtc needs.

    Attributes:
        elements_per_access: elements one visitor call sees (``kElementsPerAccess``).
        access_width: lanes along a row (``Detail::kAccessWidth``).
        access_rows: rows one warp covers at once (``Detail::kAccessRows``).
        iterations_column: accesses per thread along a row (``Iterations::kColumn``).
        warps_remaining_for_rows: ``Detail::kWarpsRemainingForRows``.
        group: ``Shape::kGroup`` (warps along M).
        cluster: ``Shape::kCluster``.
        threads: threads of the threadblock.
        steps: epilogue steps per tile (``OutputTileIterator::kIterations`` = ``Count::kTile``).
        rows_per_step: tile rows one step covers.
    """

    elements_per_access: int
    access_width: int
    access_rows: int
    iterations_column: int
    warps_remaining_for_rows: int
    group: int
    cluster: int
    threads: int
    steps: int
    rows_per_step: int


def warp_tile(config: GemmConfig) -> tuple[int, int, int]:
    """The warp tile: ``config.warp_tile``, or 64 x 64 x tile K (the default's)."""
    return config.warp_tile or (64, 64, config.tile[2])


def thread_map(config: GemmConfig, element_bits: int, elements_per_access: int) -> ThreadMap:
    """The epilogue thread map for a threadblock tile, warp tile, output element size and access
    width (the metaprogram of ``OutputTileOptimalThreadMap``, transcribed)."""
    tm, tn, tk = config.tile
    wm, wn, wk = warp_tile(config)
    warps = (tm // wm) * (tn // wn) * (tk // wk)
    shape_row, shape_group, shape_cluster = 8, tm // wm, 1  # OutputTileShape<N, 8, WarpCount::kM, 1, 1>
    e = elements_per_access
    warps_for_groups = 1 if shape_cluster > warps else warps // shape_cluster
    warps_for_rows = 1 if shape_group > warps_for_groups else warps_for_groups // shape_group
    if shape_row > warps_for_rows:  # RowArrangement<..., Is2dTile = true>
        rows = shape_row // warps_for_rows
        width = tn // e
        access_bytes = e * element_bits // 8
        target_rows = 32 // (256 // access_bytes)
        if target_rows > rows:
            access_width, access_rows = 32 // rows, rows
        else:
            access_width = min(width, min(32, 256 // access_bytes))
            access_rows = min(shape_row, 32 // access_width)
        iterations_column = width // access_width
    else:
        access_width, access_rows, iterations_column = 32, 1, tn // e // 32
    return ThreadMap(e, access_width, access_rows, iterations_column, warps_for_rows, shape_group, shape_cluster,
                     warps * 32, wm // 8, shape_row * shape_group * shape_cluster)


def row_reduction_floats(tmap: ThreadMap) -> int:
    """Floats in ``VisitorRowReduction::SharedStorage`` (``visitor_store.hpp``):
    ``size(select<0,1,2,3,5,8,10>(ThreadMapShape))``, i.e. one tile row times the rows the
    threads hold at once."""
    return (tmap.elements_per_access * tmap.access_width * tmap.iterations_column * tmap.access_rows
            * tmap.warps_remaining_for_rows * tmap.group * tmap.cluster)


def vector_elements(dtype: DType, elements_per_access: int) -> int:
    """Elements per global access of a visitor of ``dtype`` (``VecLength``: at most 16 bytes)."""
    return min(elements_per_access, MAX_ACCESS_BYTES * 8 // dtype.bits)


def mainloop_stage_bytes(config: GemmConfig, a: DType, b: DType) -> int:
    """Shared memory of one multistage mainloop stage: the A and B tiles."""
    tm, tn, tk = config.tile
    return (tm * tk * a.bits + tn * tk * b.bits) // 8


# ---- the plan ------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class KernelVariant:
    """One kernel compiled into the library, used when its requirements hold.

    Attributes:
        name: ``vector``, ``ragged_n`` or ``ragged``.
        alignment_ab: elements per mainloop access of A and B (``kAlignmentA/B``).
        epilogue_access: elements per visitor call (the thread map's ``kElementsPerAccess``,
            the kernel's ``kAlignmentC``).
        stages: mainloop stages (2 selects ``MmaPipelined``).
        vectors: (tensor name, elements per global access) of every vectorized epilogue
            tensor (M x N tensors and row broadcasts).
        epilogue_smem_bytes: bytes of ``FusionCallbacks::SharedStorage`` (0 when it is empty).
        why: when the variant is used.
    """

    name: str
    alignment_ab: int
    epilogue_access: int
    stages: int
    vectors: tuple[tuple[str, int], ...]
    epilogue_smem_bytes: int
    why: str

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["vectors"] = [list(v) for v in self.vectors]
        return d


@dataclasses.dataclass(frozen=True)
class Sm80Plan(Plan):
    """A :class:`Plan` with what only sm80 has.

    Attributes:
        warp_tile: warp tile (M, N, K).
        instruction_shape: ``mma.sync`` shape.
        thread_map_element: the element the epilogue thread map is laid out for (D's dtype, or
            the operands' for an 8-bit D; it is also the kernel's nominal ``ElementC``).
        swizzle_width: ``GemmIdentityThreadblockSwizzle<N>``'s N, in tiles (GemmConfig.swizzle is its
            log2; ignored with stream-K).
        variants: the kernels in the library, in the order they are tried.
        scratch: reductions accumulated in a float workspace and converted to their dtype after
            the GEMM (the visitors' atomics work on the output type, evtc accumulates in f32).
    """

    warp_tile: tuple[int, int, int] = (64, 64, 32)
    instruction_shape: tuple[int, int, int] = INSTRUCTION_SHAPE
    thread_map_element: DType = f32
    swizzle_width: int = 8
    variants: tuple[KernelVariant, ...] = ()
    scratch: tuple[str, ...] = ()

    def to_json(self) -> dict:
        d = super().to_json()
        d.update({
            "warp_tile": list(self.warp_tile),
            "instruction_shape": list(self.instruction_shape),
            "thread_map_element": self.thread_map_element.name,
            "swizzle_width": self.swizzle_width,
            "variants": [v.to_json() for v in self.variants],
            "scratch": list(self.scratch),
        })
        return d


def wrap_output(graph: Graph) -> Output:
    """The output whose visitor wraps the tree's root: the Store named D, else the first Store,
    else the first output (an epilogue of reductions only)."""
    stores = [o for o in graph.outputs if isinstance(o, Store)]
    return next((s for s in stores if s.name == "D"), stores[0] if stores else graph.outputs[0])


def visitor_tree(graph: Graph) -> VisitorTree:
    """The lowered tree without a C slot, its root wrapped in the visitor of :func:`wrap_output`
    (on sm80 every output, D included, is stored by a visitor)."""
    top = wrap_output(graph)
    tree = lower(graph, top, None)
    return dataclasses.replace(tree, root=Tree(Visitor(top, role_of(top)), (tree.root,)))


def _storage(root: TreeLike, floats: int) -> CType:
    """``FusionCallbacks::SharedStorage`` of a tree: ``Sm90VisitorImplBase``'s ``cute::tuple`` of
    the children's storages then the node's own (``TreeVisitor2x``/``TopologicalVisitor2x``)."""

    def storage(t: TreeLike):
        parts = []
        if isinstance(t, Topo):
            for o in t.ops:
                parts.append((yield o))
            return cute_tuple("tuple", parts)
        own = EMPTY
        if t.op.role is Role.COL_REDUCTION:
            arr = CType("AlignedArray<float>", round_up(4 * floats, 16), 16, buffer=t.op.name)
            own = struct("VisitorRowReduction::SharedStorage", [("reduction", arr)])
        if not t.children:
            return own
        for c in t.children:
            parts.append((yield c))
        return cute_tuple("tuple", parts + [own])

    return trampoline(storage, root)


def _variants(graph: Graph, tree: VisitorTree, config: GemmConfig, element: DType, a: DType
              ) -> tuple[tuple[KernelVariant, ...], dict[str, tuple[int, int]]]:
    """The kernel variants (NOTE [Ragged shapes on sm80]) and, per buffer, its (offset, bytes) in
    the first variant's callbacks storage."""
    vec_tensors = [n for n in graph.used_inputs if isinstance(n, (AuxLoad, Source, RowBroadcast))] + \
                  [o for o in graph.outputs if isinstance(o, Store)]
    wide = MAX_ACCESS_BYTES * 8 // element.bits
    specs = [
        ("vector", MAX_ACCESS_BYTES * 8 // a.bits, wide, config.stages,
         "N, K, every row/batch stride and base address are multiples of the vectors"),
        ("ragged_n", MAX_ACCESS_BYTES * 8 // a.bits, 1, config.stages,
         "K and A/B are 16-byte aligned, N or an epilogue tensor is not"),
        ("ragged", 1, 1, 2, "anything else (one-element accesses, 2-stage MmaPipelined mainloop)"),
    ]
    out = []
    spans: dict[str, tuple[int, int]] = {}
    for name, align_ab, access, stages, why in specs:
        tmap = thread_map(config, element.bits, access)
        storage = _storage(tree.root, row_reduction_floats(tmap))
        if not out:
            spans = {t.buffer: (off, t.size) for off, t in storage.leaves() if t.buffer}
        vectors = tuple((n.name, vector_elements(n.dtype, access)) for n in vec_tensors)
        out.append(KernelVariant(name, align_ab, access, stages, vectors, 0 if storage.empty else storage.size, why))
    return tuple(out), spans


_WHY = {
    "aux_load": "VisitorAuxLoad: predicated vector loads into registers, one epilogue step at a time",
    "aux_store": "VisitorAuxStore: predicated vector stores from registers",
    "row_broadcast": "VisitorRowBroadcast: the thread's columns, loaded once into registers",
    "col_broadcast": "VisitorColBroadcast: the thread's rows, loaded once into registers",
    "scalar": "VisitorScalarBroadcast: read once per batch",
    "row_reduction": "VisitorColReduction: warp shuffles, one float atomic per row and tile",
    "col_reduction": "VisitorRowReduction: partial rows through shared memory, one float atomic per column and tile",
    "scalar_reduction": "evtc::Sm80ScalarReduction (CUTLASS's VisitorScalarReduction, the atomic from lane 0): warp shuffles, one float atomic per warp",
}


def _buffers(graph: Graph, tree: VisitorTree, spans: dict[str, tuple[int, int]], scratch: tuple[str, ...]
             ) -> tuple[Buffer, ...]:
    """One Buffer per tensor the epilogue reads or writes, in visitor order."""
    out: list[Buffer] = []
    seen: set[str] = set()
    for v in tree.visitors():
        n = v.node
        role = v.role.spec.buffer
        if role not in _WHY or v.name in seen or (isinstance(n, ScalarBroadcast) and not n.by_pointer):
            continue
        seen.add(v.name)
        why = _WHY[role] + ("; accumulated in a float workspace, converted after the GEMM" if v.name in scratch else "")
        if v.name in spans:
            off, size = spans[v.name]
            out.append(Buffer(v.name, role, n.dtype, "smem", 0, size, off, (), why))
        else:
            out.append(Buffer(v.name, role, n.dtype, "direct", 0, 0, -1, (), why))
    return tuple(out)


def plan_sm80(graph: Graph, target: Target, config: GemmConfig, *, a: DType, b: DType) -> Sm80Plan:
    """Plan the sm80 kernel of ``graph``.

    Args:
        graph: the epilogue after passes (legalized for sm80).
        target: the SM80 Target.
        config: a validated sm80 GemmConfig (``stages`` set; None means 3).
        a, b: operand dtypes (f16 or bf16).

    Returns:
        The Sm80Plan; ``epilogue_smem_bytes`` is the largest ``FusionCallbacks::SharedStorage``
        of the variants (the emitted kernel ``static_assert``s each).

    Raises:
        PlanError: the mainloop's stages don't fit in shared memory.
    """
    config = config if config.stages else config.replace(stages=3)
    stage_bytes = mainloop_stage_bytes(config, a, b)
    if config.stages * stage_bytes > target.smem_capacity:
        raise PlanError(
            f"{config.stages} mainloop stages of {stage_bytes} B at tile {config.tile} exceed the "
            f"{target.smem_capacity} B of shared memory a block may use on sm80",
            epilogue=graph.name,
            hint=f"use at most {target.smem_capacity // stage_bytes} stages or a smaller tile",
        )
    tree = visitor_tree(graph)
    top = tree.root.op.node  # type: ignore[union-attr]
    # the thread map's element: D's, unless D is 8-bit (CUTLASS's epilogue iterators for 8-bit
    # outputs only take 4, 8 or 16 elements per access, default_epilogue_tensor_op.h) or there is
    # no M x N output; then the operands' 16-bit type
    element = top.dtype if isinstance(top, Store) and top.dtype.bits >= 16 else a
    scratch = tuple(o.name for o in graph.outputs if isinstance(o, Reduction) and o.dtype is not f32)
    variants, spans = _variants(graph, tree, config, element, a)
    tmap = thread_map(config, element.bits, variants[0].epilogue_access)
    notes = [
        "C and D are ordinary visitors (no collective): every tensor is accessed from registers",
        "kernel variants by alignment, chosen at run time: " + ", ".join(v.name for v in variants),
    ]
    if any(isinstance(o, Reduction) for o in graph.outputs):
        notes.append("reductions use float atomics; the kernel fills their outputs with the identity first")
    return Sm80Plan(
        arch="sm80", policy="evtc", config=config, operands=(a, b),
        epilogue_tile=(tmap.rows_per_step, config.tile[1]), fragment_size=tmap.elements_per_access,
        stages_c=0, stages_d=0, reuse_smem_c=False, delay_tma_store=False, c_slot=None, d_slot=None, shares=(),
        buffers=_buffers(graph, tree, spans, scratch),
        epilogue_smem_bytes=max(v.epilogue_smem_bytes for v in variants),
        mainloop_stage_bytes=stage_bytes, mainloop_stages=config.stages, smem_capacity=target.smem_capacity,
        notes=tuple(notes), tree=tree,
        warp_tile=warp_tile(config), instruction_shape=INSTRUCTION_SHAPE, thread_map_element=element,
        swizzle_width=1 << config.swizzle, variants=variants, scratch=scratch,
    )
