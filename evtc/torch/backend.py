"""A ``torch.compile`` backend that fuses GEMMs with the pointwise work and reductions after them.

Input: the FX graph Dynamo captured and its example inputs. Output: a callable: the graph's ATen
form with each match replaced by one evtc Gemm's custom op (:mod:`evtc.torch.ops`), compiled by
Inductor.

    torch.compile(model, backend="evtc")      # registered on import of evtc.torch.backend and
                                              # through the torch_dynamo_backends entry point

The trace to ATen (:func:`to_aten`) is :mod:`evtc.torch.aten`, the matching and the rewrite
(:func:`fuse`) :mod:`evtc.torch.regions`; this module compiles: a graph without symbolic shapes
is fused and handed to Inductor; a symbolic one is fused per concrete shape (NOTE [Symbolic
shapes], :class:`_Specializing`); a graph that needs gradients is fused after AOTAutograd
splits it, forward and backward alike (NOTE [Fusion in training]), per concrete shape where
they are symbolic (NOTE [Symbolic shapes in training]). ``options={...}`` reach every Gemm
made (:data:`GEMM_OPTIONS`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any, Mapping

from evtc.torch.aten import item_inputs, symbolic, to_aten
from evtc.torch.regions import fuse

__all__ = ["BACKEND_OPTIONS", "GEMM_OPTIONS", "evtc_backend", "fuse", "fuse_gate", "make_backend", "mode_config",
           "prebuild", "to_aten"]


def _has_symbolic_shapes(gm, example_inputs) -> bool:
    """Whether Dynamo gave a graph with symbolic sizes (``dynamic=True``, or a dimension it made
    dynamic after a recompilation): size inputs (ints), symbolic placeholder values, or (the
    graphs AOTAutograd gives) example tensors of symbolic shapes."""
    import torch

    if any(isinstance(x, (int, torch.SymInt)) and not isinstance(x, bool) or
           isinstance(x, torch.Tensor) and symbolic(x) for x in example_inputs):
        return True
    for n in gm.graph.nodes:
        v = n.meta.get("example_value") if n.op == "placeholder" else None
        if isinstance(v, torch.SymInt) or (isinstance(v, torch.Tensor) and symbolic(v)):
            return True
    return False


#: concrete shapes a symbolic graph is specialized for before its later calls run the plain
#: Inductor compilation of the symbolic graph (NOTE [Symbolic shapes]): the default of
#: ``EVTC_MAX_SPECIALIZATIONS``, which each graph reads when it is compiled
MAX_SPECIALIZATIONS = 32


class _Specializing:
    """The compiled form of a Dynamo graph with symbolic shapes (or floats it reads with
    ``.item()``: NOTE [Unspecialized floats] in :mod:`evtc.torch.aten`) whose example fuses.

    NOTE [Symbolic shapes]: an evtc kernel is chosen and launched per call, whatever M is, but
    the backend's matching reads static shapes (K and N multiples of 8, which operands are row
    vectors, columns or aux tensors). When Dynamo hands over a symbolic graph (``dynamic=True``,
    or by default after the second distinct batch size: automatic dynamic shapes), the backend
    traces it at Dynamo's example sizes, as constants (:func:`to_aten` with the size inputs as
    ints). If nothing fuses there, the symbolic graph is compiled as it is (one compilation for
    every shape, as without evtc). If the same fuses on the symbolic graph itself (the sizes
    that vary reach no fused GEMM), that one graph is compiled (NOTE [One fused graph for every
    shape]). Else each call's concrete sizes are traced,
    fused and compiled once per distinct signature (shapes, strides, dtypes, devices, size
    values), so the fusion decision of each call is the one a ``dynamic=False`` compilation of
    its shapes makes; a signature that fuses nothing, and every signature past
    :data:`MAX_SPECIALIZATIONS`, runs the symbolic graph's own compilation (``generic``, made
    while Dynamo's shape environment is current: Inductor needs it for a symbolic graph).

    Args:
        gm: Dynamo's symbolic graph (or AOTAutograd's: NOTE [Symbolic shapes in training]);
            ``generic`` its compilation.
        compile: ``compile(agm, args)``, the compilation of a fused static graph.
        example_inputs: Dynamo's example inputs, ``example_fused`` their fused ATen graph (its
            compilation waits for the first call with that signature), where already made.
    """

    def __init__(self, gm, generic, backend, how: Mapping[str, Any], compile: Callable,
                 example_inputs=None, example_fused=None) -> None:
        self.gm, self.generic, self.backend = gm, generic, backend
        self.how, self.compile = how, compile
        self.compiled: dict = {}
        self.items = item_inputs(gm)  # (NOTE [Unspecialized floats] in evtc/torch/aten.py)
        from evtc import knobs

        self.limit = knobs.max_specializations.get()
        self._warned = False
        self._pending = {} if example_fused is None else {_signature(example_inputs, self.items): example_fused}

    def __call__(self, *args):
        return self._pick(args)(*args)

    def _pick(self, args):
        """The compilation for ``args``' signature (made now if it is new)."""
        key = _signature(args, self.items)
        fn = self.compiled.get(key)
        if fn is None:
            if len(self.compiled) >= self.limit:
                if not self._warned:  # (once per graph: a server sees new token counts for ever)
                    self._warned = True
                    import warnings

                    warnings.warn(f"evtc: a compiled graph has been specialized for {self.limit} "
                                  f"shape{'' if self.limit == 1 else 's'}; calls "
                                  "with a shape not among them run it unfused (torch.compile's own compilation of "
                                  "the symbolic graph). Pad the varying size to a few buckets, or raise "
                                  "EVTC_MAX_SPECIALIZATIONS (each shape costs one compilation)", stacklevel=2)
                return self.generic
            fn = self.compiled[key] = self._specialize(key, list(args))
        return fn

    def _specialize(self, key: tuple, args: list):
        agm = self._pending.pop(key, None)
        if agm is None:
            agm, n = _fused(self.gm, args, self.how)
            if not n:
                return self.generic
            self.backend.fused += n
        return self.compile(agm, args)


