"""Hardware facts live on Target alone (issue 35): per device name, with the arch's reference
part as the default."""

import pytest

from evtc.errors import ConfigError
from evtc.plan.target import SM90, get_target


def test_known_parts_get_their_facts():
    h200 = get_target("sm90", "NVIDIA H200")
    assert (h200.sm_count, h200.device) == (132, "NVIDIA H200") and h200.mem_bandwidth > SM90.mem_bandwidth
    assert get_target("sm90", "NVIDIA H100 PCIe").sm_count == 114  # not the SXM part's 132
    assert get_target("sm90", "NVIDIA H100 80GB HBM3") == SM90.__class__(**{**SM90.__dict__, "device": "NVIDIA H100 80GB HBM3"})
    assert get_target("sm90", "a GPU nobody knows") is SM90 and get_target("sm90") is SM90
    assert get_target("sm80", "NVIDIA A100-SXM4-80GB").sm_count == 108
    with pytest.raises(ConfigError, match="unknown arch"):
        get_target("sm75")


def test_no_module_restates_the_sm_count():
    """The SM count, bandwidths and FLOP rates are read from a Target, not written as literals."""
    import re
    from pathlib import Path

    import evtc

    pkg = Path(evtc.__file__).parent
    offenders = []
    for f in pkg.rglob("*.py"):
        if f.name == "target.py":
            continue
        for i, line in enumerate(f.read_text().splitlines(), 1):
            code = line.split("#", 1)[0]
            if re.search(r"=\s*132\b|\b(800e12|3\.0e12|2\.5e12|3\.35e12)\b", code) and '"""' not in line:
                offenders.append(f"{f.relative_to(pkg)}:{i}: {line.strip()}")
    assert offenders == [], offenders
