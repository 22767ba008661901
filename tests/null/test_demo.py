"""``evtc demo``: what it says on machines without nvcc, GPU or torch, and for each arch."""

import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import evtc.cli.demo as demo


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


def _fake_builds(monkeypatch, tmp_path, cached=True, seconds=0.0):
    """nvcc is there, every kernel build is a fake that records the kernel (none may build the
    whole family through Gemm.build), and the kernel's info agrees with the plan."""
    import time

    import evtc.compiler.nvcc as nvcc
    from evtc.gemm import Gemm, Kernel

    built = []

    def build(self, timeout=None):
        built.append(self)
        time.sleep(seconds)
        return SimpleNamespace(cached=cached, library=tmp_path / f"{self.spec.name}.so")

    def whole_family(self, *a, **kw):
        raise AssertionError("the demo built the whole family (Gemm.build)")

    monkeypatch.setattr(nvcc, "find_nvcc", lambda: Path("/usr/local/cuda/bin/nvcc"))
    monkeypatch.setattr(Kernel, "build", build)
    monkeypatch.setattr(Gemm, "build", whole_family)
    monkeypatch.setattr(Gemm, "info", lambda self: {"epilogue_smem_bytes": self.plan.epilogue_smem_bytes,
                                                     "mainloop_stages": self.plan.mainloop_stages})
    return built


@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_demo_speaks_of_its_arch_and_draws_the_plan(arch, tmp_path, monkeypatch, capsys):
    built = _fake_builds(monkeypatch, tmp_path)
    monkeypatch.setattr(demo, "gpu_status", lambda: (False, "no CUDA GPU visible to torch"))
    assert demo.run_demo(tmp_path, arch) == 0
    out = capsys.readouterr().out
    other = {"sm90": "sm80", "sm80": "sm90"}[arch]
    assert other not in out, out
    assert ("CollectiveEpilogue" in out) == (arch == "sm90")
    assert f"build for {arch}" in out and "run: skipped (no CUDA GPU visible to torch)" in out
    # without a GPU only the kernel it emitted and drew is built (not the 11 of the family)
    assert [k.spec.name for k in built] == ["large"]
    assert f"kernel 1/1: bias_relu[large]" in out and "2-4 minutes on a 2-core machine" in out
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
    assert r.exit_code == 2 and "does not exist" in r.output and "Traceback" not in r.output
    # refused before anything is traced or planned (it printed the IR and the plan first)
    for bad, says in ((str(blocker), "is not a folder"), ("/dev/null", "is not a folder"),
                      (str(tmp_path / "a" / "b"), "does not exist")):
        r = CliRunner().invoke(main, ["demo", "--out-dir", bad])
        assert r.exit_code == 2 and says in r.output and "IR after passes" not in r.output, (bad, r.output)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
    from evtc.cli.commands import _out_dir

    assert _out_dir(str(tmp_path)) == tmp_path and _out_dir(str(tmp_path / "new")) == tmp_path / "new"


def test_demo_prints_progress_while_a_build_runs(tmp_path, monkeypatch, capsys):
    """A line every HEARTBEAT_S seconds while nvcc runs, whether or not output is a terminal
    (capsys is not one)."""
    _fake_builds(monkeypatch, tmp_path, cached=False, seconds=0.35)
    monkeypatch.setattr(demo, "HEARTBEAT_S", 0.1)
    monkeypatch.setattr(demo, "gpu_status", lambda: (False, "no CUDA GPU visible to torch"))
    assert demo.run_demo(tmp_path, "sm90") == 0
    out = capsys.readouterr().out
    assert out.count("... still building bias_relu[large]:") >= 2, out
    assert "kernel 1/1: built in 0 s" in out


def test_demo_on_a_gpu_builds_the_kernels_its_runs_choose(tmp_path, monkeypatch, capsys):
    import numpy as np

    import evtc.testing.bench
    import evtc.testing as T
    from evtc import bf16

    built = _fake_builds(monkeypatch, tmp_path)
    chosen = []

    def fake_chosen_kernel(gemm, p, device=None):
        k = real_chosen(gemm, p, device=device)
        chosen.append(k)
        return k

    real_chosen = T.chosen_kernel
    monkeypatch.setattr(T, "chosen_kernel", fake_chosen_kernel)
    monkeypatch.setattr(demo, "gpu_status", lambda: (True, "FAKE GPU"))
    monkeypatch.setattr(T, "check", lambda gemm, p, seed=0: {
        "D": T.compare("D", np.array([1.0, 2.0]), np.array([1.0, 2.0]), bf16)})
    monkeypatch.setattr(evtc.testing.bench, "bench_gemm", lambda gemm, *shape, **kw: {
        "evtc_ms": 1.0, "cublas_ms": 1.0, "eager_ms": 2.0, "evtc_over_cublas": 1.0, "eager_over_evtc": 2.0})
    assert demo.run_demo(tmp_path, "sm90") == 0
    out = capsys.readouterr().out
    want = list({id(k): k for k in [built[0]] + chosen}.values())  # the primary, then each run's member once
    assert built == want and len(built) < 11, [k.spec.name for k in built]
    assert {k.spec.name for k in chosen} <= {k.spec.name for k in built}
    # the verdict names the worst element's error and its bound, not a ratio against "bound 1.0"
    assert "(bound 1.0e+00)" not in out
    assert "M,N,K,L = (4096, 4096, 4096, 1): D: ok; worst element (0,): error 0.00e+00 (0 ulps of bf16), allowed" in out
