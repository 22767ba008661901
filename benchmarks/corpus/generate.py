"""Rewrite benchmarks/corpus/problems.json from models.toml (issue 36, item 1).

    python benchmarks/corpus/generate.py            # rewrite problems.json, print the counts
    python benchmarks/corpus/generate.py --check    # exit 1 if problems.json is not what this draws
    python benchmarks/corpus/generate.py --markdown # the counts as README tables

Stdlib only (tomllib: Python 3.11+). Deterministic: every random choice comes from a
random.Random seeded with a string naming the seed, the model and the layer, so adding a model
leaves the other models' draws as they were.

The draw (README.md has it in words):
  * every layer of every model: one token count from the lower half of the layer's token list
    and one from the upper half (an LM head: one from M <= 16 and one from M >= 2048);
  * the batched MoE-expert problems of models.toml's [[batched]] tables, all of them;
  * shapes that several (model, layer) pairs share become one problem listing every source;
  * then, for any model group or token decade missing from a split, the group's (or the
    corpus's) next undrawn candidates in draw order until both splits have it;
  * a log-uniform random set of RANDOM_COUNT problems: M in [1, 16384], N and K in
    [64, 32768]; half with N and K multiples of 8, a quarter with neither, a few with only N
    odd, a few with only K odd, and a few batched (L > 1, marked synthetic).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import sys
from collections import Counter, defaultdict

HERE = os.path.dirname(os.path.abspath(__file__))

SEED = 36  # issue 36
RANDOM_COUNT = 100
RANDOM_M = (1, 16384)
RANDOM_NK = (64, 32768)
FAMILIES = ("decoder_lm", "moe", "encoder", "diffusion", "random")
DECADES = ("1-9", "10-99", "100-999", "1000-9999", "10000+")
DECODE_MAX_M = 256  # decoders: M <= 256 is tagged decode, larger M prefill


def _corpus():
    """benchmarks/corpus/__init__.py (for problem_id and split_of), by path."""
    spec = importlib.util.spec_from_file_location("_evtc_corpus", os.path.join(HERE, "__init__.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_c = _corpus()
problem_id, split_of, SPLITS = _c.problem_id, _c.split_of, _c.SPLITS


def decade(M: int) -> str:
    return DECADES[min(len(str(M)) - 1, len(DECADES) - 1)]


# ---------------------------------------------------------------------------------------------
# models.toml
# ---------------------------------------------------------------------------------------------


def load_models(path: str | None = None) -> dict:
    import tomllib

    with open(path or os.path.join(HERE, "models.toml"), "rb") as f:
        return tomllib.load(f)


def expected_nk(m: dict, role: str) -> tuple[int, int] | None:
    """(N, K) a layer of this role must have, from the model's config fields; None for 'other'."""
    h, nh, nkv, hd, f, v = m["hidden"], m["heads"], m["kv_heads"], m["head_dim"], m["ffn"], m["vocab"]
    return {
        "q": (nh * hd, h),
        "kv": (nkv * hd, h),
        "qkv": ((nh + 2 * nkv) * hd, h),
        "o": (h, nh * hd),
        "up": (f, h),
        "gate_up": (2 * f, h),
        "down": (h, f),
        "lm_head": (v, h),
    }.get(role)


ROLES = ("q", "kv", "qkv", "o", "up", "gate_up", "down", "lm_head", "other")
MODEL_KEYS = ("name", "group", "family", "source", "checked", "hidden", "heads", "kv_heads", "head_dim",
              "ffn", "vocab", "causal", "layers")


