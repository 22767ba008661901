"""The padded staging route for unaligned M x N rows (NOTE [Padded staging for unaligned rows],
evtc/dispatch/staging.py) without a GPU: the cost model's choices, the padded strides of
evtc's outputs (the binder's and the torch fake's), and a family Gemm's call through the route
on fake tensors: which kernel runs, what is copied where, ``out=`` (copy-back and in-place
``out=C``), the checks that still refuse bad calls, and the switch."""

import pytest

import evtc
from evtc import f16, f32
from evtc.abi import abi_fields, ctypes_struct
from evtc.dispatch import staging
from evtc.runtime import tensors
from evtc.runtime.bind import Binder
from evtc.runtime.launch import Launcher

from test_runtime_launch import Fake, FakeLibrary  # noqa: E402


@evtc.epilogue
def aux_epi(acc, C, R: evtc.Matrix, bias: evtc.RowVector[f32]):
    F = acc * R + bias
    return {"D": F + C, "F": F}


@evtc.epilogue
def lin(acc, C, alpha: float, bias: evtc.RowVector[f32]):
    return alpha * acc + C + bias


# ---- the cost model -----------------------------------------------------------------------------


def test_cost_model_stages_large_inputs_not_small_problems_or_outputs_alone():
    bf = evtc.bf16
    loads, stores = {"C": bf}, {"D": bf}
    # bias_relu at 4096 x 50257 bf16 with a packed C: 0.33 ms of copy against ~1.7 ms of penalty
    d = staging.decide(4096, 50257, 1, loads, stores, ("C",), (), "auto")
    assert d.stage and 0.2e-3 < d.stage_s < 0.5e-3 and 1.4e-3 < d.penalty_s < 2.1e-3
    # the measured bias_relu penalty (4.07 - 2.32 ms with a packed out= D): the model within 10%
    d = staging.decide(4096, 50257, 1, loads, stores, ("C",), ("D",), "auto")
    assert d.stage and abs(d.penalty_s - 1.75e-3) < 0.175e-3
    # aux_heavy (two loads, two stores, all packed): stage
    d = staging.decide(4096, 50257, 1, {"R1": bf, "R2": bf}, {"D": bf, "F": bf}, ("R1", "R2"), ("D", "F"), "auto")
    assert d.stage
    # rowmax: only a caller's packed D; a copy-back costs about what the unaligned store does
    d = staging.decide(4096, 50257, 1, {}, {"D": bf}, (), ("D",), "auto")
    assert not d.stage
    # a small problem: the copies' fixed cost dominates
    assert not staging.decide(300, 515, 1, loads, stores, ("C",), (), "auto").stage
    assert staging.decide(300, 515, 1, loads, stores, ("C",), (), "always").stage
    assert not staging.decide(4096, 50257, 1, loads, stores, ("C",), (), "never").stage
    # batches count: L = 8 of 1024 x 1001 is worth it where one is not
    assert not staging.decide(1024, 1001, 1, loads, stores, ("C",), (), "auto").stage
    assert staging.decide(1024, 1001, 8, loads, stores, ("C",), (), "auto").stage


def test_mode_comes_from_the_environment_and_is_checked(monkeypatch):
    monkeypatch.delenv(staging.ENV, raising=False)
    assert staging.mode() == "auto"
    monkeypatch.setenv(staging.ENV, "Never")
    assert staging.mode() == "never" and staging.mode("always") == "always"
    with pytest.raises(evtc.ArgumentError, match="auto, always or never"):
        staging.mode("sometimes")


def test_misaligned_rows_batches_bases_and_ragged_outputs():
    assert staging.misaligned(tensors.view(Fake((64, 63)), "C"), 2)  # 126-byte rows
    assert not staging.misaligned(tensors.view(Fake((64, 63), strides=(64, 1)), "C"), 2)
    assert staging.misaligned(tensors.view(Fake((64, 63), strides=(64, 1)), "D"), 2, output=True)  # ragged N
    assert staging.misaligned(tensors.view(Fake((64, 64), ptr=(1 << 40) + 2), "C"), 2)
    assert staging.misaligned(tensors.view(Fake((3, 64, 63), strides=(64 * 64 + 1, 64, 1)), "C"), 2)  # batch stride
    assert not staging.misaligned(tensors.view(Fake((3, 64, 63), strides=(64 * 64, 64, 1)), "C"), 2)
    assert not staging.misaligned(tensors.view(Fake((0, 63)), "C"), 2)


