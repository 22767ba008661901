"""The ``evtc`` command line: emit, plan, build, run, bench, ops, errors, demo.

Input: an epilogue given as ``PATH.py:FUNC`` (an ``@evtc.epilogue`` function in a Python file)
or ``--expr "D = relu(alpha*acc + beta*C + bias[n])"``, plus options. Output: files (``.cu``,
``.dot``, ``.json``, ``.svg``/``.png``) and reports on the terminal.

The options that describe the GEMM (epilogue, arch, dtypes, plan, configuration) are collected
once, by the :func:`gemm_request` decorator, into a frozen :class:`GemmRequest` that the
commands pass on; a command never spells them out.

Every failure (an evtc error, a bad option, a file that can't be written) prints
``evtc: <what>`` and exits with status 2, without a Python traceback; set
``EVTC_TRACEBACK=full`` to see one. ``evtc run`` exits 1 when a result is outside its bound.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Callable

import click

from evtc import knobs
from evtc.errors import EvtcError

__all__ = ["GemmRequest", "gemm_request", "main", "nvcc_command"]

DTYPE_CHOICES = ["f32", "f16", "bf16", "e4m3", "e5m2"]
ARCH_CHOICES = ["sm90", "sm80"]

#: The paragraph every command that takes an epilogue adds to its --help.
SPEC_HELP = """
SPEC names the epilogue: PATH.py:FUNC, a function decorated with @evtc.epilogue in a Python
file (for example examples/epilogues.py:bias_relu), or leave it out and give --expr with the
expression form, for example --expr "D = relu(alpha*acc + beta*C + bias[n])" (docs/ir.md).
"""


class CliError(click.ClickException):
    """A command failed for a reason that is not an :class:`EvtcError` (a file that can't be
    written, an epilogue file that doesn't import): printed as ``evtc: <message>``, status 2."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"evtc: {self.format_message()}", err=True)


# ---- the request --------------------------------------------------------------------------------


def _tuples(x):
    return tuple(_tuples(v) for v in x) if isinstance(x, list) else x


@dataclasses.dataclass(frozen=True)
class GemmRequest:
    """What a command was asked to build: the epilogue and everything ``evtc.Gemm`` takes.

    Attributes:
        spec: ``PATH.py:FUNC``, or None with ``expr``.
        expr: a textual epilogue (``evtc.from_expr``), or None.
        arch: ``sm90`` or ``sm80``.
        a, b, c, d: dtype names (``b`` defaults to ``a``; ``c``, ``d`` to the epilogue's).
        plan: ``evtc``, ``cutlass``, or fixed planner decisions as sorted (key, value) pairs
            (the keys of ``evtc.Gemm(plan={...})``).
        tile: CTA tile (M, N, K), or None for the default.
        cluster: cluster (M, N), or None.
        schedule: ``cooperative``/``pingpong``, or None.
        stages: mainloop stages, or None for as many as fit.
        epilogue_tile: (M, N), or None for the planner's choice.
        scheduler: ``persistent``/``streamk``, or None.
    """

    spec: str | None = None
    expr: str | None = None
    arch: str = "sm90"
    a: str = "bf16"
    b: str | None = None
    c: str | None = None
    d: str | None = None
    plan: str | tuple[tuple[str, Any], ...] = "evtc"
    tile: tuple[int, int, int] | None = None
    cluster: tuple[int, int] | None = None
    schedule: str | None = None
    stages: int | None = None
    epilogue_tile: tuple[int, int] | None = None
    scheduler: str | None = None

    @property
    def label(self) -> str:
        """How the epilogue was named on the command line."""
        return self.spec or f'--expr "{self.expr}"'

    def epilogue(self):
        """The ``@evtc.epilogue`` object named by ``spec``, or the ``expr`` string.

        Raises:
            click.UsageError: no epilogue given; ``spec`` is not ``PATH.py:FUNC``; the file or
                the name doesn't exist; the name is not an epilogue.
            CliError: the file failed to import.
        """
        if self.expr:
            return self.expr
        if not self.spec:
            raise click.UsageError("give an epilogue as PATH.py:FUNC or with --expr (see --help)")
        return load_epilogue(self.spec)

    def config_fields(self) -> dict[str, Any]:
        """The configuration options given on the command line, as GemmConfig fields."""
        fields: dict[str, Any] = {}
        if self.tile:
            fields["tile"] = self.tile
        if self.cluster:
            fields["cluster"] = (*self.cluster, 1)
        for key in ("schedule", "stages", "epilogue_tile", "scheduler"):
            if getattr(self, key) is not None:
                fields[key] = getattr(self, key)
        return fields

    @property
    def plan_arg(self) -> str | dict[str, Any]:
        """``plan=`` of evtc.Gemm and evtc.Conv: the policy name or the fixed decisions."""
        return self.plan if isinstance(self.plan, str) else dict(self.plan)

    def config(self):
        """The GemmConfig: the arch's default with the options given (validated by Gemm)."""
        from evtc import dtypes
        from evtc.plan.config import default_config

        cfg = default_config(self.arch, dtypes.by_name(self.a), dtypes.by_name(self.b or self.a))
        changes = self.config_fields()
        return cfg.replace(**changes) if changes else cfg

    def conv(self, kind: str, dims: int):
        """``evtc.Conv`` of ``kind`` for this request, pinned to the configuration options given
        (every one goes to :func:`evtc.conv.conv_config`, which refuses what a conv kernel doesn't
        take, e.g. ``--schedule pingpong`` or an sm80 ``--cluster``), or a family Conv without any.

        Raises:
            EvtcError: the epilogue or the configuration is wrong.
        """
        import evtc

        return evtc.Conv(self.epilogue(), kind=kind, dims=dims, a=self.a, b=self.b or self.a, c=self.c, d=self.d,
                         arch=self.arch, config=self.config_fields() or None, plan=self.plan_arg)

    def gemm(self):
        """``evtc.Gemm`` for this request (traced, planned and emitted; not built).

        Raises:
            EvtcError: the epilogue or the configuration is wrong (located at the user's line).
        """
        import evtc

        return evtc.Gemm(self.epilogue(), a=self.a, b=self.b or self.a, c=self.c, d=self.d, arch=self.arch,
                         config=self.config(), plan=self.plan_arg)


def load_epilogue(spec: str):
    """The epilogue ``FUNC`` of the file ``PATH.py`` named by ``spec`` (``PATH.py:FUNC``)."""
    from evtc.frontend.epilogue import Epilogue

    if ":" not in spec:
        raise click.UsageError(f"'{spec}' is not PATH.py:FUNC (or use --expr)")
    path_s, func = spec.rsplit(":", 1)
    path = Path(path_s)
    if not path.is_file():
        raise click.UsageError(f"no such file: {path}")
    mod_name = f"evtc_user_{path.stem}"
    mspec = importlib.util.spec_from_file_location(mod_name, path)
    if mspec is None or mspec.loader is None:
        raise click.UsageError(f"can't import {path}: not a Python file")
    module = importlib.util.module_from_spec(mspec)
    sys.modules[mod_name] = module
    sys.path.insert(0, str(path.resolve().parent))
    try:
        mspec.loader.exec_module(module)
    except EvtcError:
        raise
    except SystemExit as e:  # sys.exit() at import: nothing was emitted, so never status 0
        raise CliError(f"importing {path} called sys.exit({e.code!r}): the module must only define the "
                       "epilogue (guard a script's own code with `if __name__ == \"__main__\":`)") from None
    except Exception as e:  # the user's module is broken: say so, without our traceback
        if knobs.traceback.get_or_default() == "full":
            raise
        raise CliError(f"importing {path} failed: {type(e).__name__}: {e}") from None
    finally:
        sys.path.pop(0)
    names = [n for n, v in vars(module).items() if isinstance(v, Epilogue)]
    listing = f"; epilogues there: {', '.join(names)}" if names else f"; {path} defines no @evtc.epilogue"
    if not hasattr(module, func):
        raise click.UsageError(f"{path} has no '{func}'{listing}")
    obj = getattr(module, func)
    if not isinstance(obj, Epilogue):
        import inspect

        if not inspect.isfunction(obj):
            raise click.UsageError(f"{path}:{func} is a {type(obj).__name__}, not an epilogue function{listing}")
    return obj


# ---- option parsing -----------------------------------------------------------------------------


def _dims(n: int, example: str):
    """A click callback parsing ``AxBxC`` into ``n`` positive ints."""

    def parse(ctx, param, text):
        if text is None:
            return None
        try:
            vals = tuple(int(x) for x in text.lower().split("x"))
        except ValueError:
            raise click.BadParameter(f"'{text}' is not like {example}") from None
        if len(vals) != n:
            raise click.BadParameter(f"'{text}' needs {n} numbers, like {example}")
        if any(v <= 0 for v in vals):
            raise click.BadParameter(f"'{text}': every extent must be a positive number, like {example}")
        return vals

    return parse


def _writable_file(ctx, param, value):
    """A click callback: an output file whose folder exists (checked before any work is done)."""
    if value is None:
        return None
    p = Path(value)
    if p.is_dir():
        raise click.BadParameter(f"{value} is a folder; give a file name")
    parent = p.parent if str(p.parent) else Path(".")
    if not parent.is_dir():
        raise click.BadParameter(f"the folder {parent} does not exist")
    if not os.access(parent, os.W_OK):
        raise click.BadParameter(f"the folder {parent} is not writable")
    return p


def _write(path: Path, data: str | bytes) -> None:
    try:
        if isinstance(data, bytes):
            path.write_bytes(data)
        else:
            path.write_text(data)
    except OSError as e:
        raise CliError(f"can't write {path}: {e.strerror or e}") from None


#: ``--plan``'s example in its help (tests/null/test_cli.py runs every example of the help)
PLAN_EXAMPLE = '{"reuse": true, "stages_c": 2}'


class PlanParam(click.ParamType):
    """``--plan``: ``evtc``, ``cutlass``, or a JSON object of fixed planner decisions, e.g.
    ``'{"reuse": true, "stages_c": 2}'`` (the keys of ``evtc.Gemm(plan={...})``:
    :data:`evtc.plan.config.PLAN_DECISIONS`), checked by key and type as ``evtc.Gemm`` checks
    them (:func:`evtc.plan.config.check_plan_decisions`: ``"direct": "X"`` is no list of names,
    ``true`` is no number of stages)."""

    name = "PLAN"

    def convert(self, value, param, ctx):
        if not isinstance(value, str) or value in ("evtc", "cutlass"):
            return value
        from evtc.plan.config import check_plan_decisions

        try:
            d = json.loads(value)
        except json.JSONDecodeError as e:
            self.fail(f"'{value}' is neither evtc, cutlass nor a JSON object ({e.msg})", param, ctx)
        if not isinstance(d, dict):
            self.fail(f"'{value}' is not a JSON object of plan decisions", param, ctx)
        try:
            check_plan_decisions(d)
        except EvtcError as e:
            self.fail(f"{e.message} ({e.hint})" if e.hint else e.message, param, ctx)
        return tuple(sorted((k, _tuples(v)) for k, v in d.items()))


_REQUEST_FIELDS = tuple(f.name for f in dataclasses.fields(GemmRequest))


def gemm_request(many: bool = False) -> Callable:
    """Decorator for a command that makes a Gemm: adds SPEC and the GEMM options, and calls the
    command with ``request`` (a :class:`GemmRequest`) instead of them; with ``many``, SPEC may be
    repeated and the command gets ``requests`` (one per SPEC, or one for ``--expr``).

    Also appends :data:`SPEC_HELP` to the command's help.
    """

    opts = [
        click.argument("spec", nargs=-1 if many else 1, required=False, metavar="[SPEC]..." if many else "[SPEC]"),
        click.option("--expr", help='a textual epilogue instead of SPEC, e.g. "D = relu(alpha*acc + beta*C + bias[n])"'),
        click.option("--arch", type=click.Choice(ARCH_CHOICES), default="sm90", show_default=True,
                     help="sm90 (Hopper, TMA warp-specialized) or sm80 (Ampere, register-only)"),
        click.option("--a", "a", type=click.Choice(DTYPE_CHOICES), default="bf16", show_default=True, help="dtype of A"),
        click.option("--b", "b", type=click.Choice(DTYPE_CHOICES), default=None, help="dtype of B (default: A's)"),
        click.option("--c", "c", type=click.Choice(DTYPE_CHOICES), default=None, help="dtype of C (default: D's)"),
        click.option("--d", "d", type=click.Choice(DTYPE_CHOICES), default=None, help="dtype of D (default: bf16)"),
        click.option("--plan", "plan", type=PlanParam(), default="evtc", show_default=True,
                     help="sm90: evtc's planner, stock CUTLASS's additive rule (cutlass), or fixed decisions as "
                          f"JSON, e.g. '{PLAN_EXAMPLE}'"),
        click.option("--tile", callback=_dims(3, "128x256x64"), help="CTA tile MxNxK, e.g. 128x256x64"),
        click.option("--cluster", callback=_dims(2, "2x1"), help="cluster MxN, e.g. 2x1"),
        click.option("--schedule", type=click.Choice(["cooperative", "pingpong"]), default=None,
                     help="sm90 kernel schedule (default: cooperative)"),
        click.option("--stages", type=click.IntRange(min=1), default=None,
                     help="mainloop stages (default: as many as fit)"),
        click.option("--epilogue-tile", "epilogue_tile", callback=_dims(2, "128x32"),
                     help="epilogue subtile MxN, e.g. 128x32 (default: the planner's choice)"),
        click.option("--scheduler", type=click.Choice(["persistent", "streamk", "batch_inner"]), default=None,
                     help="tile scheduler (default: persistent)"),
    ]

    def decorate(f):
        @functools.wraps(f)
        def command(**kw):
            fields = {k: kw.pop(k) for k in _REQUEST_FIELDS if k in kw}
            specs = fields.pop("spec")
            base = GemmRequest(**fields)
            if specs and base.expr:
                raise click.UsageError("give SPEC or --expr, not both")
            if base.arch != "sm90" and base.plan != "evtc":
                raise click.UsageError(f"--plan chooses sm90's shared-memory plan; {base.arch} kernels have none "
                                       "(leave --plan out)")
            if not many:
                return f(request=dataclasses.replace(base, spec=specs), **kw)
            requests = [dataclasses.replace(base, spec=s) for s in specs] if specs else [base]
            return f(requests=requests, **kw)

        for o in reversed(opts):
            command = o(command)
        command.__doc__ = (f.__doc__ or "").rstrip() + "\n\n" + SPEC_HELP.strip()
        return command

    return decorate


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
def emit(request: GemmRequest, output: Path | None, print_includes: bool, print_nvcc: bool, fragment: bool,
         fragment_name: str, namespace: str, conv_kind: str | None = None, dims: int = 2):
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
    if conv_kind:
        g = request.conv(conv_kind, dims)
    else:
        g = request.gemm()
    if output:
        _write(output, g.source)
        click.echo(f"wrote {output} ({len(g.source.splitlines())} lines): {g.name} for {request.arch}, "
                   f"epilogue smem {g.plan.epilogue_smem_bytes} B, {g.plan.mainloop_stages} mainloop stages", err=True)
    else:
        click.echo(g.source, nl=False)


#: emit's options that only mean something with another (option -> the one it needs)
_EMIT_NEEDS = {"fragment_name": "fragment", "namespace": "fragment", "dims": "conv_kind"}
#: emit's modes, at most one at a time, and the options each reads besides itself (None: all)
_EMIT_MODES = {"print_includes": (), "print_nvcc": ("arch", "output"), "fragment": None, "conv_kind": None}


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
        "conversion": "conversion",
    }
    rows = entries()
    width = max(len(e.text if e.kind != "operator" else e.python) for e in rows)
    kind = None
    for e in rows:
        if e.kind != kind:
            kind = e.kind
            click.echo(heads[kind])
        spelled = e.python if e.kind in ("operator", "conversion") else e.text
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


@main.command()
@click.option("--out-dir", callback=lambda c, p, v: Path(v), default="evtc-demo", show_default=True,
              help="where the emitted source and the pictures go")
@click.option("--arch", type=click.Choice(ARCH_CHOICES), default="sm90", show_default=True)
def demo(out_dir: Path, arch: str):
    """Run the bundled example end to end: emit, build if nvcc is here, run and verify if a GPU is."""
    from evtc.demo import run_demo

    try:
        status = run_demo(out_dir, arch)
    except OSError as e:
        raise CliError(f"can't write into {out_dir}: {e.strerror or e}") from None
    sys.exit(status)


from evtc.cli_cache import cache as _cache_commands  # noqa: E402  (the `evtc cache` group)
main.add_command(_cache_commands)

if __name__ == "__main__":
    main()
