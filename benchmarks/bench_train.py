"""Issue 38's training benchmark: one training step (forward and backward) of the zoo's MLP blocks
(tests/torch_zoo.py) at their models' real widths under eager PyTorch, torch.compile (default) and
``torch.compile(backend="evtc")`` (NOTE [Fusion in training]), in one run, bf16.

    python benchmarks/bench_train.py --json $OUT/train.json [--blocks gpt2,llama,bert] [--tokens 4096]
    python benchmarks/bench_train.py --prebuild      # here, without a GPU: build the kernels the
                                                    # evtc backend will choose on an H200

Per block: the gradients of every parameter and of the input against eager's (max relative
error), the evtc backend's fused-match count (forward and backward graphs), the step's time back
to back (:func:`evtc.testing.bench.time_interleaved`, modes in alternation) and the ratio to
torch.compile default. ``--prebuild`` runs the backend on the CPU at the same shapes (the fused
op's CPU kernel is skipped: only the graphs are made), asks each Gemm for the member an H200
chooses and builds those kernels in parallel, so a GPU run finds them in the cache.
"""

from __future__ import annotations

import argparse
import math
import sys

import common  # noqa: F401  (sets sys.path)


def _step(fn, block, args, loss_w):
    def run():
        for p in block.parameters():
            p.grad = None
        x = args[0].detach().requires_grad_(True)
        y = fn(x, *args[1:])
        (y.float() * loss_w).sum().backward()
        return x.grad
    return run


def zero_kernel(g, on_call=None) -> None:
    """Register a CPU kernel for Gemm ``g``'s op that returns zero outputs of the right shapes
    (their values don't matter: only the graphs and the shapes are wanted), calling
    ``on_call(A, B)`` first."""
    import torch

    op = g.torch_op()
    names = op.tensor_names + op.scalar_names

    def cpu(A, B, *rest):
        if on_call is not None:
            on_call(A, B)
        outs = op._fake_outputs(A, B, dict(zip(names, rest)))
        return tuple(o.zero_() for o in outs) if isinstance(outs, tuple) else outs.zero_()

    torch.library.register_kernel(op.qualname, "cpu", cpu)


def cpu_step(name: str, tokens: int, on_gemm, gemm_options=None):
    """One training step (forward and backward) of zoo block ``name`` at its model's real widths
    under the evtc backend on the CPU, fake data, Inductor off; ``on_gemm`` registers each
    Gemm's CPU kernel, ``gemm_options`` are the backend's (``{"atomic_sums": True}``). Returns
    the backend (``.fused``: the GEMMs it fused)."""
    import torch

    sys.path.insert(0, str(common.ROOT / "tests"))
    import torch_zoo as Z

    from evtc.torch.backend import make_backend

    d, ffn = Z.REAL[name]
    block, args = Z.make(name, d, ffn, tokens)
    torch._dynamo.reset()
    be = make_backend(allow_cpu=True, on_gemm=on_gemm, inductor=False, gemm_options=gemm_options)
    x = args[0].detach().requires_grad_(True)
    torch.compile(block, backend=be)(x, *args[1:]).float().sum().backward()
    return be


def prebuild(names, tokens, atomic_sums=False):
    from evtc.compiler import build_many

    problems = []

    def on_gemm(g):
        def record(A, B):
            problems.append((g, A.shape[-2], B.shape[-2], A.shape[-1], A.shape[0] if A.dim() == 3 else 1))

        zero_kernel(g, record)

    for name in names:
        for options in [None] + ([{"atomic_sums": True}] if atomic_sums else []):
            be = cpu_step(name, tokens, on_gemm, options)
            print(f"{name}{' (atomic sums)' if options else ''}: {be.fused} fused GEMMs")
    jobs = {}
    for g, M, N, K, L in problems:
        k = g.kernel(g.choose(M, N, K, L, device="NVIDIA H200"))
        jobs.setdefault(k.source, k.job())
    print(f"building {len(jobs)} kernels for {len(problems)} problems", flush=True)
    res = build_many(list(jobs.values()))
    print(f"built {sum(not isinstance(r, Exception) for r in res)}/{len(res)}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--blocks", default="gpt2,llama,bert")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--prebuild", action="store_true")
    ap.add_argument("--atomic-sums", action="store_true",
                    help="also time the evtc backend with options atomic_sums=True (bias gradients through float "
                         "atomics: NOTE [Atomic row and column sums])")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    sys.path.insert(0, str(common.ROOT / "tests"))
    import torch_zoo as Z

    names = args.blocks.split(",")
    if args.prebuild:
        prebuild(names, args.tokens, args.atomic_sums)
        return
    from evtc.testing.bench import time_interleaved
    from evtc.torch.backend import make_backend

    rows = []
    for name in names:
        d, ffn = Z.REAL[name]
        block, inputs = Z.make(name, d, ffn, args.tokens, device="cuda")
        block.train()
        loss_w = torch.randn(inputs[0].shape, device="cuda") / math.sqrt(inputs[0].numel())
        torch._dynamo.reset()
        be = make_backend()
        fns = {"eager": block, "default": torch.compile(block), "evtc": torch.compile(block, backend=be)}
        if args.atomic_sums:
            fns["evtc_atomic"] = torch.compile(block, backend=make_backend(gemm_options={"atomic_sums": True}))
        grads = {}
        for mode, fn in fns.items():
            xg = _step(fn, block, inputs, loss_w)()
            grads[mode] = {"x": xg.clone(), **{n: p.grad.clone() for n, p in block.named_parameters()}}
        err = {}
        for mode in [m for m in fns if m != "eager"]:
            worst = 0.0
            for n, g in grads[mode].items():
                ref = grads["eager"][n].float()
                worst = max(worst, ((g.float() - ref).abs().max() / ref.abs().max().clamp_min(1e-30)).item())
            err[mode] = worst
        t = time_interleaved({m: _step(f, block, inputs, loss_w) for m, f in fns.items()}, args.iters)
        row = {"block": name, "tokens": args.tokens, "d": d, "ffn": ffn, "fused": be.fused, "ms": t,
               "max_rel_grad_err": err, "evtc_over_default": t["evtc"] / t["default"]}
        if "evtc_atomic" in t:
            row["evtc_atomic_over_default"] = t["evtc_atomic"] / t["default"]
        rows.append(row)
        print(f"{name:8s} {args.tokens}  fused {be.fused}  step ms: eager {t['eager']:.3f} default {t['default']:.3f} "
              f"evtc {t['evtc']:.3f}  evtc/compile {row['evtc_over_default']:.3f}  grad err evtc {err['evtc']:.2e} "
              f"(compile {err['default']:.2e})" + (f"  atomic sums: evtc/compile {row['evtc_atomic_over_default']:.3f}"
                                                   if "evtc_atomic" in t else ""), flush=True)
        common.write_json(args.json, {"device": common.device_name(), "rows": rows})


if __name__ == "__main__":
    main()
