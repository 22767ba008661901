"""The sm90 emitter: Graph + Plan -> a CUDA C++ source of the whole fused GEMM.

Input: the Graph after passes and its sm90 :class:`~evtc.plan.plan.Plan` (which carries the
visitor tree). Output: the ``.cu`` text, from ``codegen_templates/sm90/gemm.cu.j2``.

Everything the template prints is computed here from the plan; nothing is re-derived (the
stage counts, epilogue tile, slots and per-aux TMA/direct choices are the plan's). The visitor
tree becomes one ``using`` per visitor (``N<k>_<kind>``), one per ``Sm90EVT`` composition
(``EVT<k>``) and one per topological region (``Topo<k>``), declared children first. The same
tree, walked the same way, gives the nested initializer of ``FusionCallbacks::Arguments``,
each positional field commented with the visitor it initializes.
"""

from __future__ import annotations

import dataclasses

from evtc import ops
from evtc.dtypes import DType, f32
from evtc.emit import common
from evtc.abi import ABI_VERSION, abi_fields
from evtc.ir.graph import Graph
from evtc.ir.nodes import Compute, Immediate, ReduceOp, Reduction, ScalarBroadcast
from evtc.ir.printer import print_graph
from evtc.passes.dag_to_tree import Topo, Tree, TreeLike, Visitor
from evtc.plan.plan import Plan

FUSION = "cutlass::epilogue::fusion"
DETAIL = "cutlass::epilogue::collective::detail"
ROUND = "cutlass::FloatRoundStyle::round_to_nearest"
STRIDE_MN = "cute::Stride<int64_t, cute::_1, int64_t>"
STRIDE_ROW = "cute::Stride<cute::_0, cute::_1, int64_t>"  # a length-N vector per batch
STRIDE_COL = "cute::Stride<cute::_1, cute::_0, int64_t>"  # a length-M vector per batch
STRIDE_SCALAR = "cute::Stride<cute::_0, cute::_0, int64_t>"

# (register, shuffle/smem, global) reduce functors for the non-atomic final reductions and the
# atomic scalar reduction (Sm90ScalarReduction has only an atomic implementation)
REDUCE_FNS = {
    ReduceOp.SUM: ("cutlass::plus", "cutlass::plus", "cutlass::plus", "cutlass::atomic_add"),
    ReduceOp.MAX: ("cutlass::maximum", "cutlass::maximum", "cutlass::maximum", "cutlass::atomic_maximum"),
    ReduceOp.MIN: ("cutlass::minimum", "cutlass::minimum", "cutlass::minimum", "evtc::atomic_minimum"),
}

KERNEL_SCHEDULES = {
    ("cooperative", False): "cutlass::gemm::KernelTmaWarpSpecializedCooperative",
    ("pingpong", False): "cutlass::gemm::KernelTmaWarpSpecializedPingpong",
    ("cooperative", True): "cutlass::gemm::KernelTmaWarpSpecializedCooperativeFP8FastAccum",
    ("pingpong", True): "cutlass::gemm::KernelTmaWarpSpecializedPingpongFP8FastAccum",
}
SCHEDULERS = {"persistent": "cutlass::gemm::PersistentScheduler", "streamk": "cutlass::gemm::StreamKScheduler"}


@dataclasses.dataclass
class Decl:
    """One ``using`` line: alias = type, with a comment naming the IR node."""

    alias: str
    type: str
    comment: str


def cxx_shape(*dims: int) -> str:
    return "cute::Shape<" + ", ".join(f"cute::_{d}" for d in dims) + ">"


