"""A 1x1 convolution's call as a GEMM's: conv tensors -> the GEMM's (M, K), (N, K), (M, N) views.

Input: the operands of a :class:`evtc.Conv` fprop call whose problem is pointwise (stride 1, no
padding, dilation 1; :func:`evtc.family.conv.pointwise_problem`), its epilogue keyword arguments
and outputs. Output: the call run by the Conv's :class:`evtc.Gemm` (same epilogue, dtypes and
arch) on :class:`~evtc.runtime.tensors.TensorView` s of the same memory, with the outputs
returned in the Conv's layout; or :data:`NOT_ROUTED` when the call doesn't fit (a filter that is
not 1x1, operands the conv checks would refuse), and then the conv kernel runs it and its checks
report what is wrong (NOTE [1x1 convolutions as GEMMs] in :mod:`evtc.family.conv`).

The views, for x of N x (D) x H x W x C, w of K x (1 x) 1 x 1 x C, y of N x (D) x H x W x K (NHWC
order; ``layout="nchw"`` tensors are read in that order through their strides):

========  =================  =====================================  ===================
GEMM      extents            from                                   strides (elements)
========  =================  =====================================  ===================
A         (M, K) = (N*H*W, C)  x, its pixels collapsed                (row stride, 1): C when packed
B         (N, K) = (K, C)      w, its filter taps (all 1) dropped      (C, 1)
C, D...   (M, N) = (N*H*W, K)  y-shaped tensors, pixels collapsed      (row stride, 1): K when packed
========  =================  =====================================  ===================

An (M, N) 2-D tensor is passed as it is, as the conv kernels take it. Outputs evtc allocates are
packed in the Conv's layout (channels-last for ``"nchw"``), as the conv kernel's are.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from evtc.errors import ArgumentError
from evtc.ir.nodes import AuxLoad, Source, Store
from evtc.runtime import tensors
from evtc.runtime.bind import ALIGN
from evtc.runtime.conv_problem import as_rows, from_nhwc, to_nhwc
from evtc.runtime.tensors import TensorView, contiguous_strides

if TYPE_CHECKING:
    from evtc.conv import Conv
    from evtc.gemm import Gemm

__all__ = ["NOT_ROUTED", "GemmRoute", "gemm_operands", "mn_view"]

#: what :meth:`GemmRoute.__call__` returns for a call the GEMM doesn't take
NOT_ROUTED = object()


def gemm_operands(x: TensorView, w: TensorView, vec: int) -> tuple[TensorView, TensorView] | None:
    """The GEMM's A (M, C) and B (K, C) views of an fprop's x and w (both in NHWC order), or
    None when the call is not a 1x1 GEMM the conv checks would accept: a filter tap count other
    than 1, differing channels, an empty extent, channels not multiples of ``vec`` (16 bytes),
    a base address not 16-byte aligned, or pixels that don't collapse into rows of one stride."""
    if len(x.shape) != len(w.shape) or len(x.shape) < 3 or any(f != 1 for f in w.shape[1:-1]):
        return None
    n, c, k = x.shape[0], x.shape[-1], w.shape[0]
    if w.shape[-1] != c or min(math.prod(x.shape[:-1]), c, k) <= 0 or c % vec or k % vec:
        return None
    if x.ptr % ALIGN or w.ptr % ALIGN or x.device < 0:
        return None
    del n
    A = as_rows(x, math.prod(x.shape[:-1]), c)
    B = as_rows(w, k, c)
    if A is None or B is None:
        return None
    return A, B


def mn_view(obj: Any, name: str, M: int, N: int, out_nhwc: tuple[int, ...], layout: str,
            epilogue: str | None = None) -> TensorView:
    """The (M, N) view of an M x N tensor of the epilogue given shaped like the output (in the
    Conv's ``layout``) or as the (M, N) matrix.

    Raises:
        ArgumentError: another shape, or pixels that don't collapse into rows of one stride (the
            messages of :class:`~evtc.runtime.conv_bind.ConvBinder`).
    """
    v = tensors.view(obj, name, epilogue)
    if len(v.shape) == 2:
        return v
    nv = to_nhwc(v, layout)
    if tuple(nv.shape) == out_nhwc:
        mv = as_rows(nv, M, N)
        if mv is None:
            hint = ("pass a .contiguous() NHWC tensor; a torch tensor of logical shape N x C x H x W in "
                    "channels_last memory needs Conv(..., layout='nchw')" if layout == "nhwc" else
                    "pass x.contiguous(memory_format=torch.channels_last) (channels_last_3d for 3-D)")
            raise ArgumentError(f"argument '{name}' (shape {tuple(v.shape)}, strides {tuple(v.strides)}) is not M "
                                f"rows of {N} contiguous elements with one row stride", epilogue=epilogue, hint=hint)
        return mv
    want = from_nhwc(out_nhwc, contiguous_strides(out_nhwc), layout)[0]
    raise ArgumentError(f"argument '{name}' has shape {tuple(v.shape)}, expected the output's {want} or the "
                        f"implicit GEMM's ({M}, {N})", epilogue=epilogue)


