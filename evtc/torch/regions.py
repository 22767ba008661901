"""The evtc torch backend's regions: the GEMMs of an ATen graph, what grows after each, and
the rewrite of each match into one evtc Gemm's custom op.

Input: an FX graph (Dynamo's, or AOTAutograd's forward and backward graphs) and its example
inputs. Output: the graph's ATen form (:func:`evtc.torch.aten.to_aten`) with each match replaced by the op
(:func:`fuse`, in place). :mod:`evtc.torch.backend` compiles the result.

How:

1. The Dynamo graph is traced to ATen with ``make_fx`` (functionalized, on fake tensors, the
   user's stack traces kept), so ``nn.Linear``/``F.linear``, ``@``/``torch.matmul``,
   ``torch.addmm``, ``torch.bmm`` and ``torch.baddbmm`` all arrive as ``aten.mm``,
   ``aten.addmm``, ``aten.bmm`` or ``aten.baddbmm``, and in-place ops as their functional forms.
   ``torch._grouped_mm(A, B, offs)`` (a mixture-of-experts layer) is an anchor too: its match
   runs as an :class:`evtc.GroupedGemm`; its region grows over pointwise ops, views and row
   reductions (one value a token: the grouped kernel's other reductions are per expert).
2. Each ``mm``/``addmm``/``bmm``/``baddbmm`` (the anchor) grows a region forward over the nodes that the
   importer's table (:data:`evtc.frontend.torch_import.ATEN`: the one table of torch ops ->
   evtc ops) can lower: pointwise ops whose other operands are numbers, a length-N vector (a
   row broadcast), an ``(..., 1)`` column of the output's rows (a column broadcast, flat M
   only), a 0-d f32 tensor (a device scalar) or a tensor of the output's shape (an aux load);
   views that only regroup the rows (``(B*S, N) <-> (B, S, N)``); and reductions (``sum``,
   ``amax``, ``max``, ``min``, ``mean``) over N (``dim=-1``), over all of M, or over everything,
   which end the region on their path.
3. Values of the region used outside it become outputs of the kernel: M x N values are stored
   in their torch dtype (the main output D, the rest aux stores), reductions come out as f32
   vectors or scalars (cast outside to the dtype torch gives them). The region is replaced by the
   op, the outputs reshaped to what the graph expects.

What evtc can't run stays unfused and goes to Inductor as it is: tensors not on a CUDA device,
operands that are not both bf16 or both f16, K or N not a multiple of 8, an operand that depends
on the region's own values, and any Gemm evtc refuses to build (the match is skipped).
Numerics: the fused epilogue computes in f32 and rounds once per output, where eager torch
rounds after every op in the tensors' dtype; the results are within one rounding of the float64
value. (Training graphs and symbolic shapes: NOTE [Fusion in training] and NOTE [Symbolic
shapes] in :mod:`evtc.torch.backend`.)
"""

from __future__ import annotations

import operator
from collections.abc import Callable
from typing import Any, Mapping

__all__ = ["bare", "fake_val", "fuse"]

_ANCHORS = ("aten.mm.default", "aten.addmm.default", "aten.bmm.default", "aten.baddbmm.default",
            "aten._grouped_mm.default")
_GROUPED = "aten._grouped_mm.default"
_VIEWS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
_TRANSPOSES = ("aten.t.default", "aten.permute.default", "aten.transpose.int")


def _val(node):
    return node.meta.get("val") if hasattr(node, "meta") else None


def _is_node(x) -> bool:
    return hasattr(x, "op") and hasattr(x, "users") and hasattr(x, "target")


def _dtype_name(t) -> str | None:
    import torch

    return {torch.bfloat16: "bf16", torch.float16: "f16", torch.float32: "f32",
            torch.float8_e4m3fn: "e4m3", torch.float8_e5m2: "e5m2"}.get(t.dtype)


def _prod(xs) -> int:
    out = 1
    for x in xs:
        out *= int(x)
    return out


