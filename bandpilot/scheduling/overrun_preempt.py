"""Preemption into the leading reservation, of jobs past their time limit only (``--preempt overrun``).

Why (issue 21, the largest JCT; README "Seventh round"): reservations are planned from running jobs'
expected ends, and nothing is killed at a time limit here (Slurm kills there), so a job that backfilled
"ending before the reservation starts" and then overran its estimate pushes the reservation back batch
after batch - a whole-cluster drain measured 16 h for a 0.4 h gang, 16 of its 38 backfills past their
limit. This plug-in takes the reserved GPUs back when the gang is due: the batch's **first blocked
gang** (no reservation ahead of it, as :class:`~bandpilot.scheduling.leader_preempt.LeaderPreemptPostFilter`)
may evict ``preemptible`` running jobs that have **run longer than their estimate** (the limit a
reservation was planned around), of no higher priority, and only if that lets it start now. It needs
no starvation bound: a victim broke the promise it was admitted on, and it loses at most one
checkpoint period (+ restart). Victims, their price (GPU-hours since the last checkpoint), the
bandwidth ranking and the one-transaction eviction are :class:`~bandpilot.scheduling.preemption.PreemptPostFilter`'s.

A job is evicted this way at most once (an ``action = 'preempt'`` audit row names it): its restart is
planned with the remaining-time estimate of a guess that was already wrong, so a second eviction
would only waste another checkpoint period. Non-preemptible jobs are never touched - unlike Slurm,
"every job completes" holds without resubmission.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from typing import Any

import sqlalchemy as sa

from bandpilot.dispatch.state import State
from bandpilot.queue.requests import Request
from bandpilot.queue.schema import T_AUDIT
from bandpilot.scheduling.estimates import OVERDUE_SHARE, Estimates
from bandpilot.scheduling.leader_preempt import LeaderPreemptPostFilter
from bandpilot.scheduling.placer import Placer
from bandpilot.scheduling.postfilter import Plan, Unschedulable
from bandpilot.scheduling.preemption import Candidate, PreemptPlan

#: The gang must have waited this long: a fresh gang's reservation is near anyway, and each eviction
#: sends a long job back to the queue. 12 h (hrrn's starvation bound, ``policies.HRRN_STARVE_S``);
#: measured on seeds 0-7 (README issue 21, "Seventh round"): 4 h (``--preempt on``'s bound) evicts
#: ~9 jobs per 200 and costs the mean, 12 h ~2 and keeps it.
GANG_WAIT_S = 12 * 3600.0

_PREEMPT_AUDITS = sa.select(T_AUDIT.c.detail).where(T_AUDIT.c.action == "preempt", T_AUDIT.c.outcome == "ok")


def evicted_before(conn: sa.Connection) -> set[str]:
    """Job ids any earlier preemption evicted (from the audit rows)."""
    out: set[str] = set()
    for (detail,) in conn.execute(_PREEMPT_AUDITS):
        try:
            out.update(json.loads(detail or "{}").get("victims", []))
        except (ValueError, AttributeError):
            continue  # a hand-written audit row: not ours
    return out


def overran(c: Candidate, now: float) -> bool:
    """Ran longer than the estimate its reservations were planned with (unknown: never)."""
    return c.expected_s is not None and now - c.started_at > c.expected_s


class OverrunPreemptPostFilter(LeaderPreemptPostFilter):
    """The leading blocked gang evicts preemptible jobs past their estimate, once each."""

    name = "overrun_preemption"

    def __init__(self, state: State, placer: Placer, rows: list[tuple], estimates: Estimates, now: float,
                 evicted: set[str] | None = None, **kw: Any) -> None:
        kw["starve_s"] = math.inf  # how long a victim waited before it started does not protect it here
        super().__init__(state, placer, rows, estimates, now, **kw)
        gone = evicted or set()
        self.cands = {i: c for i, c in self.cands.items() if i not in gone and overran(c, now)}

    @classmethod
    def load(cls, conn: sa.Connection, state: State, placer: Placer, now: float, estimates: Estimates | None = None,
             **kw: Any) -> "OverrunPreemptPostFilter":
        return super().load(conn, state, placer, now, estimates, evicted=evicted_before(conn), **kw)

    def eligible(self, req: Request) -> tuple[list[Candidate], str]:
        waited = self.now - (req.submitted_at if req.submitted_at is not None else self.now)
        if waited < GANG_WAIT_S:
            return [], ""
        elig = [c for c in self.cands.values() if c.priority <= req.priority]
        return elig, f"waited {waited / 3600:.1f} h; victims past their time limit"

    def post_filter(self, u: Unschedulable) -> Plan | None:
        plan = super().post_filter(u)
        if isinstance(plan, PreemptPlan):  # a victim's restart is planned as the overrun it is, not from the wrong guess
            plan = replace(plan, remaining=tuple((vid, self.after_restart(self.cands[vid])) for vid, _ in plan.remaining))
        return plan

    def after_restart(self, c: Candidate) -> float:
        """The victim's expected run time after its restart: what the queue expects of any job past its
        estimate (:data:`~bandpilot.scheduling.estimates.OVERDUE_SHARE` of it more, as
        :func:`~bandpilot.scheduling.estimates.expected_end` plans), plus the work lost since its last
        checkpoint and the restart. (The generic plug-in's "estimate minus checkpointed work" is ~0 for
        a job past its estimate: hrrn would rank it as the shortest job and backfill would plan around
        an end that never comes.)"""
        assert c.expected_s is not None  # overran() needs it
        return OVERDUE_SHARE * c.expected_s + c.lost_s(self.now) + c.checkpoint_s
