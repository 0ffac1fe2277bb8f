"""What does the queue look like now? The exported state, status, request listing, fragmentation
and the compact GPU list format."""

from __future__ import annotations

import functools
import json
from typing import Any, Sequence

import sqlalchemy as sa

from bandpilot.dispatch.state import State
from bandpilot.errors import RequestError
from bandpilot.queue.clock import iso
from bandpilot.queue.generations import current_generations, elastic_doc
from bandpilot.queue.schema import GPU_STATES, REQUEST_STATUSES, T_ASSIGN, T_BATCH, T_FRAG, T_GPUS, T_JOBS, T_REQ, T_RESERVE
from bandpilot.queue.store import Store
from bandpilot.topology.domains import integer_runs


def format_gpus(gpus: Sequence[str]) -> str:
    """Compact GPU list: ``h100-0:0-3,5 h100-1:0-7``."""
    by_host: dict[str, list[int]] = {}
    for g in gpus:
        h, _, i = g.rpartition(":")
        by_host.setdefault(h, []).append(int(i) if i.isdigit() else -1)
    parts = []
    for h, idx in by_host.items():
        runs = [f"{a}" if a == b else f"{a}-{b}" for a, b in integer_runs(sorted(idx))]
        parts.append(f"{h}:{','.join(runs)}")
    return " ".join(parts)


def current_state(store: Store) -> State:
    with store.read() as conn:
        return store.load_state(conn)


def export_state(store: Store) -> dict[str, Any]:
    """The cluster state in the dispatcher's JSON format (``{"free": [...], "jobs": [...]}``)."""
    return current_state(store).to_dict()


def status(store: Store) -> dict[str, Any]:
    spec = store.spec
    with store.read() as conn:
        req_counts = dict(conn.execute(sa.select(T_REQ.c.status, sa.func.count()).group_by(T_REQ.c.status)).tuples().all())
        gpu_counts = dict(conn.execute(sa.select(T_GPUS.c.state, sa.func.count()).group_by(T_GPUS.c.state)).tuples().all())
        pending_drain = conn.execute(
            sa.select(sa.func.count()).select_from(T_GPUS).where(T_GPUS.c.drain_pending.is_(True))
        ).scalar()
        reasons = dict(
            conn.execute(
                sa.select(T_REQ.c.reason, sa.func.count()).where(T_REQ.c.status == "pending", T_REQ.c.reason.is_not(None)).group_by(T_REQ.c.reason)
            ).tuples().all()
        )
        last = conn.execute(sa.select(T_BATCH).order_by(T_BATCH.c.id.desc()).limit(1)).first()
        tenants = conn.execute(
            sa.select(T_JOBS.c.tenant, sa.func.count(), sa.func.sum(T_JOBS.c.k)).where(T_JOBS.c.status == "active").group_by(T_JOBS.c.tenant)
        ).all()
        reserved = reservations_in(conn)
    return {
        "cluster": spec.name,
        "store": store.safe_url,
        "requests": {s: int(req_counts.get(s, 0)) for s in REQUEST_STATUSES},
        "deferral_reasons": {str(k): int(v) for k, v in reasons.items()},
        "gpus": {"total": spec.n_gpus, **{s: int(gpu_counts.get(s, 0)) for s in GPU_STATES}, "drain_pending": int(pending_drain or 0)},
        "tenants": {t: {"jobs": int(n), "gpus": int(g or 0)} for t, n, g in tenants},
        "last_batch": None
        if last is None
        else {
            "id": last.id, "policy": last.policy, "model_version": last.model_version, "started": iso(last.started_at),
            "finished": iso(last.finished_at), "interrupted": last.finished_at is None,
            "assigned": last.n_assigned, "deferred": last.n_deferred, "rejected": last.n_rejected,
        },
        "reservations": reserved,
    }


