"""Epilogues written with torch ops (evtc/frontend/torch_import.py): the reference epilogues of
examples/epilogues.py written with torch give the same IR text as written with evtc.*; scalars
stay runtime parameters; fp8 and other casts; reductions over each axis; what evtc can't lower is
an error at the user's line; the imported graph computes what the function computes eagerly (the
float64 interpreter against the function run in float64 torch)."""

import inspect
import subprocess
import sys

import numpy as np
import pytest

import evtc
from evtc import f32

torch = pytest.importorskip("torch")
F = torch.nn.functional

import epilogues as E

from evtc.frontend.torch_import import import_torch
from evtc.ir.interpret import interpret
from evtc.ir.printer import print_graph


# ---- the reference epilogues, written with torch -------------------------------------------------


def linear_combination(acc, C, alpha: float, beta: float):
    return alpha * acc + beta * C


def bias_relu(acc, C, alpha: float, beta: float, bias: evtc.RowVector[f32]):
    return torch.relu(alpha * acc + beta * C + bias)


def gelu_aux(acc, bias: evtc.RowVector[f32]):
    F_ = acc + bias
    return {"D": F.gelu(F_), "F": F_}


def dgelu_bgrad(acc, F: evtc.Matrix):  # gelu'(x) has no torch function: evtc.gelu_grad on the tensor
    D = acc * evtc.gelu_grad(F)
    return {"D": D, "dbias": D.sum(0)}


def residual_scale(acc, scale: evtc.ColVector[f32], bias: evtc.RowVector[f32], R1: evtc.Matrix, R2: evtc.Matrix):
    return torch.mul(torch.add(torch.mul(acc, scale), bias), R1) + R2


def row_stats(acc, C, alpha: float, beta: float, shift: evtc.ColVector[f32]):
    D = alpha * acc + beta * C
    return {"D": D, "row_max": D.max(dim=1).values, "row_sum": torch.exp(D - shift).sum(dim=-1)}


def fp8_out(acc, scale_a: float, scale_b: float, scale_d: float, bias: evtc.RowVector[f32]):
    y = F.relu(scale_a * scale_b * acc + bias)
    return {"D": (scale_d * y).to(torch.float8_e4m3fn), "amax": y.abs().amax()}


def many_aux(acc, X: evtc.Matrix, Y: evtc.Matrix, Z: evtc.Matrix, bias: evtc.RowVector[f32]):
    P = acc * X + bias
    Q = torch.sigmoid(Y) * P
    return {"D": torch.relu(Q + Z), "P": P, "Q": Q}


TORCH_WRITTEN = {f.__name__: f for f in (linear_combination, bias_relu, gelu_aux, dgelu_bgrad, residual_scale,
                                         row_stats, fp8_out, many_aux)}


def test_every_reference_epilogue_is_written_in_torch_here():
    assert set(TORCH_WRITTEN) == set(E.REFERENCE)


@pytest.mark.parametrize("name", sorted(TORCH_WRITTEN))
@pytest.mark.parametrize("frontend", ["auto", "torch"])
def test_reference_epilogue_written_with_torch_gives_the_same_ir(name, frontend):
    ours = evtc.epilogue(TORCH_WRITTEN[name], frontend=frontend)
    for dts in ({}, {"c": evtc.f16, "d": evtc.f16}):
        assert print_graph(ours.trace(**dts)) == print_graph(E.REFERENCE[name].trace(**dts))


def test_the_emitted_kernel_is_the_same_bytes():
    ours = evtc.Gemm(evtc.epilogue(row_stats), a=evtc.bf16, b=evtc.bf16, c=evtc.bf16, d=evtc.bf16)
    ref = evtc.Gemm(E.row_stats, a=evtc.bf16, b=evtc.bf16, c=evtc.bf16, d=evtc.bf16)
    assert ours.source == ref.source


def test_auto_uses_the_importer_only_when_the_function_uses_torch():
    calls = []

    def spy(acc, bias: evtc.RowVector[f32]):
        calls.append(type(acc).__name__)
        return torch.relu(acc + bias)

    evtc.epilogue(spy).graph
    assert calls[0] == "Value" and calls[-1] in ("FakeTensor", "FunctionalTensor", "Tensor") and len(calls) == 2
    calls.clear()
    with pytest.raises(evtc.TraceError, match="torch.relu was called on a traced value"):
        evtc.epilogue(spy, frontend="evtc").graph
    with pytest.raises(evtc.EpilogueSignatureError, match="frontend='jax'"):
        evtc.epilogue(spy, frontend="jax")


