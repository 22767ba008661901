"""``evtc demo``: what it says on machines without nvcc, GPU or torch, and for each arch."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import evtc.demo as demo


def test_gpu_without_torch_says_torch_is_missing(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch raises ImportError
    monkeypatch.setattr(demo, "_driver_gpus", lambda: ["NVIDIA H100 80GB HBM3"])
    ok, why = demo.gpu_status()
    assert not ok
    assert "a GPU is here (NVIDIA H100 80GB HBM3)" in why and "torch is not installed" in why
    assert "pip install 'evtc[torch]'" in why and "no CUDA GPU" not in why


def test_no_gpu_no_torch(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch", None)
    monkeypatch.setattr(demo, "_driver_gpus", lambda: [])
    ok, why = demo.gpu_status()
    assert not ok and why.startswith("no CUDA GPU is visible") and "pip install 'evtc[torch]'" in why


def test_cpu_only_torch_on_a_gpu_machine(monkeypatch):
    fake = SimpleNamespace(__version__="2.5.0+cpu", version=SimpleNamespace(cuda=None),
                           cuda=SimpleNamespace(is_available=lambda: False))
    monkeypatch.setitem(sys.modules, "torch", fake)
    monkeypatch.setattr(demo, "_driver_gpus", lambda: ["NVIDIA H100"])
    ok, why = demo.gpu_status()
    assert not ok and "built without CUDA" in why


@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_demo_speaks_of_its_arch_and_draws_the_plan(arch, tmp_path, monkeypatch, capsys):
    import evtc.compiler.nvcc as nvcc
    from evtc.gemm import Gemm

    monkeypatch.setattr(nvcc, "find_nvcc", lambda: Path("/usr/local/cuda/bin/nvcc"))
    art = SimpleNamespace(cached=True, library=tmp_path / "kernel.so")
    monkeypatch.setattr(Gemm, "build", lambda self, timeout=None: art)
    monkeypatch.setattr(Gemm, "info", lambda self: {"epilogue_smem_bytes": self.plan.epilogue_smem_bytes,
                                                     "mainloop_stages": self.plan.mainloop_stages})
    monkeypatch.setattr(demo, "gpu_status", lambda: (False, "no CUDA GPU visible to torch"))
    assert demo.run_demo(tmp_path, arch) == 0
    out = capsys.readouterr().out
    other = {"sm90": "sm80", "sm80": "sm90"}[arch]
    assert other not in out, out
    assert ("CollectiveEpilogue" in out) == (arch == "sm90")
    assert f"build for {arch}" in out and "run: skipped (no CUDA GPU visible to torch)" in out
    svg = (tmp_path / f"bias_relu_{arch}.svg").read_text()
    assert svg.lstrip().startswith("<?xml") and "<svg" in svg and "bias" in svg
    assert (tmp_path / f"bias_relu_{arch}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_demo_without_nvcc_says_how_to_get_it(tmp_path, monkeypatch, capsys):
    import evtc.compiler.nvcc as nvcc

    monkeypatch.setattr(nvcc, "find_nvcc", lambda: None)
    assert demo.run_demo(tmp_path, "sm90") == 0
    assert "build: skipped (no nvcc on this machine: install the CUDA toolkit" in capsys.readouterr().out


def test_demo_into_an_impossible_folder_is_a_message(tmp_path):
    from click.testing import CliRunner

    from evtc.cli import main

    blocker = tmp_path / "file"
    blocker.write_text("not a folder")
    r = CliRunner().invoke(main, ["demo", "--out-dir", str(blocker / "sub")])
    assert r.exit_code == 2 and "can't write into" in r.output and "Traceback" not in r.output
