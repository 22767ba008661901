"""The torch backend's one-GEMM gated form: ``act(x W_gate^T) * (x W_up^T)`` becomes one evtc
GEMM over the interleaved weights with ``evtc.glu`` in its epilogue (docs/gated.md).

Input: an ATen graph (:func:`evtc.torch.regions.to_aten`). Output: the graph with each gated
pair rewritten in place (:func:`fuse_gated`), before the regions of :func:`evtc.torch.regions.
fuse` grow over the rest (the down projection, residuals...).

The pattern: ``mul(act(mm(x, t(W_gate))), mm(x, t(W_up)))`` (either operand order; ``addmm``
with a bias on both projections; views of the rows between the GEMMs and the mul, as a 3-D
``(B, S, H)`` input gives), act one of :data:`ACTS`, the same ``x`` for both GEMMs, the weights
2-D ``(I, K)`` K-major, every intermediate used once (so a training graph, whose forward saves the
projections for the backward, never matches: :func:`evtc.torch.regions.fuse` fuses those as two
GEMMs). It becomes ``glu_op(x, interleave_gate_up(W_gate, W_up)[, interleave(b_gate, b_up)])``.

NOTE [The interleaved weights' cache]: the weights are graph inputs (the module's parameters), so
the interleaved copy is made by a custom op, ``evtc::interleave_gate_up``, at run time, and kept:
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
import threading
from typing import Any, Callable, Mapping

__all__ = ["ACTS", "CACHE_ENTRIES", "clear_interleaved_cache", "fuse_gated"]

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


def interleave_op():
    """The ``evtc::interleave_gate_up(Tensor gate, Tensor up) -> Tensor`` custom op (made once):
    :func:`evtc.interleave_gate_up` of two weights (or biases), cached."""
    global _OP
    with _LOCK:
        if _OP is not None:
            return _OP
        import torch

        from evtc.gated import interleave_gate_up

        def run(gate, up):
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

        def fake(gate, up):
            shape = list(gate.shape)
            shape[-2 if gate.dim() >= 2 else -1] *= 2
            return gate.new_empty(shape)

        op = torch.library.custom_op("evtc::interleave_gate_up", run, mutates_args=(),
                                     schema="(Tensor gate, Tensor up) -> Tensor")
        op.register_fake(fake)
        _OP = torch.ops.evtc.interleave_gate_up.default
        return _OP


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


def _match(mul, allow_cpu: bool):
    """(x, (W_gate, W_up), (b_gate, b_up) or None, act, the nodes to erase) of a gated pair whose
    product is ``mul``, or None."""
    if str(getattr(mul, "target", "")) != "aten.mul.Tensor" or len(mul.args) != 2:
        return None
    for p, q in (mul.args, mul.args[::-1]):
        a, views_a = _under_views(p)
        act = _act_of(a)
        if act is None or not _single(a) or not hasattr(q, "target"):
            continue
        mm_g, views_g = _under_views(a.args[0])
        mm_u, views_u = _under_views(q)
        if mm_g is mm_u:
            continue
        pg, pu = _projection(mm_g, allow_cpu), _projection(mm_u, allow_cpu)
        if pg is None or pu is None or not _same_rows(pg[0], pu[0]):
            continue
        vg, vu = _val(pg[1]), _val(pu[1])
        if tuple(vg.shape) != tuple(vu.shape) or (pg[2] is None) != (pu[2] is None):
            continue
        vmul, vp, vq = _val(mul), _val(p), _val(q)
        if vmul is None or vp is None or vq is None or tuple(vp.shape) != tuple(vq.shape):
            continue  # (a broadcasting product is no gated pair)
        dead = [mul, *views_a, a, *views_g, mm_g, *views_u, mm_u, mm_g.args[-1], mm_u.args[-1]]
        x_u = pu[0]
        while x_u is not pg[0] and str(getattr(x_u, "target", "")) in _VIEWS:  # up's own view of x
            dead.append(x_u)
            x_u = x_u.args[0]
        biases = (pg[2], pu[2]) if pg[2] is not None else None
        return pg[0], (pg[1], pu[1]), biases, act, dead
    return None


def fuse_gated(gm, *, allow_cpu: bool = False, on_gemm: Callable | None = None,
               gemm_options: Mapping[str, Any] | None = None, gate: Callable | None = None) -> int:
    """Rewrite every gated pair of the ATen graph ``gm`` into one evtc GEMM over the interleaved
    weights with ``evtc.glu`` in its epilogue (the module docs), in place; the arguments are
    :func:`evtc.torch.regions.fuse`'s (``gate`` is asked with the GEMM of N = 2I columns).

    Returns:
        The number of pairs rewritten.
    """
    import torch

    import evtc
    from evtc.errors import EvtcError
    from evtc.torch.regions import _dtype_name

    graph = gm.graph
    fused = 0
    for mul in [n for n in graph.nodes if n.op == "call_function"]:
        m = _match(mul, allow_cpu)
        if m is None:
            continue
        x, (wg, wu), biases, act, dead = m
        vx, vw = _val(x), _val(wg)
        dt = _dtype_name(vx)
        (I, K), M = vw.shape, vx.shape[0]
        try:
            gemm = evtc.Gemm(_epilogue(act, dt if biases else None), a=dt, b=dt, c=dt, d=dt, **(gemm_options or {}))
            if gate is not None and not gate(gemm, M, 2 * I, K, 1, vx.device):
                continue  # predicted slower than leaving it to Inductor
            if on_gemm is not None:
                on_gemm(gemm)
            op = gemm.torch_op()
        except EvtcError:
            continue
        il = interleave_op()
        with graph.inserting_before(mul):
            w = graph.call_function(il, (wg, wu))
            args = [x, w]
            if biases:
                args.append(graph.call_function(il, biases))
            out = graph.call_function(op.overload, tuple(args))
            vmul = _val(mul)
            if tuple(vmul.shape) != (M, I):
                out = graph.call_function(torch.ops.aten.view.default, (out, list(vmul.shape)))
            out.meta["val"] = vmul
        mul.replace_all_uses_with(out)
        for n in dead:
            if n in graph.nodes and not n.users:
                graph.erase_node(n)
        fused += 1
    if fused:
        graph.lint()
        gm.recompile()
    return fused