def reservation_doc(r: Any) -> dict[str, Any]:
    return {"request_id": r["request_id"], "tenant": r["tenant"], "rank": r["rank"], "start": iso(r["start_at"]), "start_at": r["start_at"],
            "gpus": json.loads(r["gpus"]), "predicted_gbps": r["predicted_gbps"], "mode": r["mode"],
            "computed": iso(r["computed_at"]), "batch_id": r["batch_id"]}


def reservations_in(conn: sa.Connection) -> list[dict[str, Any]]:
    """The reservations the last batch made (earliest rank first)."""
    q = sa.select(T_RESERVE, T_REQ.c.tenant).join(T_REQ, T_REQ.c.id == T_RESERVE.c.request_id).order_by(T_RESERVE.c.rank)
    return [reservation_doc(r) for r in conn.execute(q).mappings()]


def describe_reservation(r: dict[str, Any]) -> str:
    bw = f", predicted {r['predicted_gbps']:.0f} GB/s" if r.get("predicted_gbps") else ""
    return f"expected start ~{r['start']} on {format_gpus(r['gpus'])}{bw}"


@functools.lru_cache(maxsize=None)
def _list_stmt(status: bool, tenant: bool, request_id: bool, limit: bool) -> sa.Select:
    """The listing query for one combination of filters, built once: building and hashing a select
    costs more than PostgreSQL takes to run it (bound parameters keep the values out)."""
    q = sa.select(T_REQ, T_ASSIGN).join(T_ASSIGN, T_ASSIGN.c.request_id == T_REQ.c.id, isouter=True).order_by(T_REQ.c.seq)
    if status:
        q = q.where(T_REQ.c.status == sa.bindparam("status"))
    if tenant:
        q = q.where(T_REQ.c.tenant == sa.bindparam("tenant"))
    if request_id:
        q = q.where(T_REQ.c.id == sa.bindparam("request_id"))
    if limit:
        q = q.limit(sa.bindparam("limit", type_=sa.Integer))
    return q


def request_doc(r: Any, reservation: dict[str, Any] | None) -> dict[str, Any]:
    """A request as listed: its row joined with its assignment (``gpus`` ... ``assigned_at`` None
    when it has none) and the reservation a batch made for it."""
    return {
        "id": r["id"], "tenant": r["tenant"], "k": r["k"], "priority": r["priority"], "utility": r["utility"],
        "constraints": json.loads(r["constraints"]) if r["constraints"] else {},
        "submitted": iso(r["submitted_at"]), "status": r["status"], "reason": r["reason"],
        "detail": r["detail"], "attempts": r["attempts"],
        "gpus": json.loads(r["gpus"]) if r["gpus"] else [],
        "predicted_gbps": r["predicted_gbps"], "standalone_gbps": r["standalone_gbps"],
        "algorithm": r["algorithm"], "model_version": r["model_version"], "assigned": iso(r["assigned_at"]),
        "time_limit_s": r["time_limit_s"], "comm_fraction": r["comm_fraction"],
        "preemptible": bool(r["preemptible"]), "checkpoint_s": r["checkpoint_s"],
        "checkpoint_every_s": r["checkpoint_every_s"], "scaling": r.get("scaling"), "reservation": reservation,
        **elastic_doc(r),
    }


def list_requests(
    store: Store, status: str | None = None, tenant: str | None = None, limit: int | None = None,
    request_id: str | None = None,
) -> list[dict[str, Any]]:
    if status is not None and status not in REQUEST_STATUSES:
        raise RequestError(f"unknown status {status!r}: use one of {', '.join(REQUEST_STATUSES)}")
    params = {"status": status or None, "tenant": tenant or None, "request_id": request_id, "limit": limit or None}
    q = _list_stmt(*(v is not None for v in params.values()))
    out = []
    with store.read(snapshot=False) as conn:
        reserved = {r["request_id"]: r for r in reservations_in(conn)}
        for r in conn.execute(q, {k: v for k, v in params.items() if v is not None}).mappings():
            out.append(request_doc(r, reserved.get(r["id"]) if r["status"] == "pending" else None))
        running = [d["id"] for d in out if d["gpus"]]
        gens = current_generations(conn, running) if running else {}
        for d in out:
            if d["gpus"]:
                d["generation"] = gens.get(d["id"], 0)
    return out


