"""What a command was asked to build: the GEMM options every command shares, parsed once.

Input: the command line's SPEC (``PATH.py:FUNC``) or ``--expr``, and the options that describe
the GEMM (arch, dtypes, plan, configuration). Output: a frozen :class:`GemmRequest` that the
commands (:mod:`evtc.cli.commands`) pass on, and the click decorator (:func:`gemm_request`) and
parameter types that collect it; a command never spells those options out.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib.util
import json
import os
import sys
from pathlib import Path
from typing import Any, Callable

import click

from evtc import knobs
from evtc.errors import EvtcError

__all__ = ["ARCH_CHOICES", "DTYPE_CHOICES", "SPEC_HELP", "CliError", "GemmRequest", "gemm_request", "load_epilogue"]

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


def grouped_gemm(request: GemmRequest, member: str):
    """``evtc.GroupedGemm`` for ``request`` (traced, planned and emitted; not built): the family
    member ``member``, or, when configuration options are given, that configuration.

    Raises:
        EvtcError: the epilogue has no grouped form (reductions), or the configuration is wrong.
        click.UsageError: ``--arch sm80`` (the grouped kernel is sm90's) or a planner option.
    """
    import evtc

    if request.arch != "sm90":
        raise click.UsageError("--grouped is an sm90 kernel (CUTLASS's pointer-array GEMM); drop --arch sm80")
    if request.plan != "evtc":
        raise click.UsageError("--grouped plans its epilogue itself (C and D in the collective, other M x N tensors "
                               "register-direct): drop --plan")
    fields = request.config_fields()
    config = evtc.GemmConfig(**{"cluster": (1, 1, 1), **fields}) if fields else None
    return evtc.GroupedGemm(request.epilogue(), a=request.a, b=request.b or request.a, c=request.c, d=request.d,
                            member=None if fields else member, config=config)


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
    if p.is_dir() or value.endswith(("/", os.sep)):  # Path("new/") is Path("new"): a file would be written
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


def _no_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """``json.loads``' object hook: a key given twice is an error (json keeps the last silently)."""
    seen: set[str] = set()
    for k, _ in pairs:
        if k in seen:
            raise ValueError(f"the key '{k}' is given twice")
        seen.add(k)
    return dict(pairs)


def _short_int(token: str) -> int:
    """``json.loads``' integer hook: no plan decision has a number of 100 digits (Python's own
    refusal, past 4300, would suggest sys.set_int_max_str_digits)."""
    if len(token) > 100:
        raise ValueError(f"a number of {len(token)} digits")
    return int(token)


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
            d = json.loads(value, object_pairs_hook=_no_repeated_keys, parse_int=_short_int)
        except (ValueError, RecursionError) as e:  # JSONDecodeError, a key given twice, 5000 digits; nesting
            why = e.msg if isinstance(e, json.JSONDecodeError) else "nested too deeply" \
                if isinstance(e, RecursionError) else str(e)
            self.fail(f"'{value:.80}{'...' if len(value) > 80 else ''}' is neither evtc, cutlass nor a JSON object "
                      f"({why})", param, ctx)
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
