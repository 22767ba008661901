"""The README's commands are true: the nvcc line people copy builds the kernel evtc builds."""

import re
import shlex
from pathlib import Path

from evtc.compiler import nvcc

ROOT = Path(__file__).resolve().parents[2]


def _readme_nvcc_line() -> list[str]:
    lines = [line.strip() for line in (ROOT / "README.md").read_text().splitlines() if line.strip().startswith("nvcc ")]
    assert len(lines) == 1, lines
    return shlex.split(lines[0].replace("$(evtc emit --print-includes)", "INCLUDES"))


def test_readme_nvcc_line_has_the_builders_flags(monkeypatch):
    """The same flags, in the same order, as evtc/compiler's command for sm90 (the include
    directories are what `evtc emit --print-includes` prints)."""
    from evtc.cli import nvcc_command

    monkeypatch.setattr(nvcc, "require_nvcc", lambda: Path("nvcc"))
    readme = _readme_nvcc_line()
    built = nvcc_command("sm90", "k.cu")
    includes = [f for f in built if f.startswith("-I")]
    assert includes, built
    expect = [f for f in built if not f.startswith("-I")]
    got = [f for f in readme if f != "INCLUDES"]
    assert got == expect
    assert readme.index("INCLUDES") == built.index(includes[0])
    assert "-DNDEBUG" in got


def test_readme_test_command_uses_the_installed_package():
    text = (ROOT / "README.md").read_text()
    assert "pip install '.[test]' && python -P -m pytest -q tests" in text
    ci = (ROOT / ".ci" / "run").read_text()
    assert "python -P -m pytest" in ci and "pip install -e" not in ci


def test_emit_help_points_at_print_nvcc():
    from click.testing import CliRunner

    from evtc.cli import main

    r = CliRunner().invoke(main, ["emit", "--help"])
    text = " ".join(r.output.split())
    assert "--print-nvcc" in text and "-DNDEBUG" in text
    assert not re.search(r"nvcc -std=c\+\+17 -O3 --expt", text)  # no hand-copied flag list without -DNDEBUG


def test_ci_installs_a_cpu_torch_so_the_torch_tests_run():
    """Without torch the torch frontend, op and backend tests (about 110) skip. CI installs
    torch pinned to one exact version (a local CPU wheel there; a bare `torch` would pull a CUDA
    build) before the project, whose `torch` extra then keeps it."""
    ci = (ROOT / ".ci" / "run").read_text()
    installs = [line.strip() for line in ci.splitlines() if line.strip().startswith("pip install")]
    pinned = [i for i, line in enumerate(installs) if re.search(r"\btorch==\d+\.\d+\.\d+(\s|$)", line)]
    project = [i for i, line in enumerate(installs) if "'.[" in line]
    assert pinned and project and pinned[0] < project[0], installs
    assert "torch" in re.search(r"'\.\[([^\]]*)\]'", installs[project[0]]).group(1).split(","), installs
