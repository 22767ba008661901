"""The operand copies the evtc backend puts into a training step (issue 38): for each zoo block at
its model's real widths, the contiguous copies of transposed operands that the rewrite inserts
before evtc's fused GEMMs (evtc's GEMMs read A and B K-major: :func:`evtc.torch.regions._a_operand`,
``_b_operand``), counted and sized, forward and backward. CPU only: the backend runs on fake
data with ``inductor=False`` and the fused op's CPU kernel returns zeros.

    python benchmarks/train_copies.py [--blocks gpt2,llama] [--tokens 4096] [--json FILE]
"""

from __future__ import annotations

import argparse
import json

import common  # noqa: F401  (sets sys.path)


def copies(name: str, tokens: int) -> dict:
    from bench_train import cpu_step, zero_kernel

    from evtc.torch import regions

    seen = []
    orig_a, orig_b = regions._a_operand, regions._b_operand

    def record(kind, orig):
        def wrapped(add, x):
            out = orig(add, x)
            if out is not x and str(getattr(out, "target", "")) == "aten.clone.default":
                v = regions._val(x)
                seen.append((kind, tuple(v.shape), v.numel() * v.element_size()))
            return out
        return wrapped

    regions._a_operand, regions._b_operand = record("A", orig_a), record("B", orig_b)
    try:
        be = cpu_step(name, tokens, zero_kernel)
    finally:
        regions._a_operand, regions._b_operand = orig_a, orig_b
    return {"block": name, "tokens": tokens, "fused": be.fused, "copies": len(seen),
            "copied_MB": sum(b for _, _, b in seen) / 1e6, "each": [(k, s, b / 1e6) for k, s, b in seen]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="gpt2,llama")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = [copies(n, args.tokens) for n in args.blocks.split(",")]
    for r in rows:
        print(f"{r['block']:8} {r['tokens']} tokens: {r['fused']} fused GEMMs, {r['copies']} operand copies, "
              f"{r['copied_MB']:.1f} MB copied per step")
        for k, shape, mb in r["each"]:
            print(f"    {k} {list(shape)} {mb:.1f} MB")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)


if __name__ == "__main__":
    main()