class _Match:
    """One anchor and its region, with the kind of every operand from outside.

    Attributes:
        anchor: the ``mm``/``addmm``/``bmm`` node; ``a``, ``b``: its fx operands (``b`` is
            (K, N)); ``M``, ``N``, ``K``, ``L`` (None unless batched).
        region: the region's nodes in graph order (the anchor first); ``terminal``: those whose
            users can't join (reductions).
        externals: fx node -> (kind, name) of each tensor from outside: ``row``, ``col``,
            ``aux``, ``scalar``.
    """

    def __init__(self, anchor, a, b, M: int, N: int, K: int, L: int | None) -> None:
        self.anchor, self.a, self.b = anchor, a, b
        self.M, self.N, self.K, self.L = M, N, K, L
        self.region = [anchor]
        self.members = {anchor}
        self.terminal: set = set()
        self.views: set = set()
        self.externals: dict = {}
        self._ancestors: dict = {}
        #: a ``torch._grouped_mm`` anchor's ``offs`` (its GEMM runs as an evtc.GroupedGemm)
        self.offs = None

    # ---- shapes -------------------------------------------------------------------------------

    def is_mn(self, shape) -> bool:
        """A shape of an M x N value of this region: (L, M, N) batched; else any shape whose last
        axis is N and whose leading axes multiply to M."""
        shape = tuple(shape)
        if self.L is not None:
            return shape == (self.L, self.M, self.N)
        return len(shape) >= 1 and shape[-1] == self.N and _prod(shape[:-1]) == self.M

    def reduce_dim(self, args: dict, node) -> tuple[Any, str | None]:
        """The evtc axis (1, 0, None) of a reduction of a region value, or why it has none:
        batched, the axes of (L, M, N); flat, the last axis is N and all the others M."""
        shape = tuple(_val(args["self"]).shape)
        rank = len(shape)
        dims = args.get("dim")
        if dims is None or dims == []:
            dims = list(range(rank))
        if isinstance(dims, int):
            dims = [dims]
        dims = {int(d) % rank for d in dims}
        if self.L is not None:
            table = {frozenset({2}): 1, frozenset({1}): 0, frozenset({1, 2}): None}
        else:
            table = {frozenset({rank - 1}): 1, frozenset(range(rank - 1)): 0, frozenset(range(rank)): None}
        if frozenset(dims) not in table:
            return None, f"a reduction over dims {sorted(dims)} of a {list(shape)} value (not over N, M or both)"
        return table[frozenset(dims)], None

    def extent(self, node, dim) -> int:
        return {1: self.N, 0: self.M, None: self.M * self.N}[dim]

    # ---- operands from outside ------------------------------------------------------------------

    def depends_on_region(self, node) -> bool:
        """Whether ``node`` is computed from a region value (then it can't be an operand: the
        fused op would need its own output)."""
        stack, seen = [node], set()
        while stack:
            n = stack.pop()
            if n in self.members:
                return True
            if n in seen or n.op == "placeholder" or n.op == "get_attr":
                continue
            seen.add(n)
            stack.extend(x for x in n.all_input_nodes)
        return False

    def kind_of(self, x, out_shape, device) -> str | None:
        """The kind of the outside tensor ``x`` as an operand of an op whose result has shape
        ``out_shape`` (None: evtc can't take it)."""
        v = _val(x)
        import torch

        if not isinstance(v, torch.Tensor) or v.device != device:
            return None
        if _dtype_name(v) not in ("f32", "bf16", "f16"):
            return None
        shape = tuple(v.shape)
        if v.numel() == 1 and all(s == 1 for s in shape):
            return "scalar" if v.dtype == torch.float32 else None
        core = shape
        while core and core[0] == 1:
            core = core[1:]
        if core == (self.N,):
            return "row"
        if shape == tuple(out_shape):
            return "aux"
        if self.L is None and shape == tuple(out_shape)[:-1] + (1,) and _prod(shape) == self.M:
            return "col"
        return None

    def take(self, x, kind: str) -> bool:
        known = self.externals.get(x)
        if known is not None:
            return known[0] == kind
        self.externals[x] = (kind, f"p{len(self.externals)}")
        return True


