"""evtc/knobs.py: every environment variable is declared there and read nowhere else, with one
truthiness rule and errors that name the variable (issue 35)."""

import re
from pathlib import Path

import pytest

import evtc
from evtc import knobs
from evtc.errors import ArgumentError, BuildError, CacheError, ConfigError

PKG = Path(evtc.__file__).resolve().parent
_READ = re.compile(r"\bos\.environ\b|\bgetenv\s*\(|\benviron\s*\[|\bfrom os import environ\b")


def test_no_module_but_knobs_reads_the_environment():
    offenders = []
    for f in sorted(PKG.rglob("*.py")):
        if f.name == "knobs.py" and f.parent == PKG:
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            if _READ.search(line) and not line.lstrip().startswith("#"):
                offenders.append(f"{f.relative_to(PKG)}:{i}: {line.strip()}")
    assert offenders == [], "read the environment through evtc.knobs:\n" + "\n".join(offenders)


def test_every_evtc_variable_the_package_names_is_declared():
    declared = {k.name for k in knobs.KNOBS}
    named = set()
    for f in PKG.rglob("*.py"):
        named |= set(re.findall(r"\bEVTC_[A-Z][A-Z0-9_]*[A-Z0-9]\b", f.read_text()))
    # macros of the emitted C++ and module names, not variables
    not_variables = {"EVTC_SUPPORTS_SPLIT_BUILD", "EVTC_SPLIT_HOST", "EVTC_SPLIT_DEVICE", "EVTC_TORCH_VERSION",
                     "EVTC_HEADERS", "EVTC_DIR", "EVTC_OP"}
    assert named - not_variables <= declared, sorted(named - not_variables - declared)


@pytest.mark.parametrize("raw, want", [("1", True), ("true", True), (" YES ", True), ("on", True), ("0", False),
                                       ("false", False), ("no", False), ("Off", False), ("", False)])
def test_one_truthiness_rule(monkeypatch, raw, want):
    monkeypatch.setenv("EVTC_AUTOTUNE", raw)
    assert knobs.autotune.get() is want


def test_a_value_that_is_neither_on_nor_off_names_the_variable(monkeypatch):
    monkeypatch.setenv("EVTC_AUTOTUNE", "maybe")
    with pytest.raises(ConfigError, match="EVTC_AUTOTUNE='maybe' is neither on nor off"):
        knobs.autotune.get()


def test_the_fast_path_switch_follows_the_rule(monkeypatch):
    """EVTC_TORCH_FASTPATH=no left the fast path on (issue 35): no is off, like everywhere."""
    from evtc.torch import fast as torch_fast

    for raw, want in (("no", "0"), ("off", "0"), ("0", "0"), ("yes", "1"), ("1", "1"), ("sync", "sync")):
        monkeypatch.setenv("EVTC_TORCH_FASTPATH", raw)
        assert torch_fast.mode() == want, raw
    monkeypatch.setenv("EVTC_TORCH_FASTPATH", "later")
    with pytest.raises(ConfigError, match="EVTC_TORCH_FASTPATH"):
        torch_fast.mode()


@pytest.mark.parametrize("knob, raw, error", [
    (knobs.nvcc_timeout, "-3", BuildError), (knobs.nvcc_timeout, "soon", BuildError),
    (knobs.lock_timeout, "nan", CacheError), (knobs.cache_toolchain, "loose", CacheError),
    (knobs.unaligned_staging, "sometimes", ArgumentError), (knobs.phase_split, "x", ArgumentError),
    (knobs.progress, "maybe", ConfigError), (knobs.verify, "2", ConfigError),
])
def test_bad_values_raise_their_error_naming_the_variable(monkeypatch, knob, raw, error):
    monkeypatch.setenv(knob.name, raw)
    with pytest.raises(error, match=knob.name):
        knob.get()


def test_unset_and_scoped_values(monkeypatch):
    monkeypatch.delenv("EVTC_NVCC_TIMEOUT", raising=False)
    assert knobs.nvcc_timeout.get() is None
    with knobs.nvcc_timeout.scope("12.5"):
        assert knobs.nvcc_timeout.get() == 12.5
    assert knobs.nvcc_timeout.raw() is None
    assert knobs.packed_stores.parse("1") == "always" and knobs.progress.parse("true") == "1"


def test_evtc_knobs_lists_every_variable():
    from click.testing import CliRunner

    from evtc.cli import main

    res = CliRunner().invoke(main, ["knobs"])
    assert res.exit_code == 0, res.output
    for k in knobs.KNOBS:
        assert k.name in res.output and k.doc in res.output
