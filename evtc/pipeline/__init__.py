"""The build path above the planner: one epilogue -> kernels, stage by stage, with one memo.

Input: an epilogue (an ``@evtc.epilogue`` function, a Graph or a textual expression), the operand
dtypes and, per kernel, an arch and a :class:`~evtc.plan.config.GemmConfig`. Output: per arch
the Graph after passes, and per kernel its Plan, emitted ``.cu`` and, once built, its verified
library (:class:`~evtc.pipeline.kernel.Kernel`).

The stages run in order, trace -> passes -> lower + plan -> emit -> compile, and every stage
before compile goes through :func:`~evtc.pipeline.kernel.memoized` (get from the construct memo,
else compute, then put: :mod:`evtc.pipeline.memo`); compile goes through the kernel cache
(:mod:`evtc.compiler`), which takes sources and flags and knows nothing of the IR.
"""

from evtc.pipeline.kernel import Kernel, Pipeline, as_graph, emit, memoized

__all__ = ["Kernel", "Pipeline", "as_graph", "emit", "memoized"]
