"""The ``evtc`` command line: emit, plan, build, run, bench, knobs, ops, errors, demo, cache.

Input: an epilogue given as ``PATH.py:FUNC`` (an ``@evtc.epilogue`` function in a Python file)
or ``--expr "D = relu(alpha*acc + beta*C + bias[n])"``, plus options. Output: files (``.cu``,
``.dot``, ``.json``, ``.svg``/``.png``) and reports on the terminal.

The options that describe the GEMM (epilogue, arch, dtypes, plan, configuration) are collected
once, by the :func:`gemm_request` decorator, into a frozen :class:`GemmRequest` that the
commands pass on; a command never spells them out.

Every failure (an evtc error, a bad option, a file that can't be written) prints
``evtc: <what>`` and exits with status 2, without a Python traceback; set
``EVTC_TRACEBACK=full`` to see one. ``evtc run`` exits 1 when a result is outside its bound.

Modules: :mod:`~evtc.cli.request` (the request and its options), :mod:`~evtc.cli.commands` (the
``main`` group and its commands), :mod:`~evtc.cli.cache` (``evtc cache``), :mod:`~evtc.cli.demo`
(``evtc demo``). ``main`` is the ``evtc`` console script and ``python -m evtc``.
"""

from evtc.cli.commands import main, nvcc_command, print_plan
from evtc.cli.request import SPEC_HELP, CliError, GemmRequest, gemm_request, load_epilogue

__all__ = ["SPEC_HELP", "CliError", "GemmRequest", "gemm_request", "load_epilogue", "main", "nvcc_command",
           "print_plan"]
