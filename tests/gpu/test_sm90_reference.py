"""Reference epilogues on the H100 (sm90): fresh random data, NaN-poisoned outputs, every element
within its bound of the float64 reference (evtc.testing, NOTE [The error bound])."""

import zlib

import pytest

import evtc
from evtc import bf16, f16
from evtc.plan import default_config

from conftest_gpu import assert_matches, assert_outputs_match, run_on_stream_after_a_delay

pytestmark = pytest.mark.gpu

SHAPES = [(4096, 4096, 4096, 1), (1000, 1000, 1000, 1), (777, 1031, 512, 3)]
FIRST = ["linear_combination", "bias_relu", "residual_scale"]


@pytest.fixture(scope="module")
def gemms():
    import epilogues as E
    from conftest_gpu import prebuild

    table = {(n, dt.name): evtc.Gemm(E.REFERENCE[n], a=dt, b=dt, c=dt, d=dt, config=default_config("sm90", dt, dt))
             for n in FIRST for dt in (bf16, f16)}
    prebuild(list(table.values()))
    return table


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("name", FIRST)
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_reference_epilogue(gemms, name, dtype, shape, record_errors):
    assert_matches(gemms[(name, dtype)], shape, zlib.crc32(f"{name}{dtype}{shape}".encode()), f"{name}/{dtype}",
                   record_errors)


def test_result_depends_on_inputs(gemms, record_errors):
    """Two different random inputs give different outputs, each its own reference's (the kernel
    is not returning a constant or a stale result)."""
    import torch

    from evtc.testing import Problem, make_inputs, poisoned_outputs

    g = gemms[("bias_relu", "bf16")]
    p = Problem(256, 256, 128)
    outs = []
    for seed in (1, 2):
        ins = make_inputs(g.graph, g.a, g.b, p, seed=seed)
        out = poisoned_outputs(g.graph, p)
        g(ins["A"], ins["B"], out=out, **{k: v for k, v in ins.items() if k not in ("A", "B")})
        assert_outputs_match(g, ins, out, f"seed {seed}", record_errors)
        outs.append(out["D"].float())
    assert not torch.equal(outs[0], outs[1])


def test_runs_on_the_callers_stream(gemms, record_errors):
    """The kernel runs on the caller's current stream: its inputs are only written on that stream,
    after a delay, so a launch on any other stream reads NaN."""
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    g = gemms[("linear_combination", "bf16")]
    p = Problem(512, 384, 256)
    ins = make_inputs(g.graph, g.a, g.b, p, seed=3)
    out = poisoned_outputs(g.graph, p)
    run_on_stream_after_a_delay(g, ins, out)
    assert_outputs_match(g, ins, out, "on a side stream", record_errors)