class _BoxedSpecializing(_Specializing):
    """:class:`_Specializing` in AOTAutograd's boxed calling convention (a compiled forward or
    backward graph is called with one list of arguments, which it may clear): the signature is
    read before the chosen compilation, boxed too, runs (NOTE [Symbolic shapes in training])."""

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # an instance attribute: Dynamo's disable() wraps the backward's compilation with
        # functools.wraps, which copies the instance's __dict__, not its class's attributes
        self._boxed_call = True

    def __call__(self, args):
        return self._pick(args)(args)


def _hints(example_inputs) -> list:
    """Dynamo's example inputs with each symbolic size (``torch.SymInt``) replaced by its example
    value, read from the symbol's hint so that no guard is added (the symbolic graph stays
    symbolic); a size without a hint stays symbolic (:func:`to_aten` then takes no graph)."""
    import torch

    def hint(x):
        h = getattr(getattr(x, "node", None), "hint", None)
        return h if isinstance(h, int) else x

    return [hint(x) if isinstance(x, torch.SymInt) else x for x in example_inputs]


def _signature(args, items: tuple[int, ...] = ()) -> tuple:
    """What a specialization of a symbolic graph depends on: each tensor's shape, strides, dtype
    and device, the size inputs' values and the values of the floats read with ``.item()`` (the
    positions ``items``: NOTE [Unspecialized floats] in :mod:`evtc.torch.aten`)."""
    import torch

    return tuple((tuple(a.shape), a.stride(), a.dtype, a.device) + ((a.item(),) if i in items else ())
                 if isinstance(a, torch.Tensor) else a for i, a in enumerate(args))


def _fused(gm, example_inputs, how: Mapping[str, Any]) -> tuple[Any, int]:
    """``gm``'s ATen form with its matches fused (:func:`to_aten`, :func:`_fuse_and_build` with
    the keyword arguments ``how``) and their count; (None, 0) when nothing fused."""
    agm = to_aten(gm, example_inputs)
    n = _fuse_and_build(agm, how) if agm is not None else 0
    return (agm if n else None), n


def _evtc_ops(g) -> list[str]:
    """The evtc ops a fused graph calls, sorted (each names its epilogue's IR and family)."""
    return sorted(str(n.target) for n in g.graph.nodes if n.op == "call_function" and str(n.target).startswith("evtc."))


