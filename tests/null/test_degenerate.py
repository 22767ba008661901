"""Degenerate epilogues as a class, on every route that emits C++: a GEMM with no epilogue
(``D = acc``), only the source C, only an aux load, an output that is an input, a reduction as
the only output, only a scalar. Each either emits a source whose initializers are well formed on
sm90 and sm80, as a GEMM, a convolution and a plugin fragment, or is refused with an EvtcError
that says what to do, before anything is built.

The C++ check is structural (no nvcc here; tests/compile/test_readme_build.py builds the bare
epilogue with the README's nvcc line): with ``//`` comments stripped, every brace initializer's
fields are separated by commas. It caught ``{}  // N0_acc,`` (the comma inside the comment of a
bare leaf's initializer, issue 37), which nvcc refused with ``expected a ","``.
"""

import re

import pytest

import evtc
from evtc import bf16
from evtc.errors import EvtcError

#: (name, expression, {arch: None if it emits, else a fragment of the refusal})
CASES = [
    ("bare_acc", "D = acc", {}),
    ("only_c", "D = C", {}),
    ("scaled_c", "D = alpha*C", {}),
    ("only_aux", "D = X[m, n]", {}),
    ("aux_passthrough", "D = acc; F = X[m, n]", {}),
    ("acc_twice", "D = acc; F = acc", {}),
    ("only_row_reduction", "row_max = max(acc, dim=1)", {"sm90": "return the M x N value"}),
    ("only_scalar", "D = alpha", {"sm90": "must depend on acc", "sm80": "must depend on acc"}),
    ("only_constant", "D = 2.0", {"sm90": "must depend on acc", "sm80": "must depend on acc"}),
    ("only_row_vector", "D = bias[n]", {"sm90": "must depend on acc", "sm80": "must depend on acc"}),
]

_COMMENT = re.compile(r"//[^\n]*")
# what starts a field of the initializers evtc emits (a visitor's arguments, the collective's
# pointers and strides, the mainloop's and the kernel's fields)
_FIELD = re.compile(r"(\{|nullptr|static_cast|Stride|args\.|hw_info|cute::|float\(|typename|cutlass::)")


def initializer_errors(source: str) -> list[str]:
    """Places in ``source`` where a brace initializer's field ends (a line ending in ``}``)
    and the next line starts another field with no comma between them, comments stripped as the
    C++ compiler sees them."""
    lines = [x.strip() for x in _COMMENT.sub("", source).splitlines()]
    lines = [x for x in lines if x]
    # (a field's line ends with its comma or is the last field; a statement's ends with ';', a
    # function's or a block's head with '{')
    return [f"{a} | {b}" for a, b in zip(lines, lines[1:])
            if a.endswith("}") and _FIELD.match(b) and not b.endswith(";") and (b == "{" or not b.endswith("{"))]


def test_the_check_finds_a_comma_inside_a_comment():
    """The check fails the source evtc emitted for ``D = acc`` before the fix."""
    broken = "    {\n      {}  // N0_acc,\n      nullptr,  // ptr_C\n      StrideC{}  // dC\n    },\n"
    fixed = "    {\n      {},  // N0_acc\n      nullptr,  // ptr_C\n      StrideC{}  // dC\n    },\n"
    assert initializer_errors(broken) and not initializer_errors(fixed)
    nested = "{\n  {\n    {},  // a\n    {}  // b\n  }\n  nullptr,  // ptr_C\n}\n"
    assert initializer_errors(nested)


def _gemm_source(expr: str, arch: str) -> str:
    return evtc.Gemm(expr, a=bf16, arch=arch).source


def _conv_source(expr: str, arch: str) -> str:
    return evtc.Conv(expr, kind="fprop", a=bf16, arch=arch, config={} if arch == "sm80" else None).source


def _fragment_source(expr: str, arch: str) -> str:
    from evtc.plugin import lower

    frag = lower(expr, arch=arch, tile=(128, 128, 64), a=bf16)
    return frag.header() + "\n;\n" + frag.epilogue_arguments  # (';': two texts, not one initializer)


ROUTES = {"gemm": _gemm_source, "conv": _conv_source, "fragment": _fragment_source}


@pytest.mark.parametrize("route", list(ROUTES))
@pytest.mark.parametrize("arch", ["sm90", "sm80"])
@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_degenerate_epilogues_emit_or_are_refused(case, arch, route):
    name, expr, refused = case
    emit = ROUTES[route]
    if route == "fragment" and arch == "sm80":  # fragments are sm90 collective epilogues
        refused = {"sm80": "epilogue fragments are CUTLASS 3.x sm90"}
    if arch in refused:
        with pytest.raises(EvtcError) as e:
            emit(expr, arch)
        assert refused[arch] in str(e.value)
        assert "Traceback" not in str(e.value)
        return
    src = emit(expr, arch)
    assert initializer_errors(src) == [], f"{name} on {arch} ({route}): a field without its comma"
    # the emitted source is deterministic (the cache key): the same epilogue, the same bytes
    assert src == emit(expr, arch)


def test_bare_epilogue_initializer_is_one_empty_field():
    """``D = acc`` on sm90: the fusion arguments are a single ``{}`` (Sm90AccFetch), followed by a
    comma before the collective's ptr_C."""
    src = _gemm_source("D = acc", "sm90")
    assert re.search(r"\{\},  // N0_acc\n\s*nullptr,  // ptr_C", src), src[src.find("// epilogue"):][:400]
