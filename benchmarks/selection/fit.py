"""Fit the selection model (NOTE [The selection model], evtc/dispatch/select.py) on the calibration
half of the ground truth, write the device's table into the package, and report it on both
halves side by side (the validation half is used for nothing else).

    python benchmarks/selection/fit.py benchmarks/ground_truth/H200.json \\
        --table evtc/dispatch/tables/H200.json --report benchmarks/selection/H200_report.json \\
        --plot docs/img/selection_H200.png [--cv 5]
    python benchmarks/selection/fit.py benchmarks/ground_truth/H200.json \
        --table evtc/dispatch/tables/H200.json --report benchmarks/selection/H200_report.json --evaluate-only

``--evaluate-only`` refits nothing: it evaluates the shipped table with the current candidate
space (after a change to :func:`evtc.dispatch.space.candidates`) and rewrites the report's
calibration and validation figures; the cross-validated ones (``calibration_cv``, the gate's
too) describe the fit and are kept from the report as the last fit wrote them.

A dev-only script: scipy fits the wave model's coefficients (robust least squares on log time),
LightGBM (``pip install lightgbm``; 4.7.0 here) the ranker's trees (lambdarank, one thread,
deterministic) and the fuse gate's (NOTE [The fuse gate]: binary, from the calibration half's
out-of-fold choices of 5 folds); the package evaluates the table in plain Python.

What it reports, per half and epilogue class, over the problems whose rows TMA can address
(the unaligned ones take the staging route, whose own cost model decides; they are reported
apart): the chosen candidate's time / the fastest candidate's (geomean, share within 1.05 and
1.15, the worst), the same for the best of the model's top 4 (what ``autotune`` times), and
how many problems the choice leaves slower than eager unfused or torch.compile default (each
measured in the same run); and the chosen time / cuBLAS's plain GEMM, with and without the
problems where cuBLAS itself falls off the unaligned cliff (slower than 2x the model of its own
aligned neighbour: here, N or K not a multiple of 8). The calibration half's figures are
in-sample; ``--cv k`` adds them cross-validated (``calibration_cv``: each of k folds of the
calibration problems, by a hash of the problem, chosen by a model fitted on the other folds),
the estimate of the validation figures that choices of features and settings were made on.

The fuse gate (``gate`` in the report), per half and class, over every problem: the decided time
(the chosen kernel's where the gate fuses, torch.compile's where it does not) / the faster of
the two (geomean), how many problems it leaves more than 5 % (and at all) slower than
torch.compile, how many it leaves unfused, beside fusing always; cross-validated on the
calibration half (each fold decided by a gate fitted on the other folds) and on the validation
half (the shipped table).
"""

from __future__ import annotations

import argparse
import collections
import json
import math
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

BASELINES = ("cublas", "eager", "compile", "evtc")
TOP = 4  # the model's top candidates autotune times


def _graphs():
    import ground_truth as gt

    from evtc import bf16

    out = {}
    for name, ep in gt.EPILOGUES.items():
        import evtc

        g = evtc.Gemm(ep, a=bf16, b=bf16, c=bf16, d=bf16)
        out[name] = g
    return out


def _specs(g, row, sms, members):
    """label -> KernelSpec of the candidates of ``row``'s problem (as the ground truth names them)."""
    from evtc import bf16
    from evtc.dispatch import space
    from evtc.family.spec import EpilogueTraits, Problem

    p = Problem(row["M"], row["N"], row["K"], row["L"], True, True, sms)
    return {space.label(s): s for s in space.candidates(p, EpilogueTraits.of(g.graph), g.graph, bf16, bf16,
                                                        members=members)}


#: the ranker's relevance grades by time / the fastest candidate's (NOTE [The selection model])
GRADES = (1.02, 1.05, 1.15)
#: LightGBM's settings of the ranker (chosen by 5-fold cross-validation on the calibration half)
RANKER = dict(objective="lambdarank", lambdarank_truncation_level=5, label_gain=[0, 1, 3, 7], learning_rate=0.05,
              num_leaves=31, min_data_in_leaf=20, num_threads=1, deterministic=True, force_row_wise=True, seed=0,
              verbose=-1)
ROUNDS = 400


def grade(ratio):
    """3, 2, 1 or 0: within each of :data:`GRADES` of the fastest, or slower."""
    return sum(ratio <= g for g in GRADES)


