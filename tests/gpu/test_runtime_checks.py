"""Issue 10's silent-wrong cases on the GPU: each is now an ArgumentError that names the
argument, or behaves like torch (zero sizes, in place). Fresh random data, NaN-poisoned outputs,
float64 references (evtc.testing)."""

import math

import pytest

import evtc
from evtc.testing import Problem, check_outputs, failure_report, make_inputs, poisoned_outputs

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def gemms():
    import runtime_kernels as RK
    from conftest_gpu import prebuild

    table = RK.gemms()
    prebuild(list(table.values()))
    return table


def split(ins):
    return ins["A"], ins["B"], {k: v for k, v in ins.items() if k not in ("A", "B")}


def assert_elementwise(g, ins, outs, what, record_errors=None, *, padding=True):
    """Every element of every output within its bound of the float64 reference (evtc.testing,
    NOTE [The error bound]); ``padding``: the outputs' row padding must still be NaN (False for
    outputs whose padding was never poisoned: evtc's own, or an input's)."""
    import torch

    torch.cuda.synchronize()
    results = check_outputs(g, ins, outs, padding=padding)
    if record_errors is not None:
        record_errors(results)
    assert all(r.ok for r in results.values()), failure_report(results, f"{what}:", g.graph)


class Shifted:
    """A torch tensor seen through __cuda_array_interface__ at its address + ``offset`` bytes
    (the same shape and dtype): a misaligned (or, with ``ptr=0``, null) view torch can't make."""

    def __init__(self, t, offset=0, ptr=None):
        typestr = {"float32": "<f4", "float16": "<f2"}[str(t.dtype).replace("torch.", "")]
        self.t = t
        self.__cuda_array_interface__ = {
            "shape": tuple(t.shape), "typestr": typestr, "version": 3,
            "data": (t.data_ptr() + offset if ptr is None else ptr, False),
            "strides": tuple(s * t.element_size() for s in t.stride())}


def test_out_with_batch_stride_zero_is_refused(gemms):
    import torch

    g = gemms["bias_relu"]
    ins = make_inputs(g.graph, g.a, g.b, Problem(256, 128, 64, 2), seed=1)
    A, B, kw = split(ins)
    D = torch.full((256, 128), float("nan"), dtype=torch.bfloat16, device="cuda").expand(2, 256, 128)
    with pytest.raises(evtc.ArgumentError, match=r"output 'out\['D'\]' overlaps itself"):
        g(A, B, out=D, **kw)


def test_out_d_and_f_the_same_tensor_is_refused(gemms):
    g = gemms["stats"]
    p = Problem(256, 128, 64)
    A, B, kw = split(make_inputs(g.graph, g.a, g.b, p, seed=2))
    outs = poisoned_outputs(g.graph, p)
    outs["F"] = outs["D"]
    with pytest.raises(evtc.ArgumentError, match=r"output out\['D'\] overlaps output out\['F'\]"):
        g(A, B, out=outs, **kw)


def test_out_a_is_refused(gemms):
    g = gemms["bias_relu"]
    A, B, kw = split(make_inputs(g.graph, g.a, g.b, Problem(512, 512, 512), seed=3))
    with pytest.raises(evtc.ArgumentError, match=r"output out\['D'\] overlaps input 'A'"):
        g(A, B, out=A, **kw)


@pytest.mark.parametrize("alpha", [1e40, float("inf"), float("nan")])
def test_scalar_not_finite_in_f32_is_refused(gemms, alpha):
    g = gemms["bias_relu"]
    A, B, kw = split(make_inputs(g.graph, g.a, g.b, Problem(128, 128, 64), seed=4))
    g(A, B, **kw)  # the signature is cached: the check is per call
    kw["alpha"] = alpha
    with pytest.raises(evtc.ArgumentError, match="argument 'alpha'"):
        g(A, B, **kw)


def test_bogus_stream_handle_is_refused(gemms):
    import torch

    g = gemms["bias_relu"]
    A, B, kw = split(make_inputs(g.graph, g.a, g.b, Problem(128, 128, 64), seed=5))
    with pytest.raises(evtc.ArgumentError, match="argument 'stream' is the raw handle"):
        g(A, B, stream=12345, **kw)
    s = torch.cuda.Stream()
    D = g(A, B, stream=s, **kw)  # a real stream object works
    s.synchronize()
    assert torch.isfinite(D.float()).all()