def _anchor_operands(node):
    """(a, b, bias, beta, alpha) of an mm/addmm/bmm/baddbmm node (``bias`` None for mm/bmm)."""
    name = str(node.target)
    if name in ("aten.addmm.default", "aten.baddbmm.default"):  # (input, a, b, *, beta, alpha)
        bias, a, b = node.args[:3]
        beta = node.kwargs.get("beta", 1)
        if isinstance(beta, (int, float)) and beta == 0:
            # torch.addmm / baddbmm: "If beta is 0, then input will be ignored, and nan and inf in it
            # will not be propagated" (0 * nan would be nan in the epilogue)
            bias, beta = None, 1
        return a, b, bias, beta, node.kwargs.get("alpha", 1)
    return node.args[0], node.args[1], None, 1, 1


def _start_grouped(node, allow_cpu: bool) -> _Match | None:
    """A match for a ``_grouped_mm(A (T, K), B (E, K, N), offs)`` anchor (no bias, the
    operands' dtype out) if evtc.GroupedGemm can run it, else None."""
    import torch

    args = dict(zip(("mat_a", "mat_b", "offs", "bias", "out_dtype"), node.args))
    args.update(node.kwargs)
    a, b, offs = args.get("mat_a"), args.get("mat_b"), args.get("offs")
    va, vb, vy = _val(a), _val(b), _val(node)
    if offs is None or args.get("bias") is not None or not all(isinstance(v, torch.Tensor) for v in (va, vb, vy)):
        return None
    if va.device.type != "cuda" and not allow_cpu:
        return None
    if va.dim() != 2 or vb.dim() != 3 or va.dtype != vb.dtype or vy.dtype != va.dtype \
            or _dtype_name(va) not in ("bf16", "f16") or _val(offs) is None or _val(offs).dtype != torch.int32:
        return None
    if any(not isinstance(x, int) for x in (*va.shape, *vb.shape)):
        return None  # symbolic shapes
    (T, K), N = va.shape, vb.shape[-1]
    if K % 8 or N % 8:
        return None
    m = _Match(node, a, b, T, N, K, None)
    m.offs = offs
    return m


def _start(node, allow_cpu: bool) -> _Match | None:
    """A match for the anchor ``node`` if evtc can run its GEMM, else None."""
    import torch

    if str(node.target) == _GROUPED:
        return _start_grouped(node, allow_cpu)
    a, b, bias, beta, alpha = _anchor_operands(node)
    va, vb, vy = _val(a), _val(b), _val(node)
    if not all(isinstance(v, torch.Tensor) for v in (va, vb, vy)):
        return None
    if va.device.type != "cuda" and not allow_cpu:
        return None
    if va.dtype != vb.dtype or _dtype_name(va) not in ("bf16", "f16") or vy.dtype != va.dtype:
        return None
    batched = va.dim() == 3
    M, K, N = va.shape[-2], va.shape[-1], vb.shape[-1]
    if any(not isinstance(s, int) for s in (*va.shape, *vb.shape)):
        return None  # symbolic shapes
    if K % 8 or N % 8:
        return None
    m = _Match(node, a, b, M, N, K, va.shape[0] if batched else None)
    if bias is not None:
        kind = m.kind_of(bias, vy.shape, va.device)
        if kind is None or not m.take(bias, kind) or not isinstance(beta, (int, float)) \
                or not isinstance(alpha, (int, float)):
            return None
    return m


