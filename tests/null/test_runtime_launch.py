"""The launch path without a GPU: the call struct's layout against the C compiler's, the
per-signature cache, the per-call checks on a cached signature, zero sizes, streams, loading
libraries by relative path and checking them against their Gemm.

Tensors are fakes with ``__cuda_array_interface__``; the library is a stand-in that records what
``evtc_launch`` receives (the real one needs a GPU: tests/gpu/test_runtime_checks.py)."""

import ctypes
import json
import math
import shutil
import struct
import subprocess

import pytest

import evtc
from evtc import bf16, f16, f32
from evtc.abi import ABI_VERSION, CALL_HEADER, CallLayout, abi_fields, call_fields, ctypes_struct
from evtc.emit import common
from evtc.ir.printer import print_graph
from evtc.runtime import tensors
from evtc.runtime.bind import Binder, self_overlapping
from evtc.runtime.launch import KernelLibrary, Launcher


class Fake:
    """A device tensor as ``__cuda_array_interface__`` describes it, each at its own address
    (1 GiB apart) unless ``ptr`` is given; ``strides`` in elements."""

    _next = 1 << 32

    def __init__(self, shape, typestr="<f2", ptr=None, strides=None, device=0):
        if ptr is None:
            Fake._next += 1 << 30
            ptr = Fake._next
        itemsize = int(typestr[2:])
        self.ptr = ptr
        self.__cuda_array_interface__ = {
            "shape": tuple(shape), "typestr": typestr, "data": (ptr, False), "version": 3,
            "strides": None if strides is None else tuple(s * itemsize for s in strides)}
        self.device = type("D", (), {"id": device})()


class FakeLibrary:
    """Stands in for KernelLibrary: records prepares and the decoded evtc_call_t of each launch."""

    def __init__(self, fields, statuses=()):
        self.fields = fields
        self.call_layout = CallLayout.of(fields)
        self.prepares = 0
        self.calls = []
        self.statuses = list(statuses)
        self.lib = type("L", (), {})()
        self.lib.evtc_launch = self._launch

    def _launch(self, addr):
        raw = ctypes.string_at(addr, self.call_layout.size)
        self.calls.append(self.call_layout.packer.unpack(raw))
        return self.statuses.pop(0) if self.statuses else 0

    def prepare(self, args, device, epilogue=None):
        self.prepares += 1
        return (self.prepares << 16) | 3, 0

    def raise_status(self, status, epilogue):
        raise evtc.LaunchError(f"status {status}", epilogue=epilogue)


@evtc.epilogue
def lin(acc, C, alpha: float, bias: evtc.RowVector[f32]):
    return alpha * acc + C + bias


@evtc.epilogue
def stats(acc, C, alpha: float, bias: evtc.RowVector[f32]):
    D = alpha * acc + C + bias
    return {"D": D, "F": evtc.relu(D), "row_max": evtc.max(D, dim=1), "col_sum": evtc.sum(D, dim=0),
            "amax": evtc.amax(D)}


def launcher(ep, statuses=(), arch="sm90"):
    g = evtc.Gemm(ep, a=f16, b=f16, c=f16, d=f16, arch=arch,
                  config=None if arch == "sm90" else evtc.GemmConfig(tile=(128, 128, 32), stages=4))
    lib = FakeLibrary(abi_fields(g.graph, arch), statuses)
    return Launcher(g.dispatch.family.primary_binder(), lib, g.name), lib, g


def lin_args(M=64, N=32, K=16):
    return Fake((M, K)), Fake((N, K)), {"C": Fake((M, N)), "alpha": 1.5, "bias": Fake((N,), "<f4")}


# ---- the call struct: Python's layout is the C compiler's ------------------------------------------