def _aux_types(dtype: DType, kind: str) -> tuple[str, str]:
    """(SmemLayoutAtom, copy op) for an aux load (S2R) or store (R2S), chosen as the epilogue
    builder does (``sm90_get_epilogue_smem_swizzle_layout_atom``, ``sm90_get_smem_*_op_*``)."""
    atom = f"decltype({DETAIL}::sm90_get_epilogue_smem_swizzle_layout_atom<{STRIDE_MN}, {dtype.cutlass}, EpilogueTile>())"
    fn = "sm90_get_smem_load_op_for_source" if kind == "load" else "sm90_get_smem_store_op_for_accumulator"
    return atom, f"decltype({DETAIL}::{fn}<{STRIDE_MN}, {dtype.cutlass}, EpilogueTile>())"


class _Emitter:
    def __init__(self, graph: Graph, plan: Plan) -> None:
        self.graph = graph
        self.plan = plan
        self.decls: list[Decl] = []
        self.counter = 0
        self.alias_of: dict[int, str] = {}  # id(Tree/Topo) -> alias (EVT<k>, Topo<k> or N<k>_...)
        self.op_alias: dict[int, str] = {}  # id(Tree) -> alias of its own visitor (N<k>_...)

    # ---- visitor types ------------------------------------------------------------------------

    def visitor_type(self, v: Visitor) -> tuple[str, str]:
        """(C++ type, comment) of one visitor."""
        n = v.node
        p = self.plan
        if v.role == "acc":
            return f"{FUSION}::Sm90AccFetch", "acc"
        if v.role == "src":
            return f"{FUSION}::Sm90SrcFetch<ElementC>", f"{n.name} (the collective's C)"
        if v.role == "scalar":
            how = "device pointer" if n.by_pointer else "value"
            return f"{FUSION}::Sm90ScalarBroadcast<{n.dtype.cutlass}, {STRIDE_SCALAR}>", f"{n.name}: scalar by {how}"
        if v.role == "row":
            if p.aux_mode(n.name)[0] == "direct":
                return (f"evtc::Sm90RowBroadcastDirect<TileShape, {n.dtype.cutlass}, float, {STRIDE_ROW}>",
                        f"{n.name}[n]: row broadcast, register-direct")
            return (f"{FUSION}::Sm90RowBroadcast<0, TileShape, {n.dtype.cutlass}, float, {STRIDE_ROW}>",
                    f"{n.name}[n]: row broadcast")
        if v.role == "col":
            return (f"{FUSION}::Sm90ColBroadcast<0, TileShape, {n.dtype.cutlass}, float, {STRIDE_COL}>",
                    f"{n.name}[m]: column broadcast")
        if v.role == "aux_load":
            mode, stages = p.aux_mode(n.name)
            atom, copy = _aux_types(n.dtype, "load")
            return (f"{FUSION}::Sm90AuxLoad<{stages}, EpilogueTile, {n.dtype.cutlass}, {STRIDE_MN}, {atom}, {copy}>",
                    f"{n.name}: aux load, {mode}" + (f", {stages} stages" if stages else ""))
        if v.role == "aux_store":
            mode, stages = p.aux_mode(n.name)
            atom, copy = _aux_types(n.dtype, "store")
            store = f"{FUSION}::Sm90AuxStore<{stages}, EpilogueTile, {n.dtype.cutlass}, {ROUND}, {STRIDE_MN}, {atom}, {copy}>"
            host = dict(p.alias).get(n.name)
            if host is not None:
                return f"evtc::Sm90AliasedAuxStore<{store}>", f"{n.name}: aux store in aux load {host}'s buffer"
            return store, f"{n.name}: aux store, {mode}" + (f", {stages} stages" if stages else "")
        if v.role == "imm":
            return f"evtc::Sm90Immediate<{common.float_bits(n.value)}>", f"constant {n.value!r}"
        if v.role in ("compute", "keep"):
            functor = ops.get(n.op).functor
            return f"{FUSION}::Sm90Compute<{functor}, {n.dtype.cutlass}, float, {ROUND}>", n.op
        if v.role in ("row_reduction", "col_reduction"):
            reg, shfl, gmem, _ = REDUCE_FNS[n.op]
            # evtc's row reduction (over N, one value per row) is CUTLASS's Sm90ColReduction
            # (a column vector), and evtc's column reduction is CUTLASS's Sm90RowReduction.
            cls, stride = ("Sm90ColReduction", STRIDE_COL) if v.role == "row_reduction" else ("Sm90RowReduction", STRIDE_ROW)
            return (f"{FUSION}::{cls}<{reg}, {shfl}, {gmem}, 0, TileShape, {n.dtype.cutlass}, float, {ROUND}, {stride}>",
                    f"{n.name}: {n.role} ({n.op.value})")
        if v.role == "scalar_reduction":
            reg, _, _, atomic = REDUCE_FNS[n.op]
            return (f"{FUSION}::Sm90ScalarReduction<{reg}, {atomic}, {n.dtype.cutlass}, float, {ROUND}, {STRIDE_SCALAR}>",
                    f"{n.name}: scalar reduction ({n.op.value})")
        raise AssertionError(v.role)

    def visitor_args(self, v: Visitor) -> str:
        """The ``Arguments`` initializer of one visitor (the fields of ``evtc_args_t``)."""
        n = v.node
        if v.role in ("acc", "src", "imm", "compute", "keep"):
            return "{}"
        if v.role == "scalar":
            if n.by_pointer:
                return (f"{{{{}}, {{static_cast<{n.dtype.cutlass} const*>(args.p_{n.name})}}, "
                        f"{{{{cute::_0{{}}, cute::_0{{}}, args.bs_{n.name}}}}}}}")
            return f"{{{{{n.dtype.cutlass}(args.s_{n.name})}}, {{}}, {{}}}}"
        if v.role in ("row", "col"):
            stride = "cute::_0{}, cute::_1{}" if v.role == "row" else "cute::_1{}, cute::_0{}"
            return (f"{{static_cast<{n.dtype.cutlass} const*>(args.p_{n.name}), {n.dtype.cutlass}(0), "
                    f"{{{stride}, args.bs_{n.name}}}}}")
        if v.role == "aux_load":
            return (f"{{static_cast<{n.dtype.cutlass} const*>(args.p_{n.name}), {n.dtype.cutlass}(0), "
                    f"{{args.ld_{n.name}, cute::_1{{}}, args.bs_{n.name}}}}}")
        if v.role == "aux_store":
            return f"{{static_cast<{n.dtype.cutlass}*>(args.p_{n.name}), {{args.ld_{n.name}, cute::_1{{}}, args.bs_{n.name}}}}}"
        if v.role in ("row_reduction", "col_reduction", "scalar_reduction"):
            stride = {"row_reduction": "cute::_1{}, cute::_0{}", "col_reduction": "cute::_0{}, cute::_1{}",
                      "scalar_reduction": "cute::_0{}, cute::_0{}"}[v.role]
            # Sm90ScalarReduction takes an ElementOutput*, the row/column reductions a void*
            ptr = f"static_cast<{n.dtype.cutlass}*>(args.p_{n.name})" if v.role == "scalar_reduction" else f"args.p_{n.name}"
            return (f"{{{ptr}, {common.float_literal(n.op.identity)}, "
                    f"{{{stride}, args.bs_{n.name}}}}}")
        raise AssertionError(v.role)

    # ---- the tree ---------------------------------------------------------------------------------

    def declare(self, t: TreeLike) -> str:
        """Declare ``t`` (children first) and return its alias."""
        if isinstance(t, Tree):
            kids = [self.declare(c) for c in t.children]
            typ, comment = self.visitor_type(t.op)
            k = self.counter
            self.counter += 1
            kind = t.op.node.op if t.op.role in ("compute", "keep") else t.op.role
            alias = f"N{k}_{kind}"
            self.decls.append(Decl(alias, typ, comment))
            self.op_alias[id(t)] = alias
            if kids:
                evt = f"EVT{k}"
                self.decls.append(Decl(evt, f"{FUSION}::Sm90EVT<{alias}, {', '.join(kids)}>", f"{kind}({', '.join(kids)})"))
                alias = evt
            self.alias_of[id(t)] = alias
            return alias
        kids = [self.declare(o) for o in t.ops]
        k = self.counter
        self.counter += 1
        edges = ", ".join("cute::seq<" + ", ".join(map(str, e)) + ">" for e in t.edges)
        alias = f"Topo{k}"
        self.decls.append(Decl(alias, f"{FUSION}::Sm90TopologicalVisitor<float, cute::tuple<{edges}>, {', '.join(kids)}>",
                               f"topological region of {len(t.ops)} ops"))
        self.alias_of[id(t)] = alias
        return alias

    def arguments(self, t: TreeLike, indent: int) -> list[str]:
        """Lines of the nested initializer for ``t`` (without a trailing comma)."""
        pad = "  " * indent
        if isinstance(t, Tree) and not t.children:
            return [f"{pad}{self.visitor_args(t.op)}  // {self.alias_of[id(t)]}"]
        parts: list[tuple[list[str], str]] = []
        if isinstance(t, Tree):
            for c in t.children:
                parts.append((self.arguments(c, indent + 1), ""))
            parts.append(([f"{pad}  {self.visitor_args(t.op)}  // {self.op_alias[id(t)]}"], ""))
        else:
            for o in t.ops:
                parts.append((self.arguments(o, indent + 1), ""))
        lines = [f"{pad}{{  // {self.alias_of[id(t)]}"]
        for i, (body, _) in enumerate(parts):
            body = list(body)
            if i < len(parts) - 1:
                # the comma goes before the comment of the part's last line
                last = body[-1]
                code, sep, comment = last.partition("  //")
                body[-1] = code + "," + (sep + comment if sep else "")
            lines.extend(body)
        lines.append(f"{pad}}}")
        return lines


