"""What the torch backend's tests share, on the CPU (tests/null) and on the GPU (tests/gpu): the
models they compile and the one-rounding check. Import only where torch is installed."""

import torch
import torch.nn.functional as F
from torch import nn

from evtc import dtypes
from evtc.testing import ulp as _ulp


def ulp(x, dtype: str = "bf16"):
    """:func:`evtc.testing.ulp` of a float64 torch tensor (the spacing of ``dtype`` at |x|), as a
    float64 tensor on x's device."""
    return torch.from_numpy(_ulp(x.detach().double().cpu().numpy(), dtypes.coerce(dtype))).to(x.device)


def within_half_ulp(got, ref, dtype: str = "bf16", slack=0.0, what: str = ""):
    """``got`` (one rounding of a value close to the float64 ``ref``) is within half a spacing of
    ``dtype`` at ``ref``, plus ``slack`` (a float or a tensor broadcasting to ref) for the f32
    arithmetic before that rounding."""
    err = (got.double() - ref).abs()
    bound = 0.5 * ulp(ref, dtype) + slack + 1e-300
    bad = err > bound
    worst = int((err - bound).argmax())
    assert not bad.any(), (f"{what}: {int(bad.sum())} of {bad.numel()} beyond the bound; worst excess "
                           f"{(err - bound).max().item():.3g} (got {got.double().flatten()[worst]:.6g}, "
                           f"want {ref.flatten()[worst]:.6g})")


class LinearGelu(nn.Module):
    """``gelu_tanh(fc(x))``: one match, a row broadcast (the bias)."""

    def __init__(self, k=32, n=64):
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x):
        return F.gelu(self.fc(x), approximate="tanh")


class MLPBlock(nn.Module):
    """``x + down(gelu(up(x)))``: two matches, the second with the residual as an aux load."""

    def __init__(self, d=32, ffn=64):
        super().__init__()
        self.up, self.down = nn.Linear(d, ffn), nn.Linear(ffn, d)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(x)))


class LayerNormStats(nn.Module):
    """A linear layer whose LayerNorm statistics (the row mean and mean of squares of its output)
    come out of the GEMM's epilogue; the normalisation itself is Inductor's."""

    def __init__(self, k=32, n=64):
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x):
        h = self.fc(x)
        mu = h.mean(-1, keepdim=True)
        ms = (h * h).mean(-1, keepdim=True)
        return (h - mu) * torch.rsqrt(ms - mu * mu + 1e-5), h, mu, ms


class Fp8Out(nn.Module):
    """An e4m3 output scaled by ``scale`` (a number or a 0-d tensor) and the amax of its input."""

    def __init__(self, k=32, n=64):
        super().__init__()
        self.fc = nn.Linear(k, n)

    def forward(self, x, scale):
        y = torch.relu(self.fc(x))
        return (y * scale).to(torch.float8_e4m3fn), y.abs().amax()