@pytest.mark.skipif(shutil.which("g++") is None, reason="needs g++")
@pytest.mark.parametrize("name", ["bias_relu", "many_aux", "row_stats", "fp8_out"])
@pytest.mark.parametrize("arch", ["sm90", "sm80"])
def test_struct_layouts_match_the_c_compiler(tmp_path, name, arch):
    import epilogues as E

    if name == "fp8_out" and arch == "sm80":
        pytest.skip("fp8 is sm90-only")
    a = evtc.e4m3 if name == "fp8_out" else bf16
    cfg = None if arch == "sm90" else evtc.GemmConfig(tile=(128, 128, 32), stages=4)
    g = evtc.Gemm(E.REFERENCE[name], a=a, b=a, d=bf16, arch=arch, config=cfg)
    fields = abi_fields(g.graph, arch)
    header = common.render("common/c_abi_struct.j2", fields=fields)
    members = [("evtc_args_t", f.name) for f in fields] + [("evtc_call_t", n) for n, _ in CALL_HEADER] + \
              [("evtc_call_t", f.name) for f in call_fields(fields)]
    prints = "\n".join(f'  printf("%s.%s %zu\\n", "{s}", "{m}", offsetof({s}, {m}));' for s, m in members)
    src = tmp_path / "layout.cpp"
    src.write_text("#include <cstddef>\n#include <cstdint>\n#include <cstdio>\n" + header + "\nint main() {\n" + prints +
                   '\n  printf("sizeof.evtc_args_t %zu\\nsizeof.evtc_call_t %zu\\n", sizeof(evtc_args_t), sizeof(evtc_call_t));\n}\n')
    exe = tmp_path / "layout"
    subprocess.run(["g++", "-std=c++17", "-o", str(exe), str(src)], check=True, capture_output=True)
    c = dict(line.rsplit(" ", 1) for line in subprocess.run([str(exe)], capture_output=True, text=True,
                                                             check=True).stdout.splitlines())
    Args = ctypes_struct(fields)
    for f in fields:
        assert int(c[f"evtc_args_t.{f.name}"]) == getattr(Args, f.name).offset, f.name
    assert int(c["sizeof.evtc_args_t"]) == ctypes.sizeof(Args)
    layout = CallLayout.of(fields)
    assert int(c["sizeof.evtc_call_t"]) == layout.size == layout.packer.size
    # pack distinct values and read each field back at the C compiler's offset
    names = [n for n, _ in CALL_HEADER] + list(layout.pointers) + list(layout.scalars)
    values = [1000 + i for i in range(len(names) - len(layout.scalars))] + [0.5 + i for i in range(len(layout.scalars))]
    buf = bytearray(layout.size)
    layout.packer.pack_into(buf, 0, *values)
    for n, v in zip(names, values):
        off = int(c[f"evtc_call_t.{n}"])
        got = struct.unpack_from("<f", buf, off)[0] if isinstance(v, float) else struct.unpack_from("<q", buf, off)[0]
        assert got == v, n


def test_call_fields_order():
    fields = abi_fields(lin.trace(c=f16, d=f16), "sm90")
    layout = CallLayout.of(fields)
    assert layout.pointers == ("p_A", "p_B", "p_C", "p_bias", "p_D")
    assert layout.scalars == ("s_alpha",)
    with pytest.raises(OverflowError):
        layout.packer.pack(0, 0, 0, 0, 1, 2, 3, 4, 5, 1e40)


# ---- the signature cache and the per-call checks ---------------------------------------------------


def test_signature_is_checked_once_per_layout(monkeypatch):
    run, lib, g = launcher(lin)
    calls = []
    orig = run.binder.signature
    monkeypatch.setattr(run.binder, "signature", lambda *a, **k: calls.append(1) or orig(*a, **k))
    A, B, kw = lin_args()
    D = Fake((64, 32))
    for _ in range(3):
        assert run(A, B, kw, D) is D
    assert len(calls) == 1 and lib.prepares == 1 and len(lib.calls) == 3
    A2, B2, kw2 = lin_args()  # same layouts, new addresses: still cached
    run(A2, B2, kw2, Fake((64, 32)))
    assert len(calls) == 1
    A3, B3, kw3 = lin_args(M=128)  # a new shape: checked and prepared again
    run(A3, B3, kw3, Fake((128, 32)))
    assert len(calls) == 2 and lib.prepares == 2


