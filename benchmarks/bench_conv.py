"""Issue 15's benchmark: fused convolutions against cuDNN (through torch) and torch.compile.

On the GPU machine (after ``python benchmarks/prebuild.py conv:bench`` here or there):

    python benchmarks/bench_conv.py --json $OUT/conv.json

Layers: ResNet-50's convolutions (batch 32) and a Stable-Diffusion-style UNet's (64x64 latents,
batch 8), bf16, channels-last (torch ``channels_last`` tensors, evtc's ``layout="nchw"``). Per
layer, three modes:

* ``fprop``: ``act(conv(x, w) + bias[k])``, act = ReLU on ResNet-50's layers and SiLU on the
  UNet's; evtc's Conv as a user gets it (no ``config``: the sm90 family's member its heuristic
  picks per layer, 1x1 layers on its Gemm; the ``evtc_kernel`` column names it) against cuDNN's
  conv followed by the eager epilogue (``F.silu(F.conv2d(x, w) + bias)``) and against
  ``torch.compile`` of that function (Inductor: cuDNN's conv, the epilogue as one Triton kernel;
  ``--no-compile`` leaves it out);
* ``dgrad``: ``dx = conv_input(dy, w) * (F > 0)``, the input gradient through a ReLU whose
  pre-activation F was saved (dReLU); unit-stride layers on the Conv's arch (on sm90 the dgrad
  family's member its heuristic picks), stride-2 layers on the sm80 strided-dgrad kernel; against ``torch.nn.grad.conv2d_input`` (cuDNN's dgrad) and the
  eager mask, and its torch.compile;
* ``strided dgrad``, additionally on the stride-2 layers: the four compile-time choices of the
  row map's arithmetic (cutlass::FastDivmod or plain division, for the aux loads and for the
  stores; NOTE [Strided dgrad rows] in codegen_templates/include/evtc/sm80_conv.hpp), timed in
  the same run.

Device times per call: median of --iters samples of back-to-back calls, CUDA events, after
warm-up, the candidates of a layer interleaved (evtc.testing.bench.time_interleaved); ``--graphs`` times
each in a CUDA graph instead (evtc.testing.bench.time_graphs: the kernels alone, no host launch path,
for layers of a few microseconds).
benchmarks/explore_conv.py times every candidate kernel of the family per layer. Ratios below 1 mean
evtc is faster. The issue's target: evtc fused at least as fast as cuDNN + eager on every layer,
faster than torch.compile on the median layer.
"""

from __future__ import annotations

import argparse
import dataclasses
import statistics
import sys

import common

import evtc
from evtc import bf16


@evtc.epilogue
def bias_silu(acc, bias: evtc.RowVector[bf16]):
    """The UNet's fprop epilogue: silu(acc + bias[k])."""
    return evtc.silu(acc + bias)


@evtc.epilogue
def bias_relu(acc, bias: evtc.RowVector[bf16]):
    """ResNet-50's fprop epilogue: relu(acc + bias[k]) (a folded batch norm's shift, then ReLU)."""
    return evtc.relu(acc + bias)


@evtc.epilogue
def drelu(acc, F: evtc.Matrix):
    """dgrad's epilogue: the gradient through a ReLU, dx * (F > 0), F the saved pre-activation."""
    return evtc.where(evtc.gt(F, 0.0), acc, 0.0)


