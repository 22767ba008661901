"""The torch backend's one-GEMM gated form: ``act(x W_gate^T) * (x W_up^T)`` becomes one evtc
GEMM over the interleaved weights with ``evtc.glu`` in its epilogue (docs/gated.md).

Input: an ATen graph (:func:`evtc.torch.aten.to_aten`). Output: the graph with each gated
pair rewritten in place (:func:`fuse_gated`), before the regions of :func:`evtc.torch.regions.
fuse` grow over the rest (the down projection, residuals...).

The pattern: ``mul(act(mm(x, t(W_gate))), mm(x, t(W_up)))`` (either operand order; ``addmm``
with a bias on both projections; views of the rows between the GEMMs and the mul, as a 3-D
``(B, S, H)`` input gives), act one of :data:`ACTS`, the same ``x`` for both GEMMs, the weights
2-D ``(I, K)`` K-major, every intermediate used once (so a training graph, whose forward saves the
projections for the backward, never matches: :func:`evtc.torch.regions.fuse` fuses those as two
GEMMs). It becomes ``gated_op(x, W_gate, W_up[, b_gate, b_up])`` (:func:`gated_op`), which interleaves the
weights and runs the glu GEMM.

NOTE [The interleaved weights' cache]: the weights are graph inputs (the module's parameters), so
the interleaved copy is made at run time, inside the gated op (:func:`interleaved`), and kept:
keyed by both tensors' data pointers, shapes, strides, dtypes and version counters (an in-place
update, an optimizer step or ``load_state_dict``'s ``copy_``, bumps the counter), each entry
holding both tensors' storages so that their addresses can't be reused by other tensors while it
lives (a freed weight at the same address would otherwise hit). A copy costs a read and a write
of both weights once per new weight version; a model's calls after the first read the cached
copy. Writes through ``.data`` bypass the version counter (as they bypass autograd's checks):
call :func:`clear_interleaved_cache` after them. At most :data:`CACHE_ENTRIES` entries are kept
(least recently used out).
"""

# (no `from __future__ import annotations`: the epilogue below annotates with a dtype variable)

import collections
import dataclasses
import operator
import threading
from typing import Any, Callable, Mapping

__all__ = ["ACTS", "CACHE_ENTRIES", "clear_interleaved_cache", "fuse_gated", "gated_op", "interleaved"]

#: ATen activation -> evtc op (``aten.gelu`` by its ``approximate`` argument)
ACTS = {"aten.silu.default": "silu", "aten.relu.default": "relu", "aten.sigmoid.default": "sigmoid",
        "aten.gelu.default": "gelu"}
_MM = ("aten.mm.default", "aten.addmm.default")
_VIEWS = ("aten.view.default", "aten._unsafe_view.default", "aten.reshape.default")
#: the interleaved copies kept at once (NOTE [The interleaved weights' cache])
CACHE_ENTRIES = 64

_LOCK = threading.Lock()
_CACHE: "collections.OrderedDict[tuple, tuple]" = collections.OrderedDict()
_OP = None


def clear_interleaved_cache() -> None:
    """Drop every interleaved weight kept (NOTE [The interleaved weights' cache]): after writing
    weights through ``.data``, which does not bump their version counters."""
    with _LOCK:
        _CACHE.clear()


def _key(t) -> tuple:
    return (t.data_ptr(), tuple(t.shape), tuple(t.stride()), t.dtype, t.device, t._version)


def interleaved(gate, up):
    """:func:`evtc.interleave_gate_up` of two weights (or biases), cached (NOTE [The interleaved
    weights' cache]): the same copy while neither tensor changes."""
    from evtc.gated import interleave_gate_up

    key = (_key(gate), _key(up))
    with _LOCK:
        hit = _CACHE.get(key)
        if hit is not None:
            _CACHE.move_to_end(key)
            return hit[0]
    out = interleave_gate_up(gate.detach(), up.detach())
    with _LOCK:
        _CACHE[key] = (out, gate.untyped_storage(), up.untyped_storage())
        while len(_CACHE) > CACHE_ENTRIES:
            _CACHE.popitem(last=False)
    return out


_OPS: dict = {}