def check_model(m: dict, default_tokens: list[int]) -> list[str]:
    """What is wrong with one [[model]] table (empty: nothing)."""
    errs = []
    name = m.get("name", "?")
    for key in MODEL_KEYS:
        if key not in m:
            errs.append(f"{name}: no {key}")
    if errs:
        return errs
    if m["family"] not in FAMILIES[:-1]:
        errs.append(f"{name}: family {m['family']!r} is not one of {FAMILIES[:-1]}")
    sets = dict(m.get("token_sets", {}))
    for t in [m.get("tokens", default_tokens), *sets.values()]:
        if not t or sorted(set(t)) != list(t) or not all(1 <= x <= RANDOM_M[1] for x in t):
            errs.append(f"{name}: token list {t} is not increasing, distinct, within 1..{RANDOM_M[1]}")
    names = set()
    for layer in m["layers"]:
        lname, role, n, k = layer.get("name"), layer.get("role"), layer.get("n"), layer.get("k")
        if lname in names:
            errs.append(f"{name}: two layers named {lname!r}")
        names.add(lname)
        if role not in ROLES:
            errs.append(f"{name}/{lname}: role {role!r} is not one of {ROLES}")
        if not (isinstance(n, int) and isinstance(k, int) and n > 0 and k > 0):
            errs.append(f"{name}/{lname}: n and k must be positive integers")
        if "tokens" in layer and layer["tokens"] not in sets:
            errs.append(f"{name}/{lname}: no token set {layer['tokens']!r}")
        want = expected_nk(m, role)
        if want is not None and want != (n, k):
            errs.append(f"{name}/{lname}: role {role} wants (N, K) = {want} from the config fields, has ({n}, {k})")
    if (m["vocab"] > 0) != any(layer.get("role") == "lm_head" for layer in m["layers"]):
        errs.append(f"{name}: vocab {m['vocab']} but {'no' if m['vocab'] else 'an'} lm_head layer")
    return errs


def check(data: dict) -> list[str]:
    errs = []
    seen = set()
    for m in data["model"]:
        errs += check_model(m, data["tokens"])
        if m.get("name") in seen:
            errs.append(f"two models named {m.get('name')!r}")
        seen.add(m.get("name"))
    by_name = {m["name"]: m for m in data["model"]}
    for b in data.get("batched", []):
        m = by_name.get(b["model"])
        if m is None:
            errs.append(f"[[batched]] names no model {b['model']!r}")
            continue
        layer_names = {layer["name"] for layer in m["layers"]}
        errs += [f"[[batched]] {b['model']}: no layer {ln!r}" for ln in b["layers"] if ln not in layer_names]
    return errs


# ---------------------------------------------------------------------------------------------
# The draw
# ---------------------------------------------------------------------------------------------


def _candidate(M, N, K, L, source, family, group, tags):
    return {"M": M, "N": N, "K": K, "L": L, "source": source, "family": family, "group": group, "tags": set(tags)}


def _layer_tags(m: dict, layer: dict, M: int) -> list[str]:
    tags = []
    role = layer["role"]
    if role == "lm_head":
        tags.append("lm_head")
    if m["family"] == "moe" and role in ("up", "gate_up", "down"):
        tags.append("moe_expert")
    if "router" in layer["name"]:
        tags.append("router")
    if m["causal"] and "tokens" not in layer:
        tags.append("decode" if M <= DECODE_MAX_M else "prefill")
    return tags


def _pick(rng: random.Random, pool: list[int], taken: list[int]) -> int | None:
    pool = [t for t in pool if t not in taken]
    return rng.choice(pool) if pool else None


