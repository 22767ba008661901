"""The command line (GPU-free parts): emit, plan, ops, errors as messages with exit status 2."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import evtc
from evtc.cli import main

ROOT = Path(__file__).resolve().parents[2]
EX = str(ROOT / "examples" / "epilogues.py")


def _env():
    """The environment for a `python -P -m evtc` subprocess: the evtc this test imported first."""
    pkg_parent = str(Path(evtc.__file__).resolve().parents[1])
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [pkg_parent, os.environ.get("PYTHONPATH")]))}


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


def test_emit_grouped(tmp_path):
    """--grouped writes evtc.GroupedGemm's kernel (the member's, or a pinned configuration's), its
    reductions per group too; sm80, --conv and a 16-bit reduction are refused before anything is
    written."""
    out = tmp_path / "g.cu"
    r = run("emit", f"{EX}:bias_relu", "--grouped", "pp64x128", "-o", str(out))
    assert r.exit_code == 0, r.output
    text = out.read_text()
    assert "KernelPtrArrayTmaWarpSpecializedPingpong" in text and "evtc_group_table_bytes" in text
    r = run("emit", "--expr", "D = relu(acc + bias[n])", "--grouped", "coop128x128", "--tile", "128x256x64")
    assert r.exit_code == 0 and "cute::Shape<cute::_128, cute::_256, cute::_64>" in r.output
    for bad, why in (([f"{EX}:bias_relu", "--arch", "sm80"], "sm90 kernel"), ([f"{EX}:bias_relu", "--conv", "fprop"],
                                                                                "can't be combined")):
        r = CliRunner().invoke(main, ["emit", *bad, "--grouped", "pp64x128", "-o", str(tmp_path / "x.cu")])
        assert r.exit_code == 2 and why in r.output, r.output
        assert not (tmp_path / "x.cu").exists()
    r = CliRunner().invoke(main, ["emit", f"{EX}:row_stats", "--grouped", "pp64x128"])
    assert r.exit_code == 0 and r.output.count("evtc::Sm90ReductionGrouped<1,") == 2, r.output[-2000:]
    r = CliRunner().invoke(main, ["emit", "--expr", "D = acc; m = to(max(acc, dim=1), bf16)", "--grouped", "pp64x128",
                                  "-o", str(tmp_path / "y.cu")])
    assert r.exit_code != 0 and "reduces into f32" in r.output and not (tmp_path / "y.cu").exists(), r.output


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
    proc = subprocess.run([sys.executable, "-P", "-m", "evtc", "emit", f"{bad}:bad"], capture_output=True, text=True, env=_env())
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
    r = run("ops", "--cpp")
    assert "gelu(x)" in r.output and "evtc::Gelu" in r.output and "cutlass::epilogue::thread::ReLu" in r.output


def test_plan_takes_fixed_decisions_as_json():
    r = run("plan", f"{EX}:many_aux", "--json", "--plan", '{"share": true, "stages_c": 2, "epilogue_tile": [128, 16]}')
    assert r.exit_code == 0, r.output
    p = json.loads(r.output)
    assert (p["stages_c"], p["epilogue_tile"], len(p["shares"])) == (2, [128, 16], 2)
    r = CliRunner().invoke(main, ["plan", f"{EX}:many_aux", "--plan", "{bad"])
    assert r.exit_code == 2 and "neither evtc, cutlass nor a JSON object" in r.output
    r = CliRunner().invoke(main, ["plan", f"{EX}:many_aux", "--plan", '{"stagesc": 2}'])
    assert r.exit_code == 2 and "fixable decisions" in r.output and "Traceback" not in r.output


# ---- options travel as values; every failure is a message and status 2 -----------------------------


def test_request_is_one_frozen_value():
    """The GEMM options reach the command as one GemmRequest, and it builds the Gemm they name."""
    import dataclasses

    from evtc.cli import GemmRequest

    seen = {}

    import click

    from evtc.cli import gemm_request

    @click.command()
    @gemm_request()
    def probe(request):
        seen["r"] = request

    res = CliRunner().invoke(probe, [f"{EX}:bias_relu", "--tile", "128x128x64", "--cluster", "1x1", "--stages", "3",
                                     "--a", "f16", "--plan", '{"stages_c": 2}'], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    r = seen["r"]
    assert isinstance(r, GemmRequest) and dataclasses.is_dataclass(r)
    assert (r.tile, r.cluster, r.stages, r.a, r.plan) == ((128, 128, 64), (1, 1), 3, "f16", (("stages_c", 2),))
    with pytest.raises(dataclasses.FrozenInstanceError):
        r.arch = "sm80"
    g = r.gemm()
    assert g.config.tile == (128, 128, 64) and g.config.cluster == (1, 1, 1) and g.plan.stages_c == 2
    assert g.plan.mainloop_stages == 3 and g.a.name == "f16"


@pytest.mark.parametrize("args, needle", [
    (["emit", f"{EX}:bias_relu", "-o", "/nonexistent/x.cu"], "the folder /nonexistent does not exist"),
    (["plan", f"{EX}:bias_relu", "--dot", "/nonexistent/x.dot"], "the folder /nonexistent does not exist"),
    (["plan", f"{EX}:bias_relu", "--svg", "/nonexistent/x.svg"], "the folder /nonexistent does not exist"),
    (["plan", f"{EX}:REFERENCE"], "is a dict, not an epilogue function"),
    (["plan", f"{EX}:bias_relu", "--tile", "-128x256x64"], "every extent must be a positive number"),
    (["plan", f"{EX}:bias_relu", "--tile", "128x256"], "needs 3 numbers"),
    (["plan", f"{EX}:bias_relu", "--epilogue-tile", "0x32"], "every extent must be a positive number"),
    (["plan", f"{EX}:bias_relu", "--stages", "0"], "0 is not in the range"),
    (["plan", f"{EX}:bias_relu", "--stages", "1"], "needs at least 2"),
    (["plan"], "give an epilogue as PATH.py:FUNC or with --expr"),
    (["plan", f"{EX}:bias_relu", "--expr", "D = acc"], "not both"),
    (["plan", "nofile.py:f"], "no such file"),
    (["plan", "examples"], "is not PATH.py:FUNC"),
    (["build", "-j", "0", f"{EX}:bias_relu"], "0 is not in the range"),
    (["errors", "no-such-anchor"], "has no section"),
])
def test_every_failure_is_a_message_with_status_2(args, needle):
    r = CliRunner().invoke(main, args)
    assert r.exit_code == 2, (r.exit_code, r.output, r.exception)
    assert needle in r.output
    assert "Traceback" not in r.output and not isinstance(r.exception, (TypeError, FileNotFoundError))


def test_unwritable_output_is_a_message(tmp_path):
    out = tmp_path / "ro"
    out.mkdir()
    out.chmod(0o500)
    try:
        proc = subprocess.run([sys.executable, "-P", "-m", "evtc", "emit", f"{EX}:linear_combination", "-o", str(out / "k.cu")],
                              capture_output=True, text=True, env=_env())
    finally:
        out.chmod(0o700)
    if os.geteuid() == 0:  # root writes anywhere: then the file must be there
        assert proc.returncode == 0 and (out / "k.cu").exists()
    else:
        assert proc.returncode == 2 and "not writable" in proc.stderr and "Traceback" not in proc.stderr


def test_broken_user_module_is_a_message(tmp_path):
    bad = tmp_path / "broken.py"
    bad.write_text("raise ValueError('boom')\n")
    proc = subprocess.run([sys.executable, "-P", "-m", "evtc", "plan", f"{bad}:f"], capture_output=True, text=True, env=_env())
    assert proc.returncode == 2 and "importing" in proc.stderr and "ValueError: boom" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_every_subcommand_explains_spec():
    for cmd in ("emit", "plan", "build", "run", "bench"):
        r = run(cmd, "--help")
        text = " ".join(r.output.split())
        assert r.exit_code == 0
        assert "SPEC names the epilogue: PATH.py:FUNC" in text and "--expr" in text, cmd


def test_expr_and_several_specs_for_build_are_requests():
    import evtc.cli as cli

    seen = []
    orig = cli.GemmRequest.gemm

    def fake(self):
        seen.append(self)
        raise evtc.PlanError("stop here")

    cli.GemmRequest.gemm = fake
    try:
        r = CliRunner().invoke(main, ["build", f"{EX}:bias_relu", f"{EX}:gelu_aux", "--arch", "sm80"])
    finally:
        cli.GemmRequest.gemm = orig
    assert r.exit_code == 2 and "stop here" in r.output
    assert seen[0].spec.endswith(":bias_relu") and seen[0].arch == "sm80"


def test_build_failure_is_printed_once(monkeypatch):
    import evtc.compiler as compiler

    def fake_build_many(jobs, workers=None, on_done=None, extra=()):
        err = evtc.BuildError("nvcc failed (2) building kernel.cu: error: boom", hint="log: /tmp/x.log")
        for i in range(len(jobs)):
            on_done(i, err)
        return [err] * len(jobs)

    monkeypatch.setattr(compiler, "build_many", fake_build_many)
    r = CliRunner().invoke(main, ["build", f"{EX}:linear_combination"])
    assert r.exit_code == 2
    assert r.output.count("error: boom") == 1 and r.output.count("log: /tmp/x.log") == 1, r.output


def test_print_nvcc_is_the_builders_command(monkeypatch, tmp_path):
    from pathlib import Path as P

    from evtc.compiler import nvcc

    monkeypatch.setattr(nvcc, "require_nvcc", lambda: P("/opt/cuda/bin/nvcc"))
    r = run("emit", "--print-nvcc", "--arch", "sm90", "-o", str(tmp_path / "k.cu"))
    assert r.exit_code == 0
    cmd = r.output.split()
    assert cmd == nvcc.compile_command(tmp_path / "k.cu", tmp_path / "k.so", ("-gencode=arch=compute_90a,code=sm_90a",))
    assert "-DNDEBUG" in cmd and "-O3" in cmd


def test_e5m2_mainloop_hint_names_e4m3():
    r = CliRunner().invoke(main, ["plan", f"{EX}:bias_relu", "--a", "e5m2"])
    assert r.exit_code == 2 and "takes e4m3" in r.output and "need sm90" not in r.output


def test_errors_command_prints_the_section():
    r = run("errors", "config")
    assert r.exit_code == 0 and r.output.startswith("## config") and "ConfigError" in r.output
    assert "## build" not in r.output
    r = run("errors")
    assert r.exit_code == 0 and "errors.md" in r.output and "trace-bool" in r.output


def test_error_message_names_the_errors_command():
    r = CliRunner().invoke(main, ["plan", f"{EX}:bias_relu", "--a", "e5m2"])
    assert "see docs/errors.md#config, or run: evtc errors config" in r.output


def test_ops_lists_what_users_write():
    r = run("ops")
    lines = r.output.splitlines()
    spelled = {line.split()[0] for line in lines if line.startswith("  ")}
    for want in ("clamp(x,", "amax(x,", "sum(x,", "relu(x)", "where(cond,"):
        assert any(s.startswith(want) for s in spelled) or any(want in line for line in lines), want
    assert any(line.startswith("  a + b") for line in lines) and any(line.startswith("  a * b") for line in lines)
    assert not any(line.split()[0] in ("add", "mul", "first", "convert") for line in lines if line.startswith("  "))


# ---- issue 37: no quiet success ------------------------------------------------------------------


def test_sys_exit_in_the_users_module_is_an_error(tmp_path):
    mod = tmp_path / "quits.py"
    mod.write_text("import sys\nimport evtc\nsys.exit(0)\n")
    r = CliRunner().invoke(main, ["emit", f"{mod}:x"])
    assert r.exit_code == 2 and "called sys.exit(0)" in r.output and r.exception is not None
    mod.write_text("import sys\nimport evtc\n\n@evtc.epilogue\ndef quits(acc):\n    sys.exit(0)\n")
    r = CliRunner().invoke(main, ["emit", f"{mod}:quits"])
    assert r.exit_code == 2 and "TraceError" in r.output and "SystemExit" in r.output and "quits.py:6" in r.output


@pytest.mark.parametrize("args, needle", [
    (["--conv", "fprop", "--fragment"], "--fragment and --conv can't be combined"),
    (["--dims", "3"], "--dims only applies with --conv"),
    (["--name", "X"], "--name only applies with --fragment"),
    (["--namespace", "x"], "--namespace only applies with --fragment"),
    (["--print-includes"], "--print-includes prints and exits: --expr would be ignored"),
    (["--print-nvcc", "--tile", "128x128x64"], "--print-nvcc prints and exits: --expr, --tile would be ignored"),
    (["--print-nvcc", "--print-includes"], "can't be combined"),
    (["--arch", "sm80", "--plan", "cutlass"], "--plan chooses sm90's shared-memory plan"),
])
def test_conflicting_or_ignored_emit_options_are_refused(args, needle):
    r = CliRunner().invoke(main, ["emit", "--expr", "D = relu(acc)", *args])
    assert r.exit_code == 2 and needle in r.output, r.output


def test_print_modes_take_what_they_use():
    assert run("emit", "--print-includes").exit_code == 0
    r = run("emit", "--print-nvcc", "--arch", "sm80", "-o", "k.cu")
    assert r.exit_code == 0 and "compute_80" in r.output
    r = run("emit", "--expr", "D = relu(acc)", "--conv", "fprop", "--dims", "3")
    assert r.exit_code == 0 and "Conv" in r.output


@pytest.mark.parametrize("plan, needle", [
    ('{"direct": "X"}', "plan decision direct='X': needs a list"),
    ('{"stages_c": true}', "plan decision stages_c=True: needs a positive integer"),
    ('{"stages_c": 2.0}', "needs a positive integer"),
    ('{"reuse": 1}', "plan decision reuse=1: needs True or False"),
    ('{"epilogue_tile": [128]}', "needs [M, N]"),
    ('{"share": "F"}', "a string is not a list of names"),
    ('{"stages": 2}', "did you mean stages_c, stages_d?"),
])
def test_plan_decisions_are_checked_by_type(plan, needle):
    r = CliRunner().invoke(main, ["emit", f"{EX}:bias_relu", "--plan", plan])
    assert r.exit_code == 2 and needle in r.output, r.output
    with pytest.raises(evtc.errors.PlanError, match=needle.split(":")[0].replace("[", r"\[")):  # as the API does
        evtc.Gemm(evtc.from_expr("D = relu(acc + C)"), plan=json.loads(plan), config=evtc.GemmConfig())


@pytest.mark.parametrize("config, arch, needle", [
    (dict(scheduler="streamk", split_k=10**9), "sm90", "split_k = 1000000000: CUTLASS's stream-K scheduler"),
    (dict(swizzle=4), "sm90", "swizzle = 4"),
    (dict(swizzle=40, tile=(128, 128, 32)), "sm80", "swizzle = 40: sm80's GemmIdentityThreadblockSwizzle<N>"),
])
def test_split_k_and_swizzle_are_bounded_by_what_cutlass_takes(config, arch, needle):
    with pytest.raises(evtc.ConfigError, match=needle.replace("(", r"\(")):
        evtc.Gemm(evtc.from_expr("D = relu(acc)"), arch=arch, config=evtc.GemmConfig(**config))
    ok = dict(config, **({"split_k": 132} if "split_k" in config else {"swizzle": 3}))
    evtc.Gemm(evtc.from_expr("D = relu(acc)"), arch=arch, config=evtc.GemmConfig(**ok))


def _help_examples(command: str) -> dict[str, str]:
    """Option -> the example its --help gives ('e.g. X')."""
    import re

    import click

    out = {}
    for p in main.commands[command].params:
        m = re.search(r"e\.g\. (\"[^\"]*\"|'[^']*'|[^\s,;()]+)", (getattr(p, "help", None) or "").replace("\n", " "))
        if isinstance(p, click.Option) and m:
            out[p.opts[0]] = m.group(1).strip("'\"")
    return out


@pytest.mark.parametrize("command", ["emit", "plan"])
def test_every_example_of_the_help_runs(command, tmp_path, monkeypatch):
    """Each 'e.g.' of an option's help, with the epilogue examples of the help (SPEC_HELP)."""
    import re

    from evtc.cli import SPEC_HELP

    monkeypatch.chdir(ROOT)
    examples = _help_examples(command)
    assert {"--expr", "--plan", "--tile", "--cluster", "--epilogue-tile"} <= set(examples)
    spec = re.search(r"for example (\S+:\w+)", SPEC_HELP).group(1)
    expr = re.search(r'--expr "([^"]+)"', SPEC_HELP.replace("\n", " ")).group(1)
    assert expr == examples["--expr"]
    out = ["-o", str(tmp_path / "k.cu")] if command == "emit" else []
    for option, example in examples.items():
        for epilogue in ([spec], ["--expr", expr]):
            args = [command, *epilogue, *out] + ([option, example] if option != "--expr" else [])
            r = CliRunner().invoke(main, args)
            assert r.exit_code == 0, (args, r.output)
    r = CliRunner().invoke(main, ["emit", "--print-nvcc", "-o", "k.cu"])  # emit's own docstring
    assert "`evtc emit --print-nvcc -o k.cu`" in " ".join(main.commands["emit"].help.split()) and r.exit_code == 0