@pytest.mark.parametrize("dtype", [f16, f32, evtc.e4m3])
@pytest.mark.parametrize("N", [50257, 64, 1, 7])
def test_the_binder_allocates_the_padded_strides(dtype, N):
    """Outputs evtc allocates: rows padded to 16 bytes, batches packed; padded_strides (the torch
    fake's) says the same."""
    @evtc.epilogue
    def e(acc):
        return acc

    g = evtc.Gemm(e, a=f16, b=f16, d=dtype, config=evtc.GemmConfig(unaligned=True))
    b = g.dispatch.family.primary_binder()
    for A, B in ((Fake((64, 32)), Fake((N, 32))), (Fake((3, 64, 32)), Fake((3, N, 32)))):
        sig, _ = b.signature(A, B, {})
        (alloc,) = sig.allocs
        assert alloc.strides == staging.padded_strides(alloc.shape, dtype.bytes)
        assert alloc.strides[-2] * dtype.bytes % 16 == 0 and alloc.strides[-2] - N < 16 // dtype.bytes
    assert staging.padded_strides((4096, 50257), 2) == (50264, 1)
    assert staging.padded_strides((4, 100, 50257), 2) == (100 * 50264, 50264, 1)


def test_outputs_follow_packed_inputs_only():
    """NOTE [The row layout of the outputs evtc allocates]: packed outputs after contiguous M x N
    inputs of which one at least has rows that are not 16-byte multiples; shapes and strides
    decide, nothing else."""
    from evtc.runtime.bind import follows_packed_inputs as f
    from evtc.runtime.tensors import contiguous_strides

    assert f(50257, [((4096, 50257), (50257, 1), 2)])
    assert f(50257, [((4096, 50257), (50257, 1), 2), ((4096, 50257), (50257, 1), 4)])  # bf16 and f32
    assert f(63, [((3, 64, 63), (64 * 63, 63, 1), 2)])  # batched, contiguous
    assert f(63, [((1, 64, 63), (7, 63, 1), 2)])  # an extent of 1 has any stride
    assert not f(50257, [])  # no M x N input: padded
    assert not f(50257, [((4096, 50257), (50264, 1), 2)])  # padded input: padded output
    assert not f(50257, [((4096, 50257), (50257, 1), 2), ((4096, 50257), (50264, 1), 2)])  # mixed
    assert not f(50264, [((4096, 50264), (50264, 1), 2)])  # aligned rows: padding is a no-op
    assert not f(50260, [((4096, 50260), (50260, 1), 4)])  # 16-byte f32 rows
    assert f(50260, [((4096, 50260), (50260, 1), 2)])  # ... but 8-byte-aligned bf16 rows
    assert not f(63, [((1, 63), (63, 1), 2)])  # one row: its stride never matters
    assert not f(63, [((64, 63), (1, 64), 2)])  # column-major
    assert contiguous_strides((3, 64, 63)) == (64 * 63, 63, 1) and contiguous_strides(()) == ()
    assert contiguous_strides((0, 5)) == (5, 1)  # as torch.empty((0, 5)).stride()
    assert contiguous_strides((5, 0, 3)) == (3, 3, 1)  # as torch.empty((5, 0, 3)).stride()


def test_arrays_without_strides_are_c_contiguous():
    """``__cuda_array_interface__`` with ``strides`` None (and DLPack with NULL strides) means
    C-contiguous: the view gets :func:`contiguous_strides` of the shape, in elements."""
    from evtc.runtime import tensors

    class Arr:
        __cuda_array_interface__ = {"shape": (3, 64, 63), "typestr": "<f2", "data": (4096, False),
                                    "strides": None, "version": 3}

    v = tensors.view(Arr(), "C")
    assert v.shape == (3, 64, 63) and v.strides == (64 * 63, 63, 1)
    Arr.__cuda_array_interface__ = dict(Arr.__cuda_array_interface__, strides=(2 * 64 * 64, 2 * 64, 2))
    assert tensors.view(Arr(), "C").strides == (64 * 64, 64, 1)  # given in bytes