def draw_models(data: dict) -> tuple[list[dict], list[dict]]:
    """(drawn, reserve): the sampled candidates, and every other (layer, tokens) pair in draw order."""
    drawn, reserve = [], []
    for m in data["model"]:
        sets = dict(m.get("token_sets", {}))
        for layer in m["layers"]:
            T = list(sets[layer["tokens"]] if "tokens" in layer else m.get("tokens", data["tokens"]))
            rng = random.Random(f"{SEED}/{m['name']}/{layer['name']}")
            if layer["role"] == "lm_head":
                lower, upper = [t for t in T if t <= 16] or T[:1], [t for t in T if t >= 2048] or T[-1:]
            else:
                lower, upper = T[: len(T) // 2] or T, T[len(T) // 2:]
            chosen: list[int] = []
            for pool in (lower, upper):
                t = _pick(rng, pool, chosen)
                if t is not None:
                    chosen.append(t)
            rest = [t for t in T if t not in chosen]
            rng.shuffle(rest)
            source = f"{m['name']}/{layer['name']}"
            for M in chosen:
                drawn.append(_candidate(M, layer["n"], layer["k"], 1, source, m["family"], m["group"],
                                        _layer_tags(m, layer, M)))
            for M in rest:
                reserve.append(_candidate(M, layer["n"], layer["k"], 1, source, m["family"], m["group"],
                                          _layer_tags(m, layer, M)))
    by_name = {m["name"]: m for m in data["model"]}
    for b in data.get("batched", []):
        m = by_name[b["model"]]
        layers = {layer["name"]: layer for layer in m["layers"]}
        for ln in b["layers"]:
            layer = layers[ln]
            for L, M in b["lm"]:
                drawn.append(_candidate(M, layer["n"], layer["k"], L, f"{m['name']}/{ln} (masked grouped layout)",
                                        m["family"], m["group"], ["batched", "moe_expert", "decode"]))
    return drawn, reserve


def _log_uniform(rng: random.Random, lo: int, hi: int) -> int:
    return max(lo, min(hi, int(round(math.exp(rng.uniform(math.log(lo), math.log(hi)))))))


def _aligned(x: int, lo: int, hi: int) -> int:
    """x rounded to a multiple of 8 within [lo, hi]."""
    return max(lo + (-lo) % 8, min(hi - hi % 8, 8 * round(x / 8)))


def _unaligned(x: int, lo: int, hi: int, odd: bool = False) -> int:
    """x moved (by the least) to a value that is not a multiple of 8 (odd, if asked) within [lo, hi]."""
    for d in (0, 1, -1, 2, -2, 3, -3, 4, -4, 5, -5):
        y = x + d
        if lo <= y <= hi and y % 8 and (not odd or y % 2):
            return y
    raise AssertionError(x)


def draw_random(taken: set[str]) -> list[dict]:
    """RANDOM_COUNT log-uniform problems, none of them a shape already in `taken`."""
    rng = random.Random(f"{SEED}/random")
    # (kind, how many): the order is fixed, so the draw is
    kinds = [("aligned", 50), ("unaligned", 25), ("odd_n", 8), ("odd_k", 7), ("batched", 10)]
    out, ids = [], set(taken)
    lo, hi = RANDOM_NK
    for kind, count in kinds:
        made = 0
        while made < count:
            N, K = _log_uniform(rng, lo, hi), _log_uniform(rng, lo, hi)
            L = 1
            if kind == "batched":
                L = rng.choice([2, 3, 4, 6, 8, 12, 16])
                M = _log_uniform(rng, RANDOM_M[0], RANDOM_M[1] // L)
            else:
                M = _log_uniform(rng, *RANDOM_M)
            if kind in ("aligned", "batched"):
                N, K = _aligned(N, lo, hi), _aligned(K, lo, hi)
            elif kind == "unaligned":
                N, K = _unaligned(N, lo, hi), _unaligned(K, lo, hi)
            elif kind == "odd_n":
                N, K = _unaligned(N, lo, hi, odd=True), _aligned(K, lo, hi)
            else:
                N, K = _aligned(N, lo, hi), _unaligned(K, lo, hi, odd=True)
            pid = problem_id(M, N, K, L)
            if pid in ids:
                continue
            ids.add(pid)
            tags = ["random"] + (["batched", "synthetic"] if L > 1 else [])
            out.append(_candidate(M, N, K, L, f"random/{kind}", "random", "random", tags))
            made += 1
    return out


def _merge(cands: list[dict]) -> dict[str, dict]:
    problems: dict[str, dict] = {}
    for c in cands:
        pid = problem_id(c["M"], c["N"], c["K"], c["L"])
        p = problems.get(pid)
        if p is None:
            p = problems[pid] = {"id": pid, "M": c["M"], "N": c["N"], "K": c["K"], "L": c["L"],
                                 "split": split_of(pid), "families": [], "groups": [], "sources": [], "tags": set()}
        if c["source"] not in p["sources"]:
            p["sources"].append(c["source"])
        for key, val in (("families", c["family"]), ("groups", c["group"])):
            if val not in p[key]:
                p[key].append(val)
        p["tags"] |= c["tags"]
    return problems


def _fill(drawn: list[dict], reserve: list[dict], key) -> None:
    """Add reserve candidates (in order) until every value of key(candidate) present in the draw is
    in both splits."""
    have = defaultdict(set)
    for c in drawn:
        have[key(c)].add(split_of(problem_id(c["M"], c["N"], c["K"], c["L"])))
    for value in sorted(have):
        for want in SPLITS:
            if want in have[value]:
                continue
            for c in reserve:
                if key(c) == value and split_of(problem_id(c["M"], c["N"], c["K"], c["L"])) == want:
                    drawn.append(c)
                    have[value].add(want)
                    break
            else:
                raise AssertionError(f"no candidate puts {value!r} in the {want} split")


def generate(models_path: str | None = None) -> list[dict]:
    """The corpus: a list of problem dicts (see benchmarks/corpus/__init__.py), sorted."""
    data = load_models(models_path)
    errs = check(data)
    if errs:
        raise ValueError("models.toml:\n  " + "\n  ".join(errs))
    drawn, reserve = draw_models(data)
    _fill(drawn, reserve, key=lambda c: c["group"])
    _fill(drawn, reserve, key=lambda c: decade(c["M"]))
    real = _merge(drawn)
    rand = _merge(draw_random(set(real)))
    problems = {**real, **rand}
    order = {f: i for i, f in enumerate(FAMILIES)}
    out = []
    for p in problems.values():
        p["tags"] |= {"unaligned_n"} if p["N"] % 8 else set()
        p["tags"] |= {"unaligned_k"} if p["K"] % 8 else set()
        p["tags"] = sorted(p["tags"])
        p["families"] = sorted(p["families"], key=order.__getitem__)
        p["groups"] = sorted(p["groups"])
        out.append(p)
    out.sort(key=lambda p: (order[p["families"][0]], p["groups"][0], p["sources"][0], p["L"], p["M"], p["N"], p["K"]))
    return out


# ---------------------------------------------------------------------------------------------
# Counts, the file
# ---------------------------------------------------------------------------------------------


def summary(problems: list[dict]) -> dict:
    def per(keyf):
        d = defaultdict(Counter)
        for p in problems:
            for v in keyf(p):
                d[v][p["split"]] += 1
                d[v]["total"] += 1
        return {k: dict(sorted(v.items())) for k, v in sorted(d.items())}

    return {
        "total": len(problems),
        "splits": dict(sorted(Counter(p["split"] for p in problems).items())),
        "families": per(lambda p: p["families"]),
        "groups": per(lambda p: p["groups"]),
        "decades": per(lambda p: [decade(p["M"])]),
        "tags": per(lambda p: p["tags"]),
        "unaligned_n_or_k": sum(1 for p in problems if p["N"] % 8 or p["K"] % 8),
    }


def render(problems: list[dict]) -> str:
    """problems.json's text: a header, then one problem a line (reviewable diffs)."""
    head = {
        "about": "GEMM problems from real models' linear layers plus a log-uniform random set (issue 36, "
                 "item 1). Generated by benchmarks/corpus/generate.py from models.toml; do not edit by hand. "
                 "README.md describes the fields, the draw and the split.",
        "seed": SEED,
        "count": len(problems),
        "summary": summary(problems),
    }
    lines = ["{"]
    for key, val in head.items():
        lines.append(f"  {json.dumps(key)}: {json.dumps(val, sort_keys=False)},")
    lines.append('  "problems": [')
    body = [f"    {json.dumps(p, separators=(', ', ': '))}" for p in problems]
    lines.append(",\n".join(body))
    lines.append("  ]")
    lines.append("}")
    return "\n".join(lines) + "\n"


def _table(title: str, rows: dict) -> str:
    out = [f"| {title} | calibration | validation | total |", "| --- | ---: | ---: | ---: |"]
    for k, v in rows.items():
        out.append(f"| {k} | {v.get('calibration', 0)} | {v.get('validation', 0)} | {v.get('total', 0)} |")
    return "\n".join(out)


def markdown(problems: list[dict]) -> str:
    s = summary(problems)
    fam = {f: s["families"][f] for f in FAMILIES if f in s["families"]}
    dec = {d: s["decades"][d] for d in DECADES if d in s["decades"]}
    tags = {t: s["tags"][t] for t in s["tags"]}
    return "\n\n".join([
        f"{s['total']} problems: {s['splits'].get('calibration', 0)} calibration, "
        f"{s['splits'].get('validation', 0)} validation; {s['unaligned_n_or_k']} with N or K not a multiple of 8.",
        _table("family", fam), _table("group", s["groups"]), _table("M decade", dec), _table("tag", tags),
    ])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="compare problems.json with the draw; exit 1 if it differs")
    ap.add_argument("--markdown", action="store_true", help="print the counts as markdown tables")
    ap.add_argument("--out", default=os.path.join(HERE, "problems.json"))
    args = ap.parse_args(argv)
    problems = generate()
    text = render(problems)
    if args.check:
        with open(args.out, encoding="utf-8") as f:
            same = f.read() == text
        print(f"{args.out}: {'matches' if same else 'DIFFERS FROM'} the generator ({len(problems)} problems)")
        return 0 if same else 1
    if args.markdown:
        print(markdown(problems))
        return 0
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out}")
    print(markdown(problems))
    return 0


if __name__ == "__main__":
    sys.exit(main())