def gated_op(gemm, *, grouped: bool, bias: bool):
    """The custom op ``evtc::gated_<the Gemm's op>(Tensor x, Tensor w_gate, Tensor w_up[, Tensor
    offs][, Tensor b_gate, Tensor b_up]) -> Tensor`` that the rewrite calls (made once per Gemm and
    form): it interleaves the weights (and biases) through the cache and runs ``gemm``'s own op.

    NOTE [The interleaved copy stays inside the op]: the cached copy is never a value of the
    graph, so Inductor can't plan a buffer over it (a dead extern output may be reused in place
    by a later kernel, which would overwrite the cache). Inside a captured CUDA graph the copy of
    the capture is replayed: weights updated in place after the capture are not seen by the gated
    GEMM (capture again, as after any change a graph can't see)."""
    import torch

    inner = gemm.torch_op()
    name = "gated_" + inner.qualname.split("::")[1]
    key = (name, grouped, bias)
    with _LOCK:
        if key in _OPS:
            return _OPS[key]
    args = ["Tensor x", "Tensor w_gate", "Tensor w_up"] + (["Tensor offs"] if grouped else []) + \
           (["Tensor b_gate", "Tensor b_up"] if bias else [])
    qualname = f"evtc::{name}{'_b' if bias else ''}"

    def run(x, w_gate, w_up, *rest):
        rest = list(rest)
        call = [x, interleaved(w_gate, w_up)] + ([rest.pop(0)] if grouped else [])
        if bias:
            call.append(interleaved(rest[0], rest[1]))
        return inner.op(*call)

    def fake(x, w_gate, w_up, *rest):
        return x.new_empty((x.shape[0], w_gate.shape[-2]))

    op = torch.library.custom_op(qualname, run, mutates_args=(), device_types=None,
                                 schema="(" + ", ".join(args) + ") -> Tensor")
    op.register_fake(fake)
    ns, n = qualname.split("::")
    overload = getattr(getattr(torch.ops, ns), n).default
    with _LOCK:
        _OPS[key] = overload
    return overload


def _val(node):
    return node.meta.get("val") if hasattr(node, "meta") else None


def _single(node) -> bool:
    return len(node.users) == 1


def _under_views(node) -> tuple[Any, list]:
    """(the node under a chain of single-use row views, the views)."""
    views = []
    while hasattr(node, "target") and str(node.target) in _VIEWS and _single(node):
        views.append(node)
        node = node.args[0]
    return node, views


def _act_of(node) -> str | None:
    name = str(getattr(node, "target", ""))
    act = ACTS.get(name)
    if act == "gelu":
        approx = node.kwargs.get("approximate", node.args[1] if len(node.args) > 1 else "none")
        act = {"none": "gelu", "tanh": "gelu_tanh"}.get(approx)
    return act


def _projection(mm, allow_cpu: bool):
    """(x, W, bias) of ``mm(x, t(W))`` / ``addmm(bias, x, t(W))`` if evtc can run it as half of a
    gated pair (bf16/f16, 2-D, K-major W (I, K), K and I multiples of 8, alpha = beta = 1), else None."""
    import torch

    name = str(getattr(mm, "target", ""))
    if name not in _MM or not _single(mm):
        return None
    if name == "aten.addmm.default":
        bias, x, wt = mm.args[:3]
        if mm.kwargs.get("beta", 1) != 1 or mm.kwargs.get("alpha", 1) != 1:
            return None
    else:
        (x, wt), bias = mm.args[:2], None
    if str(getattr(wt, "target", "")) != "aten.t.default":
        return None
    w = wt.args[0]
    vx, vw, vy = _val(x), _val(w), _val(mm)
    if not all(isinstance(v, torch.Tensor) for v in (vx, vw, vy)) or vw.dim() != 2 or vx.dim() != 2:
        return None
    if vx.dtype != vw.dtype or vy.dtype != vx.dtype or vx.dtype not in (torch.bfloat16, torch.float16):
        return None
    if vx.device.type != "cuda" and not allow_cpu:
        return None
    if any(not isinstance(s, int) for s in (*vx.shape, *vw.shape, *vw.stride())):
        return None  # symbolic shapes: the general matcher's business
    I, K = vw.shape
    if K % 8 or I % 8 or vw.stride() != (K, 1):
        return None
    if bias is not None:
        vb = _val(bias)
        if not isinstance(vb, torch.Tensor) or tuple(vb.shape) != (I,) or vb.dtype != vx.dtype:
            return None
    return x, w, bias


