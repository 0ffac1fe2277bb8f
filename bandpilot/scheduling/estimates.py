"""How long will a job run? The expected run time a batch plans with, from the best source known.

In order: an explicit estimate (``bp_estimates``, e.g. from a workflow that knows), the request's
``time_limit_s`` (what a Slurm user writes with ``--time``), the median of what finished jobs of the
same tenant and size took, the median of the same size over all tenants; else unknown. Estimates
are wrong in real life (users pad limits 2-3x, jobs fail early): they order the queue (``sjf``) and
place reservations and backfill, and nothing depends on them for correctness - a job that outlives
its estimate is simply expected to end any moment (:func:`expected_end`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Iterable

import sqlalchemy as sa

from bandpilot.queue.learning import learned_runtimes, load_estimates, load_live_estimates
from bandpilot.queue.requests import Request

SOURCES = ("estimate", "time_limit", "learned_tenant_size", "learned_size")


@dataclass
class Estimates:
    explicit: dict[str, float] = field(default_factory=dict)
    by_tenant_k: dict[tuple[str, int], float] = field(default_factory=dict)
    by_k: dict[int, float] = field(default_factory=dict)

    @classmethod
    def load(cls, conn: sa.Connection, ids: Iterable[str] | None = None) -> "Estimates":
        tk, k = learned_runtimes(conn)
        return cls(load_estimates(conn, None if ids is None else list(ids)), tk, k)

    @classmethod
    def load_live(cls, conn: sa.Connection) -> "Estimates":
        """Estimates of the pending and running requests (what one batch plans with), loaded once."""
        tk, k = learned_runtimes(conn)
        return cls(load_live_estimates(conn), tk, k)

    def source(self, req: Request) -> tuple[float | None, str | None]:
        """(expected run time in seconds, where it came from) - (None, None) when unknown."""
        if req.id in self.explicit:
            return self.explicit[req.id], "estimate"
        if req.time_limit_s is not None:
            return float(req.time_limit_s), "time_limit"
        if (req.tenant, req.k) in self.by_tenant_k:
            return self.by_tenant_k[(req.tenant, req.k)], "learned_tenant_size"
        if req.k in self.by_k:
            return self.by_k[req.k], "learned_size"
        return None, None

    def of(self, req: Request) -> float | None:
        return self.source(req)[0]


#: A job past its estimate is expected to run on for this share of its estimate. "Any moment" (0)
#: makes every overrun pin its reservation to now, holding the reserved free GPUs idle batch after
#: batch; half its estimate more lets short jobs backfill them meanwhile (mixed workload, 2 seeds:
#: FIFO + topo + EASY mean JCT 14.8 -> 7.5 h and 8.7 -> 7.2 h).
OVERDUE_SHARE = 0.5


def expected_end(started_at: float, expected_s: float | None, now: float) -> float:
    """When a running job is expected to end: ``inf`` when unknown; a job past its estimate is
    expected to run :data:`OVERDUE_SHARE` of its estimate more, never to have ended in the past."""
    if expected_s is None:
        return float("inf")
    end = started_at + expected_s
    return end if end >= now else now + OVERDUE_SHARE * expected_s