def _fused_symbolic(gm, example_fused, how: Mapping[str, Any]):
    """``gm`` (symbolic) fused as one graph that stays symbolic, where that fuses the same matches
    as its example's static trace ``example_fused`` did; else None (fused per shape).

    NOTE [One fused graph for every shape]: a symbolic graph whose varying sizes reach none of
    its fused GEMMs (a decode step: the projections' M is the batch, only the attention's KV
    length grows; a graph symbolic in a size that feeds no match) needs no per-shape
    specialization: traced with Dynamo's symbolic sizes (:func:`to_aten_symbolic`, as
    AOTAutograd traces), its regions match the GEMMs and values of static shapes only
    (``_start`` and ``_grow`` in :mod:`evtc.torch.regions` skip symbolic ones), and where that
    fuses the same ops as the static trace at Dynamo's example sizes (same epilogues, dtypes
    and families: the ops' names say so) the fused graph is compiled once, symbolic, for every
    shape. Where a varying size reaches a fused GEMM (a prefill's token count is its M), fewer
    fuse and NOTE [Symbolic shapes]'s per-shape specialization runs instead.
    """
    from evtc.torch.aten import to_aten_symbolic

    sgm = to_aten_symbolic(gm)
    if sgm is None:
        return None
    n = _fuse_and_build(sgm, how)
    if not n or _evtc_ops(sgm) != _evtc_ops(example_fused):
        return None
    return sgm


def _fuse_and_build(g, how: Mapping[str, Any]) -> int:
    """:func:`fuse` the ATen graph ``g`` in place, then build its kernels (:func:`prebuild`);
    the number of matches fused."""
    problems: list = []
    n = fuse(g, **how, problems=problems)
    prebuild(problems)
    return n


# NOTE [Kernels built when the graph compiles]
# A fused GEMM's kernel used to be built on the op's first call, one nvcc after another, each
# 1-4 minutes (docs/performance.md, "Build time"): a model with five new epilogues waited for
# five builds in a row. The backend knows each match's problem from the example inputs, so it
# builds the member each will run (`Gemm.choose` on this device) for every match of the graph at
# once, in parallel (`evtc.compiler.build_many`: one nvcc a core, fewer where memory is short),
# while torch.compile compiles. A call of another shape builds what it needs then, as before. A
# kernel that fails to build here is left to the call, which raises its BuildError: the graph
# is already rewritten. CPU tensors (the tests' float64 interpreter) build nothing.


def prebuild(problems) -> None:
    """Build, in parallel, the kernel each fused GEMM match will run (NOTE [Kernels built when
    the graph compiles]).

    Args:
        problems: ``(gemm, (M, N, K, L), device)`` per match (:func:`fuse`'s ``problems``);
            those not on a CUDA device are skipped.

    Warns:
        UserWarning: a kernel that failed to build, named with its error (the call raises it).
    """
    cuda = [(g, p, d) for g, p, d in problems if getattr(d, "type", None) == "cuda"]
    if not cuda:
        return
    import warnings

    import torch

    from evtc.compiler import cache
    from evtc.dispatch.family import kernel_key

    from evtc.errors import EvtcError

    kernels: dict = {}
    for gemm, (M, N, K, L), device in cuda:
        try:
            spec = gemm.choose(M, N, K, L, device=torch.cuda.get_device_name(device))
            kernels.setdefault((gemm.name, kernel_key(spec)), gemm.dispatch.family.kernel(spec))
        except EvtcError:
            continue  # the call decides (and says why), as without a prebuild
    todo = [k for k in kernels.values() if k.library is None]
    for k, r in zip(todo, cache.build_many([k.job() for k in todo]) if todo else []):
        try:
            if isinstance(r, Exception):
                raise r
            k.load(r)
        except EvtcError as e:
            warnings.warn(f"evtc: the kernel {k.job_name} did not build; its first call raises the error: {e}",
                          stacklevel=2)


def _compile(gm, example_inputs, inductor: bool, config: Mapping[str, Any] | None = None):
    """``gm`` compiled by Inductor with its ``config`` patched in (a mode's: :func:`mode_config`),
    or as it is (``inductor=False``)."""
    if not inductor:
        return gm.forward
    from torch._inductor.compile_fx import compile_fx

    with _patched(config):
        return compile_fx(gm, example_inputs)


def _patched(config: Mapping[str, Any] | None):
    """Inductor's configuration with ``config`` patched in, as a context manager."""
    if not config:
        return contextlib.nullcontext()
    from torch._inductor import config as inductor_config

    return inductor_config.patch(dict(config))


