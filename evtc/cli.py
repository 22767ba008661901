"""The ``evtc`` command line: emit, plan, build, run, bench, demo.

Input: an epilogue given as ``PATH.py:FUNC`` (an ``@evtc.epilogue`` function in a Python file)
or ``--expr "D = relu(alpha*acc + beta*C + bias[n])"``. Output: files (``.cu``, ``.dot``,
``.json``) and reports on the terminal.

Every command turns evtc errors into a message and exit status 2 (no Python traceback); set
``EVTC_TRACEBACK=full`` to see one.
"""

from __future__ import annotations

import importlib.util
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import click

from evtc import dtypes
from evtc.errors import EvtcError

DTYPE_CHOICES = ["f32", "f16", "bf16", "e4m3", "e5m2"]


def _load_epilogue(spec: str | None, expr: str | None):
    """The epilogue object named by ``PATH.py:FUNC`` or an expression string."""
    if expr:
        return expr
    if not spec:
        raise click.UsageError("give an epilogue as PATH.py:FUNC or with --expr")
    if ":" not in spec:
        raise click.UsageError(f"'{spec}' is not PATH.py:FUNC")
    path_s, func = spec.rsplit(":", 1)
    path = Path(path_s)
    if not path.is_file():
        raise click.UsageError(f"no such file: {path}")
    mod_name = f"evtc_user_{path.stem}"
    mspec = importlib.util.spec_from_file_location(mod_name, path)
    if mspec is None or mspec.loader is None:
        raise click.UsageError(f"can't import {path}")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[mod_name] = module
    sys.path.insert(0, str(path.resolve().parent))
    try:
        mspec.loader.exec_module(module)
    finally:
        sys.path.pop(0)
    if not hasattr(module, func):
        names = [n for n, v in vars(module).items() if type(v).__name__ == "Epilogue"]
        raise click.UsageError(f"{path} has no '{func}'" + (f"; epilogues there: {', '.join(names)}" if names else ""))
    return getattr(module, func)


def _parse_triple(text: str | None, n: int, what: str) -> tuple[int, ...] | None:
    if text is None:
        return None
    try:
        vals = tuple(int(x) for x in text.lower().split("x"))
    except ValueError:
        raise click.BadParameter(f"{what} '{text}' is not like {'x'.join(['128'] * n)}") from None
    if len(vals) != n:
        raise click.BadParameter(f"{what} '{text}' needs {n} numbers")
    return vals


def _config(arch: str, a: str, tile, cluster, schedule, stages, epi_tile, scheduler):
    from evtc.plan.config import default_config

    cfg = default_config(arch, dtypes.by_name(a), dtypes.by_name(a))
    changes: dict[str, Any] = {}
    if tile:
        changes["tile"] = _parse_triple(tile, 3, "--tile")
    if cluster:
        c = _parse_triple(cluster, 2, "--cluster")
        changes["cluster"] = (c[0], c[1], 1)
    if schedule:
        changes["schedule"] = schedule
    if stages:
        changes["stages"] = stages
    if epi_tile:
        changes["epilogue_tile"] = _parse_triple(epi_tile, 2, "--epilogue-tile")
    if scheduler:
        changes["scheduler"] = scheduler
    return cfg.replace(**changes) if changes else cfg


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


class PlanParam(click.ParamType):
    """``--plan``: ``evtc``, ``cutlass``, or a JSON object of fixed planner decisions, e.g.
    ``'{"alias": true, "stages_c": 2}'`` (the keys of ``evtc.Gemm(plan={...})``: policy, c_slot,
    d_slot, epilogue_tile, stages_c, stages_d, reuse, direct, alias)."""

    name = "PLAN"

    def convert(self, value, param, ctx):
        if not isinstance(value, str) or value in ("evtc", "cutlass"):
            return value
        try:
            d = json.loads(value)
        except json.JSONDecodeError as e:
            self.fail(f"'{value}' is neither evtc, cutlass nor a JSON object ({e.msg})", param, ctx)
        if not isinstance(d, dict):
            self.fail(f"'{value}' is not a JSON object of plan decisions", param, ctx)
        return {k: _tuples(v) for k, v in d.items()}


