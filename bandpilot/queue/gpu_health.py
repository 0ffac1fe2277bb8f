"""What does a verify verdict change in the pool? Record it and gate the hardware, in one transaction.

Suspect GPUs of a degraded or failed host are drained (a slow host or an unlocalised fault: the whole
host) with the verdict as the reason; running jobs are never preempted (their GPUs drain when
released). Hardware that a previous verify drained comes back once a verify passes; drains an
operator made by hand (any other reason) are left alone.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

import sqlalchemy as sa

from bandpilot.errors import StateError
from bandpilot.queue.clock import now, iso
from bandpilot.queue.lifecycle import drain_ids, undrain_ids
from bandpilot.queue.schema import T_GPUS, T_HEALTH
from bandpilot.queue.store import Store

REASON_PREFIX = "verify:"
STATUSES = ("healthy", "degraded", "failed")


def _targets(store: Store, host: str, v: Mapping[str, Any]) -> list[str]:
    n = store.spec.hosts[store.spec.host_index[host]].n_gpus
    gpus = list(v.get("gpus") or [])
    rails = [lk.rsplit("nic-rail", 1)[1] for lk in v.get("links") or [] if "nic-rail" in lk]
    gpus += [f"{host}:{r}" for r in rails]  # a slow rail: the GPU that drives it leaves the pool
    return sorted(set(gpus)) or [f"{host}:{i}" for i in range(n)]


def apply_verdicts(store: Store, verdicts: Mapping[str, Mapping[str, Any]], source: str = "") -> dict[str, Any]:
    """Store ``{"<host>": {"status", "gpus", "links", "ratio"}}`` and drain/undrain accordingly."""
    spec = store.spec
    for host, v in verdicts.items():
        if host not in spec.host_index:
            raise StateError(f"verdict for host {host!r}, which is not in cluster {spec.name!r}")
        if v.get("status") not in STATUSES:
            raise StateError(f"verdict for {host}: status must be one of {STATUSES}, got {v.get('status')!r}")
    ts = now()
    out: dict[str, Any] = {"drained": [], "pending": [], "undrained": []}
    with store.write() as conn:
        for host, v in verdicts.items():
            row = {"status": v["status"], "gpus": json.dumps(list(v.get("gpus") or [])),
                   "links": json.dumps(list(v.get("links") or [])), "ratio": float(v.get("ratio", 1.0)),
                   "source": source or None, "verified_at": ts}
            if conn.execute(sa.update(T_HEALTH).where(T_HEALTH.c.host == host).values(**row)).rowcount == 0:
                conn.execute(sa.insert(T_HEALTH).values(host=host, **row))
            bad = _targets(store, host, v) if v["status"] != "healthy" else []
            ours = [g for (g,) in conn.execute(
                sa.select(T_GPUS.c.id).where(T_GPUS.c.host == host, T_GPUS.c.note.like(f"{REASON_PREFIX}%")))]
            back = [g for g in ours if g not in bad]
            if back:
                out["undrained"] += undrain_ids(store, conn, back)["undrained"]
            if bad:
                what = ", ".join(v.get("links") or v.get("gpus") or [host])
                reason = f"{REASON_PREFIX} {v['status']} ({what}), measured/expected {float(v.get('ratio', 0)):.2f}"
                res = drain_ids(store, conn, bad, reason)
                out["drained"] += res["drained"]
                out["pending"] += res["pending"]
    return out


def health(store: Store) -> list[dict[str, Any]]:
    """The last verdict per host (hosts never verified are listed as ``unknown``)."""
    with store.read() as conn:
        rows = {r.host: r for r in conn.execute(sa.select(T_HEALTH))}
        notes = conn.execute(sa.select(T_GPUS.c.host, sa.func.count()).where(
            T_GPUS.c.note.like(f"{REASON_PREFIX}%")).group_by(T_GPUS.c.host)).all()
    drained: dict[str, int] = {host: n for host, n in notes}
    out = []
    for h in store.spec.hosts:
        r = rows.get(h.name)
        out.append({"host": h.name, "status": r.status if r else "unknown",
                    "gpus": json.loads(r.gpus) if r else [], "links": json.loads(r.links) if r else [],
                    "ratio": float(r.ratio) if r else None, "verified_at": iso(r.verified_at) if r else None,
                    "gated_gpus": int(drained.get(h.name, 0))})
    return out
