"""Fewer elastic jobs at once, each on up to one host, shortest remaining work first - and, as an
option, suspension to 0 GPUs at an epoch boundary. The ``srpt-host`` and ``srpt-suspend`` admission
rules of :mod:`bandpilot.scheduling.elastic_admission` (flags, not the entropy-guided scheduling paper's rule).

Why: under ``fit-k`` every admitted job keeps at least its ``min_k``, so once the burst is in, ~14
jobs run at once at their floors (processor sharing) and the quota weights decide little. The entropy-guided
scheduling paper's own quotas (eq. 31, ``G · U_j / Σ U`` rounded to integers) have no floor: a job may get 0.

*Quotas* (:func:`srpt_quotas`): every candidate (running ones at a boundary and pending ones) in
order of estimated remaining work (:mod:`bandpilot.scheduling.elastic_remaining`) claims
:data:`CLAIM_FACTOR` times its ``min_k`` (within ``max_k`` and one host: beyond it a job's
collective crosses the NICs), or what is left if that is at least its ``min_k``. A running job that
gets nothing keeps its ``min_k`` (``srpt-host``) or, with ``suspend``, gets 0: it is suspended at
its epoch boundary (:func:`suspend_job`: back to pending, its remaining run time as its estimate)
and resumes, at the cost of one resize, when it is again among the shortest. When nothing waits
(no pending job left out, none suspended), the GPUs left grow the shortest jobs up to ``max_k``.
"""

from __future__ import annotations

import json
import math
from typing import Mapping, Sequence

import sqlalchemy as sa

from bandpilot.errors import RequestError
from bandpilot.queue.schema import T_ASSIGN, T_AUDIT, T_ESTIMATES, T_GEN, T_GPUS, T_JOBS, T_REQ
from bandpilot.scheduling.requeue import requeue_running