def fit(rows, split, graphs, sms, half="calibration"):
    """The table's coefficients per (class, row of the wave model) and the ranker's trees, from
    the rows of ``split``'s ``half`` (``split``: problem id -> half)."""
    import numpy as np
    from scipy.optimize import least_squares

    from evtc.dispatch import select
    from evtc.family.spec import Problem

    samples = collections.defaultdict(list)  # (class, kind) -> [(features, ms)]
    specs_of, row_of = {}, {}
    for r in rows:
        if split[r["id"]] != half:
            continue
        row_of[(r["id"], r["epilogue"])] = r
        specs = specs_of[(r["id"], r["epilogue"])] = _specs(graphs[r["epilogue"]], r, sms, "trial")
        p = Problem(r["M"], r["N"], r["K"], r["L"], True, True, sms)
        for lab, ms in r["ms"].items():
            if lab in BASELINES or not ms or lab not in specs:
                continue
            samples[(r["epilogue"], select.variant_kind(specs[lab]))].append((select.features(specs[lab], p), ms))
    coef = collections.defaultdict(dict)
    for (cls, kind), pts in sorted(samples.items()):
        X = np.array([f for f, _ in pts])
        y = np.log(np.array([t for _, t in pts]))

        def res(c, X=X, y=y):
            a, b, cc, d, e = np.abs(c)
            return np.log(np.maximum(a + b * X[:, 0] + cc * X[:, 1] + d * X[:, 2], e * X[:, 3])) - y

        sol = least_squares(res, x0=[0.005, 0.001, 0.001, 0.001, 0.0003], loss="soft_l1", f_scale=0.1)
        coef[cls][kind] = [float(f"{abs(x):.6g}") for x in sol.x]
    coef = dict(coef)
    members = sorted({s.name for specs in specs_of.values() for s in specs.values()})
    shell = select.Table({"device": "-", "sm_count": sms, "coef": coef,
                          "ranker": {"features": select.FEATURES, "members": members, "trees": []}})
    X, y, groups = [], [], []
    for (pid, cls), specs in specs_of.items():
        r = row_of[(pid, cls)]
        p = Problem(r["M"], r["N"], r["K"], r["L"], True, True, sms)
        runtime = {lab for lab in _specs(graphs[cls], r, sms, None) if r["ms"].get(lab)}
        base = {lab: shell.wave_model(cls, s, p) for lab, s in specs.items() if r["ms"].get(lab)}
        base = {lab: b for lab, b in base.items() if b is not None}
        least = min(base[lab] for lab in runtime if lab in base)
        best = min(r["ms"][lab] for lab in runtime)
        for lab, b in sorted(base.items()):
            X.append(select.ranker_features(specs[lab], p, cls, members) + [b, b - least])
            y.append(grade(r["ms"][lab] / best))
        groups.append(len(base))
    return coef, ranker(np.array(X), np.array(y), groups, members)


def ranker(X, y, groups, members):
    """The ranker's table entry: LightGBM's lambdarank trees as arrays (select.Table.trees)."""
    import lightgbm as lgb

    from evtc.dispatch import select

    cat = [select.FEATURES.index(f) for f in select.CATEGORICAL]
    model = lgb.train(RANKER, lgb.Dataset(X, y, group=groups, categorical_feature=cat,
                                          feature_name=list(select.FEATURES)), num_boost_round=ROUNDS)
    table = {"features": list(select.FEATURES), "members": members, "grades": list(GRADES), "trees": trees_of(model)}
    # the arrays give LightGBM's own scores
    check = select.Table({"device": "-", "sm_count": 1, "coef": {}, "ranker": table})
    got = [check.ranker_score(list(x)) for x in X[:2000]]
    want = model.predict(X[:2000])
    assert max(abs(g - w) for g, w in zip(got, want)) < 1e-6, "the exported trees disagree with LightGBM"
    return table