def _grow(m: _Match, nodes: list, start: int, device) -> None:
    """Admit, in graph order, every node after the anchor that uses a region value and that
    evtc can lower with the values it has."""
    import torch

    from evtc.frontend.torch_aten import _bind
    from evtc.frontend.torch_import import ATEN, target_name, unsupported_reason
    from evtc.torch.aten import symbolic

    for node in nodes[start:]:
        if node.op != "call_function":
            continue
        inputs = node.all_input_nodes
        if not any(i in m.members for i in inputs):
            continue
        if any(i in m.terminal for i in inputs) and target_name(node) != "getitem":
            continue
        if any(isinstance(_val(x), torch.Tensor) and symbolic(_val(x)) or
               isinstance(_val(x), (torch.SymInt, torch.SymFloat, torch.SymBool)) for x in (node, *inputs)):
            # a data-dependent size (NOTE [Scalars read inside the graph] in evtc/torch/aten.py), or
            # a symbolic one (NOTE [One fused graph for every shape] in evtc/torch/backend.py)
            continue
        name = target_name(node)
        if name == "getitem":
            if not (node.args[0] in m.members and str(node.args[0].target).endswith(".dim") and node.args[1] == 0):
                continue
            _admit(m, node, terminal=True)
            continue
        if name in _VIEWS and node.args[0] in m.members and _val(node) is not None and m.is_mn(_val(node).shape):
            m.views.add(node)  # regroups the rows ((B*S, N) <-> (B, S, N)): the same M x N value
            _admit(m, node, terminal=False)
            continue
        if name not in ATEN:
            continue
        if unsupported_reason(node, extents_known=True, reduce_dim=m.reduce_dim) is not None:
            continue
        row = ATEN[name]
        if row.reduction and m.offs is not None and m.reduce_dim(_bind(node), node)[0] != 1:
            # (a grouped kernel's column and scalar reductions are per group, (E, N) and (E,); the
            # graph's run over every token: only its row reductions, one value a token, are the same)
            continue
        out = _val(node)
        if name in ("aten.max.dim", "aten.min.dim"):
            if any(not (target_name(u) == "getitem" and u.args[1] == 0) for u in node.users):
                continue
        elif not row.reduction:
            if out is None or not m.is_mn(out.shape):
                continue
        ok = True
        for x in inputs:
            if x in m.members:
                continue
            kind = m.kind_of(x, out.shape if not row.reduction else _val(node.args[0]).shape, device)
            if kind is None or m.depends_on_region(x) or (x in m.externals and m.externals[x][0] != kind):
                ok = False
                break
        if not ok:
            continue
        for x in inputs:
            if x not in m.members:
                m.take(x, m.kind_of(x, out.shape if not row.reduction else _val(node.args[0]).shape, device))
        _admit(m, node, terminal=row.reduction)


_STORABLE = ("f32", "bf16", "f16", "e4m3", "e5m2")


def _prune(m: _Match) -> None:
    """Drop from the region each value used outside it that the kernel can't store (a bool
    mask, an integer), with the region values computed from it: they stay in the graph, for
    Inductor, computed from the kernel's outputs."""
    import torch

    def outside_use(n):
        return any(u not in m.members for u in n.users)

    while True:
        bad = next((n for n in m.region[1:] if n not in m.terminal and outside_use(n)
                    and not (isinstance(_val(n), torch.Tensor) and _dtype_name(_val(n)) in _STORABLE)), None)
        if bad is None:
            return
        _drop(m, bad)


def _drop(m: _Match, bad) -> None:
    """Drop ``bad`` from the region, with the region values computed from it (they stay in the
    graph, for Inductor)."""
    drop = {bad}
    for n in m.region:
        if n not in drop and any(i in drop for i in n.all_input_nodes):
            drop.add(n)
    m.region = [n for n in m.region if n not in drop]
    m.members -= drop
    m.terminal -= drop
    m.views -= drop


def _admit(m: _Match, node, terminal: bool) -> None:
    m.region.append(node)
    m.members.add(node)
    if terminal:
        m.terminal.add(node)


# ---------------------------------------------------------------------------------------------
# The epilogue of a match
# ---------------------------------------------------------------------------------------------