def test_launch_struct_holds_this_calls_pointers_and_scalars():
    run, lib, g = launcher(lin)
    A, B, kw = lin_args()
    D = Fake((64, 32))
    run(A, B, kw, D, stream=2)
    run(A, B, {**kw, "alpha": -0.25}, D, stream=0)
    (h1, ws1, wsb1, s1, *rest1), (h2, ws2, wsb2, s2, *rest2) = lib.calls
    assert h1 == h2 == (1 << 16) | 3 and (ws1, wsb1) == (0, 0)
    assert (s1, s2) == (2, 0)
    assert rest1 == [A.ptr, B.ptr, kw["C"].ptr, kw["bias"].ptr, D.ptr, 1.5]
    assert rest2[-1] == -0.25


@pytest.mark.parametrize("alpha", [1e40, -1e39, float("inf"), float("nan"), True, "1.0", 10 ** 400])
def test_scalars_must_be_finite_numbers_on_every_call(alpha):
    run, lib, g = launcher(lin)
    A, B, kw = lin_args()
    D = Fake((64, 32))
    run(A, B, kw, D)  # cached now
    with pytest.raises(evtc.ArgumentError, match="argument 'alpha'"):
        run(A, B, {**kw, "alpha": alpha}, D)
    run2, _, _ = launcher(lin)
    with pytest.raises(evtc.ArgumentError, match="argument 'alpha'"):  # first call
        run2(A, B, {**kw, "alpha": alpha}, D)


def test_pointer_checks_run_on_every_call():
    run, lib, g = launcher(lin)
    A, B, kw = lin_args()
    D = Fake((64, 32))
    run(A, B, kw, D)
    bad = Fake((64, 32), ptr=kw["C"].ptr + 8)  # same layout, so the cached signature is found
    with pytest.raises(evtc.ArgumentError, match="argument 'C' starts at an address that is not 16-byte aligned"):
        run(A, B, {**kw, "C": bad}, D)
    with pytest.raises(evtc.ArgumentError, match="argument 'bias' starts at an address that is not a multiple of its"):
        run(A, B, {**kw, "bias": Fake((32,), "<f4", ptr=kw["bias"].ptr + 1)}, D)
    with pytest.raises(evtc.ArgumentError, match="argument 'bias' is a null pointer"):
        run(A, B, {**kw, "bias": Fake((32,), "<f4", ptr=0)}, D)
    with pytest.raises(evtc.ArgumentError, match=r"output out\['D'\] overlaps input 'A'"):
        run(A, B, kw, Fake((64, 32), ptr=A.ptr))
    assert len(lib.calls) == 1


def test_in_place_d_equals_c_is_allowed_partial_overlap_is_not():
    run, lib, g = launcher(lin)
    A, B, kw = lin_args()
    C = kw["C"]
    assert run(A, B, kw, C) is C  # exactly C: in place
    shifted = Fake((64, 32), ptr=C.ptr + 32 * 2)  # one row further on
    with pytest.raises(evtc.ArgumentError, match=r"output out\['D'\] overlaps input 'C'"):
        run(A, B, kw, shifted)
    wide = Fake((64, 64), ptr=C.ptr)  # C and D as column blocks of one (64, 64) buffer: disjoint
    left = Fake((64, 32), ptr=wide.ptr, strides=(64, 1))
    right = Fake((64, 32), ptr=wide.ptr + 32 * 2, strides=(64, 1))
    run(A, B, {**kw, "C": left}, right)
    with pytest.raises(evtc.ArgumentError, match="overlaps"):  # the bias may not be written either
        run(A, B, kw, Fake((64, 32), ptr=kw["bias"].ptr - 16))