class GemmRoute:
    """A Conv's 1x1 problems on a :class:`evtc.Gemm` of its epilogue (NOTE [1x1 convolutions as
    GEMMs]). The Gemm (its whole family, its heuristic) is made on first use.

    Args:
        conv: the sm90 fprop Conv whose 1x1 problems this runs.
    """

    def __init__(self, conv: Conv) -> None:
        self.conv = conv
        self._gemm: Gemm | None = None
        graph = conv.graph
        self._mxn_inputs = tuple(i.name for i in graph.used_inputs if isinstance(i, (Source, AuxLoad)))
        self._stores = tuple(o for o in graph.outputs if isinstance(o, Store))
        self._names = tuple(o.name for o in graph.outputs)
        self._vec = ALIGN // conv.a.bytes
        self._recipes: dict[tuple, tuple] = {}

    @property
    def gemm(self) -> Gemm:
        """The Gemm of the Conv's epilogue, dtypes, arch and plan policy (its default family)."""
        if self._gemm is None:
            from evtc.gemm import Gemm

            c = self.conv
            policy = c._plan_args.get("policy", "evtc") if c._plan_args else "evtc"
            self._gemm = Gemm(c.traced, a=c.a, b=c.b, c=c.c, d=c.d, arch=c.arch, plan=policy)
        return self._gemm

    def views(self, a: Any, b: Any, kwargs: Mapping[str, Any], out: Any):
        """The GEMM call of a conv call: ``(A, B, kwargs, out, allocate)`` with (M, K), (N, K)
        and (M, N) views, and the M x N outputs evtc allocates, ``[(name, shape, strides, dtype,
        framework, device)]`` in the Conv's layout (their (M, N) views are packed rows); or None
        when the call is not the GEMM's to run. Calls whose tensors have the shapes, strides,
        dtypes and devices of an earlier one reuse its views with their own pointers (NOTE [The
        launch path]).

        Raises:
            ArgumentError: an M x N argument of a wrong shape (named).
        """
        fast = self._probe(a, b, kwargs, out)
        if fast is not None:
            key, objs = fast
            recipe = self._recipes.get(key)
            if recipe is not None and not (objs[0][1] % ALIGN or objs[1][1] % ALIGN):
                templates, kw_names, out_names, allocate = recipe
                made = [TensorView(obj, ptr, t.shape, t.strides, t.dtype, t.dtype_name, t.device, t.framework)
                        for (obj, ptr), t in zip(objs, templates)]
                kw = dict(kwargs)
                for nm, v in zip(kw_names, made[2:]):
                    kw[nm] = v
                outs = {nm: v for nm, v in zip(out_names, made[2 + len(kw_names):])}
                if isinstance(out, Mapping):
                    for nm, v in out.items():
                        if v is not None and nm not in outs:
                            outs[nm] = v
                return made[0], made[1], kw, outs, allocate
        got = self._views(a, b, kwargs, out)
        if got is not None and fast is not None:
            A, B, kw, outs, allocate = got
            kw_names = tuple(nm for nm in self._mxn_inputs if nm in kwargs)
            out_names = tuple(o.name for o in self._stores if o.name in outs)
            templates = (A, B, *(kw[nm] for nm in kw_names), *(outs[nm] for nm in out_names))
            if len(self._recipes) > 256:
                self._recipes.clear()
            self._recipes[fast[0]] = (templates, kw_names, out_names, allocate)
        return got

    def _probe(self, a: Any, b: Any, kwargs: Mapping[str, Any], out: Any):
        """(key, [(object, pointer)] of x, w, the M x N inputs and the given M x N outputs) by
        the tensors' fast probes, or None when a tensor has none (the full path then)."""
        if out is None:
            given: Mapping[str, Any] = {}
        elif type(out) is dict:
            given = out
        elif len(self._names) == 1:
            given = {self._names[0]: out}
        else:
            return None
        objs = [a, b] + [kwargs[nm] for nm in self._mxn_inputs if nm in kwargs]
        objs += [given[o.name] for o in self._stores if given.get(o.name) is not None]
        keys: list = [tuple(given), tuple(nm for nm in self._mxn_inputs if nm in kwargs)]
        pairs = []
        probes = tensors._PROBES
        for x in objs:
            probe = probes.get(type(x))
            if probe is None:
                probe = tensors.probe_for(type(x))
                if probe is None:
                    if not hasattr(x, "__cuda_array_interface__"):  # an instance attribute, not the class's
                        return None
                    probe = tensors.cai_probe
            try:
                k, p = probe(x)
            except Exception:
                return None
            keys.append(k)
            pairs.append((x, p))
        return tuple(keys), pairs

    def _views(self, a: Any, b: Any, kwargs: Mapping[str, Any], out: Any):
        c = self.conv
        layout, name = c.layout, c.name
        try:
            vx = to_nhwc(tensors.view(a, "x", name), layout)
            vw = to_nhwc(tensors.view(b, "w", name), layout)
        except ArgumentError:
            return None
        if vx.dtype is not c.a or vw.dtype is not c.b or vx.device != vw.device:
            return None
        ops = gemm_operands(vx, vw, self._vec)
        if ops is None:
            return None
        A, B = ops
        M, N = A.shape[0], B.shape[0]
        out_nhwc = (*vx.shape[:-1], N)
        kw = dict(kwargs)
        for nm in self._mxn_inputs:
            if nm in kw:
                kw[nm] = mn_view(kw[nm], nm, M, N, out_nhwc, layout, name)
        given: dict[str, Any] = {}
        if out is not None:
            if isinstance(out, Mapping):
                given = {k: v for k, v in out.items() if v is not None}
            elif len(self._names) == 1:
                given = {self._names[0]: out}
            else:
                return None  # the conv binder says what is wrong
        outs: dict[str, Any] = {}
        allocate = []
        for o in self._stores:
            if o.name in given:
                outs[o.name] = mn_view(given[o.name], f"out['{o.name}']", M, N, out_nhwc, layout, name)
            else:
                shape, strides = from_nhwc(out_nhwc, contiguous_strides(out_nhwc), layout)
                allocate.append((o.name, shape, strides, o.dtype, vx.framework, vx.device))
        for nm, v in given.items():
            if nm not in outs:
                outs[nm] = v  # reductions: (M,), (N,) or () as the conv's
        return A, B, kw, outs, tuple(allocate)

    def __call__(self, a: Any, b: Any, kwargs: Mapping[str, Any], out: Any, stream: Any):
        """Run a conv call on the Gemm; :data:`NOT_ROUTED` when it isn't the GEMM's.

        Returns:
            As :meth:`evtc.Conv.__call__`: the output alone when it is the only one, else a dict
            name -> tensor; M x N outputs in the Conv's layout.

        Raises:
            ArgumentError: a bad argument (named), from the views or the Gemm's checks.
            LaunchError: CUDA reported an error.
        """
        got = self.views(a, b, kwargs, out)
        if got is None:
            return NOT_ROUTED
        A, B, kw, outs, allocate = got
        allocated: dict[str, Any] = {}
        M, N = A.shape[0], B.shape[0]
        for nm, shape, strides, dtype, framework, device in allocate:
            obj, ptr = tensors.strided_allocator(framework, device, shape, strides, dtype)()
            allocated[nm] = obj
            outs[nm] = TensorView(obj, ptr, (M, N), (N, 1), dtype, dtype.name, device, framework)
        res = self.gemm.run(A, B, kw, outs or None, stream)
        if not isinstance(res, dict):
            res = {self._names[0]: res}
        user = out if isinstance(out, Mapping) else ({self._names[0]: out} if out is not None else {})
        final = {}
        for nm in self._names:
            if nm in allocated:
                final[nm] = allocated[nm]
            elif nm in user and user[nm] is not None:
                final[nm] = user[nm]
            else:
                final[nm] = res[nm]
        if len(self._names) == 1:
            d = final[self._names[0]]
            return d if self._names[0] == "D" else {self._names[0]: d}
        return final
