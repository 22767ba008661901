"""The selection model: a problem and its candidate kernels -> the candidates ranked by predicted
time.

Input: a :class:`~evtc.family.spec.Problem`, the epilogue's :class:`~evtc.family.spec.
EpilogueTraits` and the candidates of :func:`evtc.dispatch.space.candidates`. Output: the same
candidates, fastest predicted first. Plain Python over a per-device table that ships with the
package (``evtc/dispatch/tables/<device>.json``), fitted offline by
``benchmarks/selection/fit.py`` on the calibration half of the problem corpus only.

# NOTE [The selection model]
Candidates are ranked in two steps (docs/performance.md, "The selection model"):

1. an analytic wave model per (member, run-time variant kind, epilogue class) predicts each
   candidate's time: the persistent scheduler hands out ``units`` = scheduled tiles (CUTLASS's
   cluster and swizzle padding counted, :func:`~evtc.family.spec.scheduled_tiles`) x K splits in
   ``waves`` of the SM count; a wave costs ``a + b * mainloop + c * epilogue + d * split-K
   reduction`` (the reduction a serial turnstile of ``splits - 1`` read-modify-writes of the
   tile, CUTLASS's ``fixup`` in ``sm90_tile_scheduler_stream_k.hpp``), the stream-K
   decomposition spreads the K tiles over the SMs, and the time is at least ``e * bytes`` (A, B
   and D once through HBM). Five coefficients per row, fitted by a robust least squares on log
   time;
2. a ranker, gradient-boosted regression trees fitted with a pairwise ranking objective
   (LightGBM's lambdarank, offline) over all three epilogue classes at once, scores each
   candidate from :func:`ranker_features`: the shape, the member and its variant, the tile's
   waves, wave fill, padding and K loop per split, and the wave model's log time, absolute and
   relative to the fastest the wave model predicts among the problem's candidates. The trees
   learn how the candidates of one problem order (what the wave model misses: L2 reuse, TMA
   multicast, a schedule's epilogue overlap, the cost of a split), with relevance grades by
   time / the fastest candidate's: <= 1.02, <= 1.05, <= 1.15, slower; the candidate of the
   highest score is chosen. The table holds the trees as arrays; :meth:`Table.ranker_score`
   walks them.

The ranker replaced a correction by the nearest calibration problems (the wave model's log
residual of the same candidate averaged over the 8 nearest problems). In 5-fold
cross-validation on the calibration half (benchmarks/selection/fit.py ``--cv 5``; the settings
were chosen so, the validation half read once at the end) that chose within 1.05 of the fastest
on 83-86 % of problems per epilogue class, the ranker on 88-92 %. The table is larger (the
trees: 400 of at most 31 leaves) and a problem's ranking costs a few ms of Python (once per
shape: the dispatcher keeps its routes).

The epilogue class of a Gemm is ``reduce`` (row or column reductions), ``aux`` (aux loads or
stores besides C and D), else ``pointwise``: the three classes of the ground truth
(benchmarks/ground_truth.py).

# NOTE [The fuse gate]
Even the fastest evtc kernel loses to torch.compile's own cuBLAS GEMM + one fused Triton
epilogue on many problems (the ground truth, H200, the model's choice cross-validated: 65, 65
and 152 of 341 calibration problems for pointwise, aux and reduce, up to 6x slower), so a backend
that fused every match could make a graph slower. :func:`fuse_gain` / :func:`should_fuse` say whether to fuse: a binary classifier
of "the kernel the Gemm chooses is faster than torch.compile's time" (LightGBM, offline; 300
trees of at most 15 leaves in the table, walked by :func:`tree_score` like the ranker's) over
:func:`gate_features`: the chosen kernel's :func:`ranker_features` and wave-model log time (the
problem's own features on the staging route). Each (problem, class) is weighted by
``|log(chosen / compile)|``, so the log-odds weigh what a wrong decision costs; it fuses above a
log-odds of 1.5 (p > 0.82: cross-validated, thresholds of 0-2 gave the same geomean within
0.2 % and 1.5 left fewer problems slower than torch.compile than 0). It learns from the
calibration half's out-of-fold choices (each problem chosen by a selection model fitted without
its fold: what the model chooses on a problem it never saw), settings and threshold chosen by
5-fold cross-validation there (benchmarks/selection/fit.py, ``GATE``).

Decided time = the chosen kernel's where the gate fuses, else torch.compile's; geomean of
decided / the faster of the two, problems left > 5 % slower than torch.compile, and problems
left unfused, against fusing always (benchmarks/selection/H200_report.json, ``gate``):

=========================  ==============================  ==============================
class                      calibration, 5-fold CV (341)    validation, read once (327)
=========================  ==============================  ==============================
pointwise: gate            1.007, 6 slower, 68 unfused     1.010, 7 slower, 81 unfused
pointwise: always fuse     1.043, 49 slower                1.050, 45 slower
aux: gate                  1.008, 7 slower, 67 unfused     1.012, 6 slower, 83 unfused
aux: always fuse           1.048, 51 slower                1.053, 41 slower
reduce: gate               1.026, 12 slower, 167 unfused   1.016, 7 slower, 177 unfused
reduce: always fuse        1.144, 137 slower               1.143, 141 slower
=========================  ==============================  ==============================

Measured on the H200 only: a device without its own table (the H100, which ranks with the
H200's) gets no answer, and fusing stays the default. The figures are per GEMM + epilogue as
the ground truth times them (CUDA graphs, one problem at a time), not whole graphs: Inductor
may fuse an unfused epilogue with more of the graph than the ground truth's compile did.
"""

