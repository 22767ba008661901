"""Emission: the golden .cu for bias_relu, determinism, FileCheck-style key lines per node kind."""

import re

import pytest

import evtc
from evtc import bf16, e4m3, f16, f32


def test_bias_relu_golden(golden):
    import epilogues as E

    g = evtc.Gemm(E.bias_relu, a=bf16, b=bf16, c=bf16, d=bf16)
    golden("bias_relu_sm90.cu", g.source)


def test_emission_is_deterministic():
    """Two fresh traces of one function give the same bytes, in this process and in others with
    other hash seeds (set and dict orders, object ids), for every family member."""
    import subprocess
    import sys

    import epilogues as E

    def sources(ep):
        return [k.source for k in evtc.Gemm(ep).kernels()]

    a = sources(evtc.epilogue(E.many_aux.fn))
    b = sources(evtc.epilogue(E.many_aux.fn))
    assert a == b and len(a) == len(evtc.Gemm(E.many_aux).family)
    code = ("import sys, hashlib; sys.path[:0] = {path!r}; import evtc, epilogues as E; "
            "print(hashlib.sha256(''.join(k.source for k in evtc.Gemm(E.many_aux).kernels()).encode()).hexdigest())")
    import hashlib
    import os

    want = hashlib.sha256("".join(a).encode()).hexdigest()
    for seed in ("1", "2"):
        env = {**os.environ, "PYTHONHASHSEED": seed}
        from pathlib import Path

        root = Path(__file__).resolve().parents[2]
        paths = [str(Path(evtc.__file__).resolve().parents[1]), str(root / "examples")]
        proc = subprocess.run([sys.executable, "-c", code.format(path=paths)], capture_output=True, text=True, env=env)
        assert proc.returncode == 0, proc.stderr[-2000:]
        out = proc.stdout.strip()
        assert out == want


def lines_matching(src: str, pattern: str) -> list[str]:
    return [l for l in src.splitlines() if re.search(pattern, l)]


def test_every_node_kind_has_its_visitor():
    @evtc.epilogue
    def all_kinds(acc, C, alpha: float, s: evtc.DeviceScalar[f32], r: evtc.RowVector[bf16], c: evtc.ColVector[f32],
                  X: evtc.Matrix[f16]):
        y = evtc.where(acc > 0.5, alpha * acc + C, s * X) + r + c
        return {"D": y, "F": evtc.gelu(y).to(e4m3), "rmax": evtc.max(y, dim=1), "csum": evtc.sum(y, dim=0),
                "amin": evtc.min(y)}

    src = evtc.Gemm(all_kinds).source
    for pattern in ["Sm90AccFetch", r"Sm90SrcFetch<ElementC>", r"Sm90ScalarBroadcast<float", r"Sm90RowBroadcast(Direct)?<(0, )?TileShape, cutlass::bfloat16_t",
                    r"Sm90ColBroadcast<0, TileShape, float", r"Sm90AuxLoad<\d, EpilogueTile, cutlass::half_t",
                    r"Sm90AuxStore<\d, EpilogueTile, cutlass::float_e4m3_t", r"evtc::Sm90Immediate<0x3f000000u>",
                    r"Sm90Compute<evtc::Where", r"Sm90Compute<evtc::Greater", r"evtc::Sm90ColReductionAtomic<cutlass::maximum, cutlass::maximum, cutlass::atomic_maximum",
                    r"evtc::Sm90RowReductionParallel<cutlass::plus", r"Sm90ScalarReduction<cutlass::minimum, evtc::atomic_minimum",
                    r"Sm90Compute<evtc::Gelu, float"]:
        assert lines_matching(src, pattern), pattern
    # every positional initializer line of the fusion arguments names its visitor
    lines = src.splitlines()
    start = next(i for i, l in enumerate(lines) if l.strip().endswith("// epilogue"))
    end = next(i for i, l in enumerate(lines) if l.strip().endswith("// ptr_C"))
    for line in lines[start + 1:end]:
        if line.strip() and line.strip() not in ("}", "},"):
            assert "// " in line, line
    assert "static_cast<float const*>(args.p_s)" in src  # device scalar by pointer
    assert "args.s_alpha" in src