def fragmentation(store: Store) -> dict[str, Any]:
    """Where the free GPUs are and what they can still serve.

    A host's free GPUs are *stranded* when the host is partly busy or unavailable (they cannot serve
    a whole-host request); likewise per domain. ``largest_placeable`` is the biggest gang request
    that fits now: anywhere, on one host, in one domain.
    """
    spec = store.spec
    with store.read() as conn:
        return fragmentation_in(conn, spec)


_FRAG_COUNTS = (
    sa.select(T_GPUS.c.host, T_GPUS.c.state, sa.func.count(), sa.func.sum(sa.case((T_GPUS.c.drain_pending, 1), else_=0)))
    .group_by(T_GPUS.c.host, T_GPUS.c.state)
)


def fragmentation_in(conn: sa.Connection, spec: Any) -> dict[str, Any]:
    """:func:`fragmentation` inside an open transaction."""
    # counted by the database (a few rows per host, not one per GPU: every batch samples this)
    rows = conn.execute(_FRAG_COUNTS).all()
    per: dict[str, dict[str, int]] = {h.name: {"free": 0, "busy": 0, "unavailable": 0, "drain_pending": 0} for h in spec.hosts}
    for host, st, n, dp in rows:
        per[host][st] += int(n)
        per[host]["drain_pending"] += int(dp or 0)
    hosts = []
    for h in spec.hosts:
        c = per[h.name]
        stranded = c["free"] if c["free"] < h.n_gpus else 0
        hosts.append({"host": h.name, "domain": h.domain, "gpus": h.n_gpus, **c, "stranded": stranded})
    free = sum(x["free"] for x in hosts)
    largest_host = max((x["free"] for x in hosts), default=0)
    out: dict[str, Any] = {
        "cluster": spec.name,
        "gpus": spec.n_gpus,
        "free": free,
        "busy": sum(x["busy"] for x in hosts),
        "unavailable": sum(x["unavailable"] for x in hosts),
        "stranded": sum(x["stranded"] for x in hosts),
        "whole_free_hosts": sum(1 for x in hosts if x["free"] == x["gpus"]),
        "largest_placeable": {"any": free, "single_host": largest_host},
        # Share of free GPUs stranded on partly used hosts: 0 = every free GPU is on a wholly free host.
        "fragmentation": round(sum(x["stranded"] for x in hosts) / free, 4) if free else 0.0,
        "hosts": hosts,
    }
    if any(h.domain for h in spec.hosts):
        doms: dict[str, dict[str, Any]] = {}
        for x in hosts:
            name = x["domain"] or "(none)"
            d = doms.setdefault(name, {"domain": name, "hosts": 0, "gpus": 0, "free": 0, "busy": 0, "unavailable": 0, "largest_single_host": 0})
            d["hosts"] += 1
            for key in ("gpus", "free", "busy", "unavailable"):
                d[key] += x[key]
            d["largest_single_host"] = max(d["largest_single_host"], x["free"])
        for d in doms.values():
            d["stranded"] = d["free"] if d["free"] < d["gpus"] else 0
        out["domains"] = list(doms.values())
        out["largest_placeable"]["single_domain"] = max((d["free"] for d in doms.values()), default=0)
        out["whole_free_domains"] = sum(1 for d in doms.values() if d["free"] == d["gpus"])
    return out


def sample_fragmentation(conn: sa.Connection, spec: Any, at: float) -> dict[str, Any]:
    """Record one fragmentation sample (after a batch, or from the API's sampler) and return it."""
    f = fragmentation_in(conn, spec)
    lp = f["largest_placeable"]
    row = {"at": at, "free": f["free"], "busy": f["busy"], "unavailable": f["unavailable"], "stranded": f["stranded"],
           "largest_single_host": lp["single_host"], "largest_single_domain": lp.get("single_domain"),
           "fragmentation": f["fragmentation"]}
    conn.execute(sa.insert(T_FRAG).values(**row))
    return f


