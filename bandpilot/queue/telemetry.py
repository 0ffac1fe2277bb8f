"""Does the model still match the fabric? Observed bandwidth next to predictions, and drift.

Jobs report the bandwidth they saw when they end (``queue release JOB --measured-gbps X``), verify
runs add theirs; each is stored beside the prediction it is checked against. The drift monitor takes
the median ``|log(measured / predicted)|`` over the last observations, per host and overall, and
raises a drift event above a threshold (``params/drift.yaml``) - the signal to verify and retrain.
"""

from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

import numpy as np
import sqlalchemy as sa

from bandpilot.errors import StateError
from bandpilot.queue.clock import now
from bandpilot.queue.schema import T_ASSIGN, T_JOBS, T_OBS
from bandpilot.queue.store import Store

SOURCES = ("telemetry", "verify")


def _check_value(v: Any, what: str) -> float:
    try:
        x = float(v)
    except (TypeError, ValueError):
        raise StateError(f"{what}: measured bandwidth must be a number, got {v!r}") from None
    if not math.isfinite(x) or x < 0:
        raise StateError(f"{what}: measured bandwidth must be a finite number >= 0, got {v!r}")
    return x


def observe_jobs(conn: sa.Connection, measured: Mapping[str, Any], ts: float) -> int:
    """Store what active jobs measured, next to their assignment's prediction (inside the caller's
    release transaction: an unknown or already released job raises before anything is written)."""
    rows = []
    for job_id, v in measured.items():
        x = _check_value(v, f"job {job_id!r}")
        job = conn.execute(sa.select(T_JOBS.c.status).where(T_JOBS.c.id == job_id)).scalar()
        if job is None:
            raise StateError(f"telemetry for unknown job {job_id!r}")
        if job != "active":
            raise StateError(f"telemetry for job {job_id!r}, which was already released")
        a = conn.execute(sa.select(T_ASSIGN.c.gpus, T_ASSIGN.c.predicted_gbps).where(T_ASSIGN.c.request_id == job_id)).first()
        if a is None or not a.predicted_gbps:
            continue  # a 1-GPU job has no predicted collective bandwidth: nothing to compare
        gpus = ",".join(json.loads(a.gpus))  # assignments keep a JSON list
        rows.append({"source": "telemetry", "job_id": job_id, "gpus": gpus, "predicted_gbps": float(a.predicted_gbps),
                     "measured_gbps": x, "at": ts})
    if rows:
        conn.execute(sa.insert(T_OBS), rows)
    return len(rows)


def record_observations(store: Store, rows: Sequence[Mapping[str, Any]], source: str = "verify") -> int:
    """Store ``{"gpus": [...], "expected"|"predicted": x, "measured": y}`` rows in one transaction."""
    if source not in SOURCES:
        raise StateError(f"observation source must be one of {SOURCES}, got {source!r}")
    spec, ts, out = store.spec, now(), []
    for i, r in enumerate(rows):
        gpus = list(r.get("gpus") or [])
        for g in gpus:
            spec.parse_gpu(g, f"observation {i}")
        pred = float(r.get("predicted", r.get("expected", 0.0)) or 0.0)
        if len(gpus) < 2 or pred <= 0:
            continue
        out.append({"source": source, "job_id": r.get("job_id"), "gpus": ",".join(gpus), "predicted_gbps": pred,
                    "measured_gbps": _check_value(r.get("measured"), f"observation {i}"), "at": ts})
    with store.write() as conn:
        if out:
            conn.execute(sa.insert(T_OBS), out)
    return len(out)


def drift(store: Store, *, window: int = 200, threshold: float = 0.15, min_observations: int = 5) -> dict[str, Any]:
    """Median |log(measured/predicted)| over the last ``window`` observations, overall and per host;
    ``event`` when either is above ``threshold`` (with at least ``min_observations``)."""
    with store.read() as conn:
        rows = conn.execute(sa.select(T_OBS.c.gpus, T_OBS.c.predicted_gbps, T_OBS.c.measured_gbps)
                            .order_by(T_OBS.c.id.desc()).limit(int(window))).all()
    err = np.array([abs(math.log(max(m, 1e-9) / p)) for _, p, m in rows]) if rows else np.zeros(0)
    hosts: dict[str, list[float]] = {}
    for (gpus, _, _), e in zip(rows, err):
        for h in {g.rpartition(":")[0] for g in gpus.split(",")}:
            hosts.setdefault(h, []).append(float(e))
    per_host = {h: {"observations": len(v), "median_log_error": float(np.median(v))} for h, v in sorted(hosts.items())}
    overall = float(np.median(err)) if err.size else 0.0
    drifting = sorted(h for h, v in per_host.items() if v["observations"] >= min_observations and v["median_log_error"] > threshold)
    event = bool(drifting) or (err.size >= min_observations and overall > threshold)
    return {"observations": int(err.size), "median_log_error": overall, "threshold": threshold, "window": int(window),
            "event": event, "drifting_hosts": drifting, "hosts": per_host}
