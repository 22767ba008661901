"""The kernels of the runtime GPU tests (tests/gpu/test_runtime_checks.py, test_graphs.py), in
one place so that benchmarks/prebuild.py (group ``runtime``) builds exactly these."""

import evtc
from evtc import bf16, f16, f32


@evtc.epilogue
def stats(acc, C, alpha: float, scale: evtc.DeviceScalar[f32], bias: evtc.RowVector[f32]):
    """Every kind of output: D, an aux store F, a row, a column and a scalar reduction."""
    D = alpha * scale * acc + C + bias
    return {"D": D, "F": evtc.relu(D), "row_max": evtc.max(D, dim=1), "col_sum": evtc.sum(D, dim=0),
            "amax": evtc.amax(D)}


def gemms() -> dict:
    """name -> Gemm (built by the tests' fixtures through the cache)."""
    import epilogues as E

    return {
        "bias_relu": evtc.Gemm(E.bias_relu, a=bf16, b=bf16, c=bf16, d=bf16, config=evtc.GemmConfig()),
        "bias_relu_f16": evtc.Gemm(E.bias_relu, a=f16, b=f16, c=f16, d=f16, config=evtc.GemmConfig()),
        "stats": evtc.Gemm(stats, a=bf16, b=bf16, c=bf16, d=bf16, config=evtc.GemmConfig()),
        "stats_sm80": evtc.Gemm(stats, a=bf16, b=bf16, c=bf16, d=bf16, arch="sm80"),
    }
