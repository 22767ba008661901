"""``evtc.plugin.lower``: an epilogue -> an :class:`~evtc.plugin.fragment.EpilogueFragment`.

Input: an epilogue (an ``@evtc.epilogue`` function, an expression, a Graph or the canonical IR
text), the CTA tile, schedule and dtypes a kernel generator will use. Output: the fragment: the
fusion callbacks type and the collective epilogue's parameters as evtc's planner decided them
for that tile, their C++ declarations, and the ``Arguments`` initializer with placeholders.

The epilogue goes through exactly the pipeline of :class:`evtc.Gemm` (trace, passes, the sm90
plan), and its visitor tree is printed by the same emitter pieces (:class:`evtc.emit.core.
TreeEmitter` with the sm90 node table of :mod:`evtc.emit.sm90`), so the fusion callbacks type of
a fragment is, ``using`` line for ``using`` line, the one evtc's own GEMM of the same
configuration compiles (``tests/null/test_plugin.py`` compares them).
"""

from __future__ import annotations

import dataclasses
import keyword
import re
from typing import Any, Mapping

from evtc.abi import abi_fields
from evtc.dtypes import DType
from evtc.emit import common
from evtc.errors import FragmentError, api_boundary
from evtc.ir import nodes as N
from evtc.ir.graph import Graph
from evtc.plugin.fragment import FRAGMENT_VERSION, EpilogueFragment, Parameter, Placeholder
from evtc.plugin.stable import stable

__all__ = ["lower", "CXX_MEMBERS"]

#: CUTLASS's header set the declarations include (the epilogue collective, its builder helpers,
#: the fusion visitors, the activation functors), then evtc's helpers (codegen_templates/include).
CUTLASS_HEADERS = (
    "cute/tensor.hpp",
    "cutlass/cutlass.h",
    "cutlass/numeric_types.h",
    "cutlass/gemm/dispatch_policy.hpp",
    "cutlass/epilogue/collective/collective_builder.hpp",
    "cutlass/epilogue/fusion/sm90_callbacks_tma_warpspecialized.hpp",
    "cutlass/epilogue/thread/activation.h",
)
EVTC_HEADERS = ("evtc/functors.hpp", "evtc/sm90_visitors.hpp")
#: evtc's row and column reduction visitors (Sm90ColReductionParallel / Sm90RowReductionParallel
#: through the workspace, Sm90ColReductionAtomic / Sm90RowReductionAtomic): included where used
REDUCTION_HEADER = "evtc/sm90_reductions.hpp"
SUPPORT_HEADERS = ("evtc/driver_shim.hpp",)

EPILOGUE_SCHEDULES = {"cooperative": "cutlass::epilogue::TmaWarpSpecializedCooperative",
                      "pingpong": "cutlass::epilogue::TmaWarpSpecialized"}

#: Member names of the fragment struct (fragment.h.j2); the struct's name may be none of them.
CXX_MEMBERS = frozenset({
    "kFragmentVersion", "TileShape", "ClusterShape", "KernelSchedule", "EpilogueSchedule", "ElementA", "ElementB",
    "ElementAccumulator", "EpilogueTile", "ElementC", "ElementD", "StrideC", "StrideD", "StagesC", "StagesD",
    "FragmentSize", "ReuseSmemC", "DelayTmaStore", "DispatchPolicy", "SmemElementC", "SmemElementD", "CopyOpG2S",
    "SmemLayoutAtomC", "CopyOpS2R", "CopyOpS2G", "SmemLayoutAtomD", "CopyOpR2S", "CopyAtomC", "FusionCallbacks",
    "CollectiveEpilogue", "SharedStorageBytes", "MainloopStages", "Params", "fusion_arguments", "arguments",
})
_ALIAS = re.compile(r"^(N\d+_\w*|EVT\d+|Topo\d+)$")  # the visitor aliases TreeEmitter declares
_IDENT = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# C++ keywords Python doesn't have (Python's own are checked with keyword.iskeyword)
_CXX_KEYWORDS = frozenset("""alignas alignof asm auto bool case catch char char16_t char32_t class const constexpr
const_cast continue decltype default delete do double dynamic_cast enum explicit export extern float friend goto int
long mutable namespace new noexcept nullptr operator private protected public register reinterpret_cast short signed
sizeof static static_assert static_cast struct switch template this thread_local throw typedef typeid typename union
unsigned using virtual void volatile wchar_t std cute cutlass evtc""".split())
_ARGS_REF = re.compile(r"\bargs\.([A-Za-z_][A-Za-z0-9_]*)")
_IR_HEADER = re.compile(r"^\s*(?:#[^\n]*\n\s*)*epilogue\s+\w+\s*\(")


