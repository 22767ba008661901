"""The call fast path for torch tensors: a small C++ extension built once per machine.

NOTE [The torch fast path]: on the H100 machine (benchmarks/bench_host.py --breakdown,
2026-11-25) a bias_relu call at 256^3 cost 30 us of host time against torch.mm's 21, of which
the library's ``evtc_launch`` (CUTLASS's arguments, the cached kernel parameters, the launch)
was 8.6 us and the rest Python: reading shape, strides, dtype, device and pointer of every
tensor (about 1 us each), the two per-signature lookups, ``torch.empty_strided`` for D (4-6 us
through torch's argument parser), packing, ctypes. No rearrangement of that Python reaches
torch.mm, whose own allocation and checks run in C++. So calls with torch tensors on a key the
Python path has already checked and prepared go through ``fast.cpp``: it reads the
tensors through ATen, looks the key up, repeats the cached per-call checks (scalars' types and
limits, pointer alignment, overlap spans), allocates the outputs with the caching allocator,
packs ``evtc_call_t`` and calls the kernel library's ``evtc_launch`` directly. Whatever it does
not recognise or whatever fails returns None and the call takes the Python path, which raises
the right error or prepares and registers the key: the extension never decides a check the
Python path did not make first (tests/null/test_torch_fast.py compares the two byte for byte).
A Gemm's :class:`~evtc.dispatch.dispatcher.Dispatcher` reaches it through :class:`FastPathHook`,
which :class:`evtc.Gemm` hands it (the dispatcher imports nothing of torch).

The extension is compiled with the host C++ compiler against the installed torch (torch's
headers and libraries, no CUDA toolkit), about 20-40 s, once per (torch, Python, source)
triple, into the kernel cache (``<cache>/torch_fast/<tag>/``), atomically, with its SHA-256
recorded and checked before every load. A process that finds it missing builds it in a
background thread (calls take the Python path meanwhile) unless ``EVTC_TORCH_FASTPATH`` says
otherwise: ``0`` disables the fast path, ``sync`` builds it in the foreground on first use,
``1`` (default) in the background. ``evtc.torch.fast.build()`` builds it now (prebuild
scripts call it).
"""

from __future__ import annotations

import functools

import hashlib
import importlib.machinery
import importlib.util
import json
import logging
import os
import subprocess
import sys
import sysconfig
import tempfile
import threading
from pathlib import Path
from typing import Any, Mapping

from evtc import knobs
from evtc.runtime.launch import Launcher

__all__ = ["FastPath", "FastPathHook", "build", "mode", "module", "status"]

log = logging.getLogger("evtc")

FAST_ABI = 1  # fast.cpp's kFastAbi
SOURCE = Path(__file__).with_name("fast.cpp")

_lock = threading.Lock()
_state: dict[str, Any] = {"module": None, "failed": None, "thread": None}


_is_compiling = None  # torch.compiler.is_compiling, once torch is imported


def torch_compiling() -> bool:
    """Whether torch.compile (Dynamo) is tracing this call (torch only if already imported): a
    Gemm's call then goes through its torch op."""
    global _is_compiling
    if _is_compiling is None:
        torch = sys.modules.get("torch")
        compiler = getattr(torch, "compiler", None) if torch is not None else None
        if compiler is None or not hasattr(compiler, "is_compiling"):
            return False
        _is_compiling = compiler.is_compiling
    return bool(_is_compiling())


def mode() -> str:
    """``EVTC_TORCH_FASTPATH``: ``0`` (off), ``1`` (default: build in the background) or ``sync``."""
    return knobs.torch_fastpath.get()


@functools.lru_cache(maxsize=1)
def _tag() -> str:
    """The build's identity (source, torch, Python, ABI), hashed once per process."""
    import torch

    material = json.dumps({"source": hashlib.sha256(SOURCE.read_bytes()).hexdigest(), "torch": torch.__version__,
                           "python": sys.version, "abi": FAST_ABI,
                           "cxx11abi": bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))}, sort_keys=True)
    return hashlib.sha256(material.encode()).hexdigest()[:20]


def _folder() -> Path:
    from evtc.compiler.store import cache_dir

    return cache_dir() / "torch_fast" / _tag()


def _module_name() -> str:
    return "evtc_torch_fast_" + _tag()