def gemm_options(f):
    """The options every command that makes a Gemm takes."""
    opts = [
        click.argument("spec", required=False),
        click.option("--expr", help='a textual epilogue, e.g. "D = relu(alpha*acc + beta*C + bias[n])"'),
        click.option("--arch", type=click.Choice(["sm90", "sm80"]), default="sm90", show_default=True),
        click.option("--a", "a", type=click.Choice(DTYPE_CHOICES), default="bf16", show_default=True, help="dtype of A"),
        click.option("--b", "b", type=click.Choice(DTYPE_CHOICES), default=None, help="dtype of B (default: A's)"),
        click.option("--c", "c", type=click.Choice(DTYPE_CHOICES), default=None, help="dtype of C (default: D's)"),
        click.option("--d", "d", type=click.Choice(DTYPE_CHOICES), default=None, help="dtype of D (default: bf16)"),
        click.option("--plan", "policy", type=PlanParam(), default="evtc", show_default=True,
                     help="evtc's planner, stock CUTLASS's additive rule (cutlass), or fixed decisions as JSON, "
                          "e.g. '{\"alias\": true, \"stages_c\": 2}'"),
        click.option("--tile", help="CTA tile MxNxK, e.g. 128x256x64"),
        click.option("--cluster", help="cluster MxN, e.g. 2x1"),
        click.option("--schedule", type=click.Choice(["cooperative", "pingpong"]), default=None),
        click.option("--stages", type=int, default=None, help="mainloop stages (default: as many as fit)"),
        click.option("--epilogue-tile", "epi_tile", help="epilogue subtile MxN, e.g. 128x32"),
        click.option("--scheduler", type=click.Choice(["persistent", "streamk"]), default=None),
    ]
    for o in reversed(opts):
        f = o(f)
    return f


def _make_gemm(spec, expr, arch, a, b, c, d, policy, tile, cluster, schedule, stages, epi_tile, scheduler):
    import evtc

    ep = _load_epilogue(spec, expr)
    cfg = _config(arch, a, tile, cluster, schedule, stages, epi_tile, scheduler)
    return evtc.Gemm(ep, a=a, b=b or a, c=c, d=d, arch=arch, config=cfg, plan=policy)


def _fail(err: EvtcError) -> None:
    click.echo(f"evtc: {type(err).__name__}: {err}", err=True)
    sys.exit(2)


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except EvtcError as e:
            if os.environ.get("EVTC_TRACEBACK") == "full":
                raise
            _fail(e)


@click.group(cls=_Group)
@click.version_option(package_name="evtc")
def main() -> None:
    """evtc: compile GEMM epilogues written in Python into fused CUTLASS kernels."""


@main.command()
@gemm_options
@click.option("-o", "--output", type=click.Path(dir_okay=False, writable=True), help="write the .cu here (default: stdout)")
@click.option("--print-includes", is_flag=True, help="print the nvcc -I flags the source needs and exit")
def emit(spec, expr, arch, a, b, c, d, policy, tile, cluster, schedule, stages, epi_tile, scheduler, output, print_includes):
    """Emit the CUDA C++ of a fused GEMM.

    The source compiles on its own into a shared library:
    nvcc -std=c++17 -O3 --expt-relaxed-constexpr -shared -Xcompiler=-fPIC
    -gencode=arch=compute_90a,code=sm_90a $(evtc emit --print-includes) -o k.so k.cu
    """
    if print_includes:
        from evtc.compiler.nvcc import cutlass_include_dirs

        click.echo(" ".join(f"-I{d_}" for d_ in cutlass_include_dirs()))
        return
    g = _make_gemm(spec, expr, arch, a, b, c, d, policy, tile, cluster, schedule, stages, epi_tile, scheduler)
    if output:
        Path(output).write_text(g.source)
        click.echo(f"wrote {output} ({len(g.source.splitlines())} lines): {g.name} for {arch}, "
                   f"epilogue smem {g.plan.epilogue_smem_bytes} B, {g.plan.mainloop_stages} mainloop stages", err=True)
    else:
        click.echo(g.source, nl=False)


