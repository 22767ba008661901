"""The whole epilogue language on the H100 (sm90): every reference epilogue (fp8 included) on the
shapes of the first issue, built in parallel first, every element checked against the float64
interpreter (evtc.testing) with fresh random data and NaN-poisoned outputs. The random
epilogues are tests/gpu/test_fuzz.py's."""

import zlib

import pytest

import evtc
from evtc.plan import default_config
from evtc import bf16, e4m3

from conftest_gpu import assert_matches, assert_outputs_match

pytestmark = pytest.mark.gpu

SHAPES = [(4096, 4096, 4096, 1), (1000, 1000, 1000, 1), (777, 1031, 512, 3)]
REF_CASES = [(n, dt) for n in ("linear_combination", "bias_relu", "gelu_aux", "dgelu_bgrad", "residual_scale",
                               "row_stats", "many_aux") for dt in ("bf16", "f16")] + [("fp8_out", "e4m3")]


def make_reference_gemm(name, dt):
    import epilogues as E

    if dt == "e4m3":
        return evtc.Gemm(E.REFERENCE[name], a=e4m3, b=e4m3, d=e4m3, config=default_config("sm90", e4m3, e4m3))
    d = evtc.dtypes.by_name(dt)
    return evtc.Gemm(E.REFERENCE[name], a=d, b=d, c=d, d=d, config=default_config("sm90", d, d))


@pytest.fixture(scope="module")
def built(request):
    """All kernels of this module, built in parallel; only those the selected tests use."""
    from conftest_gpu import prebuild, selected_params

    refs = {c: make_reference_gemm(*c) for c in REF_CASES}
    want = selected_params(request, "test_reference_epilogue", "case")
    if selected_params(request, "test_reductions_start_from_the_identity_every_call", "name"):
        want |= {("row_stats", "bf16"), ("dgelu_bgrad", "bf16"), ("fp8_out", "e4m3")}
    prebuild([refs[c] for c in REF_CASES if c in want])
    return refs


@pytest.mark.parametrize("case", REF_CASES, ids=lambda c: f"{c[0]}-{c[1]}")
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_reference_epilogue(built, case, shape, record_errors):
    assert_matches(built[case], shape, zlib.crc32(f"{case}{shape}".encode()), "/".join(case), record_errors)


@pytest.mark.parametrize("name", ["row_stats", "dgelu_bgrad", "fp8_out"])
def test_reductions_start_from_the_identity_every_call(built, name, record_errors):
    """Row, column and scalar reductions must not accumulate across calls: a second call into the
    same output buffers (holding the first call's results) must give the reference again."""
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    g = built[(name, "e4m3" if name == "fp8_out" else "bf16")]
    p = Problem(256, 384, 128, 2)
    ins = make_inputs(g.graph, g.a, g.b, p, seed=5)
    out = poisoned_outputs(g.graph, p)
    kwargs = {k: v for k, v in ins.items() if k not in ("A", "B")}
    for call in (1, 2):
        g(ins["A"], ins["B"], out=out, **kwargs)
        assert_outputs_match(g, ins, out, f"{name}, call {call}", record_errors)


@pytest.mark.parametrize("name", ["bias_relu", "gelu_aux", "dgelu_bgrad", "residual_scale", "row_stats", "many_aux"])
def test_eager_function_agrees_with_the_interpreter(name, device="cuda"):
    """The second oracle: the user's function called eagerly on float64 torch tensors, against
    the interpreter within the oracle's bound with an exact accumulator (the f32 epilogue
    arithmetic and the reductions' f32 sums: an eager ``evtc.sum`` accumulates in f32, and the
    eager elementwise ops run in float64, inside the f32 bound). Scalars are passed rounded to
    their f32 leaves, as the kernel and the interpreter take them: a python float's own digits
    would move ``alpha * acc`` by up to 2^-25 |acc|, hundreds of f32 ulps of a value that
    cancels to near zero."""
    import epilogues as E
    import numpy as np
    from evtc.ir.nodes import ColBroadcast, RowBroadcast, ScalarBroadcast
    from evtc.testing import Problem, compare, make_inputs, reference, reference_and_bounds, to_numpy

    ep = E.REFERENCE[name]
    g = ep.trace(d=evtc.f32, c=evtc.f32)
    ins = make_inputs(g, bf16, bf16, Problem(96, 80, 64, 2), seed=5, device=device)
    acc = ins["A"].double() @ ins["B"].double().transpose(-1, -2)
    vals = {k: to_numpy(v) for k, v in ins.items() if k not in ("A", "B")}
    ref, bounds = reference_and_bounds(g, to_numpy(acc), 0.0, vals)
    assert all(np.array_equal(ref[k], v, equal_nan=True) for k, v in reference(g, ins).items())
    kw = {}
    for n in g.inputs:
        if n.name == "acc":
            continue
        v = ins[n.name]
        v = v.double() if hasattr(v, "double") else v
        if isinstance(n, ScalarBroadcast) and not hasattr(v, "double"):
            v = float(np.float32(v))
        if isinstance(n, ColBroadcast):
            v = v.unsqueeze(-1)  # (L, M) -> (L, M, 1)
        elif isinstance(n, RowBroadcast) and v.dim() == 2:
            v = v.unsqueeze(-2)  # (L, N) -> (L, 1, N)
        kw[n.name] = v
    got = ep(acc, **kw)
    got = got if isinstance(got, dict) else {"D": got}
    assert set(got) == set(ref)
    for k, v in got.items():
        r = compare(k, to_numpy(v), ref[k], evtc.f32, bounds[k])
        assert r.ok, f"{name}: {r.describe()}"
