"""The sm80 emitter: Graph + Sm80Plan -> a CUDA C++ source of the fused GEMM for Ampere.

Input: the Graph after passes and its :class:`~evtc.plan.sm80.Sm80Plan` (which carries the
visitor tree, already wrapped in the visitor of the output that stores D, and the kernel
variants). Output: the ``.cu`` text, from ``codegen_templates/sm80/gemm.cu.j2``.

The visitor tree becomes one ``using`` per visitor (``N<k>_<kind>``), one per ``Sm80EVT``
composition (``EVT<k>``) and one per topological region (``Topo<k>``), declared children first
inside ``Visitors<kEpilogueAccess>`` (the thread map, and so every type that depends on it,
differs per kernel variant). The same tree, walked the same way, gives the nested initializer of
``FusionCallbacks::Arguments``, each positional field commented with the visitor it
initializes. Everything else the template prints (variant requirements, reduction fills and
conversions) is a list computed here from the plan.
"""

from __future__ import annotations

import dataclasses

from evtc import ops
from evtc.emit import common
from evtc.abi import ABI_VERSION, abi_fields
from evtc.ir.graph import Graph
from evtc.ir.nodes import ReduceOp, Reduction, RowBroadcast, Source
from evtc.ir.printer import print_graph
from evtc.passes.dag_to_tree import Tree, TreeLike, Visitor
from evtc.plan.sm80 import EPILOGUE_STAGES, KernelVariant, Sm80Plan

TB = "cutlass::epilogue::threadblock"
ROUND = "cutlass::FloatRoundStyle::round_to_nearest"
STRIDE_MN = "cute::Stride<int64_t, cute::_1, int64_t>"
STRIDE_ROW = "cute::Stride<cute::_0, cute::_1, int64_t>"  # a length-N vector per batch
STRIDE_COL = "cute::Stride<cute::_1, cute::_0, int64_t>"  # a length-M vector per batch
# VisitorScalarBroadcast/VisitorScalarReduction static_assert one of _0 / _1 / int as L's stride
STRIDE_SCALAR_VALUE = "cute::Stride<cute::_0, cute::_0, cute::_0>"
STRIDE_SCALAR_BATCHED = "cute::Stride<cute::_0, cute::_0, int>"

# (register reduce functor, atomic reduce functor) per op (visitor_store.hpp's RegReduceFn and
# AtomicReduceFn); atomics on float: cutlass/functional.h, evtc::atomic_minimum in functors.hpp
REDUCE_FNS = {
    ReduceOp.SUM: ("cutlass::plus", "cutlass::atomic_add"),
    ReduceOp.MAX: ("cutlass::maximum", "cutlass::atomic_maximum"),
    ReduceOp.MIN: ("cutlass::minimum", "evtc::atomic_minimum"),
}
SWIZZLE_STREAMK = "cutlass::gemm::threadblock::ThreadblockSwizzleStreamK"


@dataclasses.dataclass
class Decl:
    """One ``using`` line: alias = type, with a comment naming the IR node."""

    alias: str
    type: str
    comment: str


@dataclasses.dataclass
class Requirement:
    """One line of a variant's requirement: a C++ condition and what it checks."""

    code: str
    comment: str


@dataclasses.dataclass
class VariantText:
    """What the template prints for one kernel variant."""

    index: int
    name: str
    alignment_ab: int
    epilogue_access: int
    stages: int
    epilogue_smem_bytes: int
    why: str
    requirements: list[Requirement]


@dataclasses.dataclass
class ReductionInit:
    """One reduction output: where the kernel accumulates it and how it is initialised."""

    name: str
    target: str  # float* expression the visitor's atomics update
    count: str  # elements per batch
    batch_stride: str  # of target, in elements
    identity: str
    convert_to: str | None  # C++ element type to round the float workspace into, or None
    output: str  # the output pointer expression (for the conversion)
    output_batch_stride: str


def _c_gemm_shape(dims) -> str:
    return "cutlass::gemm::GemmShape<" + ", ".join(map(str, dims)) + ">"


def _reduction_count(r: Reduction) -> str:
    return {1: "args.M", 0: "args.N", None: "1"}[r.dim]


