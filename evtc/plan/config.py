"""GEMM configurations: tile shape, cluster, kernel schedule, stages, tile scheduler.

Input: what the user asks for (or nothing). Output: a validated :class:`GemmConfig`.

The legality rules are the ones the CUTLASS collective builders and WGMMA impose (PTX ISA,
"Asynchronous Warpgroup Level Matrix Multiply-Accumulate": ``wgmma.mma_async`` has M = 64 per
warpgroup and N a multiple of 8 up to 256; ``sm90_gmma_builder.inl``):

* sm90 cooperative: tile M a multiple of 128 (two consumer warpgroups split M), ping-pong:
  tile M a multiple of 64; tile N a multiple of 16 (the epilogue's ``STSM`` copy atoms need
  N % 16, ``sm90_builder.inl``) and at most 256; tile K times the element size a multiple of
  32 bytes (the narrowest GMMA shared-memory swizzle row, ``ss_smem_selector``); cluster sizes 1, 2 or 4 per mode with at most
  4 CTAs (portable cluster size is 8, TMA multicast pays off up to 2-4).
* sm80: threadblock M and N multiples of 32 and of the warp tile, warp tile M/N multiples of
  16, K a multiple of 32 bytes, 2 to 8 stages (``default_gemm_universal_with_visitor.h``).
"""

from __future__ import annotations

import dataclasses
import json

from evtc.dtypes import DType
from evtc.errors import ConfigError

SCHEDULES_SM90 = ("cooperative", "pingpong")
SCHEDULERS = ("persistent", "streamk")


@dataclasses.dataclass(frozen=True)
class GemmConfig:
    """A GEMM configuration.

    Attributes:
        tile: CTA tile (M, N, K) in elements.
        cluster: thread block cluster shape (M, N, 1); sm90 only.
        schedule: sm90 kernel schedule, ``"cooperative"`` or ``"pingpong"``.
        stages: mainloop pipeline stages, or None for as many as fit beside the epilogue's
            shared memory (CUTLASS ``StageCountAutoCarveout``).
        epilogue_tile: (M, N) of the epilogue subtile, or None to let the planner choose.
        scheduler: ``"persistent"`` (data-parallel persistent tiles) or ``"streamk"``.
        warp_tile: sm80 warp tile (M, N, K).
        swizzle: sm80 threadblock swizzle (log2 of the tile group width).
        fast_accum: fp8 only: accumulate without periodic promotion (faster, less accurate).
    """

    tile: tuple[int, int, int] = (128, 256, 64)
    cluster: tuple[int, int, int] = (2, 1, 1)
    schedule: str = "cooperative"
    stages: int | None = None
    epilogue_tile: tuple[int, int] | None = None
    scheduler: str = "persistent"
    warp_tile: tuple[int, int, int] | None = None
    swizzle: int = 3
    fast_accum: bool = False

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, data: dict | str) -> "GemmConfig":
        if isinstance(data, str):
            data = json.loads(data)
        kw = {}
        for f in dataclasses.fields(cls):
            if f.name in data:
                v = data[f.name]
                kw[f.name] = tuple(v) if isinstance(v, list) else v
        return cls(**kw)

    def replace(self, **changes) -> "GemmConfig":
        return dataclasses.replace(self, **changes)

    @property
    def name(self) -> str:
        """A short stable name, e.g. ``128x256x64_2x1_coop``."""
        t = "x".join(map(str, self.tile))
        c = "x".join(map(str, self.cluster[:2]))
        s = {"cooperative": "coop", "pingpong": "pp"}.get(self.schedule, self.schedule)
        extra = ""
        if self.stages:
            extra += f"_s{self.stages}"
        if self.epilogue_tile:
            extra += f"_e{self.epilogue_tile[0]}x{self.epilogue_tile[1]}"
        if self.scheduler != "persistent":
            extra += f"_{self.scheduler}"
        return f"{t}_{c}_{s}{extra}"