def test_outputs_may_not_share_memory():
    run, lib, g = launcher(stats)
    A, B, kw = lin_args()
    X = Fake((64, 32))
    outs = {"D": X, "F": X, "row_max": Fake((64,), "<f4"), "col_sum": Fake((32,), "<f4"), "amax": Fake((), "<f4")}
    with pytest.raises(evtc.ArgumentError, match=r"output out\['D'\] overlaps output out\['F'\]"):
        run(A, B, kw, outs)
    outs["F"] = Fake((64, 32))
    outs["amax"] = Fake((), "<f4", ptr=outs["row_max"].ptr + 4)
    with pytest.raises(evtc.ArgumentError, match=r"out\['row_max'\] overlaps output out\['amax'\]"):
        run(A, B, kw, outs)
    outs["amax"] = Fake((), "<f4")
    run(A, B, kw, outs)


def test_output_with_batch_stride_zero_is_refused():
    run, lib, g = launcher(lin)
    A, B = Fake((2, 64, 16)), Fake((2, 32, 16))
    kw = {"C": Fake((64, 32)), "alpha": 1.0, "bias": Fake((32,), "<f4")}
    with pytest.raises(evtc.ArgumentError, match=r"output 'out\['D'\]' overlaps itself"):
        run(A, B, kw, Fake((2, 64, 32), strides=(0, 32, 1)))
    red, _, _ = launcher(stats)
    outs = {"D": Fake((2, 64, 32)), "F": Fake((2, 64, 32)), "row_max": Fake((2, 64), "<f4", strides=(0, 1)),
            "col_sum": Fake((2, 32), "<f4"), "amax": Fake((2,), "<f4")}
    with pytest.raises(evtc.ArgumentError, match=r"out\['row_max'\]' overlaps itself"):
        red(A, B, kw, outs)


@pytest.mark.parametrize("strides, needle", [
    ((0, 1), "row stride of 0"),
    ((-32, 1), "negative stride"),
    ((16, 1), "rows overlap"),
])
def test_bad_strides_of_an_input(strides, needle):
    run, lib, g = launcher(lin)
    A, B, kw = lin_args()
    with pytest.raises(evtc.ArgumentError, match=f"argument 'C' has a {needle}|argument 'C' .*{needle}"):
        run(A, B, {**kw, "C": Fake((64, 32), strides=strides)}, Fake((64, 32)))


def test_expanded_operand_a_is_refused():
    run, lib, g = launcher(lin)
    A, B, kw = lin_args()
    with pytest.raises(evtc.ArgumentError, match="argument 'A' has a row stride of 0"):
        run(Fake((64, 16), strides=(0, 1)), B, kw, Fake((64, 32)))


@pytest.mark.parametrize("which", ["M", "N", "K"])
def test_extents_beyond_int32_are_refused(which):
    run, lib, g = launcher(lin)
    big = (1 << 31) + 64
    M, N, K = (big if which == "M" else 64), (big if which == "N" else 32), (big if which == "K" else 16)
    A, B = Fake((M, K), strides=(0, 1)), Fake((N, K), strides=(0, 1))
    kw = {"C": Fake((M, N), strides=(0, 1)), "alpha": 1.0, "bias": Fake((N,), "<f4")}
    with pytest.raises(evtc.ArgumentError, match=f"{which} = {big} does not fit in int32"):
        run(A, B, kw, Fake((M, N)))


def test_stale_handle_is_prepared_again():
    run, lib, g = launcher(lin, statuses=[6, 0])
    A, B, kw = lin_args()
    run(A, B, kw, Fake((64, 32)))
    assert lib.prepares == 2 and len(lib.calls) == 2 and lib.calls[1][0] == (2 << 16) | 3


def test_launch_failure_is_an_evtc_error():
    run, lib, g = launcher(lin, statuses=[4])
    A, B, kw = lin_args()
    with pytest.raises(evtc.LaunchError, match="status 4"):
        run(A, B, kw, Fake((64, 32)))