def trees_of(model):
    """A LightGBM model's trees as the arrays :func:`evtc.dispatch.select.tree_score` walks."""
    trees = []
    for info in model.dump_model()["tree_info"]:
        feature, threshold, left, right, leaf = [], [], [], [], []

        def walk(n):
            if "leaf_index" in n or "leaf_value" in n:
                leaf.append(n["leaf_value"])
                return ~(len(leaf) - 1)
            i = len(feature)
            # no feature is ever missing; a category outside a split's set goes right, as in the walker
            assert n["missing_type"] in ("None", None) or (n["decision_type"] == "==" and not n["default_left"]), n
            feature.append(n["split_feature"])
            if n["decision_type"] == "==":
                threshold.append(sorted(int(c) for c in str(n["threshold"]).split("||")))
            else:
                assert n["decision_type"] == "<=", n
                threshold.append(n["threshold"])
            left.append(None)
            right.append(None)
            left[i] = walk(n["left_child"])
            right[i] = walk(n["right_child"])
            return i

        root = walk(info["tree_structure"])
        if root < 0:  # a tree of one leaf
            feature, threshold, left, right = [0], [math.inf], [root], [root]
        trees.append([feature, threshold, left, right, leaf])
    return trees


def evaluate(rows, split, graphs, table, sms):
    """Per (half, class): the chosen / fastest ratios and the comparisons of the module docstring."""
    from evtc.dispatch import select
    from evtc.family.spec import Problem

    out = collections.defaultdict(list)
    for r in rows:
        g = graphs[r["epilogue"]]
        ms = r["ms"]
        aligned = r["N"] % 8 == 0 and r["K"] % 8 == 0
        item = {"id": r["id"], "shape": [r["M"], r["N"], r["K"], r["L"]], "aligned": aligned,
                "cublas": ms["cublas"], "eager": ms.get("eager"), "compile": ms.get("compile"),
                "heuristic": ms.get("evtc")}
        if aligned:
            specs = _specs(g, r, sms, None)  # what the runtime ranks: the family and its cluster-less variants
            timed = {lab: s for lab, s in specs.items() if ms.get(lab)}
            p = Problem(r["M"], r["N"], r["K"], r["L"], True, True, sms)
            order = [select_label(s) for s in select.rank(p, r["epilogue"], list(timed.values()), table)]
            best = min(ms[lab] for lab in timed)
            item.update(chosen=ms[order[0]], pick=order[0], best=best, top=min(ms[lab] for lab in order[:TOP]),
                        best_label=min(timed, key=lambda lab: ms[lab]))
        else:  # the staging route's own choice (the family Gemm's call), and the unaligned members
            cands = [v for k, v in ms.items() if k not in BASELINES and v] + [ms["evtc"]]
            item.update(chosen=ms["evtc"], pick="route", best=min(cands), top=ms["evtc"], best_label="-")
        out[(split[r["id"]], r["epilogue"])].append(item)
    return out


def select_label(spec):
    from evtc.dispatch.space import label

    return label(spec)


def gm(xs):
    xs = [x for x in xs if x and x == x]
    return math.exp(sum(map(math.log, xs)) / len(xs)) if xs else float("nan")


def summary(items):
    al = [i for i in items if i["aligned"]]
    r = [i["chosen"] / i["best"] for i in al]
    t = [i["top"] / i["best"] for i in al]
    return {
        "problems": len(items), "aligned": len(al),
        "chosen_over_best_gm": gm(r), "within_1.05": sum(x <= 1.05 for x in r) / max(len(r), 1),
        "within_1.15": sum(x <= 1.15 for x in r) / max(len(r), 1), "worst": max(r, default=float("nan")),
        "top4_over_best_gm": gm(t), "top4_within_1.02": sum(x <= 1.02 for x in t) / max(len(t), 1),
        "top4_worst": max(t, default=float("nan")),
        "heuristic_over_best_gm": gm([i["heuristic"] / i["best"] for i in al]),
        "heuristic_within_1.05": sum(i["heuristic"] / i["best"] <= 1.05 for i in al) / max(len(al), 1),
        "slower_than_eager": sum(1 for i in items if i["eager"] and i["chosen"] > i["eager"]),
        "slower_than_compile": sum(1 for i in items if i["compile"] and i["chosen"] > i["compile"]),
        "best_slower_than_compile": sum(1 for i in items if i["compile"] and i["best"] > i["compile"]),
        "over_cublas_gm": gm([i["chosen"] / i["cublas"] for i in items]),
        "over_cublas_gm_aligned_only": gm([i["chosen"] / i["cublas"] for i in al]),
    }


def fold(problem_id, k):
    """The cross-validation fold of a problem: by its hash, past the bit that splits the halves."""
    return (int(problem_id, 16) >> 1) % k


