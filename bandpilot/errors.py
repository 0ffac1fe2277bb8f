"""Error types. Every user-facing failure is one line naming what and where.

Why a hierarchy: the CLI catches :class:`BandPilotError` and prints ``error: <msg>``
with a non-zero exit, while genuine bugs still surface as tracebacks.
"""

from __future__ import annotations


class BandPilotError(Exception):
    """Base class for expected, user-facing errors (bad input, bad config). ``code`` names the
    kind of failure for machines (the API maps codes to HTTP statuses in one table); a subclass
    sets its default, a raise site may pass a more precise one."""

    code: str = "error"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        # One line only: multi-line messages break log scraping and the CLI contract.
        super().__init__(" ".join(str(message).split()))
        if code is not None:
            self.code = code


class SpecError(BandPilotError):
    """A cluster spec or params file is malformed or inconsistent."""

    code = "invalid_spec"


class DataError(BandPilotError):
    """A measurement table, log or dataset is malformed."""

    code = "invalid_data"


class StateError(BandPilotError):
    """A cluster state (free GPUs, active jobs) is invalid or does not allow the operation
    (``conflict``); ``not_found`` when the job, request, GPU or host named does not exist."""

    code = "conflict"


class RequestError(BandPilotError):
    """A GPU request cannot be served as asked (k out of range, constraint unknown):
    ``invalid_request``; ``not_pending`` / ``duplicate_id`` where the queue's state refuses it."""

    code = "invalid_request"


class PlacementError(RequestError):
    """A request that cannot be placed. ``reason`` is one of ``insufficient_gpus``,
    ``constraint_unmet`` (defer and retry later) or ``invalid_request`` (reject)."""

    REASONS = ("insufficient_gpus", "constraint_unmet", "invalid_request")

    def __init__(self, reason: str, message: str) -> None:
        if reason not in self.REASONS:
            raise ValueError(f"unknown placement error reason {reason!r}")
        super().__init__(message, code=reason)
        self.reason = reason


class ModelError(BandPilotError):
    """A model URI cannot be resolved or does not fit the cluster."""

    code = "model_error"


def one_of(value: str, choices: tuple[str, ...], what: str, error: type[Exception] = RequestError) -> str:
    """``value`` if it is one of ``choices``, else ``error`` naming ``what`` and the choices (the
    one-line message every mode flag and config key gives)."""
    if value not in choices:
        raise error(f"unknown {what} {value!r}: use one of {', '.join(choices)}")
    return value
