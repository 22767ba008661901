"""GPU tests: build every kernel a module needs in parallel before its tests run."""

import os

import pytest


def prebuild(gemms):
    """Build ``gemms`` (evtc.Gemm objects) in parallel, one nvcc per core. A failed build is not
    raised here (it would fail every test of the module): the test using that Gemm raises it
    when it calls ``gemm.build()`` (through the cache's kept failure)."""
    from evtc.compiler import build_many

    jobs = [(g.source, g.target, g.name) for g in gemms]
    workers = int(os.environ.get("EVTC_BUILD_JOBS", os.cpu_count() or 1))
    build_many(jobs, workers=workers)
    return gemms


def selected_params(request, test_name: str, param: str) -> set:
    """The values of ``param`` over the selected (not deselected) items of ``test_name`` in the
    requesting module, so a module fixture builds only what the run needs."""
    module = request.module.__name__
    out = set()
    for item in request.session.items:
        if item.module.__name__ == module and item.originalname == test_name and hasattr(item, "callspec"):
            out.add(item.callspec.params[param])
    return out


@pytest.fixture(scope="session")
def device():
    import torch

    assert torch.cuda.is_available()
    return torch.device("cuda")