def mode_config(mode: str | None) -> dict[str, Any]:
    """The Inductor configuration of ``torch.compile``'s ``mode`` (``torch._inductor.
    list_mode_options``: ``reduce-overhead`` turns on CUDA graphs, ``max-autotune`` also
    autotunes Inductor's own GEMM templates and pointwise kernels), applied to every Inductor
    compilation of the evtc backend (NOTE [Modes]).

    Raises:
        ArgumentError: a mode Inductor doesn't list.
    """
    if mode is None or mode == "default":
        return {}
    from torch._inductor import list_mode_options

    modes = list_mode_options()
    if not isinstance(mode, str) or mode not in modes:
        from evtc.errors import ArgumentError

        raise ArgumentError(f"torch.compile(backend='evtc', mode={mode!r:.60}): not one of torch.compile's modes",
                            hint=f"use one of {', '.join(map(repr, modes))}, or leave mode out")
    return dict(modes[mode])


def _needs_grad(gm, example_inputs) -> bool:
    import torch

    if not torch.is_grad_enabled():
        return False
    return any(getattr(x, "requires_grad", False) for x in example_inputs) or \
        any(p.requires_grad for p in gm.parameters())


#: the activations whose ``aten.<name>_backward`` ops a backward graph's regions take whole
_BACKWARD_OPS = ("gelu", "silu", "sigmoid", "tanh", "threshold")


def _training(gm, example_inputs, backend, how: Mapping[str, Any], inductor: bool):
    """A graph that needs gradients: AOTAutograd splits it into a forward and a backward graph
    (functional ATen, after Inductor's decompositions) and each is fused before it is compiled.

    NOTE [Fusion in training]: the forward's matches keep what the backward reads as aux stores
    (a region value used outside it becomes an output: the pre-activation F that GELU's
    derivative needs), and the backward's GEMMs take their epilogues like any other: the data
    gradient GEMM that produces dD gets ``acc * act'(F)`` and the bias gradient's column sum
    (``sum(dim=0)``), cuBLASLt's DGELU_BGRAD for whatever activation the forward had. The
    derivative itself is PyTorch's (the decomposed ``*_backward`` ops); evtc's own derivation
    of an epilogue (:mod:`evtc.frontend.vjp`) gives the same expression.

    NOTE [Symbolic shapes in training]: under ``dynamic=True``, or once automatic dynamic shapes
    made the token count symbolic, AOTAutograd hands the inner compiler forward and backward
    graphs whose example inputs have symbolic sizes, where :func:`fuse` matches nothing (it
    reads static shapes). Each such graph is compiled as it is (``generic``, now, while the shape
    environment is current) and wrapped in a :class:`_BoxedSpecializing`, which does what NOTE
    [Symbolic shapes] does for inference, per call: a new signature (shapes, strides, dtypes,
    devices, size inputs) re-traces the ATen graph (:func:`to_aten`, on static fake tensors,
    sizes as constants; a copy taken before Inductor's passes rewrite the graph in place),
    fuses it and compiles it once; nothing fused, or a signature past
    :data:`MAX_SPECIALIZATIONS`, runs ``generic``. So each distinct shape costs one compilation
    of the forward and one of the backward. The two are specialized independently, which is
    sound because fusion never changes a graph's inputs or outputs (a region value the backward
    reads stays an output of the forward: an aux store), so any compilation of the forward pairs
    with any of the backward; the backward's signature holds the saved tensors' strides, so its
    specialization is traced for what the forward produced. (Inductor asserts its inputs'
    strides: a ``generic`` backward after a fused forward relies on the fused forward's saved
    values having the layout the symbolic compilation gave them, row-major as the op stores
    them, as in the blocks tested.) Under Inductor the static graph is compiled by
    ``compile_fx_inner`` with the keyword arguments ``compile_fx_forward``/``compile_fx_backward``
    (torch/_inductor/compile_fx.py) gave the symbolic graph: ``compile_fx`` would run
    AOTAutograd again on what is already its output, and those arguments (``is_backward``,
    ``graph_id``, ``static_input_idxs``, ``cudagraphs``, ...) name the graph's role and its
    inputs by position, not shapes, and the re-trace keeps the placeholders in order; its
    example inputs are the trace's static fake tensors, and the output node's
    ``user_visible_output_idxs`` is copied over (:func:`_as_output_of`).
    """
    import torch

    def fused(g, ex, compile: Callable):
        """``g`` (a forward or backward graph) fused and compiled: static shapes at once, symbolic
        ones per call signature (NOTE [Symbolic shapes in training])."""
        if not _has_symbolic_shapes(g, ex):
            backend.fused += _fuse_and_build(g, how)
            return compile(g, ex)
        # (Inductor's passes rewrite the graph it compiles in place: the specializations trace a copy)
        symbolic = _copy_graph(g)
        return _BoxedSpecializing(symbolic, compile(g, ex), backend, how,
                                  lambda agm, args: compile(_as_output_of(agm, symbolic), _placeholder_values(agm)))

    # NOTE [AOTAutograd's cache and the evtc backend]: AOTAutograd keys its cache of compiled
    # forward and backward graphs (torch/_functorch/_aot_autograd/autograd_cache.py) on the Dynamo
    # graph and configs, not on the inner compiler, so a model compiled by default Inductor first
    # in the same process (or an earlier one) was served default Inductor's unfused graphs: no
    # match fused (the H200 training benchmark, 2026-11-28). evtc's compilations neither read nor
    # write it.
    no_cache = torch._functorch.config.patch(enable_autograd_cache=False)
    if inductor:
        from torch._inductor.compile_fx import compile_fx, compile_fx_inner
        from torch._inductor.decomposition import select_decomp_table

        # the activations' backward ops stay whole, so that a data-gradient GEMM's region can take
        # them (the importer lowers each with evtc's derivative rule); those no region took are
        # decomposed before Inductor lowers the graph (NOTE [Backward ops no region took])
        keep = {getattr(torch.ops.aten, f"{n}_backward").default for n in _BACKWARD_OPS}
        inductors = select_decomp_table()
        table = {k: v for k, v in inductors.items() if k not in keep}

        def inner(g, ex, **kw):
            def compile_inner(g, ex):  # (a specialization's runs when its shape is first called)
                with _patched(backend.inductor_config):
                    _decompose(g, keep, inductors)
                    return compile_fx_inner(g, ex, **kw)

            return fused(g, ex, compile_inner)

        with no_cache, _patched(backend.inductor_config):
            return compile_fx(gm, example_inputs, inner_compile=inner, decompositions=table)
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    def plain(g, ex):
        return fused(g, ex, lambda g, ex: make_boxed_func(g.forward))

    with no_cache:
        return aot_autograd(fw_compiler=plain, bw_compiler=plain)(gm, example_inputs)