from __future__ import annotations

import functools
import json
import math
from pathlib import Path
from typing import Mapping, Sequence

from evtc.family.spec import KernelSpec, Problem, scheduled_tiles

__all__ = ["CLASSES", "FEATURES", "GATE_FEATURES", "Forest", "Table", "epilogue_class", "features", "fuse_gain",
           "gate_features", "load_table", "predict", "rank", "ranker_features", "should_fuse", "tree_score",
           "variant_kind"]

TABLES = Path(__file__).with_name("tables")
#: the epilogue classes, in the order of the ranker's ``cls`` feature
CLASSES = ("pointwise", "aux", "reduce")
#: the ranker's features, in order (:func:`ranker_features`, then the wave model's log time and
#: that minus the least among the problem's candidates)
FEATURES = ("cls", "log2_M", "log2_N", "log2_K", "log2_L", "log2_MNL", "member", "variant", "log2_splits",
            "tile_m", "tile_n", "swap_ab", "cluster_m", "cluster_n", "log2_tiles", "log2_scheduled_tiles",
            "padding", "tile_fill", "waves", "wave_fill", "units_per_sm", "log2_k_tiles",
            "log2_k_tiles_per_split", "log2_mainloop", "log2_epilogue", "log2_reduction", "log2_mbytes",
            "log2_flops_per_byte", "m_tile_remainder", "n_tile_remainder", "swizzle", "wave_model",
            "wave_model_over_least")
#: the categorical features (a tree's split on one is a set of values that go left)
CATEGORICAL = ("cls", "member", "variant")
#: the fuse gate's features (:func:`gate_features`): whether the selection model ranked the chosen
#: kernel (0: the staging route of rows TMA can't address), then the chosen kernel's
#: :data:`FEATURES` but the last (the least among the other candidates is not needed to decide)
GATE_FEATURES = ("ranked",) + FEATURES[:-1]
#: a candidate's feature of the fuse gate where no ranked candidate runs the problem
ABSENT = -1000.0


def epilogue_class(graph) -> str:
    """``reduce``, ``aux`` or ``pointwise``: the ground truth's class an epilogue is ranked as."""
    from evtc.ir.nodes import AuxLoad, Reduction, Store

    if any(isinstance(o, Reduction) and o.cross_tile for o in graph.outputs):
        return "reduce"  # (a GroupScale is whole inside one subtile: evtc.quantize ranks as pointwise)
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


def _splits(spec: KernelSpec) -> int:
    cfg = spec.config
    return cfg.split_k if cfg.scheduler == "streamk" and cfg.decomposition == "split_k" else 1


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
    splits = _splits(spec)
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