def _epilogue(m: _Match, name: str, d_dtype) -> tuple[Any, list]:
    """The Graph of the match's epilogue and its outputs: (fx node, output name, kind)."""
    from evtc import dtypes
    from evtc.frontend.builder import PYTHON, IRBuilder, Pending
    from evtc.frontend.torch_import import Lowering, loc_from_stack_trace
    from evtc.ir.nodes import Accumulator, AuxLoad, ColBroadcast, RowBroadcast, ScalarBroadcast

    def loc_of(node):
        return loc_from_stack_trace(node.meta.get("stack_trace"))

    d = dtypes.coerce(_dtype_name(_val(m.anchor)))
    builder = IRBuilder(name, c=d, d=d, dialect=PYTHON, loc=loc_of(m.anchor))
    env: dict = {}
    leaf_kinds = {"row": RowBroadcast, "col": ColBroadcast, "aux": AuxLoad, "scalar": ScalarBroadcast}
    acc = builder.input("acc", Accumulator, loc=loc_of(m.anchor))
    for x, (kind, pname) in m.externals.items():
        env[x] = builder.input(pname, leaf_kinds[kind], dtypes.coerce(_dtype_name(_val(x))),
                               by_pointer=kind == "scalar", loc=loc_of(x))
    a, b, bias, beta, alpha = _anchor_operands(m.anchor)
    loc = loc_of(m.anchor)
    y = acc if alpha == 1 else builder.binary("mul", acc, alpha, loc)
    if bias is not None:
        y = builder.binary("add", y, env[bias] if beta == 1 else builder.binary("mul", env[bias], beta, loc), loc)
    env[m.anchor] = y

    # the importer's lowering, with the match's axes and extents (a flat region's leading axes are all M)
    lowering = Lowering(builder, env, lambda n: loc_of(n) or builder.loc, extent=m.extent, reduce_dim=m.reduce_dim)
    for node in m.region[1:]:
        if node in m.views:
            env[node] = env[node.args[0]]
        else:
            lowering.lower(node)

    outputs = []
    n_store = n_red = 0
    for node in m.region:
        if str(node.target) in ("aten.max.dim", "aten.min.dim"):
            continue
        if all(u in m.members for u in node.users):
            continue
        value = env[node]
        v = _val(node)
        if isinstance(value, Pending):
            oname = f"r{n_red}"
            n_red += 1
            builder.output(oname, value, loc_of(node) or builder.loc)
            outputs.append((node, oname, "reduction"))
        else:
            oname = "D" if n_store == 0 else f"aux{n_store}"
            n_store += 1
            want = dtypes.coerce(_dtype_name(v))
            if want is not d and not (getattr(value, "op", None) == "convert" and value.dtype is want):
                value = builder.convert(value, want, loc_of(node))
            builder.output(oname, value, loc_of(node) or builder.loc)
            outputs.append((node, oname, "store"))
    if n_store == 0 and n_red:
        # NOTE [A region of reductions only]: where the graph uses only the region's reductions
        # (an LM head's logits reduced to their max or their sum of squares), the kernel still
        # stores an M x N D (sm90's collective epilogue stores D: evtc/passes/legalize.py), or
        # the Gemm is refused and the whole match, bias and activation with it, went unfused.
        # D is the value the first reduction reads, rounded to the GEMM's dtype; nothing in the
        # graph reads it.
        first = next(n for n in m.region if n in m.terminal and str(n.target) != "getitem")
        src = first.args[0]
        builder.output("D", env[src], loc_of(first) or builder.loc)
    return builder.graph(), outputs


# ---------------------------------------------------------------------------------------------
# Rewriting the graph
# ---------------------------------------------------------------------------------------------