def _cxx_identifier(value: Any, what: str, *, member_check: bool) -> str:
    if not isinstance(value, str) or not _IDENT.match(value):
        raise FragmentError(f"{what}={value!r} is not a C++ identifier",
                            hint="use letters, digits and underscores, not starting with a digit")
    if value in _CXX_KEYWORDS or keyword.iskeyword(value) or value.startswith("__") or re.match(r"^_[A-Z]", value):
        raise FragmentError(f"{what}={value!r} is a C++ keyword, a name CUTLASS or evtc uses, or a reserved name",
                            hint="choose another name, e.g. 'BiasReluEpilogue'")
    if member_check and (value in CXX_MEMBERS or _ALIAS.match(value)):
        raise FragmentError(f"{what}={value!r} is the name of a member of the fragment struct",
                            hint="choose another name, e.g. 'BiasReluEpilogue'")
    return value


def _namespace(value: Any) -> str:
    if not isinstance(value, str) or not value:
        raise FragmentError(f"namespace={value!r}: a C++ namespace such as 'my_kernels' or 'my::kernels'")
    for part in value.split("::"):
        _cxx_identifier(part, "namespace", member_check=False)
    return value


def _as_tuple(x: Any) -> Any:
    return tuple(x) if isinstance(x, list) else x


def _epilogue_input(epilogue: Any) -> Any:
    """The epilogue in a form :class:`evtc.Gemm` takes: IR text is parsed here, the other forms
    pass through."""
    from evtc.frontend.epilogue import Epilogue

    if isinstance(epilogue, str):
        if _IR_HEADER.match(epilogue):
            from evtc.frontend.text import parse_ir

            return parse_ir(epilogue)
        return epilogue
    if isinstance(epilogue, (Epilogue, Graph)) or callable(epilogue):
        return epilogue
    raise FragmentError(f"epilogue={type(epilogue).__name__}: give an @evtc.epilogue function, an expression string "
                        "('D = relu(acc + bias[n])'), a Graph or the canonical IR text ('epilogue f(...):')")


def _kind(node) -> str:
    if isinstance(node, N.Source):
        return "source"
    if isinstance(node, N.AuxLoad):
        return "aux_load"
    if isinstance(node, N.RowBroadcast):
        return "row_broadcast"
    if isinstance(node, N.ColBroadcast):
        return "col_broadcast"
    if isinstance(node, N.ScalarBroadcast):
        return "device_scalar" if node.by_pointer else "scalar"
    if isinstance(node, N.Store):
        return "store"
    if isinstance(node, N.GroupScale):
        return "group_scale"
    if isinstance(node, N.Reduction):
        return {1: "row_reduction", 0: "col_reduction", None: "scalar_reduction"}[node.dim]
    raise FragmentError(f"no fragment parameter kind for {type(node).__name__} '{getattr(node, 'name', '')}'")


_SHAPES = {
    "source": ("L", "M", "N"), "aux_load": ("L", "M", "N"), "store": ("L", "M", "N"),
    "row_broadcast": ("L", "N"), "col_broadcast": ("L", "M"), "device_scalar": ("L",), "scalar": (),
    "row_reduction": ("L", "M"), "col_reduction": ("L", "N"), "scalar_reduction": ("L",),
    "group_scale": ("L", "M", "G"),
}


