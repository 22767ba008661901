"""The GPU fuzz's epilogues (tests/strategies.py) are fixed: the same on every Python and
Hypothesis version, so kernels prebuilt on one machine are the ones the GPU machine asks for.
The hash of every epilogue's IR text is pinned in tests/golden/fuzz_epilogues.txt; a change of
the generator, the tracer or the IR printer shows up here (rerun with --accept-golden when it is
intended, and rebuild the prebuilt fuzz kernels)."""

import hashlib
import random

import pytest

import evtc
from evtc import bf16

import strategies as S


def _hash(ep) -> str:
    return hashlib.sha256(str(ep.trace(d=bf16)).encode()).hexdigest()[:16]


def test_fuzz_epilogues_are_pinned(golden):
    lines = [f"# arch index seed sha256(IR text)[:16]; {S.FUZZ_COUNT} epilogues of at least {S.FUZZ_MIN_NODES} nodes"]
    for arch in ("sm90", "sm80"):
        eps = S.fuzz_epilogues(arch)
        assert len(eps) == S.FUZZ_COUNT[arch] and S.FUZZ_COUNT[arch] >= {"sm90": 200, "sm80": 50}[arch]
        lines += [f"{arch} {i:3d} {seed} {_hash(ep)}" for i, (seed, ep) in enumerate(eps)]
    golden("fuzz_epilogues.txt", "\n".join(lines) + "\n")


def test_seeded_choices_use_only_the_guaranteed_sequence():
    """Random.random() for a given seed is the one sequence Python promises to keep; the chooser
    must be a function of it alone (no randrange/choice, whose algorithms may change)."""
    c = S._SeededChoices(1)
    rng = random.Random(1)
    draws = [rng.random() for _ in range(3)]
    assert draws[0] == 0.13436424411240122  # documented-stable value of Random(1).random()
    assert [c.integer(0, 9), c.integer(5, 5), c.choice("abc")] == [int(draws[0] * 10), 5, "abc"[int(draws[2] * 3)]]


def test_fuzz_epilogues_are_distinct_and_named_by_seed():
    eps = S.fuzz_epilogues("sm90") + S.fuzz_epilogues("sm80")
    assert len({str(ep.trace(d=bf16)).split("\n", 1)[1] for _, ep in eps}) > 0.95 * len(eps)
    assert all(ep.name == f"fuzz{seed}" for seed, ep in eps)
    assert S.seeded_epilogue(eps[0][0]).trace(d=bf16) == eps[0][1].trace(d=bf16)


def test_fuzz_epilogues_cover_the_language():
    """Every node kind, op and output dtype the generator can draw appears in the sm90 list."""
    from evtc.ir.nodes import Reduction, ScalarBroadcast, Store

    kinds, ops_, dts, dims = set(), set(), set(), set()
    for _, ep in S.fuzz_epilogues("sm90"):
        g = ep.trace(d=bf16)
        for n in g.nodes:
            kinds.add(type(n).__name__ + ("*" if isinstance(n, ScalarBroadcast) and n.by_pointer else ""))
            ops_.add(getattr(n, "op", None))
            if isinstance(n, (Store, Reduction)):
                dts.add(n.dtype.name)
            if isinstance(n, Reduction):
                dims.add((n.op.value, n.dim))
    assert {"Source", "AuxLoad", "RowBroadcast", "ColBroadcast", "ScalarBroadcast", "ScalarBroadcast*", "Store",
            "Reduction", "Immediate"} <= kinds
    assert {"gelu", "gelu_tanh", "erf", "tanh", "exp", "log", "sqrt", "where", "gt", "leaky_relu", "hardswish",
            "silu", "sigmoid", "maximum", "minimum", "convert"} <= ops_
    assert {"bf16", "f16", "f32", "e4m3"} <= dts
    assert {(op, d) for op in ("sum", "max", "min") for d in (0, 1, None)} <= dims


@pytest.mark.slow
@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_every_fuzz_epilogue_makes_a_gemm(arch):
    """Trace, passes, plan and emit succeed for every fuzz epilogue (what the GPU fuzz's fixture
    does before building), with no register-direct aux tensor on sm90 (those need N % 8 == 0,
    which the fuzz's ragged shapes break)."""
    for i, (seed, ep) in enumerate(S.fuzz_epilogues(arch)):
        g = evtc.Gemm(ep, a=bf16, b=bf16, d=bf16, arch=arch)
        assert not g.dispatch.family.primary_binder().direct, (arch, i, seed)
