"""Pictures of a plan (evtc/plan/draw.py): valid SVG/PNG with the expected labels."""

import struct
import xml.etree.ElementTree as ET

import pytest
from click.testing import CliRunner

import evtc
from evtc.cli import main
from evtc.plan.draw import draw_plan
from evtc.plan.model import plan_rows

SVG = "{http://www.w3.org/2000/svg}"


def _svg_text(path) -> str:
    root = ET.parse(path).getroot()  # raises on invalid XML
    assert root.tag == f"{SVG}svg"
    return "\n".join("".join(t.itertext()) for t in root.iter(f"{SVG}text"))


@pytest.mark.parametrize("name", ["many_aux", "row_stats", "dgelu_bgrad"])
def test_svg_has_the_map_and_the_dag(name, tmp_path):
    import epilogues as E

    g = evtc.Gemm(getattr(E, name))
    path = draw_plan(g.graph, g.plan, tmp_path / "p.svg")
    text = _svg_text(path)
    p = g.plan
    assert f"shared memory of one block: {p.smem_capacity} B" in text
    assert f"{p.mainloop_stages} mainloop stages x {p.mainloop_stage_bytes} B" in text
    for k in range(1, p.mainloop_stages + 1):
        assert f"mainloop stage {k}" in text
    for r in plan_rows(p):
        assert r.name in text, r.name  # every tensor in the DAG
        if r.bytes:
            assert f"{r.name}: {r.where}" in text and f"{r.bytes} B @ {r.offset}" in text
        if r.mode == "shared":
            assert f"{r.name} in {r.host}'s buffer" in text
    assert "TMA through shared memory" in text and "register-direct" in text  # the legend


def test_png_is_a_png(tmp_path):
    import epilogues as E

    g = evtc.Gemm(E.bias_relu)
    data = draw_plan(g.graph, g.plan, tmp_path / "p.png").read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and data[12:16] == b"IHDR"
    w, h = struct.unpack(">II", data[16:24])
    assert w > 500 and h > 400


def test_svg_is_deterministic(tmp_path):
    import epilogues as E

    g = evtc.Gemm(E.gelu_aux)
    a = draw_plan(g.graph, g.plan, tmp_path / "a.svg").read_text()
    b = draw_plan(g.graph, g.plan, tmp_path / "b.svg").read_text()
    assert a == b


def test_unknown_suffix(tmp_path):
    import epilogues as E

    g = evtc.Gemm(E.bias_relu)
    with pytest.raises(ValueError, match=".svg or .png"):
        draw_plan(g.graph, g.plan, tmp_path / "p.jpg")


def test_cli_writes_svg_png_and_dot(tmp_path):
    from pathlib import Path

    ex = Path(__file__).resolve().parents[2] / "examples" / "epilogues.py"
    svg, png, dot = tmp_path / "m.svg", tmp_path / "m.png", tmp_path / "m.dot"
    r = CliRunner().invoke(main, ["plan", f"{ex}:many_aux", "--svg", str(svg), "--png", str(png), "--dot", str(dot)])
    assert r.exit_code == 0, r.output
    assert "P in Y's buffer" in _svg_text(svg)
    assert png.read_bytes()[:4] == b"\x89PNG" and "digraph" in dot.read_text()


def test_cli_picture_with_a_wrong_suffix_is_a_message(tmp_path):
    from pathlib import Path

    ex = Path(__file__).resolve().parents[2] / "examples" / "epilogues.py"
    r = CliRunner().invoke(main, ["plan", f"{ex}:bias_relu", "--svg", str(tmp_path / "p.jpg")])
    assert r.exit_code == 2 and "name it p.svg" in r.output  # (checked before planning: test_hostile_sweep_s4)
