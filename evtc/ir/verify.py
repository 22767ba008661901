"""The IR verifier: the IR's invariants, each stated once, as a table of named rules.

Input: a Graph. Output: nothing, or an :class:`~evtc.errors.IRVerificationError` that shows a
window of IR text around the bad node.

The IR knows no target: per-arch rules (sm90's collective D store, which dtypes a reduction
can be written in) live in :mod:`evtc.passes.legalize` and nowhere else.

The rules (:data:`RULES`, in the order they are checked; ``docs/ir.md`` lists them too):

======================  ==========================================================  =================
rule                    invariant                                                   user error class
======================  ==========================================================  =================
inputs-are-leaves       declared inputs are leaves                                  IRVerificationError
unique-parameters       parameter names are unique                                  IRVerificationError
one-accumulator         at most one accumulator                                     IRVerificationError
has-outputs             at least one output                                         IRVerificationError
defined-before-use      every operand comes before its user in ``graph.nodes``      IRVerificationError
                        (this also catches cycles)
outputs-are-terminal    no output is an operand of another node                     IRVerificationError
outputs-listed          every output reached is in ``graph.outputs``                IRVerificationError
leaves-declared         every leaf reached is a declared input                      IRVerificationError
accumulator-f32         the accumulator is f32                                      EpilogueTypeError
tensor-dtype            M x N inputs and stores have a tensor dtype                 EpilogueTypeError
immediate-f32           constants are f32                                           EpilogueTypeError
immediate-range         a finite constant is finite in f32 (at most 3.4e38)         EpilogueTypeError
known-op                every compute names an op of :mod:`evtc.ops`                UnsupportedOpError
arity                   ... with the op's number of operands                        EpilogueTypeError
convert-target          ``convert`` targets a tensor dtype                          EpilogueTypeError
compute-f32             every other compute produces f32 (the compute type)         EpilogueTypeError
pow-exponent            ``pow``'s exponent is a constant                            EpilogueTypeError
unique-output-names     output names differ from each other and the parameters      IRVerificationError
output-mn               every output's value is M x N                               EpilogueTypeError
reduction-dim           a reduction's ``dim`` is 0, 1 or None                       EpilogueTypeError
quantize-pair           a ``group_quant`` (``evtc.quantize``) is an fp8 value       EpilogueTypeError
                        stored as one output, with its scales (a GroupScale of
                        the same group) as another, and used by nothing else;
                        one per epilogue
glu-store               a ``glu`` (``evtc.glu``, N / 2 columns) is stored as it     EpilogueTypeError
                        is, by the epilogue's only output, and used by nothing
                        else; its attribute is act, a unary op of the table
======================  ==========================================================  =================

Two users of the table, so that no rule is written twice:

* :func:`verify` raises the first violation as an :class:`IRVerificationError`. The pass
  manager runs it after every pass when verification is on (``EVTC_VERIFY=1``,
  :mod:`evtc.passes`); a violation there is a bug in evtc and the message names the pass.
* The ``propagate`` pass (:mod:`evtc.passes.propagate`), which always runs first, raises the
  first violation of the user's graph as the rule's *user error class* above, located at the
  user's line: every rule a user can break (the frontends check most of them first; a
  hand-built :class:`~evtc.ir.graph.Graph` passed to ``evtc.Gemm`` can break any) is enforced
  without a debug flag.

Every check is one pass over ``graph.nodes`` (no recursion), so verifying is linear in the
graph's size; broadcast classes come from :func:`bcast_classes`, not from the recursive
:attr:`Compute.bcast <evtc.ir.nodes.Compute.bcast>`.
"""

from __future__ import annotations

import dataclasses
import math
import warnings
from typing import Iterator

import numpy as np

from evtc import dtypes, ops
from evtc.errors import EpilogueTypeError, EvtcError, IRVerificationError, UnsupportedOpError
from evtc.ir.graph import Graph
from evtc.ir.nodes import (QUANT_CONVENTIONS, QUANT_GROUPS, QUANT_SCALE_LAYOUTS, Accumulator, Bcast,
                           Compute, GroupScale, Immediate, Leaf, Node, Output, Reduction, Store, is_glu_act)
