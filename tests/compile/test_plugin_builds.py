"""Compile tests of the plugin API's two outside consumers (nvcc, no GPU): the hand-written
CUTLASS GEMM of examples/hopper_gemm (two fragment headers in one translation unit) and the GEMM
CUTLASS's cutlass_library emitter generates with a fragment as its epilogue
(examples/cutlass_library_gemm.py). Each is one nvcc build (a few minutes); the libraries load
without a driver and report the compiled ``sizeof(CollectiveEpilogue::SharedStorage)`` and
mainloop stages, which must be the fragment's plan (the sources also static_assert them)."""

import ctypes
import re

import pytest

from plugin_build import build_cutlass_library_example, build_hopper_example, examples_dir

pytestmark = pytest.mark.compile

SMEM_CAPACITY = 232448


@pytest.fixture(scope="module")
def hopper(tmp_path_factory):
    return build_hopper_example(examples_dir(tmp_path_factory.getbasetemp() / "plugin-examples"))


@pytest.fixture(scope="module")
def cutlass_library(tmp_path_factory):
    return build_cutlass_library_example(examples_dir(tmp_path_factory.getbasetemp() / "plugin-examples"))


def test_hopper_gemm_compiles_two_fragments_as_planned(hopper):
    lib_path, frags = hopper
    lib = ctypes.CDLL(str(lib_path))
    out = (ctypes.c_longlong * 3)()
    for which, header in enumerate(["bias_relu_fragment.h", "gelu_aux_colsum_fragment.h"]):
        frag = frags[header]
        assert lib.hopper_info(which, out) == 0
        epilogue_bytes, stages, kernel_bytes = list(out)
        assert epilogue_bytes == frag.smem_bytes, header
        assert stages == frag.mainloop_stages, header
        # the kernel's storage holds the epilogue's and every stage's A and B tiles (a stage's
        # 16 bytes of barriers are planned for, but may live elsewhere)
        assert frag.smem_bytes + stages * (frag.mainloop_stage_bytes - 16) <= kernel_bytes <= SMEM_CAPACITY
        assert (lib_path.parent / "fragments" / header).read_text() == frag.header()
    assert lib.hopper_info(2, out) == 5  # HOPPER_BAD_ARGUMENT
    # the fragments the GEMM was written for: its tile and schedule, two names in one TU
    assert {f.qualified_name for f in frags.values()} == {"hopper_example::BiasRelu", "hopper_example::GeluAuxColsum"}
    assert frags["gelu_aux_colsum_fragment.h"].parameter("col_sum").kind == "col_reduction"
    assert frags["gelu_aux_colsum_fragment.h"].parameter("F").kind == "store"


def test_cutlass_library_gemm_compiles_with_the_fragment_as_its_epilogue(cutlass_library):
    lib_path, frag, gen = cutlass_library
    lib = ctypes.CDLL(str(lib_path))
    lib.cl_gemm_info.restype = ctypes.c_longlong
    assert lib.cl_gemm_info(0) == frag.smem_bytes == 74240
    assert lib.cl_gemm_info(1) == frag.mainloop_stages
    assert frag.smem_bytes <= lib.cl_gemm_info(2) <= SMEM_CAPACITY
    assert lib.cl_gemm_info(7) == -1
    src = (lib_path.parent / "cl_gemm_many_aux.cu").read_text()
    name = gen.make_operation(frag).procedural_name()
    # cutlass_library's kernel and mainloop, evtc's epilogue (no epilogue CollectiveBuilder left)
    assert f"struct {name} :" in src and f"using {name}_mainloop =" in src
    assert "cutlass::epilogue::collective::CollectiveBuilder" not in src
    assert re.search(rf"using {name}_epilogue =\s*cutlass::epilogue::collective::CollectiveEpilogue<", src)
    # the plan's slot decision is in the generated arguments: X is loaded through ptr_C
    assert "static_cast<cutlass::bfloat16_t const*>(args.p_X),  // ptr_C" in src
