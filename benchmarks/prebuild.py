"""Build, in parallel, every kernel the GPU tests and the named benchmarks need (run this first
on the GPU machine: its 16 cores build in about the time one build takes here).

    python benchmarks/prebuild.py tests random explore bias_relu planner:many_aux plan_vs_stock:differing runtime host

A group takes an argument after a colon: ``planner:NAME`` builds only that epilogue's kernels
of bench_planner.py (its ``--only NAME``), ``plan_vs_stock:differing`` only the epilogues whose
evtc plan differs from stock's (bench_plan_vs_stock.py's ``--differing``).
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
    out += [evtc.Gemm(E.REFERENCE[n], a=bf16, b=bf16, d=bf16, plan=dict(f)) for n, f in planner.VARIANTS]
    out.append(evtc.Gemm(planner.two_pairs, plan={"share": True}))
    out += [planner.row_direct_gemm(*c) for c in planner.ROW_DIRECT]
    return out


def random_gemms():
    """The sm90 GPU tests' Hypothesis-generated epilogues (they differ between Python versions:
    build them where the tests run)."""
    sys.path.insert(0, str(common.ROOT / "tests"))
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import test_sm90_language as lang

    return [evtc.Gemm(e, a=bf16, b=bf16, d=bf16) for e in lang.random_epilogues()]


def explore_gemms(name="bias_relu"):
    import explore_configs as X

    return [g for _, g in X.gemms(name)]


def bias_relu_gemms(config=None):
    """bench_bias_relu.py's kernels; ``bias_relu:JSON`` for its ``--config JSON``."""
    import bench_bias_relu as BR
    import epilogues as E

    cfg = evtc.GemmConfig.from_json(config) if config else None
    return [evtc.Gemm(E.bias_relu, a=bf16, b=bf16, c=bf16, d=bf16, config=cfg),
            evtc.Gemm(BR.bias_relu_nobeta, a=bf16, b=bf16, d=bf16, config=cfg)]


def planner_gemms(only=None):
    import bench_planner

    return bench_planner.all_gemms(only)


def plan_vs_stock_gemms(differing=False):
    import bench_plan_vs_stock

    return bench_plan_vs_stock.all_gemms(differing)


def sm80_gemms(only=None):
    """Every kernel tests/gpu/test_sm80_reference.py builds (``sm80:NAME``: only the reference
    epilogue NAME's)."""
    sys.path.insert(0, str(common.ROOT / "tests"))
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import test_sm80_reference as T

    if only:
        return [T.make_gemm(*c) for c in T.CASES if c[0] == only]
    return [T.make_gemm(*c) for c in T.CASES] + [evtc.Gemm(e, a=bf16, b=bf16, d=bf16, arch="sm80")
                                                 for e in T.random_epilogues()]


def runtime_gemms():
    """The runtime GPU tests' kernels (tests/gpu/test_runtime_checks.py, test_graphs.py)."""
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import runtime_kernels

    return list(runtime_kernels.gemms().values())


def host_gemms():
    """bench_host.py's kernels."""
    import bench_host

    return list(bench_host.gemms().values())


GROUPS = {"runtime": runtime_gemms, "host": host_gemms, "sm80": sm80_gemms, "tests": test_gemms, "random": random_gemms, "explore": explore_gemms, "bias_relu": bias_relu_gemms, "planner": planner_gemms,
          "plan_vs_stock": plan_vs_stock_gemms}


def gemms_of(names: list[str]) -> list:
    """The Gemms of the named groups (``GROUP`` or ``GROUP:ARG``), one per distinct source."""
    gemms = []
    for name in names:
        group, _, arg = name.partition(":")
        if group not in GROUPS:
            raise SystemExit(f"unknown group '{group}': one of {', '.join(sorted(GROUPS))}")
        gemms += GROUPS[group](arg) if arg else GROUPS[group]()
    return list({g.source: g for g in gemms}.values())


def main() -> None:
    uniq = {g.source: g for g in gemms_of(sys.argv[1:] or ["tests"])}
    common.build_all(list(uniq.values()), "prebuild")


if __name__ == "__main__":
    main()
