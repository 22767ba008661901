"""benchmarks/corpus (issue 36, item 1): the checked-in problems are what generate.py draws from
models.toml; ids are the hash of the shape; the split is the hash rule; both halves have every
family, model group and token decade; unaligned N and K are there; every problem has a source;
models.toml's layer shapes agree with each model's config fields."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "benchmarks" / "corpus"


def _by_path(name: str, path: Path):
    spec = importlib.util.spec_from_file_location(name, path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


corpus = _by_path("_test_corpus", CORPUS / "__init__.py")
gen = _by_path("_test_corpus_generate", CORPUS / "generate.py")


@pytest.fixture(scope="module")
def problems():
    return corpus.load()


@pytest.fixture(scope="module")
def data():
    return gen.load_models()


def test_checked_in_file_is_the_generators_output():
    drawn = gen.generate()
    text = (CORPUS / "problems.json").read_text(encoding="utf-8")
    assert text == gen.render(drawn), "problems.json is stale: run python benchmarks/corpus/generate.py"
    assert corpus.load() == drawn
    assert corpus.generate() == drawn


def test_models_toml_agrees_with_the_config_fields(data):
    assert gen.check(data) == []
    # and the check catches a wrong shape
    m = dict(data["model"][0])
    m["layers"] = [dict(m["layers"][0], n=m["layers"][0]["n"] + 1)] + m["layers"][1:]
    assert any("wants (N, K)" in e for e in gen.check_model(m, data["tokens"]))


def test_every_model_has_a_source_and_a_check(data):
    for m in data["model"]:
        assert m["source"].strip() and m["checked"].strip(), m["name"]


def test_size(problems):
    assert len(problems) >= 400
    assert sum("random" in p["families"] for p in problems) == gen.RANDOM_COUNT
    assert 500 <= sum("random" not in p["families"] for p in problems) <= 700


def test_ids_are_unique_and_the_hash_of_the_shape(problems):
    ids = [p["id"] for p in problems]
    assert len(set(ids)) == len(ids)
    for p in problems:
        assert p["id"] == corpus.problem_id(p["M"], p["N"], p["K"], p["L"])
        assert len(p["id"]) == 12 and int(p["id"], 16) >= 0
    assert corpus.problem_id(1, 2, 3, 4) == __import__("hashlib").sha256(b"1,2,3,4").hexdigest()[:12]


def test_split_is_the_hash_rule(problems):
    for p in problems:
        assert p["split"] == ("calibration" if int(p["id"], 16) % 2 == 0 else "validation")
    cal, val = corpus.load("calibration"), corpus.load("validation")
    assert len(cal) + len(val) == len(problems) and cal and val
    assert {p["split"] for p in cal} == {"calibration"} and {p["split"] for p in val} == {"validation"}
    with pytest.raises(ValueError):
        corpus.load("test")


@pytest.mark.parametrize("key", ["families", "groups", "decade"])
def test_both_halves_have_each_family_group_and_decade(problems, data, key):
    halves = defaultdict(set)
    for p in problems:
        values = [gen.decade(p["M"])] if key == "decade" else p[key]
        for v in values:
            halves[v].add(p["split"])
    missing = {v: s for v, s in halves.items() if s != set(corpus.SPLITS)}
    assert not missing, f"in one half only: {missing}"
    if key == "families":
        assert set(halves) == set(gen.FAMILIES)
    elif key == "groups":
        assert set(halves) == {m["group"] for m in data["model"]} | {"random"}
    else:
        assert set(halves) == set(gen.DECADES)


def test_unaligned_n_and_k(problems):
    un_n = [p for p in problems if p["N"] % 8]
    un_k = [p for p in problems if p["K"] % 8]
    assert un_n and un_k
    assert all(("unaligned_n" in p["tags"]) == bool(p["N"] % 8) for p in problems)
    assert all(("unaligned_k" in p["tags"]) == bool(p["K"] % 8) for p in problems)
    # real vocabularies that are not multiples of 8, and random ones with only N or only K odd
    assert {50257, 51865, 30522} <= {p["N"] for p in un_n if "random" not in p["families"]}
    assert any(p["N"] % 2 and p["K"] % 8 == 0 for p in problems)
    assert any(p["K"] % 2 and p["N"] % 8 == 0 for p in problems)


def test_every_problem_has_a_source_family_and_group(problems):
    for p in problems:
        assert p["sources"] and all(isinstance(s, str) and s for s in p["sources"]), p
        assert p["families"] and p["groups"], p
        assert p["tags"] == sorted(p["tags"])
        assert p["M"] >= 1 and p["N"] >= 1 and p["K"] >= 1 and p["L"] >= 1


def test_random_set_ranges(problems):
    rand = [p for p in problems if "random" in p["families"]]
    for p in rand:
        assert 1 <= p["M"] <= 16384 and 64 <= p["N"] <= 32768 and 64 <= p["K"] <= 32768
    assert any(p["L"] > 1 and "synthetic" in p["tags"] for p in rand)


def test_every_lm_head_at_small_and_large_token_counts(problems, data):
    ms = defaultdict(set)
    for p in problems:
        if p["L"] == 1:
            ms[(p["N"], p["K"])].add(p["M"])
    for m in data["model"]:
        for layer in m["layers"]:
            if layer["role"] == "lm_head":
                got = ms[(layer["n"], layer["k"])]
                assert any(x <= 16 for x in got) and any(x >= 2048 for x in got), (m["name"], sorted(got))
    vocabs = {layer["n"] for m in data["model"] for layer in m["layers"] if layer["role"] == "lm_head"}
    assert {32000, 50257, 50304, 128256, 151936, 256000, 32128, 51865} <= vocabs


def test_batched_problems(problems):
    real = [p for p in problems if p["L"] > 1 and "random" not in p["families"]]
    assert real and all("moe_expert" in p["tags"] and "batched" in p["tags"] for p in real)


def test_importable_as_a_package_from_the_repository_root():
    r = subprocess.run([sys.executable, "-c", "from benchmarks.corpus import load; print(len(load()))"],
                       cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert int(r.stdout) == len(corpus.load())