class _Emitter:
    def __init__(self, graph: Graph, plan: Sm80Plan) -> None:
        self.graph = graph
        self.plan = plan
        self.decls: list[Decl] = []
        self.counter = 0
        self.alias_of: dict[int, str] = {}  # id(Tree/Topo) -> alias (EVT<k>, Topo<k> or N<k>_...)
        self.op_alias: dict[int, str] = {}  # id(Tree) -> alias of its own visitor (N<k>_...)

    # ---- visitor types ------------------------------------------------------------------------

    def visitor_type(self, v: Visitor) -> tuple[str, str]:
        """(C++ type, comment) of one visitor, in ``Visitors<kEpilogueAccess>`` (where
        ``OutputTileThreadMap`` is the variant's thread map)."""
        n = v.node
        if v.role == "acc":
            return f"{TB}::VisitorAccFetch", "acc"
        if v.role == "scalar":
            if n.by_pointer:
                return (f"{TB}::VisitorScalarBroadcast<{n.dtype.cutlass}, {STRIDE_SCALAR_BATCHED}>",
                        f"{n.name}: scalar by device pointer")
            return f"{TB}::VisitorScalarBroadcast<{n.dtype.cutlass}, {STRIDE_SCALAR_VALUE}>", f"{n.name}: scalar by value"
        if v.role == "row":
            return (f"{TB}::VisitorRowBroadcast<OutputTileThreadMap, {n.dtype.cutlass}, {STRIDE_ROW}>",
                    f"{n.name}[n]: row broadcast")
        if v.role == "col":
            return (f"{TB}::VisitorColBroadcast<OutputTileThreadMap, {n.dtype.cutlass}, {STRIDE_COL}>",
                    f"{n.name}[m]: column broadcast")
        if v.role == "aux_load":
            what = "the source C" if isinstance(n, Source) else "aux load"
            return (f"{TB}::VisitorAuxLoad<OutputTileThreadMap, {n.dtype.cutlass}, {STRIDE_MN}>",
                    f"{n.name}: {what}, register-direct")
        if v.role == "aux_store":
            return (f"{TB}::VisitorAuxStore<OutputTileThreadMap, {n.dtype.cutlass}, {ROUND}, {STRIDE_MN}>",
                    f"{n.name}: store, register-direct")
        if v.role == "imm":
            return f"evtc::Sm80Immediate<{common.float_bits(n.value)}>", f"constant {n.value!r}"
        if v.role in ("compute", "keep"):
            functor = ops.get(n.op).functor
            return f"{TB}::VisitorCompute<{functor}, {n.dtype.cutlass}, float, {ROUND}>", n.op
        if v.role in ("row_reduction", "col_reduction", "scalar_reduction"):
            reg, atomic = REDUCE_FNS[n.op]
            # evtc's row reduction (over N, one value per row) is CUTLASS's VisitorColReduction
            # (a column vector), and evtc's column reduction is CUTLASS's VisitorRowReduction.
            cls, stride = {"row_reduction": ("VisitorColReduction", STRIDE_COL),
                           "col_reduction": ("VisitorRowReduction", STRIDE_ROW),
                           "scalar_reduction": ("VisitorScalarReduction", STRIDE_SCALAR_BATCHED)}[v.role]
            return (f"{TB}::{cls}<{reg}, {atomic}, OutputTileThreadMap, float, float, {ROUND}, {stride}>",
                    f"{n.name}: {n.role} ({n.op.value}), float atomics")
        raise AssertionError(v.role)

    def visitor_args(self, v: Visitor) -> str:
        """The ``Arguments`` initializer of one visitor (fields of ``evtc_args_t``; reductions
        kept in the float workspace point into ``scratch``)."""
        n = v.node
        t = n.dtype.cutlass
        if v.role in ("acc", "imm", "compute", "keep"):
            return "{}"
        if v.role == "scalar":  # {scalars[1], scalar_ptrs[1], dScalar}
            if n.by_pointer:
                return (f"{{{{{t}(0)}}, {{static_cast<{t} const*>(args.p_{n.name})}}, "
                        f"{{cute::_0{{}}, cute::_0{{}}, static_cast<int>(args.bs_{n.name})}}}}")
            return f"{{{{{t}(args.s_{n.name})}}, {{nullptr}}, {{}}}}"
        if v.role in ("row", "col"):  # {ptr, null_default, stride}
            stride = "cute::_0{}, cute::_1{}" if v.role == "row" else "cute::_1{}, cute::_0{}"
            return f"{{static_cast<{t} const*>(args.p_{n.name}), {t}(0), {{{stride}, args.bs_{n.name}}}}}"
        if v.role == "aux_load":  # {ptr (non-const in CUTLASS), null_default, stride}
            return (f"{{const_cast<{t}*>(static_cast<{t} const*>(args.p_{n.name})), {t}(0), "
                    f"{{args.ld_{n.name}, cute::_1{{}}, args.bs_{n.name}}}}}")
        if v.role == "aux_store":  # {ptr, stride}
            return f"{{static_cast<{t}*>(args.p_{n.name}), {{args.ld_{n.name}, cute::_1{{}}, args.bs_{n.name}}}}}"
        if v.role in ("row_reduction", "col_reduction", "scalar_reduction"):  # {ptr, identity, stride}
            init = self.reduction_init(n)
            bs = init.batch_stride if v.role != "scalar_reduction" else f"static_cast<int>({init.batch_stride})"
            stride = {"row_reduction": "cute::_1{}, cute::_0{}", "col_reduction": "cute::_0{}, cute::_1{}",
                      "scalar_reduction": "cute::_0{}, cute::_0{}"}[v.role]
            return f"{{{init.target}, {init.identity}, {{{stride}, {bs}}}}}"
        raise AssertionError(v.role)

    def reduction_init(self, r: Reduction) -> ReductionInit:
        scratch = r.name in self.plan.scratch
        count = _reduction_count(r)
        out = f"static_cast<{r.dtype.cutlass}*>(args.p_{r.name})"
        return ReductionInit(
            name=r.name,
            target=f"scratch.{r.name}" if scratch else f"static_cast<float*>(args.p_{r.name})",
            count=count,
            batch_stride=count if scratch else f"args.bs_{r.name}",
            identity=common.float_literal(r.op.identity),
            convert_to=r.dtype.cutlass if scratch else None,
            output=out,
            output_batch_stride=f"args.bs_{r.name}",
        )

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
                self.decls.append(Decl(evt, f"{TB}::Sm80EVT<{alias}, {', '.join(kids)}>", f"{kind}({', '.join(kids)})"))
                alias = evt
            self.alias_of[id(t)] = alias
            return alias
        kids = [self.declare(o) for o in t.ops]
        k = self.counter
        self.counter += 1
        edges = ", ".join("cute::seq<" + ", ".join(map(str, e)) + ">" for e in t.edges)
        alias = f"Topo{k}"
        self.decls.append(Decl(alias, f"{TB}::Sm80TopologicalVisitor<float, cute::tuple<{edges}>, {', '.join(kids)}>",
                               f"topological region of {len(t.ops)} ops"))
        self.alias_of[id(t)] = alias
        return alias

    def arguments(self, t: TreeLike, indent: int) -> list[str]:
        """Lines of the nested initializer for ``t`` (without a trailing comma)."""
        pad = "  " * indent
        if isinstance(t, Tree) and not t.children:
            return [f"{pad}{self.visitor_args(t.op)}  // {self.alias_of[id(t)]}"]
        parts: list[list[str]] = []
        if isinstance(t, Tree):
            for c in t.children:
                parts.append(self.arguments(c, indent + 1))
            parts.append([f"{pad}  {self.visitor_args(t.op)}  // {self.op_alias[id(t)]}"])
        else:
            for o in t.ops:
                parts.append(self.arguments(o, indent + 1))
        lines = [f"{pad}{{  // {self.alias_of[id(t)]}"]
        for i, body in enumerate(parts):
            body = list(body)
            if i < len(parts) - 1:
                # the comma goes before the comment of the part's last line
                code, sep, comment = body[-1].partition("  //")
                body[-1] = code + "," + (sep + comment if sep else "")
            lines.extend(body)
        lines.append(f"{pad}}}")
        return lines

    # ---- kernel variants ------------------------------------------------------------------------

    def requirements(self, v: KernelVariant) -> list[Requirement]:
        """The run-time conditions under which variant ``v`` accesses only elements inside the
        problem with aligned vectors (NOTE [Ragged shapes on sm80] in :mod:`evtc.plan.sm80`)."""
        a, b = self.plan.operands
        reqs: list[Requirement] = []
        if v.alignment_ab > 1:
            va = v.alignment_ab
            reqs.append(Requirement(f"args.K % {va} == 0", f"K: whole {va}-element vectors of A and B"))
            for op, dt in (("A", a), ("B", b)):
                reqs.append(Requirement(
                    f"is_aligned(args.p_{op}, {va * dt.bytes}) && args.ld_{op} % {va} == 0 && args.bs_{op} % {va} == 0",
                    f"{op}: base, row and batch strides"))
        if v.epilogue_access > 1:
            reqs.append(Requirement(f"args.N % {v.epilogue_access} == 0",
                                    f"N: whole {v.epilogue_access}-element epilogue accesses"))
        leaves = {n.name: n for n in self.graph.used_inputs}
        outs = {o.name: o for o in self.graph.outputs}
        for name, elems in v.vectors:
            if elems == 1:
                continue
            node = leaves.get(name) or outs[name]
            stride = "" if isinstance(node, RowBroadcast) else f" && args.ld_{name} % {elems} == 0"
            reqs.append(Requirement(
                f"is_aligned(args.p_{name}, {elems * node.dtype.bytes}){stride} && args.bs_{name} % {elems} == 0",
                f"{name}: {elems}-element vectors"))
        return reqs