def test_dlpack_only_objects_take_the_full_path_every_call():
    """Objects without a cheap key are checked in full (no stale signature can be reused)."""
    run, lib, g = launcher(lin)
    A, B, kw = lin_args()
    assert run._probe(A, B, kw, Fake((64, 32)))[0] is not None
    assert run._probe(A, B, {**kw, "C": object()}, None) == (None, None)
    assert run._probe(A, B, {**kw, "extra": 1}, None) == (None, None)


# ---- zero sizes -----------------------------------------------------------------------------------


def test_zero_m_is_empty_with_reductions_at_their_identity():
    g = evtc.Gemm(stats, a=f16, b=f16, c=f16, d=f16)
    A, B = Fake((0, 16)), Fake((32, 16))
    kw = {"C": Fake((0, 32)), "alpha": 1.0, "bias": Fake((32,), "<f4")}
    outs = {"D": Fake((0, 32)), "F": Fake((0, 32)), "row_max": Fake((0,), "<f4"), "col_sum": Fake((32,), "<f4"),
            "amax": Fake((), "<f4")}
    sig, ptrs = g.dispatch.family.primary_binder().signature(A, B, kw, outs)
    assert sig.mode == "empty"
    fills = {sig.operands[f.index].name: (f.count, f.batches, f.value) for f in sig.fills}
    assert fills == {"out['col_sum']": (32, 1, 0.0), "out['amax']": (1, 1, -math.inf)}
    assert not any(sig.operands[i].name in ("A", "C") for i, _ in sig.checks)


def test_zero_k_runs_on_a_zero_scratch():
    run, lib, g = launcher(lin)
    A, B = Fake((64, 0), strides=(1, 1)), Fake((32, 0), strides=(1, 1))
    kw = {"C": Fake((64, 32)), "alpha": 1.0, "bias": Fake((32,), "<f4")}
    sig, _ = g.dispatch.family.primary_binder().signature(A, B, kw, Fake((64, 32)))
    assert sig.mode == "k0" and sig.kpad == 8
    assert (sig.values["K"], sig.values["ld_A"], sig.values["ld_B"], sig.values["bs_A"]) == (8, 8, 8, 0)


def test_zero_n_and_l_are_empty():
    g = evtc.Gemm(lin, a=f16, b=f16, c=f16, d=f16)
    sig, _ = g.dispatch.family.primary_binder().signature(Fake((64, 16)), Fake((0, 16)), {"C": Fake((64, 0)), "alpha": 1.0,
                                                                  "bias": Fake((0,), "<f4")}, Fake((64, 0)))
    assert sig.mode == "empty" and not sig.fills
    sig, _ = g.dispatch.family.primary_binder().signature(Fake((0, 64, 16)), Fake((0, 32, 16)), {"C": Fake((64, 32)), "alpha": 1.0,
                                                                        "bias": Fake((32,), "<f4")}, Fake((0, 64, 32)))
    assert sig.mode == "empty" and sig.L == 0


def test_self_overlap_rule():
    assert self_overlapping((2, 4, 8), (0, 8, 1))
    assert self_overlapping((4, 8), (4, 1))
    assert not self_overlapping((2, 4, 8), (32, 8, 1))
    assert not self_overlapping((1, 4, 8), (0, 8, 1))  # a batch of one may have any stride
    assert not self_overlapping((4, 8), (16, 1))  # padded rows


# ---- streams ---------------------------------------------------------------------------------------


def test_stream_handles():
    assert [tensors.stream_handle(s) for s in (0, 1, 2)] == [0, 1, 2]
    with pytest.raises(evtc.ArgumentError, match="argument 'stream' is the raw handle 0x3039"):
        tensors.stream_handle(12345)
    with pytest.raises(evtc.ArgumentError, match="argument 'stream' is a str"):
        tensors.stream_handle("default")
    with pytest.raises(evtc.ArgumentError, match="argument 'stream' is a bool"):
        tensors.stream_handle(True)

    class TorchLike:
        cuda_stream = 0xABC0
        device_index = 1

    assert tensors.stream_handle(TorchLike(), 1) == 0xABC0
    with pytest.raises(evtc.ArgumentError, match="argument 'stream' is a stream of cuda:1, the tensors are on cuda:0"):
        tensors.stream_handle(TorchLike(), 0)

    class Protocol:
        def __cuda_stream__(self):
            return (0, 0xDEF0)

    assert tensors.stream_handle(Protocol(), 0) == 0xDEF0