def test_a_tensor_method_on_a_traced_value_reads_as_torch_whoever_imported_torch():
    def method(acc, bias: evtc.RowVector[f32]):
        return (acc + bias).exp()

    code = ("import sys, evtc\n"
            "from evtc import f32\n"
            "def method(acc, bias: evtc.RowVector[f32]):\n"
            "    return (acc + bias).exp()\n"
            "print(repr(str(evtc.epilogue(method).graph)))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert eval(out.stdout) == str(evtc.epilogue(method).graph)
    assert "exp(%0)" in str(evtc.epilogue(method).graph)


def test_epilogue_still_runs_eagerly_on_tensors():
    ep = evtc.epilogue(bias_relu)
    acc, C, bias = torch.randn(3, 4), torch.randn(3, 4), torch.randn(4)
    assert torch.equal(ep(acc, C, 0.5, 2.0, bias), torch.relu(0.5 * acc + 2.0 * C + bias))


# ---- scalars, casts, reductions ------------------------------------------------------------------


def test_scalars_stay_runtime_parameters():
    def scaled(acc, alpha: float, beta: evtc.Scalar[f32], s: evtc.DeviceScalar[f32]):
        return torch.clamp(alpha * acc, min=beta) * (1 - s)

    g = import_torch(scaled)
    text = print_graph(g)
    assert "alpha: f32 scalar, beta: f32 scalar, s: f32 devscalar" in text
    assert "mul(alpha, acc)" in text and "maximum(%0, beta)" in text and "sub(1.0, s)" in text
    acc = np.random.default_rng(0).standard_normal((1, 3, 4))
    for alpha, beta, s in ((0.5, -0.25, 0.125), (3.0, 0.5, -2.0)):
        got = interpret(g, acc, {"alpha": alpha, "beta": beta, "s": np.array([s])})["D"]
        want = np.maximum(alpha * acc, beta) * (1 - s)
        np.testing.assert_allclose(got, evtc.dtypes.round_to(want, evtc.bf16), rtol=0, atol=0)


def test_casts_set_output_and_reduction_dtypes():
    def casts(acc, bias: evtc.RowVector[f32]):
        y = acc + bias
        return {"D": y.to(torch.float8_e4m3fn), "H": y.half(), "G": y.to(torch.bfloat16).float() * 2,
                "m": y.amax(dim=1).to(torch.bfloat16), "s": y.sum()}

    g = import_torch(casts, d=evtc.f16)
    out = {o.name: o.dtype.name for o in g.outputs}
    assert out == {"D": "e4m3", "H": "f16", "G": "f16", "m": "bf16", "s": "f32"}
    assert "%1 = convert(%0) : e4m3" in print_graph(g)
    assert "convert(%0) : bf16" in print_graph(g)

    def fp64(acc):
        return acc.double()

    with pytest.raises(evtc.EpilogueTypeError, match="float64"):
        import_torch(fp64)


REDUCTIONS = [  # (torch spelling, evtc spelling) of the same reductions
    (lambda D: {"D": D, "r": D.amax(dim=1)}, lambda D: {"D": D, "r": evtc.max(D, dim=1)}),
    (lambda D: {"D": D, "r": D.max(dim=-1, keepdim=True)[0]}, lambda D: {"D": D, "r": evtc.max(D, dim=1)}),
    (lambda D: {"D": D, "r": D.sum(1)}, lambda D: {"D": D, "r": evtc.sum(D, dim=1)}),
    (lambda D: {"D": D, "r": torch.sum(D, dim=(-1,), keepdim=True)}, lambda D: {"D": D, "r": evtc.sum(D, dim=1)}),
    (lambda D: {"D": D, "r": D.sum(0)}, lambda D: {"D": D, "r": evtc.sum(D, dim=0)}),
    (lambda D: {"D": D, "r": D.amin(dim=-2)}, lambda D: {"D": D, "r": evtc.min(D, dim=0)}),
    (lambda D: {"D": D, "r": D.min(dim=0).values}, lambda D: {"D": D, "r": evtc.min(D, dim=0)}),
    (lambda D: {"D": D, "r": D.abs().amax()}, lambda D: {"D": D, "r": evtc.amax(D)}),
    (lambda D: {"D": D, "r": D.sum()}, lambda D: {"D": D, "r": evtc.sum(D)}),
    (lambda D: {"D": D, "r": D.max()}, lambda D: {"D": D, "r": evtc.max(D)}),
    (lambda D: {"D": D, "r": D.amax(dim=(0, 1))}, lambda D: {"D": D, "r": evtc.max(D)}),
]


@pytest.mark.parametrize("i", range(len(REDUCTIONS)))
def test_reductions_of_each_axis(i):
    t_fn, e_fn = REDUCTIONS[i]

    def with_torch(acc, bias: evtc.RowVector[f32]):
        return t_fn(torch.relu(acc + bias))

    def with_evtc(acc, bias: evtc.RowVector[f32]):
        return e_fn(evtc.relu(acc + bias))

    g = import_torch(with_torch, name="r")
    assert print_graph(g) == print_graph(evtc.epilogue(with_evtc, name="r", frontend="evtc").graph)


def test_constants_like_a_tensor_are_numbers():
    def with_torch(acc, bias: evtc.RowVector[f32]):
        x = acc + bias
        return torch.where(x > torch.zeros_like(x), x, torch.full_like(x, 0.5) * x) + torch.ones_like(bias)

    def with_evtc(acc, bias: evtc.RowVector[f32]):
        x = acc + bias
        return evtc.where(x > 0.0, x, 0.5 * x) + 1.0

    assert print_graph(import_torch(with_torch, name="c")) == \
        print_graph(evtc.epilogue(with_evtc, name="c", frontend="evtc").graph)


# ---- what the graph computes --------------------------------------------------------------------


def many_ops(acc, C, alpha: float, lo: float, bias: evtc.RowVector[f32], scale: evtc.ColVector[f32],
             R: evtc.Matrix[f32]):
    x = alpha * acc - C / 4 + bias * scale
    y = torch.where(x > bias, F.gelu(x, approximate="tanh"), F.silu(x)) + F.leaky_relu(R, 0.2)
    y = torch.clamp(y, min=lo, max=3.0) + F.hardtanh(R) + 2 - x.reciprocal() * 0.01 + torch.rsqrt(x * x + 1)
    y = y + torch.maximum(R, bias) - torch.clamp_max(x, 1.0) + torch.sigmoid(R) ** 2 + 2.0 ** torch.tanh(R)
    z = torch.exp(-y.abs()) + torch.log(x * x + 1)
    z = z + torch.sqrt(R * R) + torch.erf(R) + F.hardswish(R) - (R >= 0.5) * R + torch.sub(z, R, alpha=0.5)
    return {"D": z, "Y": y.to(torch.bfloat16), "rmax": z.amax(dim=1), "csum": y.sum(0), "amax": z.abs().amax()}


def test_imported_graph_computes_what_the_function_computes():
    g = import_torch(many_ops, d=f32)
    M, N = 9, 12
    gen = torch.Generator().manual_seed(3)

    def f32_values(*shape):  # the interpreter rounds inputs to their (f32) dtypes, as the kernel loads them
        return torch.randn(*shape, generator=gen).double()

    t = {"acc": f32_values(M, N) * 3, "C": f32_values(M, N), "alpha": 0.75, "lo": -0.5, "bias": f32_values(N),
         "scale": f32_values(M, 1), "R": f32_values(M, N)}
    want = many_ops(**t)
    inputs = {k: (v.numpy() if torch.is_tensor(v) else v) for k, v in t.items() if k != "acc"}
    inputs["scale"] = inputs["scale"][:, 0]
    got = interpret(g, t["acc"].numpy(), inputs)
    half_ulp = 2.0 ** -24  # the f32 outputs are the float64 values rounded once to f32
    for name in ("D", "rmax", "csum", "amax"):
        w = want[name].numpy()
        np.testing.assert_allclose(got[name][0], w, rtol=half_ulp * (1 + 1e-6), atol=1e-300, err_msg=name)
    bf = want["Y"].to(torch.bfloat16).double().numpy()
    np.testing.assert_array_equal(got["Y"][0], bf)


# ---- errors at the user's line -------------------------------------------------------------------


def _line_of(fn, text):
    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, line in enumerate(lines) if text in line)


