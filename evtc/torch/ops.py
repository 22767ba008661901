"""PyTorch custom ops for Gemms: calls that ``torch.compile(fullgraph=True)``, ``torch.export`` and
CUDA graphs can hold.

Input: an :class:`evtc.Gemm`. Output: a callable with the Gemm's call signature (``A``, ``B``
and the epilogue's parameters by name) that runs through a ``torch.library`` custom op
``evtc::<epilogue>_<hash>``, one per distinct Gemm (the hash covers the IR, the dtypes, the
arch and the family), with a fake implementation that gives every output's shape and dtype
without running anything. Dynamo puts the op in the graph instead of breaking it on evtc's
ctypes call; Inductor and ``torch.export`` see an opaque, functional op (its outputs are new
tensors, it mutates nothing). torch is imported only here: ``import evtc`` never imports it.

Inside a ``torch.compile``-d function a Gemm call without ``out=`` or ``stream=`` goes through
this op by itself (:meth:`evtc.Gemm.__call__`); outside, :meth:`evtc.Gemm.torch_op` gives it.

The op's schema: ``(Tensor A, Tensor B, Tensor <each tensor parameter>..., float <each scalar
parameter>...) -> Tensor`` (one output) or a tuple of Tensors in the epilogue's output order.
Scalars are Python numbers here (a device scalar is a tensor parameter). Outputs: stores (M, N)
or (L, M, N) of the output dtype, laid out as evtc allocates them: rows padded to 16 bytes (a
strided view: row stride N rounded up to 16 bytes, batch stride M times that), or contiguous
after contiguous M x N inputs whose rows are not 16-byte multiples (NOTE [The row layout of the
outputs evtc allocates] in evtc/gemm.py); the fake implementation gives the same strides, so
Inductor plans with the real layout; row reductions (M,) / (L, M); column reductions (N,) / (L, N);
scalar reductions () / (L,) (as :meth:`evtc.Gemm.__call__` returns them).

Raises (when the op is made): :class:`evtc.errors.ArgumentError` for a Gemm whose parameter
names the op schema can't hold.
"""

from __future__ import annotations

import hashlib
import json
import keyword
import re
import threading

from evtc.errors import ArgumentError

__all__ = ["TorchOp", "call_args", "check_fake_operands", "qualname", "run_op", "torch_op"]