# ---- a family Gemm's call through the route, on fake tensors -------------------------------------


class Harness:
    """A family Gemm whose kernels are FakeLibrary launchers (one per member, recording their
    launches), with fake-framework allocation and copies recorded."""

    def __init__(self, monkeypatch, ep=aux_epi, mode="auto"):
        monkeypatch.setenv("EVTC_CACHE_DIR", "/nonexistent/evtc-test-cache")
        monkeypatch.setenv(staging.ENV, mode)
        self.g = g = evtc.Gemm(ep, a=f16, b=f16, c=f16, d=f16)
        self.libs: dict[str, FakeLibrary] = {}
        self.copies: list[tuple[int, int]] = []
        self.allocs: list[Fake] = []
        self.launchers: dict[str, Launcher] = {}

        def launcher(spec):
            name = "unaligned" if spec.config.unaligned else "packed" if spec.config.packed_stores else "aligned"
            if name not in self.launchers:
                graph = g.graph_for(spec.arch)
                lib = self.libs[name] = FakeLibrary(abi_fields(graph, spec.arch))
                binder = Binder(graph, g.a, g.b, ctypes_struct(abi_fields(graph, spec.arch)), arch=spec.arch,
                                swap=spec.config.swap_ab, mn_tma=not spec.config.unaligned,
                                packed_stores=spec.config.packed_stores)
                self.launchers[name] = Launcher(binder, lib, g.name)
            return self.launchers[name]

        monkeypatch.setattr(g.dispatch.family, "launcher", launcher)
        monkeypatch.setattr(staging, "FRAMEWORKS", ("torch", "cupy", "other"))

        def strided_allocator(framework, device, shape, strides, dtype):
            def make():
                t = Fake(shape, "<f4" if dtype.bytes == 4 else "<f2", strides=strides)
                self.allocs.append(t)
                return t, t.ptr
            return make

        monkeypatch.setattr(tensors, "strided_allocator", strided_allocator)
        monkeypatch.setattr(staging, "_copy", lambda fw, dst, src: self.copies.append((dst.ptr, src.ptr)))

    def launched(self, name):
        """The pointers of each launch of a kernel (decoded evtc_call_t, after the header)."""
        lib = self.libs.get(name)
        return [] if lib is None else lib.calls


def aux_args(M, N, K=64, packed=True):
    ld = N if packed else (N + 7) // 8 * 8
    return (Fake((M, K)), Fake((N, K)),
            {"C": Fake((M, N), strides=(ld, 1)), "R": Fake((M, N), strides=(ld, 1)), "bias": Fake((N,), "<f4")})


def test_large_packed_inputs_are_staged_and_the_aligned_kernel_runs(monkeypatch):
    h = Harness(monkeypatch)
    A, B, kw = aux_args(4096, 50257)
    out = h.g(A, B, **kw)
    assert h.launched("aligned") and not h.launched("unaligned")
    # C and R copied once each into fresh padded buffers, which the kernel read
    assert [src for _, src in h.copies[:2]] == [kw["C"].ptr, kw["R"].ptr]
    staged = {a.ptr: a for a in h.allocs}
    for dst, _ in h.copies[:2]:
        cai = staged[dst].__cuda_array_interface__
        assert cai["shape"] == (4096, 50257) and cai["strides"] == (50264 * 2, 2)
    call = h.launched("aligned")[0]
    assert {dst for dst, _ in h.copies[:2]} <= set(call)
    # the outputs evtc allocated after packed inputs: packed rows too (NOTE [The row layout of
    # the outputs evtc allocates], evtc/gemm.py), computed padded here (these fakes are no torch
    # tensors: no row-phase split) and copied into them
    for name in ("D", "F"):
        cai = out[name].__cuda_array_interface__
        assert cai["shape"] == (4096, 50257) and cai["strides"] == (50257 * 2, 2)
    assert sorted(dst for dst, _ in h.copies[2:]) == sorted(out[n].ptr for n in ("D", "F"))
    assert all(src in call for _, src in h.copies[2:])
    # the second call takes the cached route and copies again
    h.g(A, B, **kw)
    assert len(h.copies) == 8 and len(h.launched("aligned")) == 2


