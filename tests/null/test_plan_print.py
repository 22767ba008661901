"""The printed plan (NOTE [The plan on one screen] in evtc/plan/model.py): one 80-column screen,
every tensor with where it lives, a reason for each decision; the same text from print() and
from `evtc plan`."""

import importlib.util
from pathlib import Path

import pytest
from click.testing import CliRunner

import evtc
from evtc.cli import main
from evtc.ir.nodes import AuxLoad, ColBroadcast, Reduction, RowBroadcast, ScalarBroadcast, Source, Store
from evtc.plan.model import format_plan, plan_rows

ROOT = Path(__file__).resolve().parents[2]
MAX_COLUMNS = 80
# 24 lines, a terminal's height: the eight reference epilogues take 10 to 21 (row_stats on sm80,
# with its kernel variants and notes, is the longest).
MAX_LINES = 24


def _module(path: Path):
    spec = importlib.util.spec_from_file_location(f"_plan_print_{path.parent.name}", path)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def reference_epilogues():
    """(id, epilogue) of examples/epilogues.py, and of tests/epilogues.py where it exists."""
    out = [(f"examples:{k}", v) for k, v in _module(ROOT / "examples" / "epilogues.py").REFERENCE.items()]
    extra = ROOT / "tests" / "epilogues.py"
    if extra.exists():
        mod = _module(extra)
        out += [(f"tests:{k}", v) for k, v in vars(mod).items() if isinstance(v, evtc.Epilogue)]
    return out


CASES = [(f"{name}-{arch}-{policy}", ep, arch, policy)
         for name, ep in reference_epilogues() for arch in ("sm90", "sm80") for policy in ("evtc", "cutlass")
         if not (arch == "sm80" and (policy == "cutlass" or "fp8" in name))]


def _gemm(ep, arch, policy):
    a = evtc.e4m3 if "fp8" in ep.name else evtc.bf16
    try:
        return evtc.Gemm(ep, a=a, arch=arch, plan=policy)
    except evtc.PlanError:  # many_aux has no stock plan at 128x256 (the point of the example)
        return evtc.Gemm(ep, a=a, arch=arch, plan=policy, config=evtc.GemmConfig(tile=(128, 128, 64)))


def _tensors(graph) -> set[str]:
    """Every tensor the epilogue reads or writes through memory."""
    names = {n.name for n in graph.used_inputs
             if isinstance(n, (Source, AuxLoad, RowBroadcast, ColBroadcast))
             or (isinstance(n, ScalarBroadcast) and n.by_pointer)}
    return names | {o.name for o in graph.outputs if isinstance(o, (Store, Reduction))}


@pytest.mark.parametrize("case, ep, arch, policy", CASES, ids=[c[0] for c in CASES])
def test_plan_fits_one_screen_and_lists_every_tensor(case, ep, arch, policy):
    g = _gemm(ep, arch, policy)
    text = str(g.plan)
    lines = text.rstrip("\n").splitlines()
    assert max(len(line) for line in lines) <= MAX_COLUMNS, text
    assert len(lines) <= MAX_LINES, text
    header = next(i for i, line in enumerate(lines) if line.startswith("tensor "))
    rows = lines[header + 1: header + 1 + len(plan_rows(g.plan))]
    listed = {r.split()[0] for r in rows}
    assert listed == _tensors(g.graph), text
    # every tensor has a reason
    why = " ".join(lines[header + 1 + len(rows):])
    for name in listed:
        assert f" {name}:" in why or f" {name}," in why, (name, text)


def test_reductions_say_where_they_live():
    import epilogues as E

    text = str(evtc.Gemm(E.dgelu_bgrad).plan)
    row = next(line for line in text.splitlines() if line.startswith("dbias"))
    assert "col reduction" in row and "D smem, wksp" in row
    text = str(evtc.Gemm(E.fp8_out, a=evtc.e4m3).plan)
    assert "scalar reduction" in text and "regs, atomics" in text
    text = str(evtc.Gemm(E.row_stats).plan)
    assert "row reduction" in text and "shift    col bcast" in text


def test_reasons_for_the_slots_and_reuse():
    import epilogues as E

    text = str(evtc.Gemm(E.many_aux).plan)
    assert "X: no source C: aux load X is loaded through the collective's empty C slot" in text
    assert "D: 16-bit like X, so written into its buffer once read (ReuseSmemC)" in text
    assert "bias: each thread loads its columns a subtile ahead, no smem" in text
    # C 16-bit, D 8-bit: no reuse, and the plan says why
    text = str(evtc.Gemm(E.linear_combination, c=evtc.bf16, d=evtc.e4m3).plan)
    assert "C is 16-bit, D 8-bit: no ReuseSmemC" in text


def test_a_long_name_is_cut_not_overflowing():
    ep = evtc.from_expr("D = acc + a_very_long_row_vector_name_that_goes_on_and_on_and_on[n]")
    text = str(evtc.Gemm(ep).plan)
    assert max(map(len, text.splitlines())) <= MAX_COLUMNS
    assert "…" in text


def test_cli_prints_the_same_text_as_print():
    import epilogues as E

    r = CliRunner().invoke(main, ["plan", f"{ROOT}/examples/epilogues.py:many_aux"])
    assert r.exit_code == 0
    assert r.output == format_plan(evtc.Gemm(E.many_aux).plan)


def test_colour_only_on_a_terminal():
    """On a terminal `evtc plan` adds colour and nothing else: without the escapes it is the text."""
    import io
    import re

    import epilogues as E

    from evtc.cli import print_plan

    class Tty(io.StringIO):
        def isatty(self):
            return True

    p = evtc.Gemm(E.many_aux).plan
    out = Tty()
    print_plan(p, file=out)
    coloured = out.getvalue()
    assert "\x1b[" in coloured
    assert re.sub(r"\x1b\[[0-9;]*m", "", coloured) == format_plan(p)
    plain = io.StringIO()
    print_plan(p, file=plain)
    assert plain.getvalue() == format_plan(p)
