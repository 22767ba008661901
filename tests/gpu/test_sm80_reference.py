"""The sm80 (Ampere) lowering on a GPU: every reference epilogue, bf16 and f16 operands, the
default scheduler and stream-K, on the issue's shapes (ragged N = 1031 included), built for
sm_80 with PTX (so on an H100 the driver JIT-compiles it). Fresh random data, NaN-poisoned
outputs, relative error against the float64 interpreter within the output dtype's bound.

All kernels are built in parallel before the first test (``EVTC_BUILD_JOBS`` nvcc processes)."""

import zlib

import pytest

import evtc
from evtc import bf16
from evtc.plan import default_config
from evtc.testing import Problem, check

pytestmark = pytest.mark.gpu

SHAPES = [(4096, 4096, 4096, 1), (1000, 1000, 1000, 1), (777, 1031, 512, 3)]
REFERENCE = ["linear_combination", "bias_relu", "gelu_aux", "dgelu_bgrad", "residual_scale", "row_stats", "fp8_out",
             "many_aux"]
CASES = [(n, dt, s) for n in REFERENCE for dt in ("bf16", "f16") for s in ("persistent", "streamk")]
N_RANDOM = 10


def make_gemm(name, dt, scheduler):
    import epilogues as E

    d = evtc.dtypes.by_name(dt)
    cfg = default_config("sm80", d, d).replace(scheduler=scheduler)
    out = None if name == "fp8_out" else d  # fp8_out stores e4m3 itself
    return evtc.Gemm(E.REFERENCE[name], a=d, b=d, c=d, d=out, arch="sm80", config=cfg)


def random_epilogues():
    import strategies as S

    eps = S.collect(S.random_epilogues(), 60)
    return [e for e in eps if len(e.graph.nodes) >= 8][:N_RANDOM]


@pytest.fixture(scope="module")
def built():
    from conftest_gpu import prebuild

    refs = {c: make_gemm(*c) for c in CASES}
    rand = [evtc.Gemm(e, a=bf16, b=bf16, d=bf16, arch="sm80") for e in random_epilogues()]
    prebuild(list(refs.values()) + rand)
    return refs, rand


def assert_close(g, shape, seed, what, record_errors):
    errs = check(g, Problem(*shape), seed=seed)
    record_errors(errs)
    for out, (err, tol) in errs.items():
        assert err <= tol, f"{what} {shape}: output {out} relative error {err:.3e} > {tol:.1e}\n{g.graph}"


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_reference_epilogue(built, case, shape, record_errors):
    assert_close(built[0][case], shape, zlib.crc32(f"{case}{shape}".encode()), "/".join(case), record_errors)


@pytest.mark.parametrize("k", range(N_RANDOM))
def test_random_epilogue(built, k, record_errors):
    rand = built[1]
    assert len(rand) == N_RANDOM
    for shape in ((333, 517, 256, 2), (1024, 768, 512, 1)):
        assert_close(rand[k], shape, k, f"random epilogue {k}", record_errors)


@pytest.mark.parametrize("scheduler", ["persistent", "streamk"])
@pytest.mark.parametrize("shape", [(333, 517, 77, 2), (129, 64, 8, 1), (64, 1, 24, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_ragged_k_and_tiny_shapes(built, scheduler, shape, record_errors):
    """Odd K (the one-element 'ragged' variant), a single k-tile, N = 1."""
    for name in ("bias_relu", "dgelu_bgrad", "row_stats"):
        g = built[0][(name, "bf16", scheduler)]
        assert_close(g, shape, zlib.crc32(f"{name}{shape}".encode()), f"{name}/{scheduler}", record_errors)


def test_reductions_start_from_the_identity_every_call(built):
    """Atomic reductions must not accumulate across calls: the kernel refills them each time."""
    import torch

    from evtc.testing import make_inputs

    g = built[0][("row_stats", "bf16", "persistent")]
    ins = make_inputs(g.graph, g.a, g.b, Problem(256, 384, 128), seed=5)
    A, B = ins.pop("A"), ins.pop("B")
    first = g(A, B, **ins)
    second = g(A, B, **ins)
    torch.cuda.synchronize()
    for name in ("row_max", "row_sum"):
        assert torch.allclose(first[name], second[name], rtol=1e-5), name  # atomics: any order


def test_runs_on_the_callers_stream(built):
    import torch

    from evtc.testing import make_inputs, reference, relative_error, to_numpy

    g = built[0][("linear_combination", "bf16", "streamk")]
    p = Problem(512, 384, 256)
    ins = make_inputs(g.graph, g.a, g.b, p, seed=3)
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        d = g(ins["A"], ins["B"], C=ins["C"], alpha=ins["alpha"], beta=ins["beta"])
    s.synchronize()
    ref = reference(g.graph, ins)["D"]
    assert relative_error(to_numpy(d), ref) <= 4 * bf16.eps + 1e-4