def _same_rows(a, b) -> bool:
    """Whether two fx values are the same tensor: one node, or the same view of the same tensor
    (make_fx traces ``x.view(-1, H)`` once per projection)."""
    while a is not b:
        if str(getattr(a, "target", "")) not in _VIEWS or str(getattr(b, "target", "")) not in _VIEWS:
            return False
        va, vb = _val(a), _val(b)
        if va is None or vb is None or tuple(va.shape) != tuple(vb.shape):
            return False
        a, b = a.args[0], b.args[0]
    return True


def _epilogue(act: str, bias_dtype):
    import evtc

    if bias_dtype is None:
        def gated(acc):
            return evtc.glu(acc, act=act)
    else:
        def gated(acc, bias: evtc.RowVector[bias_dtype]):
            return evtc.glu(acc + bias, act=act)
    return evtc.epilogue(gated, name=f"gated_{act}")


@dataclasses.dataclass
class _Pair:
    """A gated pair found in the graph: the tokens ``x``; the weights, as (W_gate, W_up) nodes,
    or as one concatenated [W_gate; W_up] node ``w`` (its halves sliced at ``I`` along ``wdim``);
    the biases likewise (or None); ``offs`` for a grouped GEMM; the act; the nodes to erase."""

    x: Any
    act: str
    dead: list
    weights: tuple | None = None
    w: Any = None
    wdim: int = 0
    biases: tuple | None = None
    bias: Any = None
    offs: Any = None
    #: the act is on the concatenation's second half (``h, gate = y.chunk(2, -1); h * act(gate)``)
    swap: bool = False


def _match(mul, allow_cpu: bool) -> "_Pair | None":
    """The gated pair whose product is ``mul``: two projections of the same tokens
    (``act(x W_gate^T) * (x W_up^T)``) or the two halves of one (``g, u = (x W^T).chunk(2, -1)``,
    Phi-3's ``gate_up_proj``; or of a ``torch._grouped_mm``, a mixture-of-experts layer)."""
    if str(getattr(mul, "target", "")) == "aten.glu.default":
        return _glu_pair(mul, allow_cpu)
    if str(getattr(mul, "target", "")) != "aten.mul.Tensor" or len(mul.args) != 2:
        return None
    import torch

    vmul = _val(mul)
    for p, q in (mul.args, mul.args[::-1]):
        a, views_a = _under_views(p)
        act = _act_of(a)
        if act is None or not _single(a) or not hasattr(q, "target"):
            continue
        vp, vq = _val(p), _val(q)
        if not all(isinstance(v, torch.Tensor) for v in (vmul, vp, vq)) or tuple(vp.shape) != tuple(vq.shape):
            continue  # (a broadcasting product, or one by a symbolic size (h * pos), is no gated pair)
        g, views_g = _under_views(a.args[0])
        u, views_u = _under_views(q)
        head = [mul, *views_a, a, *views_g, *views_u]
        split = _halves(g, u)
        if split is not None:
            pair = _split_pair(split.args[0], act, head + [g, u, split], allow_cpu)
            if pair is not None:
                pair.swap = g.args[1] == 1
                return pair
            continue
        if g is u:
            continue
        pg, pu = _projection(g, allow_cpu), _projection(u, allow_cpu)
        if pg is None or pu is None or not _same_rows(pg[0], pu[0]):
            continue
        vg, vu = _val(pg[1]), _val(pu[1])
        if tuple(vg.shape) != tuple(vu.shape) or (pg[2] is None) != (pu[2] is None):
            continue
        dead = head + [g, u, g.args[-1], u.args[-1]]
        x_u = pu[0]
        while x_u is not pg[0] and str(getattr(x_u, "target", "")) in _VIEWS:  # up's own view of x
            dead.append(x_u)
            x_u = x_u.args[0]
        biases = (pg[2], pu[2]) if pg[2] is not None else None
        return _Pair(pg[0], act, dead, weights=(pg[1], pu[1]), biases=biases)
    return None