def ranker_features(spec: KernelSpec, p: Problem, cls: str, members: Sequence[str]) -> list[float]:
    """The ranker's features of ``spec`` on ``p`` (:data:`FEATURES` but the last two, which
    :func:`rank` appends): ``members`` numbers the member (-1: one the ranker never saw)."""
    cfg = spec.config
    tm, tn, tk = cfg.tile
    M, N, K, L = p.M, p.N, p.K, p.L
    Mk, Nk = (N, M) if cfg.swap_ab else (M, N)
    cm, cn = tuple(cfg.cluster[:2]) if cfg.cluster else (1, 1)
    tiles = scheduled_tiles(cfg, Mk, Nk, L, swizzle=cfg.swizzle or 0)
    raw = math.ceil(Mk / tm) * math.ceil(Nk / tn) * L
    splits = _splits(spec)
    k_tiles = math.ceil(K / tk)
    units = tiles * splits
    waves = math.ceil(units / p.sm_count)
    if cfg.scheduler != "streamk":
        variant = 0
    elif cfg.decomposition == "stream_k":
        variant = 2
    else:
        variant = 3 if splits > 1 else 1
    f0, f1, f2, f3 = features(spec, p)
    name = spec.name.split(":")[0]
    return [CLASSES.index(cls), math.log2(M), math.log2(N), math.log2(K), math.log2(L), math.log2(M * N * L),
            members.index(name) if name in members else -1, variant, math.log2(splits), tm, tn,
            int(bool(cfg.swap_ab)), cm, cn, math.log2(raw), math.log2(tiles), tiles / raw,
            Mk * Nk * L / (raw * tm * tn), waves, units / (waves * p.sm_count), units / p.sm_count,
            math.log2(k_tiles), math.log2(max(k_tiles / splits, 1e-3)), math.log2(f0 + 1e-9),
            math.log2(f1 + 1e-9), math.log2(f2 + 1e-3), math.log2(f3), math.log2(2.0 * M * N * K * L / (f3 * 1e6)),
            (Mk / tm) % 1, (Nk / tn) % 1, cfg.swizzle or 0]


def gate_features(p: Problem, cls: str, chosen: KernelSpec | None, table: "Table") -> list[float]:
    """The fuse gate's features (:data:`GATE_FEATURES`) of ``p`` run by ``chosen`` (what the
    Gemm's ``choose`` returns): the chosen kernel's :func:`ranker_features` and wave-model time
    where the table has a wave-model row for it, else (the staging route: an unaligned member or
    the sm80 kernel, or ``chosen`` None) the problem's own features, the kernel's :data:`ABSENT`
    (its categorical ``member`` and ``variant`` a value no candidate has)."""
    b = table.wave_model(cls, chosen, p) if chosen is not None else None
    if b is not None:
        return [1.0] + ranker_features(chosen, p, cls, table.members) + [b]
    M, N, K, L = p.M, p.N, p.K, p.L
    x = [ABSENT] * len(FEATURES[:-1])
    mbytes = ((M * K + N * K) * 2 + M * N * 2) * L / 1e6
    for name, v in (("cls", CLASSES.index(cls)), ("log2_M", math.log2(M)), ("log2_N", math.log2(N)),
                    ("log2_K", math.log2(K)), ("log2_L", math.log2(L)), ("log2_MNL", math.log2(M * N * L)),
                    ("member", len(table.members)), ("variant", 4), ("log2_mbytes", math.log2(mbytes)),
                    ("log2_flops_per_byte", math.log2(2.0 * M * N * K * L / (mbytes * 1e6)))):
        x[FEATURES.index(name)] = v
    return [0.0] + x


def _parse_trees(raw) -> list:
    return [(f, [frozenset(t) if isinstance(t, list) else t for t in th], lo, hi, leaf) for f, th, lo, hi, leaf in raw]


def tree_score(trees, x: Sequence[float]) -> float:
    """The sum of the leaves ``x`` reaches in ``trees`` (:attr:`Table.trees`' arrays)."""
    s = 0.0
    for feature, threshold, left, right, leaf in trees:
        i = 0
        while i >= 0:
            t = threshold[i]
            v = x[feature[i]]
            go_left = (v >= 0 and int(v) in t) if isinstance(t, frozenset) else v <= t
            i = left[i] if go_left else right[i]
        s += leaf[~i]
    return s