def test_outputs_after_padded_inputs_keep_padded_rows_and_need_no_copy(monkeypatch):
    h = Harness(monkeypatch)
    A, B, kw = aux_args(4096, 50257, packed=False)
    out = h.g(A, B, **kw)
    assert h.launched("aligned") and not h.copies
    for name in ("D", "F"):
        cai = out[name].__cuda_array_interface__
        assert cai["shape"] == (4096, 50257) and cai["strides"] == (50264 * 2, 2)
        assert out[name].ptr in h.launched("aligned")[0]


def test_small_problems_and_never_keep_the_unaligned_kernel(monkeypatch):
    h = Harness(monkeypatch)
    A, B, kw = aux_args(300, 515)
    h.g(A, B, **kw)
    assert h.launched("unaligned") and not h.launched("aligned") and not h.copies
    h = Harness(monkeypatch, mode="never")
    A, B, kw = aux_args(4096, 50257)
    h.g(A, B, **kw)
    assert h.launched("unaligned") and not h.launched("aligned") and not h.copies
    # the switch on the Gemm overrides the environment, for every later call
    h.g.set_unaligned_staging("always")
    h.g(A, B, **kw)
    assert h.launched("aligned") and len(h.copies) == 4  # C and R in, D and F (packed, as C) back
    with pytest.raises(evtc.ArgumentError):
        h.g.set_unaligned_staging("maybe")


def test_the_decision_is_cached_per_signature_switch_and_alignment(monkeypatch):
    h = Harness(monkeypatch)
    calls = []
    plan = staging.StagedLauncher.plan
    monkeypatch.setattr(staging.StagedLauncher, "plan", lambda self, *a: calls.append(1) or plan(self, *a))
    A, B, kw = aux_args(300, 515)
    for _ in range(3):
        h.g(A, B, **kw)
    assert len(calls) == 1 and len(h.launched("unaligned")) == 3
    monkeypatch.setenv(staging.ENV, "always")  # a new switch setting: decided again
    h.g(A, B, **kw)
    assert len(calls) == 2 and h.launched("aligned")
    kw["C"] = Fake((300, 515), ptr=(1 << 45) + 2)  # same signature, another base alignment
    h.g(A, B, **kw)
    assert len(calls) == 3


def test_batched_inputs_are_staged_with_a_padded_batch_stride(monkeypatch):
    h = Harness(monkeypatch, mode="always")
    L, M, N, K = 3, 64, 63, 32
    kw = {"C": Fake((L, M, N)), "R": Fake((L, M, N)), "bias": Fake((N,), "<f4")}
    out = h.g(Fake((L, M, K)), Fake((L, N, K)), **kw)
    assert h.launched("aligned")
    for dst, _ in h.copies[:2]:
        (a,) = [x for x in h.allocs if x.ptr == dst]
        assert a.__cuda_array_interface__["strides"] == (M * 64 * 2, 64 * 2, 2)
    # after packed inputs, packed outputs (contiguous batches), computed padded and copied back
    for name in ("D", "F"):
        assert out[name].__cuda_array_interface__["strides"] == (M * N * 2, N * 2, 2)
    assert sorted(dst for dst, _ in h.copies[2:]) == sorted(out[n].ptr for n in ("D", "F"))