@pytest.mark.parametrize("shape", [(0, 128, 64, 1), (256, 0, 64, 1), (256, 128, 64, 0)], ids=["M0", "N0", "L0"])
def test_zero_extents_give_empty_outputs_and_identities(gemms, shape):
    import torch

    g = gemms["stats"]
    M, N, K, L = shape
    batched = L != 1
    ins = make_inputs(g.graph, g.a, g.b, Problem(max(M, 8), max(N, 8), K, max(L, 1)), seed=6, batched=batched)

    def cut(t, *idx):
        return t[(slice(0, L),) + idx] if batched else t[idx]

    A, B = cut(ins["A"], slice(0, M)), cut(ins["B"], slice(0, N))
    kw = {"C": cut(ins["C"], slice(0, M), slice(0, N)), "bias": cut(ins["bias"], slice(0, N)),
          "scale": cut(ins["scale"]), "alpha": ins["alpha"]}
    out = g(A, B, **kw)
    torch.cuda.synchronize()
    lead = (L,) if batched else ()
    assert tuple(out["D"].shape) == lead + (M, N) and tuple(out["F"].shape) == lead + (M, N)
    assert tuple(out["row_max"].shape) == lead + (M,) and tuple(out["col_sum"].shape) == lead + (N,)
    assert tuple(out["amax"].shape) == lead
    if L:
        assert (out["col_sum"] == 0).all()  # a sum over an empty M (or nothing when N = 0)
        assert (out["row_max"] == -math.inf).all()  # a max over an empty N
        assert (out["amax"] == -math.inf).all()  # a max over nothing: the identity
        assert out["col_sum"].numel() + out["row_max"].numel() > 0


def test_zero_k_is_the_epilogue_of_a_zero_accumulator(gemms, record_errors):
    for name in ("bias_relu", "stats"):
        g = gemms[name]
        p = Problem(300, 136, 8)
        ins = make_inputs(g.graph, g.a, g.b, p, seed=7)
        ins["A"], ins["B"] = ins["A"][:, :0], ins["B"][:, :0]
        outs = poisoned_outputs(g.graph, p)
        A, B, kw = split(ins)
        g(A, B, out=outs if len(outs) > 1 else outs["D"], **kw)
        assert_elementwise(g, ins, outs, f"{name}, K = 0", record_errors)  # A @ B.T with K = 0 is zeros


def test_extent_beyond_int32_is_refused(gemms):
    import torch

    g = gemms["bias_relu"]
    big = (1 << 31) + 64
    A = torch.zeros(1, 64, dtype=torch.bfloat16, device="cuda").expand(big, 64)  # no memory behind it
    B = torch.zeros(128, 64, dtype=torch.bfloat16, device="cuda")
    C = torch.zeros(1, 128, dtype=torch.bfloat16, device="cuda").expand(big, 128)
    bias = torch.zeros(128, device="cuda")
    with pytest.raises(evtc.ArgumentError, match=f"M = {big} does not fit in int32"):
        g(A, B, C=C, alpha=1.0, beta=1.0, bias=bias)


def test_expanded_c_is_refused(gemms):
    import torch

    g = gemms["bias_relu"]
    A, B, kw = split(make_inputs(g.graph, g.a, g.b, Problem(256, 128, 64), seed=8))
    kw["C"] = torch.randn(1, 128, device="cuda").to(torch.bfloat16).expand(256, 128)
    with pytest.raises(evtc.ArgumentError, match="argument 'C' has a row stride of 0"):
        g(A, B, **kw)


@pytest.mark.parametrize("what", ["bias", "scale", "row_max"])
def test_misaligned_vector_scalar_and_reduction_are_refused(gemms, what):
    g = gemms["stats"]
    p = Problem(256, 128, 64)
    A, B, kw = split(make_inputs(g.graph, g.a, g.b, p, seed=9))
    outs = poisoned_outputs(g.graph, p)
    g(A, B, out=outs, **kw)
    if what == "row_max":
        outs["row_max"] = Shifted(outs["row_max"], 1)
        label = r"out\['row_max'\]"
    else:
        kw[what] = Shifted(kw[what], 1)
        label = what
    with pytest.raises(evtc.ArgumentError, match=f"argument '{label}' starts at an address that is not a multiple"):
        g(A, B, out=outs, **kw)


def test_null_pointer_is_refused(gemms):
    g = gemms["bias_relu"]
    A, B, kw = split(make_inputs(g.graph, g.a, g.b, Problem(256, 128, 64), seed=10))
    kw["bias"] = Shifted(kw["bias"], ptr=0)
    with pytest.raises(evtc.ArgumentError, match="argument 'bias' is a null pointer"):
        g(A, B, **kw)


def test_in_place_d_equals_c(gemms, record_errors):
    import torch

    g = gemms["bias_relu"]
    p = Problem(333, 200, 128)
    ins = make_inputs(g.graph, g.a, g.b, p, seed=11)
    before = {**ins, "C": ins["C"].clone()}  # the reference's C: the call overwrites it
    A, B, kw = split(ins)
    D = g(A, B, out=kw["C"], **kw)
    torch.cuda.synchronize()
    assert D is kw["C"]
    # C's row padding is an input's (zeros), not poisoned
    assert_elementwise(g, before, {"D": D}, "D = C in place", record_errors, padding=False)


def test_tensors_on_another_device_than_the_current_one(gemms):
    """The kernel runs on the tensors' device (as torch does), not the current device."""
    import torch

    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    g = gemms["bias_relu"]
    p = Problem(256, 128, 64)
    ins = make_inputs(g.graph, g.a, g.b, p, seed=12, device="cuda:1")
    A, B, kw = split(ins)
    with torch.cuda.device(0):
        D = g(A, B, **kw)
    torch.cuda.synchronize(1)
    assert D.device.index == 1
    assert_elementwise(g, ins, {"D": D}, "D on cuda:1", padding=False)  # evtc allocated D