@main.command()
@gemm_options
@click.option("--ir", "show_ir", is_flag=True, help="also print the IR after passes")
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
@click.option("--dot", type=click.Path(dir_okay=False), help="write the DAG with buffer placement (graphviz DOT)")
@click.option("--png", type=click.Path(dir_okay=False), help="also render the DOT to PNG (needs graphviz's dot)")
def plan(spec, expr, arch, a, b, c, d, policy, tile, cluster, schedule, stages, epi_tile, scheduler, show_ir, as_json, dot, png):
    """Print the shared-memory plan (and optionally the IR and a picture of the DAG)."""
    g = _make_gemm(spec, expr, arch, a, b, c, d, policy, tile, cluster, schedule, stages, epi_tile, scheduler)
    if as_json:
        click.echo(g.plan.dumps())
    else:
        if show_ir:
            click.echo(str(g.graph))
        _print_plan(g.plan)
    if dot or png:
        from evtc.plan.draw import to_dot

        text = to_dot(g.graph, g.plan)
        dot_path = Path(dot or Path(png).with_suffix(".dot"))
        dot_path.write_text(text)
        click.echo(f"wrote {dot_path}", err=True)
        if png:
            import shutil
            import subprocess

            if shutil.which("dot") is None:
                click.echo("graphviz's 'dot' is not installed: only the .dot file was written", err=True)
            else:
                subprocess.run(["dot", "-Tpng", str(dot_path), "-o", png], check=True)
                click.echo(f"wrote {png}", err=True)


def _print_plan(p) -> None:
    try:
        from rich.console import Console
        from rich.table import Table
    except ImportError:  # pragma: no cover
        click.echo(str(p))
        return
    con = Console()
    cfg = p.config
    con.print(f"[bold]plan ({p.policy})[/bold] for {p.arch}: tile {'x'.join(map(str, cfg.tile))}, "
              f"cluster {'x'.join(map(str, cfg.cluster[:2]))}, {cfg.schedule}")
    if p.arch == "sm90":
        con.print(f"epilogue tile {p.epilogue_tile[0]}x{p.epilogue_tile[1]}, StagesC={p.stages_c}, StagesD={p.stages_d}, "
                  f"ReuseSmemC={p.reuse_smem_c}, DelayTmaStore={p.delay_tma_store}; C slot: {p.c_slot or '(void)'}, D slot: {p.d_slot}")
    t = Table()
    for col in ("buffer", "role", "dtype", "mode", "stages", "bytes", "offset", "shares", "why"):
        t.add_column(col)
    for b_ in p.buffers:
        t.add_row(b_.name, b_.role, b_.dtype.name, b_.mode, str(b_.stages), str(b_.bytes),
                  str(b_.offset) if b_.offset >= 0 else "-", ",".join(b_.shares_with) or "-", b_.why)
    con.print(t)
    con.print(f"epilogue smem {p.epilogue_smem_bytes} B; mainloop {p.mainloop_stages} stages x {p.mainloop_stage_bytes} B; "
              f"capacity {p.smem_capacity} B")
    for n in p.notes:
        con.print(f"note: {n}")