def _decompose(g, ops, table: Mapping) -> int:
    """Replace, in place, each call of one of ``ops`` in the graph module ``g`` by the ATen graph
    of its decomposition in ``table`` (Inductor's: what its passes and lowerings expect, ops the
    decomposition calls decomposed too), traced on the call's fake values (symbolic sizes too);
    returns how many were replaced.

    NOTE [Backward ops no region took]: the evtc backend keeps the activations' ``*_backward``
    ops out of Inductor's decomposition table so that a data-gradient GEMM's region can take one
    whole (NOTE [Fusion in training]). Inductor has no lowering of its own for them: it would run
    one that no region took on ATen's eager kernel (a fallback, one more pass through memory),
    and where the environment variable ``CI`` is set its ``make_fallback``
    (torch/_inductor/lowering.py) asserts instead ("a decomposition exists, we should switch to
    it"): a symbolic graph's generic compilation, or an activation after no GEMM, failed to
    compile there. So what no region took is decomposed here, as Inductor would have done.
    """
    import torch
    from torch._dispatch.python import enable_python_dispatcher
    from torch.fx.experimental.proxy_tensor import make_fx

    from evtc.torch.aten import fake_mode_of

    left = [n for n in g.graph.nodes if n.op == "call_function" and n.target in ops
            and all("val" in a.meta for a in n.all_input_nodes)]  # (AOTAutograd's graphs: every node)
    for n in left:
        inputs = list(n.all_input_nodes)
        vals = [a.meta["val"] for a in inputs]

        def call(*xs, n=n, inputs=inputs):
            env = dict(zip(inputs, xs))
            args, kwargs = torch.fx.map_arg((n.args, n.kwargs), lambda a: env[a])
            return n.target(*args, **kwargs)

        with fake_mode_of(vals) or contextlib.nullcontext(), enable_python_dispatcher():
            sub = make_fx(call, decomposition_table=table, tracing_mode="real")(*vals)
        env: dict = {}
        with g.graph.inserting_before(n):
            for s in sub.graph.nodes:
                if s.op == "placeholder":
                    env[s] = inputs[len(env)]
                elif s.op == "output":
                    n.replace_all_uses_with(env[s.args[0]])
                else:
                    if s.op == "get_attr":  # a constant the decomposition made
                        name = f"_evtc_decomposed_{s.target}_{id(s):x}"
                        setattr(g, name, getattr(sub, s.target))
                        s.target = name
                    env[s] = g.graph.node_copy(s, lambda a: env[a])
        g.graph.erase_node(n)
    if left:
        g.recompile()
    return len(left)


