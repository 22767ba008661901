"""The device side of tensors: memory allocated like them, fills, streams, the device's name.

Input: a :class:`~evtc.runtime.tensor_read.TensorView` to allocate like, or a framework name and
a device ordinal, or a stream object. Output: new device memory from the framework's allocator
(a tensor and its view, a buffer and its address, or an allocator to call per launch), fills
through the driver, the caller's current stream and checked raw stream handles, and the
device's name. :mod:`evtc.runtime.tensors` is the one import path.
"""

from __future__ import annotations

import functools
import sys
from typing import Any

from evtc.dtypes import DType
from evtc.errors import ArgumentError
from evtc.runtime.tensor_read import TensorView, _cai_view, _torch_view

__all__ = ["SPECIAL_STREAMS", "bytes_allocator", "current_stream", "current_stream_getter", "device_name", "empty",
           "empty_bytes", "memset_async", "stream_handle", "strided_allocator"]

# ---- allocation ---------------------------------------------------------------------------------


def empty(like: TensorView, shape: tuple[int, ...], dtype: DType, *, pad_last_to_bytes: int = 16) -> tuple[Any, TensorView]:
    """Allocate an uninitialised tensor with the framework and device of ``like``.

    The last dimension's storage is padded so each row starts at a multiple of
    ``pad_last_to_bytes`` bytes (TMA needs 16-byte row strides); the returned object is a view
    of exactly ``shape``.

    Raises:
        ArgumentError: ``like`` comes from a framework evtc can't allocate with; pass ``out=``.
    """
    per = max(1, pad_last_to_bytes // max(1, dtype.bytes))
    padded = shape[:-1] + (((shape[-1] + per - 1) // per) * per,)
    if like.framework == "torch":
        torch = sys.modules["torch"]
        tdt = getattr(torch, dtype.torch)
        buf = torch.empty(padded, dtype=tdt, device=f"cuda:{like.device}")
        obj = buf[..., : shape[-1]]
        return obj, _torch_view(obj)
    if like.framework == "cupy":
        cupy = sys.modules["cupy"]
        if dtype.torch not in ("float32", "float16"):
            raise ArgumentError(f"cupy has no {dtype} arrays", hint="pass out= tensors, or use torch")
        with cupy.cuda.Device(like.device):
            buf = cupy.empty(padded, dtype=dtype.torch)
        obj = buf[..., : shape[-1]]
        return obj, _cai_view(obj)
    raise ArgumentError("evtc can only allocate outputs with torch or cupy",
                        hint="pass preallocated outputs with out={'name': tensor, ...}")


def empty_bytes(like: TensorView, nbytes: int) -> tuple[Any, int]:
    """A device buffer of ``nbytes`` bytes (for the kernel's workspace): (object, address)."""
    if nbytes == 0:
        return None, 0
    if like.framework == "torch":
        torch = sys.modules["torch"]
        buf = torch.empty((nbytes,), dtype=torch.uint8, device=f"cuda:{like.device}")
        return buf, int(buf.data_ptr())
    if like.framework == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(like.device):
            buf = cupy.empty((nbytes,), dtype="uint8")
        return buf, int(buf.data.ptr)
    from cuda.bindings import runtime as cudart  # type: ignore[import-not-found]

    err, ptr = cudart.cudaMalloc(nbytes)
    if int(err) != 0:
        raise ArgumentError(f"cudaMalloc({nbytes}) for the workspace failed: {err}")
    return _CudaFree(ptr), int(ptr)


class _CudaFree:
    def __init__(self, ptr) -> None:
        self.ptr = ptr

    def __del__(self) -> None:
        try:
            from cuda.bindings import runtime as cudart  # type: ignore[import-not-found]

            cudart.cudaFree(self.ptr)
        except Exception:
            pass


# ---- streams ------------------------------------------------------------------------------------

#: Raw handles accepted as ints: the legacy default stream (0), ``cudaStreamLegacy`` (1) and
#: ``cudaStreamPerThread`` (2), which the CUDA runtime defines as constants. Any other int is
#: refused: the driver dereferences a stream handle without validating it (a bogus one crashes
#: the process), and no driver query fails cleanly on one.
SPECIAL_STREAMS = (0, 1, 2)


def current_stream_getter(framework: str):
    """``get(device) -> int``: the framework's current raw stream on a device, cheaply (torch:
    ``torch._C._cuda_getCurrentRawStream``; cupy: its current stream; others: 0)."""
    if framework == "torch":
        torch = sys.modules["torch"]
        raw = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        if raw is not None:
            return raw
        return lambda device: int(torch.cuda.current_stream(device).cuda_stream)
    if framework == "cupy":
        cupy = sys.modules["cupy"]

        def get(device: int) -> int:
            with cupy.cuda.Device(device):
                return int(cupy.cuda.get_current_stream().ptr)

        return get
    return lambda device: 0


def current_stream(like: TensorView) -> int:
    """The caller's current CUDA stream for ``like``'s framework and device (0 otherwise)."""
    return current_stream_getter(like.framework)(like.device)


def stream_handle(stream: Any, device: int | None = None, epilogue: str | None = None) -> int:
    """A raw ``cudaStream_t`` from a stream object, checked.

    Accepted: torch streams (``torch.cuda.Stream``, ``torch.cuda.ExternalStream``), cupy streams,
    objects with CUDA Python's ``__cuda_stream__`` protocol or a ``cuda_stream`` attribute,
    ``cuda.bindings`` ``CUstream``/``cudaStream_t`` objects, and the ints 0, 1 and 2
    (:data:`SPECIAL_STREAMS`). A stream object that says its device must be on ``device``.

    Raises:
        ArgumentError: any other int (a raw handle evtc can't validate: wrap it in
            ``torch.cuda.ExternalStream``), a stream on another device, or an object that is not
            a stream; the message names the argument ``stream``.
    """
    def bad(msg: str, hint: str | None = None) -> ArgumentError:
        return ArgumentError(msg, epilogue=epilogue, hint=hint)

    if stream is None:
        return 0
    if isinstance(stream, bool):
        raise bad("argument 'stream' is a bool, not a CUDA stream")
    if isinstance(stream, int):
        if stream in SPECIAL_STREAMS:
            return stream
        raise bad(f"argument 'stream' is the raw handle {stream:#x}: evtc accepts only stream objects and the "
                  "special handles 0, 1 (cudaStreamLegacy) and 2 (cudaStreamPerThread)",
                  hint="pass a torch.cuda.Stream or cupy stream; for a handle you own, torch.cuda.ExternalStream(handle) "
                       "(a bogus raw handle would crash the process inside the CUDA driver)")
    stream_device = None
    cls = type(stream)
    try:
        # the frameworks' own attributes first: they also say the stream's device
        if hasattr(stream, "cuda_stream"):  # torch.cuda.Stream / ExternalStream
            handle = int(stream.cuda_stream)
            stream_device = getattr(stream, "device_index", None)
        elif cls.__module__.startswith("cupy") and hasattr(stream, "ptr"):
            handle = int(stream.ptr)
            stream_device = getattr(stream, "device_id", None)
        elif hasattr(stream, "__cuda_stream__"):  # CUDA Python's stream protocol: (version, handle)
            handle = int(stream.__cuda_stream__()[1])
        elif cls.__module__.startswith("cuda.") and cls.__name__ in ("CUstream", "cudaStream_t"):
            handle = int(stream)
        else:
            raise bad(f"argument 'stream' is a {cls.__name__}, not a CUDA stream",
                      hint="pass a torch.cuda.Stream, a cupy stream, or 0 for the default stream")
    except ArgumentError:
        raise
    except Exception as e:
        raise bad(f"argument 'stream' could not be read as a CUDA stream: {e}") from None
    if stream_device is not None and device is not None and int(stream_device) != device:
        raise bad(f"argument 'stream' is a stream of cuda:{stream_device}, the tensors are on cuda:{device}",
                  hint=f"pass a stream of cuda:{device}")
    return handle


# ---- allocation on the fast path ---------------------------------------------------------------


def strided_allocator(framework: str, device: int, shape: tuple[int, ...], strides: tuple[int, ...], dtype: DType):
    """``make() -> (object, pointer)``: a new uninitialised tensor of ``shape`` and ``strides``
    (elements) on ``device``, from the framework's allocator (so it is stream-ordered and can be
    captured in a CUDA graph). For torch, one ``torch.empty_strided`` call."""
    if framework == "torch":
        torch = sys.modules["torch"]
        tdt = getattr(torch, dtype.torch)
        dev = torch.device("cuda", device)
        empty_strided = torch.empty_strided

        def make():
            t = empty_strided(shape, strides, dtype=tdt, device=dev)
            return t, t.data_ptr()

        return make
    if framework == "cupy":
        cupy = sys.modules["cupy"]
        if dtype.torch not in ("float32", "float16"):
            raise ArgumentError(f"cupy has no {dtype} arrays", hint="pass out= tensors, or use torch")
        span = 1 + sum((s - 1) * st for s, st in zip(shape, strides)) if all(shape) else 0
        itemsize = dtype.bytes

        def make():
            with cupy.cuda.Device(device):
                mem = cupy.cuda.alloc(max(1, span) * itemsize)
                arr = cupy.ndarray(shape, dtype=dtype.torch, memptr=mem,
                                   strides=tuple(st * itemsize for st in strides))
            return arr, int(arr.data.ptr)

        return make
    raise ArgumentError("evtc can only allocate outputs with torch or cupy",
                        hint="pass preallocated outputs with out={'name': tensor, ...}")


def bytes_allocator(framework: str, device: int):
    """``make(nbytes) -> (object, pointer)``: a device buffer (workspace, scratch) from the
    framework's allocator; other frameworks fall back to ``cudaMalloc`` (which synchronises and
    can't be captured in a CUDA graph)."""
    if framework == "torch":
        torch = sys.modules["torch"]
        dev = torch.device("cuda", device)
        empty, u8 = torch.empty, torch.uint8

        def make(nbytes: int):
            t = empty((nbytes,), dtype=u8, device=dev)
            return t, t.data_ptr()

        return make
    like = TensorView(None, 0, (), (), None, "", device, framework)
    return lambda nbytes: empty_bytes(like, nbytes)


# ---- device memory fills through the driver (rare paths: zero sizes, K = 0) ---------------------


def memset_async(ptr: int, pattern: int, element_bytes: int, count: int, stream: int, device: int) -> None:
    """Fill ``count`` elements of ``element_bytes`` (1, 2 or 4) at ``ptr`` with the bit pattern
    ``pattern`` on ``stream`` (``cuMemsetD{8,16,32}Async``; capturable in a CUDA graph).

    Raises:
        LaunchError: the driver refused.
    """
    from cuda.bindings import driver as cu  # type: ignore[import-not-found]

    from evtc.errors import LaunchError

    def ok(res):
        err = res[0] if isinstance(res, tuple) else res
        if int(err) != 0:
            raise LaunchError(f"CUDA driver error {err} while filling an output")
        return res[1] if isinstance(res, tuple) and len(res) > 1 else None

    if count <= 0:
        return
    try:
        _memset(cu, ok, ptr, pattern, element_bytes, count, stream, device)
    except LaunchError:
        raise
    except Exception as e:  # no driver library, a binding that changed
        raise LaunchError(f"can't fill an output through the CUDA driver: {e}") from None


def _memset(cu, ok, ptr: int, pattern: int, element_bytes: int, count: int, stream: int, device: int) -> None:
    ok(cu.cuInit(0))
    dev = ok(cu.cuDeviceGet(device))
    ctx = ok(cu.cuDevicePrimaryCtxRetain(dev))
    ok(cu.cuCtxPushCurrent(ctx))
    try:
        fn = {1: cu.cuMemsetD8Async, 2: cu.cuMemsetD16Async, 4: cu.cuMemsetD32Async}[element_bytes]
        ok(fn(ptr, pattern, count, stream))
    finally:
        cu.cuCtxPopCurrent()
        cu.cuDevicePrimaryCtxRelease(dev)


@functools.lru_cache(maxsize=None)
def device_name(device: int) -> str:
    """The name of CUDA device ``device`` (``NVIDIA H100 80GB HBM3``), through torch when it is
    loaded, else the CUDA runtime of cuda-python; ``cuda:N`` if neither can tell."""
    torch = sys.modules.get("torch")
    try:
        if torch is not None:
            return str(torch.cuda.get_device_name(device))
        from cuda.bindings import runtime as cudart  # type: ignore[import-not-found]

        err, prop = cudart.cudaGetDeviceProperties(device)
        if int(err) == 0:
            return prop.name.decode(errors="replace").rstrip("\x00")
    except Exception:  # noqa: BLE001 - a name is only a key for the tuner's store
        pass
    return f"cuda:{device}"