from evtc.ir.printer import window

__all__ = ["RULES", "Violation", "bcast_classes", "format_violation", "verify", "violations"]


#: rule name -> (what it requires, the error class a user's graph that breaks it gets)
RULES: dict[str, tuple[str, type[EvtcError]]] = {
    "inputs-are-leaves": ("declared inputs are leaves", IRVerificationError),
    "unique-parameters": ("parameter names are unique", IRVerificationError),
    "one-accumulator": ("at most one accumulator", IRVerificationError),
    "has-outputs": ("at least one output", IRVerificationError),
    "defined-before-use": ("every operand is defined before its user (no cycles)", IRVerificationError),
    "outputs-are-terminal": ("no output is an operand", IRVerificationError),
    "outputs-listed": ("every output reached is in graph.outputs", IRVerificationError),
    "leaves-declared": ("every leaf reached is a declared input", IRVerificationError),
    "accumulator-f32": ("the accumulator is f32", EpilogueTypeError),
    "tensor-dtype": ("M x N inputs and stores have a tensor dtype", EpilogueTypeError),
    "immediate-f32": ("constants are f32", EpilogueTypeError),
    "immediate-range": ("a finite constant stays finite in f32", EpilogueTypeError),
    "known-op": ("every compute names a registered op", UnsupportedOpError),
    "arity": ("every compute has its op's number of operands", EpilogueTypeError),
    "convert-target": ("convert targets a tensor dtype", EpilogueTypeError),
    "compute-f32": ("computes other than convert produce f32", EpilogueTypeError),
    "pow-exponent": ("pow's exponent is a constant", EpilogueTypeError),
    "unique-output-names": ("output names are unique and differ from the parameters", IRVerificationError),
    "output-mn": ("every output's value is M x N", EpilogueTypeError),
    "reduction-dim": ("a reduction's dim is 0, 1 or None", EpilogueTypeError),
    "quantize-pair": ("a quantized value is one stored output with its scales as another", EpilogueTypeError),
    "glu-store": ("a glu value (evtc.glu) is stored, as is, as the epilogue's only output", EpilogueTypeError),
}


@dataclasses.dataclass(frozen=True)
class Violation:
    """One broken rule.

    Attributes:
        rule: the rule's name in :data:`RULES`.
        message: one sentence saying what is wrong (names the node).
        node: the offending node, or None for a graph-level rule.
        hint: what to do about it, for a user's graph.
    """

    rule: str
    message: str
    node: Node | None = None
    hint: str | None = None

    @property
    def user_error(self) -> type[EvtcError]:
        """The error class a user's graph that breaks this rule gets (see :data:`RULES`)."""
        return RULES[self.rule][1]


def bcast_classes(graph: Graph) -> dict[int, Bcast]:
    """The broadcast class of every value of ``graph`` (outputs excluded), by node id, in one
    pass over ``graph.nodes`` (a compute's class is the join of its operands', as
    :attr:`Compute.bcast <evtc.ir.nodes.Compute.bcast>` defines it, memoised here). Operands
    not defined before their user (a broken graph) count as M x N."""
    out: dict[int, Bcast] = {}
    for n in graph.nodes:
        if isinstance(n, Compute):
            b = Bcast.SCALAR
            for a in n.args:
                b = b.join(out.get(id(a), Bcast.MN))
            out[id(n)] = b
        elif not isinstance(n, Output):  # an output's class is its reduction's, not a value's
            out[id(n)] = n.bcast
    return out


