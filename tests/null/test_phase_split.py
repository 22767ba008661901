"""The row-phase split (NOTE [Row-phase split], evtc/dispatch/phase_split.py) without a GPU: its
geometry (every view TMA-addressable, every element of the caller's tensors computed exactly
once, by the main call or the fringe) and a whole call on CPU torch tensors, with a stand-in for
the two batched GEMM launches that evaluates the epilogue on exactly the views it is given."""

import numpy as np
import pytest

import evtc
from evtc import bf16, f32
from evtc.ir.interpret import interpret
from evtc.dispatch import phase_split as ps


@evtc.epilogue
def split_epi(acc, C, R: evtc.Matrix, bias: evtc.RowVector[f32], scale: evtc.ColVector[f32], alpha: float):
    F = alpha * acc * R + bias * scale
    return {"D": evtc.relu(F) + C, "F": F}


@evtc.epilogue
def split_red(acc, bias: evtc.RowVector[f32]):
    D = acc + bias
    return {"D": D, "row_max": evtc.max(D, dim=1)}


def _aligned(byte_offset: int) -> bool:
    return byte_offset % 16 == 0


# (M, N, row stride, base offset in elements, element bytes)
CASES = [(4096, 50257, 50257, 0, 2), (64, 2049, 2049, 3, 2), (48, 1001, 1006, 5, 2), (32, 37, 37, 1, 2),
         (16, 515, 515, 7, 4), (32, 999, 999, 3, 1), (8, 4097, 4104, 3, 2)]


