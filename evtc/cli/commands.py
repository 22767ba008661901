"""The ``evtc`` command group and its commands: emit, plan, build, run, bench, knobs, ops, errors,
demo (and ``cache``, from :mod:`evtc.cli.cache`).

Input: a :class:`~evtc.cli.request.GemmRequest` per command (or none), plus each command's own
options. Output: files (``.cu``, ``.dot``, ``.json``, ``.svg``/``.png``) and reports on the
terminal. Errors: see :mod:`evtc.cli`.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Callable

import click

from evtc import knobs
from evtc.cli.request import ARCH_CHOICES, CliError, GemmRequest, _writable_file, _write, gemm_request
from evtc.errors import EvtcError

__all__ = ["main", "nvcc_command", "print_plan"]


# ---- the group ----------------------------------------------------------------------------------


def _fail(err: EvtcError) -> None:
    click.echo(f"evtc: {type(err).__name__}: {err}", err=True)
    sys.exit(2)


class _Group(click.Group):
    def invoke(self, ctx):
        try:
            return super().invoke(ctx)
        except EvtcError as e:
            if knobs.traceback.get_or_default() == "full":
                raise
            _fail(e)


@click.group(cls=_Group)
@click.version_option(package_name="evtc")
def main() -> None:
    """evtc: compile GEMM epilogues written in Python into fused CUTLASS kernels.

    Most commands take the epilogue as SPEC, PATH.py:FUNC (a function decorated with
    @evtc.epilogue in a Python file), or as --expr "D = relu(alpha*acc + beta*C + bias[n])".
    Errors print a message and exit with status 2.
    """


# ---- emit ---------------------------------------------------------------------------------------


def nvcc_command(arch: str, source: str | Path = "k.cu", output: str | Path | None = None) -> list[str]:
    """The exact nvcc command evtc's builder runs to compile ``source`` into a shared library.

    Args:
        arch: ``sm90`` or ``sm80``.
        source: the ``.cu`` file.
        output: the library (default: ``source`` with ``.so``).

    Raises:
        NoDeviceError: nvcc was not found. BuildError: the CUTLASS headers were not found.
    """
    # NOTE: the one place the CLI asks the compiler for its command line (README and
    # tests/null/test_readme_nvcc.py compare against it).
    from evtc.compiler.nvcc import compile_command
    from evtc.plan.target import get_target

    src = Path(source)
    return compile_command(src, Path(output) if output else src.with_suffix(".so"), get_target(arch).gencode)


@main.command()
@gemm_request()
@click.option("-o", "--output", callback=_writable_file, help="write the .cu here (default: stdout)")
@click.option("--print-includes", is_flag=True,
              help="print the nvcc -I flags the .cu needs (evtc's headers and CUTLASS's) and exit")
@click.option("--print-nvcc", is_flag=True,
              help="print the nvcc command that builds the .cu (-o's, else k.cu) for --arch, exactly as evtc "
                   "builds it, and exit")
@click.option("--fragment", is_flag=True, help="write an epilogue fragment header for another generator's GEMM "
                                               "instead of a whole GEMM (evtc.plugin, docs/plugin.md)")
@click.option("--name", "fragment_name", default="EvtcEpilogue", show_default=True,
              help="with --fragment: the C++ name of the fragment struct")
@click.option("--namespace", default="evtc_fragment", show_default=True, help="with --fragment: its C++ namespace")
@click.option("--conv", "conv_kind", type=click.Choice(["fprop", "dgrad", "wgrad"]), default=None,
              help="fuse the epilogue into an implicit-GEMM convolution of this kind instead (docs/conv.md); "
                   "--tile, --cluster, --schedule cooperative, --scheduler, --stages and --epilogue-tile pin its "
                   "kernel (without them: the default non-persistent 128x128 kernel)")
@click.option("--dims", type=click.IntRange(2, 3), default=2, show_default=True, help="with --conv: 2-D or 3-D")
@click.option("--grouped", type=click.Choice(["pp64x128", "coop128x128", "coop128x256"]), default=None,
              help="emit the grouped (mixture-of-experts) kernel of evtc.GroupedGemm, this family member "
                   "(docs/grouped.md); --tile, --cluster, --schedule, --stages and --epilogue-tile pin another")
def emit(request: GemmRequest, output: Path | None, print_includes: bool, print_nvcc: bool, fragment: bool,
         fragment_name: str, namespace: str, conv_kind: str | None = None, dims: int = 2, grouped: str | None = None):
    """Emit the CUDA C++ of a fused GEMM (or, with --conv, of a fused convolution).

    The .cu compiles on its own into a shared library with a small C ABI; `evtc emit
    --print-nvcc -o k.cu` prints the exact command (the flags evtc's own builds use, -DNDEBUG
    included).
    """
    _check_emit_options(click.get_current_context())
    if print_includes:
        from evtc.compiler.nvcc import include_dirs

        click.echo(" ".join(f"-I{d_}" for d_ in include_dirs()))  # evtc's own headers, then CUTLASS's
        return
    if print_nvcc:
        click.echo(shlex.join(nvcc_command(request.arch, output or "k.cu")))
        return
    if fragment:
        from evtc.plugin.cli import emit_fragment

        return emit_fragment(request, output, fragment_name, namespace, _write)
    if grouped:
        from evtc.cli.request import grouped_gemm

        gg = grouped_gemm(request, grouped)
        name, source, plan = gg.name, gg.source(), gg.kernel().plan
    else:
        g = request.conv(conv_kind, dims) if conv_kind else request.gemm()
        name, source, plan = g.name, g.source, g.plan
    if output:
        _write(output, source)
        click.echo(f"wrote {output} ({len(source.splitlines())} lines): {name} for {request.arch}, "
                   f"epilogue smem {plan.epilogue_smem_bytes} B, {plan.mainloop_stages} mainloop stages", err=True)
    else:
        click.echo(source, nl=False)


#: emit's options that only mean something with another (option -> the one it needs)
_EMIT_NEEDS = {"fragment_name": "fragment", "namespace": "fragment", "dims": "conv_kind"}
#: emit's modes, at most one at a time, and the options each reads besides itself (None: all)
_EMIT_MODES = {"print_includes": (), "print_nvcc": ("arch", "output"), "fragment": None, "conv_kind": None,
               "grouped": None}


def _check_emit_options(ctx: click.Context) -> None:
    """Refuse emit options that conflict or would be ignored (``--conv`` with ``--fragment``,
    ``--dims`` without ``--conv``, an epilogue with ``--print-includes``): a command that quietly
    drops what it was asked for reports success for something it didn't do.

    Raises:
        click.UsageError: naming the options.
    """
    given = {p.name: p for p in ctx.command.params
             if ctx.get_parameter_source(p.name) not in (None, click.core.ParameterSource.DEFAULT)
             and not (p.name == "spec" and not ctx.params.get("spec"))}

    def flag(name: str) -> str:
        p = given[name]
        return p.opts[0] if isinstance(p, click.Option) else p.name.upper()

    modes = [m for m in _EMIT_MODES if m in given and ctx.params.get(m)]
    if len(modes) > 1:
        raise click.UsageError(f"{flag(modes[0])} and {flag(modes[1])} can't be combined")
    for name, needs in _EMIT_NEEDS.items():
        if name in given and needs not in modes:
            raise click.UsageError(f"{flag(name)} only applies with "
                                   f"{next(o for p in ctx.command.params if p.name == needs for o in p.opts)}")
    if modes and _EMIT_MODES[modes[0]] is not None:
        ignored = [flag(n) for n in given if n != modes[0] and n not in _EMIT_MODES[modes[0]]]
        if ignored:
            raise click.UsageError(f"{flag(modes[0])} prints and exits: {', '.join(ignored)} would be ignored")


# ---- plan ---------------------------------------------------------------------------------------


@main.command()
@gemm_request()
@click.option("--ir", "show_ir", is_flag=True, help="also print the IR after passes")
@click.option("--json", "as_json", is_flag=True, help="print the plan as JSON")
@click.option("--svg", callback=_writable_file,
              help="draw the shared-memory map and the DAG coloured by buffer mode into an SVG file")
@click.option("--png", callback=_writable_file, help="the same picture as a PNG file")
@click.option("--dot", callback=_writable_file, help="write the DAG with buffer placement as graphviz DOT")
def plan(request: GemmRequest, show_ir: bool, as_json: bool, svg: Path | None, png: Path | None, dot: Path | None):
    """Print the shared-memory plan: every tensor, where it lives and why.

    The same text as print(gemm.plan), at most 80 columns. --svg/--png draw it (matplotlib;
    no graphviz needed), --dot writes the DAG for graphviz.
    """
    for path, fmt in ((svg, "svg"), (png, "png")):
        if path and path.suffix.lower() != f".{fmt}":  # (draw_plan picks the format from the suffix)
            raise click.UsageError(f"--{fmt} {path}: the picture's format follows the file's suffix; name it "
                                   f"{path.with_suffix('.' + fmt).name}")
    files = [str(p.resolve()) for p in (svg, png, dot) if p]
    if len(set(files)) < len(files):
        raise click.UsageError("--svg, --png and --dot name the same file: each writes its own")
    g = request.gemm()
    if as_json:
        click.echo(g.plan.dumps())
    else:
        if show_ir:
            click.echo(str(g.graph))
        print_plan(g.plan)
    if dot:
        from evtc.plan.draw import to_dot

        _write(dot, to_dot(g.graph, g.plan))
        click.echo(f"wrote {dot}", err=True)
    for path in (svg, png):
        if path:
            from evtc.plan.draw import draw_plan

            try:
                draw_plan(g.graph, g.plan, path)
            except OSError as e:
                raise CliError(f"can't write {path}: {e.strerror or e}") from None
            except ImportError as e:
                raise CliError(f"drawing needs {e.name}: pip install matplotlib networkx") from None
            except ValueError as e:  # a suffix other than .svg/.png
                raise CliError(str(e)) from None
            click.echo(f"wrote {path}", err=True)


def print_plan(p, *, file=None) -> None:
    """Print ``format_plan(p)``; on a terminal, with colour (rich), never re-wrapped."""
    from evtc.plan.model import format_plan

    text = format_plan(p)
    out = file or sys.stdout
    if not (hasattr(out, "isatty") and out.isatty()) or knobs.no_color.raw() is not None:
        click.echo(text, nl=False, file=file)
        return
    from rich.console import Console
    from rich.text import Text

    t = Text(text)
    t.highlight_regex(r"(?m)^plan .*$", "bold")
    t.highlight_regex(r"(?m)^tensor .*$", "bold underline")
    t.highlight_regex(r"smem, TMA", "blue")
    t.highlight_regex(r"\bin \w+(?=\s)", "magenta")
    t.highlight_regex(r"registers|regs, \w+", "dark_orange")
    t.highlight_regex(r"(?m)^(why|note)(?=:)", "bold")
    Console(file=out, soft_wrap=True, highlight=False).print(t, end="")


# ---- build --------------------------------------------------------------------------------------


@main.command()
@gemm_request(many=True)
@click.option("-j", "--jobs", type=click.IntRange(min=1), default=None,
              help="parallel nvcc processes (default: CPU count; an sm90 build needs about 3.6 GB)")
def build(requests: list[GemmRequest], jobs: int | None):
    """Build one or more epilogues in parallel into the kernel cache.

    Each SPEC is built with the same options; a failed build is reported once, with the kept
    source and log, and the command exits with status 2.
    """
    from evtc.compiler import build_many

    gemms = [r.gemm() for r in requests]
    t0 = time.perf_counter()

    def done(i, res):
        status = f"FAILED ({type(res).__name__}, below)" if isinstance(res, EvtcError) else (
            "cached" if res.cached else f"built in {res.seconds:.0f} s")
        click.echo(f"[{time.perf_counter() - t0:6.0f} s] {requests[i].label}: {status}", err=True)

    res = build_many([(g.source, g.target, g.name) for g in gemms], workers=jobs, on_done=done)
    failed = [(r, e) for r, e in zip(requests, res) if isinstance(e, EvtcError)]
    for r, e in failed:
        click.echo(f"evtc: {r.label}: {type(e).__name__}: {e}", err=True)
    if failed:
        sys.exit(2)


# ---- run, bench ---------------------------------------------------------------------------------


def _problem_options(m: int, n: int, k: int) -> Callable:
    def decorate(f):
        for o in reversed([
            click.option("--m", "M", type=click.IntRange(min=1), default=m, show_default=True, help="rows of A, D"),
            click.option("--n", "N", type=click.IntRange(min=1), default=n, show_default=True, help="rows of B, columns of D"),
            click.option("--k", "K", type=click.IntRange(min=1), default=k, show_default=True, help="the reduction extent"),
            click.option("--l", "L", type=click.IntRange(min=1), default=1, show_default=True, help="batch count"),
        ]):
            f = o(f)
        return f

    return decorate


@main.command()
@gemm_request()
@_problem_options(4096, 4096, 4096)
@click.option("--seed", type=int, default=0, show_default=True)
def run(request: GemmRequest, M: int, N: int, K: int, L: int, seed: int):
    """Build, run on the GPU with random data, and compare with the float64 reference.

    Exits 1 when an output is outside its error bound.
    """
    from evtc.testing import Problem, check

    g = request.gemm()
    _require_gpu()
    errs = check(g, Problem(M, N, K, L), seed=seed)
    bad = False
    for r in errs.values():
        bad |= not r.ok
        click.echo(r.summary())
    sys.exit(1 if bad else 0)


@main.command()
@gemm_request()
@_problem_options(8192, 8192, 8192)
@click.option("--iters", type=click.IntRange(min=1), default=50, show_default=True)
def bench(request: GemmRequest, M: int, N: int, K: int, L: int, iters: int):
    """Time the fused GEMM against cuBLAS's plain GEMM (median of CUDA-event timings)."""
    from evtc.testing.bench import bench_gemm

    g = request.gemm()
    _require_gpu()
    r = bench_gemm(g, M, N, K, L, iters=iters)
    click.echo(json.dumps(r, indent=2))


