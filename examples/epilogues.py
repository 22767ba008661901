"""The reference epilogues (docs: DESIGN section 8), written as users write epilogues.

Each is a plain Python function under ``@evtc.epilogue``: it traces into an evtc Graph, and it
also runs eagerly on torch tensors (column vectors shaped (M, 1)), which the GPU tests use as a
second oracle beside evtc's float64 interpreter.

    evtc emit examples/epilogues.py:bias_relu --arch sm90 -o bias_relu.cu
"""

import evtc
from evtc import f32


@evtc.epilogue
def linear_combination(acc, C, alpha: float, beta: float):
    """D = alpha * acc + beta * C."""
    return alpha * acc + beta * C


@evtc.epilogue
def bias_relu(acc, C, alpha: float, beta: float, bias: evtc.RowVector[f32]):
    """D = relu(alpha * acc + beta * C + bias[n])."""
    return evtc.relu(alpha * acc + beta * C + bias)


@evtc.epilogue
def gelu_aux(acc, bias: evtc.RowVector[f32]):
    """Training forward: F = acc + bias[n] (saved for the backward pass), D = gelu(F)."""
    F = acc + bias
    return {"D": evtc.gelu(F), "F": F}


@evtc.epilogue
def dgelu_bgrad(acc, F: evtc.Matrix):
    """Training backward: D = acc * gelu'(F); the bias gradient is the column sum of D."""
    D = acc * evtc.gelu_grad(F)
    return {"D": D, "dbias": evtc.sum(D, dim=0)}


@evtc.epilogue
def residual_scale(acc, scale: evtc.ColVector[f32], bias: evtc.RowVector[f32], R1: evtc.Matrix, R2: evtc.Matrix):
    """D = (acc * scale[m] + bias[n]) * R1 + R2, two aux loads."""
    return (acc * scale + bias) * R1 + R2


@evtc.epilogue
def row_stats(acc, C, alpha: float, beta: float, shift: evtc.ColVector[f32]):
    """D = alpha * acc + beta * C, with softmax statistics of each row: the row max of D and
    the row sum of exp(D - shift[m])."""
    D = alpha * acc + beta * C
    return {"D": D, "row_max": evtc.max(D, dim=1), "row_sum": evtc.sum(evtc.exp(D - shift), dim=1)}


@evtc.epilogue
def fp8_out(acc, scale_a: float, scale_b: float, scale_d: float, bias: evtc.RowVector[f32]):
    """fp8 forward: D = e4m3(scale_d * relu(scale_a * scale_b * acc + bias[n])) and the amax of
    the value before scaling (for the next step's scale_d)."""
    y = evtc.relu(scale_a * scale_b * acc + bias)
    return {"D": (scale_d * y).to(evtc.e4m3), "amax": evtc.amax(y)}


@evtc.epilogue
def many_aux(acc, X: evtc.Matrix, Y: evtc.Matrix, Z: evtc.Matrix, bias: evtc.RowVector[f32]):
    """Three aux loads and two aux stores: P = acc * X + bias[n] and Q = sigmoid(Y) * P are
    saved; D = relu(Q + Z)."""
    P = acc * X + bias
    Q = evtc.sigmoid(Y) * P
    return {"D": evtc.relu(Q + Z), "P": P, "Q": Q}


REFERENCE = {
    "linear_combination": linear_combination,
    "bias_relu": bias_relu,
    "gelu_aux": gelu_aux,
    "dgelu_bgrad": dgelu_bgrad,
    "residual_scale": residual_scale,
    "row_stats": row_stats,
    "fp8_out": fp8_out,
    "many_aux": many_aux,
}