@dataclasses.dataclass(frozen=True)
class Layer:
    name: str
    n: int
    h: int
    w: int
    c: int
    k: int
    r: int
    s: int
    stride: int
    pad: int

    @property
    def out(self) -> tuple[int, int]:
        return ((self.h + 2 * self.pad - self.r) // self.stride + 1, (self.w + 2 * self.pad - self.s) // self.stride + 1)


# ResNet-50 (torchvision's v1.5: the stride in the 3x3), batch 32; conv1 (3 input channels) is left
# out: its channels are not a 16-byte vector (evtc's conv kernels need C % 8 == 0)
RN_BATCH = 32
RESNET50 = [
    Layer("rn50_res2_1x1_256_64", RN_BATCH, 56, 56, 256, 64, 1, 1, 1, 0),
    Layer("rn50_res2_3x3_64", RN_BATCH, 56, 56, 64, 64, 3, 3, 1, 1),
    Layer("rn50_res2_1x1_64_256", RN_BATCH, 56, 56, 64, 256, 1, 1, 1, 0),
    Layer("rn50_res3_3x3_128_s2", RN_BATCH, 56, 56, 128, 128, 3, 3, 2, 1),
    Layer("rn50_res3_3x3_128", RN_BATCH, 28, 28, 128, 128, 3, 3, 1, 1),
    Layer("rn50_res3_1x1_128_512", RN_BATCH, 28, 28, 128, 512, 1, 1, 1, 0),
    Layer("rn50_res3_down_256_512_s2", RN_BATCH, 56, 56, 256, 512, 1, 1, 2, 0),
    Layer("rn50_res4_3x3_256", RN_BATCH, 14, 14, 256, 256, 3, 3, 1, 1),
    Layer("rn50_res4_3x3_256_s2", RN_BATCH, 28, 28, 256, 256, 3, 3, 2, 1),
    Layer("rn50_res4_1x1_1024_256", RN_BATCH, 14, 14, 1024, 256, 1, 1, 1, 0),
    Layer("rn50_res5_3x3_512", RN_BATCH, 7, 7, 512, 512, 3, 3, 1, 1),
    Layer("rn50_res5_1x1_512_2048", RN_BATCH, 7, 7, 512, 2048, 1, 1, 1, 0),
]
# A Stable-Diffusion-1.5-style UNet at 64x64 latents, batch 8: the 3x3 convolutions of its
# resnet blocks at each resolution and its stride-2 downsamplers
UNET = [
    Layer("unet_3x3_320_64", 8, 64, 64, 320, 320, 3, 3, 1, 1),
    Layer("unet_3x3_640_32", 8, 32, 32, 640, 640, 3, 3, 1, 1),
    Layer("unet_3x3_1280_16", 8, 16, 16, 1280, 1280, 3, 3, 1, 1),
    Layer("unet_3x3_1280_8", 8, 8, 8, 1280, 1280, 3, 3, 1, 1),
    Layer("unet_3x3_320_640_32", 8, 32, 32, 320, 640, 3, 3, 1, 1),
    Layer("unet_down_320_s2", 8, 64, 64, 320, 320, 3, 3, 2, 1),
    Layer("unet_down_640_s2", 8, 32, 32, 640, 640, 3, 3, 2, 1),
]
LAYERS = {"resnet50": RESNET50, "unet": UNET}
#: each network's fprop activation (its epilogue: bias + activation)
ACTIVATION = {"resnet50": "relu", "unet": "silu"}
DIVMODS = [(True, True), (True, False), (False, True), (False, False)]


def divmod_name(fast: tuple[bool, bool]) -> str:
    return "loads_" + ("fast" if fast[0] else "div") + "_stores_" + ("fast" if fast[1] else "div")


def convs(arch: str) -> dict:
    """The benchmark's Convs: fprop (``fprop_relu``, ``fprop_silu``: families on sm90, no config)
    and dgrad on ``arch`` (dgrad's strided problems run on its strided sm80 kernel), and one
    strided-dgrad Conv per FastDivmod choice."""
    out = {"fprop_silu": evtc.Conv(bias_silu, kind="fprop", a=bf16, d=bf16, arch=arch, layout="nchw"),
           "fprop_relu": evtc.Conv(bias_relu, kind="fprop", a=bf16, d=bf16, arch=arch, layout="nchw"),
           "dgrad": evtc.Conv(drelu, kind="dgrad", a=bf16, c=bf16, d=bf16, arch=arch, layout="nchw")}
    for fast in DIVMODS:
        out[divmod_name(fast)] = evtc.Conv(drelu, kind="dgrad", a=bf16, d=bf16, arch="sm80", layout="nchw",
                                           fast_divmod=fast)
    return out


def fprop_kernel(conv, layer: Layer):
    """(label, kernel) a family Conv runs ``layer``'s fprop on (evtc.Conv.kernel_for)."""
    return conv.kernel_for((layer.n, layer.h, layer.w, layer.c), (layer.k, layer.r, layer.s, layer.c),
                           evtc.ConvProblem(stride=layer.stride, padding=layer.pad))


def dgrad_kernel(conv, layer: Layer):
    """(label, kernel) a family Conv runs ``layer``'s dgrad on (``strided`` for stride 2)."""
    p, q = layer.out
    return conv.kernel_for((layer.n, p, q, layer.k), (layer.k, layer.r, layer.s, layer.c),
                           evtc.ConvProblem(stride=layer.stride, padding=layer.pad, input_size=(layer.h, layer.w)))


def kernels(arch: str = "sm90") -> list:
    """Build jobs of every kernel the benchmark runs (benchmarks/prebuild.py conv:bench): the fprop
    and the unit-stride dgrad kernel each layer runs on, and the strided-dgrad variants."""
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    import conv_cases

    table = convs(arch)
    jobs = [fprop_kernel(table[f"fprop_{ACTIVATION[net]}"], layer)[1].job()
            for net, layers in LAYERS.items() for layer in layers]
    jobs += [dgrad_kernel(table["dgrad"], layer)[1].job()
             for layers in LAYERS.values() for layer in layers if layer.stride == 1]
    pairs = [(table["dgrad"], False)] + [(table[divmod_name(f)], True) for f in DIVMODS]
    return list({j.source: j for j in jobs + conv_cases.kernels(pairs)}.values())


def bench_layer(layer: Layer, table: dict, iters: int, compiled: dict, act: str = "silu",
                timer=None, fprop_only: bool = False) -> list[dict]:
    import torch
    import torch.nn.functional as F
    from torch.nn.grad import conv2d_input

    from evtc.testing.bench import time_interleaved

    timer = timer or time_interleaved
    cl = torch.channels_last
    activation = F.relu if act == "relu" else F.silu
    fprop_conv = table[f"fprop_{act}"]
    dev = "cuda"
    gen = torch.Generator(device=dev)
    gen.manual_seed(0)

    def rand(*shape):
        return torch.randn(shape, generator=gen, device=dev).to(torch.bfloat16).contiguous(memory_format=cl)

    p, q = layer.out
    x = rand(layer.n, layer.c, layer.h, layer.w)
    w = rand(layer.k, layer.c, layer.r, layer.s) * (layer.c * layer.r * layer.s) ** -0.5
    bias = torch.randn(layer.k, generator=gen, device=dev).to(torch.bfloat16)
    dy = rand(layer.n, layer.k, p, q)
    Fpre = rand(layer.n, layer.c, layer.h, layer.w)
    stride, pad = (layer.stride,) * 2, (layer.pad,) * 2
    problem = evtc.ConvProblem(stride=layer.stride, padding=layer.pad)
    dproblem = evtc.ConvProblem(stride=layer.stride, padding=layer.pad, input_size=(layer.h, layer.w))
    y = torch.empty(layer.n, layer.k, p, q, device=dev, dtype=torch.bfloat16).contiguous(memory_format=cl)
    dx = torch.empty_like(x)

    def eager_fprop():
        return activation(F.conv2d(x, w, None, stride, pad) + bias.view(1, -1, 1, 1))

    def eager_dgrad():
        return conv2d_input(x.shape, w, dy, stride, pad) * (Fpre > 0)

    rows = []
    fns = {"evtc": lambda: fprop_conv(x, w, problem=problem, out=y, bias=bias), "cudnn_eager": eager_fprop}
    if compiled:
        fns["torch_compile"] = lambda: compiled[f"fprop_{act}"](x, w, bias, stride, pad)
    t = timer(fns, iters)
    row = _row(layer, "fprop", t)
    row["evtc_kernel"] = fprop_kernel(fprop_conv, layer)[0]
    rows.append(row)
    if fprop_only:
        return rows

    fns = {"evtc": lambda: table["dgrad"](dy, w, problem=dproblem, out=dx, F=Fpre), "cudnn_eager": eager_dgrad}
    if compiled:
        fns["torch_compile"] = lambda: compiled["dgrad"](x.shape, w, dy, Fpre, stride, pad)
    if layer.stride > 1:
        for fast in DIVMODS:
            conv = table[divmod_name(fast)]
            fns[divmod_name(fast)] = (lambda conv=conv: conv(dy, w, problem=dproblem, out=dx, F=Fpre))
    t = timer(fns, iters)
    row = _row(layer, "strided_dgrad" if layer.stride > 1 else "dgrad", t)
    row["evtc_kernel"] = dgrad_kernel(table["dgrad"], layer)[0]
    if layer.stride > 1:
        base = t[divmod_name((False, False))]
        for fast in DIVMODS:
            row[f"{divmod_name(fast)}_ms"] = t[divmod_name(fast)]
            row[f"{divmod_name(fast)}_over_div"] = t[divmod_name(fast)] / base
        row["best_divmod"] = min(DIVMODS, key=lambda f: t[divmod_name(f)])
        row["best_divmod"] = divmod_name(row["best_divmod"])
    rows.append(row)
    return rows


def _row(layer: Layer, mode: str, t: dict) -> dict:
    p, q = layer.out
    flops = 2.0 * layer.n * p * q * layer.k * layer.c * layer.r * layer.s
    return {"layer": layer.name, "mode": mode, "shape": f"{layer.n}x{layer.h}x{layer.w}x{layer.c}->{layer.k} "
            f"{layer.r}x{layer.s}/{layer.stride}", "evtc_ms": t["evtc"], "cudnn_eager_ms": t["cudnn_eager"],
            "compile_ms": t.get("torch_compile", float("nan")), "evtc_over_cudnn_eager": t["evtc"] / t["cudnn_eager"],
            "evtc_over_compile": t["evtc"] / t.get("torch_compile", float("nan")), "evtc_tflops": flops / t["evtc"] / 1e9}


def compiled_fns() -> dict:
    import torch
    import torch.nn.functional as F
    from torch.nn.grad import conv2d_input

    def fprop_silu(x, w, b, stride, pad):
        return F.silu(F.conv2d(x, w, None, stride, pad) + b.view(1, -1, 1, 1))

    def fprop_relu(x, w, b, stride, pad):
        return F.relu(F.conv2d(x, w, None, stride, pad) + b.view(1, -1, 1, 1))

    def dgrad(shape, w, dy, Fpre, stride, pad):
        return conv2d_input(shape, w, dy, stride, pad) * (Fpre > 0)

    return {"fprop_silu": torch.compile(fprop_silu, dynamic=False), "fprop_relu": torch.compile(fprop_relu, dynamic=False),
            "dgrad": torch.compile(dgrad, dynamic=False)}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--arch", default="sm90", choices=("sm90", "sm80"))
    ap.add_argument("--only", choices=sorted(LAYERS), help="one network's layers")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (it compiles once per layer)")
    ap.add_argument("--layers", help="comma-separated layer names (default: every layer)")
    ap.add_argument("--graphs", action="store_true", help="time each candidate in a CUDA graph (evtc.testing.bench.time_graphs)")
    ap.add_argument("--fprop-only", action="store_true", help="skip the dgrad modes")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    from evtc.testing.bench import time_graphs

    table = convs(args.arch)
    sys.path.insert(0, str(common.ROOT / "tests" / "gpu"))
    common.build_all(kernels(args.arch), "conv")
    compiled = None if args.no_compile else compiled_fns()
    rows = []
    for net, layers in LAYERS.items():
        if args.only and net != args.only:
            continue
        for layer in layers:
            if args.layers and layer.name not in args.layers.split(","):
                continue
            got = bench_layer(layer, table, args.iters, compiled, ACTIVATION[net],
                              time_graphs if args.graphs else None, fprop_only=args.fprop_only)
            for r in got:
                r["net"] = net
                print(f"{r['layer']:28s} {r['mode']:13s} {r['evtc_kernel']:14s} evtc {r['evtc_ms']:.3f} ms  cuDNN+eager "
                      f"{r['cudnn_eager_ms']:.3f}  compile {r['compile_ms']:.3f}  ratios "
                      f"{r['evtc_over_cudnn_eager']:.3f} / {r['evtc_over_compile']:.3f}", flush=True)
            rows += got
            torch.cuda.empty_cache()
    summary = {}
    groups = [(mode, None) for mode in ("fprop", "dgrad", "strided_dgrad")] + [("fprop", net) for net in LAYERS]
    for mode, net in groups:
        sel = [r for r in rows if r["mode"] == mode and net in (None, r["net"])]
        if sel:
            summary[mode if net is None else f"{mode}_{net}"] = {
                "median_evtc_over_cudnn_eager": statistics.median(r["evtc_over_cudnn_eager"] for r in sel),
                "max_evtc_over_cudnn_eager": max(r["evtc_over_cudnn_eager"] for r in sel),
                "layers_slower_than_cudnn_eager": sum(r["evtc_over_cudnn_eager"] > 1 for r in sel),
                "layers": len(sel),
                "median_evtc_over_compile": statistics.median(r["evtc_over_compile"] for r in sel)}
    strided = [r for r in rows if r["mode"] == "strided_dgrad"]
    if strided:
        summary["divmod"] = {divmod_name(f): statistics.median(r[f"{divmod_name(f)}_over_div"] for r in strided)
                             for f in DIVMODS}
    print(f"\nconvolutions, bf16, {args.arch} kernels on {common.device_name()}")
    print(common.table(rows, ["layer", "mode", "evtc_kernel", "evtc_ms", "cudnn_eager_ms", "compile_ms", "evtc_over_cudnn_eager",
                              "evtc_over_compile", "evtc_tflops"]))
    if strided:
        print("\nstrided dgrad, the row map's arithmetic (time / plain division for both):")
        print(common.table(strided, ["layer"] + [f"{divmod_name(f)}_over_div" for f in DIVMODS] + ["best_divmod"]))
    print("\nsummary:", summary)
    common.write_json(args.json, {"device": common.device_name(), "arch": args.arch, "rows": rows,
                                  "summary": summary,
                                  "timing": "graphs" if args.graphs else "interleaved",
                                  "plans": {k: str(v.plan) for k, v in table.items() if k.startswith(("fprop", "dgrad"))}})


if __name__ == "__main__":
    main()
