"""Compilation targets.

Input: an arch name. Output: a :class:`Target` with the numbers the planner needs.
"""

from __future__ import annotations

import dataclasses

from evtc.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class Target:
    """A GPU architecture as the planner sees it.

    Attributes:
        arch: ``"sm90"`` or ``"sm80"``.
        smem_capacity: shared memory one thread block may use, in bytes. sm90: 232448
            (``cutlass::gemm::collective::detail::sm90_smem_capacity_bytes``, 227 KB); sm80:
            166912 (163 KB, the A100 per-block opt-in limit, CUDA C Programming Guide, compute
            capability 8.0).
        gencode: nvcc ``-gencode`` flags. sm90 needs the ``sm_90a`` target for WGMMA and
            ``setmaxnreg``; sm80 embeds PTX too so that the driver can JIT it for newer GPUs.
        mem_bandwidth: device memory bandwidth in bytes/s used by the cost model (H100 SXM:
            about 3.0e12 measured with a device-to-device copy here).
        mma_flops: dense bf16 tensor-core rate in FLOP/s used by the cost model (H100 SXM:
            about 8.0e14 measured with cuBLAS at 8192^3 here).
        sm_count: multiprocessors.
    """

    arch: str
    smem_capacity: int
    gencode: tuple[str, ...]
    mem_bandwidth: float
    mma_flops: float
    sm_count: int


SM90 = Target("sm90", 232448, ("-gencode=arch=compute_90a,code=sm_90a",), 3.0e12, 8.0e14, 132)
SM80 = Target("sm80", 166912, ("-gencode=arch=compute_80,code=[sm_80,compute_80]",), 1.9e12, 3.1e14, 108)

TARGETS = {"sm90": SM90, "sm80": SM80}


def get_target(arch: str) -> Target:
    """The Target for ``arch``.

    Raises:
        ConfigError: unknown arch.
    """
    try:
        return TARGETS[arch]
    except KeyError:
        raise ConfigError(f"unknown arch '{arch}'", hint="use 'sm90' (Hopper) or 'sm80' (Ampere)") from None