def fake_val(node):
    """Give the new node ``node`` its ``meta["val"]`` (its target run on its arguments' fake
    values, under their fake mode) and ``meta["eager_input_vals"]`` (those values); nothing
    where an argument has none.

    NOTE [New nodes carry their fake values]: the op's operands must reach it with the strides of
    the graph (K-contiguous: the ``needs_exact_strides`` tag, :func:`evtc.torch.ops.k_contiguous`).
    Inductor applies that tag from the op node's ``meta["eager_input_vals"]`` and, where a custom
    pass inserted the op without them, applies nothing (torch/_inductor/graph.py,
    ``call_function``). So the contiguous copy (``aten.clone``) the rewrite puts before the op was
    a buffer of free layout: Inductor laid it out as its transposed source, the copy did nothing,
    and the op copied again in eager ATen, a strided copy at about 0.3 TB/s. Measured on the
    H200, 2026-11-29 (benchmarks/profile_train.py): 2.6 ms of Llama's 9.9 ms training step, 0.57
    ms of GPT-2's 2.2 ms."""
    import torch
    from torch._guards import detect_fake_mode

    vals = []

    def val(a):
        v = a.meta.get("val")
        vals.append(v)
        return v

    args = torch.fx.node.map_arg(node.args, val)
    kwargs = torch.fx.node.map_arg(node.kwargs, val)
    if any(v is None for v in vals):
        return None
    try:  # (the inference zoo's graphs mix two fake modes: no value then; their operands reached the op
        # K-contiguous all the same, on the CPU under Inductor)
        mode = detect_fake_mode([v for v in vals if isinstance(v, torch.Tensor)])
        if mode is None:
            return None
        with mode:
            out = node.target(*args, **kwargs)
    except Exception:  # noqa: BLE001 - a value that can't be made leaves the node as the pass made it
        return None
    node.meta["val"] = out
    # Inductor constrains a needs_exact_strides op's arguments to these, and to nothing when a
    # custom pass inserted the op without them (torch/_inductor/graph.py, call_function)
    node.meta["eager_input_vals"] = (args, kwargs)
    return node.meta["val"]


def _b_operand(add, b):
    """The (N, K) row-major B of evtc for the (K, N) operand ``b``: the tensor under a transpose
    when it is row-major, else a contiguous copy of ``b``'s transpose."""
    import torch

    aten = torch.ops.aten
    name = str(b.target) if b.op == "call_function" else ""
    if name in _TRANSPOSES:
        src = b.args[0]
        vs = _val(src)
        rank = vs.dim() if vs is not None else 0
        swaps = (name == "aten.t.default" or
                 (name == "aten.permute.default" and list(b.args[1]) in ([1, 0], [0, 2, 1])) or
                 (name == "aten.transpose.int" and {int(d) % rank for d in b.args[1:3]} == {rank - 2, rank - 1}))
        if swaps and vs is not None and vs.is_contiguous():
            return src
    rank = _val(b).dim() if _val(b) is not None else 2
    # (permute, not transpose: after AOTAutograd's decompositions Inductor lowers permute only)
    t = add(aten.permute.default, (b, list(range(rank - 2)) + [rank - 1, rank - 2]))
    return add(aten.clone.default, (t,), {"memory_format": torch.contiguous_format})


def _a_operand(add, a):
    import torch

    va = _val(a)
    if va is not None and va.is_contiguous():
        return a
    return add(torch.ops.aten.clone.default, (a,), {"memory_format": torch.contiguous_format})


def _reshape(add, x, shape: list):
    """``x`` viewed as ``shape``: nothing where it has that shape, else ``aten.view`` (a contiguous
    copy first where its strides can't be viewed so). View and copy, not ``reshape``, which
    Inductor decomposes: the same nodes serve a Dynamo graph and a graph after AOTAutograd."""
    import torch

    aten = torch.ops.aten
    v = _val(x)
    if v is not None and list(v.shape) == list(shape):
        return x
    if v is not None and not v.is_contiguous():
        x = add(aten.clone.default, (x,), {"memory_format": torch.contiguous_format})
    return add(aten.view.default, (x, shape))


def _laid_out(add, x):
    """``x`` (an epilogue tensor of the op) as the GPU call's binder takes it: itself where its
    fake value is contiguous and starts 16-byte aligned, else a contiguous copy.

    NOTE [Epilogue tensors in the binder's layout]: the op's call checks each tensor as
    evtc/runtime/bind.py's rules say (unit stride along the last dimension, no row stride of 0,
    M x N rows starting 16-byte aligned for TMA) and refuses the rest with an ArgumentError; the
    op's layout tags (``needs_exact_strides``) make Inductor pass each one as the graph lays it
    out. A region operand read through a view (a residual ``r.t()``, a bias ``W[:, 1]``, an
    ``expand``, a slice ``big[:, 3:51]``) would then reach the GPU kernel's binder and fail there,
    after compiling; so the rewrite copies any operand not already so laid out (a storage
    offset it can't read, a symbolic one, counts as misaligned). A contiguous, aligned operand,
    the common case, is passed as it is."""
    import torch

    v = _val(x)
    if not isinstance(v, torch.Tensor):
        return x
    off = v.storage_offset()
    if v.is_contiguous() and isinstance(off, int) and (off * v.element_size()) % 16 == 0:
        return x
    return add(torch.ops.aten.clone.default, (x,), {"memory_format": torch.contiguous_format})