def _parameters(graph: Graph, plan, placeholders: tuple[Placeholder, ...]) -> tuple[Parameter, ...]:
    # the sm90 plan has a Buffer (with its mode) for every tensor but by-value scalars
    modes = {b.name: b.mode for b in plan.buffers}
    by_tensor: dict[str, list[str]] = {}
    for p in placeholders:
        by_tensor.setdefault(p.tensor, []).append(p.name)
    out = []
    nodes = [n for n in graph.used_inputs if not isinstance(n, N.Accumulator)] + list(graph.outputs)
    for n in nodes:
        kind = _kind(n)
        dt: DType = n.dtype
        if kind in ("source", "aux_load", "store"):
            align = 16
        elif kind == "scalar":
            align = 0
        else:
            align = dt.bytes
        slot = "C" if n.name == plan.c_slot else "D" if n.name == plan.d_slot else None
        mode = "value" if kind == "scalar" else modes.get(n.name, "registers")
        red = n if isinstance(n, N.Reduction) else None
        out.append(Parameter(
            name=n.name, kind=kind, io="output" if kind in ("store",) or red is not None else "input", dtype=dt.name,
            element=dt.cutlass, shape=_SHAPES[kind], slot=slot, mode=mode, alignment=align,
            placeholders=tuple(by_tensor.get(n.name, ())), reduce=red.op.value if red is not None else None,
            identity=red.op.identity if red is not None else None))
    return tuple(out)


def _placeholder_text(text: str, names: set[str]) -> str:
    """``args.NAME`` -> ``${NAME}`` (NOTE [Fragment placeholders]), checking every name."""
    found = set(_ARGS_REF.findall(text))
    stray = sorted(found - names)
    if stray:  # an emitter macro read a field the ABI doesn't have: a bug in evtc
        raise FragmentError(f"internal error: the emitted initializer reads {stray}, which are not placeholders",
                            hint="please report this with the epilogue's IR")
    return _ARGS_REF.sub(lambda m: "${" + m.group(1) + "}", text)