def violations(graph: Graph) -> Iterator[Violation]:
    """The broken rules of ``graph``, graph-level ones first, then node by node in
    ``graph.nodes`` order (so the first is the earliest bad line of the IR text).

    Args:
        graph: the graph to check.

    Yields:
        :class:`Violation`, possibly several per node.
    """
    declared = {id(i) for i in graph.inputs}
    names: set[str] = set()
    for leaf in graph.inputs:
        if not isinstance(leaf, Leaf):
            yield Violation("inputs-are-leaves", f"declared input {type(leaf).__name__} is not a leaf")
            continue
        if leaf.name in names:
            yield Violation("unique-parameters", f"parameter name '{leaf.name}' is declared twice")
        names.add(leaf.name)
    if sum(isinstance(i, Accumulator) for i in graph.inputs) > 1:
        yield Violation("one-accumulator", "more than one accumulator")
    if not graph.outputs:
        yield Violation("has-outputs", "the epilogue has no outputs",
                        hint="return an M x N value, or a dict of outputs")

    bcast = bcast_classes(graph)
    defined: set[int] = set()
    out_ids = {id(o) for o in graph.outputs}
    for node in graph.nodes:
        for i in node.inputs:
            if id(i) not in defined:
                yield Violation("defined-before-use",
                                "a value is used before it is defined (or the graph has a cycle)", node)
            if isinstance(i, Output):
                yield Violation("outputs-are-terminal", f"output '{i.name}' is used as an input of another node", node)
        defined.add(id(node))
        if isinstance(node, Leaf):
            if id(node) not in declared:
                yield Violation("leaves-declared", f"leaf '{node.name}' is not a declared input", node,
                                hint="add it to the graph's inputs")
            if isinstance(node, Accumulator) and node.dtype is not dtypes.f32:
                yield Violation("accumulator-f32", f"the accumulator is f32, not {node.dtype}", node)
            if node.bcast is Bcast.MN and node.dtype not in dtypes.TENSOR_DTYPES:
                yield Violation("tensor-dtype", f"M x N input '{node.name}' can't be {node.dtype}", node)
        elif isinstance(node, Immediate):
            if node.dtype is not dtypes.f32:
                yield Violation("immediate-f32", f"constants are f32, not {node.dtype}", node)
            if math.isfinite(node.value) and abs(node.value) > dtypes.f32.max and math.isinf(_as_f32(node.value)):
                yield Violation("immediate-range",
                                f"the constant {node.value:.6g} is beyond f32's range (+-{dtypes.f32.max:.6g})", node,
                                hint="the epilogue computes in f32: scale the constant down, or write "
                                     "float('inf') if infinity is meant")
        elif isinstance(node, Compute):
            yield from _compute_violations(node)
        elif isinstance(node, Output):
            if id(node) not in out_ids:
                yield Violation("outputs-listed", f"output '{node.name}' is not in the graph's outputs", node)
            if node.name in names:
                yield Violation("unique-output-names", f"output name '{node.name}' is already used", node,
                                hint="give every output its own name, different from the parameters")
            names.add(node.name)
            got = bcast.get(id(node.value)) if node.value is not None else None
            if got is not Bcast.MN:
                what = f"a {got.value} value" if got is not None else "nothing"
                yield Violation("output-mn", f"output '{node.name}' needs an M x N value, got {what}", node,
                                hint="combine it with acc, C or an M x N input first")
            if isinstance(node, Store) and node.dtype not in dtypes.TENSOR_DTYPES:
                yield Violation("tensor-dtype", f"M x N outputs can't be {node.dtype}", node)
            if isinstance(node, Reduction) and node.dim is not None and (
                    type(node.dim) is not int or node.dim not in (0, 1)):
                yield Violation("reduction-dim", f"reduction dim {node.dim!r} is not 0, 1 or None", node,
                                hint="dim=1 reduces over N (one value per row), dim=0 over M, None over both")
        else:
            yield Violation("inputs-are-leaves", f"unknown node kind {type(node).__name__}", node)
    yield from _quantize_violations(graph)
    yield from _glu_violations(graph)


_PAIR_HINT = ("write q, s = evtc.quantize(y, evtc.e4m3) and return both, e.g. {'D': q, 'D_scale': s}, "
              "using q for nothing else")