def _replace(gm, m: _Match, op, outputs: list) -> None:
    """Put ``op``'s call where the region was and reroute every use outside the region."""
    import torch

    graph = gm.graph
    by_name = {pname: x for x, (kind, pname) in m.externals.items()}
    kinds = {pname: kind for x, (kind, pname) in m.externals.items()}
    new_nodes = [m.region[-1]]

    def add(target, args, kwargs=None):  # a new node after the region (legalize_graph sorts later)
        with graph.inserting_after(new_nodes[-1]):
            n = graph.call_function(target, args, kwargs or {})
        fake_val(n)
        new_nodes.append(n)
        return n

    A = _a_operand(add, m.a)
    B = _b_operand(add, m.b)
    args = [A, B] if m.offs is None else [A, B, m.offs]
    for pname in op.tensor_names:
        x = by_name[pname]
        kind = kinds[pname]
        if kind == "aux":
            shape = [m.L, m.M, m.N] if m.L is not None else [m.M, m.N]
        elif kind == "row":
            shape = [m.N]
        elif kind == "col":
            shape = [m.M]
        else:
            shape = []
        args.append(_laid_out(add, _reshape(add, x, shape)))
    call = add(op.overload, tuple(args))
    single = len(op.output_names) == 1
    for node, oname, kind in outputs:
        i = op.output_names.index(oname)
        out = call if single else add(operator.getitem, (call, i))
        v = _val(node)
        out = _reshape(add, out, list(v.shape))
        if kind == "reduction" and v.dtype != torch.float32:
            out = add(torch.ops.prims.convert_element_type.default, (out, v.dtype))
        out.meta["val"] = v
        node.replace_all_uses_with(out, delete_user_cb=lambda u: u not in m.members)
    for node in reversed(m.region):
        graph.erase_node(node)


# NOTE [A bare GEMM stays torch's]
# A match with nothing after its GEMM but views (a projection whose output feeds attention, the
# down projection of a gated MLP, AOTAutograd's weight-gradient GEMMs; `addmm`'s bias and
# `baddbmm`'s scaled input are the anchor's own, one cuBLAS(Lt) call in torch) has no epilogue to
# fuse: its kernel would only put evtc's GEMM where torch.compile runs cuBLAS's, and in a Llama
# training step (H200, 2026-11-29, docs/performance.md) evtc's six such GEMMs took 1.04-1.28x
# the time of the same problems' cuBLAS calls. The fuse gate can't judge it: its ground truth is
# GEMM + epilogue against cuBLAS + a Triton epilogue, and here torch.compile runs no epilogue. So
# with a gate such a match stays unfused. Without one (`fuse_all`, or `batch_invariant`, where
# cuBLAS's kernel choice would break the option: NOTE [Batch invariance]) it is fused. A cast
# (`mm(...).float()`) is not a view: the kernel saves its pass.


def bare(m: _Match) -> bool:
    """Whether the match ``m`` has nothing to fuse: no node after its anchor but views (NOTE [A
    bare GEMM stays torch's])."""
    return all(n in m.views for n in m.region[1:])


