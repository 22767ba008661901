"""The random-epilogue GPU fuzz (issue 10): ``FUZZ_COUNT`` epilogues per arch (200 on sm90, 50 on
sm80) from fixed seeds (tests/strategies.py: the same epilogues on every Python version, pinned
by tests/null/test_fuzz_epilogues.py), each run on a ragged batched shape and a ragged-K shape
with fresh random data and NaN-poisoned outputs, every element of every output within its bound
of the float64 reference (evtc.testing). A failure shows the epilogue's IR and its seed
(``strategies.seeded_epilogue(seed)`` rebuilds it).

The kernels are built in parallel before the first test; on the GPU machine, carry them prebuilt
(``python benchmarks/prebuild.py random:0-99 random:100-199 random80``, then pack_cache.py)."""

import pytest

import evtc
from evtc import bf16

from conftest_gpu import assert_matches

pytestmark = pytest.mark.gpu

#: (M, N, K, L): ragged M and N (no tile divides them) with two batches; ragged N and K with one
SHAPES = [(333, 517, 256, 2), (129, 1031, 72, 1)]


def fuzz_gemm(arch: str, epilogue) -> evtc.Gemm:
    """The Gemm the fuzz runs for one epilogue (prebuild.py's ``random``/``random80`` groups)."""
    return evtc.Gemm(epilogue, a=bf16, b=bf16, d=bf16, arch=arch,
                     config=evtc.plan.default_config(arch, bf16, bf16))


def _cases():
    import strategies as S

    return [(arch, i) for arch in ("sm90", "sm80") for i in range(S.FUZZ_COUNT[arch])]


@pytest.fixture(scope="module")
def built(request):
    """The selected cases' Gemms (an epilogue whose Gemm fails to construct fails its own test),
    built in parallel."""
    import strategies as S
    from conftest_gpu import prebuild, selected_params

    want = selected_params(request, "test_fuzz_epilogue", "case")
    table = {}
    for arch in ("sm90", "sm80"):
        n = max([i + 1 for a, i in want if a == arch], default=0)
        for i, (seed, ep) in enumerate(S.fuzz_epilogues(arch, n)):
            if (arch, i) in want:
                try:
                    table[(arch, i)] = (seed, fuzz_gemm(arch, ep))
                except evtc.EvtcError as e:
                    table[(arch, i)] = (seed, e)
    prebuild([g for _, g in table.values() if isinstance(g, evtc.Gemm)])
    return table


@pytest.mark.parametrize("case", _cases(), ids=lambda c: f"{c[0]}-{c[1]:03d}")
def test_fuzz_epilogue(built, case, record_errors):
    seed, g = built[case]
    if isinstance(g, Exception):
        raise g
    for shape in SHAPES:
        assert_matches(g, shape, seed, f"fuzz epilogue {case[0]} #{case[1]} (seed {seed})", record_errors)
