"""A corpus of GEMM problems from real models (issue 36, item 1): the linear layers of decoder LMs,
MoE experts, encoders and diffusion models at token counts from 1 to 16384, plus a log-uniform
random set; split by a hash into a calibration half and a validation half.

    from benchmarks.corpus import load          # from the repository root
    problems = load("calibration")              # [{"id", "M", "N", "K", "L", "split", ...}, ...]

or, from anywhere, by path::

    spec = importlib.util.spec_from_file_location("corpus", "<repo>/benchmarks/corpus/__init__.py")
    corpus = importlib.util.module_from_spec(spec); spec.loader.exec_module(corpus)

The problems are checked in (problems.json); generate.py rewrites them from models.toml with a
fixed seed, and tests/null/test_corpus.py holds the file to the generator. Stdlib only; README.md
says where the numbers come from and how the sample and the split are drawn.

A problem (a dict):
    id        the first 12 hex digits of sha256("M,N,K,L"): one problem a shape
    M, N, K, L  D[L, M, N] = A[L, M, K] @ B[L, K, N] (L = 1: a plain GEMM)
    split     "calibration" when int(id, 16) is even, else "validation"
    families  coarse kinds of model it comes from: decoder_lm, moe, encoder, diffusion, random
    groups    model families (gpt2, llama, qwen2.5, ..., random)
    sources   "model/layer name" for every (model, layer) that gives this shape (or "random/...")
    tags      decode / prefill (decoders: M <= 256 / M > 256), lm_head, moe_expert, router,
              batched, synthetic, random, unaligned_n / unaligned_k (N or K not a multiple of 8)
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os

HERE = os.path.dirname(os.path.abspath(__file__))
PROBLEMS_JSON = os.path.join(HERE, "problems.json")
MODELS_TOML = os.path.join(HERE, "models.toml")
SPLITS = ("calibration", "validation")

__all__ = ["load", "problem_id", "split_of", "generate", "SPLITS", "PROBLEMS_JSON", "MODELS_TOML"]


def problem_id(M: int, N: int, K: int, L: int = 1) -> str:
    """The stable id of a shape: the first 12 hex digits of sha256 of "M,N,K,L"."""
    return hashlib.sha256(f"{M},{N},{K},{L}".encode()).hexdigest()[:12]


def split_of(pid: str) -> str:
    """The half a problem belongs to, by its id alone (never by hand)."""
    return SPLITS[int(pid, 16) % 2]


def load(split: str | None = None, path: str = PROBLEMS_JSON) -> list[dict]:
    """The checked-in problems (all, or one split's), in the file's order."""
    if split is not None and split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS} or None, not {split!r}")
    with open(path, encoding="utf-8") as f:
        problems = json.load(f)["problems"]
    return [p for p in problems if split is None or p["split"] == split]


def _generator():
    spec = importlib.util.spec_from_file_location("_evtc_corpus_generate", os.path.join(HERE, "generate.py"))
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def generate() -> list[dict]:
    """The problems as generate.py draws them from models.toml now (needs tomllib: Python 3.11+)."""
    return _generator().generate()
