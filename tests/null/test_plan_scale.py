"""The sm90 planner's search is bounded (NOTE [Bounded search] in evtc/plan/sm90.py): the work of
planning a wide epilogue grows polynomially with its tensors (doubling them takes at most about
four times the work: 1.8-2.6x today, where an exhaustive search over 2^40 subsets would never
end), and the plans they get are legal.

Work is counted, not timed: the Python function calls the planner makes (cProfile's count, the
same on every run, whatever else the machine is doing), so a loaded machine can't fail the test.
"""

import cProfile
import pstats

import pytest

import evtc
from evtc import bf16, f16, f32
from evtc.dtypes import DType
from evtc.ir.graph import Graph, GraphBuilder
from evtc.ir.nodes import Accumulator, AuxLoad, Compute, RowBroadcast, Store
from evtc.passes import run
from evtc.plan import GemmConfig, make_plan as plan
from evtc.plan.sm90_space import mainloop_stage_bytes


def wide(n_in: int, n_out: int, dtypes: tuple[DType, ...] = (bf16,)) -> Graph:
    """acc * X0 + X1 + ... with ``n_in`` aux loads and ``n_out`` stores of partial sums."""
    b = GraphBuilder()
    acc = b.add(Accumulator(f32, name="acc"))
    bias = b.add(RowBroadcast(f32, name="bias"))
    xs = [b.add(AuxLoad(dtypes[i % len(dtypes)], name=f"X{i}")) for i in range(n_in)]
    v = b.add(Compute(f32, op="add", args=(acc, bias)))
    partial = []
    for x in xs:
        v = b.add(Compute(f32, op="add", args=(v, x)))
        partial.append(v)
    outs = [b.add(Store(dtypes[i % len(dtypes)], name=f"Y{i}", value=b.add(Compute(f32, op="relu", args=(partial[i % len(partial)] if partial else v,)))))
            for i in range(n_out - 1)]
    outs.insert(0, b.add(Store(bf16, name="D", value=v)))
    return Graph("wide", (acc, bias, *xs), tuple(outs))


@pytest.mark.parametrize("n_in, n_out, dtypes", [
    (40, 1, (bf16,)), (1, 40, (bf16,)), (17, 1, (bf16,)), (18, 3, (bf16, f16, f32)), (40, 40, (bf16, f32)),
])
def test_wide_epilogues_plan_in_polynomial_work_and_legally(n_in, n_out, dtypes):
    cfg = GemmConfig()

    def planned(n_in, n_out):
        """The plan of ``wide(n_in, n_out)`` and the function calls planning it took."""
        g = run(wide(n_in, n_out, dtypes), "sm90")
        profile = cProfile.Profile()
        profile.enable()
        try:
            p = plan(g, "sm90", a=bf16, b=bf16, config=cfg)
        finally:
            profile.disable()
        return p, pstats.Stats(profile).total_calls

    half = (max(1, n_in // 2), max(1, n_out // 2))
    planned(*half)  # warm up (imports, caches)
    _, small = planned(*half)
    p, large = planned(n_in, n_out)
    # quadratic growth is 4x; a cubic search 8x, an exhaustive one 2^(n/2)x
    assert large < 5 * small, f"{(n_in, n_out)} took {large / small:.1f}x the calls of {half}"
    assert p.mainloop_stages >= 2
    assert p.epilogue_smem_bytes + p.mainloop_stages * mainloop_stage_bytes(cfg, bf16, bf16) <= p.smem_capacity
    # every M x N tensor has a decision; the ones that don't fit in shared memory are register-direct
    names = {b.name: b for b in p.buffers}
    assert {f"X{i}" for i in range(n_in)} <= set(names)
    if n_in + n_out > 12:
        assert any(b.mode == "direct" and b.role in ("aux_load", "aux_store") for b in p.buffers)


def test_the_greedy_search_makes_the_largest_buffers_register_direct_first():
    # one f32 input among bf16 ones: it frees the most shared memory, so it goes direct first
    g = run(wide(24, 1, (bf16, bf16, bf16, f32)), "sm90")
    p = plan(g, "sm90", a=bf16, b=bf16, config=GemmConfig())
    direct = {b.name for b in p.buffers if b.mode == "direct" and b.role == "aux_load"}
    f32_inputs = {f"X{i}" for i in range(24) if i % 4 == 3}
    assert f32_inputs <= direct | {p.c_slot}


def test_plan_rank_must_be_a_non_negative_integer():
    import epilogues as E

    for bad in (-1, "a", 1.5, True):
        with pytest.raises(evtc.ConfigError, match="plan_rank"):
            evtc.Gemm(E.bias_relu, plan_rank=bad)
