"""The README's nvcc line, run literally (through a shell, `$(evtc emit --print-includes)` and
all) on what `evtc emit` writes for the plainest epilogue, `D = acc`, builds a library that
exports evtc's C ABI: the line a user copies works, and the degenerate epilogue compiles on sm90
(it did not: the separating comma landed inside a comment, issue 37)."""

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.compile

ROOT = Path(__file__).resolve().parents[2]


def _readme_line() -> str:
    lines = [line.strip() for line in (ROOT / "README.md").read_text().splitlines() if line.strip().startswith("nvcc ")]
    assert len(lines) == 1, lines
    return lines[0]


@pytest.mark.skipif(shutil.which("nvcc") is None and not os.environ.get("EVTC_NVCC"), reason="needs nvcc")
def test_the_readmes_nvcc_line_builds_the_emitted_bare_epilogue(tmp_path):
    # `evtc` as the user's shell finds it: this interpreter's entry point (the checkout's evtc
    # under EVTC_TEST_SOURCE, the installed one otherwise)
    bindir = tmp_path / "bin"
    bindir.mkdir()
    shim = bindir / "evtc"
    shim.write_text(f"#!/bin/sh\nexec {sys.executable} -m evtc \"$@\"\n")
    shim.chmod(0o755)
    env = {**os.environ, "PATH": f"{bindir}{os.pathsep}{os.environ.get('PATH', '')}"}
    emit = subprocess.run(["evtc", "emit", "--expr", "D = acc", "--arch", "sm90", "-o", "k.cu"], cwd=tmp_path,
                          env=env, capture_output=True, text=True)
    assert emit.returncode == 0, emit.stderr
    build = subprocess.run(_readme_line(), shell=True, cwd=tmp_path, env=env, capture_output=True, text=True,
                           timeout=1800)
    assert build.returncode == 0, build.stderr[-4000:]
    lib = ctypes.CDLL(str(tmp_path / "k.so"))
    for symbol in ("evtc_info", "evtc_launch"):
        assert hasattr(lib, symbol), symbol
