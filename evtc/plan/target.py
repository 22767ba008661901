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
        copy_bandwidth: a strided device-to-device copy's rate in bytes/s, read and write counted
            apart (the padded staging route's cost model; H100 SXM: 2.5e12 measured with
            ``torch.Tensor.copy_`` between padded and packed rows, docs/performance.md).
        device: the GPU these numbers are of (``nvidia-smi``'s name), or the arch's reference
            part.
    """

    arch: str
    smem_capacity: int
    gencode: tuple[str, ...]
    mem_bandwidth: float
    mma_flops: float
    sm_count: int
    copy_bandwidth: float = 2.5e12
    device: str = ""


SM90 = Target("sm90", 232448, ("-gencode=arch=compute_90a,code=sm_90a",), 3.0e12, 8.0e14, 132, 2.5e12,
              "NVIDIA H100 80GB HBM3")
SM80 = Target("sm80", 166912, ("-gencode=arch=compute_80,code=[sm_80,compute_80]",), 1.9e12, 3.1e14, 108, 1.6e12,
              "NVIDIA A100-SXM4-80GB")

TARGETS = {"sm90": SM90, "sm80": SM80}

#: the hardware facts of the parts evtc knows, by a substring of the device's name: (SM count,
#: HBM bytes/s, dense bf16 FLOP/s, strided-copy bytes/s). H100 SXM: the numbers above
#: (measured here); H200: the H100's 132 SMs and tensor cores with HBM3e at 4.8 TB/s (NVIDIA's
#: H200 datasheet: 4.8 TB/s, 989 TFLOP/s dense bf16 peak, the H100 SXM's 3.35 and 989); H100 PCIe:
#: 114 SMs, 2.0 TB/s; A100: 108 SMs, 2.0 TB/s (80 GB SXM), 312 TFLOP/s peak.
DEVICES: dict[str, tuple[int, float, float, float]] = {
    "H200": (132, 4.3e12, 8.0e14, 3.6e12),
    "H100 PCIe": (114, 1.8e12, 6.0e14, 1.5e12),
    "H100": (132, 3.0e12, 8.0e14, 2.5e12),
    "A100": (108, 1.9e12, 3.1e14, 1.6e12),
}


def get_target(arch: str, device: str | None = None) -> Target:
    """The Target for ``arch``, with the hardware facts of ``device`` (a GPU's name, e.g.
    ``NVIDIA H200``) where :data:`DEVICES` knows it, else the arch's reference part's.

    Raises:
        ConfigError: unknown arch.
    """
    base = TARGETS.get(arch) if isinstance(arch, str) else None  # (a list is no key: no TypeError)
    if base is None:
        raise ConfigError(f"unknown arch {arch!r:.60}", hint="use 'sm90' (Hopper) or 'sm80' (Ampere)")
    if device:
        for key, (sms, bw, flops, copy) in DEVICES.items():  # most specific first ("H100 PCIe" before "H100")
            if key in device:
                return dataclasses.replace(base, sm_count=sms, mem_bandwidth=bw, mma_flops=flops,
                                           copy_bandwidth=copy, device=device)
    return base
