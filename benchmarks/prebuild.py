"""Build, in parallel, every kernel the GPU tests and the named benchmarks need (run this first
on the GPU machine: its 16 cores build in about the time one build takes here).

    python benchmarks/prebuild.py tests random explore bias_relu planner:many_aux plan_vs_stock:differing runtime host
    python benchmarks/prebuild.py conv conv:explore
    python benchmarks/prebuild.py reductions     # the row/column-reduction kernels of tests and benchmarks

A group takes an argument after a colon: ``planner:NAME`` builds only that epilogue's kernels
of bench_planner.py (its ``--only NAME``), ``plan_vs_stock:differing`` only the epilogues whose
evtc plan differs from stock's (bench_plan_vs_stock.py's ``--differing``), ``random:0-99`` and
``random80:0-24`` a chunk of the GPU fuzz's epilogues (by index, both ends included), so that
several machines or processes can build the 250 fuzz kernels in parallel:

    python benchmarks/prebuild.py random:0-99 &  python benchmarks/prebuild.py random:100-199 &
    python benchmarks/prebuild.py random80 &  wait
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

    import test_sm90_reference as ref

    out = [evtc.Gemm(E.REFERENCE[n], a=dt, b=dt, c=dt, d=dt, config=evtc.plan.default_config("sm90", dt, dt))
           for n in ref.FIRST for dt in (bf16, f16)]
    out += [lang.make_reference_gemm(*c) for c in lang.REF_CASES]
    out += [evtc.Gemm(E.REFERENCE[n], a=bf16, b=bf16, d=bf16, plan=dict(f), config=evtc.GemmConfig())
            for n, f in planner.VARIANTS]
    out.append(evtc.Gemm(planner.two_pairs, plan={"share": True}, config=evtc.GemmConfig()))
    out += [planner.row_direct_gemm(*c) for c in planner.ROW_DIRECT]
    return out


def _fuzz_gemms(arch: str, chunk: str | None):
    sys.path.insert(0, str(common.ROOT / "tests"))
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import strategies as S
    import test_fuzz

    n = S.FUZZ_COUNT[arch]
    lo, hi = 0, n - 1
    if chunk:
        try:
            lo, _, hi = chunk.partition("-")
            lo, hi = int(lo), int(hi or lo)
        except ValueError:
            raise SystemExit(f"fuzz chunk '{chunk}': expected FIRST-LAST indices, e.g. 0-99") from None
        if not 0 <= lo <= hi < n:
            raise SystemExit(f"fuzz chunk '{chunk}': indices run from 0 to {n - 1}")
    return [test_fuzz.fuzz_gemm(arch, ep) for _, ep in S.fuzz_epilogues(arch, hi + 1)[lo:]]


def random_gemms(chunk=None):
    """The sm90 GPU fuzz's kernels (tests/gpu/test_fuzz.py), ``random:FIRST-LAST`` a chunk of
    them. The epilogues come from fixed seeds: the same on every Python version."""
    return _fuzz_gemms("sm90", chunk)


def random80_gemms(chunk=None):
    """The sm80 GPU fuzz's kernels, ``random80:FIRST-LAST`` a chunk of them."""
    return _fuzz_gemms("sm80", chunk)


def explore_gemms(name="bias_relu"):
    import explore_configs as X

    return [g for _, g in X.gemms(name)]


def small_gemms():
    """explore_small.py's candidate kernels for decode, few-tile and long-K problems."""
    import explore_small

    return list(explore_small.gemms().values())


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
    epilogue NAME's); the sm80 fuzz is ``random80``."""
    sys.path.insert(0, str(common.ROOT / "tests"))
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import test_sm80_reference as T

    return [T.make_gemm(*c) for c in T.CASES if not only or c[0] == only]


def runtime_gemms():
    """The runtime GPU tests' kernels (tests/gpu/test_runtime_checks.py, test_graphs.py)."""
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import runtime_kernels

    return list(runtime_kernels.gemms().values())


def host_gemms(shape="256x256x256"):
    """bench_host.py's kernels: the family member each of its epilogues runs at ``shape``
    (``host:MxNxK``; bench_host.py's default shape), not whole families."""
    import bench_host

    M, N, K = (int(x) for x in shape.split("x"))
    return [g.kernel(g.choose(M, N, K)).job() for g in bench_host.gemms().values()]


def family_gemms():
    """tests/gpu/test_family_gpu.py's kernels (every reference epilogue x member variant, and the
    dispatch test's family with its on-demand members)."""
    sys.path.insert(0, str(common.ROOT / "tests"))
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import epilogues as E
    import test_family_gpu as T

    out = [T.make(n, v) for n in T.NAMES for v in T.VARIANTS if (n, v) not in T.REFUSED]
    fam = evtc.Gemm(T.maxima, a=bf16, b=bf16).family
    out += [evtc.Gemm(T.maxima, a=bf16, b=bf16, config=fam[m].config) for m in {c[0] for c in T.ATOMIC_CASES}]
    g = evtc.Gemm(E.bias_relu, a=bf16, b=bf16, c=bf16, d=bf16)
    for member in ("unaligned", "unaligned_k"):
        out.append(evtc.Gemm(E.bias_relu, a=bf16, b=bf16, c=bf16, d=bf16, arch=g.kernel(member).arch,
                             config=g.kernel(member).spec.config))
    return out + [g]


def shapes_gemms():
    """bench_shapes.py's kernels: three epilogues' families, their unaligned members and packed-store
    variants."""
    import bench_shapes

    return bench_shapes.prebuild_gemms()