class Forest:
    """Trees stacked into arrays, to score many feature rows at once (:meth:`scores`): the same
    sums as :func:`tree_score` row by row, bit for bit (the same float64 comparisons, the leaves
    added in tree order), in a few numpy passes instead of a Python loop per node. Ranking a
    problem's ~25 candidates through the ranker's 400 trees took ~6 ms in :func:`tree_score`
    (CPU, 2026-11-29), where the dispatcher routes a call signature's first call."""

    def __init__(self, trees) -> None:
        import numpy as np

        T = len(trees)
        nodes = max((len(t[0]) for t in trees), default=0) or 1
        leaves = max((len(t[4]) for t in trees), default=1)
        cats = [c for t in trees for th in t[1] if isinstance(th, frozenset) for c in th]
        self.ncat = max(cats, default=-1) + 1
        self.feature = np.zeros((T, nodes), np.int64)
        self.threshold = np.full((T, nodes), np.inf)
        self.left = np.full((T, nodes), -1, np.int64)
        self.right = np.full((T, nodes), -1, np.int64)
        self.is_cat = np.zeros((T, nodes), bool)
        self.cat_left = np.zeros((T, nodes, max(self.ncat, 1)), bool)
        self.leaf = np.zeros((T, leaves))
        self.start = np.zeros(T, np.int64)
        for k, (feature, threshold, left, right, leaf) in enumerate(trees):
            n = len(feature)
            if n == 0:
                self.start[k] = -1  # a tree of one leaf
            self.feature[k, :n], self.left[k, :n], self.right[k, :n] = feature, left, right
            self.leaf[k, :len(leaf)] = leaf
            for i, th in enumerate(threshold):
                if isinstance(th, frozenset):
                    self.is_cat[k, i] = True
                    self.cat_left[k, i, sorted(th)] = True
                else:
                    self.threshold[k, i] = th

    def scores(self, X) -> list[float]:
        """The sum of the leaves each row of ``X`` (rows of features) reaches."""
        import numpy as np

        X = np.asarray(X, dtype=np.float64)
        T, nodes = self.feature.shape
        C, F = X.shape if X.ndim == 2 else (0, 0)
        if T == 0 or C == 0:
            return [0.0] * C
        feature, threshold = self.feature.ravel(), self.threshold.ravel()
        left, right, is_cat = self.left.ravel(), self.right.ravel(), self.is_cat.ravel()
        cat_left = self.cat_left.reshape(T * nodes, -1)
        xs = X.ravel()
        tree = np.repeat(np.arange(T), C)  # walk w = (tree w // C, row w % C)
        row = np.tile(np.arange(C), T)
        leaf_of = np.zeros(T * C, np.int64)  # a one-leaf tree's walk ends at once, at leaf 0
        node = np.repeat(self.start, C)
        walking = np.flatnonzero(node >= 0)
        node = tree * nodes + np.maximum(node, 0)  # flat node index
        while walking.size:
            nd = node[walking]
            v = xs[row[walking] * F + feature[nd]]
            go_left = v <= threshold[nd]
            cat = np.flatnonzero(is_cat[nd])
            if cat.size:  # categorical nodes: int(v) in the node's set, for v >= 0
                vc = v[cat]
                member = (vc >= 0) & (vc < self.ncat)
                code = np.where(member, vc, 0).astype(np.int64)
                go_left[cat] = member & cat_left[nd[cat], code]
            child = np.where(go_left, left[nd], right[nd])
            done = child < 0
            leaf_of[walking[done]] = ~child[done]
            walking = walking[~done]
            node[walking] = tree[walking] * nodes + child[~done]
        leaf = self.leaf[tree, leaf_of].reshape(T, C)
        return np.cumsum(leaf, axis=0)[-1].tolist()  # in tree order, as tree_score adds them