def _copy_graph(g):
    """A copy of the graph module ``g`` (nodes and their meta, shallowly) that passes run on
    ``g`` leave alone."""
    import copy

    import torch

    return torch.fx.GraphModule(g, copy.deepcopy(g.graph))


def _as_output_of(agm, g):
    """``agm`` (``g`` specialized: the same outputs) with which of them are the user's, as
    Inductor's ``compile_fx_forward``/``compile_fx_backward`` marked them on ``g``'s output node
    (``user_visible_output_idxs``: those keep eager's strides)."""
    key = "user_visible_output_idxs"
    if key in g.graph.output_node().meta:
        agm.graph.output_node().meta[key] = g.graph.output_node().meta[key]
    return agm


def _placeholder_values(agm) -> list:
    """The example inputs a specialized graph was traced with (fake tensors of static shapes, the
    size inputs' values): what its compilation runs on."""
    return [n.meta.get("val") for n in agm.graph.nodes if n.op == "placeholder"]


#: the :class:`evtc.Gemm` keyword arguments the backend passes on (``torch.compile(...,
#: backend="evtc", options={...})`` or :func:`make_backend`'s ``gemm_options``)
GEMM_OPTIONS = ("batch_invariant", "autotune", "atomic_sums")
#: the backend's own options: ``fuse_all`` fuses every match (no fuse gate)
BACKEND_OPTIONS = ("fuse_all",)


def fuse_gate(backend) -> Callable:
    """The backend's gate for :func:`fuse`: leave a GEMM match to Inductor where the fuse gate
    predicts evtc's kernel slower than torch.compile's own GEMM and fused epilogue on that
    problem (:func:`evtc.dispatch.select.should_fuse`; NOTE [The fuse gate] says what it was
    fitted and validated on). It answers on CUDA devices with a table of their own (the H200
    today); elsewhere every match is fused. Counts what it leaves in ``backend.left_unfused``."""

    def gate(gemm, M: int, N: int, K: int, L: int, device) -> bool:
        if getattr(device, "type", None) != "cuda":
            return True
        import torch

        from evtc.dispatch import select

        name = torch.cuda.get_device_name(device)
        ok = select.should_fuse(M, N, K, L, select.epilogue_class(gemm.graph), gemm.choose(M, N, K, L, device=name),
                                name)
        if not ok:
            backend.left_unfused += 1
        return ok

    return gate


def _gemm_options(options: Mapping[str, Any] | None) -> dict[str, Any]:
    from evtc.errors import ArgumentError

    if options is not None and not isinstance(options, Mapping):
        raise ArgumentError(f"torch.compile(backend='evtc', options={options!r:.60}): a dict of option -> bool",
                            hint=f"e.g. options={{'batch_invariant': True}}; the evtc backend takes "
                                 f"{', '.join(GEMM_OPTIONS + BACKEND_OPTIONS)}")
    options = dict(options or {})
    unknown = sorted(map(repr, set(options) - set(GEMM_OPTIONS) - set(BACKEND_OPTIONS)))
    if unknown:
        raise ArgumentError(f"torch.compile(backend='evtc', options=...): unknown option(s) {', '.join(unknown)}",
                            hint=f"the evtc backend takes {', '.join(GEMM_OPTIONS + BACKEND_OPTIONS)}")
    for k, v in options.items():
        if not isinstance(v, bool):
            raise ArgumentError(f"torch.compile(backend='evtc', options={{'{k}': {v!r}}}): a bool is expected")
    return options


