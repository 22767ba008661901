"""Build, in parallel, every kernel the GPU tests and the named benchmarks need (run this first
on the GPU machine: its 16 cores build in about the time one build takes here).

    python benchmarks/prebuild.py tests explore bias_relu
"""

from __future__ import annotations

import sys

import common  # noqa: F401

import evtc
from evtc import bf16, f16


def test_gemms():
    """Every kernel the sm90 GPU tests build (their fixtures then find them in the cache)."""
    sys.path.insert(0, str(common.ROOT / "tests"))
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import epilogues as E
    import test_sm90_language as lang
    import test_sm90_planner as planner

    out = [evtc.Gemm(E.REFERENCE[n], a=dt, b=dt, c=dt, d=dt) for n in ("linear_combination", "bias_relu", "residual_scale")
           for dt in (bf16, f16)]
    out += [lang.make_reference_gemm(*c) for c in lang.REF_CASES]
    out += [evtc.Gemm(e, a=bf16, b=bf16, d=bf16) for e in lang.random_epilogues()]
    out += [evtc.Gemm(E.REFERENCE[n], a=bf16, b=bf16, d=bf16, plan=dict(f)) for n, f in planner.VARIANTS]
    out.append(evtc.Gemm(planner.two_pairs, plan={"alias": True}))
    return out


def explore_gemms(name="bias_relu"):
    import explore_configs as X

    return [g for _, g in X.gemms(name)]


def bias_relu_gemms():
    import bench_bias_relu as BR
    import epilogues as E

    return [evtc.Gemm(E.bias_relu, a=bf16, b=bf16, c=bf16, d=bf16), evtc.Gemm(BR.bias_relu_nobeta, a=bf16, b=bf16, d=bf16)]


def planner_gemms():
    import bench_planner

    return bench_planner.all_gemms()


def plan_vs_stock_gemms():
    import bench_plan_vs_stock

    return bench_plan_vs_stock.all_gemms()


def sm80_gemms():
    """Every kernel tests/gpu/test_sm80_reference.py builds, and the sm80-vs-sm90 benchmark's."""
    sys.path.insert(0, str(common.ROOT / "tests"))
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import test_sm80_reference as T

    return [T.make_gemm(*c) for c in T.CASES] + [evtc.Gemm(e, a=bf16, b=bf16, d=bf16, arch="sm80")
                                                 for e in T.random_epilogues()]


GROUPS = {"sm80": sm80_gemms, "tests": test_gemms, "explore": explore_gemms, "bias_relu": bias_relu_gemms, "planner": planner_gemms,
          "plan_vs_stock": plan_vs_stock_gemms}


def main() -> None:
    gemms = []
    for name in sys.argv[1:] or ["tests"]:
        gemms += GROUPS[name]()
    uniq = {g.source: g for g in gemms}
    common.build_all(list(uniq.values()), "prebuild")


if __name__ == "__main__":
    main()