def fuse(gm, *, allow_cpu: bool = False, on_gemm: Callable | None = None,
         gemm_options: Mapping[str, Any] | None = None, gate: Callable | None = None,
         problems: list | None = None) -> int:
    """Replace every match in the ATen graph ``gm`` (from :func:`evtc.torch.aten.to_aten`) by an evtc Gemm's
    op, in place.

    Args:
        allow_cpu: fuse CPU tensors too (tests, with a CPU kernel registered for the op).
        on_gemm: called with each Gemm made (tests register their kernel there).
        gemm_options: keyword arguments of every :class:`evtc.Gemm` made (``batch_invariant``,
            ``autotune``: :data:`GEMM_OPTIONS`).
        gate: ``gate(gemm, M, N, K, L, device) -> bool``, asked for each GEMM match (not the
            grouped ones) once its Gemm is made: False leaves the match unfused, for Inductor
            (the backend's is the fuse gate: NOTE [The fuse gate] in evtc/dispatch/select.py).
            With a gate, a match with nothing to fuse stays torch's (:func:`bare`); without
            one (``fuse_all``, ``batch_invariant``) every match is fused.
        problems: a list that gets ``(gemm, (M, N, K, L), device)`` of each GEMM match fused
            (not the grouped ones): what the backend builds before the first call.

    Returns:
        The number of matches fused (a gated pair, two GEMMs in the graph, counts once).
    """
    from torch.fx.passes.tools_common import legalize_graph

    import evtc
    from evtc.errors import EvtcError

    from evtc.torch.gated import fuse_gated

    # gated pairs first: act(x W_gate^T) * (x W_up^T) as one GEMM with evtc.glu (evtc/torch/gated.py)
    fused = fuse_gated(gm, allow_cpu=allow_cpu, on_gemm=on_gemm, gemm_options=gemm_options, gate=gate,
                       problems=problems)
    names = [n.name for n in gm.graph.nodes if n.op == "call_function" and str(n.target) in _ANCHORS]
    for name in names:
        # (legalize_graph below rebuilds the graph, keeping the names; anchors are never region members)
        anchor = next((n for n in gm.graph.nodes if n.name == name), None)
        if anchor is None:
            continue
        m = _start(anchor, allow_cpu)
        if m is None:
            continue
        nodes = list(gm.graph.nodes)
        _grow(m, nodes, nodes.index(anchor) + 1, _val(anchor).device)
        _prune(m)
        dt = _dtype_name(_val(anchor))
        gemm = None
        # (a match with nothing to fuse is left before its Gemm is made: NOTE [A bare GEMM stays torch's])
        while gemm is None and not (gate is not None and bare(m)):
            try:
                graph, outputs = _epilogue(m, f"fused_{str(anchor.target).split('.')[1].lstrip('_')}_{fused}", dt)
                if m.offs is not None:
                    gemm = evtc.GroupedGemm(graph, a=dt, b=dt, c=dt, d=dt,
                                            batch_invariant=(gemm_options or {}).get("batch_invariant"))
                else:
                    gemm = evtc.Gemm(graph, a=dt, b=dt, c=dt, d=dt, **(gemm_options or {}))
            except EvtcError:
                # NOTE [A region evtc refuses shrinks]: an op the region admitted that evtc then
                # refuses (pow with a tensor exponent, 2.0 ** h, a cast through int32) dropped the
                # whole match, bias and activation with it; the region gives up its last node (and
                # what is computed from it) and is tried again while an epilogue is left (a bare
                # GEMM left of it stays cuBLAS's)
                if len(m.region) > 1:
                    _drop(m, m.region[-1])
                    _prune(m)
                if len(m.region) == 1:
                    break
        if gemm is None:
            continue  # the match stays unfused
        try:
            if m.offs is None and gate is not None and not gate(gemm, m.M, m.N, m.K, m.L or 1, _val(anchor).device):
                continue  # predicted slower than leaving it to Inductor
            if on_gemm is not None:
                on_gemm(gemm)
            op = gemm.torch_op()
        except EvtcError:
            continue  # evtc can't build this epilogue: the match stays unfused
        _replace(gm, m, op, outputs)
        legalize_graph(gm)  # (the op went after the region; a use of its outputs may come earlier)
        fused += 1
        if problems is not None and m.offs is None:
            problems.append((gemm, (m.M, m.N, m.K, m.L or 1), _val(anchor).device))
    if fused:
        gm.graph.lint()
        gm.recompile()
    return fused