def test_bogus_stream_is_refused_before_any_launch():
    run, lib, g = launcher(lin)
    A, B, kw = lin_args()
    with pytest.raises(evtc.ArgumentError, match="argument 'stream'"):
        run(A, B, kw, Fake((64, 32)), stream=12345)
    assert not lib.calls


# ---- loading and checking libraries --------------------------------------------------------------


def _fake_library(tmp_path, graph, arch="sm90", *, name=None, abi=ABI_VERSION, fields=None):
    """A tiny shared library with the C ABI's metadata functions, describing ``graph``."""
    fields = fields or abi_fields(graph, arch)
    info = {"static": {"abi": [f.to_json() for f in fields], "ir": print_graph(graph), "name": name or graph.name,
                       "arch": arch}}
    layout = CallLayout.of(fields)
    src = tmp_path / "k.c"
    src.write_text(f"""
#include <stddef.h>
int evtc_abi_version(void) {{ return {abi}; }}
size_t evtc_args_size(void) {{ return {ctypes.sizeof(ctypes_struct(fields))}; }}
size_t evtc_call_size(void) {{ return {layout.size}; }}
const char* evtc_info(void) {{ return {json.dumps(json.dumps(info))}; }}
const char* evtc_last_error(void) {{ return ""; }}
int evtc_can_implement(void) {{ return 0; }}
size_t evtc_workspace_size(void) {{ return 0; }}
int evtc_run(void) {{ return 5; }}
int evtc_prepare(void) {{ return 5; }}
int evtc_launch(void) {{ return 6; }}
""")
    so = tmp_path / "k.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(so), str(src)], check=True, capture_output=True)
    return so


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
@pytest.mark.parametrize("spelling", ["k.so", "./k.so"])
def test_library_loads_by_relative_path(tmp_path, monkeypatch, spelling):
    g = lin.trace(c=f16, d=f16)
    _fake_library(tmp_path, g)
    monkeypatch.chdir(tmp_path)
    lib = KernelLibrary(spelling)
    assert lib.path == (tmp_path / "k.so").resolve() and lib.info["static"]["name"] == "lin"


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_library_of_another_kernel_is_refused(tmp_path):
    gemm = evtc.Gemm(lin, a=f16, b=f16, c=f16, d=f16)
    other = evtc.Gemm(stats, a=f16, b=f16, c=f16, d=f16)
    lib = KernelLibrary(_fake_library(tmp_path, other.graph))
    with pytest.raises(evtc.LaunchError, match="is not the kernel of this Gemm: its argument struct") as ei:
        lib.verify(fields=abi_fields(gemm.graph, "sm90"), ir=print_graph(gemm.graph), name="lin", arch="sm90")
    assert ei.value.anchor == "library-mismatch"
    mine = KernelLibrary(_fake_library(tmp_path / "x" if (tmp_path / "x").mkdir() is None else tmp_path, gemm.graph))
    mine.verify(fields=abi_fields(gemm.graph, "sm90"), ir=print_graph(gemm.graph), name="lin", arch="sm90")
    with pytest.raises(evtc.LaunchError, match="its arch"):
        mine.verify(fields=abi_fields(gemm.graph, "sm90"), ir=print_graph(gemm.graph), name="lin", arch="sm80")


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_library_of_another_abi_is_refused(tmp_path):
    g = lin.trace(c=f16, d=f16)
    with pytest.raises(evtc.LaunchError, match=f"was built for ABI 2, this evtc speaks {ABI_VERSION}"):
        KernelLibrary(_fake_library(tmp_path, g, abi=2))


