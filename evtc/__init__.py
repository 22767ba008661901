"""evtc: an epilogue-fusion compiler for GPU GEMMs.

Write ``D = act(alpha*acc + beta*C + bias)`` (and extra outputs, reductions, aux inputs, fp8
scaling) as a Python function; evtc traces it, simplifies it, plans the Hopper epilogue's shared
memory, emits a CUTLASS Epilogue Visitor Tree GEMM, builds it with nvcc and runs it::

    import evtc
    from evtc import bf16, f32

    @evtc.epilogue
    def bias_relu(acc, C, alpha: float, beta: float, bias: evtc.RowVector[f32]):
        return evtc.relu(alpha * acc + beta * C + bias)

    gemm = evtc.Gemm(bias_relu, a=bf16, b=bf16, c=bf16, d=bf16, arch="sm90")
    D = gemm(A, B, C=C, alpha=0.5, beta=1.5, bias=bias)

One folder per stage. The build path, ``frontend`` (trace, text) -> ``ir`` (the Graph) ->
``passes`` -> ``lower`` (the visitor tree) -> ``plan`` -> ``emit`` (the ``.cu``) -> ``compiler``
(nvcc, the verified kernel cache), driven by ``pipeline`` (one loop, one memo); the call path,
``dispatch`` (a call's problem -> the kernel that runs it; the family, selection model, tuner,
staging) -> ``runtime`` (tensor views, binding, launch). On top: ``Gemm`` and ``Conv`` (facades),
``torch/`` (custom ops, the ``torch.compile`` backend, the call fast path), ``cli/`` (the ``evtc``
command), ``testing/`` (the float64 oracle, timing), ``plugin/`` (epilogue fragments for other
generators). tests/null/test_layers.py keeps the floors apart. See docs/OVERVIEW.md.
"""

from evtc.dtypes import DType, bf16, e4m3, e5m2, f16, f32
from evtc.errors import (
    ArgumentError,
    BuildError,
    ConfigError,
    EpilogueSignatureError,
    EpilogueTypeError,
    EvtcError,
    GrammarError,
    IRVerificationError,
    LaunchError,
    MisalignedError,
    LegalizeError,
    NoDeviceError,
    PlanError,
    TraceError,
    UnknownDTypeError,
    UnsupportedOpError,
)
from evtc.frontend.epilogue import Epilogue, epilogue
from evtc.frontend.functions import (
    abs,
    amax,
    clamp,
    eq,
    erf,
    exp,
    ge,
    gelu,
    gelu_grad,
    gelu_tanh,
    glu,
    gt,
    hardswish,
    le,
    leaky_relu,
    log,
    lt,
    max,
    maximum,
    min,
    minimum,
    multiply_add,
    ne,
    pow,
    quantize,
    relu,
    rsqrt,
    sigmoid,
    silu,
    sqrt,
    sum,
    tanh,
    to,
    where,
)
from evtc.frontend.trace import ColVector, DeviceScalar, Matrix, RowVector, Scalar
from evtc.frontend.trace import SourceMatrix as Source
from evtc.ir.graph import Graph
from evtc._version import __version__


def __getattr__(name: str):
    # The heavier stages load on first use, so `import evtc` stays cheap for tracing.
    if name == "Gemm":
        from evtc.gemm import Gemm

        return Gemm
    if name == "GroupedGemm":
        from evtc.grouped import GroupedGemm

        return GroupedGemm
    if name in ("Conv", "ConvProblem"):
        import evtc.conv

        return getattr(evtc.conv, name)
    if name in ("GemmConfig",):
        from evtc.plan.config import GemmConfig

        return GemmConfig
    if name == "interleave_gate_up":
        from evtc.gated import interleave_gate_up

        return interleave_gate_up
    if name == "from_expr":
        from evtc.frontend.text import from_expr

        return from_expr
    if name == "parse_ir":
        from evtc.frontend.text import parse_ir

        return parse_ir
    if name.startswith("_"):
        raise AttributeError(f"module 'evtc' has no attribute '{name}'")
    from evtc.frontend.functions import unknown_function  # located, with close matches (an AttributeError too)

    raise unknown_function(name)
