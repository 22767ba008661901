"""Fixtures of the kernel-cache tests (see cache_helpers.py): a private cache per test and a
session cache of two tiny prebuilt kernels."""

from __future__ import annotations

import os

import pytest

from cache_helpers import CACHE_ENV, REAL_NVCC, tiny_source


@pytest.fixture
def cache_env(tmp_path, monkeypatch):
    """A fresh private cache at ``tmp_path/cache`` and none of the cache's settings inherited."""
    for v in CACHE_ENV:
        monkeypatch.delenv(v, raising=False)
    monkeypatch.setenv("EVTC_CACHE_DIR", str(tmp_path / "cache"))
    from evtc.compiler import fingerprint

    fingerprint.clear()
    yield tmp_path / "cache"
    fingerprint.clear()


@pytest.fixture(scope="session")
def prebuilt(tmp_path_factory):
    """A cache holding the tiny kernels ``a`` and ``b`` for sm80, built once per session;
    tests copy it (:func:`copy_prebuilt`) instead of building again."""
    if REAL_NVCC is None:
        pytest.skip("needs nvcc")
    root = tmp_path_factory.mktemp("prebuilt") / "cache"
    saved = {v: os.environ.pop(v, None) for v in CACHE_ENV}
    os.environ["EVTC_CACHE_DIR"] = str(root)
    try:
        from evtc.compiler import build_many

        res = build_many([(tiny_source("a"), "sm80", "a"), (tiny_source("b"), "sm80", "b")], workers=2)
        for r in res:
            if isinstance(r, Exception):
                raise r
    finally:
        for v, val in saved.items():
            if val is None:
                os.environ.pop(v, None)
            else:
                os.environ[v] = val
    return root