@main.command()
@click.argument("specs", nargs=-1)
@click.option("--arch", type=click.Choice(["sm90", "sm80"]), default="sm90", show_default=True)
@click.option("--a", "a", type=click.Choice(DTYPE_CHOICES), default="bf16", show_default=True)
@click.option("--d", "d", type=click.Choice(DTYPE_CHOICES), default=None)
@click.option("--plan", "policy", type=click.Choice(["evtc", "cutlass"]), default="evtc", show_default=True)
@click.option("-j", "--jobs", type=int, default=None, help="parallel nvcc processes (default: CPU count)")
def build(specs, arch, a, d, policy, jobs):
    """Build one or more epilogues (PATH.py:FUNC ...) in parallel into the cache."""
    import evtc
    from evtc.compiler import build_many

    if not specs:
        raise click.UsageError("give at least one PATH.py:FUNC")
    gemms = [evtc.Gemm(_load_epilogue(s, None), a=a, d=d, arch=arch, plan=policy) for s in specs]
    t0 = time.perf_counter()

    def done(i, res):
        status = f"failed: {res}" if isinstance(res, EvtcError) else ("cached" if res.cached else f"built in {res.seconds:.0f} s")
        click.echo(f"[{time.perf_counter() - t0:6.0f} s] {specs[i]}: {status}", err=True)

    res = build_many([(g.source, g.target, g.name) for g in gemms], workers=jobs, on_done=done)
    failed = [r for r in res if isinstance(r, EvtcError)]
    if failed:
        _fail(failed[0])


@main.command()
@gemm_options
@click.option("--m", "M", type=int, default=4096)
@click.option("--n", "N", type=int, default=4096)
@click.option("--k", "K", type=int, default=4096)
@click.option("--l", "L", type=int, default=1)
@click.option("--seed", type=int, default=0)
def run(spec, expr, arch, a, b, c, d, policy, tile, cluster, schedule, stages, epi_tile, scheduler, M, N, K, L, seed):
    """Build, run on the GPU with random data, and compare with the float64 reference."""
    from evtc.testing import Problem, check

    g = _make_gemm(spec, expr, arch, a, b, c, d, policy, tile, cluster, schedule, stages, epi_tile, scheduler)
    _require_gpu()
    errs = check(g, Problem(M, N, K, L), seed=seed)
    bad = False
    for name, (err, tol) in errs.items():
        ok = err <= tol
        bad |= not ok
        click.echo(f"{name}: relative error {err:.3e} (bound {tol:.1e}) {'ok' if ok else 'FAILED'}")
    sys.exit(1 if bad else 0)


@main.command()
@gemm_options
@click.option("--m", "M", type=int, default=8192)
@click.option("--n", "N", type=int, default=8192)
@click.option("--k", "K", type=int, default=8192)
@click.option("--l", "L", type=int, default=1)
@click.option("--iters", type=int, default=50)
def bench(spec, expr, arch, a, b, c, d, policy, tile, cluster, schedule, stages, epi_tile, scheduler, M, N, K, L, iters):
    """Time the fused GEMM against cuBLAS's plain GEMM (median of CUDA-event timings)."""
    from evtc.bench import bench_gemm

    g = _make_gemm(spec, expr, arch, a, b, c, d, policy, tile, cluster, schedule, stages, epi_tile, scheduler)
    _require_gpu()
    r = bench_gemm(g, M, N, K, L, iters=iters)
    click.echo(json.dumps(r, indent=2))


@main.command()
def ops():
    """List the ops an epilogue can use."""
    from evtc import ops as table

    for name, op in sorted(table.OPS.items()):
        if name in ("first", "convert"):
            continue
        click.echo(f"{name:14s} {op.arity}  {op.functor:40s} {op.doc}")


@main.command()
@click.option("--out-dir", type=click.Path(file_okay=False), default="evtc-demo", show_default=True,
              help="where the emitted source goes")
@click.option("--arch", type=click.Choice(["sm90", "sm80"]), default="sm90", show_default=True)
def demo(out_dir, arch):
    """Run the bundled example end to end: emit, build if nvcc is here, run and verify if a GPU is."""
    from evtc.demo import run_demo

    sys.exit(run_demo(Path(out_dir), arch))


def _require_gpu() -> None:
    from evtc.errors import NoDeviceError

    try:
        import torch
    except ImportError:
        raise NoDeviceError("running needs torch with CUDA", hint="pip install 'evtc[torch]'") from None
    if not torch.cuda.is_available():
        raise NoDeviceError("no CUDA GPU is visible")


from evtc.cli_cache import cache as _cache_commands  # noqa: E402  (the `evtc cache` group)
main.add_command(_cache_commands)

if __name__ == "__main__":
    main()