def _quantize_violations(graph: Graph) -> Iterator[Violation]:
    """The rule ``quantize-pair``: the kernel quantizes the stored subtile once its group's
    scales are known, so a quantized value exists only as that output pair."""
    users: dict[int, list[Node]] = {}
    for node in graph.nodes:
        for i in node.inputs:
            users.setdefault(id(i), []).append(node)
    seen_scales = 0
    for node in graph.nodes:
        if isinstance(node, GroupScale):
            seen_scales += 1
            if seen_scales == 2:  # the kernel quantizes D's subtile, at the root: one quantization
                yield Violation("quantize-pair", f"a second quantization ('{node.name}'): an epilogue quantizes one "
                                "output, its D", node, hint="quantize one output per GEMM")
            v = node.value
            if not (isinstance(v, Compute) and v.op == "group_quant"):
                yield Violation("quantize-pair", f"output '{node.name}' holds quantize's scales of a value "
                                "that is not quantized", node, hint=_PAIR_HINT)
            elif (v.attr("group"), v.attr("convention"), v.attr("layout", "row_major")) != \
                    (node.group, node.convention, node.layout):
                yield Violation("quantize-pair", f"scales '{node.name}' (group {node.group}, {node.convention}, "
                                f"{node.layout}) differ from their quantization's (group {v.attr('group')}, "
                                f"{v.attr('convention')}, {v.attr('layout', 'row_major')})", node, hint=_PAIR_HINT)
            if node.group not in QUANT_GROUPS or node.convention not in QUANT_CONVENTIONS or node.dtype is not dtypes.f32 \
                    or node.layout not in QUANT_SCALE_LAYOUTS:
                yield Violation("quantize-pair", f"scales '{node.name}': group {node.group} of "
                                f"{QUANT_GROUPS}, convention '{node.convention}' of {QUANT_CONVENTIONS}, layout "
                                f"'{node.layout}' of {QUANT_SCALE_LAYOUTS}, f32 (not {node.dtype})", node, hint=_PAIR_HINT)
        elif isinstance(node, Compute) and node.op == "group_quant":
            us = users.get(id(node), [])
            stores = [u for u in us if isinstance(u, Store)]
            scales = [u for u in us if isinstance(u, GroupScale)]
            if len(stores) != 1 or len(scales) != 1 or len(us) != 2:
                what = ", ".join(sorted({getattr(u, 'name', '') or u.kind for u in us})) or "nothing"
                yield Violation("quantize-pair", "a quantized value must be returned once, with its scales, and "
                                f"used by nothing else; here it is used by: {what}", node, hint=_PAIR_HINT)
            if not node.dtype.is_fp8:
                yield Violation("quantize-pair", f"quantize writes e4m3 or e5m2, not {node.dtype}", node)
            group, convention = node.attr("group"), node.attr("convention")
            layout = node.attr("layout", "row_major")
            keys = sorted(k for k, _ in node.attrs)
            if isinstance(group, bool) or not isinstance(group, int) or group not in QUANT_GROUPS \
                    or not isinstance(convention, str) or convention not in QUANT_CONVENTIONS \
                    or keys not in (["convention", "group"], ["convention", "group", "layout"]) \
                    or not isinstance(layout, str) or layout not in QUANT_SCALE_LAYOUTS:
                given = ", ".join(f"{k}={v!r}" for k, v in node.attrs)
                yield Violation("quantize-pair", f"group_quant {{{given}}}: its attributes are group, one of "
                                f"{', '.join(map(str, QUANT_GROUPS))} (an integer), convention, one of "
                                f"{', '.join(QUANT_CONVENTIONS)}, optionally layout, one of "
                                f"{', '.join(QUANT_SCALE_LAYOUTS)} (default row_major), and no others", node,
                                hint="e.g. {convention=vllm, group=128}")
            for st in stores:
                if st.dtype is not node.dtype:  # the kernel's D holds the quotients rounded to fp8
                    yield Violation("quantize-pair", f"output '{st.name}': quantize's {node.dtype} values stored as "
                                    f"{st.dtype}", st, hint=f"store them as {node.dtype}: '{st.name} = store(...) : "
                                    f"{node.dtype}'")


_GLU_HINT = "return the glu value itself as the only output: return evtc.glu(acc + bias, act='silu')"