def make_backend(*, allow_cpu: bool = False, on_gemm: Callable | None = None, inductor: bool = True,
                 gemm_options: Mapping[str, Any] | None = None, fuse_all: bool = False, gate: Callable | None = None,
                 inductor_config: Mapping[str, Any] | None = None):
    """A Dynamo backend: :func:`to_aten` and :func:`fuse`, then Inductor (or the graph as it is,
    ``inductor=False``); a graph that needs gradients goes through AOTAutograd with its forward
    and backward graphs fused (NOTE [Fusion in training]). ``backend.fused`` counts the matches of
    every graph it compiled; a graph without matches goes to Inductor unchanged.

    Args:
        allow_cpu, on_gemm: :func:`fuse`'s.
        inductor: compile with Inductor (else run the fused graph as it is).
        gemm_options: keyword arguments of every Gemm made (:data:`GEMM_OPTIONS`:
            ``batch_invariant``, ``autotune``).
        fuse_all: fuse every match; by default :func:`fuse_gate` leaves the matches it predicts
            slower fused than unfused to Inductor (``backend.left_unfused`` counts them), and
            matches with nothing to fuse stay torch's (NOTE [A bare GEMM stays torch's] in
            evtc/torch/regions.py). With ``batch_invariant`` (the option or
            ``EVTC_BATCH_INVARIANT``) every match is fused, as with ``fuse_all``: a match left
            to cuBLAS would run a kernel that M chooses.
        gate: a gate of :func:`fuse`'s form instead of :func:`fuse_gate` (tests).
        inductor_config: Inductor configuration patched in around each of its compilations
            (a ``torch.compile`` mode's: :func:`mode_config`; NOTE [Modes]).

    Raises:
        ArgumentError: an option not in :data:`GEMM_OPTIONS`, or not a bool; ``allow_cpu``,
            ``inductor`` or ``fuse_all`` not a bool; ``on_gemm`` or ``gate`` not callable;
            ``atomic_sums`` with batch invariance (the option or ``EVTC_BATCH_INVARIANT``);
            ``inductor_config`` not a dict of Inductor configuration.
    """
    from evtc.errors import ArgumentError

    how = {"allow_cpu": allow_cpu, "on_gemm": on_gemm, "gemm_options": _gemm_options(gemm_options)}
    if set(how["gemm_options"]) & set(BACKEND_OPTIONS):
        raise ArgumentError("make_backend(gemm_options=...): fuse_all is make_backend's own argument")
    # (fuse_all="no" would fuse every match, allow_cpu="no" fuse matches on CPU tensors that no
    # kernel runs, inductor="no" compile with Inductor)
    for flag, value in (("fuse_all", fuse_all), ("allow_cpu", allow_cpu), ("inductor", inductor)):
        if not isinstance(value, bool):
            raise ArgumentError(f"make_backend({flag}={value!r:.60}): True or False")
    for name, value in (("on_gemm", on_gemm), ("gate", gate)):
        if value is not None and not callable(value):  # (called on the first match, inside torch.compile)
            raise ArgumentError(f"make_backend({name}={value!r:.60}): a function or None",
                                hint="on_gemm(gemm) is called with each Gemm made; gate(gemm, M, N, K, L, device) "
                                     "says whether a match is fused")

    if inductor_config is not None:
        if not isinstance(inductor_config, Mapping):
            raise ArgumentError(f"make_backend(inductor_config={inductor_config!r:.60}): a dict of Inductor "
                                "configuration or None", hint="e.g. evtc.torch.backend.mode_config('max-autotune')")
        from torch._inductor import config as inductor_config_module

        unknown = sorted(map(repr, set(inductor_config) - set(inductor_config_module.get_config_copy())))
        if unknown:  # (Inductor's patch would raise inside torch.compile, at the first compilation)
            raise ArgumentError(f"make_backend(inductor_config=...): {', '.join(unknown[:5])} not Inductor "
                                "configuration", hint="name torch._inductor.config's entries, e.g. "
                                                      "'max_autotune' or 'triton.cudagraphs'")

    def backend(gm, example_inputs):
        if _needs_grad(gm, example_inputs):
            return _training(gm, example_inputs, backend, how, inductor)
        config = backend.inductor_config
        concrete = _hints(example_inputs)
        agm, n = _fused(gm, concrete, how)
        backend.fused += n
        if not n:
            return _compile(gm, example_inputs, inductor, config)
        # NOTE [Symbolic shapes]; a float read with .item() was traced as its value: NOTE
        # [Unspecialized floats] in evtc/torch/aten.py
        if _has_symbolic_shapes(gm, example_inputs) or item_inputs(gm):
            left = backend.left_unfused
            whole = _fused_symbolic(gm, agm, how)
            backend.left_unfused = left  # (its gate's answers repeat the example's, counted above)
            if whole is not None:  # NOTE [One fused graph for every shape]
                return _compile(whole, example_inputs, inductor, config)
            return _Specializing(gm, _compile(gm, example_inputs, inductor, config), backend, how,
                                 lambda g, args: _compile(g, args, inductor, config), concrete, agm)
        return _compile(agm, example_inputs, inductor, config)

    backend.fused = 0
    backend.left_unfused = 0
    backend.inductor_config = dict(inductor_config or {})
    invariant = how["gemm_options"].get("batch_invariant")
    if invariant is None:
        from evtc import knobs

        invariant = knobs.batch_invariant.get()
    if invariant and how["gemm_options"].get("atomic_sums"):
        # (every Gemm made would refuse the pair, and every match would stay unfused, silently)
        where = "" if how["gemm_options"].get("batch_invariant") else " (EVTC_BATCH_INVARIANT)"
        raise ArgumentError(f"the evtc backend's options atomic_sums=True and batch_invariant=True{where}: float "
                            "atomics add the sums in the order the tiles finish", hint="choose one of the two")
    if not fuse_all and not invariant:  # (a match left to cuBLAS would break batch invariance)
        how["gate"] = gate or fuse_gate(backend)
    return backend


