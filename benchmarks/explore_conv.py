"""Every candidate kernel of the sm90 conv family (evtc/family/conv.py CANDIDATES: tiles, clusters,
the epilogue tile) and, on 1x1 layers, the GEMM route, on each fprop layer of
bench_conv.py's UNet and ResNet-50 sets, beside cuDNN's conv followed by the eager epilogue, in
one run: the evidence for the family's heuristic (NOTE [The sm90 conv family]).

On the GPU machine (the kernels first, in parallel on its cores; then the run, about a minute of
GPU time for both sets):

    python benchmarks/prebuild.py conv:explore
    python benchmarks/explore_conv.py --json $OUT/explore_conv.json

Per layer (bf16, channels-last, ``act(conv(x, w) + bias[k])``: SiLU on the UNet, ReLU on
ResNet-50, as bench_conv.py): each candidate runs as a Conv pinned to its configuration
(``Conv(config=...)``), ``route`` as a family Conv on a 1x1 layer (its Gemm's heuristic pick),
``gemm:MEMBER`` (1x1 layers) each member of that Gemm's family pinned, on torch views of the same
NHWC memory (stream-K members data-parallel; swap-AB only where M <= 256),
``family`` as a user's Conv (the heuristic's pick, or the route), ``cudnn_eager`` as torch's
``act(F.conv2d(x, w) + bias)``. Each output is first checked against cuDNN's (relative error
below 2 %: a wrong kernel is recorded, not timed). Times are device times: each candidate
captured in a CUDA graph (``--calls`` calls) and replayed ``--iters`` times, CUDA events around
each replay, the candidates of a layer in alternation, median (evtc.testing.bench.time_graphs);
``--interleaved`` times back-to-back calls instead (host launch path included, as bench_conv.py).

Robust: a candidate that fails to build, to run or to match is recorded with its error and the
run goes on; the JSON is rewritten after every layer (a CUDA error that kills the context leaves
the layers before it).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import traceback

import common

import evtc
from evtc import bf16
from evtc.family import conv as CF

import bench_conv as BC

#: the candidates every layer runs (besides route, family and cudnn_eager)
CANDIDATES = tuple(CF.CANDIDATES)
#: relative error (max |evtc - cuDNN| / max |cuDNN|) above which a candidate is recorded as wrong
TOLERANCE = 2e-2


def epilogue(net: str):
    return BC.bias_relu if BC.ACTIVATION[net] == "relu" else BC.bias_silu


def layers(nets=("unet", "resnet50"), only: str | None = None) -> list[tuple[str, BC.Layer]]:
    names = set(only.split(",")) if only else None
    return [(net, layer) for net in nets for layer in BC.LAYERS[net] if names is None or layer.name in names]


def is_1x1(layer: BC.Layer) -> bool:
    return layer.r == layer.s == 1 and layer.stride == 1 and layer.pad == 0


def convs(nets=("unet", "resnet50"), candidates=CANDIDATES) -> dict:
    """The Convs of the exploration: ``(net, candidate)`` -> a Conv pinned to the candidate's
    configuration, ``(net, "family")`` -> the family Conv (the heuristic, the 1x1 route). A
    candidate whose Conv can't be made (a ConfigError, a PlanError) maps to the exception."""
    out: dict = {}
    for net in nets:
        ep = epilogue(net)
        out[(net, "family")] = evtc.Conv(ep, kind="fprop", a=bf16, d=bf16, arch="sm90", layout="nchw")
        members = CF.member_configs(bf16, candidates)
        for name in candidates:
            try:
                out[(net, name)] = evtc.Conv(ep, kind="fprop", a=bf16, d=bf16, arch="sm90", layout="nchw",
                                             config=dict(members[name].fields))
            except evtc.EvtcError as e:
                out[(net, name)] = e
    return out


_GEMMS: dict = {}


def gemm_members(conv: evtc.Conv, M: int) -> dict:
    """``gemm:MEMBER`` -> a Gemm pinned to each member of ``conv``'s route Gemm family that a 1x1
    layer of M rows can use (stream-K members run data-parallel; swap-AB only for M <= 256)."""
    key = (id(conv), M <= 256)
    if key in _GEMMS:
        return _GEMMS[key]
    out = _GEMMS[key] = {}
    for name, spec in conv.gemm_route.gemm.family.items():
        if spec.config.swap_ab and M > 256:
            continue
        cfg = spec.config
        if cfg.scheduler == "streamk":
            cfg = cfg.replace(decomposition="data_parallel")
        out[f"gemm:{name}"] = evtc.Gemm(conv.traced, a=bf16, b=bf16, d=bf16, arch="sm90", config=cfg)
    return out