@stable(since=1)
@api_boundary
def lower(epilogue: Any, *, arch: str = "sm90", tile: Any, epilogue_tile: Any = None, schedule: str = "cooperative",
          cluster: Any = (1, 1, 1), a: DType | str, b: DType | str | None = None, c: DType | str | None = None,
          d: DType | str | None = None, stages: int | None = None, plan: str | Mapping = "evtc",
          name: str = "EvtcEpilogue", namespace: str = "evtc_fragment") -> EpilogueFragment:
    """Plan ``epilogue`` for a kernel with this tile, schedule and dtypes and return it as an
    epilogue fragment that another generator's CUTLASS 3.x sm90 GEMM uses as its epilogue.

    Args:
        epilogue: an ``@evtc.epilogue`` function (or a plain function evtc can trace), an
            expression (``"D = relu(alpha*acc + beta*C + bias[n])"``), a :class:`evtc.Graph`, or
            the canonical IR text (``"epilogue f(acc: f32 accumulator, ...):\\n  ..."``).
        arch: ``"sm90"`` (fragments are CUTLASS 3.x TMA warp-specialized epilogues).
        tile: the kernel's CTA tile (M, N, K) in elements, e.g. ``(128, 256, 64)``: WGMMA's rules
            (:mod:`evtc.plan.config`).
        epilogue_tile: the epilogue subtile (M, N), or None for the planner's choice. M is 128
            (cooperative) or 64 (ping-pong); N a multiple of 16 dividing the tile's N.
        schedule: ``"cooperative"`` or ``"pingpong"``: the kernel schedule
            (``KernelTmaWarpSpecializedCooperative`` / ``...Pingpong``).
        cluster: the cluster (M, N, 1) or (M, N) the kernel will use (recorded; the epilogue
            does not depend on it).
        a, b: the mainloop operand dtypes (``b`` defaults to ``a``): bf16, f16 or e4m3. They size
            the mainloop's stages, which the plan trades against epilogue buffers.
        c: dtype of the source C when the epilogue reads ``C`` (default: ``d``).
        d: dtype of M x N outputs that don't choose one with ``.to()`` (default: the epilogue's,
            else bf16).
        stages: the mainloop stages the kernel will use (``StageCount<stages>``), or None for
            ``StageCountAutoCarveout`` (as many as fit beside the epilogue).
        plan: ``"evtc"`` (evtc's planner), ``"cutlass"`` (stock CUTLASS's additive rule), or a
            dict of fixed planner decisions, as for :class:`evtc.Gemm`.
        name: the C++ struct's name (an identifier, not one of its members).
        namespace: the C++ namespace of the struct (``a`` or ``a::b``); two fragments with
            different names or namespaces live in one translation unit.

    Returns:
        The :class:`~evtc.plugin.fragment.EpilogueFragment`; ``fragment.header()`` is the C++.

    Raises:
        FragmentError: an arch other than sm90, a name or namespace that is not a usable C++
            identifier, an epilogue of another type, an epilogue with ``evtc.glu`` (its gated
            store is evtc's own root visitor over a void D, no fusion of a stock collective).
        ConfigError: an illegal tile, schedule, cluster, epilogue tile (one that does not divide
            the tile), stage count or dtype, naming it.
        PlanError: the epilogue's buffers do not fit beside two mainloop stages at this tile.
        TraceError, GrammarError, EpilogueTypeError, LegalizeError: the epilogue itself, located
            at the user's line.

    Example::

        frag = evtc.plugin.lower(bias_relu, tile=(128, 256, 64), a=evtc.bf16, d=evtc.bf16,
                                 name="BiasRelu", namespace="my_kernels")
        open("bias_relu.h", "w").write(frag.header())
        args = frag.bind({p.name: f"params.{p.name}" for p in frag.placeholders})
    """
    from evtc.gemm import Gemm
    from evtc.plan.config import GemmConfig

    if arch != "sm90":
        raise FragmentError(f"arch={arch!r}: epilogue fragments are CUTLASS 3.x sm90 (Hopper) collective epilogues",
                            hint="use arch='sm90'; sm80 kernels are built whole by evtc.Gemm(..., arch='sm80')")
    name = _cxx_identifier(name, "name", member_check=True)
    namespace = _namespace(namespace)
    source = _epilogue_input(epilogue)
    cluster = _as_tuple(cluster)
    if isinstance(cluster, tuple) and len(cluster) == 2:
        cluster = (*cluster, 1)
    config = GemmConfig(tile=_as_tuple(tile), cluster=cluster, schedule=schedule, stages=stages,
                        epilogue_tile=_as_tuple(epilogue_tile))
    gemm = Gemm(source, a=a, b=b, c=c, d=d, arch=arch, config=config, plan=plan)
    gated = [o.name for o in gemm.graph.outputs if N.is_gated(o)]
    if gated:
        raise FragmentError(f"output '{gated[0]}' is evtc.glu's: the gated store is evtc's own root visitor over a "
                            "void D (N / 2 columns), which a stock CUTLASS collective epilogue's fusion can't be",
                            epilogue=gemm.name, hint="build the gated GEMM with evtc.Gemm, or make the fragment "
                            "of the epilogue without glu and apply it after the GEMM")
    return _fragment(gemm.graph, gemm.plan, arch, name, namespace)


