"""Planning: GEMM configurations, the sm90 shared-memory planner and the sm80 lowering.

Input: a Graph after passes, an arch, a GemmConfig. Output: a :class:`~evtc.plan.model.Plan`.
"""

from __future__ import annotations

from evtc.dtypes import DType
from evtc.ir.graph import Graph
from evtc.plan.config import GemmConfig, check_plan_options, default_config, validate
from evtc.plan.model import Buffer, Plan
from evtc.plan.target import Target, get_target


def make_plan(graph: Graph, arch: str, *, a: DType, b: DType, config: GemmConfig | None = None,
         policy: str = "evtc", rank: int = 0, fixed: dict | None = None) -> Plan:
    """Plan ``graph`` for ``arch``.

    Args:
        graph: the epilogue after passes (:func:`evtc.passes.run`).
        arch: ``"sm90"`` or ``"sm80"``.
        a: the dtype of operand A.
        b: the dtype of operand B.
        config: GEMM configuration; None for :func:`default_config`.
        policy: sm90 only: ``"evtc"`` or ``"cutlass"`` (stock CUTLASS's additive rule).
        rank: sm90 only: take the rank-th best plan of the cost model (autotuning).
        fixed: sm90 only: decisions imposed on the planner (see :func:`evtc.plan.sm90.plan_sm90`).

    Raises:
        ConfigError: the configuration is illegal for the arch.
        PlanError: nothing fits.
    """
    target = get_target(arch)
    config = validate(config or default_config(arch, a, b), arch, a, b)
    check_plan_options(arch, policy, rank, fixed, epilogue=graph.name)
    if arch == "sm90":
        from evtc.plan.sm90 import plan_sm90

        return plan_sm90(graph, target, config, a=a, b=b, policy=policy, rank=rank, fixed=fixed)
    from evtc.plan.sm80 import plan_sm80

    return plan_sm80(graph, target, config, a=a, b=b)


__all__ = ["Buffer", "GemmConfig", "Plan", "Target", "default_config", "get_target", "make_plan", "validate"]
