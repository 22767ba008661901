import os
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))
sys.path.insert(0, str(ROOT / "tests"))
os.environ.setdefault("EVTC_VERIFY", "1")

# The tests check what users install: the evtc package pip installed (from a wheel, with its
# grammar, templates, headers and docs page as package data), not the checkout's evtc/ that
# `python -m pytest` puts on sys.path. Run `pip install '.[test]' && python -P -m pytest tests`;
# EVTC_TEST_SOURCE=1 tests the source tree on purpose (an editable install, a device run with the
# working tree on PYTHONPATH).
TEST_SOURCE = os.environ.get("EVTC_TEST_SOURCE") == "1"


def _imported_from_checkout() -> bool:
    import evtc

    # The checkout's own package directory, not anything under ROOT: CI's virtual environment
    # (.venv-ci/lib/.../site-packages/evtc) lives inside the clone.
    return Path(evtc.__file__).resolve().parent == (ROOT / "evtc").resolve()


def pytest_configure(config):
    if not TEST_SOURCE and _imported_from_checkout():
        import evtc

        raise pytest.UsageError(
            f"the tests imported evtc from the checkout ({Path(evtc.__file__).parent}), not from an install: "
            "pip install '.[test]' and run `python -P -m pytest tests` (or set EVTC_TEST_SOURCE=1 to test "
            "the source tree on purpose)"
        )


from devices import HAS_GPU, HAS_NVCC  # noqa: E402  (tests/ is on sys.path above)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "gpu" in item.keywords and not HAS_GPU:
            item.add_marker(pytest.mark.skip(reason="needs an NVIDIA GPU (run on the device machine: see README)"))
        if "compile" in item.keywords and not HAS_NVCC:
            item.add_marker(pytest.mark.skip(reason="needs nvcc"))


def pytest_addoption(parser):
    parser.addoption("--accept-golden", action="store_true",
                     help="rewrite the golden files under tests/golden/ instead of comparing with them")


@pytest.fixture
def golden(request):
    """Compare text with tests/golden/<name>; with --accept-golden, write it instead."""
    accept = request.config.getoption("--accept-golden")

    def check(name: str, text: str) -> None:
        path = ROOT / "tests" / "golden" / name
        if accept or not path.exists():
            if not accept:
                pytest.fail(f"golden file {path} is missing: run pytest --accept-golden and review the diff")
            path.write_text(text)
            return
        expected = path.read_text()
        if text != expected:
            import difflib

            diff = "".join(difflib.unified_diff(expected.splitlines(True), text.splitlines(True), "golden", "now", n=2))
            pytest.fail(f"output differs from {path} (rerun with --accept-golden if intended):\n{diff[:6000]}")

    return check


@pytest.fixture
def no_build(monkeypatch, tmp_path):
    """A test in which any kernel build fails it (NOTE [Checks before builds]: a bad call is
    refused before nvcc runs): the cache's build entry points replaced, the cache in tmp_path."""
    from evtc.compiler import cache

    monkeypatch.setenv("EVTC_CACHE_DIR", str(tmp_path / "cache"))

    def refuse(*a, **k):
        pytest.fail("a build started before the arguments were checked")

    monkeypatch.setattr(cache, "build", refuse)
    monkeypatch.setattr(cache, "build_many", refuse)