def _glu_violations(graph: Graph) -> Iterator[Violation]:
    """The rule ``glu-store``: a glu value has N / 2 columns, which no other M x N value of the
    epilogue has, and the kernel computes it where it stores it (the root visitor pairs the
    subtile's columns: include/evtc/sm90_glu_store.hpp), so it is one output and nothing else."""
    glus = [n for n in graph.nodes if isinstance(n, Compute) and n.op == "glu"]
    if not glus:
        return
    users: dict[int, list[Node]] = {}
    for node in graph.nodes:
        for i in node.inputs:
            users.setdefault(id(i), []).append(node)
    for k, node in enumerate(glus):
        us = users.get(id(node), [])
        if k == 1:
            yield Violation("glu-store", "a second glu: an epilogue stores one gated output", node, hint=_GLU_HINT)
        if len(us) != 1 or not isinstance(us[0], Store):
            what = ", ".join(sorted({getattr(u, "name", "") or getattr(u, "op", "") or u.kind for u in us})) or "nothing"
            yield Violation("glu-store", f"a glu value (N / 2 columns) can only be stored as it is; here it is used "
                            f"by: {what}", node, hint=_GLU_HINT + " (set the output's dtype with the epilogue's d)")
        if [k for k, _ in node.attrs] != ["act"] or not is_glu_act(node.attr("act")):
            given = ", ".join(f"{k}={v!r}" for k, v in node.attrs)
            yield Violation("glu-store", f"glu {{{given}}}: its one attribute is act, the name of a unary op", node,
                            hint="e.g. {act=silu}")
    others = [o for o in graph.outputs if not any(o.value is g for g in glus)]
    if others:
        yield Violation("glu-store", f"outputs {[o.name for o in others]} beside the gated output: a gated epilogue "
                        "has one output (its other values have N columns, the gated one N / 2)", others[0],
                        hint="compute the other outputs in a GEMM of their own")


def _as_f32(v: float) -> float:
    with np.errstate(over="ignore"):
        return float(np.float32(v))


def _compute_violations(node: Compute) -> Iterator[Violation]:
    op = ops.OPS.get(node.op)
    if op is None:
        yield Violation("known-op", f"unknown op '{node.op}'", node, hint=f"known ops: {', '.join(sorted(ops.OPS))}")
        return
    if len(node.args) != op.arity:
        yield Violation("arity", f"op '{node.op}' takes {op.arity} operands, got {len(node.args)}", node)
    if node.op == "group_quant":
        pass  # its dtype is the quantized element's (rule quantize-pair)
    elif node.op == "convert":
        if node.dtype not in dtypes.TENSOR_DTYPES:
            yield Violation("convert-target", f"can't convert to {node.dtype}", node)
    elif node.dtype is not dtypes.f32:
        yield Violation("compute-f32", f"'{node.op}' computes in f32, not {node.dtype}", node)
    if node.op == "pow" and len(node.args) == 2 and not isinstance(node.args[1], Immediate):
        yield Violation("pow-exponent", "pow needs a constant exponent", node,
                        hint="write the exponent as a number, or use exp(y * log(x))")


def format_violation(graph: Graph, v: Violation, *, after: str | None = None) -> str:
    """The message of ``v``: ``after pass '<name>': `` when a pass broke it, and the IR window
    around its node when the node is part of the text form."""
    text = f"after pass '{after}': {v.message}" if after else v.message
    if v.node is not None:
        try:
            w = window(graph, v.node)
        except Exception:  # the graph is broken enough that it can't be printed
            w = ""
        if w:
            text += "\n" + w
    return text


def verify(graph: Graph, arch: str | None = None, *, after: str | None = None) -> None:
    """Check the invariants of ``graph`` (:data:`RULES`).

    Args:
        graph: the graph to check.
        arch: deprecated and ignored: the IR knows no target; the per-arch rules are
            :func:`evtc.passes.legalize.legalize`'s (``evtc.passes.run(graph, arch)`` runs them).
        after: the name of the pass that produced ``graph``, named in the error.

    Raises:
        IRVerificationError: the first broken invariant, with an IR window around the node and
            the node's location.

    Example::

        verify(evtc.parse_ir(text))     # raises for a compute that isn't f32, an undeclared leaf...
    """
    if arch is not None:
        warnings.warn("evtc.ir.verify(graph, arch): the arch rules moved to evtc.passes.legalize; "
                      "arch is ignored", DeprecationWarning, stacklevel=2)
    for v in violations(graph):
        raise IRVerificationError(format_violation(graph, v, after=after),
                                  loc=getattr(v.node, "loc", None), epilogue=graph.name, hint=None)