def _variant_texts(em: _Emitter, plan: Sm80Plan) -> list[VariantText]:
    return [VariantText(i, v.name, v.alignment_ab, v.epilogue_access, v.stages, v.epilogue_smem_bytes, v.why,
                        em.requirements(v)) for i, v in enumerate(plan.variants)]


def emit_sm80(graph: Graph, plan: Sm80Plan, *, name: str | None = None) -> str:
    """The ``.cu`` source of ``graph`` planned by ``plan`` for sm80.

    Args:
        graph: the epilogue after passes.
        plan: its :class:`~evtc.plan.sm80.Sm80Plan` (with the wrapped visitor tree).
        name: kernel name used in comments and the info JSON (default: the graph's name).

    Returns:
        The source text; deterministic (the same graph and plan give the same bytes).
    """
    assert plan.arch == "sm80" and plan.tree is not None
    em = _Emitter(graph, plan)
    root = em.declare(plan.tree.root)
    fusion_args = em.arguments(plan.tree.root, 4)
    cfg = plan.config
    a, b = plan.operands
    fields = abi_fields(graph, "sm80")
    info = {
        "abi_version": ABI_VERSION,
        "name": name or graph.name,
        "arch": "sm80",
        "plan": plan.to_json(),
        "abi": [f.to_json() for f in fields],
        "ir": print_graph(graph),
    }
    reductions = [em.reduction_init(o) for o in graph.outputs if isinstance(o, Reduction)]
    variants = _variant_texts(em, plan)
    return common.render(
        "sm80/gemm.cu.j2",
        name=name or graph.name,
        ir_lines=print_graph(graph).rstrip("\n").splitlines(),
        plan_lines=str(plan).rstrip("\n").splitlines(),
        functors=common.read_template_file("common/functors.hpp"),
        visitors=common.read_template_file("sm80/visitors.hpp"),
        element_a=a.cutlass,
        element_b=b.cutlass,
        element_output=plan.thread_map_element.cutlass,
        threadblock_shape=_c_gemm_shape(cfg.tile),
        warp_shape=_c_gemm_shape(plan.warp_tile),
        instruction_shape=_c_gemm_shape(plan.instruction_shape),
        epilogue_stages=EPILOGUE_STAGES,
        swizzle=SWIZZLE_STREAMK if cfg.scheduler == "streamk"
        else f"cutlass::gemm::threadblock::GemmIdentityThreadblockSwizzle<{plan.swizzle}>",
        scheduler=cfg.scheduler,
        decls=em.decls,
        root=root,
        variants=variants,
        tried=variants[:-1],
        fallback=variants[-1],
        fusion_args=fusion_args,
        scratch=[r for r in reductions if r.convert_to is not None],
        reductions=reductions,
        epilogue_smem_bytes=plan.epilogue_smem_bytes,
        mainloop_stages=plan.mainloop_stages,
        smem_capacity=plan.smem_capacity,
        fields=fields,
        abi_version=ABI_VERSION,
        info_json=common.c_string(common.json_compact(info)),
    )
