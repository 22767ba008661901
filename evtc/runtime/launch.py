"""Loading a built kernel and launching it.

Input: a shared library built from an emitted source, and the user's tensors. Output: a
:class:`KernelLibrary` (the C ABI through ctypes, checked against the Gemm that loads it) and a
:class:`Launcher` that runs calls on it.

Loading needs no GPU (the library links the CUDA runtime statically and touches the device only
when a function runs), so the compile tests read ``evtc_info`` on a CPU-only machine.

# NOTE [The launch path]
A call costs host time in three places, and each is paid once per problem signature, not per
call, where it can be:

* **Python checks.** Each tensor gives one cheap key (shape, strides, dtype, device:
  :func:`evtc.runtime.tensors.probe_for`); the tuple of keys finds a checked
  :class:`~evtc.runtime.bind.Signature`. Only a miss runs the full checks of
  :class:`~evtc.runtime.bind.Binder`. Per call remain what depends on the values: null
  pointers, alignment, overlap of given outputs with other tensors, finite scalars.
* **Packing.** The pointers and scalars go into a preallocated per-thread buffer with one
  ``struct.Struct.pack_into`` of the layout :class:`evtc.abi.CallLayout` computed at load, and
  the library is called once (``evtc_launch``) with the buffer's address.
* **C++.** ``evtc_prepare`` (per signature) runs CUTLASS's ``can_implement``, the workspace
  query and, once per device, the kernel attributes (``cudaFuncSetAttribute``); it keeps the
  signature under a handle. ``evtc_launch`` (per call) merges the pointers into it, initialises
  the workspace on the stream (reduction identities), encodes the TMA descriptors (direct
  ``cuTensorMapEncodeTiled`` calls) and launches. No call synchronises, allocates host-side
  device memory or sets attributes, so the call can be captured in a CUDA graph: the workspace
  and the outputs come from the framework's allocator (``torch.empty_strided``), which a
  capture redirects to the graph's pool, and the reductions' identities are written by the
  captured work itself (``initialize_workspace`` on sm90; the fill kernels on sm80).

The current stream comes from ``torch._C._cuda_getCurrentRawStream(device)``.
"""

from __future__ import annotations

import ctypes
import functools
import json
import threading
from pathlib import Path
from typing import Any

from evtc.abi import ABI_VERSION, AbiField, CallLayout, ctypes_struct
from evtc.errors import ArgumentError, LaunchError
from evtc.runtime import tensors
from evtc.runtime.bind import Binder, Signature

STATUS = {0: "ok", 1: "can't implement", 2: "workspace too small", 3: "initialize failed", 4: "launch failed",
          5: "CUDA error", 6: "stale handle"}
STALE = 6
#: signatures kept per Gemm before the cache starts over (a dynamic-shape workload)
MAX_SIGNATURES = 4096