def _require_gpu() -> None:
    from evtc.errors import NoDeviceError

    try:
        import torch
    except ImportError:
        raise NoDeviceError("running needs torch with CUDA (evtc makes the random inputs with torch)",
                            hint="pip install 'evtc[torch]'") from None
    if not torch.cuda.is_available():
        raise NoDeviceError("no CUDA GPU is visible to torch")


# ---- ops, errors, demo --------------------------------------------------------------------------


@main.command(name="knobs")
def knobs_command():
    """List every environment variable evtc reads: type, default, current value, what it does.

    Declared once, in evtc/knobs.py; docs/knobs.md is generated from the same table.
    """
    from evtc import knobs as k

    rows = k.table()
    width = max(len(r["name"]) for r in rows)
    for r in rows:
        value = f" = {r['value']}" if r["value"] else ""
        default = f" (default {r['default']})" if r["default"] else ""
        click.echo(f"{r['name'].ljust(width)}  {r['kind']}{default}{value}")
        click.echo(f"{' ' * width}  {r['doc']}")


@main.command()
@click.option("--cpp", is_flag=True, help="also show the op-table name and C++ functor of each")
def ops(cpp: bool):
    """List what an epilogue can use: operators, evtc.* functions, reductions, conversion.

    Generated from the op table (evtc/ops.py); docs/language.md is generated from the same.
    """
    from evtc.language import entries

    heads = {
        "operator": "operators (in Python and in --expr)",
        "function": "functions: evtc.NAME(...) in Python, NAME(...) in --expr",
        "reduction": "reductions, returned as outputs (dim=1: over N, dim=0: over M, none: both)",
        "quantization": "quantization, returned as two outputs (Python epilogues only)",
        "conversion": "conversion",
    }
    rows = entries()
    width = max(len(e.text if e.kind != "operator" else e.python) for e in rows)
    kind = None
    for e in rows:
        if e.kind != kind:
            kind = e.kind
            click.echo(heads[kind])
        spelled = e.python if e.kind in ("operator", "quantization", "conversion") else e.text
        line = f"  {spelled.ljust(width)}  {e.doc}"
        if cpp:
            line += f"  [{e.op}{': ' + e.functor if e.functor else ''}]"
        click.echo(line)