def visitor_paths(root: TreeLike) -> dict[tuple[str, str], tuple[int, ...]]:
    """(role, name) -> index path of each aux load/store visitor through the nested ``ops``
    tuples (``Sm90EVT<Node, Children...>`` holds (children..., node); a topological visitor
    holds its ops in order), as ``evtc::Sm90SmemAlias`` walks them."""
    paths: dict[tuple[str, str], tuple[int, ...]] = {}

    def walk(t: TreeLike, path: tuple[int, ...]) -> None:
        if isinstance(t, Tree):
            for i, c in enumerate(t.children):
                walk(c, path + (i,))
            here = path + (len(t.children),) if t.children else path
            if t.op.role in ("aux_load", "aux_store"):
                paths[(t.op.role, t.op.name)] = here
        else:
            for i, o in enumerate(t.ops):
                walk(o, path + (i,))

    walk(root, ())
    return paths


def _alias_wrapper(plan: Plan, root_alias: str) -> tuple[str, str]:
    """The ``FusionCallbacks`` type: the tree itself, or wrapped by ``evtc::Sm90SmemAlias``."""
    if not plan.alias:
        return root_alias, ""
    paths = visitor_paths(plan.tree.root)

    def seq(p: tuple[int, ...]) -> str:
        return "cute::seq<" + ", ".join(map(str, p)) + ">"

    pairs = ", ".join(f"evtc::AliasPair<{seq(paths[('aux_load', ld)])}, {seq(paths[('aux_store', st)])}>"
                      for st, ld in plan.alias)
    note = "; ".join(f"{st} lives in {ld}'s buffer" for st, ld in plan.alias)
    return f"evtc::Sm90SmemAlias<{root_alias}, {pairs}>", note