class KernelLibrary:
    """A loaded kernel.

    Args:
        path: the shared library (absolute or relative to the working directory).

    Raises:
        LaunchError: the library can't be loaded, or its ABI doesn't match this evtc.
    """

    def __init__(self, path: Path | str) -> None:
        # dlopen looks a bare file name up on the library search path, not in the working
        # directory (and Path("./k.so") prints as "k.so"): always load an absolute path.
        # absolute, not resolved: a verified shared-cache library is /proc/self/fd/N, a link to a
        # memfd that only opens through that path
        #: evtc_prepare calls so far (a new problem signature, or a stale handle)
        self.prepares = 0
        self.path = Path(path).expanduser().absolute()
        try:
            self.lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise LaunchError(f"can't load {self.path}: {e}") from None
        lib = self.lib
        try:
            lib.evtc_abi_version.restype = ctypes.c_int
            version = lib.evtc_abi_version()
        except AttributeError:
            raise LaunchError(f"{self.path} is not an evtc kernel (no evtc_abi_version)") from None
        if version != ABI_VERSION:
            raise LaunchError(f"{self.path} was built for ABI {version}, this evtc speaks {ABI_VERSION}",
                              hint="clear the build cache (EVTC_CACHE_DIR) and rebuild")
        lib.evtc_args_size.restype = ctypes.c_size_t
        lib.evtc_call_size.restype = ctypes.c_size_t
        lib.evtc_info.restype = ctypes.c_char_p
        lib.evtc_last_error.restype = ctypes.c_char_p
        lib.evtc_can_implement.restype = ctypes.c_int
        lib.evtc_can_implement.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.evtc_workspace_size.restype = ctypes.c_size_t
        lib.evtc_workspace_size.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.evtc_run.restype = ctypes.c_int
        lib.evtc_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int]
        lib.evtc_prepare.restype = ctypes.c_int
        lib.evtc_prepare.argtypes = [ctypes.c_void_p, ctypes.c_int, ctypes.POINTER(ctypes.c_int64),
                                     ctypes.POINTER(ctypes.c_uint64)]
        lib.evtc_launch.restype = ctypes.c_int
        lib.evtc_launch.argtypes = [ctypes.c_void_p]
        self.fields = tuple(AbiField(**f) for f in self.info["static"]["abi"])
        self.Args = ctypes_struct(self.fields)
        if ctypes.sizeof(self.Args) != lib.evtc_args_size():
            raise LaunchError(f"argument struct size mismatch: C {lib.evtc_args_size()} B, Python {ctypes.sizeof(self.Args)} B")
        self.call_layout = CallLayout.of(self.fields)
        if self.call_layout.size != lib.evtc_call_size():
            raise LaunchError(f"call struct size mismatch: C {lib.evtc_call_size()} B, Python {self.call_layout.size} B")
        copy = getattr(lib, "evtc_copy_rows", None)  # sm90 GEMMs: NOTE [Copy kernels for staging]
        if copy is not None:
            copy.restype = ctypes.c_int
            copy.argtypes = [ctypes.c_void_p, *[ctypes.c_int64] * 2, ctypes.c_void_p, *[ctypes.c_int64] * 5,
                             ctypes.c_int, ctypes.c_void_p, ctypes.c_int]
            from evtc.runtime import pitched_copy

            pitched_copy.register_copy_kernel(copy)

    @functools.cached_property
    def info(self) -> dict:
        """The kernel's info JSON: ``static`` (plan, ABI, IR, name, arch), ``epilogue_smem_bytes``
        (``sizeof(CollectiveEpilogue::SharedStorage)``), ``kernel_smem_bytes``,
        ``mainloop_stages``, ``args_size``, ``call_size``."""
        return json.loads(self.lib.evtc_info())

    def verify(self, *, fields: tuple[AbiField, ...], ir: str, name: str, arch: str) -> None:
        """Check that this library is the kernel of the Gemm that loads it: the same ABI fields
        (so the same ``evtc_args_t``), IR text, name and arch in its info JSON.

        Raises:
            LaunchError: (anchor ``library-mismatch``) naming what differs.
        """
        static = self.info["static"]
        diffs = []
        if tuple(fields) != self.fields:
            diffs.append("its argument struct (ABI fields)")
        if static.get("ir") != ir:
            diffs.append("its epilogue IR")
        if static.get("name") != name:
            diffs.append(f"its name ('{static.get('name')}', expected '{name}')")
        if static.get("arch") != arch:
            diffs.append(f"its arch ({static.get('arch')}, expected {arch})")
        if diffs:
            raise LaunchError(f"{self.path} is not the kernel of this Gemm: {', '.join(diffs)} differ",
                              hint="a cache entry holds another kernel: clear the build cache (EVTC_CACHE_DIR) and "
                                   "rebuild", anchor="library-mismatch")

    def _error(self) -> str:
        return self.lib.evtc_last_error().decode(errors="replace")

    def can_implement(self, args: ctypes.Structure, device: int) -> tuple[bool, str]:
        ok = self.lib.evtc_can_implement(ctypes.byref(args), device) == 0
        return ok, ("" if ok else self._error())

    def workspace_size(self, args: ctypes.Structure, device: int) -> int:
        return int(self.lib.evtc_workspace_size(ctypes.byref(args), device))

    def raise_status(self, status: int, epilogue: str | None) -> None:
        """Turn a non-zero status of the C ABI into an evtc error.

        Raises:
            ArgumentError: status 1, CUTLASS can't implement the problem.
            LaunchError: any other failure, with the library's message.
        """
        msg = self._error()
        if status == 1:
            raise ArgumentError(f"the kernel can't run this problem: {msg}", epilogue=epilogue,
                                hint="check that every M x N tensor's rows start on 16-byte boundaries")
        what = str(STATUS.get(status, status))
        raise LaunchError(msg if msg.startswith(what) else f"{what}: {msg}", epilogue=epilogue)

    def prepare(self, args: ctypes.Structure, device: int, epilogue: str | None = None) -> tuple[int, int]:
        """``evtc_prepare``: check the problem once and keep it in the library.

        Returns:
            (handle for ``evtc_launch``, workspace bytes).

        Raises:
            ArgumentError, LaunchError: as :meth:`raise_status`.
        """
        self.prepares += 1
        handle = ctypes.c_int64()
        ws = ctypes.c_uint64()
        status = self.lib.evtc_prepare(ctypes.byref(args), device, ctypes.byref(handle), ctypes.byref(ws))
        if status:
            self.raise_status(status, epilogue)
        return handle.value, ws.value

    def run(self, args: ctypes.Structure, workspace: int, workspace_bytes: int, stream: int, device: int,
            epilogue: str | None = None) -> None:
        """Check and launch in one call (``evtc_run``; no prepared state) on ``stream``.

        Raises:
            ArgumentError, LaunchError: as :meth:`raise_status`.
        """
        status = self.lib.evtc_run(ctypes.byref(args), ctypes.c_void_p(workspace), workspace_bytes,
                                   ctypes.c_void_p(stream), device)
        if status:
            self.raise_status(status, epilogue)


