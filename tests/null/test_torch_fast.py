"""The torch fast path (evtc/torch/fast.py, NOTE [The torch fast path]) without a GPU.

The extension is built against the installed torch (about 20 s, once per cache directory) and
run in its test mode, which accepts CPU tensors: a key is registered from a call the Python
launch path made (on stand-in device tensors of the same shapes, strides and dtypes), then the
extension's call with CPU torch tensors must pack exactly the bytes the Python packer packs
for the same pointers and scalars, allocate the outputs the signature says, and refuse (None,
no launch) every call the Python path would have to check again: another key, a tensor
subclass, a scalar of another type or out of range, a misaligned pointer, extra or missing
arguments, a launch that fails. GPU tests: tests/gpu/test_runtime_checks.py."""

import ctypes
import math
import shutil
import types

import pytest

torch = pytest.importorskip("torch")

import evtc  # noqa: E402
from evtc import f16  # noqa: E402
from evtc.abi import abi_fields  # noqa: E402
from evtc.runtime.launch import Launcher  # noqa: E402
from evtc.torch import fast as torch_fast  # noqa: E402

from test_runtime_launch import Fake, FakeLibrary, lin, stats  # noqa: E402

pytestmark = pytest.mark.skipif(shutil.which("c++") is None, reason="needs a C++ compiler")

LAUNCH = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p)


@pytest.fixture(scope="module")
def mod(tmp_path_factory, monkeypatch_module):
    monkeypatch_module.setenv("EVTC_CACHE_DIR", str(tmp_path_factory.mktemp("fastcache")))
    return torch_fast.build()


@pytest.fixture(scope="module")
def monkeypatch_module():
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


class Recorder:
    """A C-callable stand-in for a library's evtc_launch: records the raw call struct."""

    def __init__(self, size, status=0):
        self.size, self.status, self.calls = size, status, []
        self.fn = LAUNCH(self._launch)
        self.address = ctypes.cast(self.fn, ctypes.c_void_p).value

    def _launch(self, addr):
        self.calls.append(ctypes.string_at(addr, self.size))
        return self.status


def fake_of(t):
    """A stand-in device tensor with t's shape, strides and dtype."""
    typestr = {torch.float16: "<f2", torch.float32: "<f4"}[t.dtype]
    return Fake(tuple(t.shape), typestr, strides=tuple(t.stride()))


def setup(mod, ep=lin, M=64, N=32, K=16, status=0):
    g = evtc.Gemm(ep, a=f16, b=f16, c=f16, d=f16)
    lib = FakeLibrary(abi_fields(g.graph, "sm90"))
    run = Launcher(g.dispatch.family.primary_binder(), lib, g.name)
    A, B = torch.randn(M, K, dtype=torch.float16), torch.randn(N, K, dtype=torch.float16)
    kw = {"C": torch.randn(M, N, dtype=torch.float16), "alpha": 1.5, "bias": torch.randn(N, dtype=torch.float32)}
    fA, fB = fake_of(A), fake_of(B)
    fkw = {k: (fake_of(v) if isinstance(v, torch.Tensor) else v) for k, v in kw.items()}
    # the Python path's signature and prepare (its launch would allocate D with a framework)
    sig, ptrs = run.binder.signature(fA, fB, fkw, None)
    run._prepare(sig, ptrs, [fkw[n] for n in run.binder.scalar_names])
    assert sig.mode == "launch" and sig.handle >= 0 and sig.allocs
    fast = torch_fast.FastPath(mod, g.dispatch.family.primary_binder(), lib.call_layout, allow_cpu=True)
    rec = Recorder(lib.call_layout.size, status)
    assert fast.add(run, sig, A, B, kw, rec.address)
    return fast, rec, run, sig, lib, A, B, kw


def test_packs_what_the_python_path_packs(mod):
    fast, rec, run, sig, lib, A, B, kw = setup(mod)
    assert len(fast) == 1
    D = fast.call(fast.table, A, B, kw)
    assert isinstance(D, torch.Tensor) and len(rec.calls) == 1
    alloc = sig.allocs[0]
    assert tuple(D.shape) == alloc.shape and D.stride() == alloc.strides and D.dtype == torch.float16
    want = lib.call_layout.packer.pack(sig.handle, 0, sig.workspace, 0, A.data_ptr(), B.data_ptr(),
                                       kw["C"].data_ptr(), kw["bias"].data_ptr(), D.data_ptr(), 1.5)
    assert rec.calls[0] == want
    # new values and pointers, same key: still the fast path, with this call's values
    kw2 = {"C": torch.randn(64, 32, dtype=torch.float16), "alpha": -3, "bias": torch.randn(32)}
    D2 = fast.call(fast.table, A, B, kw2)
    want2 = lib.call_layout.packer.pack(sig.handle, 0, sig.workspace, 0, A.data_ptr(), B.data_ptr(),
                                        kw2["C"].data_ptr(), kw2["bias"].data_ptr(), D2.data_ptr(), -3.0)
    assert rec.calls[1] == want2