def _fragment(graph, p, arch: str, name: str, namespace: str) -> EpilogueFragment:
    """The fragment of the planned epilogue ``graph`` (plan ``p``) as the C++ struct
    ``namespace::name``: :func:`lower` after its checks."""
    from evtc.compiler.nvcc import BASE_FLAGS, arch_flags
    from evtc.emit.core import TreeEmitter, terminate
    from evtc.emit.sm90 import KERNEL_SCHEDULES, _share_wrapper, cxx_shape, node_table, uses_tile_reduction
    from evtc.ir.printer import print_graph

    cfg = p.config
    em = TreeEmitter(node_table(p))
    root = em.declare(p.tree.root)
    fusion_root, root_note = _share_wrapper(p, root)
    args = _initializers(em, graph, p, arch)
    c_input, d_output, element_c, element_d, stride = (args.c_input, args.d_output, args.element_c, args.element_d,
                                                      args.stride)
    placeholders = args.placeholders
    parameters = _parameters(graph, p, placeholders)
    schedule_type = KERNEL_SCHEDULES[(cfg.schedule, False)]
    qualified = f"{namespace}::{name}"
    ir_text = print_graph(graph)
    values = dict(
        version=FRAGMENT_VERSION, namespace=namespace, name=name, epilogue=graph.name, qualified=qualified,
        tile=cfg.tile, schedule=cfg.schedule, tile_shape=cxx_shape(*cfg.tile), cluster_shape=cxx_shape(*cfg.cluster),
        kernel_schedule=schedule_type, epilogue_schedule=EPILOGUE_SCHEDULES[cfg.schedule],
        element_a=p.operands[0].cutlass, element_b=p.operands[1].cutlass,
        epilogue_tile=cxx_shape(*p.epilogue_tile), element_c=element_c, element_d=element_d,
        c_note=(f"{c_input.name} through the C slot" if c_input is not None else "no C slot"),
        d_note=f"{d_output.name} through the D slot", stride=stride,
        stages_c=p.stages_c, stages_d=p.stages_d, fragment_size=p.fragment_size,
        reuse_smem_c="true" if p.reuse_smem_c else "false", delay_tma_store="true" if p.delay_tma_store else "false",
        # the epilogue builder's STSM atom for C (sm90_builder.inl): x4 when the subtile's N allows
        copy_atom_c="SM90_U32x4_STSM_N" if p.epilogue_tile[1] % 16 == 0 else "SM90_U32x2_STSM_N",
        decls=em.decls, root=fusion_root, root_note=root_note, smem_bytes=p.epilogue_smem_bytes,
        mainloop_stages=p.mainloop_stages,
        stages_note=(f"the kernel's StageCount<{cfg.stages}>" if cfg.stages else
                     "what StageCountAutoCarveout<SharedStorageBytes> leaves for ElementA/B at TileShape"),
        placeholders=placeholders,
        fusion_body=terminate(_bind_args(args.fusion_text), ";"),
        epilogue_body=terminate(_bind_args(args.epilogue_text), ";"),
    )
    declarations = common.render("plugin/fragment.h.j2", **values)
    # row/column reductions are evtc's derived visitors (evtc/sm90_reductions.hpp)
    evtc_headers = EVTC_HEADERS + ((REDUCTION_HEADER,) if uses_tile_reduction(p) else ())
    link = {"-shared", "-Xcompiler=-fPIC", "-Xcompiler=-fvisibility=hidden"}
    preamble = common.render(
        "plugin/preamble.j2", version=FRAGMENT_VERSION, epilogue=graph.name, qualified=qualified,
        ir_lines=ir_text.rstrip("\n").splitlines(), plan_lines=str(p).rstrip("\n").splitlines(),
        parameters=parameters, flags=[f for f in BASE_FLAGS if f not in link] + list(arch_flags(arch)))
    return EpilogueFragment(
        version=FRAGMENT_VERSION, name=name, namespace=namespace, epilogue=graph.name, arch=arch, ir=ir_text,
        tile=cfg.tile, schedule=cfg.schedule, cluster=cfg.cluster, a=p.operands[0].name, b=p.operands[1].name,
        stages=cfg.stages, kernel_schedule=schedule_type, epilogue_schedule=EPILOGUE_SCHEDULES[cfg.schedule],
        epilogue_tile=p.epilogue_tile, stages_c=p.stages_c, stages_d=p.stages_d, fragment_size=p.fragment_size,
        reuse_smem_c=p.reuse_smem_c, delay_tma_store=p.delay_tma_store,
        c_input=c_input.name if c_input is not None else None, d_output=d_output.name, element_c=element_c,
        element_d=element_d, stride_c=stride, stride_d=stride, smem_bytes=p.epilogue_smem_bytes,
        mainloop_stages=p.mainloop_stages, mainloop_stage_bytes=p.mainloop_stage_bytes,
        smem_capacity=p.smem_capacity, callbacks_type=f"{qualified}::FusionCallbacks",
        collective_epilogue_type=f"{qualified}::CollectiveEpilogue", declarations=declarations,
        headers=CUTLASS_HEADERS + evtc_headers, evtc_headers=evtc_headers, support_headers=SUPPORT_HEADERS,
        fusion_arguments=args.fusion_text, epilogue_arguments=args.epilogue_text, placeholders=placeholders,
        parameters=parameters, preamble=preamble, plan=p, graph=graph,
    )