def _halves(g, u):
    """The ``aten.split`` node whose items 0 and 1, or 1 and 0, ``g`` and ``u`` are, over the last
    dimension in two equal halves; else None.

    NOTE [The act on either half]: diffusers' GEGLU (``h, gate = proj(x).chunk(2, -1); h *
    gelu(gate)``), ``F.glu`` (``a * sigmoid(b)``, written out or ``aten.glu`` itself:
    :func:`_glu_pair`) and Mamba-style ``x * silu(z)`` gate the second half, where Phi-3 gates
    the first; both are one glu GEMM, the weights' halves (and the bias's) passed to the gated
    op as (gate, up) in the order the act takes them (``_Pair.swap``)."""
    if getattr(g, "target", None) is not operator.getitem or getattr(u, "target", None) is not operator.getitem \
            or g.args[0] is not u.args[0]:
        return None
    split = g.args[0]
    name = str(getattr(split, "target", ""))
    if name not in ("aten.split.Tensor", "aten.split_with_sizes.default") \
            or (g.args[1], u.args[1]) not in ((0, 1), (1, 0)):
        return None
    y = _val(split.args[0])
    dim = split.args[2] if len(split.args) > 2 else split.kwargs.get("dim", 0)
    # (x.chunk(2, -1) is split(I); x.split([I, I], -1) is split_with_sizes([I, I]))
    sizes = [split.args[1]] * 2 if name == "aten.split.Tensor" else list(split.args[1])
    if y is None or not isinstance(dim, int) or dim % y.dim() != y.dim() - 1 or len(split.users) != 2 \
            or not _single(g) or not _single(u) or len(sizes) != 2 \
            or not all(isinstance(s, int) for s in (*sizes, y.shape[-1])) or sizes[0] != sizes[1] \
            or 2 * sizes[0] != y.shape[-1]:
        return None  # (a symbolic size, an fx node or a SymInt: pairs are matched at static shapes only)
    return split


def _glu_pair(glu, allow_cpu: bool) -> "_Pair | None":
    """``F.glu(y, dim=-1)``, ``a * sigmoid(b)`` of ``y``'s halves (``aten.glu``, which the
    importer's table has no row for): the pair of a projection ``y``'s halves with the act on the
    second (NOTE [The act on either half])."""
    dim = glu.args[1] if len(glu.args) > 1 else glu.kwargs.get("dim", -1)
    vy = _val(glu.args[0])
    if vy is None or not isinstance(dim, int) or vy.dim() < 1 or dim % vy.dim() != vy.dim() - 1 or vy.shape[-1] % 2:
        return None
    pair = _split_pair(glu.args[0], "sigmoid", [glu], allow_cpu)
    if pair is not None:
        pair.swap = True
    return pair


def _split_pair(src, act: str, dead: list, allow_cpu: bool) -> "_Pair | None":
    """The pair of one projection's two halves (``src`` is what is split: the projection's
    output under row views, views that keep its last dimension, so that the halves are its first
    and last I columns; a view to another last dimension, ``y.view(M, 2, I)``, pairs other
    columns)."""
    import torch

    y, views_y = _under_views(src)
    vy, vs = _val(y), _val(src)
    if not _single(y) or vy is None or vs is None or vy.dim() < 1 or vs.shape[-1] != vy.shape[-1]:
        return None
    name = str(getattr(y, "target", ""))
    if name == "aten._grouped_mm.default":
        args = dict(zip(("mat_a", "mat_b", "offs", "bias", "out_dtype"), y.args))
        args.update(y.kwargs)
        x, bt, offs = args.get("mat_a"), args.get("mat_b"), args.get("offs")
        if offs is None or args.get("bias") is not None or str(getattr(bt, "target", "")) != "aten.transpose.int" \
                or tuple(d % 3 for d in bt.args[1:3]) not in ((1, 2), (2, 1)):
            return None
        w = bt.args[0]
        vx, vw, vy = _val(x), _val(w), _val(y)
        if not all(isinstance(v, torch.Tensor) for v in (vx, vw, vy)) or vw.dim() != 3 or vx.dim() != 2 \
                or vx.dtype != vw.dtype or vy.dtype != vx.dtype or vx.dtype not in (torch.bfloat16, torch.float16) \
                or (vx.device.type != "cuda" and not allow_cpu) \
                or any(not isinstance(v, int) for v in (*vx.shape, *vw.shape, *vw.stride())):
            return None
        _, N, K = vw.shape
        if N % 16 or K % 8 or vw.stride()[-1] != 1:
            return None
        return _Pair(x, act, dead + views_y + [y, bt], w=w, wdim=1, offs=offs)
    proj = _projection(y, allow_cpu)
    if proj is None:
        return None
    x, w, bias = proj
    if _val(w).shape[0] % 16:
        return None
    return _Pair(x, act, dead + views_y + [y, y.args[-1]], w=w, wdim=0, bias=bias)


