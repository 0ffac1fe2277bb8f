"""What time is it, and how is a time shown? Epoch seconds in the store, ISO 8601 (UTC) in reports."""

from __future__ import annotations

import datetime as _dt
import time


def now() -> float:
    return time.time()


def iso(ts: float | None) -> str | None:
    if ts is None:
        return None
    return _dt.datetime.fromtimestamp(ts, _dt.timezone.utc).isoformat(timespec="milliseconds")
