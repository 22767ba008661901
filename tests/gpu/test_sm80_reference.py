"""The sm80 (Ampere) lowering on a GPU: every reference epilogue, bf16 and f16 operands, the
default scheduler and stream-K, on the issue's shapes (ragged N = 1031 included), built for
sm_80 with PTX (so on an H100 the driver JIT-compiles it). Fresh random data, NaN-poisoned
outputs, every element within its bound of the float64 reference (evtc.testing, NOTE [The error
bound]). The random epilogues are tests/gpu/test_fuzz.py's.

All kernels are built in parallel before the first test (``EVTC_BUILD_JOBS`` nvcc processes)."""

import zlib

import pytest

import evtc
from evtc.plan import default_config

from conftest_gpu import assert_matches, assert_outputs_match, run_on_stream_after_a_delay

pytestmark = pytest.mark.gpu

SHAPES = [(4096, 4096, 4096, 1), (1000, 1000, 1000, 1), (777, 1031, 512, 3)]
REFERENCE = ["linear_combination", "bias_relu", "gelu_aux", "dgelu_bgrad", "residual_scale", "row_stats", "fp8_out",
             "many_aux"]
CASES = [(n, dt, s) for n in REFERENCE for dt in ("bf16", "f16") for s in ("persistent", "streamk")]


def make_gemm(name, dt, scheduler):
    import epilogues as E

    d = evtc.dtypes.by_name(dt)
    cfg = default_config("sm80", d, d).replace(scheduler=scheduler)
    out = None if name == "fp8_out" else d  # fp8_out stores e4m3 itself
    return evtc.Gemm(E.REFERENCE[name], a=d, b=d, c=d, d=out, arch="sm80", config=cfg)


@pytest.fixture(scope="module")
def built():
    from conftest_gpu import prebuild

    refs = {c: make_gemm(*c) for c in CASES}
    prebuild(list(refs.values()))
    return refs


@pytest.mark.parametrize("case", CASES, ids=lambda c: "-".join(c))
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_reference_epilogue(built, case, shape, record_errors):
    assert_matches(built[case], shape, zlib.crc32(f"{case}{shape}".encode()), "/".join(case), record_errors)


@pytest.mark.parametrize("scheduler", ["persistent", "streamk"])
@pytest.mark.parametrize("shape", [(333, 517, 77, 2), (129, 64, 8, 1), (64, 1, 24, 1)],
                         ids=lambda s: "x".join(map(str, s)))
def test_ragged_k_and_tiny_shapes(built, scheduler, shape, record_errors):
    """Odd K (the one-element 'ragged' variant), a single k-tile, N = 1."""
    for name in ("bias_relu", "dgelu_bgrad", "row_stats"):
        g = built[(name, "bf16", scheduler)]
        assert_matches(g, shape, zlib.crc32(f"{name}{shape}".encode()), f"{name}/{scheduler}", record_errors)


@pytest.mark.parametrize("scheduler", ["persistent", "streamk"])
@pytest.mark.parametrize("name", ["row_stats", "dgelu_bgrad", "fp8_out"])
def test_reductions_start_from_the_identity_every_call(built, name, scheduler, record_errors):
    """Row, column and scalar reductions (atomics) must not accumulate across calls: a second call
    into the same output buffers, which hold the first call's results, must give the reference
    again (comparing the two calls with each other would pass a kernel that is wrong both times)."""
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    g = built[(name, "bf16", scheduler)]
    p = Problem(256, 384, 128, 2)
    ins = make_inputs(g.graph, g.a, g.b, p, seed=5)
    out = poisoned_outputs(g.graph, p)
    kwargs = {k: v for k, v in ins.items() if k not in ("A", "B")}
    for call in (1, 2):
        g(ins["A"], ins["B"], out=out, **kwargs)
        assert_outputs_match(g, ins, out, f"{name}/{scheduler}, call {call}", record_errors)


def test_runs_on_the_callers_stream(built, record_errors):
    """The kernel runs on the caller's current stream: its inputs are only written on that stream,
    after a delay, so a launch on any other stream reads NaN."""
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    g = built[("linear_combination", "bf16", "streamk")]
    p = Problem(512, 384, 256)
    ins = make_inputs(g.graph, g.a, g.b, p, seed=3)
    out = poisoned_outputs(g.graph, p)
    run_on_stream_after_a_delay(g, ins, out)
    assert_outputs_match(g, ins, out, "on a side stream", record_errors)
