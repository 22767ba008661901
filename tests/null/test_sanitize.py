"""benchmarks/sanitize.py without a GPU: its cases, and its reading of compute-sanitizer's output
(the lines below follow compute-sanitizer 2025's format: a report is a top-level '========= '
line, its details are indented)."""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "benchmarks"))

import sanitize as SZ  # noqa: E402

A = "sm90/bias_relu/bf16/persistent/200x136x72x1"
B = "sm80/row_stats/bf16/streamk/77x264x64x2"

MEMCHECK = f"""========= COMPUTE-SANITIZER
{SZ.MARK} BEGIN {A}
{SZ.MARK} RESULT {A} ok
{SZ.MARK} END {A}
{SZ.MARK} BEGIN {B}
========= Invalid __global__ write of size 4 bytes
=========     at void cutlass::Kernel2<...>(T1::Params)+0x1c30
=========     by thread (96,0,0) in block (1,0,0)
=========     Address 0x7f0000001040 is out of bounds
=========     Saved host backtrace up to driver entry point at kernel launch time
=========
========= Invalid __global__ write of size 4 bytes
=========     at void cutlass::Kernel2<...>(T1::Params)+0x1c30
{SZ.MARK} RESULT {B} FAILED row_sum (f32): FAILED, 3 of 154 elements outside the bound
{SZ.MARK} END {B}
========= ERROR SUMMARY: 2 errors
"""


def test_cases_cover_every_reference_epilogue_on_both_archs():
    cases = SZ.all_cases()
    assert {c.epilogue for c in cases} == set(SZ.REFERENCE)
    assert len(cases) == len(SZ.REFERENCE) * len(SZ.SHAPES) * 3  # sm90 + sm80 x two schedulers
    assert any(c.shape[3] > 1 for c in cases) and all(c.shape[0] % 64 and c.shape[1] % 128 for c in cases)
    assert len({c.id for c in cases}) == len(cases)
    assert [c.dtype for c in cases if c.arch == "sm90" and c.epilogue == "fp8_out"] == ["e4m3"] * len(SZ.SHAPES)


def test_parse_attributes_reports_to_their_case():
    r = SZ.parse("memcheck", MEMCHECK, [A, B])
    assert r["cases"][A]["errors"] == 0 and r["cases"][B]["errors"] == 2
    assert r["cases"][B]["first"].startswith("Invalid __global__ write")
    assert r["cases"][A]["oracle"] == "ok" and r["cases"][B]["oracle"].startswith("FAILED row_sum")
    assert r["summary"] == 2 and r["outside"] == 0 and r["missing"] == []


def test_parse_counts_racecheck_warnings_apart_and_reports_outside_cases():
    text = f"""========= COMPUTE-SANITIZER
========= Error: Race reported between Write access at 0x100 in k() and Read access at 0x200 in k()
{SZ.MARK} BEGIN {A}
========= Warning: Race reported between Write access at 0x100 and Write access at 0x100 [128 hazards]
========= Error: Race reported between Write access at 0x100 and Read access at 0x180 [4 hazards]
{SZ.MARK} END {A}
========= RACECHECK SUMMARY: 3 hazards displayed (2 errors, 1 warning)
"""
    r = SZ.parse("racecheck", text, [A])
    assert r["cases"][A] == {"errors": 1, "warnings": 1, "oracle": None,
                             "first": "Error: Race reported between Write access at 0x100 and Read access at 0x180 [4 hazards]"}
    assert r["outside"] == 1 and r["summary"] == 2


def test_parse_names_cases_that_never_finished():
    text = f"========= COMPUTE-SANITIZER\n{SZ.MARK} BEGIN {A}\n{SZ.MARK} END {A}\n{SZ.MARK} BEGIN {B}\n"
    r = SZ.parse("synccheck", text, [A, B])
    assert r["missing"] == [B] and r["summary"] is None


FAKE = r'''#!/usr/bin/env python3
"""Stands in for compute-sanitizer: no GPU; reports one error in the second case under memcheck."""
import sys
tool = sys.argv[sys.argv.index("--tool") + 1]
ids = sys.argv[sys.argv.index("--child") + 1:]
print("========= COMPUTE-SANITIZER")
for k, i in enumerate(ids):
    print("EVTC-SANITIZE BEGIN " + i)
    if tool == "memcheck" and k == 1:
        print("========= Invalid __global__ read of size 16 bytes")
        print("=========     at kernel+0x10")
    print("EVTC-SANITIZE RESULT " + i + " ok")
    print("EVTC-SANITIZE END " + i)
n = 1 if tool == "memcheck" else 0
print(f"========= RACECHECK SUMMARY: 0 hazards displayed (0 errors, 0 warnings)" if tool == "racecheck"
      else f"========= ERROR SUMMARY: {n} error" + ("s" if n != 1 else ""))
'''


def _run(tmp_path, *args):
    import json
    import subprocess

    fake = tmp_path / "compute-sanitizer"
    fake.write_text(FAKE)
    fake.chmod(0o755)
    out = tmp_path / "s.json"
    p = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "sanitize.py"), "--sanitizer", str(fake), "--no-build",
                        "--only", "bias_relu", "--json", str(out), *args], capture_output=True, text=True, timeout=120)
    return p, json.loads(out.read_text())


def test_the_script_reports_per_tool_and_case_and_fails_on_an_error(tmp_path):
    p, doc = _run(tmp_path)
    assert p.returncode == 1 and doc["ok"] is False
    ids = doc["cases"]
    assert len(ids) == 3 * len(SZ.SHAPES)
    mem = doc["tools"]["memcheck"]
    assert [mem["cases"][i]["errors"] for i in ids] == [0, 1] + [0] * (len(ids) - 2)
    assert all(c["errors"] == 0 for t in ("racecheck", "synccheck") for c in doc["tools"][t]["cases"].values())
    assert ids[1] in p.stdout and "Invalid __global__ read" in p.stdout
    assert (tmp_path / "sanitize_memcheck.log").exists()


def test_the_script_passes_when_every_tool_is_clean(tmp_path):
    p, doc = _run(tmp_path, "--tools", "racecheck,synccheck")
    assert p.returncode == 0 and doc["ok"] is True, p.stdout + p.stderr
