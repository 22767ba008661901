"""Loading a built kernel and calling its C ABI.

Input: a shared library built from an emitted source. Output: a :class:`KernelLibrary` whose
methods call ``evtc_run``, ``evtc_workspace_size``, ``evtc_can_implement`` and ``evtc_info``.

Loading needs no GPU (the library links the CUDA runtime statically and touches the device only
when a function runs), so the compile tests read ``evtc_info`` on a CPU-only machine.
"""

from __future__ import annotations

import ctypes
import functools
import json
from pathlib import Path

from evtc.abi import ABI_VERSION, AbiField, ctypes_struct
from evtc.errors import ArgumentError, LaunchError

STATUS = {0: "ok", 1: "can't implement", 2: "workspace too small", 3: "initialize failed", 4: "launch failed",
          5: "CUDA error"}


class KernelLibrary:
    """A loaded kernel.

    Args:
        path: the shared library.

    Raises:
        LaunchError: the library can't be loaded, or its ABI doesn't match this evtc.
    """

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)
        try:
            self.lib = ctypes.CDLL(str(self.path))
        except OSError as e:
            raise LaunchError(f"can't load {self.path}: {e}") from None
        lib = self.lib
        lib.evtc_abi_version.restype = ctypes.c_int
        lib.evtc_args_size.restype = ctypes.c_size_t
        lib.evtc_info.restype = ctypes.c_char_p
        lib.evtc_last_error.restype = ctypes.c_char_p
        lib.evtc_can_implement.restype = ctypes.c_int
        lib.evtc_can_implement.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.evtc_workspace_size.restype = ctypes.c_size_t
        lib.evtc_workspace_size.argtypes = [ctypes.c_void_p, ctypes.c_int]
        lib.evtc_run.restype = ctypes.c_int
        lib.evtc_run.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p, ctypes.c_int]
        if lib.evtc_abi_version() != ABI_VERSION:
            raise LaunchError(f"{self.path} was built for ABI {lib.evtc_abi_version()}, this evtc speaks {ABI_VERSION}",
                              hint="clear the build cache (EVTC_CACHE_DIR) and rebuild")
        self.fields = tuple(AbiField(**f) for f in self.info["static"]["abi"])
        self.Args = ctypes_struct(self.fields)
        if ctypes.sizeof(self.Args) != lib.evtc_args_size():
            raise LaunchError(f"argument struct size mismatch: C {lib.evtc_args_size()} B, Python {ctypes.sizeof(self.Args)} B")

    @functools.cached_property
    def info(self) -> dict:
        """The kernel's info JSON: ``static`` (plan, ABI, IR), ``epilogue_smem_bytes``
        (``sizeof(CollectiveEpilogue::SharedStorage)``), ``kernel_smem_bytes``,
        ``mainloop_stages``, ``args_size``."""
        return json.loads(self.lib.evtc_info())

    def _error(self) -> str:
        return self.lib.evtc_last_error().decode(errors="replace")

    def can_implement(self, args: ctypes.Structure, device: int) -> tuple[bool, str]:
        ok = self.lib.evtc_can_implement(ctypes.byref(args), device) == 0
        return ok, ("" if ok else self._error())

    def workspace_size(self, args: ctypes.Structure, device: int) -> int:
        return int(self.lib.evtc_workspace_size(ctypes.byref(args), device))

    def run(self, args: ctypes.Structure, workspace: int, workspace_bytes: int, stream: int, device: int,
            epilogue: str | None = None) -> None:
        """Launch on ``stream`` (asynchronous).

        Raises:
            ArgumentError: CUTLASS can't implement the problem (alignment, sizes).
            LaunchError: initialization or the launch failed; the message has CUDA's error.
        """
        status = self.lib.evtc_run(ctypes.byref(args), ctypes.c_void_p(workspace), workspace_bytes,
                                   ctypes.c_void_p(stream), device)
        if status == 0:
            return
        msg = self._error()
        if status == 1:
            raise ArgumentError(f"the kernel can't run this problem: {msg}", epilogue=epilogue,
                                hint="check that every M x N tensor's rows start on 16-byte boundaries")
        what = str(STATUS.get(status, status))
        raise LaunchError(msg if msg.startswith(what) else f"{what}: {msg}", epilogue=epilogue)
