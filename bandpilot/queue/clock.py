"""What time is it, and how is a time shown? Epoch seconds in the store, ISO 8601 (UTC) in reports.

A simulation drives the real queue in simulated time: :func:`use_clock` makes :func:`now` return
its clock within the calling thread (a context variable, so parallel simulations on a thread pool
each keep their own), and every time the store writes (start, end, batch) is then simulated time.
"""

from __future__ import annotations

import contextvars
import datetime as _dt
import time
from contextlib import contextmanager
from typing import Callable, Iterator

_CLOCK: contextvars.ContextVar[Callable[[], float] | None] = contextvars.ContextVar("bandpilot_clock", default=None)


def now() -> float:
    clock = _CLOCK.get()
    return time.time() if clock is None else float(clock())


@contextmanager
def use_clock(clock: Callable[[], float]) -> Iterator[None]:
    """Within the block (this thread / task), :func:`now` is ``clock()``."""
    token = _CLOCK.set(clock)
    try:
        yield
    finally:
        _CLOCK.reset(token)


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="milliseconds")
