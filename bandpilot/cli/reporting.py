"""Progress the command line shows for long work (:mod:`bandpilot.progress` stages).

* :class:`LineReporter` - no terminal (CI, pipes, ``make run > log``): a line when a stage starts
  (with the last run's duration as the estimate), a line at most every ``interval`` seconds while a
  countable stage runs (done/total, elapsed, time left at the current rate) and one when it ends.
* :class:`RichReporter` - a terminal: a rich bar per running stage; the same start/done lines stay.

Stage durations are remembered in ``.bandpilot/progress-history.json`` under the project, so the
next run can say how long a stage took last time before it has any progress of its own.
"""

from __future__ import annotations

import json
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Callable, TextIO

from bandpilot.config import settings
from bandpilot import progress
from bandpilot.io import write_text_atomic

HISTORY_FILE = "progress-history.json"


def clock_text(seconds: float) -> str:
    """``1:40``, ``1:02:03``."""
    s = max(0, int(round(seconds)))
    h, rest = divmod(s, 3600)
    m, s = divmod(rest, 60)
    return f"{h}:{m:02d}:{s:02d}" if h else f"{m}:{s:02d}"


def default_history() -> Path:
    from bandpilot.config import project_root

    return project_root() / ".bandpilot" / HISTORY_FILE


class _History:
    """Last duration per stage name (a small JSON file; unreadable -> no estimates)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self.last: dict[str, float] = {}
        if path is not None and path.is_file():
            try:
                doc = json.loads(path.read_text())
                self.last = {str(k): float(v) for k, v in doc.items()} if isinstance(doc, dict) else {}
            except (OSError, ValueError, TypeError):
                self.last = {}

    def record(self, name: str, seconds: float) -> None:
        if self.path is None:
            return
        self.last[name] = round(seconds, 1)
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            write_text_atomic(self.path, json.dumps(self.last, indent=1, sort_keys=True) + "\n")
        except OSError:  # estimates are a convenience: never fail the work over them
            pass


class _Base(progress.Reporter):
    def __init__(self, clock: Callable[[], float] = time.monotonic, history: Path | None = None) -> None:
        self.clock = clock
        self.t0 = clock()
        self.history = _History(history)
        self.lock = threading.Lock()
        self.begun: dict[int, float] = {}

    def _stamp(self) -> str:
        return f"[{clock_text(self.clock() - self.t0):>5}]"

    def _head(self, st: progress.Stage) -> str:
        return f"{self._stamp()} {'  ' * st.depth}{st.name}"

    def _start_line(self, st: progress.Stage) -> str:
        parts = []
        if st.total is not None:
            parts.append(f"{st.total} {st.unit}".strip())
        last = self.history.last.get(st.name)
        est = f" (~{clock_text(last)} last run)" if last is not None else ""
        return self._head(st) + (f": {', '.join(parts)}" if parts else "") + est

    def _end_line(self, st: progress.Stage, error: BaseException | None) -> str:
        took = self.clock() - self.begun.pop(id(st), self.clock())
        if error is None:
            self.history.record(st.name, took)
            return f"{self._head(st)}: done in {clock_text(took)}"
        if isinstance(error, KeyboardInterrupt):
            return f"{self._head(st)}: interrupted after {clock_text(took)}"
        return f"{self._head(st)}: failed after {clock_text(took)}"

    def _progress_line(self, st: progress.Stage) -> str:
        took = self.clock() - self.begun.get(id(st), self.clock())
        text = f"{self._head(st)}: {st.done}/{st.total} {st.unit}".rstrip() + f", {clock_text(took)} elapsed"
        if st.total and 0 < st.done < st.total:
            text += f", ~{clock_text(took / st.done * (st.total - st.done))} left"
        return text


class LineReporter(_Base):
    """Plain lines for logs: start, at most one progress line per ``interval`` seconds, end."""

    def __init__(self, stream: TextIO | None = None, *, clock: Callable[[], float] = time.monotonic,
                 interval: float = 30.0, history: Path | None = None) -> None:
        super().__init__(clock, history)
        self.stream = stream or sys.stderr
        self.interval = float(interval)
        self.said: dict[int, float] = {}

    def _say(self, line: str) -> None:
        self.stream.write(line + "\n")
        self.stream.flush()

    def started(self, st: progress.Stage) -> None:
        with self.lock:
            self.begun[id(st)] = self.said[id(st)] = self.clock()
            self._say(self._start_line(st))

    def advanced(self, st: progress.Stage) -> None:
        with self.lock:
            now = self.clock()
            if st.total is None or st.done >= st.total or now - self.said.get(id(st), now) < self.interval:
                return
            self.said[id(st)] = now
            self._say(self._progress_line(st))

    def finished(self, st: progress.Stage, error: BaseException | None) -> None:
        with self.lock:
            self.said.pop(id(st), None)
            self._say(self._end_line(st, error))


class RichReporter(_Base):
    """A rich progress bar per running stage on a terminal; start and done lines scroll above."""

    def __init__(self, console: Any = None, *, clock: Callable[[], float] = time.monotonic,
                 history: Path | None = None) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn

        super().__init__(clock, history)
        self.console = console or Console(stderr=True)
        # "done/total unit" only for countable stages (rich's M/N column would show "0/?")
        self.bars = Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), TextColumn("{task.fields[count]}"),
                             TimeElapsedColumn(), TimeRemainingColumn(), console=self.console, transient=True)
        self.tasks: dict[int, Any] = {}

    def started(self, st: progress.Stage) -> None:
        with self.lock:
            self.begun[id(st)] = self.clock()
            self.bars.console.print(self._start_line(st), markup=False, highlight=False)
            if not self.tasks:
                self.bars.start()
            self.tasks[id(st)] = self.bars.add_task(("  " * st.depth) + st.name, total=st.total, count=self._count(st))

    def advanced(self, st: progress.Stage) -> None:
        with self.lock:
            task = self.tasks.get(id(st))
            if task is not None:
                self.bars.update(task, completed=st.done, count=self._count(st))

    @staticmethod
    def _count(st: progress.Stage) -> str:
        return f"{st.done}/{st.total} {st.unit}".rstrip() if st.total is not None else ""

    def finished(self, st: progress.Stage, error: BaseException | None) -> None:
        with self.lock:
            task = self.tasks.pop(id(st), None)
            if task is not None:
                self.bars.remove_task(task)
            self.bars.console.print(self._end_line(st, error), markup=False, highlight=False)
            if not self.tasks:
                self.bars.stop()


def shown(show: bool) -> Any:
    """For a command's ``--progress/--no-progress``: the installed reporter, or none in the block."""
    from contextlib import nullcontext

    return nullcontext() if show else progress.use(None)


def make_reporter(stream: TextIO | None = None, *, history: Path | None | str = "default") -> progress.Reporter | None:
    """Bars on a terminal, lines elsewhere (``CI`` set counts as elsewhere); ``BANDPILOT_PROGRESS``
    = ``bars`` | ``lines`` | ``off`` overrides."""
    stream = stream or sys.stderr
    hist = default_history() if history == "default" else history
    mode = (settings().progress or "").strip().lower()
    if mode in ("off", "0", "none", "false"):
        return None
    tty = bool(getattr(stream, "isatty", lambda: False)())
    if mode == "bars" or (mode != "lines" and tty and not os.environ.get("CI")):
        from rich.console import Console

        return RichReporter(Console(file=stream, force_terminal=True), history=hist)  # type: ignore[arg-type]
    return LineReporter(stream, history=hist)  # type: ignore[arg-type]
