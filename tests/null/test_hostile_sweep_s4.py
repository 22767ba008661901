"""A hostile-input sweep (fourth round), no GPU and no nvcc: evtc.GroupedGemm's call (offsets on
no device, outputs that overlap themselves, A or an input, N = 0 and K = 0), the torch ops of
Gemm and GroupedGemm (their arguments and their fake implementations under FakeTensorMode),
torch-written epilogues that slice, the torch backend's addmm / baddbmm with beta = 0, `evtc
plan --svg/--png`, and evtc.Conv's choose, member and ConvProblem. Each case escaped as a raw
Python exception, started a build, or was accepted into a wrong result before its fix: now an
EvtcError (or a usage error of the command line) naming the argument."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

import evtc
from evtc.errors import ArgumentError, ConfigError, UnsupportedOpError

torch = pytest.importorskip("torch")

import evtc.grouped as grouped  # noqa: E402

bf = torch.bfloat16
T, K, E, N = 10, 64, 3, 48


class _Launched(Exception):
    """Raised where the grouped call would load its kernel: every check passed."""


@pytest.fixture
def on_cpu(no_build, monkeypatch):
    """GroupedGemm calls with CPU tensors standing in for CUDA ones (the device check lets them
    through) and a sentinel where the kernel would be loaded, after every check."""

    def on_cpu_too(t, what, device, name):
        if not isinstance(t, torch.Tensor):
            raise ArgumentError(f"{what} is a {type(t).__name__}, not a torch tensor")

    def launched(self, member):
        raise _Launched(member)

    monkeypatch.setattr(grouped, "_check_cuda", on_cpu_too)
    monkeypatch.setattr(grouped.GroupedGemm, "_loaded", launched)


def _operands(n=N, k=K):
    return torch.zeros(T, k, dtype=bf), torch.zeros(E, n, k, dtype=bf), torch.tensor([3, 6, 10], dtype=torch.int32)


# ---- GroupedGemm: offsets, zero extents -----------------------------------------------------------


def test_grouped_offsets_on_the_meta_device_are_refused(on_cpu):
    # NotImplementedError: Cannot copy out of meta tensor; no data!
    gg = evtc.GroupedGemm("D = relu(acc + bias[n])")
    A, B, _ = _operands()
    with pytest.raises(ArgumentError, match="offs is on meta"):
        gg.run_eager(A, B, torch.empty(E, dtype=torch.int32, device="meta"), bias=torch.zeros(E, N))
    with pytest.raises(_Launched):  # a CPU tensor is still checked and copied
        gg.run_eager(A, B, torch.tensor([3, 6, 10], dtype=torch.int32), bias=torch.zeros(E, N))


def test_grouped_n_zero_returns_empty_outputs_without_a_build(on_cpu):
    # N = 0 went on to the kernel's build and launch (T = 0 and E = 0 returned at once)
    gg = evtc.GroupedGemm("D = acc; s = sum(acc, dim=1)")
    A, B, offs = _operands(n=0)
    got = gg.run_eager(A, B, offs)
    assert tuple(got["D"].shape) == (T, 0)
    assert tuple(got["s"].shape) == (T,) and torch.equal(got["s"], torch.zeros(T))  # the sum's identity


def test_grouped_k_zero_says_so(on_cpu):
    # was: "A's row stride (1 elements) is not a multiple of 16 bytes"
    gg = evtc.GroupedGemm("D = relu(acc)")
    A, B, offs = _operands(k=0)
    with pytest.raises(ArgumentError, match="K = 0 .*no zero-K path"):
        gg.run_eager(A, B, offs)


# ---- GroupedGemm: outputs that overlap ------------------------------------------------------------


def test_grouped_out_that_is_a_reads_tensor_is_refused(on_cpu):
    # the mainloop read A while the epilogue stored into it: accepted, a race
    gg = evtc.GroupedGemm("D = relu(acc + bias[n])")
    buf = torch.zeros(T, K, dtype=bf)
    with pytest.raises(ArgumentError, match="out overlaps the input 'A'"):
        gg.run_eager(buf, torch.zeros(E, K, K, dtype=bf), _operands()[2], out=buf, bias=torch.zeros(K))


def test_grouped_out_that_overlaps_itself_is_refused(on_cpu):
    # an expanded (T, N) view of one row passed the 16-byte row check (stride 0)
    gg = evtc.GroupedGemm("D = relu(acc + bias[n])")
    A, B, offs = _operands()
    with pytest.raises(ArgumentError, match="out overlaps itself"):
        gg.run_eager(A, B, offs, out=torch.zeros(1, N, dtype=bf).expand(T, N), bias=torch.zeros(E, N))


def test_grouped_outputs_that_overlap_each_other_or_part_of_c_are_refused(on_cpu):
    A, B, offs = _operands()
    two = evtc.GroupedGemm("D = acc; F = acc * 2")
    big = torch.zeros(T, 2 * N, dtype=bf)
    with pytest.raises(ArgumentError, match=r"out\['F'\] overlaps an output out\['D'\]"):
        two.run_eager(A, B, offs, out={"D": big[:, :N], "F": big[:, 8:N + 8]})
    with pytest.raises(_Launched):  # two column blocks of one buffer lie side by side
        two.run_eager(A, B, offs, out={"D": big[:, :N], "F": big[:, N:]})
    src = evtc.GroupedGemm("D = acc + C")
    buf = torch.zeros(T + 1, N, dtype=bf)
    with pytest.raises(ArgumentError, match="out overlaps the input 'C'"):
        src.run_eager(A, B, offs, out=buf[1:], C=buf[:-1])
    C = torch.zeros(T, N, dtype=bf)
    with pytest.raises(_Launched):  # exactly C: in place
        src.run_eager(A, B, offs, out=C, C=C)
