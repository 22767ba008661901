"""The plugin examples without a compiler: the cutlass_library generator's source and its checks,
and the hand-written GEMM binds every run-time parameter of its fragments (a Params field it
forgot would compile and stay null)."""

import re
from pathlib import Path

import pytest
from click.testing import CliRunner

import evtc
import evtc.plugin
from evtc.errors import FragmentError
from plugin_build import _load

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


@pytest.fixture(scope="module")
def generator():
    return _load(EXAMPLES / "cutlass_library_gemm.py", "cutlass_library_gemm")


@pytest.fixture(scope="module")
def many_aux_fragment():
    import epilogues as E

    return evtc.plugin.lower(E.many_aux, tile=(128, 256, 64), cluster=(2, 1, 1), a="bf16", d="bf16", name="ManyAux",
                             namespace="cl_evtc")


def test_cutlass_library_source_has_its_kernel_and_evtcs_epilogue(generator, many_aux_fragment):
    frag = many_aux_fragment
    op = generator.make_operation(frag)
    src = generator.generate(frag)
    name = op.procedural_name()
    assert frag.declarations in src and "${" not in src
    assert f"struct {name} :" in src and "cutlass::epilogue::collective::CollectiveBuilder" not in src
    assert f"cutlass::epilogue::Sm90TmaWarpSpecialized<{frag.stages_c}, {frag.stages_d}, {frag.fragment_size}, true, " \
           "false>" in src
    assert f"== {frag.smem_bytes}," in src
    fields = re.search(r"typedef struct cl_gemm_args_t \{\n(.*?)\n\} cl_gemm_args_t;", src, re.S).group(1)
    assert [tuple(line.strip().rstrip(";").rsplit(" ", 1)[::-1]) for line in fields.splitlines()] == \
           [(n, t) for n, t in generator.abi_fields(frag)]
    assert src.count("#include <evtc/driver_shim.hpp>") == 1
    assert generator.generate(frag) == src  # deterministic


@pytest.mark.parametrize("change, message", [
    (lambda op: setattr(op.tile_description, "tile_shape", [128, 128, 64]), r"tile \(128, 128, 64\) is not the tile"),
    (lambda op: setattr(op.tile_description, "stages", 5), "5 mainloop stages"),
    (lambda op: setattr(op.tile_description, "cluster_shape", [8, 1, 1]), "is not a legal sm90 cluster"),
])
def test_cutlass_library_emitter_refuses_an_operation_the_fragment_was_not_planned_for(generator, many_aux_fragment,
                                                                                       change, message):
    op = generator.make_operation(many_aux_fragment)
    change(op)
    with pytest.raises(FragmentError, match=message):
        generator.EmitGemmUniversal3xInstanceWithEvtc(many_aux_fragment).emit(op)


def test_cutlass_library_emitter_refuses_other_c_and_schedule(generator, many_aux_fragment):
    from cutlass_library.library import DataType, KernelScheduleType, TensorDescription, LayoutType

    op = generator.make_operation(many_aux_fragment)
    op.C = TensorDescription(DataType.f16, LayoutType.RowMajor, 8)
    with pytest.raises(FragmentError, match=r"c=f16: its C slot holds X \(bf16\)"):
        generator.EmitGemmUniversal3xInstanceWithEvtc(many_aux_fragment).emit(op)
    op = generator.make_operation(many_aux_fragment)
    op.kernel_schedule = KernelScheduleType.TmaWarpSpecializedPingpong
    with pytest.raises(FragmentError, match="not the schedule it was planned for"):
        generator.EmitGemmUniversal3xInstanceWithEvtc(many_aux_fragment).emit(op)


def test_hopper_gemm_binds_every_placeholder_of_its_fragments():
    build = _load(EXAMPLES / "hopper_gemm" / "build.py", "hopper_gemm_build")
    src = (EXAMPLES / "hopper_gemm" / "hopper_gemm.cu").read_text()
    frags = build.fragments()
    for header, fn in (("bias_relu_fragment.h", "hopper_bias_relu"), ("gelu_aux_colsum_fragment.h",
                                                                     "hopper_gelu_aux_colsum")):
        frag = frags[header]
        body = src.split(f"HOPPER_EXPORT int {fn}(", 1)[1].split("\n}\n", 1)[0]
        assert f"using Fragment = {frag.qualified_name};" in body
        bound = re.findall(r"epilogue\.(\w+) = ", body)
        assert sorted(bound) == sorted(p.name for p in frag.placeholders), header
        assert f'#include "{header}"' in src
        frag.check(tile=(128, 128, 64), schedule="cutlass::gemm::KernelTmaWarpSpecializedCooperative",
                   cluster=(2, 1, 1), a="bf16", b="bf16", version=1)
    # the configuration the C++ declares is the one build.py lowers for
    assert "using TileShape = cute::Shape<cute::_128, cute::_128, cute::_64>;" in src
    assert "using ClusterShape = cute::Shape<cute::_2, cute::_1, cute::_1>;" in src
    assert build.TILE == (128, 128, 64) and build.CLUSTER == (2, 1, 1)


def test_hopper_gemm_command_in_its_comment_makes_the_same_header(tmp_path):
    """The `evtc emit --fragment` line quoted at the top of hopper_gemm.cu writes the header
    build.py writes."""
    from evtc.cli import main

    build = _load(EXAMPLES / "hopper_gemm" / "build.py", "hopper_gemm_build")
    src = (EXAMPLES / "hopper_gemm" / "hopper_gemm.cu").read_text()
    line = re.search(r"//   evtc emit (.*?)\\\n//\s+(.*?)\n", src)
    args = [str(EXAMPLES.parent / a) if a.startswith("examples/") else a
            for a in (line.group(1) + " " + line.group(2)).split()]
    out = tmp_path / "bias_relu_fragment.h"
    args[args.index("-o") + 1] = str(out)
    res = CliRunner().invoke(main, ["emit", *args])
    assert res.exit_code == 0, res.output
    assert out.read_text() == build.fragments()["bias_relu_fragment.h"].header()
