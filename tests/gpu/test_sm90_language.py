"""The whole epilogue language on the H100 (sm90): every reference epilogue (fp8 included) on the
shapes of the first issue, and 20 Hypothesis-generated random epilogues, built in parallel first,
each checked against the float64 interpreter with fresh random data and NaN-poisoned outputs."""

import zlib

import pytest

import evtc
from evtc import bf16, e4m3, f16
from evtc.testing import Problem, check

pytestmark = pytest.mark.gpu

SHAPES = [(4096, 4096, 4096, 1), (1000, 1000, 1000, 1), (777, 1031, 512, 3)]
REF_CASES = [(n, dt) for n in ("linear_combination", "bias_relu", "gelu_aux", "dgelu_bgrad", "residual_scale",
                               "row_stats", "many_aux") for dt in ("bf16", "f16")] + [("fp8_out", "e4m3")]


def make_reference_gemm(name, dt):
    import epilogues as E

    if dt == "e4m3":
        return evtc.Gemm(E.REFERENCE[name], a=e4m3, b=e4m3, d=e4m3)
    d = evtc.dtypes.by_name(dt)
    return evtc.Gemm(E.REFERENCE[name], a=d, b=d, c=d, d=d)


def random_epilogues():
    import strategies as S

    eps = S.collect(S.random_epilogues(), 80)
    return [e for e in eps if len(e.graph.nodes) >= 8][:20]


@pytest.fixture(scope="module")
def built(request):
    """All kernels of this module, built in parallel; only those the selected tests use."""
    from conftest_gpu import prebuild, selected_params

    refs = {c: make_reference_gemm(*c) for c in REF_CASES}
    rand = [evtc.Gemm(e, a=bf16, b=bf16, d=bf16) for e in random_epilogues()]
    want_cases = selected_params(request, "test_reference_epilogue", "case")
    want_rand = selected_params(request, "test_random_epilogue", "k")
    prebuild([refs[c] for c in REF_CASES if c in want_cases] + [rand[k] for k in sorted(want_rand)])
    return refs, rand


@pytest.mark.parametrize("case", REF_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_reference_epilogue(built, case, shape, record_errors):
    g = built[0][case]
    errs = check(g, Problem(*shape), seed=zlib.crc32(f"{case}{shape}".encode()))
    record_errors(errs)
    for out, (err, tol) in errs.items():
        assert err <= tol, f"{case} {shape}: output {out} relative error {err:.3e} > {tol:.1e}"


@pytest.mark.parametrize("k", range(20))
def test_random_epilogue(built, k, record_errors):
    rand = built[1]
    assert len(rand) == 20
    g = rand[k]
    for shape in ((333, 517, 256, 2), (1024, 768, 512, 1)):
        errs = check(g, Problem(*shape), seed=k)
        record_errors(errs)
        for out, (err, tol) in errs.items():
            assert err <= tol, f"random epilogue {k}, {shape}, output {out}: {err:.3e} > {tol:.1e}\n{g.graph}"


@pytest.mark.parametrize("name", ["bias_relu", "gelu_aux", "dgelu_bgrad", "residual_scale", "row_stats", "many_aux"])
def test_eager_function_agrees_with_the_interpreter(name):
    """The second oracle: the user's function called eagerly on float64 torch tensors."""
    import numpy as np
    import torch

    import epilogues as E
    from evtc.ir.nodes import ColBroadcast, RowBroadcast
    from evtc.testing import make_inputs, reference, to_numpy

    ep = E.REFERENCE[name]
    g = ep.trace(d=evtc.f32, c=evtc.f32)
    ins = make_inputs(g, bf16, bf16, Problem(96, 80, 64, 2), seed=5)
    ref = reference(g, ins)
    acc = ins["A"].double() @ ins["B"].double().transpose(-1, -2)
    kw = {}
    for n in g.inputs:
        if n.name == "acc":
            continue
        v = ins[n.name]
        v = v.double() if hasattr(v, "double") else v
        if isinstance(n, ColBroadcast):
            v = v.unsqueeze(-1)  # (L, M) -> (L, M, 1)
        elif isinstance(n, RowBroadcast) and v.dim() == 2:
            v = v.unsqueeze(-2)  # (L, N) -> (L, 1, N)
        kw[n.name] = v
    got = ep(acc, **kw)
    got = got if isinstance(got, dict) else {"D": got}
    for k, v in got.items():
        np.testing.assert_allclose(to_numpy(v), ref[k], rtol=1e-5, atol=1e-5, err_msg=f"{name}.{k}")