def unsupported(acc, bias: evtc.RowVector[f32]):
    y = torch.relu(acc + bias)
    return torch.cumsum(y, dim=1)


def test_unsupported_op_is_reported_at_the_user_line():
    with pytest.raises(evtc.UnsupportedOpError) as info:
        evtc.epilogue(unsupported).graph
    err = info.value
    assert err.loc.line == _line_of(unsupported, "cumsum") and err.loc.file == __file__
    assert err.loc.text.strip() == "return torch.cumsum(y, dim=1)" and err.loc.col == 11
    assert err.epilogue == "unsupported" and "aten.cumsum" in err.message
    assert "relu" in err.hint and "amax" in err.hint
    text = str(err)
    assert "^^^^" in text and "docs/errors.md#unsupported-op" in text
    frames = [f.filename for f in __import__("traceback").extract_tb(err.__traceback__)]
    assert not any("/evtc/" in f.replace("\\", "/") and "tests" not in f for f in frames), frames


@pytest.mark.parametrize("body,cls,match,marker", [
    (lambda acc, a: acc.softmax(dim=1), evtc.UnsupportedOpError, "aten._softmax", "softmax"),
    (lambda acc, a: acc.clone().relu_(), evtc.UnsupportedOpError, "in-place op relu_", "relu_"),
    (lambda acc, a: acc.mean(dim=1), evtc.UnsupportedOpError, "mean", "mean"),
    (lambda acc, a: acc.max(dim=1).indices * 1.0, evtc.UnsupportedOpError, "argmax", "indices"),
    (lambda acc, a: acc.var(dim=1), evtc.UnsupportedOpError, "aten.var", "var"),
    (lambda acc, a: acc.t() + 1, evtc.UnsupportedOpError, "aten.t|moves elements|permute", ".t()"),
    (lambda acc, a: acc * torch.ones(5, 7), evtc.UnsupportedOpError, "tensor constant|aten.ones", "ones"),
    (lambda acc, a: acc - acc.amax(dim=1, keepdim=True), evtc.TraceError, "used inside the epilogue", "keepdim"),
    (lambda acc, a: torch.relu(acc) if a > 0 else acc, evtc.TraceError, "Python value", "a > 0"),
    (lambda acc, a: (torch.relu(acc), acc), evtc.TraceError, "outputs need names", None),
    (lambda acc, a: {"D": acc, "m": acc.max(dim=1)}, evtc.UnsupportedOpError, "argmax", "acc.max(dim=1)"),
    (lambda acc, a: {"D": torch.relu(acc), "v": torch.relu(a)}, evtc.EpilogueTypeError, "scalar value", None),
    (lambda acc, a: torch.ops.aten.gelu.default(acc, approximate="sigmoid"), evtc.TraceError,
     "the epilogue function raised RuntimeError: approximate", "approximate"),
])
def test_what_the_importer_refuses(body, cls, match, marker):
    def fn(acc, a: float):
        return body(acc, a)

    with pytest.raises(cls, match=match) as info:
        import_torch(fn)
    if marker is not None:
        assert marker in (info.value.loc.text or ""), (str(info.value), marker)


def test_a_vector_of_the_wrong_kind_is_a_broadcast_error_with_the_shapes():
    def wrong(acc, scale: evtc.RowVector[f32]):
        return torch.relu(acc) * scale.view(-1, 1)  # a row vector used as a column

    with pytest.raises(evtc.TraceError, match="(must match the size|broadcast).*traced with M=5, N=7") as info:
        import_torch(wrong)
    assert "scale.view(-1, 1)" in info.value.loc.text and "evtc.ColVector as (M, 1)" in info.value.hint


def test_a_function_that_raises_is_located():
    def raises(acc):
        y = torch.relu(acc)
        return y + undefined_name  # noqa: F821

    with pytest.raises(evtc.TraceError, match="NameError") as info:
        import_torch(raises)
    assert info.value.loc.line == _line_of(raises, "undefined_name")


def test_importing_the_module_does_not_import_torch():
    code = "import sys, evtc, evtc.frontend.torch_import as t; print('torch' in sys.modules, len(t.ATEN) > 50)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["False", "True"]