def fragmentation_history(store: Store, *, since: float | None = None, limit: int = 2000) -> list[dict[str, Any]]:
    """Fragmentation samples, oldest first (the newest ``limit``)."""
    q = sa.select(T_FRAG).order_by(T_FRAG.c.id.desc()).limit(max(1, min(int(limit), 100_000)))
    if since is not None:
        q = q.where(T_FRAG.c.at >= since)
    with store.read() as conn:
        rows = conn.execute(q).mappings().all()
    return [{"at": iso(r["at"]), "t": r["at"], "free": r["free"], "busy": r["busy"], "unavailable": r["unavailable"],
             "stranded": r["stranded"], "largest_single_host": r["largest_single_host"],
             "largest_single_domain": r["largest_single_domain"], "fragmentation": r["fragmentation"]} for r in reversed(rows)]


def recent_batches(store: Store, limit: int = 20) -> list[dict[str, Any]]:
    """The newest batch runs with what they assigned and the predicted bandwidth of each assignment."""
    with store.read() as conn:
        batches = conn.execute(sa.select(T_BATCH).order_by(T_BATCH.c.id.desc()).limit(max(1, min(int(limit), 500)))).all()
        ids = [b.id for b in batches]
        assigned: dict[int, list[dict[str, Any]]] = {i: [] for i in ids}
        if ids:
            q = (sa.select(T_ASSIGN.c.request_id, T_ASSIGN.c.batch_id, T_ASSIGN.c.predicted_gbps, T_REQ.c.k, T_REQ.c.tenant)
                 .join(T_REQ, T_REQ.c.id == T_ASSIGN.c.request_id).where(T_ASSIGN.c.batch_id.in_(ids)))
            for r in conn.execute(q):
                assigned[r.batch_id].append({"id": r.request_id, "k": r.k, "tenant": r.tenant, "predicted_gbps": r.predicted_gbps})
    return [{"id": b.id, "policy": b.policy, "model_version": b.model_version, "started": iso(b.started_at),
             "finished": iso(b.finished_at), "assigned": b.n_assigned, "deferred": b.n_deferred, "rejected": b.n_rejected,
             "assignments": assigned[b.id]} for b in batches]


def gpu_grid(store: Store) -> list[dict[str, Any]]:
    """Every GPU in cluster order with its state, job, owning tenant and drain flag (the dashboard's grid)."""
    q = (sa.select(T_GPUS.c.id, T_GPUS.c.host, T_GPUS.c.idx, T_GPUS.c.domain, T_GPUS.c.state, T_GPUS.c.job_id,
                   T_GPUS.c.drain_pending, T_GPUS.c.note, T_JOBS.c.tenant)
         .join(T_JOBS, T_JOBS.c.id == T_GPUS.c.job_id, isouter=True).order_by(T_GPUS.c.pos))
    with store.read() as conn:
        return [{"id": r.id, "host": r.host, "idx": r.idx, "domain": r.domain, "state": r.state, "job": r.job_id,
                 "tenant": r.tenant, "drain_pending": bool(r.drain_pending), "note": r.note} for r in conn.execute(q)]


def nothing_to_place(store: Store) -> str | None:
    """Why a batch would place nothing (no pending request, or none small enough for the free GPUs),
    from two cheap queries - so a scheduled no-op batch never loads the model; None otherwise."""
    with store.read() as conn:
        n, kmin = conn.execute(sa.select(sa.func.count(), sa.func.min(T_REQ.c.k)).where(T_REQ.c.status == "pending")).one()
        free = conn.execute(sa.select(sa.func.count()).select_from(T_GPUS).where(T_GPUS.c.state == "free")).scalar()
    if not n:
        return "nothing pending"
    if kmin > free:
        return f"{n} pending, the smallest needs {kmin} GPUs, {free} free"
    return None