def test_packed_out_tensors_are_written_in_place_by_the_packed_stores(monkeypatch):
    """NOTE [Stores into packed rows]: the caller's packed outputs go to the packed-store variant of
    the member the aligned problem takes; only the packed inputs are copied. (Two M x N outputs:
    ``EVTC_PACKED_STORES=always``; ``auto`` copies them back, the next test.)"""
    monkeypatch.setenv(staging.PACKED_ENV, "always")
    h = Harness(monkeypatch)
    A, B, kw = aux_args(4096, 50257)
    D, F = Fake((4096, 50257)), Fake((4096, 50257))
    res = h.g(A, B, out={"D": D, "F": F}, **kw)
    assert res["D"] is D and res["F"] is F
    assert h.launched("packed") and not h.launched("aligned") and not h.launched("unaligned")
    assert [src for _, src in h.copies] == [kw["C"].ptr, kw["R"].ptr]  # nothing copied back
    call = h.launched("packed")[0]
    assert D.ptr in call and F.ptr in call and all(dst in call for dst, _ in h.copies)
    # aligned inputs: nothing copied at all, where the copy-back route chose the unaligned kernel
    # for an epilogue without loads (rowmax) and staged the rest
    A, B, kw = aux_args(4096, 50257, packed=False)
    h.copies.clear()
    h.g(A, B, out={"D": D, "F": F}, **kw)
    assert len(h.launched("packed")) == 2 and not h.copies
    # a batch stride that is not a multiple of 16 bytes (1001 x 63 elements): the packed stores
    # address every element themselves, so those are written in place too
    L, M, N, K = 2, 1001, 63, 32
    h.g.set_unaligned_staging("always")  # small: "auto" would leave it to the unaligned kernel
    Db, Fb = Fake((L, M, N)), Fake((L, M, N))
    h.g(Fake((L, M, K)), Fake((L, N, K)), out={"D": Db, "F": Fb}, C=Fake((L, M, N)), R=Fake((L, M, N)),
        bias=Fake((N,), "<f4"))
    assert len(h.launched("packed")) == 3
    assert Db.ptr in h.launched("packed")[-1] and not any(dst in (Db.ptr, Fb.ptr) for dst, _ in h.copies)
    # EVTC_PACKED_STORES=0 turns them off
    monkeypatch.setenv(staging.PACKED_ENV, "0")
    h.g(A, B, out={"D": D, "F": F}, **kw)
    assert len(h.launched("packed")) == 3 and h.launched("aligned")


def test_auto_takes_the_packed_stores_for_one_output_only(monkeypatch):
    """``EVTC_PACKED_STORES=auto`` (the default): an epilogue with two M x N outputs copies them
    back (slower on the packed stores, H100), one with a single output writes it in place; an
    unknown value is an ArgumentError naming the variable."""
    h = Harness(monkeypatch)
    A, B, kw = aux_args(4096, 50257)
    D, F = Fake((4096, 50257)), Fake((4096, 50257))
    h.g(A, B, out={"D": D, "F": F}, **kw)
    assert not h.launched("packed") and sorted(dst for dst, _ in h.copies if dst in (D.ptr, F.ptr)) == \
        sorted([D.ptr, F.ptr])
    h1 = Harness(monkeypatch, ep=lin, mode="always")
    C = Fake((2048, 255))  # (an M the selection model runs on a member that is not swap-AB)
    h1.g(Fake((2048, 64)), Fake((255, 64)), out=Fake((2048, 255)), C=C, alpha=1.0, bias=Fake((255,), "<f4"))
    assert h1.launched("packed")
    monkeypatch.setenv(staging.PACKED_ENV, "sometimes")
    h2 = Harness(monkeypatch, ep=lin, mode="always")
    with pytest.raises(evtc.ArgumentError, match="EVTC_PACKED_STORES"):
        h2.g(Fake((2048, 64)), Fake((255, 64)), out=Fake((2048, 255)), C=C, alpha=1.0, bias=Fake((255,), "<f4"))


def test_packed_mode_reads_the_switch_and_its_aliases(monkeypatch):
    for raw, want in (("", "auto"), (" Always ", "always"), ("1", "always"), ("0", "never"), ("never", "never")):
        monkeypatch.setenv(staging.PACKED_ENV, raw)
        assert staging.packed_mode() == want, raw
    monkeypatch.delenv(staging.PACKED_ENV)
    assert staging.packed_mode() == "auto"
    monkeypatch.setenv(staging.PACKED_ENV, "2")
    with pytest.raises(evtc.ArgumentError, match="EVTC_PACKED_STORES='2' is not one of auto, always, never"):
        staging.packed_mode()


