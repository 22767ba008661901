"""The grouped kernel's shared-memory plan against the compiler (nvcc, no GPU; issue 39): a
layout probe of each (-DEVTC_LAYOUT_PROBE: the types up to the pointer-array collective epilogue,
whose ``sizeof(SharedStorage)`` the source static_asserts equal to the plan's) reports every
buffer where the plan puts it and the plan's total."""

import pytest

import evtc
from evtc import f32
from evtc.grouped import GroupedGemm

pytestmark = pytest.mark.compile


@evtc.epilogue
def per_expert(acc, weight: evtc.ColVector[f32], alpha: evtc.DeviceScalar[f32], bias: evtc.RowVector[f32]):
    return weight * (alpha * acc + bias)


@evtc.epilogue
def swiglu(acc, bias: evtc.RowVector[f32]):
    """evtc.glu in the grouped kernel: void C and D, the pairs through the group table."""
    return evtc.glu(acc + bias, act="silu")


def cases():
    import epilogues as E

    return {"bias_relu/coop128x128": GroupedGemm(E.bias_relu, member="coop128x128"),
            "per_expert/pp64x128": GroupedGemm(per_expert, member="pp64x128"),
            "swiglu/coop128x256": GroupedGemm(swiglu, member="coop128x256"),
            # NOTE [Reductions in the grouped kernel]: per token, per expert, no shared memory
            "row_stats/pp64x128": GroupedGemm(E.row_stats, member="pp64x128"),
            "dgelu_bgrad/coop128x128": GroupedGemm(E.dgelu_bgrad, member="coop128x128")}


@pytest.fixture(scope="module")
def probes():
    from test_layout_sm90 import layouts

    gg = cases()
    found = layouts({name: (g.source(), g.name) for name, g in gg.items()})
    return {name: (g, found[name]) for name, g in gg.items()}


@pytest.mark.parametrize("name", list(cases()))
def test_grouped_plan_matches_the_compiled_layout(probes, name):
    from evtc.plan.sm90_layout import SLOT_C, SLOT_D, row_label

    g, layout = probes[name]
    p = g.kernel().plan
    assert layout.pop("sizeof") == [0, p.epilogue_smem_bytes]
    for b in p.buffers:
        label = {"C": SLOT_C, "D": SLOT_D}.get(b.role) or (row_label(b.name) if b.mode == "smem" else None)
        if label is None:
            continue
        assert layout.pop(label) == [b.offset, b.bytes], b.name
    assert not layout, f"compiled buffers the plan does not list: {layout}"