def snap_down(lo: int, hi: int, step: int, x: int) -> int:
    """The largest size of ``lo + n·step`` (<= hi) that is <= x; 0 if x < lo."""
    if x < lo:
        return 0
    return lo + ((min(x, hi) - lo) // step) * step


#: A job's claim is this many times its ``min_k`` (within ``max_k`` and one host): measured on seed
#: 001's workload (benchmarks/bench_elastic.py), 2 beat ``min_k`` itself, 3x, the requested ``k`` and a whole host -
#: small gangs are cheaper in GPU-hours at η < 1, but a job at its floor runs slowly for hours.
CLAIM_FACTOR = 2


def claim(c, host: int) -> int:
    """The GPUs a candidate asks for under the ``srpt-*`` rules."""
    return max(c.lo, min(c.hi, CLAIM_FACTOR * c.lo, host))


def srpt_quotas(cands: Sequence, n_gpus: int, host: int, suspend: bool, keep: bool = False,
                claims: Mapping[str, int] | None = None) -> dict[str, int]:
    """Quotas by remaining work (module docstring): every running candidate gets a quota (0 only
    with ``suspend``); pending ones left out wait. ``keep`` (``rebalance(fill_idle=True)``): when
    nothing waits, running jobs get back their current size before the shortest grows. ``claims``: a
    claim per job instead of :func:`claim` (``srpt-marginal``: :mod:`bandpilot.scheduling.elastic_marginal`)."""
    claims = claims or {}
    running = [c for c in cands if c.running]
    floors = 0 if suspend else sum(c.lo for c in running)
    if floors > n_gpus:
        raise RequestError(f"running jobs need {floors} GPUs at their min_k but only {n_gpus} are in play")
    budget = n_gpus - floors  # without suspension the running jobs' floors are reserved first
    out: dict[str, int] = {}
    # shortest remaining first; a running job before a pending one of equal work (no churn on ties)
    for c in sorted(cands, key=lambda c: (c.remaining, not c.running)):
        base = c.lo if (c.running and not suspend) else 0
        q = snap_down(c.lo, c.hi, c.step, min(claims.get(c.id) or claim(c, host), budget + base))
        if q:
            out[c.id] = q
            budget -= q - base
        elif c.running:
            out[c.id] = base  # its floor (srpt-host) or 0: suspended
    # nothing waits (no pending job left out, none suspended): what is left grows the shortest, up to
    # max_k (the pricer still refuses a growth that does not pay). Measured (benchmarks/bench_elastic.py): at 2,000
    # jobs on 1,024 mostly idle GPUs, claims alone leave large jobs at min_k (-16 % vs FIFO; -28 % with this)
    if all(out.get(c.id, 0) > 0 for c in cands):
        if keep:
            budget = _keep_sizes(cands, out, budget)
        for c in sorted(cands, key=lambda c: (c.remaining, not c.running)):
            if budget <= 0:
                break
            q = snap_down(c.lo, c.hi, c.step, out[c.id] + budget) if out[c.id] else 0
            budget -= max(0, q - out[c.id])
            out[c.id] = max(q, out[c.id])
    return out


def _keep_sizes(cands: Sequence, out: dict[str, int], budget: int) -> int:
    """Running jobs (shortest first) back up to their current size while the budget allows; returns
    what is left. Why: with ``fill_idle`` a job may hold GPUs the leftovers' rule would give the
    shortest job, whose growth the pricer refuses (8 -> 24 across three hosts): without this the
    next round would shrink the filled job and fill it again, two resizes an epoch."""
    for c in sorted(cands, key=lambda c: (c.remaining, not c.running)):
        if c.running and out[c.id] < c.k and budget > 0:
            q = snap_down(c.lo, c.hi, c.step, min(c.k, out[c.id] + budget))
            budget -= max(0, q - out[c.id])
            out[c.id] = max(q, out[c.id])
    return budget


def suspend_job(conn: sa.Connection, jid: str, remaining_s: float, ts: float) -> None:
    """A running job back to pending at its epoch boundary (its checkpoint): its GPUs freed, its
    assignment and job rows removed, its estimate set to the remaining run time at its requested
    ``k``, one audit row; raises if it is no longer running (the caller's transaction rolls back)."""
    if not requeue_running(conn, jid, reason="suspended", detail="suspended at an epoch boundary (srpt-suspend)",
                           remaining_s=remaining_s, ts=ts):
        raise RequestError(f"job {jid!r} is no longer running: it cannot be suspended")
    conn.execute(sa.insert(T_AUDIT).values(
        at=ts, actor="scheduler", action="suspend", target=jid, outcome="ok",
        detail=json.dumps({"remaining_s": remaining_s if math.isfinite(remaining_s) else None}, sort_keys=True)))


def was_suspended(conn: sa.Connection, jid: str) -> bool:
    """Is this pending request a suspended job (read before its next assignment clears the reason)?"""
    return conn.execute(sa.select(T_REQ.c.reason).where(T_REQ.c.id == jid)).scalar_one_or_none() == "suspended"


def record_resume(conn: sa.Connection, jid: str, gpus: Sequence[str], ts: float) -> int:
    """A resumed job's new assignment is its next generation (``reason = 'resume'``, from 0 GPUs):
    ``queue show`` / ``/launch`` show a new generation, and the job's latest generation is the GPUs
    it runs on (the invariant). Returns the generation."""
    gen = int(conn.execute(sa.select(sa.func.coalesce(sa.func.max(T_GEN.c.generation), 0))
                           .where(T_GEN.c.request_id == jid)).scalar_one()) + 1
    conn.execute(sa.insert(T_GEN).values(request_id=jid, generation=gen, k=len(gpus), gpus=json.dumps(list(gpus)),
                                         previous_k=0, epoch=None, predicted_gbps=None, reason="resume", at=ts))
    conn.execute(sa.insert(T_AUDIT).values(
        at=ts, actor="scheduler", action="resume", target=jid, outcome="ok",
        detail=json.dumps({"generation": gen, "k": len(gpus)}, sort_keys=True)))
    return gen
