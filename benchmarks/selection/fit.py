"""Fit the selection model (NOTE [The selection model], evtc/dispatch/select.py) on the calibration
half of the ground truth, write the device's table into the package, and report it on both
halves side by side (the validation half is used for nothing else).

    python benchmarks/selection/fit.py benchmarks/ground_truth/H200.json \\
        --table evtc/dispatch/tables/H200.json --report benchmarks/selection/H200_report.json \\
        --plot docs/img/selection_H200.png

A dev-only script: scipy fits the wave model's coefficients (robust least squares on log time);
the package evaluates the table in plain Python.

What it reports, per half and epilogue class, over the problems whose rows TMA can address
(the unaligned ones take the staging route, whose own cost model decides; they are reported
apart): the chosen candidate's time / the fastest candidate's (geomean, share within 1.05 and
1.15, the worst), the same for the best of the model's top 4 (what ``autotune`` times), and
how many problems the choice leaves slower than eager unfused or torch.compile default (each
measured in the same run); and the chosen time / cuBLAS's plain GEMM, with and without the
problems where cuBLAS itself falls off the unaligned cliff (slower than 2x the model of its own
aligned neighbour: here, N or K not a multiple of 8).
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


def fit(rows, split, graphs, sms):
    """Coefficients per (class, row of the wave model) and the calibration residuals."""
    import numpy as np
    from scipy.optimize import least_squares

    from evtc.dispatch import select
    from evtc.family.spec import Problem

    samples = collections.defaultdict(list)  # (class, kind) -> [(features, ms)]
    specs_of = {}
    for r in rows:
        if split[r["id"]] != "calibration":
            continue
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
    table_rows = collections.defaultdict(list)
    for r in rows:
        key = (r["id"], r["epilogue"])
        if key not in specs_of:
            continue
        specs = specs_of[key]
        p = Problem(r["M"], r["N"], r["K"], r["L"], True, True, sms)
        residuals = {}
        for lab, ms in r["ms"].items():
            kind = select.variant_kind(specs[lab]) if lab in specs else None
            if lab in BASELINES or not ms or kind not in coef[r["epilogue"]]:
                continue
            pred = select.predict(coef[r["epilogue"]][kind], select.features(specs[lab], p))
            residuals[lab] = round(math.log(ms) - math.log(pred), 3)
        table_rows[r["epilogue"]].append([r["M"], r["N"], r["K"], r["L"], residuals])
    return dict(coef), dict(table_rows)


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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("ground_truth")
    ap.add_argument("--table", required=True)
    ap.add_argument("--report")
    ap.add_argument("--plot")
    ap.add_argument("-k", type=int, default=8)
    args = ap.parse_args()
    from benchmarks import corpus
    from evtc.dispatch import select

    split = {p["id"]: p["split"] for p in corpus.load()}
    gt = json.loads(Path(args.ground_truth).read_text())
    sms = gt["sm_count"]
    rows = gt["rows"]
    graphs = _graphs()
    aligned_rows = [r for r in rows if r["N"] % 8 == 0 and r["K"] % 8 == 0]
    coef, table_rows = fit(aligned_rows, split, graphs, sms)
    data = {"device": gt["device"], "sm_count": sms, "k": args.k, "date": gt.get("date"),
            "source": f"{Path(args.ground_truth).name}: the calibration half of benchmarks/corpus "
                      "(fit by benchmarks/selection/fit.py)",
            "coef": coef, "rows": table_rows}
    Path(args.table).parent.mkdir(parents=True, exist_ok=True)
    Path(args.table).write_text(json.dumps(data, separators=(",", ":"), sort_keys=True) + "\n")
    table = select.Table(data)
    res = evaluate(rows, split, graphs, table, sms)
    report = {"device": gt["device"], "halves": {f"{h}/{c}": summary(v) for (h, c), v in sorted(res.items())}}
    for key, s in report["halves"].items():
        print(f"{key:22s} n={s['aligned']:3d}  chosen/best gm {s['chosen_over_best_gm']:.3f}  "
              f"<=1.05 {100 * s['within_1.05']:.1f}%  <=1.15 {100 * s['within_1.15']:.1f}%  worst {s['worst']:.2f} | "
              f"top{TOP} <=1.02 {100 * s['top4_within_1.02']:.1f}% worst {s['top4_worst']:.2f} | heuristic gm "
              f"{s['heuristic_over_best_gm']:.3f} <=1.05 {100 * s['heuristic_within_1.05']:.1f}% | "
              f">eager {s['slower_than_eager']} >compile {s['slower_than_compile']} (best>compile "
              f"{s['best_slower_than_compile']}) | /cuBLAS {s['over_cublas_gm']:.3f} "
              f"(aligned {s['over_cublas_gm_aligned_only']:.3f})")
    if args.report:
        report["problems"] = {f"{h}/{c}": v for (h, c), v in sorted(res.items())}
        Path(args.report).write_text(json.dumps(report, indent=1) + "\n")
    if args.plot:
        plot(res, args.plot, gt["device"])


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
