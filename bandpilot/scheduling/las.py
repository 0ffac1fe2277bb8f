"""Least attained service first, with preemption: Tiresias' discretised 2D-LAS (issue 21 item 6).

A job's *attained service* is GPUs x seconds it has run (Tiresias' two dimensions, spatial and
temporal, in one number). Requests are ordered by its level
(:data:`~bandpilot.scheduling.policies.LAS_THRESHOLDS_GPU_S`: fewer GPU-hours received = earlier),
FIFO within a level (:func:`~bandpilot.scheduling.policies.order_pending`, policy ``las``). With
``--preempt on``, a request that cannot start may evict preemptible running jobs whose attained
service has reached a **lower** level than its own - the most-attained make room for the least -
planned and carried out by the topology-aware preemption plug-in
(:mod:`bandpilot.scheduling.preemption`: cheapest checkpoint loss first, scored by the gang's
predicted bandwidth, one transaction). Two jobs of one level never preempt each other, so a job
evicted at level 1 is not bounced by another level-1 job (Tiresias' reason for discretising).

The attained service of a job that was preempted before is kept in the preemption's audit row
(``attained_gpu_s`` per victim): no schema change, and it survives restarts of the queue.
"""

from __future__ import annotations

import json
import math
from typing import Any

import sqlalchemy as sa

from bandpilot.dispatch.state import State
from bandpilot.queue.requests import Request
from bandpilot.queue.schema import T_AUDIT
from bandpilot.scheduling.estimates import Estimates
from bandpilot.scheduling.placer import Placer
from bandpilot.scheduling.policies import las_level
from bandpilot.scheduling.preemption import _CANDIDATES, Candidate, PreemptPostFilter

_PREEMPT_AUDIT = sa.select(T_AUDIT.c.detail).where(T_AUDIT.c.action == "preempt", T_AUDIT.c.outcome == "ok")


def load_attained(conn: sa.Connection) -> dict[str, float]:
    """GPU-seconds each job ran before it was preempted (summed over its preemptions)."""
    out: dict[str, float] = {}
    for (detail,) in conn.execute(_PREEMPT_AUDIT):
        try:
            got = json.loads(detail or "{}").get("attained_gpu_s") or {}
        except (ValueError, AttributeError):
            continue  # an audit row written before attained service was recorded
        for jid, gpu_s in got.items():
            out[jid] = out.get(jid, 0.0) + float(gpu_s)
    return out


class LasPreemptPostFilter(PreemptPostFilter):
    """Preemption for ``las``: victims are the preemptible jobs a level below the gang (never above
    its priority); every preemptible running job is a candidate (levels, not starvation, stop ping-pong)."""

    name = "las_preemption"

    def __init__(self, state: State, placer: Placer, rows: list[tuple], estimates: Estimates, now: float,
                 attained: dict[str, float], **kw: Any) -> None:
        super().__init__(state, placer, rows, estimates, now, starve_s=math.inf, **kw)
        self.prior = attained

    @classmethod
    def load(cls, conn: sa.Connection, state: State, placer: Placer, now: float, estimates: Estimates | None = None,
             **kw: Any) -> "LasPreemptPostFilter":
        est = estimates if estimates is not None else Estimates.load(conn)  # the batch's copy when given
        return cls(state, placer, conn.execute(_CANDIDATES).all(), est, now, load_attained(conn), **kw)

    def attained(self, c: Candidate) -> float:
        return self.prior.get(c.id, 0.0) + c.k * max(0.0, self.now - c.started_at)

    def eligible(self, req: Request) -> tuple[list[Candidate], str]:
        mine = self.prior.get(req.id, 0.0)
        level = las_level(mine)
        elig = [c for c in self.cands.values() if c.priority <= req.priority and las_level(self.attained(c)) > level]
        return elig, f"least attained service: {mine / 3600:.1f} GPU-h received, level {level}"