def default_config(arch: str, a: DType, b: DType) -> GemmConfig:
    """The default configuration for ``arch`` and the operand types.

    sm90: cooperative 128x256 with a 2x1 cluster; K = 128 bytes of the operand type (64 for
    16-bit, 128 for fp8). This is the configuration measured closest to cuBLAS on the H100 for
    bias+relu epilogues (see docs/performance.md). sm80: 128x128x32 (16-bit) with 64x64 warps and
    4 stages, the CUTLASS profiler's common choice for 16-bit GEMMs on A100.
    """
    if arch == "sm90":
        k = 128 // a.bytes if a.bytes else 64
        return GemmConfig(tile=(128, 256, k), cluster=(2, 1, 1), schedule="cooperative")
    if arch == "sm80":
        return GemmConfig(tile=(128, 128, 32), cluster=(1, 1, 1), schedule="multistage", stages=4,
                          warp_tile=(64, 64, 32))
    raise ConfigError(f"unknown arch '{arch}'", hint="use 'sm90' (Hopper) or 'sm80' (Ampere)")


def validate(config: GemmConfig, arch: str, a: DType, b: DType) -> GemmConfig:
    """Check ``config`` against the rules in the module docstring.

    Returns:
        ``config`` itself when it is legal.

    Raises:
        ConfigError: the first broken rule, naming the field and the rule's source.
    """
    tm, tn, tk = config.tile
    if config.scheduler not in SCHEDULERS:
        raise ConfigError(f"scheduler '{config.scheduler}' is not one of {SCHEDULERS}")
    if arch == "sm90":
        if config.schedule not in SCHEDULES_SM90:
            raise ConfigError(f"sm90 schedule '{config.schedule}' is not one of {SCHEDULES_SM90}")
        m_unit = 128 if config.schedule == "cooperative" else 64
        if tm % m_unit or tm > 256:
            raise ConfigError(
                f"tile M = {tm}: the {config.schedule} schedule needs a multiple of {m_unit} up to 256",
                hint="WGMMA has M = 64 per warpgroup; the cooperative schedule splits M over two warpgroups",
            )
        if tn % 16 or not 16 <= tn <= 256:
            raise ConfigError(f"tile N = {tn}: needs a multiple of 16 in [16, 256] (WGMMA N <= 256, STSM atoms need N % 16)")
        if (tk * a.bits // 8) % 32 or (tk * b.bits // 8) % 32:
            raise ConfigError(f"tile K = {tk}: K x element size must be a multiple of 32 bytes (a 32-byte swizzle row)")
        cm, cn, ck = config.cluster
        if ck != 1 or cm not in (1, 2, 4) or cn not in (1, 2, 4) or cm * cn > 4:
            raise ConfigError(f"cluster {config.cluster}: each of M, N in (1, 2, 4), K = 1, at most 4 CTAs")
        if config.epilogue_tile is not None:
            em, en = config.epilogue_tile
            if tm % em or tn % en or en % 16 or (config.schedule == "cooperative" and em != min(128, tm)) \
                    or (config.schedule == "pingpong" and em != min(64, tm)):
                raise ConfigError(
                    f"epilogue tile {config.epilogue_tile} doesn't fit tile {config.tile} with the {config.schedule} schedule",
                    hint="its M must be 128 (cooperative) or 64 (ping-pong), its N a multiple of 16 dividing tile N",
                )
        if config.stages is not None and config.stages < 2:
            raise ConfigError(f"stages = {config.stages}: the TMA mainloop needs at least 2")
    elif arch == "sm80":
        wm, wn, wk = config.warp_tile or (64, 64, tk)
        if tm % wm or tn % wn or wm % 16 or wn % 16 or tm % 32 or tn % 32:
            raise ConfigError(f"sm80 tile {config.tile} / warp tile {config.warp_tile} don't divide")
        if tk % wk or wk % 16:
            raise ConfigError(f"sm80 tile K = {tk} / warp tile K = {wk}: the warp K must divide the tile K and be a "
                              "multiple of 16 (the K of mma.sync m16n8k16 for 16-bit operands)")
        if (tk * a.bits // 8) % 32:
            raise ConfigError(f"tile K = {tk}: K x element size must be a multiple of 32 bytes")
        if (tm // wm) * (tn // wn) > 8:
            raise ConfigError("more than 8 warps per threadblock")
        if not 2 <= (config.stages or 3) <= 8:
            raise ConfigError(f"sm80 stages = {config.stages}: between 2 and 8")
    else:
        raise ConfigError(f"unknown arch '{arch}'", hint="use 'sm90' (Hopper) or 'sm80' (Ampere)")
    return config
