"""How far along is long work? Stages the library opens and a reporter the caller installs.

Long steps (profiling, training, sweeps, evaluation) open a stage and advance it::

    with stage(f"profile {spec.name}", total=len(todo), unit="runs") as st:
        for m in todo:
            ...
            st.advance()

Nothing is printed: without an installed :class:`Reporter` a stage only counts. The command line
installs one that prints a line per stage (or draws rich bars on a terminal); a program embedding
the library may install its own (``with use(MyReporter()): ...``) or none.

The reporter is process-wide while its ``use`` block runs (orchestrators run steps on worker
threads, where a context variable set by the caller would not be seen); nesting depth is per thread.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager
from typing import Iterator

__all__ = ["Reporter", "Stage", "begin", "stage", "use", "current"]


class Reporter:
    """Receives stage events; this base class ignores them. Calls come from the thread that runs
    the stage; implementations that draw should be thread-safe."""

    def started(self, st: "Stage") -> None:
        pass

    def advanced(self, st: "Stage") -> None:
        pass

    def finished(self, st: "Stage", error: BaseException | None) -> None:
        pass


class Stage:
    """One named step: ``done`` of ``total`` units (``total`` None: not countable)."""

    def __init__(self, name: str, total: int | None = None, unit: str = "", depth: int = 0) -> None:
        self.name = name
        self.total = total
        self.unit = unit
        self.depth = depth
        self.done = 0
        self.started_at = time.monotonic()
        self._reporter: Reporter | None = None
        self._ended = False

    def end(self, error: BaseException | None = None) -> None:
        """Finish the stage (once); ``error``: what ended it early."""
        if self._ended:
            return
        self._ended = True
        _local.depth = self.depth
        if self._reporter is not None:
            self._reporter.finished(self, error)

    def advance(self, n: int = 1) -> None:
        self.done += n
        if self._reporter is not None:
            self._reporter.advanced(self)

    @property
    def elapsed(self) -> float:
        return time.monotonic() - self.started_at

    def __repr__(self) -> str:
        return f"Stage({self.name!r}, {self.done}/{self.total})"


_reporter: Reporter | None = None
_lock = threading.Lock()
_local = threading.local()


def current() -> Reporter | None:
    return _reporter


@contextmanager
def use(reporter: Reporter | None) -> Iterator[Reporter | None]:
    """Install ``reporter`` for the duration of the block (the previous one comes back after)."""
    global _reporter
    with _lock:
        before, _reporter = _reporter, reporter
    try:
        yield reporter
    finally:
        with _lock:
            _reporter = before


def begin(name: str, total: int | None = None, unit: str = "") -> Stage:
    """Open a stage by hand (for code that cannot wrap its work in ``with stage(...)``); close it
    with :meth:`Stage.end`, passing the exception that ended it, if any."""
    depth = getattr(_local, "depth", 0)
    st = Stage(name, total, unit, depth)
    st._reporter = _reporter
    if st._reporter is not None:
        st._reporter.started(st)
    _local.depth = depth + 1
    return st


@contextmanager
def stage(name: str, total: int | None = None, unit: str = "") -> Iterator[Stage]:
    """Open a stage; it is finished (or failed, when the block raises) on exit."""
    st = begin(name, total, unit)
    try:
        yield st
    except BaseException as exc:
        st.end(exc)
        raise
    st.end()
