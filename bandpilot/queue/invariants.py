"""Is the store consistent? Every cross-table invariant the queue promises, read in one snapshot."""

from __future__ import annotations

import json

import sqlalchemy as sa

from bandpilot.dispatch.state import State
from bandpilot.errors import StateError
from bandpilot.queue.schema import T_ASSIGN, T_GEN, T_GPUS, T_JOBS, T_REQ, T_RESERVE
from bandpilot.queue.store import Store


def check_invariants(store: Store) -> list[str]:
    """Every cross-table invariant the queue promises; returns the violations (empty = consistent)."""
    spec = store.spec
    bad: list[str] = []
    with store.read() as conn:
        gpus = conn.execute(sa.select(T_GPUS.c.id, T_GPUS.c.state, T_GPUS.c.job_id, T_GPUS.c.drain_pending)).all()
        jobs = {r.id: r for r in conn.execute(sa.select(T_JOBS)).all()}
        reqs = {r.id: r for r in conn.execute(sa.select(T_REQ)).all()}
        assigns = {r.request_id: r for r in conn.execute(sa.select(T_ASSIGN)).all()}
        state = store.load_state(conn)
        reserved = conn.execute(sa.select(T_RESERVE.c.request_id, T_RESERVE.c.gpus)).all()
        latest = {r.request_id: r for r in conn.execute(sa.select(T_GEN).order_by(T_GEN.c.generation)).all()}
    if sorted(g.id for g in gpus) != sorted(spec.gpu_ids):
        bad.append("GPU rows do not match the cluster spec")
    held: dict[str, set[str]] = {}
    for g in gpus:
        if (g.state == "busy") != (g.job_id is not None):
            bad.append(f"GPU {g.id} is {g.state} with job {g.job_id!r}")
        if g.job_id is not None:
            held.setdefault(g.job_id, set()).add(g.id)
            j = jobs.get(g.job_id)
            if j is None or j.status != "active":
                bad.append(f"GPU {g.id} is held by job {g.job_id!r} which is not active")
        if g.drain_pending and g.state != "busy":
            bad.append(f"GPU {g.id} has a pending drain but is {g.state}")
    owner: dict[str, str] = {}
    for rid, a in assigns.items():
        r = reqs.get(rid)
        if r is None or r.status not in ("assigned", "released"):
            bad.append(f"assignment for request {rid!r} whose status is {getattr(r, 'status', None)!r}")
        j = jobs.get(rid)
        if j is None:
            bad.append(f"assigned request {rid!r} has no job")
            continue
        ag = json.loads(a.gpus)
        if len(ag) != j.k or len(set(ag)) != j.k:
            bad.append(f"job {rid!r} was assigned {len(ag)} GPUs for k={j.k}")
        if j.status == "active":
            if set(ag) != held.get(rid, set()):
                bad.append(f"active job {rid!r} holds {sorted(held.get(rid, set()))} but was assigned {ag}")
            for gid in ag:
                if gid in owner:
                    bad.append(f"GPU {gid} is assigned to active jobs {owner[gid]!r} and {rid!r}")
                owner[gid] = rid
    for rid, r in reqs.items():
        if r.status in ("assigned", "released") and rid not in assigns:
            bad.append(f"request {rid!r} is {r.status} without an assignment")
        if r.status in ("pending", "rejected", "cancelled") and (rid in assigns or rid in jobs):
            bad.append(f"request {rid!r} is {r.status} but has an assignment/job")
        if r.status == "assigned" and getattr(jobs.get(rid), "status", None) != "active":
            bad.append(f"request {rid!r} is assigned but its job is not active")
        if r.status == "released" and getattr(jobs.get(rid), "status", None) != "released":
            bad.append(f"request {rid!r} is released but its job is still active")
    for rid, gen in latest.items():  # a resized job runs on its latest generation and nothing else
        if getattr(reqs.get(rid), "status", None) == "pending":
            continue  # suspended (elastic srpt-suspend): it holds nothing, checked above; a resume is a new generation
        current = assigns.get(rid)
        if current is None or sorted(json.loads(gen.gpus)) != sorted(json.loads(current.gpus)):
            bad.append(f"job {rid!r}: generation {gen.generation} is not its current assignment")
    for rid, g in reserved:
        st = getattr(reqs.get(rid), "status", None)
        if st != "pending":
            bad.append(f"reservation for request {rid!r} whose status is {st!r}")
        rg = json.loads(g)
        r = reqs.get(rid)
        if r is not None and (len(rg) != r.k or len(set(rg)) != r.k or not set(rg) <= set(spec.gpu_ids)):
            bad.append(f"reservation for request {rid!r} holds {len(set(rg))} known GPUs for k={r.k}")
    try:
        State.from_dict(spec, state.to_dict(), "exported state")
    except StateError as exc:
        bad.append(f"exported state is invalid: {exc}")
    return bad
