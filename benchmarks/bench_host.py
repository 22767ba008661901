"""Issue 12's host-path benchmark: host microseconds per call of evtc beside torch, in one run.

On the GPU machine (kernels prebuilt: ``python benchmarks/prebuild.py host``):

    python benchmarks/bench_host.py --json $OUT/host.json

For bias_relu, many_aux and row_stats (a row max and a row sum: reductions) at 256x256x256
bf16 (``--shape``), default configuration:

* ``evtc``: ``gemm(A, B, **inputs)`` (outputs allocated by evtc), ``evtc_out``: with ``out=``
  preallocated outputs, ``evtc_launch``: the library's ``evtc_launch`` alone, called through
  ctypes with the last call's packed arguments (the C++ part: TMA descriptors, workspace
  initialisation, the launch);
* ``mm``: ``torch.mm(A, B.T)`` (cuBLAS, allocating its output): the goal is evtc's bias_relu at
  most this, many_aux at most 1.5x;
* ``eager``: the epilogue function run unfused by PyTorch after ``torch.mm``;
* ``addmm_act``: ``torch._addmm_activation(bias, A, B.T)``, cuBLASLt's fused relu(acc + bias)
  (bias_relu only).

Host time: the GPU is kept busy (``torch.cuda._sleep``) while the host issues ``--calls`` calls
back to back without synchronising; host us per call = the host clock's elapsed time / calls,
the median of ``--repeats`` samples (so it is the launch path alone, never waiting for the GPU).
Device time: CUDA events around back-to-back calls (:func:`evtc.testing.bench.time_interleaved`).
``--profile`` adds the top functions of a cProfile of evtc's calls (where the Python time goes).
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time

import common  # noqa: F401  (sets sys.path)

import evtc
from evtc import bf16

EPILOGUES = ("bias_relu", "many_aux", "row_stats")


def gemms() -> dict:
    """The benchmarked kernels (also benchmarks/prebuild.py's group ``host``)."""
    import epilogues as E

    return {n: evtc.Gemm(E.REFERENCE[n], a=bf16, b=bf16, c=bf16, d=bf16) for n in EPILOGUES}


def host_us(fn, calls: int, repeats: int) -> float:
    """Median host time per call (us) of ``fn`` issued back to back on a busy GPU."""
    import torch

    fn()
    torch.cuda.synchronize()
    samples = []
    for _ in range(repeats):
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(50_000_000)  # ~30 ms of GPU work: the calls below queue behind it
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        samples.append((time.perf_counter() - t0) / calls * 1e6)
        torch.cuda.synchronize()
    return statistics.median(samples)


def profile_top(fn, calls: int, top: int = 15) -> list[dict]:
    """The ``top`` functions by own time over ``calls`` calls of ``fn`` (cProfile)."""
    import torch

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    torch.cuda.synchronize()
    stats = pstats.Stats(prof, stream=io.StringIO())
    rows = []
    for (file, line, name), (cc, nc, tt, ct, _) in sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]:
        rows.append({"function": f"{file.rsplit('/', 2)[-1]}:{line}({name})", "calls_per_call": nc / calls,
                     "own_us_per_call": tt / calls * 1e6, "cumulative_us_per_call": ct / calls * 1e6})
    return rows


def per_call_us(fn, n: int = 20000) -> float:
    """Mean host microseconds of ``fn()`` over ``n`` calls (no GPU wait: for host-only steps)."""
    fn()
    t0 = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t0) / n * 1e6


