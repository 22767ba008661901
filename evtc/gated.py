"""The one-GEMM gated form's operands: gate and up weights with their rows interleaved.

``evtc.glu`` pairs column 2j (the gate) with column 2j + 1 (its up) of the accumulator inside
the epilogue tile (NOTE [The gated epilogue], include/evtc/sm90_glu_store.hpp), so the GEMM's B
is ``[W_gate; W_up]`` with the rows of the two interleaved: row 2j of B is row j of W_gate, row
2j + 1 row j of W_up. Interleaving by single rows keeps every pair inside one thread's registers
whatever the tile (the WGMMA accumulator layout gives each thread columns 2c and 2c + 1, PTX
ISA "Register fragment wgmma .m64nNk16"), so one weight layout serves every kernel of the family.
A bias over the GEMM's N columns is interleaved the same way.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from evtc.errors import ArgumentError

__all__ = ["interleave_gate_up"]


def interleave_gate_up(gate: Any, up: Any, dim: int | None = None) -> Any:
    """``[gate; up]`` interleaved along ``dim``: B (or the bias) for ``evtc.glu``, whose row
    2j is gate's row j and row 2j + 1 up's row j.

    Args:
        gate: a torch tensor or numpy array: a weight (I, K) as ``nn.Linear`` stores it
            (out_features x in_features), (E, I, K) per expert, or a bias (I,), (E, I).
        up: the same kind, shape and dtype as ``gate``.
        dim: the axis of the I gate/up rows; default -2 for two or more dimensions (weights),
            -1 for one (a bias). Per-expert biases (E, I) need ``dim=-1``.

    Returns:
        A new contiguous tensor (array) with that axis 2I long, in the inputs' dtype and device:
        a copy to make once (at load or compile time), not per call.

    Raises:
        ArgumentError: shapes, kinds (torch tensors or numpy arrays) or dtypes differ, torch
            tensors on two devices or not dense (sparse layouts), or ``dim`` is no integer axis
            in range.
    """
    shape_g, shape_u = tuple(getattr(gate, "shape", ())), tuple(getattr(up, "shape", ()))
    # (a kind, not an exact type: an nn.Parameter pairs with a plain tensor)
    is_torch = [type(t).__module__.startswith("torch") for t in (gate, up)]
    if not shape_g or shape_g != shape_u or is_torch[0] != is_torch[1] or (
            not is_torch[0] and type(gate) is not type(up)):
        raise ArgumentError(f"interleave_gate_up of {type(gate).__name__} {shape_g} and {type(up).__name__} "
                            f"{shape_u}: two tensors (or arrays) of one shape, W_gate and W_up as nn.Linear stores them")
    if getattr(gate, "dtype", None) != getattr(up, "dtype", None):
        raise ArgumentError(f"interleave_gate_up: W_gate is {gate.dtype}, W_up {up.dtype}: one dtype",
                            hint="convert one of them first")
    if is_torch[0]:
        if gate.device != up.device:
            raise ArgumentError(f"interleave_gate_up: W_gate is on {gate.device}, W_up on {up.device}: one device",
                                hint="move one of them first")
        if str(gate.layout) != "torch.strided" or str(up.layout) != "torch.strided":
            raise ArgumentError(f"interleave_gate_up of {gate.layout} and {up.layout} tensors: dense (strided) ones",
                                hint="call .to_dense() first")
    nd = len(shape_g)
    if dim is None:
        dim = -2 if nd >= 2 else -1
    if isinstance(dim, (bool, np.bool_)) or not isinstance(dim, (int, np.integer)) or not -nd <= dim < nd:
        raise ArgumentError(f"interleave_gate_up dim={dim!r} for {nd}-D inputs", hint="-2 for weights, -1 for biases")
    dim = int(dim)
    axis = dim % nd
    new = list(shape_g)
    new[axis] *= 2
    if type(gate).__module__.startswith("torch"):
        import sys

        torch = sys.modules["torch"]
        return torch.stack((gate, up), dim=axis + 1).reshape(tuple(new)).contiguous()
    return np.ascontiguousarray(np.stack((np.asarray(gate), np.asarray(up)), axis=axis + 1).reshape(tuple(new)))
