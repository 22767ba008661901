"""The 1x1 route of a conv family: a pointwise fprop call -> the call run by a Gemm of the epilogue.

Input: the operands of a Conv fprop call whose problem is pointwise (stride 1, no padding,
dilation 1; :func:`evtc.family.conv.pointwise_problem`), its epilogue keyword arguments and
outputs. Output: the call run by the dispatch of a :class:`evtc.Gemm` of the same epilogue,
dtypes and arch (given to the route, made on first use) on
:class:`~evtc.runtime.tensors.TensorView` s of the same memory (:mod:`evtc.runtime.conv_gemm`),
with the outputs returned in the Conv's layout; or :data:`NOT_ROUTED` when the call doesn't fit
(a filter that is not 1x1, operands the conv checks would refuse), and then a conv kernel runs it
and its checks report what is wrong (NOTE [1x1 convolutions as GEMMs] in :mod:`evtc.family.conv`).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from evtc.dtypes import DType
from evtc.errors import ArgumentError
from evtc.ir.graph import Graph
from evtc.ir.nodes import AuxLoad, Source, Store
from evtc.runtime import tensors
from evtc.runtime.bind import ALIGN
from evtc.runtime.conv_gemm import gemm_operands, mn_view
from evtc.runtime.conv_problem import from_nhwc, to_nhwc
from evtc.runtime.tensors import TensorView, contiguous_strides

__all__ = ["NOT_ROUTED", "GemmRoute"]

#: what :meth:`GemmRoute.__call__` returns for a call the GEMM doesn't take
NOT_ROUTED = object()


class GemmRoute:
    """An sm90 fprop family's 1x1 problems on a :class:`evtc.Gemm` of its epilogue (NOTE [1x1
    convolutions as GEMMs]), run through the Gemm's dispatch. The Gemm (its whole family, its
    heuristic) is made on first use.

    Args:
        graph: the Conv's epilogue after passes.
        a, b: the Conv's operand dtypes.
        layout: the Conv's layout (``nhwc`` or ``nchw``).
        make_gemm: makes the Gemm of the Conv's epilogue, dtypes, arch and plan policy (its
            default family), on first use.
    """

    def __init__(self, graph: Graph, a: DType, b: DType, layout: str, make_gemm: Callable[[], Any]) -> None:
        self.a, self.b, self.layout, self.name = a, b, layout, graph.name
        self._make_gemm = make_gemm
        self._gemm: Any = None
        self._mxn_inputs = tuple(i.name for i in graph.used_inputs if isinstance(i, (Source, AuxLoad)))
        self._stores = tuple(o for o in graph.outputs if isinstance(o, Store))
        self._names = tuple(o.name for o in graph.outputs)
        self._vec = ALIGN // a.bytes
        self._recipes: dict[tuple, tuple] = {}

    @property
    def gemm(self):
        """The :class:`evtc.Gemm` 1x1 problems run on (made on first use)."""
        if self._gemm is None:
            self._gemm = self._make_gemm()
        return self._gemm

    def kernel(self, M: int, N: int, K: int):
        """The member the Gemm's family picks for an (M, N, K) problem, and its kernel."""
        family = self.gemm.dispatch.family
        member = family.choose(M, N, K)
        return member, family.kernel(member)

    def kernels(self) -> list:
        """The kernels of the Gemm's default family (planned, not built)."""
        return self.gemm.dispatch.family.kernels()

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
        layout, name = self.layout, self.name
        try:
            vx = to_nhwc(tensors.view(a, "x", name), layout)
            vw = to_nhwc(tensors.view(b, "w", name), layout)
        except ArgumentError:
            return None
        if vx.dtype is not self.a or vw.dtype is not self.b or vx.device != vw.device:
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
        res = self.gemm.dispatch.run(A, B, kw, outs or None, stream)
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
