"""Build the hand-written Hopper GEMM of this folder (hopper_gemm.cu) with evtc fragments as its
epilogues.

Input: this GEMM's configuration (:data:`TILE`, :data:`CLUSTER`, :data:`SCHEDULE`, bf16
operands) and its two epilogues. Output: ``bias_relu_fragment.h`` and
``gelu_aux_colsum_fragment.h`` (``evtc.plugin.lower(...).header()``, what
``evtc emit --fragment`` writes) and the shared library ``hopper_gemm-<hash>.so`` in the output
folder::

    python examples/hopper_gemm/build.py /tmp/hopper_gemm     # prints the library's path

hopper_gemm.cu is the consumer: it includes both headers and builds its own mainloop, kernel and
host code around them (its C ABI is described at its top).
"""

from __future__ import annotations

import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))  # examples/: epilogues.py, plugin_build.py

import evtc  # noqa: E402
import evtc.plugin  # noqa: E402
from evtc import f32  # noqa: E402

import epilogues  # noqa: E402
from plugin_build import nvcc_shared  # noqa: E402

#: hopper_gemm.cu's configuration (its TileShape, ClusterShape, KernelSchedule, ElementA/B).
TILE = (128, 128, 64)
CLUSTER = (2, 1, 1)
SCHEDULE = "cooperative"
OPERANDS = evtc.bf16
NAMESPACE = "hopper_example"


@evtc.epilogue
def gelu_aux_colsum(acc, bias: evtc.RowVector[f32]):
    """Training forward with the bias gradient's statistics: F = acc + bias[n] is saved (an aux
    store), D = gelu(F), and col_sum[n] = sum over m of F (a column reduction)."""
    F = acc + bias
    return {"D": evtc.gelu(F), "F": F, "col_sum": evtc.sum(F, dim=0)}


#: header file -> (epilogue, C++ struct name), as hopper_gemm.cu includes them.
EPILOGUES = {
    "bias_relu_fragment.h": (epilogues.bias_relu, "BiasRelu"),
    "gelu_aux_colsum_fragment.h": (gelu_aux_colsum, "GeluAuxColsum"),
}


def fragments() -> dict[str, evtc.plugin.EpilogueFragment]:
    """The two fragments, lowered for this GEMM's configuration (header file -> fragment)."""
    return {header: evtc.plugin.lower(ep, tile=TILE, cluster=CLUSTER, schedule=SCHEDULE, a=OPERANDS, b=OPERANDS,
                                      c=evtc.bf16, d=evtc.bf16, name=name, namespace=NAMESPACE)
            for header, (ep, name) in EPILOGUES.items()}


def build(out_dir: Path | str) -> tuple[Path, dict[str, evtc.plugin.EpilogueFragment]]:
    """Write the fragment headers into ``out_dir/fragments`` and build the library.

    Returns:
        (the library's path, header file -> fragment).

    Raises:
        RuntimeError: nvcc failed (the message names the log).
    """
    out = Path(out_dir)
    frags = fragments()
    headers = out / "fragments"
    headers.mkdir(parents=True, exist_ok=True)
    for header, frag in frags.items():
        frag.check(tile=TILE, schedule=SCHEDULE, cluster=CLUSTER, a=OPERANDS, b=OPERANDS, version=1)
        path = headers / header
        text = frag.header()
        if not path.exists() or path.read_text() != text:
            path.write_text(text)
    lib = nvcc_shared(HERE / "hopper_gemm.cu", out, fragment=next(iter(frags.values())), header_dirs=[headers],
                      name="hopper_gemm")
    return lib, frags


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit("usage: python examples/hopper_gemm/build.py OUTPUT_FOLDER")
    print(build(sys.argv[1])[0])