@main.command()
@click.argument("anchor", required=False)
def errors(anchor: str | None):
    """Explain an error: print the section of the errors page that an error message names.

    Every evtc error message ends with "see docs/errors.md#ANCHOR"; `evtc errors ANCHOR`
    prints that section from the copy of docs/errors.md installed with evtc. Without ANCHOR,
    list the anchors and print where the page is.
    """
    from evtc.resources import data_path

    page = data_path("docs", "errors.md")
    if anchor is None:
        text = page.read_text()
        anchors = [line[3:].strip() for line in text.splitlines() if line.startswith("## ")]
        click.echo(f"{page}\n")
        click.echo("anchors: " + ", ".join(a for a in anchors if a != "Reading an error"))
        return
    section = _section(page.read_text(), anchor.lstrip("#"))
    if section is None:
        raise click.UsageError(f"docs/errors.md has no section '{anchor}' (run `evtc errors` for the list)")
    click.echo(_plain(section))


def _plain(markdown: str) -> str:
    """The page's text as a terminal shows it: without its HTML comments (the ``<!-- gen: ... -->``
    markers of docs/gen_docs.py) and the blank lines they leave."""
    import re

    text = re.sub(r"^[ \t]*<!--.*?-->[ \t]*(\n|$)", "", markdown, flags=re.S | re.M)  # a comment line goes
    text = re.sub(r"<!--.*?-->", "", text, flags=re.S)  # an inline comment leaves the text around it
    return re.sub(r"\n{3,}", "\n\n", text)