@pytest.mark.parametrize("M,N,ld,off,eb", CASES)
def test_every_view_is_tma_aligned_and_every_element_is_computed_once(M, N, ld, off, eb):
    base = (1 << 20) + off * eb
    geom = ps.find_geometry(M, N, [(base, ld, eb)], align_bytes=[eb])
    assert geom is not None
    G, step, shift = geom.groups, geom.step, geom.shift
    assert (G * ld * eb) % 16 == 0 and ((ld + step) * eb) % 16 == 0 and (base + shift * eb) % 16 == 0
    assert G == 16 // np.gcd(ld * eb % 16 or 16, 16) or (ld * eb) % 16 == 0
    assert geom.main_n % (16 // eb) == 0 and geom.fringe_n % (16 // eb) == 0 and geom.fringe_n >= geom.fringe
    seen = np.zeros((M, N), dtype=np.int64)
    for l in range(G):
        c0 = geom.start(l)
        # the main view of phase l: rows l + G i, columns c0 .. c0 + Nb, at an aligned address
        assert _aligned(base + (l * ld + c0) * eb)
        seen[l::G, c0:c0 + geom.main_n] += 1
    assert seen.max() == 1
    # the index arithmetic fringe_indices runs on the device, here on numpy arrays
    dst, src = ps.index_math(geom, np.arange(M, dtype=np.int64)[:, None], np.arange(geom.fringe, dtype=np.int64),
                             np.where)
    assert dst.size == M * geom.fringe
    r, c = dst // N, dst % N
    np.add.at(seen, (r, c), 1)
    assert (seen == 1).all(), "an element is computed twice or never"
    # the fringe element of (r, c) sits at column w of the gathered list, inside phase l's window
    w = src % geom.width
    assert (src // geom.width == r).all()
    lo = (r % G) * step
    assert ((w >= lo) & (w < lo + geom.fringe)).all()
    R = geom.right
    assert (np.where(w < R, w + N - R, w - R) == c).all()


def test_no_split_where_the_rows_disagree_or_m_is_ragged():
    # packed bf16 C and a padded D: no step fits both row strides
    assert ps.find_geometry(64, 2049, [(0, 2049, 2), (0, 2056, 2)], align_bytes=[2]) is None
    assert ps.find_geometry(60, 2049, [(0, 2049, 2)], align_bytes=[2]) is None  # 60 rows, G = 8
    # one shift for every tensor: their bases must sit at one offset mod 16 bytes
    assert ps.find_geometry(64, 2049, [(0, 2049, 2), (2, 2049, 2)], align_bytes=[2]) is None
    assert ps.find_geometry(64, 2049, [(2, 2049, 2), (4098, 2049, 2)], align_bytes=[2]) is not None
    assert ps.find_geometry(64, 9, [(0, 9, 2)], align_bytes=[2]) is None  # nothing left for the main call
    # an fp8 output beside packed odd-N bf16 rows: no row stride of bytes takes the views
    assert ps.find_geometry(64, 2049, [(0, 2049, 2)], align_bytes=[2, 1]) is None
    assert ps.find_geometry(64, 2049, [(0, 2049, 2)], align_bytes=[2, 4]) is not None
    # reading B once per phase must hide under the MMA time: 4096 rows yes, 512 no
    assert ps.reread_ok(4096, 50257, 4096, 8, 2) and not ps.reread_ok(512, 50257, 4096, 8, 2)


def _torch():
    return pytest.importorskip("torch")


class _Gemm:
    """Evaluates the epilogue in float64 on the views each launch gets, and rounds into them."""

    def __init__(self, graph):
        from evtc.plan.target import SM90

        self.graph = graph
        self.launches = []
        self.specs = []
        self.b = bf16
        self.target = SM90
        self.members = {}
        self.family = self  # the stand-in is both the Dispatcher and its GemmFamily

    def choose(self, M, N, K, L):
        """The family's ``pingpong`` member, without its cluster where the cluster's rounding pads
        the tiles by more than 10 % (NOTE [Cluster padding]; a stand-in for the model's choice)."""
        from evtc.family.spec import KernelSpec, scheduled_tiles
        from evtc.plan.config import GemmConfig

        spec = KernelSpec("pingpong", GemmConfig(tile=(128, 192, 64), cluster=(2, 1, 1), schedule="pingpong"), "sm90")
        c1 = KernelSpec("pingpong_c1", spec.config.replace(cluster=(1, 1, 1)), "sm90")
        padded = scheduled_tiles(spec.config, M, N, 1, swizzle=0)
        return c1 if padded > 1.1 * scheduled_tiles(c1.config, M, N, 1, swizzle=0) else spec

    def launcher(self, spec):
        def launch(A, B, kwargs, out, stream):
            self.specs.append(spec.name)
            return self.run(A, B, kwargs, out, stream)

        return launch

    def run(self, A, B, kwargs, out, stream):
        torch = _torch()
        assert A.dim() == 3 and B.dim() == 3
        for x in [A, B, *out.values(), *(v for v in kwargs.values() if hasattr(v, "dim") and v.dim() == 3)]:
            eb = x.element_size()
            assert all((s * eb) % 16 == 0 for s in x.stride()[:-1]) and x.stride(-1) == 1, "not TMA-addressable"
            assert (x.storage_offset() * eb) % 16 == 0 or x.data_ptr() % 16 == 0
        self.launches.append((tuple(A.shape), tuple(B.shape)))
        acc = (A.double() @ B.double().transpose(1, 2)).numpy()
        vals = {k: (v.double().numpy() if hasattr(v, "dim") else v) for k, v in kwargs.items()}
        res = interpret(self.graph, acc, vals)
        for n, y in out.items():
            y.copy_(torch.from_numpy(res[n]).to(y.dtype))


def _packed(M, N, dtype, off, fill=None, gap=0):
    """(buffer, an (M, N) tensor in it ``off`` elements in, rows N + ``gap`` apart)."""
    torch = _torch()
    buf = torch.full((M * (N + gap) + 16,), float("nan"), dtype=dtype)
    t = buf.as_strided((M, N), (N + gap, 1), off)
    if fill is not None:
        t.copy_(fill)
    return buf, t


@pytest.mark.parametrize("M,N,K,off", [(64, 203, 32, 0), (32, 1001, 16, 3), (16, 77, 48, 5)])
@pytest.mark.parametrize("in_place", [False, True])
def test_a_whole_call_matches_the_unsplit_reference(M, N, K, off, in_place):
    torch = _torch()
    g = torch.Generator().manual_seed(M + N + off)
    rnd = lambda *s: torch.randn(*s, generator=g)  # noqa: E731
    graph = split_epi.graph
    A, B = rnd(M, K).to(torch.bfloat16), rnd(N, K).to(torch.bfloat16)
    _, C = _packed(M, N, torch.bfloat16, off, rnd(M, N))
    _, R = _packed(M, N, torch.bfloat16, off, rnd(M, N))
    kw = {"C": C, "R": R, "bias": rnd(N), "scale": rnd(M), "alpha": 0.75}
    ref_in = {k: (v.clone() if hasattr(v, "clone") else v) for k, v in kw.items()}
    bufs, given = {}, {}
    for n in ("D", "F"):
        # F's rows 8 elements further apart than C's: another row stride, the same phases
        bufs[n], given[n] = _packed(M, N, torch.bfloat16, off, gap=8 if n == "F" else 0)
    if in_place:
        given["D"] = C
    views = [(t.data_ptr(), t.stride(0), 2) for t in (C, R, *given.values())]
    assert given["F"].stride(0) == N + 8
    geom = ps.find_geometry(M, N, views, align_bytes=[2, 2])
    assert geom is not None and geom.groups == 8
    fake = _Gemm(graph)
    got = ps.run(fake, geom, A, B, kw, given, None, loads={"C": bf16, "R": bf16}, stores={"D": bf16, "F": bf16},
                 rows={"bias"}, cols={"scale"})
    assert got["D"] is given["D"] and got["F"] is given["F"]
    Mb = M // 8
    assert fake.launches == [((8, Mb, K), (8, geom.fringe_n, K)), ((8, Mb, K), (8, geom.main_n, K))]
    # the fringe, then the main call: on the batch-inner tile order (B's reads would not hide at
    # this size), both without the 2x1 cluster (one M tile a phase: NOTE [Cluster padding])
    assert fake.specs == ["pingpong_c1", "pingpong_c1_bi"]
    acc = (A.double() @ B.double().T).numpy()
    ref = interpret(graph, acc, {k: (v.double().numpy() if hasattr(v, "dim") else v) for k, v in ref_in.items()})
    for n in ("D", "F"):
        assert not torch.isnan(got[n]).any(), f"{n}: an element was never written"
        np.testing.assert_array_equal(got[n].double().numpy(), ref[n].reshape(got[n].shape), err_msg=n)
    # nothing outside the caller's tensors was written (F's gaps between rows included)
    for n in ("F",) + (() if in_place else ("D",)):
        outside = torch.ones(bufs[n].shape, dtype=torch.bool)
        outside.as_strided(given[n].shape, given[n].stride(), off).fill_(False)
        assert torch.isnan(bufs[n][outside]).all(), n


def test_the_members_launchers_are_cached_per_gemm_and_forgotten_after_tuning():
    fake = _Gemm(split_epi.graph)
    geom = ps.find_geometry(4096, 50257, [(0, 50257, 2)], align_bytes=[2])
    first = ps.launchers(fake, geom, 4096)
    assert ps.launchers(fake, geom, 4096) is first
    assert ps.launchers(fake, geom, 2048) is not first  # another K: chosen on its own
    ps.forget(fake)  # what Dispatcher.forget calls (a new tuning, a new staging setting)
    assert ps.launchers(fake, geom, 4096) is not first


def test_the_switch_comes_from_the_environment_and_is_checked(monkeypatch):
    from evtc.dispatch import staging

    monkeypatch.delenv(staging.SPLIT_ENV, raising=False)
    assert staging.split_mode() == "auto"
    monkeypatch.setenv(staging.SPLIT_ENV, " Never ")
    assert staging.split_mode() == "never"
    monkeypatch.setenv(staging.SPLIT_ENV, "sometimes")
    with pytest.raises(evtc.ArgumentError, match="EVTC_PHASE_SPLIT='sometimes' is not one of auto, always, never"):
        staging.split_mode()


def test_packed_geometry_applies_the_route_s_rule(monkeypatch):
    """``packed_geometry`` (what benchmarks prebuild for packed calls) answers as a call would:
    a split that fits but whose fixed cost is not below MARGIN x the unaligned kernel's penalty
    (1024 x 4097 bias_relu: 35 us of penalty) or with under MIN_PHASE_ROWS rows a phase is not
    taken; EVTC_PHASE_SPLIT=always takes every split that fits, never none."""
    import epilogues as E

    from evtc.dispatch import staging

    g = evtc.Gemm(E.bias_relu, a=bf16, b=bf16, c=bf16, d=bf16)
    monkeypatch.delenv(staging.SPLIT_ENV, raising=False)
    fits = ps.find_geometry(1024, 4097, [(0, 4097, 2), (0, 4097, 2)], align_bytes=[2])
    assert fits is not None and fits.rows >= ps.MIN_PHASE_ROWS
    assert ps.packed_geometry(g, 1024, 4097, 4096) is None  # the cost rule
    assert ps.packed_geometry(g, 4096, 4097, 4096) == ps.find_geometry(4096, 4097, [(0, 4097, 2)] * 2,
                                                                          align_bytes=[2])
    assert ps.packed_geometry(g, 4096, 50257, 4096) is not None
    assert ps.packed_geometry(g, 512, 32001, 4096) is None  # 64 rows a phase
    monkeypatch.setenv(staging.SPLIT_ENV, "always")
    assert ps.packed_geometry(g, 1024, 4097, 4096) == fits
    monkeypatch.setenv(staging.SPLIT_ENV, "never")
    assert ps.packed_geometry(g, 4096, 50257, 4096) is None
