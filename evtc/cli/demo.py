"""``evtc demo``: the bundled example, end to end, saying what happens at each step.

Input: nothing but the machine (nvcc? a GPU? torch?). Output: ``<out-dir>/bias_relu_<arch>.cu``,
the plan's picture (``bias_relu_<arch>.svg`` and ``.png``: the shared-memory map and the DAG
coloured by buffer mode) and a report; exit status 0 when every step that could run passed.
Each skipped step says why and what would make it run.

It builds only the kernels it runs (a Gemm is a family of kernels, and :meth:`evtc.Gemm.build`
builds them all: 11 sm90 kernels, about 19 minutes of nvcc on a 2-core machine): without a GPU
the primary kernel, whose source it emits and whose storage it checks; with one, also the
member each of its runs chooses (:func:`evtc.testing.chosen_kernel`). Every build prints a line
before and after, and one every 30 s while nvcc runs, on a terminal or into a log alike.
"""

from __future__ import annotations

import importlib.util
import threading
import time
from pathlib import Path

from evtc.errors import EvtcError
from evtc.resources import data_path

__all__ = ["gpu_status", "load_examples", "run_demo"]

#: What the kernel's info call reports as the epilogue's shared storage, per arch.
STORAGE = {
    "sm90": "sizeof(CollectiveEpilogue::SharedStorage)",
    "sm80": "the visitors' shared storage (FusionCallbacks::SharedStorage)",
}


#: the problems the demo checks against the float64 reference on a GPU (M, N, K, L), and the one
#: it times
RUNS = ((4096, 4096, 4096, 1), (1000, 1000, 1000, 1), (777, 1031, 512, 3))
BENCH = (8192, 8192, 8192, 1)
#: what a cold build of one kernel takes on a small machine (measured: one sm90 kernel, 2 cores)
COLD_BUILD = "a cold build of one kernel takes about 2-4 minutes on a 2-core machine"
#: seconds between the "still building" lines
HEARTBEAT_S = 30.0


def _step(n: int, text: str) -> None:
    print(f"[{n}] {text}", flush=True)