def test_the_packed_kernel_is_the_aligned_member_s_variant(monkeypatch):
    monkeypatch.setenv(staging.PACKED_ENV, "always")
    h = Harness(monkeypatch)
    specs = []
    monkeypatch.setattr(h.g.dispatch.family, "launcher", lambda spec, f=h.g.dispatch.family.launcher: specs.append(spec) or f(spec))
    A, B, kw = aux_args(4096, 50257)
    h.g(A, B, out={"D": Fake((4096, 50257)), "F": Fake((4096, 50257))}, **kw)
    (spec,) = specs
    base = h.g.choose(4096, 50257, 64)
    assert spec.config == base.config.replace(packed_stores=True) and spec.name == base.name + "_packed"
    # swap-AB members (decode-sized M) have none: copied back
    specs.clear()
    A, B, kw = aux_args(16, 50257)
    h.g.set_unaligned_staging("always")
    h.g(A, B, out={"D": Fake((16, 50257)), "F": Fake((16, 50257))}, **kw)
    assert not any(s.config.packed_stores for s in specs) and h.launched("aligned")


def test_packed_out_tensors_are_computed_padded_and_copied_back(monkeypatch):
    h = Harness(monkeypatch)
    monkeypatch.setenv(staging.PACKED_ENV, "0")
    A, B, kw = aux_args(4096, 50257)
    D, F = Fake((4096, 50257)), Fake((4096, 50257))
    res = h.g(A, B, out={"D": D, "F": F}, **kw)
    assert res["D"] is D and res["F"] is F
    assert h.launched("aligned")
    srcs = [src for _, src in h.copies]
    assert srcs[:2] == [kw["C"].ptr, kw["R"].ptr]
    back = h.copies[2:]
    assert sorted(dst for dst, _ in back) == sorted([D.ptr, F.ptr])  # into the caller's tensors
    call = h.launched("aligned")[0]
    assert all(src in call for _, src in back) and D.ptr not in call and F.ptr not in call
    # aligned C and R with the same packed outputs: staged too (the unaligned kernel would read
    # C and R one element at a time as well)
    A, B, kw = aux_args(4096, 50257, packed=False)
    h.copies.clear()
    h.g(A, B, out={"D": D, "F": F}, **kw)
    assert len(h.launched("aligned")) == 2 and sorted(dst for dst, _ in h.copies) == sorted([D.ptr, F.ptr])


def test_in_place_out_c_reads_the_staged_copy_and_the_packed_stores_write_c(monkeypatch):
    h = Harness(monkeypatch, ep=lin, mode="always")
    A, B = Fake((2048, 64)), Fake((255, 64))  # (an M whose member is not swap-AB)
    C = Fake((2048, 255))
    res = h.g(A, B, out=C, C=C, alpha=1.0, bias=Fake((255,), "<f4"))
    assert res is C
    (staged,) = h.allocs
    assert h.copies == [(staged.ptr, C.ptr)]
    call = h.launched("packed")[0]
    assert staged.ptr in call and C.ptr in call


def test_in_place_out_c_reads_the_staged_copy_and_copies_back(monkeypatch):
    h = Harness(monkeypatch, ep=lin, mode="always")
    monkeypatch.setenv(staging.PACKED_ENV, "0")
    A, B = Fake((256, 64)), Fake((255, 64))
    C = Fake((256, 255))
    res = h.g(A, B, out=C, C=C, alpha=1.0, bias=Fake((255,), "<f4"))
    assert res is C
    staged, d = h.allocs  # C's padded copy, then the padded output evtc allocated
    assert d.__cuda_array_interface__["strides"] == (256 * 2, 2)
    assert h.copies == [(staged.ptr, C.ptr), (C.ptr, d.ptr)]  # C in, then D over C
    call = h.launched("aligned")[0]
    assert staged.ptr in call and d.ptr in call and C.ptr not in call


