"""``torch.compile(model, backend="evtc", mode=...)`` (NOTE [Modes] in evtc/torch/backend.py):
torch.compile's modes are Inductor configuration, patched in around every Inductor compilation
the backend makes (inference, training's forward and backward, a shape's specialization when it
is first called) and nowhere else; an unknown mode is an ArgumentError before anything is
traced. On the CPU, where Inductor skips CUDA graphs, with evtc's float64 interpreter as the
fused op's kernel (tests/null/test_torch_backend.py)."""

import pytest

torch = pytest.importorskip("torch")

import torch_zoo as Z  # noqa: E402
from test_torch_backend import GEMMS, register  # noqa: E402

from evtc.errors import ArgumentError  # noqa: E402
from evtc.torch.backend import make_backend, mode_config  # noqa: E402

F = torch.nn.functional


def test_mode_config_is_inductors_list():
    from torch._inductor import list_mode_options

    assert mode_config(None) == {} and mode_config("default") == {}
    for mode in ("reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs"):
        assert mode_config(mode) == list_mode_options(mode) and mode_config(mode)
    assert mode_config("reduce-overhead")["triton.cudagraphs"] is True
    for bad in ("fastest", "MAX-AUTOTUNE", 5):
        with pytest.raises(ArgumentError, match="not one of torch.compile's modes"):
            mode_config(bad)


def _seen(monkeypatch, name):
    """Record Inductor's cudagraphs and max_autotune settings at each call of
    ``torch._inductor.compile_fx.<name>``."""
    import torch._inductor.compile_fx as cfx
    from torch._inductor import config

    seen, real = [], getattr(cfx, name)

    def spy(*args, **kwargs):
        seen.append((config.triton.cudagraphs, config.max_autotune))
        return real(*args, **kwargs)

    monkeypatch.setattr(cfx, name, spy)
    return seen


def test_a_mode_reaches_inductor_through_torch_compile(monkeypatch):
    from torch._inductor import config

    seen = _seen(monkeypatch, "compile_fx")
    torch._dynamo.reset()
    lin = torch.nn.Linear(32, 16)
    f = torch.compile(lambda x: F.gelu(lin(x)), backend="evtc", mode="reduce-overhead")
    x = torch.randn(8, 32)
    with torch.no_grad():
        torch.testing.assert_close(f(x), F.gelu(lin(x)))
    assert seen and all(s == (True, False) for s in seen), seen
    assert (config.triton.cudagraphs, config.max_autotune) == (False, False)  # patched only while compiling
    with pytest.raises(Exception, match="not one of torch.compile's modes"):
        torch._dynamo.reset()
        torch.compile(lambda x: lin(x) + 1, backend="evtc", mode="fastest")(x)


@pytest.mark.parametrize("dynamic", [False, True])
def test_a_mode_covers_fused_graphs_and_each_shapes_specialization(monkeypatch, dynamic):
    seen = _seen(monkeypatch, "compile_fx")
    torch._dynamo.reset()
    GEMMS.clear()
    be = make_backend(allow_cpu=True, on_gemm=lambda g: (GEMMS.append(g), register(g)),
                      inductor_config=mode_config("max-autotune-no-cudagraphs"))
    lin = torch.nn.Linear(64, 48).to(torch.bfloat16)
    f = torch.compile(lambda x: torch.relu(lin(x)), backend=be, dynamic=dynamic)
    with torch.no_grad():
        for m in (32, 40):
            x = torch.randn(m, 64, dtype=torch.bfloat16)
            want = torch.relu(x.double() @ lin.weight.double().T + lin.bias.double())
            got = f(x)
            assert (got.double() - want).abs().max().item() <= 2 ** -7 * want.abs().max().item()
    assert be.fused >= 2 if dynamic else be.fused >= 1
    # dynamic: the symbolic graph's generic compilation, then one per shape when first called
    assert len(seen) >= (3 if dynamic else 1) and all(s == (False, True) for s in seen), seen


def test_a_mode_covers_trainings_forward_and_backward(monkeypatch):
    seen = _seen(monkeypatch, "compile_fx_inner")
    torch._dynamo.reset()
    GEMMS.clear()
    be = make_backend(allow_cpu=True, on_gemm=lambda g: (GEMMS.append(g), register(g)),
                      inductor_config=mode_config("max-autotune-no-cudagraphs"))
    block, args = Z.make("gpt2", 64, 256, 48)
    block.to(torch.bfloat16)
    x = args[0].detach().clone().requires_grad_(True)
    torch.compile(block, backend=be)(x, *args[1:]).float().sum().backward()
    assert be.fused >= 2 and x.grad is not None
    assert len(seen) >= 2 and all(s == (False, True) for s in seen), seen


@pytest.mark.parametrize("bad, match", [("max-autotune", "a dict of Inductor configuration"),
                                        ({"max_autotuned": True}, "'max_autotuned' not Inductor configuration")])
def test_make_backend_checks_its_inductor_config(bad, match):
    with pytest.raises(ArgumentError, match=match):
        make_backend(inductor_config=bad)
    assert make_backend(inductor_config={"max_autotune": True}).inductor_config == {"max_autotune": True}
