"""GPU tests: build every kernel a module needs in parallel before its tests run."""

import os

import pytest


def prebuild(gemms):
    """Build ``gemms`` (evtc.Gemm objects) in parallel, one nvcc per core; raise on failure."""
    from evtc.build import build_many

    jobs = [(g.source, g.target, g.name) for g in gemms]
    workers = int(os.environ.get("EVTC_BUILD_JOBS", os.cpu_count() or 1))
    results = build_many(jobs, workers=workers)
    for g, r in zip(gemms, results):
        if isinstance(r, Exception):
            raise r
    for g in gemms:
        g.build()
    return gemms


@pytest.fixture(scope="session")
def device():
    import torch

    assert torch.cuda.is_available()
    return torch.device("cuda")