def test_row_and_column_max_in_f32_are_atomic_sums_and_16_bit_maxima_use_the_workspace():
    """NOTE [Atomic row and column max]: an f32 max/min is CUTLASS's atomic visitor (no tile
    counters, the output filled with the identity on every launch); sums and bf16 maxima keep
    evtc's workspace reduction and its header."""
    @evtc.epilogue
    def atomic_ones(acc):
        return {"D": acc, "rmax": evtc.max(acc, dim=1), "cmin": evtc.min(acc, dim=0)}

    @evtc.epilogue
    def workspace_ones(acc):
        return {"D": acc, "rsum": evtc.sum(acc, dim=1), "cmax": evtc.max(acc, dim=0).to(bf16)}

    g = evtc.Gemm(atomic_ones)
    modes = {b.name: b.mode for b in g.plan.buffers}
    assert modes["rmax"] == "atomic" and modes["cmin"] == "atomic"
    src = g.source
    assert lines_matching(src, r"evtc::Sm90ColReductionAtomic<cutlass::maximum, cutlass::maximum, cutlass::atomic_maximum")
    assert lines_matching(src, r"evtc::Sm90RowReductionAtomic<cutlass::minimum, cutlass::minimum, evtc::atomic_minimum")
    assert "ReductionParallel" not in src
    # the launch fills the outputs with the identity even when the workspace is empty
    assert "if (workspace != nullptr)" not in src
    # a stream-K member keeps the workspace (NOTE [Scalar reductions and stream-K])
    sk = evtc.Gemm(atomic_ones, config=evtc.GemmConfig(scheduler="streamk", tile=(128, 128, 64), cluster=(1, 1, 1)))
    assert {b.name: b.mode for b in sk.plan.buffers}["rmax"] == "workspace"
    assert lines_matching(sk.source, r"evtc::Sm90ColReductionParallel<cutlass::maximum")

    g = evtc.Gemm(workspace_ones)
    modes = {b.name: b.mode for b in g.plan.buffers}
    assert modes["rsum"] == "workspace" and modes["cmax"] == "workspace"
    src = g.source
    assert lines_matching(src, r"evtc::Sm90ColReductionParallel<cutlass::plus")
    assert lines_matching(src, r"evtc::Sm90RowReductionParallel<cutlass::maximum, cutlass::maximum, cutlass::maximum, 0, TileShape, cutlass::bfloat16_t")
    assert "evtc/sm90_reductions.hpp" in src and "if (workspace != nullptr)" in src


def test_row_broadcast_follows_the_plan():
    """A row broadcast the plan keeps in shared memory is CUTLASS's Sm90RowBroadcast; one it sends
    register-direct is evtc's Sm90RowBroadcastDirect, with the same arguments and no buffer."""
    import epilogues as E

    smem = evtc.Gemm(E.many_aux, plan={"direct": []})
    direct = evtc.Gemm(E.many_aux, plan={"direct": ["bias"]})
    assert lines_matching(smem.source, r"Sm90RowBroadcast<0, TileShape, float")
    assert not lines_matching(smem.source, r"using N\d+_row = evtc::Sm90RowBroadcastDirect")
    assert lines_matching(direct.source, r"using N\d+_row = evtc::Sm90RowBroadcastDirect<TileShape, float, float")
    assert not lines_matching(direct.source, r"Sm90RowBroadcast<0")
    assert direct.plan.buffer("bias").mode == "direct" and direct.plan.buffer("bias").bytes == 0
    # the CTA-N row of f32 (1 KB at N = 256) is gone from the shared storage
    assert smem.plan.buffer("bias").bytes == 256 * 4
    assert direct.plan.epilogue_smem_bytes < smem.plan.epilogue_smem_bytes
    arg = "static_cast<float const*>(args.p_bias), float(0), {cute::_0{}, cute::_1{}, args.bs_bias}"
    assert arg in smem.source and arg in direct.source


def test_every_op_emits():
    from evtc import ops

    for name, op in ops.OPS.items():
        if name in ("first", "convert", "group_quant", "glu"):  # evtc.quantize, evtc.glu: test_quantize.py, test_glu.py
            continue
        fn = _make(name, op.arity)
        src = evtc.Gemm(fn).source
        assert op.functor in src, name


def _make(name, arity):
    from evtc.frontend.trace import apply

    def fn(acc, X: evtc.Matrix):
        operands = [acc, X, acc][:arity]
        if name == "pow":
            operands = [acc, 1.5]
        return evtc.relu(apply(name, *operands))  # (not `+ acc`: a mul would fuse into an fma)

    return evtc.epilogue(fn, name=f"op_{name}")


def test_plan_is_printed_in_the_source():
    import epilogues as E

    g = evtc.Gemm(E.residual_scale)
    assert f"static_assert(sizeof(typename CollectiveEpilogue::SharedStorage) == {g.plan.epilogue_smem_bytes}" in g.source
    assert re.search(r"//\s+epilogue smem: \d+ B", g.source)


def test_tiles_of_other_widths_get_one_wgmma_across_n():
    """NOTE [Extended WGMMA shapes]: a tile whose N is not one of CuTe's default WGMMA extents
    (176, 160, 224, 80) defines CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED before CuTe is included, so
    ``ss_op_selector`` picks one 64 x N atom instead of several narrow ones; the default family's
    other sources (and so their cache keys) don't change."""
    import epilogues as E

    from evtc.emit.sm90 import needs_extended_wgmma

    assert [n for n in range(8, 257, 8) if not needs_extended_wgmma(n)] == [8, 16, 32, 64, 96, 128, 192, 256]
    assert needs_extended_wgmma(176) and needs_extended_wgmma(320) and not needs_extended_wgmma(384)
    define = "#define CUTE_SM90_EXTENDED_MMA_SHAPES_ENABLED 1"
    for n in (176, 160, 224, 80):
        cfg = evtc.GemmConfig(tile=(128, n, 64), cluster=(1, 1, 1), schedule="cooperative")
        src = evtc.Gemm(E.bias_relu, a=bf16, b=bf16, config=cfg).source
        assert define in src, n
        assert src.index(define) < src.index("#include <cute/tensor.hpp>"), n
    for k in evtc.Gemm(E.bias_relu, a=bf16, b=bf16).kernels():
        # the default family's one member of another width: NOTE [The 128x176 ping-pong tile]
        assert ("CUTE_SM90_EXTENDED" in k.source) == (k.spec.name == "pp128x176"), k.spec.name