def kernels(nets=("unet", "resnet50"), only: str | None = None, candidates=CANDIDATES) -> list:
    """Build jobs of every kernel the exploration runs (benchmarks/prebuild.py ``conv:explore``):
    each candidate per network's epilogue, the Gemm member each 1x1 layer's route runs on, and
    the pinned Gemm members of the 1x1 layers."""
    table = convs(nets, candidates)
    jobs = [c._kernels[("sm90", False)].job() for c in table.values() if isinstance(c, evtc.Conv)
            and c.pinned]
    for net, layer in layers(nets, only):
        jobs.append(BC.fprop_kernel(table[(net, "family")], layer)[1].job())
        if is_1x1(layer):
            for g in gemm_members(table[(net, "family")], layer.n * layer.h * layer.w).values():
                jobs += g.jobs()
    return list({j.source: j for j in jobs}.values())


def explore_layer(net: str, layer: BC.Layer, table: dict, candidates, args, broken: set, built: set) -> dict:
    """One layer's row: every candidate checked against cuDNN and timed (``broken``: (net,
    candidate) whose build failed; ``built``: the sources that built)."""
    import torch
    import torch.nn.functional as F

    from evtc.testing.bench import time_graphs, time_interleaved

    cl = torch.channels_last
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)

    def rand(*shape):
        return torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16).contiguous(memory_format=cl)

    p, q = layer.out
    x = rand(layer.n, layer.c, layer.h, layer.w)
    w = rand(layer.k, layer.c, layer.r, layer.s) * (layer.c * layer.r * layer.s) ** -0.5
    bias = torch.randn(layer.k, generator=gen, device="cuda").to(torch.bfloat16)
    stride, pad = (layer.stride,) * 2, (layer.pad,) * 2
    problem = evtc.ConvProblem(stride=layer.stride, padding=layer.pad)
    act = F.relu if BC.ACTIVATION[net] == "relu" else F.silu

    def eager():
        return act(F.conv2d(x, w, None, stride, pad) + bias.view(1, -1, 1, 1))

    ref = eager().float()
    scale = ref.abs().max().item() or 1.0
    family = table[(net, "family")]
    label = BC.fprop_kernel(family, layer)[0]
    M, N, K = layer.n * p * q, layer.k, layer.c * layer.r * layer.s
    row = {"net": net, "layer": layer.name, "shape": f"{layer.n}x{layer.h}x{layer.w}x{layer.c}->{layer.k} "
           f"{layer.r}x{layer.s}/{layer.stride}", "gemm": [M, N, K], "heuristic": label, "ms": {}, "errors": {},
           "rel_err": {}}
    runs = {"cudnn_eager": eager}
    names = list(candidates) + (["route"] if is_1x1(layer) else []) + ["family"]
    gemms = gemm_members(family, M) if is_1x1(layer) else {}
    for name in names + list(gemms):
        conv = gemms[name] if name in gemms else family if name in ("route", "family") else table[(net, name)]
        if isinstance(conv, Exception):
            row["errors"][name] = f"{type(conv).__name__}: {conv}"
            continue
        if (net, name) in broken or (name in gemms and any(j.source not in built for j in conv.jobs())):
            row["errors"][name] = "its build failed"
            continue
        y = torch.empty(layer.n, layer.k, p, q, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)

        if name in gemms:  # A = x as (M, C), B = w as (K, C), D = y as (M, K): views of NHWC memory
            A2, B2 = x.permute(0, 2, 3, 1).reshape(M, K), w.permute(0, 2, 3, 1).reshape(N, K)
            D2 = y.permute(0, 2, 3, 1).view(M, N)

            def run(g=conv, A2=A2, B2=B2, D2=D2):
                return g(A2, B2, out=D2, bias=bias)
        else:
            def run(conv=conv, y=y):
                return conv(x, w, problem=problem, out=y, bias=bias)

        try:
            y.fill_(float("nan"))  # no earlier candidate's result in reused memory
            run()
            torch.cuda.synchronize()
            err = (y.float() - ref).abs().max().item() / scale
        except Exception as e:  # noqa: BLE001 - one candidate's failure is a result
            row["errors"][name] = f"{type(e).__name__}: {e}".splitlines()[0][:300]
            continue
        row["rel_err"][name] = err
        if not err <= TOLERANCE:
            row["errors"][name] = f"wrong result: relative error {err:.3g}"
            continue
        runs[name] = run
    timer = time_interleaved if args.interleaved else time_graphs
    t = timer(runs, args.iters) if args.interleaved else timer(runs, args.iters, args.calls)
    base = t["cudnn_eager"]
    row["cudnn_eager_ms"] = base
    for name, ms in t.items():
        if name != "cudnn_eager":
            if ms == ms:
                row["ms"][name] = ms
            else:
                row["errors"][name] = "could not be timed (CUDA graph capture failed)"
    timed = {n: v for n, v in row["ms"].items() if n != "family"}
    if timed:
        best = min(timed, key=timed.get)
        row["best"], row["best_over_cudnn_eager"] = best, timed[best] / base
    if "family" in row["ms"]:
        row["family_over_cudnn_eager"] = row["ms"]["family"] / base
        row["family_over_best"] = row["ms"]["family"] / timed[row["best"]] if timed else float("nan")
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--only", choices=sorted(BC.LAYERS), help="one network's layers")
    ap.add_argument("--layers", help="comma-separated layer names")
    ap.add_argument("--candidates", help=f"comma-separated candidates (default: {','.join(CANDIDATES)})")
    ap.add_argument("--iters", type=int, default=30, help="replays (graphs) or samples (--interleaved) per candidate")
    ap.add_argument("--calls", type=int, default=10, help="calls per CUDA graph")
    ap.add_argument("--interleaved", action="store_true", help="time back-to-back calls instead of CUDA graphs")
    ap.add_argument("--cudnn-benchmark", action="store_true", help="torch.backends.cudnn.benchmark = True")
    ap.add_argument("--kernels", action="store_true", help="print the kernels the run needs and exit (no GPU)")
    ap.add_argument("--json")
    args = ap.parse_args()
    nets = (args.only,) if args.only else ("unet", "resnet50")
    candidates = tuple(args.candidates.split(",")) if args.candidates else CANDIDATES
    unknown = sorted(set(candidates) - set(CF.CANDIDATES))
    if unknown:
        raise SystemExit(f"unknown candidates {unknown}: one of {', '.join(CF.CANDIDATES)}")
    if args.kernels:
        for j in kernels(nets, args.layers, candidates):
            print(j.name, j.arch, len(j.source))
        return
    import torch

    torch.backends.cudnn.benchmark = args.cudnn_benchmark
    table = convs(nets, candidates)
    jobs = kernels(nets, args.layers, candidates)
    ok = common.build_all(jobs, "explore_conv")
    built = {j.source for j in ok}
    broken = {(net, name) for (net, name), c in table.items() if isinstance(c, evtc.Conv) and c.pinned
              and c._kernels[("sm90", False)].source not in built}
    rows = []
    for net, layer in layers(nets, args.layers):
        try:
            row = explore_layer(net, layer, table, candidates, args, broken, built)
        except Exception as e:  # noqa: BLE001 - the next layer may still run
            traceback.print_exc()
            row = {"net": net, "layer": layer.name, "errors": {"layer": f"{type(e).__name__}: {e}"}, "ms": {}}
        rows.append(row)
        base = row.get("cudnn_eager_ms")
        if base:
            ranked = sorted((v, k) for k, v in row["ms"].items())
            print(f"{layer.name:28s} cuDNN+eager {base * 1e3:8.1f} us  family ({row['heuristic']}) "
                  f"{row.get('family_over_cudnn_eager', float('nan')):.3f}  best: "
                  + ", ".join(f"{k} {v / base:.3f}" for v, k in ranked[:4])
                  + (f"  errors: {sorted(row['errors'])}" if row["errors"] else ""), flush=True)
        common.write_json(args.json, {"device": common.device_name(), "timing": "interleaved" if args.interleaved
                                      else "graphs", "candidates": list(candidates), "rows": rows})
        torch.cuda.empty_cache()
    cols = ["layer", "heuristic", "cudnn_eager_ms", "family_over_cudnn_eager", "best", "best_over_cudnn_eager",
            "family_over_best"]
    print(f"\nconv fprop candidates, bf16, on {common.device_name()} (time / cuDNN + eager; "
          f"{'back-to-back' if args.interleaved else 'CUDA graphs'})")
    print(common.table(rows, cols))
    ratios = {name: [r["ms"][name] / r["cudnn_eager_ms"] for r in rows if name in r.get("ms", {})]
              for name in list(candidates) + ["route", "family"]}
    print("\nper candidate, time / (cuDNN + eager) over the layers it ran (median, max, layers):")
    for name, v in ratios.items():
        if v:
            print(f"  {name:8s} {statistics.median(v):.3f}  {max(v):.3f}  {len(v)}")
    fam = [r["family_over_cudnn_eager"] for r in rows if "family_over_cudnn_eager" in r]
    if fam:
        print(f"\nfamily (heuristic): median {statistics.median(fam):.3f}, worst {max(fam):.3f}, "
              f"{sum(v > 1 for v in fam)} of {len(fam)} layers slower than cuDNN + eager")


if __name__ == "__main__":
    sys.exit(main())
