"""A Dynamo graph traced to functional ATen, the form the backend's regions match
(:mod:`evtc.torch.regions`).

Input: Dynamo's FX graph and its example inputs. Output: the ATen graph with ``meta["val"]`` on
every node (:func:`to_aten`), or None for a graph it does not take.
"""

from __future__ import annotations

__all__ = ["fake_mode_of", "item_inputs", "symbolic", "to_aten", "to_aten_symbolic"]


def symbolic(t) -> bool:
    """Whether a tensor's sizes or strides are symbolic (a fake tensor of a dynamic graph)."""
    import torch

    return any(isinstance(v, torch.SymInt) for v in (*t.shape, *t.stride()))


def item_inputs(gm) -> tuple[int, ...]:
    """The positions of ``gm``'s inputs that the graph reads with ``.item()``: the Python floats
    Dynamo left unspecialized, each a 0-d float64 tensor (NOTE [Unspecialized floats])."""
    import torch

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    return tuple(i for i, p in enumerate(placeholders)
                 if any(u.op in ("call_method", "call_function") and u.target in ("item", torch.Tensor.item)
                        and u.args[0] is p for u in p.users))


def _item_values(gm, example_inputs) -> dict:
    """placeholder node -> the float each ``.item()`` of it reads (from the real example input)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensor

    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    values = {}
    for i in item_inputs(gm):
        x = example_inputs[i] if i < len(example_inputs) else None
        if isinstance(x, torch.Tensor) and not isinstance(x, FakeTensor) and x.numel() == 1:
            values[placeholders[i]] = x.item()
    return values


def to_aten(gm, example_inputs):
    """``gm`` (a Dynamo FX graph) traced to a functional ATen graph with ``meta["val"]`` on every
    node and the user's stack traces; None for graphs it does not take (symbolic shapes,
    non-tensor inputs).

    NOTE [Unspecialized floats]: under ``dynamic=True``, and after a Python float changed between
    calls (automatic dynamic), Dynamo passes each float the graph reads (a LayerNorm's ``eps``, a
    LoRA ``scaling``, a ``ZeroPad2d`` value) as a 0-d float64 input read by ``.item()``. On fake
    tensors without a shape environment ``.item()`` has no value, so the trace failed and the
    whole graph went unfused. Each ``.item()`` of such an input is traced as the example's value,
    a constant (as the size inputs are, NOTE [Symbolic shapes] in :mod:`evtc.torch.backend`), and
    the backend compiles the graph once per distinct value of them (:func:`item_inputs` are part
    of its specialization's signature)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    if not all(isinstance(x, (torch.Tensor, int)) and not isinstance(x, bool) for x in example_inputs):
        return None
    if any(isinstance(x, torch.Tensor) and symbolic(x) for x in example_inputs):
        return None
    items = _item_values(gm, example_inputs)

    class _Run(torch.fx.Interpreter):
        def run_node(self, n):
            if n.op in ("call_method", "call_function") and n.target in ("item", torch.Tensor.item) \
                    and n.args[0] in items:
                return items[n.args[0]]  # (NOTE [Unspecialized floats])
            return super().run_node(n)

    run = _Run(gm).run
    # NOTE [Scalars read inside the graph]: with capture_scalar_outputs (or
    # capture_dynamic_output_shape_ops) Dynamo keeps a computed tensor's .item() (nonzero, a
    # boolean mask's indexing) in the graph; on fake tensors without a shape environment it has
    # no value, the trace failed and no GEMM of the graph fused. A shape environment gives it an
    # unbacked symbol (torch/fx/experimental/symbolic_shapes.py); the inputs stay static, and a
    # GEMM or region value whose shape holds such a symbol is not matched (evtc/torch/regions.py).
    mode = FakeTensorMode(shape_env=ShapeEnv())
    # ints are the values of a symbolic graph's size inputs: traced as constants (a
    # specialization to this call's shapes: _Specializing)
    return _trace(run, mode, lambda: [mode.from_tensor(x, static_shapes=True) if isinstance(x, torch.Tensor) else x
                                      for x in example_inputs])


def fake_mode_of(vals):
    """The fake mode the fake tensors among ``vals`` were made in (None without one): the mode to
    trace them in. Not ``detect_fake_mode``'s answer, which is the tracing context's first: Dynamo
    gives a backend a fresh mode that shares the shape environment but not its graph's fake
    values (``meta["example_value"]``), and tracing those in it fails ("Mixing fake modes")."""
    from torch._subclasses.fake_tensor import FakeTensor

    return next((v.fake_mode for v in vals if isinstance(v, FakeTensor)), None)


def _trace(run, mode, inputs):
    """``run`` traced by ``make_fx`` (functionalized) in the fake ``mode`` on ``inputs()``, dead
    code removed; None where the trace fails (a graph make_fx can't trace is compiled as Dynamo
    gave it), with functorch's layer stack as it was (NOTE [A failed trace restores functorch's
    stack])."""
    import torch
    import torch.fx.traceback as fx_traceback
    from torch.fx.experimental.proxy_tensor import make_fx

    # NOTE [A failed trace restores functorch's stack]: a torch.func.vmap graph's trace fails
    # (functionalize's layer under vmap's: an internal assert) after its _vmap_increment_nesting,
    # which stayed pushed: Dynamo's guard on functorch's state then failed on its own frame
    # ("Guard failed on the same frame it was created") and torch.compile raised. The depth is
    # restored as Dynamo restores it around a frame (torch/_dynamo/eval_frame.py); the graph
    # runs unfused (a vmapped bias is a per-batch row vector, which bmm regions don't take).
    depth = torch._C._functorch.get_dynamic_layer_stack_depth()
    try:
        args = inputs()
        with fx_traceback.preserve_node_meta(), mode:
            agm = make_fx(torch.func.functionalize(run), tracing_mode="real")(*args)
    except Exception:  # noqa: BLE001
        return None
    finally:
        torch._C._functorch.pop_dynamic_layer_stack_and_undo_to_depth(depth)
    agm.graph.eliminate_dead_code()
    agm.recompile()
    return agm


def to_aten_symbolic(gm):
    """``gm`` (a Dynamo FX graph with symbolic shapes) traced to a functional ATen graph that stays
    symbolic: on the placeholders' own fake values (``meta["example_value"]``, Dynamo's symbolic
    sizes) in Dynamo's fake mode, as AOTAutograd traces it. None where it does not take the graph
    (a placeholder without a fake value, a float read with ``.item()``: NOTE [Unspecialized
    floats], or a trace that fails). For NOTE [One fused graph for every shape] in
    :mod:`evtc.torch.backend`: its regions match only GEMMs and values of static shapes."""
    import torch

    if item_inputs(gm):
        return None
    vals = [n.meta.get("example_value") for n in gm.graph.nodes if n.op == "placeholder"]
    if any(v is None or isinstance(v, bool) or not isinstance(v, (torch.Tensor, int, torch.SymInt)) for v in vals):
        return None
    mode = fake_mode_of(vals)
    if mode is None:
        return None
    return _trace(torch.fx.Interpreter(gm).run, mode, lambda: vals)  # (None: fused per shape, as before)