def test_errors_command_prints_text_not_generator_markers():
    for anchor in ("plan", "unsupported-op", "grammar", "constant-fold"):
        r = run("errors", anchor)
        assert r.exit_code == 0 and "<!--" not in r.output and "-->" not in r.output
        assert "\n\n\n" not in r.output and "```" in r.output


def test_print_includes_resolves_every_evtc_header(tmp_path):
    """Every #include "evtc/..." of an emitted .cu (and of the headers it includes) is a file
    under one of the printed -I folders (a CPU check; nothing is compiled)."""
    import re

    dirs = [Path(f[2:]) for f in run("emit", "--print-includes").output.split()]
    assert dirs and all(d.is_dir() for d in dirs)
    for arch in ("sm90", "sm80"):
        source = run("emit", f"{EX}:bias_relu", "--arch", arch).output
        todo = re.findall(r'#include [<"](evtc/[^>"]+)[>"]', source)
        assert todo, arch
        seen = set()
        while todo:
            name = todo.pop()
            if name in seen:
                continue
            seen.add(name)
            found = [d / name for d in dirs if (d / name).is_file()]
            assert found, f"{arch}: #include {name} is under none of {dirs}"
            todo += re.findall(r'#include [<"](evtc/[^>"]+)[>"]', found[0].read_text())
        cutlass = re.findall(r'#include [<"](cutlass/[^>"]+|cute/[^>"]+)[>"]', source)
        assert all(any((d / h).is_file() for d in dirs) for h in cutlass), arch


def test_the_checked_decisions_are_the_planners():
    from evtc.plan.config import PLAN_DECISIONS
    from evtc.plan.sm90_space import FIXABLE

    assert tuple(PLAN_DECISIONS) == ("policy", *FIXABLE)
