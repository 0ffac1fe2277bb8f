"""What future will a placement made in this batch live in? The queue's :class:`~bandpilot.dispatch.lifetime.Outlook`
for lifetime pricing (issue 21, item 4), built once per batch from the store.

* **Running jobs' time left**: ``started + expected run time`` (:mod:`bandpilot.scheduling.estimates`,
  the same expected ends reservations plan with) minus now; unknown is "never ends".
* **The arrival mix**: the last :data:`RECENT` requests submitted (pending ones included: under load
  they are what takes the next free GPUs). A request of more GPUs than the largest host spans hosts;
  a smaller gang (2+ GPUs) spans with the share of running such gangs that do; 1-GPU jobs never.
  The GPU-weighted share is the probability that a GPU turning over goes to a job that spans hosts.
* **Such jobs' footprint**: GPUs per host and pressure (the stored demand, already under the demand
  model) of the running jobs that span hosts; none running: half a host and the candidate's own.
* **Fill time** of a free GPU: 0 while requests wait, else free GPUs / the recent arrival rate in GPUs.

Estimates plan, they never decide correctness: a wrong one only misprices a placement.
"""

from __future__ import annotations

import math
from dataclasses import replace
from typing import Any, Iterable

import numpy as np
import sqlalchemy as sa

from bandpilot.dispatch.demand import pressure_factor
from bandpilot.dispatch.lifetime import Outlook
from bandpilot.dispatch.state import State
from bandpilot.queue.requests import Request
from bandpilot.queue.schema import T_JOBS, T_REQ
from bandpilot.scheduling.estimates import Estimates, expected_end
from bandpilot.topology.cluster import popcount

#: Recent requests that make the arrival mix.
RECENT = 64
#: Pending requests (policy order) the outlook keeps for the queue lookahead.
QUEUE = 32

_RUNNING = (
    sa.select(T_JOBS.c.id, T_JOBS.c.started_at, T_REQ.c.k, T_REQ.c.tenant, T_REQ.c.time_limit_s, T_REQ.c.comm_fraction)
    .join(T_REQ, T_REQ.c.id == T_JOBS.c.id)
    .where(T_JOBS.c.status == "active")
)
_RECENT = sa.select(T_REQ.c.k, T_REQ.c.submitted_at, T_REQ.c.comm_fraction).order_by(T_REQ.c.seq.desc()).limit(RECENT)


def build_outlook(state: State, estimates: Estimates, now: float, running: Iterable[tuple],
                  recent: Iterable[tuple[int, float]], queue: list[tuple[str, int]]) -> Outlook:
    """The outlook from rows: ``running`` (id, started_at, k, tenant, time_limit_s, comm_fraction),
    ``recent`` (k, submitted_at, comm_fraction) requests, newest first, and the pending ``queue``
    (id, k) in policy order."""
    spec = state.spec
    G = int(spec.gpus_per_host.max())
    rem: dict[str, float] = {}
    comm: dict[str, float] = {}
    for jid, started, k, tenant, limit, f in running:
        est = estimates.of(Request(str(jid), int(k), str(tenant), time_limit_s=limit))
        rem[str(jid)] = expected_end(float(started), est, now) - now
        comm[str(jid)] = 1.0 if f is None else float(f)
    spans = [j for j in state.jobs if j.cross_host]
    gangs = [j for j in state.jobs if 2 <= popcount(j.mask).sum() <= G]
    small_share = (sum(j.cross_host for j in gangs) / len(gangs)) if gangs else 0.0
    mix = [(int(k), float(t), 1.0 if f is None else float(f)) for k, t, f in recent]
    ks = np.array([m[0] for m in mix], dtype=float)
    fs = np.array([m[2] for m in mix], dtype=float)
    p_span = np.where(ks > G, 1.0, np.where(ks >= 2, small_share, 0.0))
    cross_share = float((ks * p_span).sum() / ks.sum()) if ks.size and ks.sum() > 0 else 0.0
    w = p_span.sum()
    mix_gpus = float((ks * p_span).sum() / w) if w > 0 else 2.0
    mix_comm = float((fs * p_span).sum() / w) if w > 0 else 1.0
    if spans:
        slice_gpus = float(np.mean([popcount(j.mask).sum() / (j.mask != 0).sum() for j in spans]))
        pressure = float(np.mean([j.demand_gbps for j in spans]))
    else:
        slice_gpus, pressure = G / 2.0, 0.0
    fill_s = 0.0
    if not queue:
        times = [m[1] for m in mix]
        span_s = now - min(times) if times else 0.0
        rate = ks.sum() / span_s if span_s > 0 else 0.0  # GPUs asked per second, recently
        fill_s = state.n_free / rate if rate > 0 else math.inf
    sizes, counts = np.unique(ks[ks >= 2].astype(np.int64), return_counts=True)
    mix_k = tuple(int(k) for k in sizes[np.lexsort((sizes, -counts))])
    return Outlook(rem, cross_share, slice_gpus, pressure, fill_s, tuple(queue[:QUEUE]), mix_k, comm, mix_comm, mix_gpus)


def load_outlook(conn: sa.Connection, state: State, estimates: Estimates, now: float,
                 queue: list[tuple[str, int]]) -> Outlook:
    return build_outlook(state, estimates, now, conn.execute(_RUNNING).all(),
                         [tuple(r) for r in conn.execute(_RECENT)], queue)


def run_time(estimates: Estimates | None, req: Request) -> float | None:
    """The request's expected run time (None when unknown)."""
    return None if estimates is None else estimates.of(req)


def attach(outlook: Any, state: State, req: Request, run_s: float | None, demand: str) -> State:
    """``state`` carrying ``outlook`` for request ``req``, expected to run ``run_s``, pressing on
    shared NICs by the ``demand`` model."""
    return replace(state, outlook=outlook.for_run(run_s, req.id, req.comm_fraction,
                                                  pressure_factor(req.comm_fraction, demand)))
