"""How did fragmentation evolve? Domain fragmentation recorded after every batch (``bp_fragmentation``,
schema v6) on clusters with domains, and read back as a time series
(``bandpilot cluster fragmentation --history N``). The metrics are
:func:`bandpilot.dispatch.fragmentation.fragmentation_metrics`."""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import sqlalchemy as sa

from bandpilot.dispatch.fragmentation import fragmentation_metrics
from bandpilot.queue.clock import _now, iso
from bandpilot.queue.schema import T_FRAG
from bandpilot.queue.store import Store
from bandpilot.topology.cluster import ClusterSpec


def record_fragmentation(conn: sa.Connection, batch_id: int | None, spec: ClusterSpec, free: np.ndarray) -> None:
    """One row for the free mask after a batch (inside the batch's transaction); no-op without domains."""
    if not any(h.domain for h in spec.hosts):
        return
    m = fragmentation_metrics(spec, free)
    conn.execute(sa.insert(T_FRAG).values(
        batch_id=batch_id, at=_now(), free=m["free"], stranded=m["stranded_gpus"], stranded_trays=m["stranded_tray_gpus"],
        largest=m["largest_placeable"], whole_free=m["whole_free_domains"],
        domains=json.dumps({d["domain"]: d["free"] for d in m["domains"]}),
    ))


def fragmentation_history(store: Store, limit: int = 20) -> list[dict[str, Any]]:
    """The last ``limit`` records, oldest first."""
    q = sa.select(T_FRAG).order_by(T_FRAG.c.id.desc()).limit(limit)
    with store.read() as conn:
        rows = conn.execute(q).mappings().all()
    return [
        {"batch": r["batch_id"], "at": iso(r["at"]), "free": r["free"], "stranded": r["stranded"],
         "stranded_trays": r["stranded_trays"], "largest_placeable": r["largest"], "whole_free_domains": r["whole_free"],
         "domains": json.loads(r["domains"])}
        for r in reversed(rows)
    ]
