"""Unit-stride dgrad + dReLU of bench_conv.py's UNet layers on the non-persistent conv kernel, the
persistent cooperative members (NOTE [Persistent conv kernels]) and the fprop family's long-K
members (clusters along M), beside cuDNN's input
gradient followed by the eager mask, in one run: the evidence for the dgrad family. With
``--strided``: the stride-2 layers of both sets on configurations of the strided-dgrad kernel
(CUTLASS 2.x's, NOTE [Strided dgrad rows]).

On the GPU machine (the kernels are built first, in parallel):

    python benchmarks/explore_conv_dgrad.py --json $OUT/explore_conv_dgrad.json
    python benchmarks/explore_conv_dgrad.py --strided --json $OUT/explore_strided_dgrad.json

Per layer (bf16, channels-last, ``dx = conv2d_input(dy, w) * (F > 0)``): each member runs as a
dgrad Conv pinned to its configuration; each output is first checked against cuDNN's (max |evtc
- cuDNN| / max |cuDNN| below 2 %: a wrong kernel is recorded, not timed); times are device times
in CUDA graphs (evtc.testing.bench.time_graphs), the candidates of a layer in alternation, median; printed
and written as time / (cuDNN + eager).
"""

from __future__ import annotations

import argparse
import json

import common

import evtc
from evtc import bf16
from evtc.family import conv as CF

import bench_conv as BC

#: name -> the dgrad Conv's configuration (``{}``: the non-persistent default): the family's
#: candidates (evtc/family/conv.py CANDIDATES), the fprop family's long-K members among them (NOTE
#: [Long-K conv layers: the filter multicast])
MEMBERS = {"base": {}, **{n: dict(m.fields) for n, m in CF.member_configs(bf16, (
    "coop128", "coop160", "coop", "streamk128", "m64", "coop192_c2x1", "streamk128_c4x1", "m64_c4x1")).items()}}
#: name -> the strided-dgrad kernel's configuration (sm80 tile, warp tile, stages; ``{}``: the
#: default 128x128x32, warps 64x64x32, 4 stages)
STRIDED = {"default": {},
           "t128x128x64_s3": {"tile": (128, 128, 64), "warp_tile": (64, 64, 64), "stages": 3},
           "t128x128x64_s4": {"tile": (128, 128, 64), "warp_tile": (64, 64, 64), "stages": 4},
           "t128x128x32_s6": {"tile": (128, 128, 32), "warp_tile": (64, 64, 32), "stages": 6},
           "t128x256x32_s3": {"tile": (128, 256, 32), "warp_tile": (64, 64, 32), "stages": 3},
           "t256x128x32_s3": {"tile": (256, 128, 32), "warp_tile": (64, 64, 32), "stages": 3},
           "t256x128x64_s3": {"tile": (256, 128, 64), "warp_tile": (64, 64, 64), "stages": 3},
           "t128x64x32_s4": {"tile": (128, 64, 32), "warp_tile": (64, 32, 32), "stages": 4},
           "t64x128x32_s4": {"tile": (64, 128, 32), "warp_tile": (32, 64, 32), "stages": 4}}
TOLERANCE = 2e-2


def convs(strided: bool = False) -> dict:
    """name -> a dgrad Conv pinned to that configuration (``strided``: sm80 Convs, whose stride-2
    problems run on the strided-dgrad kernel)."""
    arch, members = ("sm80", STRIDED) if strided else ("sm90", MEMBERS)
    return {m: evtc.Conv(BC.drelu, kind="dgrad", a=bf16, c=bf16, d=bf16, arch=arch, layout="nchw", config=cfg)
            for m, cfg in members.items()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--strided", action="store_true", help="the stride-2 layers on strided-dgrad configurations")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch
    from torch.nn.grad import conv2d_input

    from evtc.testing.bench import time_graphs

    table = convs(args.strided)
    # what each member runs: the stride-2 problems an sm80 Conv's strided-dgrad kernel, else its one kernel
    runs = {m: c._kernel("sm80", True).job() if args.strided else c for m, c in table.items()}
    built = {id(x) for x in common.build_all(list(runs.values()), "explore_conv_dgrad")}
    broken = {m for m, x in runs.items() if id(x) not in built}
    cl = torch.channels_last
    rows = []
    layers = ([l for ls in BC.LAYERS.values() for l in ls if l.stride == 2] if args.strided
              else [l for l in BC.LAYERS["unet"] if l.stride == 1])
    for layer in layers:
        gen = torch.Generator(device="cuda")
        gen.manual_seed(0)

        def rand(*shape):
            return torch.randn(shape, generator=gen, device="cuda").to(torch.bfloat16).contiguous(memory_format=cl)

        p, q = layer.out
        w = rand(layer.k, layer.c, layer.r, layer.s) * (layer.c * layer.r * layer.s) ** -0.5
        dy = rand(layer.n, layer.k, p, q)
        Fpre = rand(layer.n, layer.c, layer.h, layer.w)
        xshape = (layer.n, layer.c, layer.h, layer.w)
        problem = evtc.ConvProblem(stride=layer.stride, padding=layer.pad, input_size=(layer.h, layer.w))

        def eager():
            return conv2d_input(xshape, w, dy, layer.stride, layer.pad) * (Fpre > 0)

        ref = eager().float()
        fns, errs = {"cudnn_eager": eager}, {}
        for m, conv in table.items():
            if m in broken:
                continue
            dx = torch.empty(xshape, device="cuda", dtype=torch.bfloat16).contiguous(memory_format=cl)
            try:
                conv(dy, w, problem=problem, out=dx, F=Fpre)
                torch.cuda.synchronize()
            except evtc.EvtcError as e:
                errs[m] = str(e)[:200]
                continue
            errs[m] = float((dx.float() - ref).abs().max() / ref.abs().max())
            if errs[m] < TOLERANCE:
                fns[m] = (lambda conv=conv, dx=dx: conv(dy, w, problem=problem, out=dx, F=Fpre))
        t = time_graphs(fns, args.iters)
        row = {"layer": layer.name, "gemm": [layer.n * layer.h * layer.w, layer.c, layer.k * layer.r * layer.s],
               "cudnn_eager_ms": t["cudnn_eager"],
               "ratio": {m: t[m] / t["cudnn_eager"] for m in t if m != "cudnn_eager"}, "rel_err": errs}
        rows.append(row)
        print(f"{layer.name:22s} cuDNN+eager {t['cudnn_eager'] * 1e3:7.1f} us  "
              + "  ".join(f"{m} {v:.3f}" for m, v in row["ratio"].items()), flush=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"device": torch.cuda.get_device_name(), "members": STRIDED if args.strided else MEMBERS,
                       "rows": rows}, f, indent=1)
        print("wrote", args.json)


if __name__ == "__main__":
    main()