def probe_call(b: Binder, A: Any, B: Any, kwargs: dict, out: Any):
    """The cache key of a call and its pointers (``evtc_call_t`` order; 0 for outputs evtc
    allocates), or (None, None) when the call must take the full path."""
    if len(kwargs) != b.n_kwargs:
        return None, None
    try:
        objs = [A, B] + [kwargs[n] for n in b.tensor_names]
        for n in b.other_names:  # present, so that no unknown name took their place
            kwargs[n]
    except KeyError:
        return None, None
    if out is None:
        form = 0
    elif type(out) is dict:
        form = 2
        outs = [out.get(n) for n in b.output_names]
        # (not outs.count(None): that compares tensors with ==, a device kernel each)
        if len(out) != sum(x is not None for x in outs):
            return None, None
        objs += outs
    elif b.single:
        form = 1
        objs.append(out)
    else:
        return None, None
    keys: list = [type(A), form]
    ptrs: list[int] = []
    probes = tensors._PROBES
    for x in objs:
        if x is None:
            keys.append(None)
            ptrs.append(0)
            continue
        probe = probes.get(type(x))
        if probe is None:
            probe = tensors.probe_for(type(x))
            if probe is None:
                if not hasattr(x, "__cuda_array_interface__"):  # an instance attribute, not the class's
                    return None, None
                probe = tensors.cai_probe
        try:
            k, p = probe(x)
        except Exception:
            return None, None
        keys.append(k)
        ptrs.append(p)
    if form == 0:
        ptrs += b.no_outputs
    return tuple(keys), ptrs



