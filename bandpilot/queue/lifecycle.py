"""How do jobs end and hardware leave or rejoin the pool? Release, drain and undrain."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import sqlalchemy as sa

from bandpilot.errors import SpecError, StateError
from bandpilot.queue.clock import now
from bandpilot.queue.schema import T_GPUS, T_JOBS, T_REQ
from bandpilot.queue.store import Store
from bandpilot.queue.telemetry import observe_jobs
from bandpilot.topology.cluster import ClusterSpec

_REL_JOB = (
    sa.update(T_JOBS)
    .where(T_JOBS.c.id == sa.bindparam("b_id"), T_JOBS.c.status == "active")
    .values(status="released", ended_at=sa.bindparam("b_now"))
)
_REL_GPUS_SEL = (
    sa.select(T_GPUS.c.id, T_GPUS.c.drain_pending)
    .where(T_GPUS.c.job_id == sa.bindparam("b_id"))
    .order_by(T_GPUS.c.id)
    .with_for_update()
)
_REL_GPUS = (
    sa.update(T_GPUS)
    .where(T_GPUS.c.job_id == sa.bindparam("b_id"))
    .values(
        state=sa.case((T_GPUS.c.drain_pending, "unavailable"), else_="free"),
        job_id=None, drain_pending=False, updated_at=sa.bindparam("b_now"),
    )
)
_REL_REQ = (
    sa.update(T_REQ)
    .where(T_REQ.c.id == sa.bindparam("b_id"), T_REQ.c.status == "assigned")
    .values(status="released", updated_at=sa.bindparam("b_now"))
)


def release(store: Store, job_id: str, measured_gbps: float | None = None) -> dict[str, Any]:
    """End a job: its GPUs return to the free pool (or become unavailable if drained meanwhile).
    ``measured_gbps``: the bandwidth the job saw, stored next to its prediction (drift monitor)."""
    return release_many(store, [job_id], None if measured_gbps is None else {job_id: measured_gbps})[0]


def release_many(store: Store, job_ids: Sequence[str], measured: Mapping[str, Any] | None = None) -> list[dict[str, Any]]:
    """Release several jobs in one transaction (all or none: an unknown or finished job aborts)."""
    ts = now()
    out = []
    with store.write() as conn:
        if measured:
            extra = sorted(set(measured) - set(job_ids))
            if extra:
                raise StateError(f"telemetry for jobs that are not being released: {extra[:3]}")
            observe_jobs(conn, measured, ts)
        for job_id in job_ids:
            p = {"b_id": job_id, "b_now": ts}
            if conn.execute(_REL_JOB, p).rowcount != 1:
                st = conn.execute(sa.select(T_JOBS.c.status).where(T_JOBS.c.id == job_id)).scalar()
                if st is None:
                    req = conn.execute(sa.select(T_REQ.c.status).where(T_REQ.c.id == job_id)).scalar()
                    hint = f" (request {job_id!r} is {req})" if req else ""
                    raise StateError(f"no active job {job_id!r}{hint}", code="conflict" if hint else "not_found")
                raise StateError(f"job {job_id!r} was already released")
            rows = conn.execute(_REL_GPUS_SEL, p).all()  # row locks on PostgreSQL
            conn.execute(_REL_GPUS, p)
            conn.execute(_REL_REQ, p)
            out.append({"job": job_id, "freed": [g for g, d in rows if not d], "unavailable": [g for g, d in rows if d]})
    return out


def resolve_targets(spec: ClusterSpec, target: str) -> list[str]:
    """A GPU id, a host name or a domain name -> GPU ids."""
    if ":" in target:
        try:
            spec.parse_gpu(target)
        except SpecError as exc:
            raise StateError(str(exc)) from None
        return [target]
    if target in spec.host_index:
        h = spec.hosts[spec.host_index[target]]
        return [f"{h.name}:{i}" for i in range(h.n_gpus)]
    dom = [h for h in spec.hosts if h.domain == target]
    if dom:
        return [f"{h.name}:{i}" for h in dom for i in range(h.n_gpus)]
    raise StateError(f"unknown GPU, host or domain {target!r} in cluster {spec.name!r}", code="not_found")


def drain(store: Store, target: str, reason: str | None = None) -> dict[str, list[str]]:
    """Take a GPU, host or domain out of the free pool. Free GPUs become unavailable now; busy ones
    stay with their job and become unavailable when it is released."""
    ids = resolve_targets(store.spec, target)
    with store.write() as conn:
        return drain_ids(store, conn, ids, reason)


def drain_ids(store: Store, conn: sa.Connection, ids: Sequence[str], reason: str | None) -> dict[str, list[str]]:
    """:func:`drain` of GPU ids inside the caller's write transaction."""
    ts = now()
    store.lock_gpus(conn, ids)
    rows = conn.execute(sa.select(T_GPUS.c.id, T_GPUS.c.state, T_GPUS.c.drain_pending).where(T_GPUS.c.id.in_(ids))).all()
    now_off = [g for g, s, _ in rows if s == "free"]
    later = [g for g, s, d in rows if s == "busy" and not d]
    already = [g for g, s, d in rows if s == "unavailable" or (s == "busy" and d)]
    if now_off:
        conn.execute(
            sa.update(T_GPUS).where(T_GPUS.c.id.in_(now_off), T_GPUS.c.state == "free")
            .values(state="unavailable", note=reason, updated_at=ts)
        )
    if later:
        conn.execute(
            sa.update(T_GPUS).where(T_GPUS.c.id.in_(later), T_GPUS.c.state == "busy")
            .values(drain_pending=True, note=reason, updated_at=ts)
        )
    order = {g: i for i, g in enumerate(ids)}
    key = order.__getitem__
    return {"drained": sorted(now_off, key=key), "pending": sorted(later, key=key), "already": sorted(already, key=key)}


def undrain(store: Store, target: str) -> dict[str, list[str]]:
    """Return drained hardware to the free pool (and cancel pending drains of busy GPUs)."""
    ids = resolve_targets(store.spec, target)
    with store.write() as conn:
        return undrain_ids(store, conn, ids)


def undrain_ids(store: Store, conn: sa.Connection, ids: Sequence[str]) -> dict[str, list[str]]:
    """:func:`undrain` of GPU ids inside the caller's write transaction."""
    ts = now()
    store.lock_gpus(conn, ids)
    rows = conn.execute(sa.select(T_GPUS.c.id, T_GPUS.c.state, T_GPUS.c.drain_pending).where(T_GPUS.c.id.in_(ids))).all()
    back = [g for g, s, _ in rows if s == "unavailable"]
    kept = [g for g, s, d in rows if s == "busy" and d]
    if back:
        conn.execute(
            sa.update(T_GPUS).where(T_GPUS.c.id.in_(back), T_GPUS.c.state == "unavailable")
            .values(state="free", note=None, updated_at=ts)
        )
    if kept:
        conn.execute(sa.update(T_GPUS).where(T_GPUS.c.id.in_(kept)).values(drain_pending=False, note=None, updated_at=ts))
    order = {g: i for i, g in enumerate(ids)}
    return {"undrained": sorted(back, key=order.__getitem__), "cancelled": sorted(kept, key=order.__getitem__)}