def reductions_gemms():
    """The kernels with a row or column reduction that the GPU tests and the benchmarks run:
    tests/gpu/test_family_gpu.py's members of row_stats (row max and sum) and dgelu_bgrad (a column
    sum), every variant, and bench_shapes.py's rowmax family with its unaligned members (which
    explore_members.py pins too)."""
    sys.path.insert(0, str(common.ROOT / "tests"))
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import bench_shapes
    import test_family_gpu as T

    out = [T.make(n, v) for n in ("row_stats", "dgelu_bgrad") for v in T.VARIANTS if (n, v) not in T.REFUSED]
    # rowmax's family and pinned Gemms, and its build jobs ("rowmax[pingpong_packed]")
    return out + [g for g in bench_shapes.prebuild_gemms() if g.name.split("[")[0] == "rowmax"]


def conv_gemms(which=None):
    """The conv kernels: tests/gpu/test_conv_gpu.py's matrix (``conv:tests``), its sm90 fprop family
    tests' and the dgrad family's (the 1x1 GEMM route, a non-default member, dgrad's members: ``conv:family``), bench_conv.py's
    (``conv:bench``: the kernel each layer runs on), and explore_conv.py's (``conv:explore``: every
    candidate configuration per network epilogue and the 1x1 layers' Gemm members; not in the
    plain ``conv`` group)."""
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import bench_conv
    import conv_cases

    if which not in (None, "", "tests", "family", "persistent", "bench", "explore"):
        raise SystemExit(f"conv group '{which}': one of tests, family, persistent, bench, explore")
    if which == "explore":
        import explore_conv

        return explore_conv.kernels()
    return (conv_cases.kernels(conv_cases.all_convs()) if which in (None, "", "tests") else []) + \
        (conv_cases.family_kernels() + conv_cases.dgrad_family_kernels() if which in (None, "", "family") else []) + \
        (conv_cases.persistent_kernels() if which in (None, "", "persistent") else []) + \
        (bench_conv.kernels() if which in (None, "", "bench") else [])


def degenerate_gemms():
    """tests/gpu/test_degenerate_gpu.py's kernels: the degenerate epilogues on two members."""
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import test_degenerate_gpu as T

    return list(T.gemms().values())


def invariance_jobs():
    """tests/gpu/test_batch_invariance_gpu.py's kernels: the batch-invariant members its problems
    run on (an H200's choices)."""
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import test_batch_invariance_gpu as T

    return T.jobs()


def grouped_gemms():
    """tests/gpu/test_grouped_gpu.py's and bench_moe.py's grouped kernels (issue 39)."""
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import bench_moe
    import test_grouped_gpu as T

    return list(T.gemms().values()) + bench_moe.grouped_gemms()


def quantize_gemms():
    """tests/gpu/test_quantize_gpu.py's kernels (issue 40: evtc.quantize on each member that can
    run it, and each variant's family)."""
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import test_quantize_gpu as T

    return list(T.gemms().values())


def glu_gemms():
    """tests/gpu/test_glu_gpu.py's kernels (evtc.glu, the one-GEMM gated form, on each member
    that can run it, and its family)."""
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import test_glu_gpu as T

    return list(T.gemms().values())


def atomic_sums_gemms():
    """tests/gpu/test_atomic_sums_gpu.py's kernels (row and column sums through float atomics,
    beside the workspace)."""
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import test_atomic_sums_gpu as T

    return list(T.gemms().values())


def bench_glu_gemms():
    """bench_glu.py's kernels: what each row's Gemms choose on the H200 (jobs)."""
    import bench_glu

    jobs = {}
    for _, H, I, act in bench_glu.MODELS:
        table = bench_glu.gemms(act)
        for name, N in (("glu", 2 * I), ("up", I), ("bare", I)):
            g = table[name]
            for M in bench_glu.TOKENS:
                k = g.kernel(g.choose(M, N, H, device=bench_glu.DEVICE))
                jobs.setdefault(k.source, k.job())
    return list(jobs.values())


def torch_gemms():
    """bench_torch.py's kernels (and tests/gpu/test_torch_gpu.py's backend tests): the families of
    the two epilogues the evtc torch.compile backend makes for an MLP block."""
    import bench_torch

    return bench_torch.gemms()


GROUPS = {"torch": torch_gemms, "family": family_gemms, "shapes": shapes_gemms, "runtime": runtime_gemms, "conv": conv_gemms,
          "host": host_gemms, "sm80": sm80_gemms, "tests": test_gemms, "degenerate": degenerate_gemms,
          "invariance": invariance_jobs, "grouped": grouped_gemms, "quantize": quantize_gemms, "glu": glu_gemms,
          "atomic_sums": atomic_sums_gemms, "bench_glu": bench_glu_gemms,
          "random": random_gemms, "random80": random80_gemms,
          "explore": explore_gemms, "reductions": reductions_gemms, "small": small_gemms, "bias_relu": bias_relu_gemms, "planner": planner_gemms,
          "plan_vs_stock": plan_vs_stock_gemms}


def gemms_of(names: list[str]) -> list:
    """The Gemms of the named groups (``GROUP`` or ``GROUP:ARG``), one per distinct source."""
    gemms = []
    for name in names:
        group, _, arg = name.partition(":")
        if group not in GROUPS:
            raise SystemExit(f"unknown group '{group}': one of {', '.join(sorted(GROUPS))}")
        gemms += GROUPS[group](arg) if arg else GROUPS[group]()
    return list({tuple(j.source for j in common.jobs_of(g)): g for g in gemms}.values())


def main() -> None:
    common.build_all(gemms_of(sys.argv[1:] or ["tests"]), "prebuild")


if __name__ == "__main__":
    main()
