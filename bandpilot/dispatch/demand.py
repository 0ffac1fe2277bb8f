"""How hard does a running job press on the NICs it shares? The demand model, a stated assumption.

The contention formula (:mod:`bandpilot.dispatch.contention`) charges every contending job ``j``
a *pressure* ``p_j`` against the shared capacity. Two models, one used everywhere at once (the
dispatcher's predictor through the queue's stored job demand, and the simulator's truth):

* ``full`` - ``p_j = d_j``, the job's standalone bandwidth, all the time: every co-tenant talks
  continuously. Overstates contention for a job that spends 30 % of its time in collectives.
* ``comm`` - ``p_j = f_j · d_j`` with ``f_j`` the job's communication fraction: its time-averaged
  pressure, collectives not aligned between jobs. A job that gives no fraction presses fully.

The candidate's own demand stays ``d_S``: while it communicates it wants its full bandwidth; only
the co-tenants' load is averaged over time.
"""

from __future__ import annotations

import math

import numpy as np

DEMAND_MODELS = ("full", "comm")
DEFAULT_DEMAND = "full"


class DemandModelError(ValueError):
    pass


def check_demand_model(model: str) -> str:
    if model not in DEMAND_MODELS:
        raise DemandModelError(f"unknown demand model {model!r}: use one of {', '.join(DEMAND_MODELS)}")
    return model


def pressure_factor(comm_fraction: float | None, model: str) -> float:
    """Multiplier of a job's standalone bandwidth that it presses on shared NICs with."""
    check_demand_model(model)
    if model == "full" or comm_fraction is None or not math.isfinite(comm_fraction):
        return 1.0
    return float(min(1.0, max(0.0, comm_fraction)))


def pressure(standalone: np.ndarray, comm_fractions: np.ndarray, model: str) -> np.ndarray:
    """Vectorised :func:`pressure_factor` × standalone (NaN fraction = not given = full)."""
    check_demand_model(model)
    solo = np.asarray(standalone, dtype=float)
    if model == "full":
        return solo.copy()
    f = np.asarray(comm_fractions, dtype=float)
    return solo * np.where(np.isfinite(f), np.clip(f, 0.0, 1.0), 1.0)