@dataclasses.dataclass(frozen=True)
class _Initializers:
    """The run-time half of a fragment: its placeholders, the C and D slots' tensors, and the
    fusion and collective initializers with ``${name}`` placeholders."""

    placeholders: tuple
    c_input: Any
    d_output: Any
    element_c: str
    element_d: str
    stride: str
    fusion_text: str
    epilogue_text: str


def _initializers(em, graph, p, arch: str) -> _Initializers:
    """The fusion arguments ``em`` writes for plan ``p`` and the collective's arguments around
    them, with every run-time value a placeholder (checked: each has a place)."""
    from evtc.emit.core import separate
    from evtc.emit.sm90 import mn_stride, mn_stride_args

    fusion_lines = em.arguments(p.tree.root, 0)
    fields = abi_fields(graph, arch)
    start = next(i for i, f in enumerate(fields) if f.name == "bs_B") + 1
    placeholders = tuple(Placeholder(f.name, f.ctype, f.tensor or "", f.what) for f in fields[start:])
    names = {x.name for x in placeholders}

    c_input = graph.input(p.c_slot) if p.c_slot else None
    d_output = graph.output(p.d_slot)
    element_c = c_input.dtype.cutlass if c_input is not None else "void"
    element_d = d_output.dtype.cutlass
    stride = mn_stride(p)
    epilogue_lines = common.render(
        "plugin/arguments.j2",
        fusion_args=["  " + x for x in fusion_lines],
        c_ptr=f"static_cast<{element_c} const*>(args.p_{c_input.name})" if c_input is not None else "nullptr",
        c_stride=f"{stride}{mn_stride_args(p, c_input.name)}" if c_input is not None else f"{stride}{{}}",
        d_ptr=f"static_cast<{element_d}*>(args.p_{d_output.name})",
        d_stride=f"{stride}{mn_stride_args(p, d_output.name)}",
    ).rstrip("\n").splitlines()
    # the fusion arguments are the first positional part: a comma after them
    n_fusion = len(fusion_lines)
    epilogue_lines = epilogue_lines[:1] + separate([epilogue_lines[1:1 + n_fusion], epilogue_lines[1 + n_fusion:]])

    fusion_text = _placeholder_text("\n".join(fusion_lines), names) + "\n"
    epilogue_text = _placeholder_text("\n".join(epilogue_lines), names) + "\n"
    used = set(re.findall(r"\$\{(\w+)\}", epilogue_text))
    if used != names:  # every run-time value has a place in the initializer
        raise FragmentError(f"internal error: placeholders {sorted(names - used)} are not in the initializer",
                            hint="please report this with the epilogue's IR")
    return _Initializers(placeholders, c_input, d_output, element_c, element_d, stride, fusion_text, epilogue_text)


def _bind_args(text: str) -> list[str]:
    """The placeholder text bound to the header's ``Params`` struct (``${x}`` -> ``args.x``)."""
    return re.sub(r"\$\{(\w+)\}", r"args.\1", text).rstrip("\n").splitlines()
