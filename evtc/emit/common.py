"""Helpers shared by the emitters: the Jinja2 environment, C literals, the args struct.

Input: values from a Graph and a Plan. Output: strings the templates lay out.
"""

from __future__ import annotations

import functools
import json
import math
import struct

import jinja2

from evtc.dtypes import DType
from evtc.resources import data_path


@functools.lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    """The template environment: ``codegen_templates/``, StrictUndefined, no autoescape,
    ``{% %}`` blocks trimmed so the emitted C++ reads as if written by hand."""
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(data_path("codegen_templates"))),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(template: str, **values) -> str:
    return environment().get_template(template).render(**values)


def c_string(text: str) -> str:
    """``text`` as a C string literal (split into lines for readability)."""
    out = []
    for chunk in [text[i:i + 100] for i in range(0, len(text), 100)] or [""]:
        esc = chunk.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
        out.append(f'"{esc}"')
    return "\n    ".join(out)


def float_bits(v: float) -> str:
    """The f32 bit pattern of ``v`` as a C unsigned literal (for ``evtc::Sm90Immediate``)."""
    return "0x%08xu" % struct.unpack("<I", struct.pack("<f", v))[0]


def float_literal(v: float) -> str:
    """``v`` as a C++ float expression that is exact for any f32 value (inf and NaN included)."""
    if math.isnan(v):
        return "cutlass::platform::numeric_limits<float>::quiet_NaN()"
    if math.isinf(v):
        return ("-" if v < 0 else "") + "cutlass::platform::numeric_limits<float>::infinity()"
    return f"{float(v)!r}f"


def element(dtype: DType) -> str:
    return dtype.cutlass


def json_compact(obj) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"))
