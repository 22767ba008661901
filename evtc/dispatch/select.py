"""The selection model: a problem and its candidate kernels -> the candidates ranked by predicted
time.

Input: a :class:`~evtc.family.spec.Problem`, the epilogue's :class:`~evtc.family.spec.
EpilogueTraits` and the candidates of :func:`evtc.dispatch.space.candidates`. Output: the same
candidates, fastest predicted first. Plain Python over a per-device table that ships with the
package (``evtc/dispatch/tables/<device>.json``), fitted offline by
``benchmarks/selection/fit.py`` on the calibration half of the problem corpus only.

# NOTE [The selection model]
A candidate's time is predicted in two steps (docs/performance.md, "The selection model"):

1. an analytic wave model per (member, run-time variant kind, epilogue class): the persistent
   scheduler hands out ``units`` = scheduled tiles (CUTLASS's cluster and swizzle padding
   counted, :func:`~evtc.family.spec.scheduled_tiles`) x K splits in ``waves`` of the SM count;
   a wave costs ``a + b * mainloop + c * epilogue + d * split-K reduction`` (the reduction a
   serial turnstile of ``splits - 1`` read-modify-writes of the tile, CUTLASS's
   ``fixup`` in ``sm90_tile_scheduler_stream_k.hpp``), the stream-K decomposition spreads the
   K tiles over the SMs, and the time is at least ``e * bytes`` (A, B and D once through HBM).
   Five coefficients per row, fitted by a robust least squares on log time;
2. a correction learned from the nearest calibration problems: the mean of the model's log
   residual for the same candidate over the ``k`` problems nearest in (log M, log N, log K,
   log L / 2), weighted by 1 / (distance + 0.25). What the wave model misses (L2 reuse, TMA
   multicast, a schedule's epilogue overlap) varies smoothly with the shape; this learns it
   locally without moving the model where it has no neighbours.

The epilogue class of a Gemm is ``reduce`` (row or column reductions), ``aux`` (aux loads or
stores besides C and D), else ``pointwise``: the three classes of the ground truth
(benchmarks/ground_truth.py).
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Mapping, Sequence

from evtc.family.spec import KernelSpec, Problem, scheduled_tiles

__all__ = ["Table", "epilogue_class", "features", "load_table", "predict", "rank", "variant_kind"]

TABLES = Path(__file__).with_name("tables")
#: feature weights of the neighbour distance: log2 of M, N, K and L
WEIGHTS = (1.0, 1.0, 1.0, 0.5)
#: a candidate no neighbour measured gets the model's prediction plus this (log) penalty
UNSEEN_PENALTY = 0.05


def epilogue_class(graph) -> str:
    """``reduce``, ``aux`` or ``pointwise``: the ground truth's class an epilogue is ranked as."""
    from evtc.ir.nodes import AuxLoad, Reduction, Store

    if any(isinstance(o, Reduction) for o in graph.outputs):
        return "reduce"
    stores = sum(isinstance(o, Store) for o in graph.outputs)
    if stores > 1 or any(isinstance(n, AuxLoad) for n in graph.used_inputs):
        return "aux"
    return "pointwise"


def variant_kind(spec: KernelSpec) -> str:
    """The row of the wave model: the member, and for a stream-K-scheduler member ``:dp``,
    ``:sk`` or ``:split``."""
    cfg = spec.config
    base = spec.name.split(":")[0]
    if cfg.scheduler != "streamk":
        return base
    if cfg.decomposition == "split_k" and cfg.split_k > 1:
        return base + ":split"
    return base + (":sk" if cfg.decomposition == "stream_k" else ":dp")


def features(spec: KernelSpec, p: Problem) -> tuple[float, float, float, float]:
    """(mainloop, epilogue, reduction, bytes) of the wave model for ``spec`` on ``p``: mainloop
    and epilogue in waves x (tile area / 128^2) x (K loop / 64) and waves x (tile area / 128^2),
    the reduction in waves x (splits - 1) x tile area / 128^2, bytes in MB."""
    cfg = spec.config
    tm, tn, tk = cfg.tile
    Mk, Nk = (p.N, p.M) if cfg.swap_ab else (p.M, p.N)
    tiles = scheduled_tiles(cfg, Mk, Nk, p.L, swizzle=cfg.swizzle or 0)
    k_tiles = math.ceil(p.K / tk)
    area = tm * tn / (128 * 128)
    stream_k = cfg.scheduler == "streamk" and cfg.decomposition == "stream_k"
    splits = cfg.split_k if cfg.scheduler == "streamk" and cfg.decomposition == "split_k" else 1
    if stream_k:  # the K tiles of every output tile spread evenly over the SMs
        waves = math.ceil(tiles * k_tiles / p.sm_count) / k_tiles
        k_loop = k_tiles * tk
        reduction = waves * area
    else:
        waves = math.ceil(tiles * splits / p.sm_count)
        k_loop = math.ceil(k_tiles / splits) * tk
        reduction = waves * (splits - 1) * area
    mbytes = ((p.M * p.K + p.N * p.K) * 2 + p.M * p.N * 2) * p.L / 1e6
    return waves * area * k_loop / 64, waves * area, reduction, mbytes


