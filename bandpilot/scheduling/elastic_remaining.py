"""How much work does each elastic job still have? The remaining-work estimate the ``srpt``
admission rule (:mod:`bandpilot.scheduling.elastic_admission`) orders and yields by.

A job's work is its run-time estimate at its requested ``k`` (``bp_estimates``, its time limit,
or what finished jobs of its tenant and size took: :class:`~bandpilot.scheduling.estimates.Estimates`)
times ``k``, in GPU-seconds at ``k``. A running job has done the share its attained service gives:
each stretch of its generations (``bp_assignments.assigned_at``, then one stretch per
``bp_generations`` row, the last one up to now) at ``k_i`` GPUs counts ``dur · speed(k_i)`` of the
estimate, ``speed(k) = (k / k0) · η^log2(k / k0)`` with ``η`` the job's declared scaling (1 when
undeclared) - the compute share of the simulator's runtime model, the collective left out (an
estimate; nothing depends on it for correctness). A job without an estimate is unknown (``inf``:
it orders last and yields to every job).
"""

from __future__ import annotations

import math
from types import SimpleNamespace
from typing import Iterable, Mapping

import sqlalchemy as sa

from bandpilot.queue.requests import Request
from bandpilot.queue.schema import T_ASSIGN, T_GEN, T_REQ
from bandpilot.scheduling.estimates import Estimates


def speed(k: int, k0: int, eta: float) -> float:
    """Compute speed at ``k`` GPUs relative to ``k0`` (the runtime model's compute share)."""
    return (k / k0) * eta ** math.log2(k / k0)


def done_share(stretches: Iterable[tuple[float, int]], k0: int, eta: float, expected_s: float) -> float:
    """Share of the work done after ``stretches`` of ``(seconds, GPUs)`` (capped at 1)."""
    if expected_s <= 0:
        return 1.0
    return min(1.0, sum(d * speed(k, k0, eta) for d, k in stretches if d > 0 and k > 0) / expected_s)


def remaining_work(conn: sa.Connection, running: Mapping[str, int], pending: Iterable[Request], at: float,
                   etas: Mapping[str, float | None]) -> dict[str, float]:
    """Remaining GPU-seconds (at each job's requested ``k``) of the ``running`` jobs (id -> GPUs held
    now) and the ``pending`` requests at time ``at``; ``inf`` when a job has no estimate."""
    held = dict(running)
    running = list(held)
    pending = list(pending)
    out: dict[str, float] = {}
    est = Estimates.load(conn, running + [p.id for p in pending])
    for p in pending:
        e = est.of(p)
        out[p.id] = math.inf if e is None else float(e) * p.k
    if not running:
        return out
    rows, gens = {}, {}
    for i in range(0, len(running), 500):
        chunk = running[i : i + 500]
        q = (sa.select(T_REQ.c.id, T_REQ.c.k, T_REQ.c.tenant, T_REQ.c.time_limit_s, T_ASSIGN.c.assigned_at)
             .join(T_ASSIGN, T_ASSIGN.c.request_id == T_REQ.c.id).where(T_REQ.c.id.in_(chunk)))
        rows.update({r.id: r for r in conn.execute(q)})
        q = (sa.select(T_GEN.c.request_id, T_GEN.c.at, T_GEN.c.k, T_GEN.c.previous_k)
             .where(T_GEN.c.request_id.in_(chunk)).order_by(T_GEN.c.request_id, T_GEN.c.generation))
        for g in conn.execute(q):
            gens.setdefault(g.request_id, []).append(g)
    for jid in running:
        r = rows.get(jid)
        if r is None:
            continue
        # Estimates.of reads id, tenant, k and time limit only
        e = est.of(SimpleNamespace(id=jid, tenant=r.tenant, k=r.k, time_limit_s=r.time_limit_s))  # type: ignore[arg-type]
        if e is None:
            out[jid] = math.inf
            continue
        # a job suspended and resumed (srpt-suspend) starts a new assignment: its estimate is then
        # the remaining run time, so only the generations since that assignment count
        g = [x for x in gens.get(jid, []) if float(x.at) >= float(r.assigned_at)]
        starts = [float(r.assigned_at)] + [float(x.at) for x in g]
        ends = starts[1:] + [at]
        # generation 0 ran at the first resize's previous size (never resized: at the size held now)
        sizes = [int(g[0].previous_k) if g else held[jid]] + [int(x.k) for x in g]
        stretches = [(b - a, k) for a, b, k in zip(starts, ends, sizes)]
        eta = etas.get(jid)
        out[jid] = float(e) * r.k * (1.0 - done_share(stretches, r.k, 1.0 if eta is None else float(eta), float(e)))
    return out
