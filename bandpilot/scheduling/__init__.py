"""Stage 6, scheduling: what runs where and when. Queue policies and quotas, the placer (one
request against an in-memory state, through the dispatcher) and the batch loop that writes the
decisions into the durable queue (:mod:`bandpilot.queue`) in one transaction. Reservations,
preemption and elastic resizes are plans added here, on top of the store.

The names below are loaded on first use: a command that only names a profile
needs :mod:`~bandpilot.scheduling.profile`, and the batch loop's imports (the queue store, SQLAlchemy) cost a command that
never runs a batch about a second of start-up on a busy machine."""

from __future__ import annotations

import importlib
from typing import Any

_LAZY = {
    "COMMIT_MODES": "batch", "check_model": "batch", "model_version_of": "batch", "run_batch": "batch",
    "BatchReport": "outcomes", "Outcome": "outcomes",
    "POLICIES": "policies", "order_pending": "policies", "utility_prior": "policies", "utility_quotas": "policies",
    "PROFILES": "profile", "ProfileError": "profile", "SchedulerProfile": "profile", "get_profile": "profile",
    "load_profile": "profile",
}

__all__ = sorted([*_LAZY, "DEMAND_MODELS"])


def __getattr__(name: str) -> Any:
    if name == "DEMAND_MODELS":
        from bandpilot.dispatch.demand import DEMAND_MODELS

        return DEMAND_MODELS
    mod = _LAZY.get(name)
    if mod is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{mod}"), name)
    globals()[name] = value
    return value
