"""The snapshot set of emitted sources: every reference epilogue on each kernel configuration of
the sm90 family (pinned, so the set is the same whatever the family holds), the unaligned and
cluster-less variants, sm80, the three convolution kinds on both archs, plugin fragments and
twenty fuzz epilogues. tests/null/test_source_snapshots.py pins the SHA-256 of each source in
tests/golden/source_snapshots.txt: a change to the floors above the emitter (issue 35's
refactors) must leave every byte as it was.

    python tests/snapshots.py > tests/golden/source_snapshots.txt   # (or pytest --accept-golden)
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT / "examples"), str(ROOT / "tests")]

import evtc  # noqa: E402
from evtc import bf16, e4m3, f16  # noqa: E402
from evtc.plan.config import GemmConfig  # noqa: E402

K = 64
CONFIGS = {
    "large": GemmConfig(tile=(128, 256, K), cluster=(2, 1, 1), schedule="cooperative"),
    "pingpong": GemmConfig(tile=(128, 192, K), cluster=(2, 1, 1), schedule="pingpong"),
    "streamk": GemmConfig(tile=(128, 128, K), cluster=(1, 1, 1), scheduler="streamk"),
    "kheavy": GemmConfig(tile=(128, 64, K), cluster=(1, 1, 1), scheduler="streamk"),
    "small": GemmConfig(tile=(64, 128, K), cluster=(1, 1, 1), schedule="pingpong"),
    "pp128": GemmConfig(tile=(128, 128, K), cluster=(1, 1, 1), schedule="pingpong"),
    "pp64x256": GemmConfig(tile=(64, 256, K), cluster=(1, 1, 1), schedule="pingpong"),
    "pp128x176": GemmConfig(tile=(128, 176, K), cluster=(1, 1, 1), schedule="pingpong"),
    "swap": GemmConfig(tile=(64, 32, K), cluster=(1, 1, 1), schedule="pingpong", swap_ab=True),
    "swap16": GemmConfig(tile=(64, 16, K), cluster=(1, 1, 1), schedule="pingpong", swap_ab=True),
    "swap16_c4": GemmConfig(tile=(64, 16, K), cluster=(4, 1, 1), schedule="pingpong", swap_ab=True),
    "swapk": GemmConfig(tile=(128, 32, K), cluster=(1, 1, 1), schedule="cooperative", scheduler="streamk",
                        swap_ab=True),
    "large_c1": GemmConfig(tile=(128, 256, K), cluster=(1, 1, 1), schedule="cooperative"),
    "unaligned": GemmConfig(tile=(128, 256, K), cluster=(2, 1, 1), schedule="cooperative", unaligned=True),
    "unaligned_pingpong": GemmConfig(tile=(128, 192, K), cluster=(2, 1, 1), schedule="pingpong", unaligned=True),
    "packed": GemmConfig(tile=(128, 192, K), cluster=(2, 1, 1), schedule="pingpong", packed_stores=True),
}


def _ok(make):
    try:
        return make()
    except evtc.EvtcError as e:  # a configuration an epilogue can't take: its refusal is pinned too
        return f"refused: {type(e).__name__}: {str(e).splitlines()[0]}"


def sources() -> dict[str, str]:
    """name -> emitted source (or the refusal) of every member of the set."""
    import epilogues as E
    import strategies as S

    out: dict[str, str] = {}
    for name, ep in E.REFERENCE.items():
        a = e4m3 if name == "fp8_out" else bf16
        for cname, cfg in CONFIGS.items():
            out[f"gemm/{name}/sm90/{cname}"] = _ok(lambda: evtc.Gemm(ep, a=a, b=a, config=cfg).source)
        if a is bf16:
            out[f"gemm/{name}/sm80"] = _ok(lambda: evtc.Gemm(ep, a=a, b=a, arch="sm80").source)
            for kind in ("fprop", "dgrad", "wgrad"):
                for arch in ("sm90", "sm80"):
                    out[f"conv/{name}/{kind}/{arch}"] = _ok(
                        lambda: evtc.Conv(ep, kind=kind, a=a, arch=arch, config={} if arch == "sm80" else None).source)
            out[f"fragment/{name}"] = _ok(lambda: _fragment(ep))
        out[f"gemm/{name}/sm90/cutlass-plan"] = _ok(lambda: evtc.Gemm(ep, a=a, b=a, plan="cutlass").source)
    for seed, ep in S.fuzz_epilogues("sm90")[:20]:
        out[f"fuzz/{seed}/sm90"] = _ok(lambda: evtc.Gemm(ep, a=f16, b=f16, config=CONFIGS["large"]).source)
    for seed, ep in S.fuzz_epilogues("sm80")[:5]:
        out[f"fuzz/{seed}/sm80"] = _ok(lambda: evtc.Gemm(ep, a=f16, b=f16, arch="sm80").source)
    return out


def _fragment(ep) -> str:
    from evtc.plugin import lower

    f = lower(ep, arch="sm90", tile=(128, 128, 64), a=bf16)
    return f.header() + "\n;\n" + f.epilogue_arguments


def digest_lines() -> str:
    lines = [f"{name} {hashlib.sha256(src.encode()).hexdigest()[:24]}" for name, src in sorted(sources().items())]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.stdout.write(digest_lines())