def emit_sm90(graph: Graph, plan: Plan, *, name: str | None = None) -> str:
    """The ``.cu`` source of ``graph`` planned by ``plan`` for sm90.

    Args:
        graph: the epilogue after passes.
        plan: its sm90 plan (with the visitor tree).
        name: kernel name used in comments and the info JSON (default: the graph's name).

    Returns:
        The source text; deterministic (the same graph and plan give the same bytes).
    """
    assert plan.arch == "sm90" and plan.tree is not None
    em = _Emitter(graph, plan)
    root = em.declare(plan.tree.root)
    fusion_args = em.arguments(plan.tree.root, 3)
    cfg = plan.config
    a, b = plan.operands
    c_input = graph.input(plan.c_slot) if plan.c_slot else None
    d_output = graph.output(plan.d_slot)
    fields = abi_fields(graph, "sm90")
    uses = {v.role for v in plan.tree.visitors()}
    info = {
        "abi_version": ABI_VERSION,
        "name": name or graph.name,
        "arch": "sm90",
        # the tile order is a run-time argument: leave it out, so that it doesn't change the source
        "plan": {**plan.to_json(), "config": cfg.kernel_json("sm90")},
        "abi": [f.to_json() for f in fields],
        "ir": print_graph(graph),
    }
    return common.render(
        "sm90/gemm.cu.j2",
        name=name or graph.name,
        ir_lines=print_graph(graph).rstrip("\n").splitlines(),
        plan_lines=str(plan).rstrip("\n").splitlines(),
        functors=common.read_template_file("common/functors.hpp"),
        driver_shim=common.read_template_file("common/driver_shim.hpp"),
        visitors=common.read_template_file("sm90/visitors.hpp"),
        element_a=a.cutlass,
        element_b=b.cutlass,
        alignment_a=16 // a.bytes,
        alignment_b=16 // b.bytes,
        element_c=c_input.dtype.cutlass if c_input is not None else "void",
        element_d=d_output.dtype.cutlass,
        tile_shape=cxx_shape(*cfg.tile),
        cluster_shape=cxx_shape(*cfg.cluster),
        epilogue_tile=cxx_shape(*plan.epilogue_tile),
        kernel_schedule=KERNEL_SCHEDULES[(cfg.schedule, bool(cfg.fast_accum and a.is_fp8))],
        tile_scheduler=SCHEDULERS[cfg.scheduler],
        stages_c=plan.stages_c,
        stages_d=plan.stages_d,
        fragment_size=plan.fragment_size,
        reuse_smem_c="true" if plan.reuse_smem_c else "false",
        delay_tma_store="true" if plan.delay_tma_store else "false",
        copy_atom_c="SM90_U32x4_STSM_N" if plan.epilogue_tile[1] % 16 == 0 else "SM90_U32x2_STSM_N",
        decls=em.decls,
        root=_alias_wrapper(plan, root)[0],
        root_note=_alias_wrapper(plan, root)[1],
        stage_count=(f"cutlass::gemm::collective::StageCount<{cfg.stages}>" if cfg.stages else
                     "cutlass::gemm::collective::StageCountAutoCarveout<static_cast<int>(sizeof(typename CollectiveEpilogue::SharedStorage))>"),
        epilogue_smem_bytes=plan.epilogue_smem_bytes,
        mainloop_stages=plan.mainloop_stages,
        fusion_args=fusion_args,
        c_ptr=f"static_cast<ElementC const*>(args.p_{c_input.name})" if c_input is not None else "nullptr",
        c_stride=f"StrideC{{args.ld_{c_input.name}, cute::_1{{}}, args.bs_{c_input.name}}}" if c_input is not None
        else "StrideC{}",
        d_ptr=f"static_cast<ElementD*>(args.p_{d_output.name})",
        d_stride=f"StrideD{{args.ld_{d_output.name}, cute::_1{{}}, args.bs_{d_output.name}}}",
        fields=fields,
        abi_version=ABI_VERSION,
        info_json=common.c_string(common.json_compact(info)),
        uses_reduction=bool(uses & {"row_reduction", "col_reduction", "scalar_reduction"}),
    )
