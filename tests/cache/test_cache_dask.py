"""build_many on executors other than the local thread pool: Dask's distributed scheduler (a
LocalCluster with two worker processes) and a ProcessPoolExecutor. The workers compile and
send the library back; this process verifies it and installs it in its own cache."""

from __future__ import annotations

import concurrent.futures
import dataclasses
import os

import pytest

from cache_helpers import copy_prebuilt, copying_nvcc, loaded_tag, needs_nvcc, prebuilt_library, tiny_source
from evtc.compiler import BuildJob, build_many, lookup
from evtc.compiler import cache as cache_mod
from evtc.errors import BuildError

pytestmark = needs_nvcc


def test_dask_local_cluster_builds_two_kernels(cache_env):
    distributed = pytest.importorskip("distributed")
    tag = f"dask-{os.getpid()}"
    jobs = [BuildJob(tiny_source(f"{tag}-1"), "sm80", "one"), BuildJob(tiny_source(f"{tag}-2"), "sm80", "two")]
    with distributed.LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address=None) as cluster, \
            distributed.Client(cluster) as client:
        worker_pids = set(client.run(os.getpid).values())
        res = build_many(jobs, executor=client.get_executor())
        for r in res:
            assert not isinstance(r, Exception), r
        assert [r.cached for r in res] == [False, False]
        assert [loaded_tag(r.verified_library_path()) for r in res] == [f"{tag}-1", f"{tag}-2"]
        for r in res:
            assert r.meta["built_on"] and r.meta["toolchain"]["nvcc"].startswith("cuda_")
            assert r.source.read_text().startswith("// evtc cache test kernel")
            assert "-o" in r.log.read_text().splitlines()[0]
        # a second round is answered from the local cache: nothing is submitted
        again = build_many(jobs, executor=client.get_executor())
        assert [r.cached for r in again] == [True, True]
    assert os.getpid() not in worker_pids and len(worker_pids) == 2
    assert lookup(jobs[0].source, "sm80", name="one") is not None


def test_process_pool_executor_and_a_failed_remote_build(cache_env, prebuilt):
    copy_prebuilt(prebuilt, cache_env)
    bad = tiny_source("bad-remote") + "\nnot C++;\n"
    jobs = [BuildJob(tiny_source("a"), "sm80", "a"), BuildJob(bad, "sm80", "bad"),
            BuildJob(tiny_source("pp"), "sm80", "pp"), BuildJob(tiny_source("pp"), "sm80", "pp-again")]
    seen = []
    with concurrent.futures.ProcessPoolExecutor(2) as ex:
        res = build_many(jobs, executor=ex, on_done=lambda i, r: seen.append(i))
    assert sorted(seen) == [0, 1, 2, 3]
    assert res[0].cached
    assert isinstance(res[1], BuildError) and "nvcc failed" in str(res[1]) and "kernel bad" in str(res[1])
    failed = cache_env / "failed"
    assert f"source: {failed}" in str(res[1]) and (next(failed.iterdir()) / "build.log").exists()
    assert not res[2].cached and res[3].library == res[2].library  # one build for two identical jobs
    assert loaded_tag(res[2].verified_library_path()) == "pp"


def test_a_worker_with_other_headers_is_refused(cache_env, monkeypatch, prebuilt, tmp_path):
    """The worker's key material differs (other CUTLASS headers): its library is not installed."""
    monkeypatch.setenv("EVTC_NVCC", str(copying_nvcc(tmp_path, prebuilt_library(prebuilt, "a"))))
    real = cache_mod.compile_remote

    def other_headers(job, timeout=None):
        rb = real(job, timeout)
        rb.material = dict(rb.material, headers=dict(rb.material["headers"], cutlass="0" * 64))
        rb.key = cache_mod._key_of(rb.material)
        return rb

    monkeypatch.setattr(cache_mod, "compile_remote", other_headers)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        (res,) = build_many([BuildJob(tiny_source("wrong"), "sm80", "wrong")], executor=ex)
    assert isinstance(res, BuildError) and "headers differ" in str(res)
    assert lookup(tiny_source("wrong"), "sm80", name="wrong") is None


def test_a_corrupted_transfer_is_refused(cache_env, monkeypatch, prebuilt, tmp_path):
    monkeypatch.setenv("EVTC_NVCC", str(copying_nvcc(tmp_path, prebuilt_library(prebuilt, "a"))))
    real = cache_mod.compile_remote

    def corrupt(job, timeout=None):
        rb = real(job, timeout)
        data = bytearray(rb.library)
        data[len(data) // 2] ^= 0xFF
        return dataclasses.replace(rb, library=bytes(data))

    monkeypatch.setattr(cache_mod, "compile_remote", corrupt)
    with concurrent.futures.ThreadPoolExecutor(1) as ex:
        (res,) = build_many([BuildJob(tiny_source("corrupt"), "sm80", "corrupt")], executor=ex)
    assert isinstance(res, BuildError) and "corrupted on its way here" in str(res)
    assert lookup(tiny_source("corrupt"), "sm80", name="corrupt") is None
