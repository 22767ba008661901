"""Layout probes (nvcc, no GPU): every buffer of an sm90 plan lies where the compiled
``CollectiveEpilogue::SharedStorage`` puts it, with the bytes the plan says, not only the total.

A probe build compiles an emitted kernel with ``-DEVTC_LAYOUT_PROBE``: the types up to the
collective epilogue and ``evtc_buffer_layout()`` (the offset and size of each buffer's member,
taken by the compiler), without the kernel itself, so it builds in a fraction of a full build.
"""

import ctypes
import json

import pytest

import evtc
from evtc import bf16, e4m3, f16, f32
from evtc.plan.target import SM90

pytestmark = pytest.mark.compile


@evtc.epilogue
def fp8_and_pre(acc, C, bias: evtc.RowVector[f32]):
    """An fp8 D beside a bf16 output that can take the D slot (issue 14's misreported case)."""
    pre = acc + C + bias
    return {"D": evtc.relu(pre).to(e4m3), "pre": pre}


def cases():
    import epilogues as E

    out = {}
    for name, ep in E.REFERENCE.items():
        a = e4m3 if name == "fp8_out" else bf16
        out[name] = evtc.Gemm(ep, a=a, b=a, d=bf16)
    out["gelu_aux/d_slot=F"] = evtc.Gemm(E.gelu_aux, plan={"d_slot": "F"})
    out["fp8_and_pre/d_slot=pre"] = evtc.Gemm(fp8_and_pre, c=bf16, plan={"d_slot": "pre"})
    out["fp8_and_pre"] = evtc.Gemm(fp8_and_pre, c=bf16)
    out["many_aux/stock"] = evtc.Gemm(E.many_aux, plan="cutlass", config=evtc.GemmConfig(tile=(128, 128, 64)))
    out["many_aux/shares,stages_c=2"] = evtc.Gemm(E.many_aux, plan={"share": True, "stages_c": 2})
    out["residual_scale/direct=R2"] = evtc.Gemm(E.residual_scale, plan={"direct": ["R2"]}, d=f16, a=f16)
    out["bias_relu/smem row"] = evtc.Gemm(E.bias_relu, plan={"direct": []})
    return out


def layouts(sources: dict) -> dict:
    """name -> the compiled ``evtc_buffer_layout()`` of each (source, kernel name) in ``sources``,
    from layout probe builds (-DEVTC_LAYOUT_PROBE), two at a time."""
    from evtc.compiler import build_many

    res = build_many([(src, SM90, kname) for src, kname in sources.values()], workers=2,
                     extra=("-DEVTC_LAYOUT_PROBE",))
    out = {}
    for name, r in zip(sources, res):
        if isinstance(r, Exception):
            raise r
        lib = ctypes.CDLL(str(r.library))
        lib.evtc_buffer_layout.restype = ctypes.c_char_p
        out[name] = json.loads(lib.evtc_buffer_layout())
    return out


@pytest.fixture(scope="module")
def probes():
    gemms = cases()
    found = layouts({name: (g.source, g.name) for name, g in gemms.items()})
    return {name: (g, found[name]) for name, g in gemms.items()}


@pytest.mark.parametrize("name", list(cases()))
def test_every_buffer_is_where_the_plan_says(probes, name):
    from evtc.plan.sm90_layout import SLOT_C, SLOT_D, aux_label, row_label

    g, layout = probes[name]
    p = g.plan
    seen = set()
    for b in p.buffers:
        if b.role == "C":
            label = SLOT_C
        elif b.role == "D":
            label = SLOT_D
        elif b.mode == "tma":
            label = aux_label(b.name)
        elif b.mode == "smem":
            label = row_label(b.name)
        else:
            continue  # register-direct, workspace, or shared (checked through its host below)
        off, size = layout[label]
        seen.add(label)
        assert off == b.offset, f"{b.name}: plan offset {b.offset}, compiled {off}"
        if b.mode == "shared":  # D written into C's buffer: the union member overlays C
            c = p.buffer(p.c_slot)
            assert (off, size) == tuple(layout[SLOT_C]) and c.offset == off
        else:
            assert size == b.bytes, f"{b.name}: plan {b.bytes} B, compiled {size} B"
    for b in p.buffers:  # an aux store sharing an aux load's buffer sits at that buffer
        if b.mode == "shared" and b.role == "aux_store":
            assert b.offset == layout[aux_label(b.shares_with[0])][0]
    assert layout.pop("sizeof") == [0, p.epilogue_smem_bytes]
    assert set(layout) == seen, f"compiled buffers the plan does not list: {set(layout) - seen}"
