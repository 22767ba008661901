"""The command line (GPU-free parts): emit, plan, ops, errors as messages with exit status 2."""

import json
import subprocess
import sys
from pathlib import Path

from click.testing import CliRunner

from evtc.cli import main

ROOT = Path(__file__).resolve().parents[2]
EX = str(ROOT / "examples" / "epilogues.py")


def run(*args):
    r = CliRunner().invoke(main, list(args), catch_exceptions=False)
    return r


def test_emit_writes_a_cu(tmp_path):
    out = tmp_path / "k.cu"
    r = run("emit", f"{EX}:bias_relu", "--arch", "sm90", "-o", str(out))
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "Sm90RowBroadcast" in text and "evtc_run" in text
    assert "extern \"C\"" in text


def test_emit_to_stdout_with_dtypes_and_tile():
    r = run("emit", f"{EX}:linear_combination", "--a", "f16", "--d", "f16", "--tile", "128x128x64", "--cluster", "1x1")
    assert r.exit_code == 0
    assert "using ElementA = cutlass::half_t;" in r.output and "cute::Shape<cute::_128, cute::_128, cute::_64>" in r.output


def test_print_includes():
    r = run("emit", "--print-includes")
    assert r.exit_code == 0 and "-I" in r.output and "cutlass_library/source/include" in r.output


def test_plan_json_and_dot(tmp_path):
    dot = tmp_path / "g.dot"
    r = run("plan", f"{EX}:many_aux", "--json", "--dot", str(dot))
    assert r.exit_code == 0
    plan = json.loads(r.output[: r.output.rindex("}") + 1])
    assert plan["policy"] == "evtc" and plan["mainloop_stages"] >= 2
    assert "digraph" in dot.read_text() and "aux_store" in dot.read_text()


def test_plan_table_with_ir():
    r = run("plan", f"{EX}:residual_scale", "--ir", "--plan", "cutlass")
    assert r.exit_code == 0
    assert "epilogue residual_scale(" in r.output and "R1" in r.output and "mainloop" in r.output


def test_errors_are_messages_not_tracebacks(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("import evtc\n\n@evtc.epilogue\ndef bad(acc):\n    if acc > 0:\n        return acc\n    return acc\n")
    proc = subprocess.run([sys.executable, "-m", "evtc", "emit", f"{bad}:bad"], capture_output=True, text=True)
    assert proc.returncode == 2
    assert "TraceError" in proc.stderr and "bad.py:5" in proc.stderr and "if acc > 0" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_plan_error_for_stock_many_aux():
    r = run("plan", f"{EX}:many_aux", "--plan", "cutlass")
    assert r.exit_code == 2


def test_unknown_function_lists_epilogues():
    r = CliRunner().invoke(main, ["emit", f"{EX}:nope"])
    assert r.exit_code != 0 and "bias_relu" in r.output


def test_ops_lists_functors():
    r = run("ops")
    assert "gelu" in r.output and "cutlass::epilogue::thread::GELU" in r.output


def test_plan_takes_fixed_decisions_as_json():
    r = run("plan", f"{EX}:many_aux", "--json", "--plan", '{"share": true, "stages_c": 2, "epilogue_tile": [128, 16]}')
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    assert (p["stages_c"], p["epilogue_tile"], len(p["shares"])) == (2, [128, 16], 2)
    r = CliRunner().invoke(main, ["plan", f"{EX}:many_aux", "--plan", "{bad"])
    assert r.exit_code == 2 and "neither evtc, cutlass nor a JSON object" in r.output
    r = CliRunner().invoke(main, ["plan", f"{EX}:many_aux", "--plan", '{"stagesc": 2}'])
    assert r.exit_code == 2 and "fixable decisions" in r.output and "Traceback" not in r.output
