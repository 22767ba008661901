"""Reference epilogues on the H100 (sm90): fresh random data, NaN-poisoned outputs, relative error
against the float64 interpreter within the output dtype's bound."""

import zlib

import pytest

import evtc
from evtc import bf16, f16
from evtc.testing import Problem, check

pytestmark = pytest.mark.gpu

SHAPES = [(4096, 4096, 4096, 1), (1000, 1000, 1000, 1), (777, 1031, 512, 3)]
FIRST = ["linear_combination", "bias_relu", "residual_scale"]


@pytest.fixture(scope="module")
def gemms():
    import epilogues as E
    from conftest_gpu import prebuild

    table = {(n, dt.name): evtc.Gemm(E.REFERENCE[n], a=dt, b=dt, c=dt, d=dt) for n in FIRST for dt in (bf16, f16)}
    prebuild(list(table.values()))
    return table


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("name", FIRST)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_reference_epilogue(gemms, name, dtype, shape, record_errors):
    g = gemms[(name, dtype)]
    errs = check(g, Problem(*shape), seed=zlib.crc32(f"{name}{dtype}{shape}".encode()))
    record_errors(errs)
    for out, (err, tol) in errs.items():
        assert err <= tol, f"{name}/{dtype} {shape}: output {out} relative error {err:.3e} > {tol:.1e}"


def test_result_depends_on_inputs(gemms):
    """Two different random inputs give different outputs (the kernel is not returning a constant)."""
    import torch

    from evtc.testing import make_inputs

    g = gemms[("bias_relu", "bf16")]
    p = Problem(256, 256, 128)
    outs = []
    for seed in (1, 2):
        ins = make_inputs(g.graph, g.a, g.b, p, seed=seed)
        outs.append(g(ins.pop("A"), ins.pop("B"), **ins).float())
    assert not torch.allclose(outs[0], outs[1])


def test_runs_on_the_callers_stream(gemms):
    import torch

    from evtc.testing import make_inputs, reference, relative_error, to_numpy

    g = gemms[("linear_combination", "bf16")]
    p = Problem(512, 384, 256)
    ins = make_inputs(g.graph, g.a, g.b, p, seed=3)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        d = g(ins["A"], ins["B"], C=ins["C"], alpha=ins["alpha"], beta=ins["beta"])
    s.synchronize()
    ref = reference(g.graph, ins)["D"]
    assert relative_error(to_numpy(d), ref) <= 4 * bf16.eps + 1e-4