class Table:
    """One device's fitted model: per epilogue class, the wave model's coefficients per row; the
    ranker's trees; the fuse gate's trees.

    Attributes:
        device: the GPU it was measured on (``torch.cuda.get_device_name()``).
        sm_count: its multiprocessors.
        coef: class -> wave-model row (:func:`variant_kind`) -> five coefficients.
        members: the member names the ranker's ``member`` feature numbers.
        trees: the ranker's trees, each ``[feature, threshold, left, right, leaf]`` arrays: node
            ``i`` sends ``x`` to ``left[i]`` where ``x[feature[i]] <= threshold[i]`` (or, for a
            categorical feature, where ``int(x[feature[i]])`` is in the list ``threshold[i]``),
            else to ``right[i]``; a child ``c < 0`` is the leaf ``leaf[~c]``.
        gate_trees: the fuse gate's trees (the same arrays over :data:`GATE_FEATURES`), None
            where the table has no gate.
        gate_threshold: the gate's score above which fusing is predicted to pay.
    """

    def __init__(self, data: Mapping) -> None:
        self.device = data["device"]
        self.sm_count = int(data["sm_count"])
        self.coef: dict[str, dict[str, list[float]]] = data["coef"]
        ranker = data["ranker"]
        if tuple(ranker["features"]) != FEATURES:
            raise ValueError(f"the table's ranker was fitted on other features: {ranker['features']}")
        self.members: list[str] = list(ranker["members"])
        self.trees = _parse_trees(ranker["trees"])
        self.forest = Forest(self.trees)
        gate = data.get("gate")
        self.gate_trees = self.gate_threshold = None
        if gate is not None:
            if tuple(gate["features"]) != GATE_FEATURES or list(gate["members"]) != self.members:
                raise ValueError("the table's fuse gate was fitted on other features")
            self.gate_trees = _parse_trees(gate["trees"])
            self.gate_threshold = float(gate["threshold"])

    def wave_model(self, cls: str, spec: KernelSpec, p: Problem) -> float | None:
        """The wave model's log time (ms) of ``spec`` on ``p``, or None where the table has no
        coefficients for its row."""
        coef = self.coef.get(cls, {}).get(variant_kind(spec))
        if coef is None:
            return None
        return math.log(max(predict(coef, features(spec, p)), 1e-6))

    def ranker_score(self, x: Sequence[float]) -> float:
        """The ranker's score of a candidate's :data:`FEATURES` ``x``: higher is faster."""
        return tree_score(self.trees, x)

    def gate_score(self, x: Sequence[float]) -> float:
        """The fuse gate's score (log-odds) of :data:`GATE_FEATURES` ``x``: higher, fusing is
        more likely to beat torch.compile (the table must have a gate)."""
        return tree_score(self.gate_trees, x)


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


def scores(p: Problem, cls: str, candidates: Sequence[KernelSpec], table: Table) -> list[float | None]:
    """The ranker's score of each of ``candidates`` (higher: faster), None where the table has no
    wave-model row for it."""
    base = [table.wave_model(cls, s, p) for s in candidates]
    least = min((b for b in base if b is not None), default=0.0)
    rows = [ranker_features(spec, p, cls, table.members) + [b, b - least]
            for spec, b in zip(candidates, base) if b is not None]
    got = iter(table.forest.scores(rows) if rows else [])
    return [None if b is None else next(got) for b in base]


def rank(p: Problem, cls: str, candidates: Sequence[KernelSpec], table: Table | None) -> list[KernelSpec]:
    """``candidates`` ordered by the ranker's score, best first (their given order among equal
    scores, and where the table has no row for them, after those it ranks)."""
    if table is None:
        return list(candidates)
    scored = [(-s if s is not None else math.inf, i, spec)
              for i, (spec, s) in enumerate(zip(candidates, scores(p, cls, candidates, table)))]
    scored.sort(key=lambda t: (t[0], t[1]))
    return [s for _, _, s in scored]


def fuse_gain(M: int, N: int, K: int, L: int, epilogue_class: str, chosen: KernelSpec | None,
              device: str | None = None) -> float | None:
    """How sure the fuse gate is that the fused evtc Gemm beats torch.compile's own GEMM and
    fused epilogue on this problem (NOTE [The fuse gate]): its score minus its threshold, > 0
    to fuse, <= 0 to leave the match to Inductor; None where it has no answer (no ``device``, a
    device without its own table, or a table without a gate): fusing stays the default.

    Args:
        M, N, K, L: the problem (L the batch, 1 unbatched).
        epilogue_class: ``pointwise``, ``aux`` or ``reduce`` (:func:`epilogue_class` of the
            Gemm's graph).
        chosen: the kernel the Gemm runs the problem on (its ``choose(M, N, K, L, ...)``);
            one the selection model doesn't rank (the unaligned members, the sm80 kernel) or
            None: decided on the problem's features alone.
        device: the GPU's name (``torch.cuda.get_device_name()``).
    """
    if device is None or epilogue_class not in CLASSES:
        return None
    if not any(f.stem.replace("_", " ").lower() in device.lower() for f in TABLES.glob("*.json")):
        return None  # the gate compares with torch.compile on one device: no other's table answers
    table = load_table(device)
    if table is None or table.gate_trees is None:
        return None
    p = Problem(M, N, K, L, True, True, table.sm_count)
    return table.gate_score(gate_features(p, epilogue_class, chosen, table)) - table.gate_threshold


def should_fuse(M: int, N: int, K: int, L: int, epilogue_class: str, chosen: KernelSpec | None,
                device: str | None = None) -> bool:
    """Whether to fuse the match (:func:`fuse_gain` > 0, or True where it has no answer)."""
    gain = fuse_gain(M, N, K, L, epilogue_class, chosen, device)
    return gain is None or gain > 0