class _Heartbeat:
    """Prints ``    ... <what>: N s`` every ``every`` seconds until the block ends (a line per
    interval, so logs show progress too: no terminal needed)."""

    def __init__(self, what: str, every: float | None = None) -> None:
        self.what, self.every = what, HEARTBEAT_S if every is None else every
        self._done = threading.Event()
        self._thread: threading.Thread | None = None

    def _beat(self) -> None:
        t0 = time.perf_counter()
        while not self._done.wait(self.every):
            print(f"    ... {self.what}: {time.perf_counter() - t0:.0f} s", flush=True)

    def __enter__(self) -> "_Heartbeat":
        self._thread = threading.Thread(target=self._beat, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._done.set()
        if self._thread is not None:
            self._thread.join()


def _build_kernels(kernels, indent: str = "    ") -> bool:
    """Build each kernel (:meth:`evtc.gemm.Kernel.build`, or fetch it from the cache), one line
    before and one after each, a heartbeat while nvcc runs. Returns False after a failure."""
    for i, k in enumerate(kernels, 1):
        print(f"{indent}kernel {i}/{len(kernels)}: {k.job_name} ...", flush=True)
        t0 = time.perf_counter()
        try:
            with _Heartbeat(f"still building {k.job_name}"):
                art = k.build()
        except EvtcError as e:
            print(f"{indent}failed: {e}")
            return False
        took = "from the cache" if art.cached else f"built in {time.perf_counter() - t0:.0f} s"
        print(f"{indent}kernel {i}/{len(kernels)}: {took}: {art.library}", flush=True)
    return True


def load_examples():
    """The module ``examples/epilogues.py`` (bundled in the wheel) and its path."""
    path = data_path("examples", "epilogues.py")
    spec = importlib.util.spec_from_file_location("evtc_examples", path)
    if spec is None or spec.loader is None:
        raise FileNotFoundError(f"can't load the bundled examples at {path}")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module, path


def _driver_gpus() -> list[str]:
    """Names of the CUDA devices the driver sees (through cuda-python, an evtc dependency);
    empty without a driver or a device."""
    try:
        from cuda.bindings import driver  # type: ignore[import-not-found]

        err, = driver.cuInit(0)
        if int(err) != 0:
            return []
        err, count = driver.cuDeviceGetCount()
        if int(err) != 0:
            return []
        names = []
        for i in range(count):
            err, dev = driver.cuDeviceGet(i)
            err, raw = driver.cuDeviceGetName(64, dev)
            names.append(raw.split(b"\0", 1)[0].decode(errors="replace") if int(err) == 0 else f"GPU {i}")
        return names
    except Exception:
        return []


def gpu_status() -> tuple[bool, str]:
    """(can run, why not): running the demo's check needs a CUDA GPU and torch with CUDA.

    Returns:
        (True, device name) or (False, the reason in words with what to install).
    """
    try:
        import torch
    except ImportError:
        gpus = _driver_gpus()
        where = f"a GPU is here ({gpus[0]}) but " if gpus else "no CUDA GPU is visible, and "
        return False, (f"{where}torch is not installed (the check makes its inputs and the reference "
                       "with torch): pip install 'evtc[torch]'")
    if not torch.cuda.is_available():
        gpus = _driver_gpus()
        if gpus and torch.version.cuda is None:
            return False, (f"a GPU is here ({gpus[0]}) but this torch {torch.__version__} is built without "
                           "CUDA: install a CUDA build of torch")
        return False, "no CUDA GPU visible to torch"
    return True, torch.cuda.get_device_name()


def run_demo(out_dir: Path, arch: str = "sm90") -> int:
    """Trace, plan, emit, draw, build, check and time ``bias_relu`` for ``arch``, printing each
    step.

    Returns:
        0 when every step that could run passed, 1 otherwise.

    Raises:
        OSError: ``out_dir`` can't be created or written.
    """
    import evtc
    from evtc.compiler.nvcc import find_nvcc

    examples, path = load_examples()
    ep = examples.bias_relu
    _step(1, f"trace {path.name}:bias_relu  ->  D = relu(alpha*acc + beta*C + bias[n])")
    try:
        gemm = evtc.Gemm(ep, a=evtc.bf16, b=evtc.bf16, c=evtc.bf16, d=evtc.bf16, arch=arch)
    except EvtcError as e:
        print(f"    failed: {e}")
        return 1
    print("    IR after passes:")
    for line in str(gemm.graph).splitlines():
        print("      " + line)
    _step(2, f"plan for {arch}")
    for line in str(gemm.plan).splitlines():
        print("      " + line)
    out_dir.mkdir(exist_ok=True)  # (its parent exists: the CLI checked; a caller's OSError is theirs)
    cu = out_dir / f"bias_relu_{arch}.cu"
    cu.write_text(gemm.source)
    _step(3, f"emit CUTLASS C++: {cu} ({len(gemm.source.splitlines())} lines)")
    pictures = [out_dir / f"bias_relu_{arch}.{ext}" for ext in ("svg", "png")]
    try:
        from evtc.plan.draw import draw_plan

        for pic in pictures:
            draw_plan(gemm.graph, gemm.plan, pic)
        print(f"    the plan as a picture (shared-memory map and DAG): {', '.join(map(str, pictures))}")
    except ImportError as e:
        print(f"    no picture: {e.name} is not installed (pip install matplotlib networkx)")

    if find_nvcc() is None:
        _step(4, "build: skipped (no nvcc on this machine: install the CUDA toolkit or set CUDA_HOME)")
        return 0
    ok, device = gpu_status()
    primary = gemm.kernel(next(iter(gemm.family.values())))  # the kernel emitted and drawn above
    _step(4, f"build for {arch} with nvcc the kernel shown above, {primary.spec.name} (cached by content hash; "
             f"{COLD_BUILD})")
    if not _build_kernels([primary]):
        return 1
    info = gemm.info()
    agree = info["epilogue_smem_bytes"] == gemm.plan.epilogue_smem_bytes
    print(f"    the kernel reports {STORAGE.get(arch, 'its epilogue storage')} = {info['epilogue_smem_bytes']} B "
          f"(planner: {gemm.plan.epilogue_smem_bytes} B, {'agree' if agree else 'DISAGREE'}), "
          f"{info['mainloop_stages']} mainloop stages")
    if not agree:
        return 1

    if not ok:
        _step(5, f"run: skipped ({device})")
        return 0
    return _run_and_time(gemm, ep, primary, device)


def _run_and_time(gemm, ep, primary, device: str) -> int:
    """Steps 5 and 6 of the demo on a GPU: build the kernels the runs choose, check each run
    against the float64 reference, time 8192^3 beside cuBLAS and eager PyTorch."""
    from evtc.testing import Problem, check, chosen_kernel

    chosen = {}
    for shape in RUNS + (BENCH,):
        k = chosen_kernel(gemm, Problem(*shape), device=device)
        chosen.setdefault(id(k), k)
    rest = [k for k in chosen.values() if k is not primary and k.library is None]
    if rest:
        print(f"    the runs below choose {len(rest)} more kernel(s): "
              f"{', '.join(k.spec.name for k in rest)} (the family's members for their problems)")
        if not _build_kernels(rest):
            return 1
    _step(5, f"run on {device} and compare every element with the float64 reference")
    good = True
    for shape in RUNS:
        with _Heartbeat(f"running {shape}"):
            errs = check(gemm, Problem(*shape), seed=sum(shape))
        for r in errs.values():
            good &= r.ok
            print(f"    M,N,K,L = {shape}: {r.summary()}")
    from evtc.testing.bench import bench_gemm

    r = bench_gemm(gemm, *BENCH, iters=20, eager_fn=ep.fn)
    print(f"    8192^3: evtc {r['evtc_ms']:.3f} ms, cuBLAS plain GEMM {r['cublas_ms']:.3f} ms "
          f"({r['evtc_over_cublas']:.2f}x), eager PyTorch {r['eager_ms']:.3f} ms ({r['eager_over_evtc']:.2f}x slower than evtc)")
    return 0 if good else 1