@pytest.mark.parametrize("change", [
    "shape", "dtype", "strides", "extra_kwarg", "missing_kwarg", "alpha_bool", "alpha_str", "alpha_nan",
    "alpha_huge", "alpha_big_int", "subclass", "misaligned", "kwargs_not_dict", "a_parameter", "none_tensor"])
def test_refuses_what_python_must_check(mod, change):
    fast, rec, run, sig, lib, A, B, kw = setup(mod)
    kw = dict(kw)
    if change == "shape":
        A = torch.randn(65, 16, dtype=torch.float16)
    elif change == "dtype":
        kw["bias"] = kw["bias"].half()
    elif change == "strides":
        kw["C"] = torch.randn(32, 64, dtype=torch.float16).t()
    elif change == "extra_kwarg":
        kw["beta"] = 1.0
    elif change == "missing_kwarg":
        del kw["alpha"]
    elif change == "alpha_bool":
        kw["alpha"] = True
    elif change == "alpha_str":
        kw["alpha"] = "1.5"
    elif change == "alpha_nan":
        kw["alpha"] = math.nan
    elif change == "alpha_huge":
        kw["alpha"] = 1e39
    elif change == "alpha_big_int":
        kw["alpha"] = 10 ** 400
    elif change == "subclass":
        class T(torch.Tensor):
            pass
        kw["C"] = kw["C"].as_subclass(T)
    elif change == "misaligned":
        # same shape and strides, a base address TMA can't use
        buf = torch.randn(64 * 32 + 1, dtype=torch.float16)
        kw["C"] = buf[1:].view(64, 32)
    elif change == "kwargs_not_dict":
        kw = types.MappingProxyType(kw)
    elif change == "a_parameter":
        A = torch.nn.Parameter(A)  # another Python type for A: another key
    elif change == "none_tensor":
        kw["C"] = None
    assert fast.call(fast.table, A, B, kw) is None
    assert rec.calls == []


def test_parameter_registered_separately(mod):
    fast, rec, run, sig, lib, A, B, kw = setup(mod)
    W = torch.nn.Parameter(B)
    assert fast.add(run, sig, A, W, kw, rec.address)
    assert fast.call(fast.table, A, W, kw) is not None and len(rec.calls) == 1


def test_failed_launch_drops_the_entry(mod):
    fast, rec, run, sig, lib, A, B, kw = setup(mod, status=6)  # evtc_launch: stale handle
    assert fast.call(fast.table, A, B, kw) is None
    assert len(rec.calls) == 1 and len(fast) == 0
    assert fast.call(fast.table, A, B, kw) is None and len(rec.calls) == 1  # not tried again


def test_swap_ab_packs_b_first(mod):
    fast, rec, run, sig, lib, A, B, kw = setup(mod)
    swapped = types.SimpleNamespace(binder=types.SimpleNamespace(**{
        n: getattr(run.binder, n) for n in ("tensor_names", "scalar_names", "output_names")}, swap=True),
        layout=run.layout)
    assert fast.add(swapped, sig, A, B, kw, rec.address)
    D = fast.call(fast.table, A, B, kw)
    want = lib.call_layout.packer.pack(sig.handle, 0, sig.workspace, 0, B.data_ptr(), A.data_ptr(),
                                       kw["C"].data_ptr(), kw["bias"].data_ptr(), D.data_ptr(), 1.5)
    assert rec.calls[0] == want


def test_many_outputs_come_back_as_the_python_path_returns_them(mod):
    fast, rec, run, sig, lib, A, B, kw = setup(mod, ep=stats)
    out = fast.call(fast.table, A, B, kw)
    assert list(out) == list(run.binder.output_names)
    by_name = {a.name: a for a in sig.allocs}
    for name, t in out.items():
        assert tuple(t.shape) == by_name[name].shape and t.stride() == by_name[name].strides
    assert len(rec.calls) == 1
    fields = lib.call_layout.packer.unpack(rec.calls[0])
    ptrs = dict(zip(lib.call_layout.pointers, fields[4:]))
    for name, t in out.items():
        assert ptrs[f"p_{name}"] == t.data_ptr()