_LOCK = threading.Lock()
_OPS: dict[str, TorchOp] = {}
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: the version of what the op promises beyond its schema (its outputs' strides), part of its name:
#: Inductor's on-disk caches keep compiled graphs by op name, with the fake implementation's
#: strides baked in, so a changed promise must change the name (2: NOTE [The row layout of the
#: outputs evtc allocates], evtc/gemm.py)
CONTRACT = 2
#: words of the op schema language a parameter can't be named: its types, and Python's keywords
#: (its parser reads 'def', 'import', 'is', ... as such), which the text forms let through as names
_RESERVED = {"Tensor", "float", "int", "bool", "str", "Scalar", "NoneType", "out", "self", *keyword.kwlist}


class TorchOp:
    """A Gemm behind a ``torch.library`` custom op (see the module docstring).

    Attributes:
        qualname: ``"evtc::<name>_<hash>"``.
        schema: the op's schema string.
        op: the ``torch.library`` op (``torch.ops.evtc.<name>_<hash>``).
        tensor_names, scalar_names, output_names: the Gemm's parameters in schema order, its
            outputs in return order.
    """

    def __init__(self, gemm) -> None:
        import torch

        from evtc.ir.nodes import GroupScale, Reduction, Store

        binder = gemm.dispatch.prober
        graph = gemm.graph
        self.gemm = gemm
        self.tensor_names = tuple(binder.tensor_names)
        self.scalar_names = tuple(binder.scalar_names)
        self.unused_names = tuple(binder.unused_names)
        self.output_names = tuple(o.name for o in graph.outputs)
        for n in self.tensor_names + self.scalar_names:
            if not _NAME.match(n) or n in _RESERVED or n in ("A", "B"):
                raise ArgumentError(f"parameter {n!r} can't be named in a torch op schema", epilogue=graph.name,
                                    hint="rename the parameter")
        self.qualname = qualname(gemm)
        args = ["Tensor A", "Tensor B"] + [f"Tensor {n}" for n in self.tensor_names] + \
               [f"float {n}" for n in self.scalar_names]
        outs = "Tensor" if len(self.output_names) == 1 else "(" + ", ".join(["Tensor"] * len(self.output_names)) + ")"
        self.schema = "(" + ", ".join(args) + ") -> " + outs
        specs = []
        for o in graph.outputs:
            dtype = getattr(torch, o.dtype.torch)
            if isinstance(o, Store):
                specs.append(("store", o, dtype))
            elif isinstance(o, GroupScale):
                specs.append(("group_scale", o, dtype))
            elif isinstance(o, Reduction):
                specs.append(("reduction", o.axis, dtype))
        self._specs = specs
        names = self.tensor_names + self.scalar_names
        single = len(self.output_names) == 1
        out_names = self.output_names

        def run(A, B, *rest):
            A, B = k_contiguous(A), k_contiguous(B)
            got = gemm.dispatch.run(A, B, dict(zip(names, rest)))
            if single:
                return got if not isinstance(got, dict) else got[out_names[0]]
            return tuple(got[n] for n in out_names)

        def fake(A, B, *rest):
            return self._fake_outputs(A, B, dict(zip(names, rest)))

        self.op = torch.library.custom_op(self.qualname, run, mutates_args=(), device_types="cuda",
                                          schema=self.schema, tags=layout_tags(torch))
        self.op.register_fake(fake)

    @property
    def overload(self):
        """The op's ``OpOverload`` (``torch.ops.evtc.<name>_<hash>.default``): the target FX
        graphs call."""
        import torch

        ns, name = self.qualname.split("::")
        return getattr(getattr(torch.ops, ns), name).default

    def _fake_outputs(self, A, B, kwargs):
        from evtc.runtime.bind import batch_count, follows_packed_inputs
        from evtc.dispatch.staging import padded_strides
        from evtc.runtime.tensors import contiguous_strides

        check_fake_operands(self.gemm.name, A, B)
        batched = A.dim() == 3 or B.dim() == 3
        L = batch_count(A.shape, B.shape)
        M, N = A.shape[-2], B.shape[-2]
        mn = [(tuple(kwargs[n].shape), tuple(kwargs[n].stride()), eb) for n, eb in self.gemm.dispatch.mn_loads]
        # NOTE [The row layout of the outputs evtc allocates] (evtc/gemm.py): packed rows after
        # packed inputs whose rows TMA can't address, else rows padded to 16 bytes
        packed = follows_packed_inputs(N, mn)  # False without M x N inputs
        outs = []
        for kind, axis, dtype in self._specs:
            # (a store's N / 2 columns for evtc.glu's: Store.columns)
            shape = (M, axis.columns(N)) if kind == "store" else (M, axis.groups(N)) if kind == "group_scale" else \
                tuple(axis.shape(M, N))
            if batched:
                shape = (L,) + tuple(shape)
            if kind == "store":
                # the strides the real call returns: evtc allocates M x N outputs with rows padded
                # to 16 bytes (N = 50257 bf16: row stride 50264), a strided (.., M, N) view
                strides = contiguous_strides(shape) if packed else padded_strides(shape, dtype.itemsize)
                outs.append(A.new_empty_strided(shape, strides, dtype=dtype))
            else:
                outs.append(A.new_empty(shape, dtype=dtype))
        return outs[0] if len(outs) == 1 else tuple(outs)

    def __call__(self, A, B, **kwargs):
        """Run the Gemm through the op: the same arguments and results as
        :meth:`evtc.Gemm.__call__` without ``out=`` and ``stream=`` (the op allocates its
        outputs on the current stream)."""
        missing = [n for n in self.tensor_names + self.scalar_names if n not in kwargs]
        extra = [n for n in kwargs if n not in self.tensor_names + self.scalar_names + self.unused_names]
        if missing or extra:
            raise ArgumentError(f"{'missing ' + ', '.join(missing) if missing else ''}"
                                f"{'; ' if missing and extra else ''}"
                                f"{'unknown ' + ', '.join(extra) if extra else ''}",
                                epilogue=self.gemm.name,
                                hint="pass the epilogue's parameters by name: "
                                     + ", ".join(self.tensor_names + self.scalar_names))
        operands = {"A": A, "B": B}
        args = call_args(self.gemm.name, operands, kwargs, self.tensor_names, self.scalar_names)
        got = run_op(self.op, self.gemm.name, operands, args, self.tensor_names + self.scalar_names)
        if len(self.output_names) == 1:
            return got if self.output_names[0] == "D" else {self.output_names[0]: got}
        return dict(zip(self.output_names, got))


def check_fake_operands(epilogue: str, A, B) -> None:
    """What the fake implementation reads of A and B: the extents the real call checks first
    (evtc/runtime/bind.py ``_gemm_extents``), so that a graph traced with operands the call would
    refuse fails at its trace with the call's error, not with an IndexError or a wrong shape.

    Raises:
        ArgumentError: A or B not 2-D or 3-D, their K or batch extents differ.
    """
    if A.dim() not in (2, 3) or B.dim() not in (2, 3):
        raise ArgumentError(f"A and B must be 2-D or 3-D, got A {tuple(A.shape)} and B {tuple(B.shape)}",
                            epilogue=epilogue)
    if A.shape[-1] != B.shape[-1]:
        raise ArgumentError(f"A is {tuple(A.shape)} and B is {tuple(B.shape)}: their K extents differ",
                            epilogue=epilogue, hint="B is given as N x K (the GEMM computes A @ B.T)")
    La = A.shape[0] if A.dim() == 3 else 1
    Lb = B.shape[0] if B.dim() == 3 else 1
    if La != Lb and 1 not in (La, Lb):
        raise ArgumentError(f"A has batch {La} and B has batch {Lb}", epilogue=epilogue)


def call_args(epilogue: str, operands: dict, kwargs: dict, tensor_names: tuple, scalar_names: tuple) -> list:
    """The op's arguments after its operands: the tensor parameters, then the scalars as floats,
    each checked, so that a bad one is an ArgumentError naming it rather than torch's schema
    error or ``float()``'s (``alpha="x"``, ``alpha=None``, ``bias=1.0``).

    Raises:
        ArgumentError: an operand or tensor parameter that is no torch tensor, a scalar that is
            no real number (a Python number, a 0-d tensor or a symbolic float under torch.compile).
    """
    import torch

    for n, v in [*operands.items(), *((n, kwargs[n]) for n in tensor_names)]:
        if not isinstance(v, torch.Tensor):
            raise ArgumentError(f"argument '{n}' is a {type(v).__name__}, not a torch tensor", epilogue=epilogue,
                                hint="the op's tensor arguments are torch tensors")
    scalars = []
    for n in scalar_names:
        v = kwargs[n]
        if isinstance(v, (str, bytes, bool, complex)) or not hasattr(v, "__float__") or (
                isinstance(v, torch.Tensor) and (v.numel() != 1 or v.is_complex())):
            raise ArgumentError(f"argument '{n}' = {v!r:.40} is not a number (it is a by-value scalar of the op)",
                                epilogue=epilogue, hint="pass a Python float")
        scalars.append(float(v))
    return [kwargs[n] for n in tensor_names] + scalars


def run_op(op, epilogue: str, operands: dict, args: list, names: tuple):
    """``op(*operands.values(), *args)`` (``args`` named by ``names``, as :func:`call_args`
    returns them). The op has a kernel for CUDA tensors only (tests and ``allow_cpu`` register a
    CPU one); torch's ``NotImplementedError`` ("Could not run 'evtc::...' with arguments from the
    'CPU' backend") for tensors on another device is the call's own error, naming the argument.

    Raises:
        ArgumentError: a tensor argument on a device the op has no kernel for.
    """
    import torch

    try:
        return op(*operands.values(), *args)
    except NotImplementedError:
        for n, v in [*operands.items(), *zip(names, args)]:
            if isinstance(v, torch.Tensor) and v.device.type != "cuda":
                raise ArgumentError(f"argument '{n}' is on {v.device}: evtc's op runs its kernel on CUDA tensors",
                                    epilogue=epilogue, hint="move the tensors to the GPU (.cuda())") from None
        raise


def layout_tags(torch) -> tuple:
    """The op's tags: Inductor passes its tensor arguments with the strides they have in the
    graph it was given (``needs_exact_strides``, else ``needs_fixed_stride_order`` on older
    torch), not a layout of its choosing.

    NOTE [Operand layouts under Inductor]: the backend gives the op K-contiguous operands
    (:func:`evtc.torch.regions._b_operand`: a transposed weight's source, or a contiguous copy);
    measured on the H200 (2026-11-28, bench_train.py on GPT-2's block under AOTAutograd), a
    Conv1D weight (in, out) still arrived as its (N, K) transpose with stride 6400 along K, and
    the Gemm refused it. The tag keeps the copy; :func:`k_contiguous` is the guard behind it."""
    tag = getattr(torch.Tag, "needs_exact_strides", None) or getattr(torch.Tag, "needs_fixed_stride_order", None)
    return (tag,) if tag is not None else ()


def k_contiguous(t):
    """``t`` itself when its last axis (K) is contiguous, else a contiguous copy (NOTE
    [Operand layouts under Inductor])."""
    if t.dim() and t.shape[-1] > 1 and t.stride(-1) != 1:
        return t.contiguous()
    return t


def qualname(gemm) -> str:
    """``"evtc::<epilogue>_<12 hex digits>"``: the hash of :data:`CONTRACT`, the Gemm's IR, dtypes,
    arch and family."""
    from evtc.ir.printer import print_graph

    key = json.dumps({"contract": CONTRACT, "ir": print_graph(gemm.graph), "a": gemm.a.name, "b": gemm.b.name,
                      "arch": gemm.arch, "family": {n: repr(s.config) for n, s in gemm.family.items()}},
                     sort_keys=True)
    return f"evtc::{gemm.graph.name}_{hashlib.sha256(key.encode()).hexdigest()[:12]}"


def torch_op(gemm) -> TorchOp:
    """The :class:`TorchOp` of ``gemm`` (made once per distinct Gemm and kept: torch.library ops
    can't be unregistered).

    Raises:
        ArgumentError: a parameter name the schema can't hold.
        ImportError: torch is not installed.
    """
    op = getattr(gemm, "_torch_op", None)
    if op is not None:
        return op
    with _LOCK:
        qual = qualname(gemm)
        op = _OPS.get(qual)
        if op is None:
            op = _OPS[qual] = TorchOp(gemm)
    gemm._torch_op = op
    return op


def attach(gemm) -> None:
    """Make ``gemm``'s op as it is constructed (torch imported).

    NOTE [The torch op is made outside torch.compile]: Dynamo can't trace the making of a
    torch.library op (a lock, the registration), so a call it traces must find the op made
    already: made when the Gemm is constructed with torch imported (about 1.5 ms), else by
    ``gemm.torch_op()``. A parameter name the schema can't hold is kept and said when compiled.
    """
    try:
        torch_op(gemm)
    except ArgumentError as e:
        gemm._torch_op_error = e


def no_op_message(gemm) -> str:
    """Why a call that torch.compile traces has no torch op (NOTE [The torch op is made outside
    torch.compile])."""
    if gemm._torch_op_error is not None:
        return str(gemm._torch_op_error)
    return (f"evtc: the Gemm '{gemm.name}' was made before torch was imported, so it has no torch op "
            "and torch.compile can't make one while it traces; call gemm.torch_op() once before "
            "compiling (or construct the Gemm after `import torch`)")
