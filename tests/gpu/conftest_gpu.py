"""GPU tests: build every kernel a module needs in parallel before its tests run, and check
results with evtc.testing's elementwise oracle."""

import os

import pytest


def prebuild(gemms):
    """Build ``gemms`` (evtc.Gemm objects) in parallel, one nvcc per core. A failed build is not
    raised here (it would fail every test of the module): the test using that Gemm raises it
    when it calls ``gemm.build()`` (through the cache's kept failure)."""
    from evtc.compiler import build_many

    jobs = list({j.source: j for g in gemms for j in g.jobs()}.values())
    workers = int(os.environ.get("EVTC_BUILD_JOBS", os.cpu_count() or 1))
    build_many(jobs, workers=workers)
    return gemms


def built_fixture(gemms):
    """A module-scoped fixture: the dict ``gemms()`` returns (test key -> evtc.Gemm), every Gemm
    of it built first (:func:`prebuild`). In a test module: ``built = built_fixture(gemms)``."""

    @pytest.fixture(scope="module")
    def built():
        table = gemms()
        prebuild(list(table.values()))
        return table

    return built


def selected_params(request, test_name: str, param: str) -> set:
    """The values of ``param`` over the selected (not deselected) items of ``test_name`` in the
    requesting module, so a module fixture builds only what the run needs."""
    module = request.module.__name__
    out = set()
    for item in request.session.items:
        if item.module.__name__ == module and item.originalname == test_name and hasattr(item, "callspec"):
            out.add(item.callspec.params[param])
    return out


def assert_matches(gemm, shape, seed, what, record_errors, **kw):
    """Run ``gemm`` on fresh random data of ``shape = (M, N, K, L)`` with NaN-poisoned outputs and
    assert that every element of every output is within its bound of the float64 reference
    (evtc.testing, NOTE [The error bound]); the failure names the worst element of each output
    and shows the epilogue's IR."""
    from evtc.testing import Problem, check, failure_report

    results = check(gemm, Problem(*shape), seed=seed, **kw)
    record_errors(results, shape)
    assert all(r.ok for r in results.values()), failure_report(results, f"{what} {shape}:", gemm.graph)
    return results


def assert_outputs_match(gemm, inputs, outputs, what, record_errors=None):
    """:func:`assert_matches` for outputs the test ran itself (``inputs`` from
    ``evtc.testing.make_inputs``)."""
    import torch

    from evtc.testing import check_outputs, failure_report

    torch.cuda.synchronize()
    results = check_outputs(gemm, inputs, outputs)
    if record_errors is not None:
        record_errors(results)
    assert all(r.ok for r in results.values()), failure_report(results, f"{what}:", gemm.graph)
    return results


def run_on_stream_after_a_delay(gemm, inputs, outputs):
    """Run ``gemm`` on a side stream that first sleeps and only then fills the inputs (staged
    NaN until then): a kernel launched on any other stream reads NaN and fails the check."""
    import torch

    staged = {k: v.clone() if hasattr(v, "clone") else v for k, v in inputs.items()}
    for v in inputs.values():
        if hasattr(v, "fill_"):
            v.view(torch.uint8).fill_(0x7F) if v.element_size() == 1 else v.fill_(float("nan"))
    s = torch.cuda.Stream()
    torch.cuda.synchronize()
    with torch.cuda.stream(s):
        torch.cuda._sleep(100_000_000)  # ~60 ms of GPU cycles before the inputs exist
        for k, v in inputs.items():
            if hasattr(v, "copy_"):
                v.copy_(staged[k])
        kwargs = {k: v for k, v in inputs.items() if k not in ("A", "B")}
        gemm(inputs["A"], inputs["B"], out=outputs, **kwargs)
    s.synchronize()


@pytest.fixture(scope="session")
def device():
    import torch

    assert torch.cuda.is_available()
    return torch.device("cuda")
