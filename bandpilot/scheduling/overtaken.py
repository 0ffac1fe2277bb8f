"""An age slot for the request FIFO order has most wronged (``--age-slot overtaken``; issue 21, the
largest JCT, README "Tenth round").

Why (README issue 21, "Ninth round" trace): where the default's largest JCT exceeds Slurm-like's,
the job is one whose limit is past ``hrrn``'s 8 h age cap - usually a 1-8 GPU gang - that cannot
backfill (its run overlaps every reservation) while fresh short gangs, whole-cluster ones above
all, win both reservation slots by response ratio (seed 4 ``comm``: an 8-GPU job waits 65.7 h while
124 later jobs start; FIFO + EASY starts it after 11.7 h). FIFO would have made it the reserved head
once the work submitted before it had run. Its wait alone does not say whether that point has passed
(the ``oldest`` slot, measured, gives up the mean); how much **later-submitted** work has run while
it waited does: that is work FIFO would have run after it.

The measure: the GPU-seconds run so far by jobs submitted after the request (``k`` x time held, up to
now; facts from ``bp_jobs``, no estimate). Once it reaches :data:`OVERTAKEN_CLUSTER_S` seconds of the
whole cluster, a request expected to run past ``hrrn``'s cap (:data:`OVERTAKEN_MIN_EST_S`; the traced
class) is "overtaken"; the most overtaken one is reserved first, before the batch walks the policy
order (the age slot's mechanics, :mod:`bandpilot.scheduling.age_slot`). Gangs of any size qualify: an
old whole-cluster gang passed over by that much younger work is the same wrong.
"""

from __future__ import annotations

import bisect
from typing import Callable, Iterable, Mapping

import numpy as np
import sqlalchemy as sa

from bandpilot.queue.schema import T_JOBS, T_REQ
from bandpilot.scheduling.policies import HRRN_AGE_CAP_S, Pending

#: A request is overtaken once later-submitted jobs have run this many seconds of the whole cluster
#: (GPU-seconds / GPUs) while it waited: ``hrrn``'s age cap (8 h), reused, not searched - the cap
#: already says a long request should not wait behind more than about that much short work.
OVERTAKEN_CLUSTER_S = HRRN_AGE_CAP_S
#: Only requests expected to run longer than this compete (0: any). ``hrrn``'s cap: a request within
#: it ages at its own response ratio and was never the starving one in the traced cells. Measured on
#: tuning seeds 0-7 (README "Tenth round"): any request, mean 4.74 / 4.70 h, p95 20.88 / 20.46 h
#: (``comm`` p95 target missed); past the cap, 4.55 / 4.65 h, 18.67 / 19.14 h, max 38.95 / 39.82 h.
OVERTAKEN_MIN_EST_S = HRRN_AGE_CAP_S


def _started_since(since: float) -> sa.Select:
    return (sa.select(T_REQ.c.submitted_at, T_JOBS.c.k, T_JOBS.c.started_at, T_JOBS.c.ended_at)
            .join(T_REQ, T_REQ.c.id == T_JOBS.c.id).where(T_REQ.c.submitted_at > since))


def overtaken_work(rows: Iterable[tuple], pending: Iterable[Pending], now: float) -> dict[str, float]:
    """GPU-seconds run up to ``now`` by jobs submitted after each pending request. ``rows``:
    (submitted_at, k, started_at, ended_at or None) of started jobs."""
    jobs = sorted((float(sub), int(k) * max(0.0, min(now, now if end is None else float(end)) - float(start)))
                  for sub, k, start, end in rows)
    subs = [s for s, _ in jobs]
    after = np.concatenate([np.cumsum([w for _, w in jobs][::-1])[::-1], [0.0]]) if jobs else np.zeros(1)
    return {p.req.id: float(after[bisect.bisect_right(subs, p.submitted_at)]) for p in pending}


def load_overtaken(conn: sa.Connection, pending: list[Pending], now: float) -> dict[str, float]:
    """:func:`overtaken_work` from the store (jobs submitted after the oldest pending request)."""
    if not pending:
        return {}
    since = min(p.submitted_at for p in pending)
    return overtaken_work(conn.execute(_started_since(since)).all(), pending, now)


def overtaken_key(work: Mapping[str, float], n_gpus: int, estimate: Callable[[Pending], float | None]):
    """The age slot's key: cluster-seconds of later work run while the request waited (0 for a
    request expected to run at most :data:`OVERTAKEN_MIN_EST_S`)."""
    def key(p: Pending) -> float:
        if OVERTAKEN_MIN_EST_S > 0 and (estimate(p) or 0.0) <= OVERTAKEN_MIN_EST_S:
            return 0.0
        return work.get(p.req.id, 0.0) / max(n_gpus, 1)
    return key