def test_layout_offsets_match_the_packer():
    g = evtc.Gemm(stats, a=f16, b=f16, c=f16, d=f16)
    layout = FakeLibrary(abi_fields(g.graph, "sm90")).call_layout
    off = layout.offsets()
    values = list(range(1, 5 + len(layout.pointers))) + [0.5] * len(layout.scalars)
    raw = layout.packer.pack(*values[:4 + len(layout.pointers)], *values[4 + len(layout.pointers):])
    names = ["handle", "workspace", "workspace_bytes", "stream", *layout.pointers]
    for i, n in enumerate(names):
        assert int.from_bytes(raw[off[n]:off[n] + 8], "little") == values[i]
    for n in layout.scalars:
        assert ctypes.c_float.from_buffer_copy(raw[off[n]:off[n] + 4]).value == 0.5


def test_gemm_registers_only_torch_calls_and_respects_the_switch(monkeypatch):
    monkeypatch.setenv("EVTC_TORCH_FASTPATH", "0")
    assert torch_fast.mode() == "0"
    g = evtc.Gemm(lin, a=f16, b=f16, c=f16, d=f16)
    g.dispatch.fast.register(None, (), Fake((4, 4)), Fake((4, 4)), {})  # not torch tensors: nothing happens
    assert g.dispatch.fast.table is None and not g.dispatch.fast.off
    g.dispatch.fast.register(None, (), torch.zeros(1), torch.zeros(1), {})
    assert g.dispatch.fast.table is None and g.dispatch.fast.off  # switched off: never asked again


def test_loader_refuses_a_tampered_build(mod, tmp_path):
    # (a copy: rewriting the loaded file in place would change the code this process runs)
    folder = tmp_path / "copy"
    shutil.copytree(torch_fast._folder(), folder)
    so = folder / "ext.so"
    data = so.read_bytes()
    so.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))
    with pytest.raises(RuntimeError, match="SHA-256"):
        torch_fast._load(folder)
    (folder / "ext.so").unlink()
    assert torch_fast._load(folder) is None  # not built: None, and the caller builds it


def test_loader_refuses_files_others_could_write(mod, tmp_path):
    folder = tmp_path / "copy"
    shutil.copytree(torch_fast._folder(), folder)
    (folder / "ext.so").chmod(0o666)
    with pytest.raises(RuntimeError, match="not a private file"):
        torch_fast._load(folder)
    (folder / "ext.so").chmod(0o600)
    (folder / "meta.json").unlink()
    (folder / "meta.json").symlink_to(torch_fast._folder() / "meta.json")
    with pytest.raises(RuntimeError, match="not a private file"):
        torch_fast._load(folder)


def test_stale_temporary_builds_are_removed(tmp_path):
    import os
    import time

    old, new = tmp_path / ".ext-old.so", tmp_path / ".ext-new.so"
    old.write_bytes(b"x")
    new.write_bytes(b"x")
    t = time.time() - 3600
    os.utime(old, (t, t))
    torch_fast._clean_stale(tmp_path)
    assert not old.exists() and new.exists()


def test_forgetting_the_dispatch_clears_the_fast_path(mod):
    fast, rec, run, sig, lib, A, B, kw = setup(mod)
    g = evtc.Gemm(lin, a=f16, b=f16, c=f16, d=f16)
    g.dispatch.fast.table = fast
    g.dispatch._routes[("some", "key")] = run
    assert len(fast) == 1
    g.set_unaligned_staging("never")  # a new setting: every signature chooses again
    assert len(fast) == 0 and not g.dispatch._routes
    assert fast.call(fast.table, A, B, kw) is None and rec.calls == []


def test_a_key_the_fast_path_declined_is_not_offered_again(mod):
    """The Python path offers each call to the fast path; a key it declined (here: a signature
    whose mode is not a plain launch) is remembered until the dispatch is forgotten."""
    fast, rec, run, sig, lib, A, B, kw = setup(mod)
    g = evtc.Gemm(lin, a=f16, b=f16, c=f16, d=f16)
    g.dispatch.fast.table, g.dispatch.fast.call = fast, fast.bound
    offered = []
    real_add = fast.add

    def add(*args):
        offered.append(args[1])
        return False  # declined

    fast.add = add
    key = ("declined", "key")
    run._signatures[key] = sig
    for _ in range(3):
        g.dispatch.fast.register(run, key, A, B, kw)
    assert offered == [sig] and key in g.dispatch.fast.refused
    g.dispatch.forget()  # a new choice of kernels: ask again
    g.dispatch.fast.register(run, key, A, B, kw)
    assert offered == [sig, sig]
    fast.add = real_add