def fuse_gated(gm, *, allow_cpu: bool = False, on_gemm: Callable | None = None,
               gemm_options: Mapping[str, Any] | None = None, gate: Callable | None = None,
               problems: list | None = None) -> int:
    """Rewrite every gated pair of the ATen graph ``gm`` into one evtc GEMM over the interleaved
    weights with ``evtc.glu`` in its epilogue (the module docs), in place; the arguments are
    :func:`evtc.torch.regions.fuse`'s (``gate`` is asked with the GEMM of N = 2I columns; a
    grouped pair runs as an :class:`evtc.GroupedGemm`, which the gate doesn't judge).

    Returns:
        The number of pairs rewritten.
    """
    import torch

    import evtc
    from evtc.errors import EvtcError
    from evtc.torch.regions import _dtype_name, fake_val

    graph = gm.graph
    fused = 0
    aten = torch.ops.aten
    for mul in [n for n in graph.nodes if n.op == "call_function"]:
        m = _match(mul, allow_cpu)
        if m is None:
            continue
        vx = _val(m.x)
        dt = _dtype_name(vx)
        if m.weights is not None:
            (I, K), E = _val(m.weights[0]).shape, None
        else:
            shape = _val(m.w).shape
            E, (I2, K) = (shape[0], shape[1:]) if m.offs is not None else (None, shape)
            I = I2 // 2
        M = vx.shape[0]
        has_bias = m.biases is not None or m.bias is not None
        try:
            ep = _epilogue(m.act, dt if has_bias else None)
            if m.offs is not None:
                gemm = evtc.GroupedGemm(ep, a=dt, b=dt, c=dt, d=dt,
                                        batch_invariant=(gemm_options or {}).get("batch_invariant"))
            else:
                gemm = evtc.Gemm(ep, a=dt, b=dt, c=dt, d=dt, **(gemm_options or {}))
                if gate is not None and not gate(gemm, M, 2 * I, K, 1, vx.device):
                    continue  # predicted slower than leaving it to Inductor
            if on_gemm is not None:
                on_gemm(gemm)
            gemm.torch_op()
        except EvtcError:
            continue
        overload = gated_op(gemm, grouped=m.offs is not None, bias=has_bias)
        with graph.inserting_before(mul):
            def node(target, args):  # with its fake value (NOTE [New nodes carry their fake values])
                n = graph.call_function(target, args)
                fake_val(n)
                return n

            def halves(t, dim):  # [W_gate; W_up] -> its two halves, views (NOTE [The act on either half])
                order = (1, 0) if m.swap else (0, 1)
                return tuple(node(aten.slice.Tensor, (t, dim, k * I, (k + 1) * I)) for k in order)

            args = [m.x, *(m.weights or halves(m.w, m.wdim))]
            if m.offs is not None:
                args.append(m.offs)
            if has_bias:
                args.extend(m.biases or halves(m.bias, 0))
            out = node(overload, tuple(args))
            vmul = _val(mul)
            if tuple(vmul.shape) != (M, I):
                out = node(aten.view.default, (out, list(vmul.shape)))
            out.meta["val"] = vmul
        mul.replace_all_uses_with(out)
        if problems is not None and m.offs is None:
            problems.append((gemm, (M, 2 * I, K, 1), vx.device))
        for n in m.dead:
            if n in graph.nodes and not n.users:
                graph.erase_node(n)
        fused += 1
    if fused:
        graph.lint()
        gm.recompile()
    return fused