def predict(coef: Sequence[float], f: Sequence[float]) -> float:
    """The wave model's time (ms) from its five coefficients and :func:`features`."""
    a, b, c, d, e = (abs(x) for x in coef)
    return max(a + b * f[0] + c * f[1] + d * f[2], e * f[3])


def _point(M: int, N: int, K: int, L: int) -> tuple[float, ...]:
    return tuple(w * math.log2(max(x, 1)) for w, x in zip(WEIGHTS, (M, N, K, L)))


class Table:
    """One device's fitted model: per epilogue class, the wave model's coefficients per row and
    the calibration problems with the model's log residual per candidate label.

    Attributes:
        device: the GPU it was measured on (``torch.cuda.get_device_name()``).
        sm_count: its multiprocessors.
        k: neighbours averaged.
    """

    def __init__(self, data: Mapping) -> None:
        self.device = data["device"]
        self.sm_count = int(data["sm_count"])
        self.k = int(data.get("k", 8))
        self.coef: dict[str, dict[str, list[float]]] = data["coef"]
        self.rows: dict[str, list[tuple[tuple[float, ...], dict[str, float]]]] = {
            cls: [(_point(*r[:4]), r[4]) for r in rows] for cls, rows in data["rows"].items()}

    def score(self, cls: str, p: Problem, spec: KernelSpec, label: str, near) -> float | None:
        """The predicted log time of ``spec`` (labelled ``label``), or None where the table has
        no coefficients for its row."""
        coef = self.coef.get(cls, {}).get(variant_kind(spec))
        if coef is None:
            return None
        base = math.log(max(predict(coef, features(spec, p)), 1e-6))
        num = den = 0.0
        for w, residuals in near:
            r = residuals.get(label)
            if r is not None:
                num += w * r
                den += w
        return base + (num / den if den else UNSEEN_PENALTY)

    def neighbours(self, cls: str, p: Problem) -> list[tuple[float, dict[str, float]]]:
        """The ``k`` calibration problems of ``cls`` nearest ``p``: (weight, residuals)."""
        x = _point(p.M, p.N, p.K, p.L)
        dist = sorted(((math.dist(x, pt), res) for pt, res in self.rows.get(cls, ())), key=lambda t: t[0])
        return [(1.0 / (dd + 0.25), res) for dd, res in dist[:self.k]]


@functools.lru_cache(maxsize=None)
def load_table(device: str | None) -> Table | None:
    """The table for ``device`` (a GPU's name): its own where one was measured, else the H200's
    for any sm90 part (NOTE [The selection model]: the H100 SXM has the same 132 SMs and
    less bandwidth; its own table is not measured yet). None where no table ships."""
    names = sorted(TABLES.glob("*.json"))
    if not names:
        return None
    chosen = names[0]
    for f in names:
        if device and f.stem.replace("_", " ").lower() in device.lower():
            chosen = f
    return Table(json.loads(chosen.read_text()))  # package data, written by benchmarks/selection/fit.py


def rank(p: Problem, cls: str, candidates: Sequence[KernelSpec], table: Table | None) -> list[KernelSpec]:
    """``candidates`` ordered by predicted time, fastest first (their given order where the
    table has no row for them, after those it ranks)."""
    from evtc.dispatch.space import label

    if table is None:
        return list(candidates)
    near = table.neighbours(cls, p)
    scored = []
    for i, spec in enumerate(candidates):
        s = table.score(cls, p, spec, label(spec), near)
        scored.append((s if s is not None else math.inf, i, spec))
    scored.sort(key=lambda t: (t[0], t[1]))
    return [s for _, _, s in scored]