class Launcher:
    """Runs calls of one Gemm on its library (NOTE [The launch path]).

    Args:
        binder: the Gemm's argument checker.
        library: its loaded kernel (None for an :class:`EmptyLauncher`).
        name: the epilogue's name (for errors).
    """

    def __init__(self, binder: Binder, library: KernelLibrary | None, name: str) -> None:
        self.binder = binder
        self.library = library
        self.name = name
        # (no library: an EmptyLauncher, which launches nothing)
        self.layout = library.call_layout if library is not None else None
        self._pack = self.layout.packer.pack_into if library is not None else None
        self._launch = library.lib.evtc_launch if library is not None else None
        #: the address of the library's ``evtc_launch`` (for evtc/torch/fast.cpp)
        self.launch_address = ctypes.cast(self._launch, ctypes.c_void_p).value or 0 \
            if isinstance(self._launch, ctypes._CFuncPtr) else 0
        self._signatures: dict[tuple, Signature] = {}
        self._tls = threading.local()
        self._streams: dict[str, Any] = {}
        self._keepalive: Any = None

    # ---- the fast path ------------------------------------------------------------------------

    def __call__(self, A: Any, B: Any, kwargs: dict, out: Any = None, stream: Any = None):
        """Check, allocate and launch one call; returns the outputs (``D`` alone when it is the
        only output, else a dict in the epilogue's order).

        Raises:
            ArgumentError: a bad argument, named.
            LaunchError: CUDA or CUTLASS refused the launch.
        """
        key, ptrs = self._probe(A, B, kwargs, out)
        return self.run(key, ptrs, A, B, kwargs, out, stream)

    def run(self, key: tuple | None, ptrs: list[int] | None, A: Any, B: Any, kwargs: dict, out: Any = None,
            stream: Any = None):
        """:meth:`__call__` after :meth:`_probe` (a kernel family probes once, picks a kernel, and
        hands the probe to its launcher)."""
        b = self.binder
        sig = self._signatures.get(key) if key is not None else None
        if sig is None:
            sig, ptrs = b.signature(A, B, kwargs, out)
            scalars = [b.scalar_value(n, kwargs[n]) for n in b.scalar_names]
            if key is not None:
                if len(self._signatures) >= MAX_SIGNATURES:
                    self._signatures.clear()
                self._signatures[key] = sig
        else:
            scalars = [kwargs[n] for n in b.scalar_names]
            for x, lim in zip(scalars, b.scalar_limits):
                t = type(x)
                if (t is not float and t is not int) or not -lim <= x <= lim:  # NaN fails the comparison
                    scalars = [b.scalar_value(n, kwargs[n]) for n in b.scalar_names]
                    break
            b.check_pointers(sig, ptrs)
        dev = sig.device
        if stream is None:
            getter = self._streams.get(sig.framework)
            if getter is None:
                getter = self._streams[sig.framework] = tensors.current_stream_getter(sig.framework)
            handle = getter(dev)
        else:
            handle = tensors.stream_handle(stream, dev, self.name)
        allocators = sig.allocators
        if not allocators:
            allocators = sig.allocators = tuple(
                tensors.strided_allocator(sig.framework, dev, a.shape, a.strides, a.dtype)
                for a in sig.allocs) + (tensors.bytes_allocator(sig.framework, dev),)
        made = None
        if sig.allocs:
            made = {}
            for alloc, make in zip(sig.allocs, allocators):
                obj, p = make()
                made[alloc.name] = obj
                ptrs[alloc.index] = p
        if sig.mode == "launch":
            self._run(sig, ptrs, scalars, handle, allocators[-1], None)
        elif sig.mode == "k0":
            nbytes = max(sig.M, sig.N) * b.a.bytes * sig.kpad
            scratch, sp = allocators[-1](nbytes)
            tensors.memset_async(sp, 0, 1, nbytes, handle, dev)
            ptrs[0] = ptrs[1] = sp
            self._run(sig, ptrs, scalars, handle, allocators[-1], scratch)
        else:
            for f in sig.fills:
                _fill_identity(ptrs[f.index], f, handle, dev)
        if stream is not None:
            self._keepalive = (A, B, kwargs, out)  # the caller's stream may outlive this call's references
        if b.single:
            d = made[b.output_names[0]] if made else (out if type(out) is not dict else out[b.output_names[0]])
            return d if b.output_names[0] == "D" else {b.output_names[0]: d}
        return {n: made[n] if made and n in made else out[n] for n in b.output_names}

    def _probe(self, A: Any, B: Any, kwargs: dict, out: Any):
        return probe_call(self.binder, A, B, kwargs, out)

    def _buffer(self):
        tls = self._tls
        buf = getattr(tls, "buf", None)
        if buf is None:
            buf = tls.buf = ctypes.create_string_buffer(self.layout.size)
            tls.addr = ctypes.addressof(buf)
        return buf, tls.addr

    def _prepare(self, sig: Signature, ptrs: list[int], scalars: list[float]) -> None:
        b = self.binder
        args = b.fill_args(sig, ptrs, dict(zip(b.scalar_names, scalars)))
        sig.handle, sig.workspace = self.library.prepare(args, sig.device, self.name)

    def _run(self, sig: Signature, ptrs: list[int], scalars: list, stream: int, alloc_bytes, scratch) -> None:
        if self.binder.swap:  # swap-AB: the kernel's A is the call's B (Binder's values are swapped too)
            ptrs = [ptrs[1], ptrs[0], *ptrs[2:]]
        if sig.handle < 0:
            self._prepare(sig, ptrs, scalars)
        ws_obj, ws_ptr = alloc_bytes(sig.workspace) if sig.workspace else (None, 0)
        buf, addr = self._buffer()
        for attempt in (0, 1):
            try:
                self._pack(buf, 0, sig.handle, ws_ptr, sig.workspace, stream, *ptrs, *scalars)
            except (OverflowError, ValueError, TypeError):  # out-of-range scalar or pointer
                scalars = [self.binder.scalar_value(n, x) for n, x in zip(self.binder.scalar_names, scalars)]
                self._pack(buf, 0, sig.handle, ws_ptr, sig.workspace, stream, *ptrs, *scalars)
            status = self._launch(addr)
            if status != STALE or attempt:
                break
            self._prepare(sig, ptrs, scalars)  # evicted, or sm80's variant changed with the alignment
            if sig.workspace and (ws_obj is None or sig.workspace > ws_obj_bytes(ws_obj)):
                ws_obj, ws_ptr = alloc_bytes(sig.workspace)
        if status:
            self.library.raise_status(status, self.name)
        if scratch is not None or ws_obj is not None:
            self._last = (ws_obj, scratch)  # stream-ordered frees are safe; kept for other frameworks' buffers