def test_a_bad_call_is_still_refused(monkeypatch):
    h = Harness(monkeypatch, ep=lin, mode="always")
    A, B = Fake((256, 64)), Fake((255, 64))
    base = 1 << 44
    C = Fake((256, 255), ptr=base)
    D = Fake((256, 255), ptr=base + 2 * 100)  # overlaps C, not exactly
    with pytest.raises(evtc.ArgumentError, match="overlaps"):
        h.g(A, B, out=D, C=C, alpha=1.0, bias=Fake((255,), "<f4"))
    assert not h.copies and not h.launched("aligned")
    with pytest.raises(evtc.ArgumentError, match="shape"):
        h.g(A, B, C=Fake((256, 254)), alpha=1.0, bias=Fake((255,), "<f4"))


def test_other_frameworks_keep_the_unaligned_kernel(monkeypatch):
    h = Harness(monkeypatch, mode="always")
    monkeypatch.setattr(staging, "FRAMEWORKS", ("torch", "cupy"))
    A, B, kw = aux_args(4096, 50257)
    h.g(A, B, **kw)
    assert h.launched("unaligned") and not h.copies


def test_evtc_views_keep_the_unaligned_kernel(monkeypatch):
    """A Conv's 1x1 route passes TensorViews: nothing to copy them with."""
    h = Harness(monkeypatch, mode="always")
    A, B, kw = aux_args(4096, 50257)
    kw["C"] = tensors.view(kw["C"], "C")
    h.g(A, B, **kw)
    assert h.launched("unaligned") and not h.copies


def test_pinned_gemms_never_stage(monkeypatch):
    monkeypatch.setenv(staging.ENV, "always")
    g = evtc.Gemm(lin, a=f16, b=f16, c=f16, d=f16, config=evtc.GemmConfig(unaligned=True))
    graph = g.graph
    lib = FakeLibrary(abi_fields(graph, "sm90"))
    binder = Binder(graph, g.a, g.b, ctypes_struct(abi_fields(graph, "sm90")), arch="sm90", mn_tma=False)
    monkeypatch.setattr(g.dispatch.family, "launcher", lambda spec: Launcher(binder, lib, g.name))
    monkeypatch.setattr(staging, "_copy", lambda *a: pytest.fail("a pinned Gemm staged a copy"))
    A, B = Fake((4096, 64)), Fake((50257, 64))
    g(A, B, out=Fake((4096, 50257)), C=Fake((4096, 50257)), alpha=1.0, bias=Fake((50257,), "<f4"))
    assert lib.calls and not any(isinstance(x, staging.StagedLauncher) for x in g.dispatch.family.launchers.values())


def test_pitched_copy_layouts():
    """NOTE [Pitched copies for staging]: one 2-D copy over all L x M rows where both layouts are
    unit-stride rows under one pitch; anything else is left to ``copy_``."""
    from evtc.runtime.pitched_copy import row_layout

    # packed bf16 (4096, 50257) into rows padded to 50264
    assert row_layout((4096, 50257), (50264, 1), (50257, 1), 2) == (50264 * 2, 50257 * 2, 50257 * 2, 4096)
    # batched: the batch stride is M rows on both sides, so all L x M rows are one copy
    assert row_layout((3, 5, 7), (5 * 8, 8, 1), (35, 7, 1), 2) == (16, 14, 14, 15)
    # one row: its pitch is never used, any stride passes
    assert row_layout((1, 7), (0, 1), (7, 1), 4) == (28, 28, 28, 1)
    # batch stride not M rows, transposed rows, overlapping rows, other ranks: no
    assert row_layout((3, 5, 7), (48, 8, 1), (35, 7, 1), 2) is None
    assert row_layout((5, 7), (1, 5), (7, 1), 2) is None
    assert row_layout((5, 7), (3, 1), (7, 1), 2) is None
    assert row_layout((7,), (1,), (1,), 2) is None
    assert row_layout((0, 7), (8, 1), (7, 1), 2) is None


def test_pitched_copy_declines_what_it_can_not_copy():
    from evtc.runtime.pitched_copy import copy_rows

    assert copy_rows(object(), object()) is False
    torch = pytest.importorskip("torch")
    a = torch.zeros(4, 7)
    assert copy_rows(a, torch.ones(4, 7)) is False  # CPU tensors: copy_ does it
    assert float(a.sum()) == 0.0
