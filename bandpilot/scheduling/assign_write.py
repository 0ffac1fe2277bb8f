"""How is one assignment written? Compare-and-set statements inside a savepoint, so a lost race
touches nothing (the batch loop and the elastic rounds both write through here)."""

from __future__ import annotations

import json
from typing import Any

import sqlalchemy as sa

from bandpilot.dispatch.demand import DEFAULT_DEMAND, pressure_factor
from bandpilot.queue.requests import Request
from bandpilot.queue.schema import T_ASSIGN, T_GPUS, T_JOBS, T_REQ


class AssignConflict(Exception):
    """The GPUs picked were taken meanwhile: the savepoint is rolled back."""


_ASSIGN_REQ = (
    sa.update(T_REQ)
    .where(T_REQ.c.id == sa.bindparam("b_id"), T_REQ.c.status == "pending")
    .values(status="assigned", reason=None, detail=None, attempts=T_REQ.c.attempts + 1,
            last_batch=sa.bindparam("b_batch"), updated_at=sa.bindparam("b_now"))
)
_TAKE_GPUS = (
    sa.update(T_GPUS)
    .where(T_GPUS.c.id.in_(sa.bindparam("b_gpus", expanding=True)), T_GPUS.c.state == "free")
    .values(state="busy", job_id=sa.bindparam("b_job"), updated_at=sa.bindparam("b_now"))
)
_INS_JOB = sa.insert(T_JOBS)
_INS_ASSIGN = sa.insert(T_ASSIGN)


def write_assignment(
    conn: sa.Connection, req: Request, sel: Any, batch_id: int | None, ts: float,
    model_uri: str | None, model_version: str | None, algorithm: str, demand: str = DEFAULT_DEMAND,
) -> str:
    """Assign inside a savepoint: 'assigned', 'skipped' (no longer pending) or raise AssignConflict.
    Order matters: request CAS first (nothing touched if it lost), the job row before the GPUs
    that reference it, then the GPU CAS whose row count must equal k."""
    gpus = list(sel.gpus)
    with conn.begin_nested():
        if conn.execute(_ASSIGN_REQ, {"b_id": req.id, "b_batch": batch_id, "b_now": ts}).rowcount != 1:
            return "skipped"
        standalone = float(getattr(sel, "standalone_gbps", None) or 0.0)
        # the job's pressure on shared NICs under the demand model: what later predictions charge it
        pressed = standalone * pressure_factor(req.comm_fraction, demand)
        conn.execute(_INS_JOB, {"id": req.id, "tenant": req.tenant, "k": req.k, "demand_gbps": pressed,
                                "status": "active", "started_at": ts, "ended_at": None})
        n = conn.execute(_TAKE_GPUS, {"b_gpus": gpus, "b_job": req.id, "b_now": ts}).rowcount
        if n != len(gpus):
            raise AssignConflict(f"only {n} of {len(gpus)} GPUs were still free")
        conn.execute(_INS_ASSIGN, {
            "request_id": req.id, "batch_id": batch_id, "gpus": json.dumps(gpus),
            "predicted_gbps": num(getattr(sel, "predicted_gbps", None)), "standalone_gbps": standalone,
            "algorithm": str(getattr(sel, "algorithm", None) or algorithm), "model_uri": model_uri,
            "model_version": model_version, "search_ms": num(getattr(sel, "search_ms", None)),
            "evaluations": count(getattr(sel, "evaluations", None)), "assigned_at": ts,
            **_rank_map(getattr(sel, "placement", None)),
        })
    return "assigned"


def _rank_map(placement: dict | None) -> dict[str, str | None]:
    if not placement:
        return {"ranks": None, "placement": None}
    figures = {k: v for k, v in placement.items() if k != "ranks"}
    return {"ranks": json.dumps(placement["ranks"]), "placement": json.dumps(figures, sort_keys=True)}


def num(v: Any) -> float | None:
    return None if v is None else float(v)


def count(v: Any) -> int | None:
    return None if v is None else int(v)