def _compile(folder: Path) -> None:
    """Compile fast.cpp into ``folder/ext.so`` (atomically) and record its SHA-256."""
    import torch
    from torch.utils import cpp_extension

    folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    _clean_stale(folder)
    name = _module_name()
    includes = [f"-I{p}" for p in cpp_extension.include_paths()] + [f"-I{sysconfig.get_paths()['include']}"]
    libdirs = [p for p in cpp_extension.library_paths()]
    abi = int(bool(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True)))
    cxx = knobs.cxx.get()
    fd, tmp = tempfile.mkstemp(prefix=".ext-", suffix=".so", dir=folder)
    os.close(fd)
    cmd = [cxx, "-O2", "-std=c++20", "-shared", "-fPIC", "-w", f"-D_GLIBCXX_USE_CXX11_ABI={abi}",
           f"-DTORCH_EXTENSION_NAME={name}", f'-DEVTC_TORCH_VERSION="{torch.__version__}"', *includes, str(SOURCE),
           "-o", tmp, *[f"-L{p}" for p in libdirs], *[f"-Wl,-rpath,{p}" for p in libdirs],
           "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    try:
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
        if r.returncode != 0:
            raise RuntimeError(f"{cxx} failed ({r.returncode}): {r.stderr[-2000:]}")
        digest = hashlib.sha256(Path(tmp).read_bytes()).hexdigest()
        os.chmod(tmp, 0o600)  # (the linker recreates its output with the umask's mode)
        os.replace(tmp, folder / "ext.so")
        meta = folder / "meta.json"
        meta_tmp = folder / f".meta-{os.getpid()}.json"
        meta_tmp.write_text(json.dumps({"sha256": digest, "torch": torch.__version__, "abi": FAST_ABI}))
        os.chmod(meta_tmp, 0o600)
        os.replace(meta_tmp, meta)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def _check_private(folder: Path, *files: Path) -> None:
    """Refuse files another user could have written: ``folder`` (``<cache>/torch_fast/<tag>``),
    the folders above it up to the cache directory, and ``files`` in it must pass the kernel
    cache's one rule, NOTE [Trusted files] (evtc/compiler/trust.py: no links, the user's or
    root's, writable by nobody else)."""
    from evtc.compiler import trust

    try:
        trust.check_below(folder.parent.parent, folder, want_dir=True)
        for p in files:
            trust.check(p)
    except trust.Untrusted as e:
        raise RuntimeError(f"not a private file of this user ({e}): the torch fast path is not loaded") from None


def _clean_stale(folder: Path, age_s: float = 600.0) -> None:
    """Remove temporary outputs of builds that died (a process that exited mid-build)."""
    import time

    for p in folder.glob(".ext-*.so"):
        try:
            if time.time() - p.stat().st_mtime > age_s:
                p.unlink()
        except OSError:
            pass


def _load(folder: Path):
    """Import the built extension after checking its hash, ABI and torch version; None if absent."""
    import torch

    so, meta = folder / "ext.so", folder / "meta.json"
    if not so.is_file() or not meta.is_file():
        return None
    _check_private(folder, so, meta)
    data = so.read_bytes()
    want = json.loads(meta.read_text())
    if hashlib.sha256(data).hexdigest() != want.get("sha256"):
        raise RuntimeError(f"{so} does not match its recorded SHA-256: not loaded")
    name = _module_name()
    loader = importlib.machinery.ExtensionFileLoader(name, str(so))
    spec = importlib.util.spec_from_file_location(name, str(so), loader=loader)
    mod = importlib.util.module_from_spec(spec)
    loader.exec_module(mod)
    if mod.FAST_ABI != FAST_ABI or mod.TORCH_VERSION != torch.__version__:
        raise RuntimeError(f"{so} was built for another evtc or torch: not used")
    return mod


def build():
    """Build (if needed) and load the extension now; returns the module.

    Raises:
        RuntimeError: the compiler failed or the built file fails its checks (the message says
            which); calls keep working on the Python path.
    """
    with _lock:
        if _state["module"] is not None:
            return _state["module"]
        folder = _folder()
        mod = _load(folder)
        if mod is None:
            from filelock import FileLock

            folder.mkdir(parents=True, exist_ok=True, mode=0o700)
            with FileLock(str(folder / ".lock")):
                mod = _load(folder)
                if mod is None:
                    _compile(folder)
                    mod = _load(folder)
        _state["module"] = mod
        return mod


def _background() -> None:
    try:
        build()
    except Exception as e:  # the Python path keeps serving calls
        _state["failed"] = f"{type(e).__name__}: {e}"
        log.info("evtc: torch fast path unavailable: %s", _state["failed"])


def module():
    """The loaded extension, or None (not built yet: a background build starts, per
    ``EVTC_TORCH_FASTPATH``; off; or its build failed)."""
    m = mode()
    if m == "0":
        return None
    mod = _state["module"]
    if mod is not None or _state["failed"] is not None:
        return mod
    if "torch" not in sys.modules:
        return None
    try:
        with _lock:
            mod = _state["module"] = _state["module"] or _load(_folder())
    except Exception as e:
        _state["failed"] = f"{type(e).__name__}: {e}"
        return None
    if mod is not None:
        return mod
    if m == "sync":
        _background()
        return _state["module"]
    if _state["thread"] is None:
        t = _state["thread"] = threading.Thread(target=_background, name="evtc-torch-fast-build", daemon=True)
        t.start()
    return None


def status() -> str:
    """One line: whether the fast path is loaded, building, off or failed (and why)."""
    if _state["module"] is not None:
        return "loaded"
    if _state["failed"]:
        return f"failed: {_state['failed']}"
    if mode() == "0":
        return "off (EVTC_TORCH_FASTPATH=0)"
    t = _state["thread"]
    return "building" if t is not None and t.is_alive() else "not built"


class FastPath:
    """One Gemm's table of fast-path calls (see the NOTE above).

    Args:
        mod: the loaded extension.
        binder: the Gemm's argument checker (names of tensors, scalars and outputs).
        layout: the call struct's layout (:class:`evtc.abi.CallLayout`) of its kernels.
        allow_cpu: accept CPU tensors (GPU-free tests with a recording ``launch``).
    """

    def __init__(self, mod, binder, layout, allow_cpu: bool = False) -> None:
        from evtc.abi import CALL_HEADER

        if tuple(n for n, _ in CALL_HEADER) != ("handle", "workspace", "workspace_bytes", "stream"):
            raise RuntimeError("evtc_call_t's header changed: update fast.cpp")
        self.mod = mod
        self.binder = binder
        self.layout = layout
        self.call = mod.call
        offsets = layout.offsets()
        if [offsets[n] for n in ("handle", "workspace", "workspace_bytes", "stream")] != [0, 8, 16, 24]:
            raise RuntimeError("unexpected evtc_call_t header layout")
        b = binder
        self.table = mod.new_table(list(b.tensor_names), list(b.other_names), list(b.scalar_names),
                                   [float(x) for x in b.scalar_limits], list(b.output_names), b.n_kwargs, b.single,
                                   b.single and b.output_names[0] == "D", layout.size,
                                   [offsets[n] for n in layout.pointers], [offsets[n] for n in layout.scalars],
                                   allow_cpu)
        #: ``bound(A, B, kwargs)``: the call with this table bound (outputs, or None)
        self.bound = functools.partial(self.call, self.table)

    def __len__(self) -> int:
        return self.mod.size(self.table)

    def clear(self) -> None:
        """Forget every registered key (the next call of each takes the Python path again)."""
        self.mod.clear(self.table)

    def add(self, launcher, sig, A, B, kwargs, launch_address: int) -> bool:
        """Register the call just made on the Python path (key ``sig``, already prepared)."""
        import torch

        b = launcher.binder
        if (sig.mode != "launch" or sig.handle < 0 or b.tensor_names != self.binder.tensor_names
                or b.scalar_names != self.binder.scalar_names or b.output_names != self.binder.output_names
                or launcher.layout.pointers != self.layout.pointers or launcher.layout.scalars != self.layout.scalars
                or launcher.layout.size != self.layout.size):
            return False
        by_name = {a.name: a for a in sig.allocs}
        if set(by_name) != set(b.output_names):
            return False
        allocs = [(by_name[n].index, list(by_name[n].shape), list(by_name[n].strides),
                   getattr(torch, by_name[n].dtype.torch)) for n in b.output_names]
        spans = [(i, j, lo_i, hi_i, lo_j, hi_j) for i, j, lo_i, hi_i, lo_j, hi_j, _ in sig.spans]
        return self.mod.add(self.table, A, B, kwargs, launch_address, sig.handle, sig.workspace, sig.device,
                            bool(b.swap), list(sig.checks), spans, allocs)


class FastPathHook:
    """A Dispatcher's side of the torch fast path (NOTE [The torch fast path] in
    the module docstring): hands it the calls the Python path checked and launched.

    Attributes:
        call: ``call(A, B, kwargs)`` -> outputs, or None where the fast path doesn't know the
            call (None until the extension is built and a call registered).
    """

    def __init__(self, dispatcher) -> None:
        self.dispatcher = dispatcher
        self.table = None  # the FastPath (its table of calls)
        self.call = None
        self.off = False
        self.refused: set = set()  # probe keys the fast path declined: not offered again

    def clear(self) -> None:
        self.refused.clear()  # another launcher may take the key now
        if self.table is not None:
            self.table.clear()

    def register(self, launcher: Launcher, key: tuple, A: Any, B: Any, kwargs: Mapping[str, Any]) -> None:
        """Register a call the Python path just checked and launched (torch tensors only; builds
        the extension in the background on first use)."""
        if self.off:
            return
        torch = sys.modules.get("torch")
        if torch is None or type(A) not in (torch.Tensor, torch.nn.Parameter) or type(kwargs) is not dict:
            return
        table = self.table
        if table is None:
            mod = module()
            if mod is None:
                if mode() == "0" or status().startswith("failed"):
                    self.off = True
                return
            if type(launcher) is not Launcher:
                return
            try:
                table = self.table = FastPath(mod, self.dispatcher.prober, launcher.layout)
                self.call = table.bound
            except Exception:  # a layout the extension can't pack: the Python path serves every call
                self.off = True
                return
        if type(launcher) is not Launcher:  # a staged call copies its inputs first: the Python path's
            return
        if key in self.refused:  # declined before: its answer depends only on the key's signature
            return
        sig = launcher._signatures.get(key)
        if sig is not None and not table.add(launcher, sig, A, B, kwargs, launcher.launch_address):
            if len(self.refused) >= 4096:
                self.refused.clear()
            self.refused.add(key)