def _section(markdown: str, anchor: str) -> str | None:
    """The ``## anchor`` section of a markdown page, heading included, or None."""
    out: list[str] = []
    for line in markdown.splitlines():
        if line.startswith("## "):
            if out:
                break
            if line[3:].strip() == anchor:
                out.append(line)
        elif out:
            out.append(line)
    return "\n".join(out).rstrip() + "\n" if out else None


def _out_dir(value: str) -> Path:
    """``demo --out-dir``: a folder name (an empty one was Path(''), the current folder, written into
    without being named), checked before the demo traces, plans or builds anything: a folder, or a
    new one in a folder that exists (``emit -o``'s rule: evtc makes no folders above it)."""
    if not value.strip():
        raise click.BadParameter("an empty name is no folder; give one (or '.' for the current folder)")
    p = Path(value)
    if p.exists() and not p.is_dir():
        raise click.BadParameter(f"{value} exists and is not a folder")
    parent = p.parent if str(p.parent) else Path(".")
    if not p.exists() and not parent.is_dir():
        raise click.BadParameter(f"the folder {parent} does not exist")
    if not os.access(p if p.exists() else parent, os.W_OK):
        raise click.BadParameter(f"the folder {p if p.exists() else parent} is not writable")
    return p


@main.command()
@click.option("--out-dir", callback=lambda c, p, v: _out_dir(v), default="evtc-demo", show_default=True,
              help="where the emitted source and the pictures go")
@click.option("--arch", type=click.Choice(ARCH_CHOICES), default="sm90", show_default=True)
def demo(out_dir: Path, arch: str):
    """Run the bundled example end to end: emit, build if nvcc is here, run and verify if a GPU is."""
    from evtc.cli.demo import run_demo

    try:
        status = run_demo(out_dir, arch)
    except OSError as e:
        raise CliError(f"can't write into {out_dir}: {e.strerror or e}") from None
    sys.exit(status)


from evtc.cli.cache import cache as _cache_commands  # noqa: E402  (the `evtc cache` group)

main.add_command(_cache_commands)