def out_of_fold(rows, aligned_rows, split, graphs, sms, k):
    """Each calibration (problem, class) chosen by a table fitted on the other k - 1 folds of the
    calibration half (the validation half is not read): [(class, evaluate's item, that table)]."""
    from evtc.dispatch import select

    out = []
    cal = [r for r in rows if split[r["id"]] == "calibration"]
    for i in range(k):
        train = {pid: ("calibration" if h == "calibration" and fold(pid, k) != i else "-") for pid, h in split.items()}
        coef, ranker_table = fit(aligned_rows, train, graphs, sms)
        table = select.Table({"device": "-", "sm_count": sms, "coef": coef, "ranker": ranker_table})
        held = [r for r in cal if fold(r["id"], k) == i]
        for (_, cls), items in evaluate(held, {r["id"]: "calibration_cv" for r in held}, graphs, table, sms).items():
            out += [(cls, item, table) for item in items]
    return out


def cross_validate(oof):
    """Per ("calibration_cv", class): the items of :func:`out_of_fold`."""
    out = collections.defaultdict(list)
    for cls, item, _ in oof:
        out[("calibration_cv", cls)].append(item)
    return out


#: the fuse gate's settings (NOTE [The fuse gate] in evtc/dispatch/select.py; chosen by 5-fold
#: cross-validation on the calibration half): a binary classifier of "the chosen kernel is
#: faster than torch.compile", each (problem, class) weighted by |log(chosen / compile)| + 0.01,
#: so that its log-odds weigh what a wrong decision costs in the geomean
GATE = dict(objective="binary", learning_rate=0.05, num_leaves=15, min_data_in_leaf=20, num_threads=1,
            deterministic=True, force_row_wise=True, seed=0, verbose=-1)
GATE_ROUNDS = 300
#: the log-odds above which the gate fuses (p > 0.82): in cross-validation, 0-2 gave the same
#: geomean within 0.2 %; 1.5 leaves fewer problems slower than torch.compile than 0 does
GATE_THRESHOLD = 1.5
#: the folds of the out-of-fold choices the gate learns from (and is cross-validated on)
GATE_FOLDS = 5


def gate_samples(entries, rows, graphs, sms):
    """The gate's features of each (class, item, table) of ``entries`` (the item's chosen kernel,
    the features by that table) and log(chosen / torch.compile)."""
    import numpy as np

    from evtc.dispatch import select
    from evtc.family.spec import Problem

    row_of = {(r["id"], r["epilogue"]): r for r in rows}
    X, z = [], []
    for cls, item, table in entries:
        r = row_of[(item["id"], cls)]
        p = Problem(r["M"], r["N"], r["K"], r["L"], True, True, sms)
        chosen = _specs(graphs[cls], r, sms, None)[item["pick"]] if item["aligned"] else None
        X.append(select.gate_features(p, cls, chosen, table))
        z.append(math.log(item["chosen"] / item["compile"]))
    return np.array(X), np.array(z)


def fit_gate(X, z, members):
    """The gate's table entry: LightGBM's binary trees (NOTE [The fuse gate]) as arrays."""
    import lightgbm as lgb
    import numpy as np

    from evtc.dispatch import select

    cat = [select.GATE_FEATURES.index(f) for f in select.CATEGORICAL]
    model = lgb.train(GATE, lgb.Dataset(X, (z < 0).astype(int), weight=np.abs(z) + 0.01, categorical_feature=cat,
                                        feature_name=list(select.GATE_FEATURES)), num_boost_round=GATE_ROUNDS)
    gate = {"features": list(select.GATE_FEATURES), "members": members, "threshold": GATE_THRESHOLD,
            "trees": trees_of(model)}
    trees = select.Table({"device": "-", "sm_count": 1, "coef": {},
                          "ranker": {"features": select.FEATURES, "members": members, "trees": []},
                          "gate": gate}).gate_trees
    got = [select.tree_score(trees, list(x)) for x in X]
    want = model.predict(X, raw_score=True)
    assert max(abs(g - w) for g, w in zip(got, want)) < 1e-6, "the exported gate disagrees with LightGBM"
    return gate


def gate_summary(items, fuse):
    """The gate's figures over ``items`` (evaluate's) decided by ``fuse`` (the chosen kernel where
    True, torch.compile where False), beside always fusing."""
    def figures(dec):
        return {"decided_over_faster_gm": gm([d / min(i["chosen"], i["compile"]) for d, i in zip(dec, items)]),
                "slower_than_compile_by_5pc": sum(d > 1.05 * i["compile"] for d, i in zip(dec, items)),
                "slower_than_compile": sum(d > i["compile"] for d, i in zip(dec, items))}
    gate = figures([i["chosen"] if f else i["compile"] for i, f in zip(items, fuse)])
    return {"problems": len(items), "unfused": sum(not f for f in fuse), "gate": gate,
            "always_fuse": figures([i["chosen"] for i in items])}