class EmptyLauncher(Launcher):
    """A :class:`Launcher` for calls with nothing to compute (M, N or L = 0), before its kernel
    is built: the outputs are allocated (reductions filled with their identity) and no kernel
    runs, so none is built (NOTE [An empty call builds nothing]). Its binder is the graph's ABI
    (:meth:`evtc.dispatch.family.GemmFamily.binder` without a library).

    NOTE [An empty call builds nothing]: an empty problem's launch path is allocation and fills
    only (``Signature.mode == "empty"``), yet its first call built the chosen kernel, minutes of
    nvcc, and then launched nothing; a mixture-of-experts layer or a batch that can be empty met
    it on every new Gemm. The dispatcher routes such a call here when the kernel is not built
    (the route is cached per signature, and a signature holds M, N and L, so a later call with
    rows builds and runs its kernel as before).
    """

    def __init__(self, binder: Binder, name: str) -> None:
        super().__init__(binder, None, name)  # (no library: nothing is launched)

    def _run(self, sig: Signature, *args) -> None:
        raise LaunchError(f"{self.name}: a call with rows reached the launcher of empty calls (M={sig.M}, N={sig.N}, "
                          f"L={sig.L}); this is a bug in evtc")


def ws_obj_bytes(obj: Any) -> int:
    """Bytes of a workspace buffer from :func:`evtc.runtime.tensors.bytes_allocator`."""
    for attr in ("nbytes", "size"):
        v = getattr(obj, attr, None)
        if isinstance(v, int):
            return v
    return 0


def _identity_bits(f) -> tuple[int, int]:
    """(bit pattern, element bytes) of the identity ``f.value`` in ``f.dtype``."""
    import struct

    import numpy as np

    dt = f.dtype
    if dt.bytes == 4:
        return struct.unpack("<I", struct.pack("<f", f.value))[0], 4
    if dt.name == "f16":
        return int(np.array(f.value, dtype=np.float16).view(np.uint16)), 2
    if dt.name == "bf16":
        return struct.unpack("<I", struct.pack("<f", f.value))[0] >> 16, 2
    # fp8: 0, or +-inf as e5m2's infinity and as e4m3's largest finite value (e4m3 has no infinity)
    bits32 = struct.unpack("<I", struct.pack("<f", f.value))[0]
    if f.value == 0:
        return 0, 1
    sign = 0x80 if bits32 >> 31 else 0
    return (sign | (0x7C if dt.name == "e5m2" else 0x7E)), 1


def _fill_identity(ptr: int, f, stream: int, device: int) -> None:
    pattern, eb = _identity_bits(f)
    if f.batch_stride == f.count or f.batches == 1:
        tensors.memset_async(ptr, pattern, eb, f.count * f.batches, stream, device)
    else:
        for lidx in range(f.batches):
            tensors.memset_async(ptr + lidx * f.batch_stride * eb, pattern, eb, f.count, stream, device)