def breakdown(g, A, B, kw: dict) -> dict:
    """Host us of each step of a call on the fast path, timed alone (``--breakdown``): the tensor
    probes, the dispatch lookups, the framework's allocation, the stream query, packing and the
    C++ launch. Steps that launch (the allocation, evtc_launch) run on a busy GPU."""
    import torch

    from evtc.torch import fast as torch_fast_mod
    from evtc.runtime import launch as L
    from evtc.runtime import tensors as T

    key, ptrs = L.probe_call(g.dispatch.prober, A, B, kw, None)
    launcher = g.dispatch._routes[key]
    sig = launcher._signatures[key]
    buf, addr = launcher._buffer()
    d_shape, d_stride = tuple(sig.allocs[0].shape), tuple(sig.allocs[0].strides)
    steps = {
        "python call with these kwargs (no-op)": lambda: (lambda A, B, **k: None)(A, B, **kw),
        "torch.compiler.is_compiling()": torch_fast_mod.torch_compiling,
        "probe one tensor (_torch_probe)": lambda: T._torch_probe(A),
        "probe_call (every tensor)": lambda: L.probe_call(g.dispatch.prober, A, B, kw, None),
        "hash of the call key": lambda: hash(key),
        "dispatch + signature lookups": lambda: (g.dispatch._routes.get(key), launcher._signatures.get(key)),
        "current raw stream": lambda: torch._C._cuda_getCurrentRawStream(0),
        "torch.empty_strided (D)": lambda: torch.empty_strided(d_shape, d_stride, dtype=A.dtype, device=A.device),
        "pack the call struct": lambda: launcher._pack(buf, 0, sig.handle, 0, sig.workspace, 0, *ptrs,
                                                       *[kw[n] for n in g.dispatch.prober.scalar_names]),
        "evtc_launch (C++)": lambda: launcher._launch(addr),
        "whole call": lambda: g(A, B, **kw),
        "torch.mm": lambda: torch.mm(A, B.t()),
    }
    out = {}
    for name, fn in steps.items():
        if hasattr(torch.cuda, "_sleep"):
            torch.cuda._sleep(200_000_000)
        out[name] = per_call_us(fn, 2000 if "launch" in name or "call" in name or "mm" in name
                                or "empty" in name else 20000)
        torch.cuda.synchronize()
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shape", default="256x256x256", help="MxNxK")
    ap.add_argument("--calls", type=int, default=100)
    ap.add_argument("--repeats", type=int, default=15)
    ap.add_argument("--iters", type=int, default=30, help="device-time samples")
    ap.add_argument("--profile", action="store_true")
    ap.add_argument("--no-fast", action="store_true", help="don't build the torch fast path first")
    ap.add_argument("--breakdown", action="store_true", help="host us of each step of the fast path, timed alone")
    ap.add_argument("--json")
    args = ap.parse_args()
    import torch

    import epilogues as E
    from evtc.testing.bench import time_interleaved
    from evtc.ir.nodes import ColBroadcast
    from evtc.testing import Problem, make_inputs, poisoned_outputs

    M, N, K = (int(x) for x in args.shape.split("x"))
    from evtc.torch import fast as torch_fast

    if not args.no_fast:
        torch_fast.build()  # NOTE [The torch fast path]: built once per machine, here before timing
    table = gemms()
    python_only = gemms()  # the same kernels on the Python launch path alone
    for g in python_only.values():
        g.dispatch.fast.off = True
    # only the member each epilogue runs on at this shape (benchmarks/prebuild.py's host group)
    from evtc.compiler import build_many

    build_many([g.kernel(g.choose(M, N, K)).job() for g in table.values()])
    p = Problem(M, N, K)
    rows, ratios, profiles = [], {}, {}
    for name, g in table.items():
        ins = make_inputs(g.graph, g.a, g.b, p, seed=3)
        A, B = ins["A"], ins["B"]
        kw = {k: v for k, v in ins.items() if k not in ("A", "B")}
        outs = poisoned_outputs(g.graph, p)
        given = outs["D"] if len(outs) == 1 else outs
        Bt = B.t()
        fn = E.REFERENCE[name].fn
        col = {n.name for n in g.graph.inputs if isinstance(n, ColBroadcast)}
        eager_kw = {k: (v.unsqueeze(-1) if k in col else v) for k, v in kw.items()}
        acc_name = g.graph.accumulator.name if g.graph.accumulator is not None else "acc"
        gp = python_only[name]
        cases = {
            "evtc": lambda: g(A, B, **kw),
            "evtc_python": lambda: gp(A, B, **kw),
            "evtc_out": lambda: g(A, B, out=given, **kw),
            "mm": lambda: torch.mm(A, Bt),
            "eager": lambda: fn(**{acc_name: torch.mm(A, Bt)}, **eager_kw),
        }
        if name == "bias_relu":
            bias = kw["bias"].to(torch.bfloat16)
            cases["addmm_act"] = lambda: torch._addmm_activation(bias, A, Bt, use_gelu=False)
        g(A, B, **kw)  # registers the key with the fast path
        gp(A, B, out=given, **kw)
        g(A, B, out=given, **kw)  # prepare; the launcher's buffer now holds this call's arguments
        launcher = g.dispatch._single or next(iter(g.dispatch._routes.values()))  # a family: the member this shape runs on
        cases["evtc_launch"] = lambda: launcher._launch(launcher._tls.addr)
        host = {k: host_us(f, args.calls, args.repeats) for k, f in cases.items()}
        dev = time_interleaved({k: f for k, f in cases.items() if k != "evtc_launch"}, args.iters)
        for k in cases:
            rows.append({"epilogue": name, "impl": k, "host_us": host[k],
                         "device_us": dev[k] * 1e3 if k in dev else None})
        ratios[name] = {"evtc_over_mm": host["evtc"] / host["mm"], "evtc_out_over_mm": host["evtc_out"] / host["mm"],
                        "evtc_over_eager": host["evtc"] / host["eager"]}
        if args.profile:
            profiles[name] = profile_top(lambda: g(A, B, **kw), 2000)
            profiles[name + " out="] = profile_top(lambda: g(A, B, out=given, **kw), 2000)
        if args.breakdown:
            steps = profiles.setdefault("breakdown", {})[name] = breakdown(g, A, B, kw)
            for step, us in steps.items():
                print(f"  {name}: {step:40s} {us:7.2f} us", flush=True)
        lib = launcher.library
        print(f"{name}: {lib.prepares} prepares, {len(launcher._signatures)} signatures, dispatch "
              f"{[k.spec.name for k in g.dispatch.family._kernels.values() if k.library is lib]}", flush=True)
        print(f"{name}: fast path {torch_fast.status()}, {len(g.dispatch.fast.table) if g.dispatch.fast.table is not None else 0} keys; "
              f"evtc (Python path alone) {host['evtc_python']:.1f} us", flush=True)
        print(f"{name}: evtc {host['evtc']:.1f} us, out= {host['evtc_out']:.1f} us, evtc_launch {host['evtc_launch']:.1f} us, "
              f"torch.mm {host['mm']:.1f} us, eager {host['eager']:.1f} us (host time per call)", flush=True)
    print(f"\nhost time per call at {args.shape} bf16 on {common.device_name()}")
    print(common.table(rows, ["epilogue", "impl", "host_us", "device_us"]))
    goals = {"bias_relu": 1.0, "many_aux": 1.5}
    for n, lim in goals.items():
        r = ratios[n]["evtc_over_mm"]
        print(f"goal {n}: evtc / torch.mm = {r:.2f} (goal <= {lim}): {'met' if r <= lim else 'NOT met'}")
    common.write_json(args.json, {"device": common.device_name(), "fast_path": torch_fast.status(), "shape": args.shape, "calls": args.calls,
                                  "repeats": args.repeats, "rows": rows, "ratios": ratios, "goals": goals,
                                  "profiles": profiles})


if __name__ == "__main__":
    main()
