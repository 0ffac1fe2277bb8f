"""Putting a running job back in the queue, shared by preemption (evicted for a gang) and elastic
suspension (quota 0 at an epoch boundary): both must free the same rows the same way, or a GPU could
stay bound to a job that no longer runs."""
from __future__ import annotations

import math

import sqlalchemy as sa

from bandpilot.queue.schema import T_ASSIGN, T_ESTIMATES, T_GPUS, T_JOBS, T_REQ


def requeue_running(conn: sa.Connection, jid: str, *, reason: str, detail: str,
                    remaining_s: float | None, ts: float) -> bool:
    """Free the job's GPUs (draining ones become unavailable), drop its job and assignment rows, set its
    request pending with ``reason``/``detail`` and, when known, its estimate to the remaining run time.
    False when the job was no longer running: the caller raises so its transaction rolls back."""
    freed = conn.execute(
        sa.update(T_GPUS).where(T_GPUS.c.job_id == jid)
        .values(state=sa.case((T_GPUS.c.drain_pending, "unavailable"), else_="free"),
                job_id=None, drain_pending=False, updated_at=ts)).rowcount
    n_job = conn.execute(sa.delete(T_JOBS).where(T_JOBS.c.id == jid, T_JOBS.c.status == "active")).rowcount
    conn.execute(sa.delete(T_ASSIGN).where(T_ASSIGN.c.request_id == jid))
    n_req = conn.execute(
        sa.update(T_REQ).where(T_REQ.c.id == jid, T_REQ.c.status == "assigned")
        .values(status="pending", reason=reason, detail=detail, updated_at=ts)).rowcount
    if not freed or n_job != 1 or n_req != 1:
        return False
    if remaining_s is not None and math.isfinite(remaining_s) and remaining_s > 0:
        conn.execute(sa.delete(T_ESTIMATES).where(T_ESTIMATES.c.request_id == jid))
        conn.execute(sa.insert(T_ESTIMATES).values(request_id=jid, expected_s=float(remaining_s)))
    return True
