"""The tests test what users install: evtc and its data files come from the installed package,
and a wheel built from this checkout works on its own (DESIGN.md section 2)."""

import os
import subprocess
import sys
from pathlib import Path

import pytest

import evtc
from evtc.resources import data_path

ROOT = Path(__file__).resolve().parents[2]
PKG = Path(evtc.__file__).resolve().parent
SOURCE_PKG = (ROOT / "evtc").resolve()  # the checkout's package (an install may live under ROOT: CI's venv)
DATA = [("grammar", "epilogue.lark"), ("codegen_templates",), ("examples", "epilogues.py"), ("docs", "errors.md")]

source_run = pytest.mark.skipif(os.environ.get("EVTC_TEST_SOURCE") == "1",
                                reason="EVTC_TEST_SOURCE=1: testing the source tree on purpose")


@source_run
def test_evtc_is_the_installed_package():
    assert PKG != SOURCE_PKG, f"evtc imported from the checkout: {PKG}"


@source_run
@pytest.mark.parametrize("parts", DATA, ids=lambda p: "/".join(p))
def test_data_files_come_from_the_installed_package(parts):
    p = data_path(*parts)
    assert p.resolve().is_relative_to(PKG), p
    assert not p.resolve().is_relative_to(SOURCE_PKG)


@pytest.mark.slow
def test_wheel_on_its_own(tmp_path):
    """Build the wheel, install it alone into a folder, and run the CLI from there, away from the
    checkout: the grammar, the templates, the examples and the errors page must be inside."""
    wheels = tmp_path / "wheels"
    subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(wheels), str(ROOT)],
                   check=True, capture_output=True, text=True)
    (whl,) = wheels.glob("evtc-*.whl")
    site = tmp_path / "site"
    subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(whl)],
                   check=True, capture_output=True, text=True)
    env = {**os.environ, "PYTHONPATH": str(site), "EVTC_CACHE_DIR": str(tmp_path / "cache")}
    env.pop("EVTC_TEST_SOURCE", None)
    work = tmp_path / "work"
    work.mkdir()

    def evtc_(*args):
        return subprocess.run([sys.executable, "-P", "-m", "evtc", *args], cwd=work, env=env,
                              capture_output=True, text=True)

    where = subprocess.run([sys.executable, "-P", "-c", "import evtc, evtc.resources as r; print(evtc.__file__); "
                            "print(r.data_path('grammar', 'epilogue.lark')); print(r.data_path('docs', 'errors.md'))"],
                           cwd=work, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert all(Path(w).is_relative_to(site) for w in where), where
    examples = site / "evtc" / "_data" / "examples" / "epilogues.py"
    r = evtc_("emit", f"{examples}:bias_relu", "-o", "k.cu")
    assert r.returncode == 0, r.stderr
    assert "evtc_run" in (work / "k.cu").read_text()
    r = evtc_("emit", "--expr", "D = relu(alpha*acc + beta*C + bias[n])")
    assert r.returncode == 0 and "Sm90RowBroadcast" in r.stdout, r.stderr
    r = evtc_("plan", f"{examples}:many_aux", "--svg", "m.svg")
    assert r.returncode == 0 and "tensor" in r.stdout and (work / "m.svg").read_text().startswith("<?xml")
    r = evtc_("errors", "plan")
    assert r.returncode == 0 and r.stdout.startswith("## plan")
    r = evtc_("plan", "--expr", "D = acc +")
    assert r.returncode == 2 and "or run: evtc errors grammar" in r.stderr
