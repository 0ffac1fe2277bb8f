"""How does a running elastic job change size? A resize is the job's next assignment *generation*,
written in ONE transaction: the GPUs it gives up are freed, the ones it gains are taken with a
compare-and-set (``state = 'free'``), ``bp_assignments`` / ``bp_jobs`` are rewritten to the new set and
``bp_generations`` + ``bp_audit`` get a row each. A crash (even ``kill -9``) mid-resize leaves the old
generation or the new one, never a mix; no GPU is ever held by two generations because a GPU row
has one owner and the old set is released in the same statement sequence that takes the new one.

Generation 0 is the batch's assignment (in ``bp_assignments`` only); generation ``n >= 1`` is the
``n``-th resize.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import sqlalchemy as sa

from bandpilot.errors import RequestError, StateError
from bandpilot.queue.clock import now
from bandpilot.queue.schema import T_ASSIGN, T_AUDIT, T_GEN, T_GPUS, T_JOBS, T_REQ
from bandpilot.queue.store import Store

@dataclass(frozen=True)
class Resize:
    job: str
    gpus: tuple[str, ...]  # the new generation's GPUs
    epoch: int | None = None
    predicted_gbps: float | None = None
    demand_gbps: float | None = None  # the job's pressure at its new size (None: scaled by size)


def current_generations(conn: sa.Connection, ids: Sequence[str]) -> dict[str, int]:
    """Latest generation per job id (jobs never resized are absent: generation 0)."""
    out: dict[str, int] = {}
    ids = list(ids)
    q = sa.select(T_GEN.c.request_id, sa.func.max(T_GEN.c.generation)).group_by(T_GEN.c.request_id)
    for i in range(0, len(ids), 500):
        out.update({r: int(g) for r, g in conn.execute(q.where(T_GEN.c.request_id.in_(ids[i : i + 500])))})
    return out


def apply_resize(conn: sa.Connection, rz: Resize, ts: float, actor: str,
                 between: Callable[[], None] | None = None) -> dict[str, Any]:
    """Resize one running job inside the caller's transaction (checked against its size range and
    the free GPUs); the caller commits, so a batch of resizes lands whole or not at all."""
    new = list(dict.fromkeys(rz.gpus))
    if len(new) != len(rz.gpus) or not new:
        raise RequestError(f"job {rz.job!r}: a resize needs a non-empty list of distinct GPUs")
    row = conn.execute(
        sa.select(T_REQ.c.status, T_REQ.c.k, T_REQ.c.min_k, T_REQ.c.max_k, T_REQ.c.k_step, T_ASSIGN.c.gpus, T_JOBS.c.demand_gbps)
        .join(T_ASSIGN, T_ASSIGN.c.request_id == T_REQ.c.id).join(T_JOBS, T_JOBS.c.id == T_REQ.c.id)
        .where(T_REQ.c.id == rz.job)
    ).first()
    if row is None or row.status != "assigned":
        raise StateError(f"job {rz.job!r} is not running: only running jobs can be resized")
    lo = row.k if row.min_k is None else row.min_k
    hi = row.k if row.max_k is None else row.max_k
    step = row.k_step or 1
    k = len(new)
    if not lo <= k <= hi or (k - lo) % step:
        raise RequestError(f"job {rz.job!r}: size {k} is outside its elastic range {lo}..{hi} (step {step})")
    old = json.loads(row.gpus)
    gone = sorted(set(old) - set(new))
    added = sorted(set(new) - set(old))
    if gone:
        n = conn.execute(sa.update(T_GPUS).where(T_GPUS.c.id.in_(gone), T_GPUS.c.job_id == rz.job)
                         .values(state="free", job_id=None, updated_at=ts)).rowcount
        if n != len(gone):
            raise StateError(f"job {rz.job!r}: only {n} of the {len(gone)} GPUs it gives up were its own")
    if between is not None:
        between()
    if added:
        n = conn.execute(sa.update(T_GPUS).where(T_GPUS.c.id.in_(added), T_GPUS.c.state == "free")
                         .values(state="busy", job_id=rz.job, updated_at=ts)).rowcount
        if n != len(added):
            raise StateError(f"job {rz.job!r}: only {n} of the {len(added)} GPUs it grows onto are free")
    demand = rz.demand_gbps if rz.demand_gbps is not None else float(row.demand_gbps) * k / max(1, len(old))
    conn.execute(sa.update(T_ASSIGN).where(T_ASSIGN.c.request_id == rz.job)
                 .values(gpus=json.dumps(new), predicted_gbps=rz.predicted_gbps))
    conn.execute(sa.update(T_JOBS).where(T_JOBS.c.id == rz.job).values(k=k, demand_gbps=demand))
    gen = int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(T_GEN.c.generation), 0))
                           .where(T_GEN.c.request_id == rz.job)).scalar_one()) + 1
    reason = "grow" if k > len(old) else "shrink" if k < len(old) else "move"
    conn.execute(sa.insert(T_GEN).values(request_id=rz.job, generation=gen, k=k, gpus=json.dumps(new), previous_k=len(old),
                                         epoch=rz.epoch, predicted_gbps=rz.predicted_gbps, reason=reason, at=ts))
    detail = {"generation": gen, "from_k": len(old), "to_k": k, "epoch": rz.epoch, "added": added, "released": gone}
    conn.execute(sa.insert(T_AUDIT).values(at=ts, actor=actor[:200], action="resize", target=rz.job, outcome="ok",
                                           detail=json.dumps(detail, sort_keys=True)[:4000]))
    return {"job": rz.job, "generation": gen, "k": k, "previous_k": len(old), "added": added, "released": gone}


def resize(store: Store, resizes: Sequence[Resize] | Resize, *, actor: str = "scheduler",
           between: Callable[[], None] | None = None) -> list[dict[str, Any]]:
    """Apply resizes in ONE transaction, shrinks first (so a grow may take what another job gave
    up); any failure rolls every one of them back. Returns one summary per resize. ``between()``
    runs inside the transaction after a job's old GPUs are freed and before its new ones are taken
    (the crash tests' window for ``kill -9`` mid-resize)."""
    items = [resizes] if isinstance(resizes, Resize) else list(resizes)
    if not items:
        return []
    ts = now()
    with store.write() as conn:
        olds = {r: len(json.loads(g)) for r, g in conn.execute(
            sa.select(T_ASSIGN.c.request_id, T_ASSIGN.c.gpus).where(T_ASSIGN.c.request_id.in_([r.job for r in items])))}
        items.sort(key=lambda r: len(r.gpus) - olds.get(r.job, 0))  # shrinks first
        return [apply_resize(conn, rz, ts, actor, between) for rz in items]


def generation_history(store: Store, job: str) -> list[dict[str, Any]]:
    with store.read() as conn:
        rows = conn.execute(sa.select(T_GEN).where(T_GEN.c.request_id == job).order_by(T_GEN.c.generation)).mappings().all()
    return [{**dict(r), "gpus": json.loads(r["gpus"])} for r in rows]


def elastic_doc(r: Mapping[Any, Any]) -> dict[str, Any]:
    """The elastic range of a request row (empty for a fixed gang)."""
    if r.get("min_k") is None and r.get("max_k") is None:
        return {}
    return {"min_k": r["min_k"] if r["min_k"] is not None else r["k"],
            "max_k": r["max_k"] if r["max_k"] is not None else r["k"], "k_step": r.get("k_step") or 1}
