"""A progress bar for builds that take more than a second.

Input: the number of kernels to build and a notice as each one finishes. Output: a rich progress
bar on stderr (kernels done / total, elapsed time, the last kernel finished), shown only once the
build has taken ``delay`` seconds, so cache hits print nothing.

Shown when stderr is a terminal; ``EVTC_PROGRESS=1`` forces it (e.g. in CI logs), ``EVTC_PROGRESS=0``
turns it off.
"""

from __future__ import annotations


import sys
import threading

from evtc import knobs

__all__ = ["BuildProgress"]


def _enabled() -> bool:
    flag = knobs.progress.get()
    if flag != "auto":
        return flag == "1"
    try:
        return sys.stderr.isatty()
    except (AttributeError, ValueError):
        return False


class BuildProgress:
    """A context manager that shows a bar for ``total`` kernels after ``delay`` seconds.

    Args:
        total: kernels to build.
        what: what the bar says (``"building"``).
        delay: seconds before the bar appears.
        enabled: override the terminal/``EVTC_PROGRESS`` rule.

    Example::

        with BuildProgress(len(jobs)) as bar:
            for job in jobs:
                ...
                bar.advance(job.name)
    """

    def __init__(self, total: int, what: str = "building", delay: float = 1.0, enabled: bool | None = None) -> None:
        self.total = total
        self.what = what
        self.delay = delay
        self.enabled = _enabled() if enabled is None else enabled
        self.done = 0
        self.last = ""
        self._lock = threading.Lock()
        self._progress = None
        self._task = None
        self._timer: threading.Timer | None = None
        self._closed = False

    def _start(self) -> None:
        with self._lock:
            if self._closed or self._progress is not None:
                return
            from rich.console import Console
            from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

            self._progress = Progress(SpinnerColumn(), TextColumn("[bold]{task.description}"), BarColumn(),
                                      MofNCompleteColumn(), TextColumn("kernels"), TimeElapsedColumn(),
                                      TextColumn("{task.fields[last]}"), console=Console(stderr=True),
                                      transient=False, redirect_stdout=False, redirect_stderr=False)
            self._task = self._progress.add_task(self.what, total=self.total, completed=self.done, last=self.last)
            self._progress.start()

    def __enter__(self) -> "BuildProgress":
        if self.enabled and self.total > 0:
            self._timer = threading.Timer(self.delay, self._start)
            self._timer.daemon = True
            self._timer.start()
        return self

    def advance(self, name: str = "", ok: bool = True) -> None:
        """One more kernel finished (``ok`` False: it failed)."""
        with self._lock:
            self.done += 1
            self.last = f"{name}{'' if ok else ' (failed)'}"
            if self._progress is not None:
                self._progress.update(self._task, completed=self.done, last=self.last)

    def __exit__(self, *exc) -> None:
        if self._timer is not None:
            self._timer.cancel()
        with self._lock:
            self._closed = True
            if self._progress is not None:
                self._progress.stop()

    @property
    def shown(self) -> bool:
        """Whether the bar appeared."""
        return self._progress is not None