def gate_report(oof, val, rows, graphs, sms, table):
    """The gate cross-validated on the calibration half (each fold's problems decided by a gate
    fitted on the other folds' out-of-fold choices) and on the validation half (the shipped table,
    its gate fitted on every calibration fold): per half and class, :func:`gate_summary`."""
    from evtc.dispatch import select

    X, z = gate_samples(oof, rows, graphs, sms)
    folds = [fold(item["id"], GATE_FOLDS) for _, item, _ in oof]
    score = [0.0] * len(oof)
    for i in range(GATE_FOLDS):
        train = [j for j, f in enumerate(folds) if f != i]
        trees = select._parse_trees(fit_gate(X[train], z[train], table.members)["trees"])
        for j, f in enumerate(folds):
            if f == i:
                score[j] = select.tree_score(trees, list(X[j]))
    out = {}
    for cls in select.CLASSES:
        idx = [j for j, (c, _, _) in enumerate(oof) if c == cls]
        out[f"calibration_cv/{cls}"] = gate_summary([oof[j][1] for j in idx], [score[j] > GATE_THRESHOLD for j in idx])
        entries = [(cls, item, table) for item in val[cls]]
        Xv, _ = gate_samples(entries, rows, graphs, sms)
        fuse = [table.gate_score(list(x)) > table.gate_threshold for x in Xv]
        out[f"validation/{cls}"] = gate_summary(val[cls], fuse)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ground_truth")
    ap.add_argument("--table", required=True)
    ap.add_argument("--report")
    ap.add_argument("--plot")
    ap.add_argument("--evaluate-only", action="store_true",
                    help="no fit: evaluate the shipped --table with today's candidates, keep the report's CV figures")
    ap.add_argument("--cv", type=int, default=0, metavar="K",
                    help="also report K-fold cross-validated figures of the calibration half")
    args = ap.parse_args()
    from benchmarks import corpus
    from evtc.dispatch import select

    split = {p["id"]: p["split"] for p in corpus.load()}
    gt = json.loads(Path(args.ground_truth).read_text())
    sms = gt["sm_count"]
    rows = gt["rows"]
    graphs = _graphs()
    aligned_rows = [r for r in rows if r["N"] % 8 == 0 and r["K"] % 8 == 0]
    if args.evaluate_only:
        evaluate_only(args, rows, split, graphs, sms)
        return
    coef, ranker_table = fit(aligned_rows, split, graphs, sms)
    # the gate learns from the calibration half's out-of-fold choices: what the model chooses
    # on problems it was not fitted on
    oof = out_of_fold(rows, aligned_rows, split, graphs, sms, GATE_FOLDS)
    X, z = gate_samples(oof, rows, graphs, sms)
    data = {"device": gt["device"], "sm_count": sms, "date": gt.get("date"),
            "source": f"{Path(args.ground_truth).name}: the calibration half of benchmarks/corpus "
                      "(fit by benchmarks/selection/fit.py)",
            "coef": coef, "ranker": ranker_table, "gate": fit_gate(X, z, ranker_table["members"])}
    Path(args.table).parent.mkdir(parents=True, exist_ok=True)
    Path(args.table).write_text(json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n")
    table = select.Table(data)
    res = evaluate(rows, split, graphs, table, sms)
    if args.cv:
        res.update(cross_validate(oof if args.cv == GATE_FOLDS else
                                  out_of_fold(rows, aligned_rows, split, graphs, sms, args.cv)))
    report = {"device": gt["device"], "halves": {f"{h}/{c}": summary(v) for (h, c), v in sorted(res.items())}}
    for key, s in report["halves"].items():
        print(f"{key:25s} n={s['aligned']:3d}  chosen/best gm {s['chosen_over_best_gm']:.3f}  "
              f"<=1.05 {100 * s['within_1.05']:.1f}%  <=1.15 {100 * s['within_1.15']:.1f}%  worst {s['worst']:.2f} | "
              f"top{TOP} <=1.02 {100 * s['top4_within_1.02']:.1f}% worst {s['top4_worst']:.2f} | heuristic gm "
              f"{s['heuristic_over_best_gm']:.3f} <=1.05 {100 * s['heuristic_within_1.05']:.1f}% | "
              f">eager {s['slower_than_eager']} >compile {s['slower_than_compile']} (best>compile "
              f"{s['best_slower_than_compile']}) | /cuBLAS {s['over_cublas_gm']:.3f} "
              f"(aligned {s['over_cublas_gm_aligned_only']:.3f})")
    report["gate"] = gate_report(oof, {c: res[("validation", c)] for c in select.CLASSES}, rows, graphs, sms, table)
    for key, g in report["gate"].items():
        a, b = g["gate"], g["always_fuse"]
        print(f"gate {key:25s} n={g['problems']:3d}  decided/faster gm {a['decided_over_faster_gm']:.4f} "
              f">compile+5% {a['slower_than_compile_by_5pc']:3d} unfused {g['unfused']:3d} | always fuse "
              f"{b['decided_over_faster_gm']:.4f} >compile+5% {b['slower_than_compile_by_5pc']:3d}")
    if args.report:
        report["problems"] = {f"{h}/{c}": v for (h, c), v in sorted(res.items()) if h != "calibration_cv"}
        Path(args.report).write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        plot(res, args.plot, gt["device"])


def evaluate_only(args, rows, split, graphs, sms) -> None:
    """``--evaluate-only``: the shipped table evaluated again (see the module docstring)."""
    from evtc.dispatch import select

    table = select.Table(json.loads(Path(args.table).read_text()))
    res = evaluate(rows, split, graphs, table, sms)
    old = json.loads(Path(args.report).read_text()) if args.report and Path(args.report).exists() else {}
    halves = {k: v for k, v in old.get("halves", {}).items() if k.startswith("calibration_cv/")}
    halves.update({f"{h}/{c}": summary(v) for (h, c), v in sorted(res.items())})
    gate = {k: v for k, v in old.get("gate", {}).items() if k.startswith("calibration_cv/")}
    for cls in select.CLASSES:
        val = res[("validation", cls)]
        Xv, _ = gate_samples([(cls, item, table) for item in val], rows, graphs, sms)
        gate[f"validation/{cls}"] = gate_summary(val, [table.gate_score(list(x)) > table.gate_threshold for x in Xv])
    report = {"device": old.get("device", table.device if hasattr(table, "device") else None),
              "halves": dict(sorted(halves.items())), "gate": dict(sorted(gate.items())),
              "problems": {f"{h}/{c}": v for (h, c), v in sorted(res.items())}}
    for key, s in report["halves"].items():
        print(f"{key:25s} chosen/best gm {s['chosen_over_best_gm']:.4f}  <=1.05 {100 * s['within_1.05']:.1f}%  "
              f"<=1.15 {100 * s['within_1.15']:.1f}%  worst {s['worst']:.2f}  top{TOP} <=1.02 "
              f"{100 * s['top4_within_1.02']:.1f}%")
    for key, g in report["gate"].items():
        print(f"gate {key:25s} decided/faster gm {g['gate']['decided_over_faster_gm']:.4f} "
              f">compile+5% {g['gate']['slower_than_compile_by_5pc']}")
    if args.report:
        Path(args.report).write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        plot(res, args.plot, report["device"])


def plot(res, path, device):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for (half, cls), items in sorted(res.items()):
        if half != "validation":
            continue
        r = sorted(i["chosen"] / i["best"] for i in items if i["aligned"])
        ax1.step(r, [(j + 1) / len(r) for j in range(len(r))], where="post", label=cls)
        e = sorted(i["chosen"] / i["eager"] for i in items if i["eager"])
        ax2.plot(range(len(e)), e, ".", ms=3, label=cls)
    ax1.axvline(1.05, color="gray", ls=":")
    ax1.set_xlim(1.0, 1.5)
    ax1.set_xlabel("chosen / fastest candidate")
    ax1.set_ylabel("share of validation problems")
    ax1.set_title(f"the selection model on the validation half ({device})")
    ax1.legend()
    ax2.axhline(1.0, color="gray", ls=":")
    ax2.set_yscale("log")
    ax2.set_xlabel("validation problems, sorted")
    ax2.set_ylabel("evtc (chosen) / eager unfused")
    ax2.legend()
    fig.tight_layout()
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


if __name__ == "__main__":
    main()