@pytest.mark.skipif(shutil.which("gcc") is None, reason="needs gcc")
def test_stale_handle_from_the_c_side(tmp_path):
    """The library's status 6 (a stale handle) makes the launcher prepare again; a second 6 is
    an error, not a loop."""
    gemm = evtc.Gemm(lin, a=f16, b=f16, c=f16, d=f16)
    lib = KernelLibrary(_fake_library(tmp_path, gemm.graph))
    run = Launcher(gemm.dispatch.family.primary_binder(), lib, "lin")
    prepared = []
    lib.prepare = lambda args, dev, name=None: prepared.append(args.M) or (1 << 16, 0)
    A, B, kw = lin_args()
    with pytest.raises(evtc.LaunchError, match="stale handle"):
        run(A, B, kw, Fake((64, 32)))
    assert prepared == [64, 64]


def test_sm80_binder_accepts_element_aligned_vectors():
    run, lib, g = launcher(lin, arch="sm80")
    A, B, kw = lin_args(N=30)
    kw["C"] = Fake((64, 30), strides=(32, 1))
    run(A, B, kw, Fake((64, 30), strides=(32, 1)))
    assert len(lib.calls) == 1


def test_gemm_call_errors_show_no_evtc_frames():
    """Gemm.__call__'s errors leave evtc with the user's frames only (api_boundary)."""
    import traceback

    run, lib, g = launcher(lin)
    g.dispatch._single = run
    A, B, kw = lin_args()
    D = Fake((64, 32))
    assert g(A, B, out=D, **kw) is D
    with pytest.raises(evtc.ArgumentError, match="argument 'alpha'") as ei:
        g(A, B, out=D, **{**kw, "alpha": 1e40})
    frames = [f.filename for f in traceback.extract_tb(ei.value.__traceback__)]
    assert not any("/evtc/" in f.replace("\\", "/") for f in frames), frames
    assert frames[0].endswith("test_runtime_launch.py")
    assert ei.value.__cause__ is None


def test_prebuild_groups_of_the_runtime_tests_and_bench_host():
    """benchmarks/prebuild.py's groups ``runtime`` and ``host`` name the kernels that
    tests/gpu/test_runtime_checks.py, test_graphs.py and benchmarks/bench_host.py build."""
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    import prebuild

    gemms = prebuild.gemms_of(["runtime"])
    # the runtime tests pin their kernel
    names = sorted((g.name, g.arch, g.a.name, len(g.jobs())) for g in gemms)
    assert names == [("bias_relu", "sm90", "bf16", 1), ("bias_relu", "sm90", "f16", 1), ("stats", "sm80", "bf16", 1),
                     ("stats", "sm90", "bf16", 1)]
    # bench_host measures what users get at its shape: the family member each epilogue runs on there
    import bench_host

    host = prebuild.gemms_of(["host"])
    want = {g.kernel(g.choose(256, 256, 256)).source for g in bench_host.gemms().values()}
    assert {j.source for j in host} == want and len(want) == 3


@pytest.mark.parametrize("shapes", [((0, 64), (64, 64), (0, 64)), ((5, 64), (0, 64), (5, 0)),
                                    ((0, 5, 64), (0, 64, 64), (0, 5, 64))], ids=["M=0", "N=0", "L=0"])
def test_an_empty_call_builds_nothing(no_build, shapes):
    """NOTE [An empty call builds nothing] (evtc/runtime/launch.py): a call with no rows, columns
    or batches returns its outputs without building the chosen kernel (it built it, minutes of
    nvcc, then launched nothing)."""
    from fakecuda import FakeCuda

    from evtc.runtime.launch import EmptyLauncher

    g = evtc.Gemm("D = relu(acc + bias[n])", a="f16", d="f16")
    a, b, d = shapes
    out = FakeCuda(d)
    got = g(FakeCuda(a), FakeCuda(b), bias=FakeCuda((b[-2],), typestr="<f4"), out=out)
    assert got is out and all(type(r) is EmptyLauncher for r in g.dispatch._routes.values())
    assert g.dispatch.family.primary.library is None