def evtc_backend(gm, example_inputs, *, options: Mapping[str, Any] | None = None, mode: str | None = None):
    """``torch.compile(model, backend="evtc")``: fuse GEMMs with their epilogues (:func:`fuse`),
    hand the rest to Inductor. ``options={"batch_invariant": True}`` (or ``"autotune"``) is passed
    to every :class:`evtc.Gemm` the backend makes; ``options={"fuse_all": True}`` fuses every
    match, where by default the fuse gate leaves to Inductor the matches it predicts slower fused
    (:func:`fuse_gate`). ``mode`` is torch.compile's, applied to Inductor's part of the graph.

    NOTE [Modes]: ``torch.compile(model, backend="evtc", mode=...)`` takes torch.compile's modes
    (``torch._inductor.list_mode_options``): each is Inductor configuration, patched in around
    every Inductor compilation the backend makes (the graph after fusion; under training the
    forward and backward, and each shape's specialization when its first call compiles it).
    ``reduce-overhead`` runs the compiled graph, evtc's ops inside it, as CUDA graphs (the ops
    launch on the current stream and allocate through torch: tests/gpu/test_torch_gpu.py replays
    one in a CUDA graph); ``max-autotune`` also autotunes Inductor's own GEMM templates, which
    then run the GEMMs evtc leaves to Inductor (bare ones, and those the fuse gate leaves, whose
    ground truth is default Inductor's time: under max-autotune the gate is no longer fitted to
    what the unfused side runs). evtc's own kernel choice is its selection model's either way;
    ``options={"autotune": True}`` times its candidates.

    Raises:
        ArgumentError: a mode torch.compile doesn't have, or an unknown option.
    """
    config = mode_config(mode)
    if not options and not config:
        return _DEFAULT(gm, example_inputs)
    key = (tuple(sorted(_gemm_options(options).items())), mode)
    backend = _BY_OPTIONS.get(key)
    if backend is None:
        opts = dict(key[0])
        fuse_all = bool(opts.pop("fuse_all", False))
        backend = _BY_OPTIONS[key] = make_backend(gemm_options=opts, fuse_all=fuse_all, inductor_config=config)
    return backend(gm, example_inputs)


_BY_OPTIONS: dict[tuple, Callable] = {}
_DEFAULT = make_backend()


def _register() -> None:
    try:
        from torch._dynamo import register_backend
        from torch._dynamo.backends.registry import _BACKENDS
    except ImportError:  # an old torch
        return
    if "evtc" not in _BACKENDS:
        register_backend(evtc_backend, name="evtc")


_register()
