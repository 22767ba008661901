"""A kernel built on the CPU machine (nvcc, no GPU), exported there with ``evtc cache export``,
carried to the GPU machine and imported with ``evtc cache import`` into an empty cache, on a
machine told it has no nvcc (``EVTC_NVCC=none``): the family Gemm finds it, checks it, loads it
and computes the float64 reference's result (issue 12, "a portable kernel cache"). Any rebuild
would need nvcc and fail, so passing proves the imported kernel ran.

Make the archive on the CPU machine (docs/testing.md):

    python benchmarks/pack_cache.py host -o .carry/portable.tar.xz   # bench_host.py's members, bias_relu's among them

and run with ``EVTC_PORTABLE_ARCHIVE=.carry/portable.tar.xz``.
"""

import os
import subprocess
import sys

import pytest

import evtc
from evtc import bf16

from conftest_gpu import assert_matches

ARCHIVE = os.environ.get("EVTC_PORTABLE_ARCHIVE")

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not ARCHIVE, reason="EVTC_PORTABLE_ARCHIVE names no archive exported on the CPU "
                                                     "machine (see this module's docstring)")]


def test_a_kernel_built_without_a_gpu_runs_here_without_nvcc(tmp_path, monkeypatch, record_errors):
    import epilogues as E

    cache = tmp_path / "cache"
    cache.mkdir(mode=0o700)
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVTC_")}
    env.update(EVTC_CACHE_DIR=str(cache), EVTC_NVCC="none", PYTHONPATH=os.pathsep.join(sys.path))
    p = subprocess.run([sys.executable, "-m", "evtc", "cache", "import", ARCHIVE], env=env, capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    monkeypatch.setenv("EVTC_CACHE_DIR", str(cache))
    monkeypatch.setenv("EVTC_NVCC", "none")
    monkeypatch.setenv("EVTC_TORCH_FASTPATH", "0")  # its extension would need a compiler too
    g = evtc.Gemm(E.REFERENCE["bias_relu"], a=bf16, b=bf16, c=bf16, d=bf16)
    for shape in ((256, 256, 256, 1), (200, 312, 256, 1)):  # the member bench_host.py's shape picks
        assert g.choose(*shape[:3]).name == g.choose(256, 256, 256).name
        assert_matches(g, shape, seed=sum(shape), what="imported", record_errors=record_errors)
