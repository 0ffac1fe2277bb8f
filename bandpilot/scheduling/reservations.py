"""When will a blocked gang start, and which later requests may start before it? Reservations and
backfill, with Slurm's ``sched/backfill`` as the reference.

* ``greedy`` - every pending request is tried in policy order and takes what fits now (the queue's
  behaviour before reservations): a large gang that is not first can wait behind a stream of small
  ones indefinitely.
* ``easy`` - the first gang in policy order that cannot start gets a **reservation**: the earliest
  time its GPUs are expected to be free (running jobs end at ``started + expected run time``,
  :mod:`bandpilot.scheduling.estimates`) AND a concrete GPU set, chosen by the dispatcher on the
  cluster as it is expected to be then (the jobs still running at that time press on the NICs).
  A later request starts now only if it cannot delay that reservation: on GPUs outside the set, or
  expected to end before the reservation starts. A request whose run time is unknown is treated as
  never ending: it may only use GPUs no reservation needs.
* ``conservative`` - every blocked gang (up to ``max_reservations``) gets a reservation that
  respects the earlier ones, so no reserved gang is delayed by a later one.

Reservations are recomputed from scratch by every batch, stored (``bp_reservations``) and shown.
They plan with estimates and never enforce them: a job that outlives its estimate is expected to
end any moment, and the reservation simply moves. Bandwidth is used to choose the reserved GPUs,
not to decide "delay": like Slurm, a backfilled job that shares NICs with a reservation does not
count as delaying it.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Iterable

import numpy as np
import sqlalchemy as sa

from bandpilot.dispatch.state import Job, State
from bandpilot.errors import one_of
from bandpilot.queue.clock import iso
from bandpilot.queue.requests import Request
from bandpilot.queue.schema import T_JOBS, T_REQ, T_RESERVE
from bandpilot.queue.views import describe_reservation
from bandpilot.scheduling.estimates import Estimates, expected_end
from bandpilot.scheduling.placer import Deferred, Placer
from bandpilot.topology.cluster import popcount

BACKFILL_MODES = ("greedy", "easy", "conservative")
#: Reservations per batch in ``conservative`` mode (each costs a few dispatcher calls).
MAX_CONSERVATIVE = 16
#: Candidate start times tried per reservation (the earliest running-job ends).
MAX_STEPS = 64


def check_backfill(mode: str) -> str:
    return one_of(mode, BACKFILL_MODES, "backfill mode")


@dataclass
class Reservation:
    request_id: str
    k: int
    rank: int
    start_at: float
    gpus: list[str]
    mask: np.ndarray = field(repr=False)
    predicted_gbps: float | None
    expected_s: float | None

    @property
    def end_at(self) -> float:
        return math.inf if self.expected_s is None else self.start_at + self.expected_s

    def describe(self) -> str:
        return f"reserved: {describe_reservation(self.to_dict())}"

    def to_dict(self) -> dict[str, Any]:
        return {"request_id": self.request_id, "k": self.k, "rank": self.rank, "start": iso(self.start_at),
                "start_at": self.start_at, "gpus": self.gpus, "predicted_gbps": self.predicted_gbps}


@dataclass
class _Running:
    id: str
    mask: np.ndarray
    end: float
    demand: float


_ACTIVE = (
    sa.select(T_JOBS.c.id, T_JOBS.c.started_at, T_REQ.c.k, T_REQ.c.tenant, T_REQ.c.time_limit_s)
    .join(T_REQ, T_REQ.c.id == T_JOBS.c.id)
    .where(T_JOBS.c.status == "active")
)


class Book:
    """The reservations of one batch and the running jobs' expected ends they are planned from."""

    def __init__(self, mode: str, state: State, placer: Placer, estimates: Estimates, now: float,
                 running_rows: Iterable[tuple], max_reservations: int | None = None) -> None:
        self.mode = check_backfill(mode)
        self.spec = state.spec
        self.now = now
        self.estimates = estimates
        self.placer = placer  # a planning placer of its own: its failure cache must not leak
        self.free = state.free.copy()
        self.limit = 0 if mode == "greedy" else 1 if mode == "easy" else (max_reservations or MAX_CONSERVATIVE)
        demand = {j.id: j for j in state.jobs}
        self.running: list[_Running] = []
        for jid, started, k, tenant, limit in running_rows:
            job = demand.get(jid)
            if job is None:
                continue
            est = estimates.of(Request(jid, int(k), tenant, time_limit_s=limit))
            self.running.append(_Running(jid, job.mask, expected_end(float(started), est, now), job.demand_gbps))
        self.reservations: list[Reservation] = []
        self.holds = 0  # reservations of gangs waiting for a better placement (not EASY's slots)

    @classmethod
    def load(cls, conn: sa.Connection, mode: str, state: State, placer: Placer, now: float,
             max_reservations: int | None = None, estimates: Estimates | None = None) -> "Book":
        """``estimates``: the batch's copy (:meth:`Estimates.load_live`), loaded here when None."""
        est = estimates if estimates is not None else Estimates.load(conn)
        return cls(mode, state, placer, est, now, conn.execute(_ACTIVE).all(), max_reservations)

    @property
    def active(self) -> bool:
        return self.limit > 0

    def can_reserve(self) -> bool:
        return len(self.reservations) - self.holds < self.limit

    def hold(self, r: Reservation) -> None:
        """A gang that could start now waits for a better placement (:mod:`bandpilot.scheduling.startwait`):
        its GPUs at ``r.start_at`` are protected like a reservation's, without using a backfill slot.
        A reservation the gang already had is replaced."""
        self.reservations = [x for x in self.reservations if x.request_id != r.request_id]
        self.reservations.append(r)
        self.holds += 1

    def hidden_for(self, req: Request) -> np.ndarray | None:
        """GPUs ``req`` must not take now: those of reservations starting before it would end."""
        if not self.reservations:
            return None
        est = self.estimates.of(req)
        end = math.inf if est is None else self.now + est
        out = np.zeros(self.spec.n_hosts, dtype=np.int64)
        for r in self.reservations:
            if r.start_at < end and r.request_id != req.id:  # never hides its own GPUs
                out |= r.mask
        return out if out.any() else None

    def started(self, req: Request, gpus: list[str], demand: float) -> None:
        """A request started in this batch: its GPUs come back at its expected end."""
        mask = self.spec.to_mask(gpus)
        self.running.append(_Running(req.id, mask, expected_end(self.now, self.estimates.of(req), self.now), demand))
        self.free &= ~mask
        self.reservations = [r for r in self.reservations if r.request_id != req.id]  # a held gang that started

    def evicted(self, ids: Iterable[str]) -> None:
        """Preempted jobs no longer run: their GPUs are free now."""
        gone = set(ids)
        for r in self.running:
            if r.id in gone:
                self.free |= r.mask
        self.running = [r for r in self.running if r.id not in gone]

    # -- planning ---------------------------------------------------------------------------
    def _steps(self, from_now: bool = False) -> list[float]:
        ends = {r.end for r in self.running if math.isfinite(r.end)} | ({self.now} if from_now else set())
        ends.update(r.end_at for r in self.reservations if math.isfinite(r.end_at))
        return sorted(t for t in ends if t >= self.now)[:MAX_STEPS]

    def _state_at(self, t: float, until: float) -> State:
        """The expected cluster at ``t`` for a job running until ``until``: jobs ended by ``t``
        have freed their GPUs; reservations overlapping ``[t, until)`` keep theirs."""
        free = self.free.copy()
        jobs = []
        for r in self.running:
            if r.end <= t:
                free |= r.mask
            else:
                jobs.append(Job(r.id, tuple(self.spec.from_mask(r.mask)), r.demand, r.mask))
        for res in self.reservations:
            if res.start_at < until and res.end_at > t:
                free &= ~res.mask
        return State(self.spec, free, tuple(jobs))

    def steps(self, from_now: bool = False) -> list[float]:
        """The planning times: now (if asked) and each running job's expected end."""
        return self._steps(from_now)

    def place_at(self, req: Request, t: float, est: float | None) -> Any | None:
        """The dispatcher's selection for ``req`` on the cluster expected at ``t`` (its GPUs kept
        until ``t + est``), or None when it does not fit there."""
        st = self._state_at(t, math.inf if est is None else t + est)
        if int(popcount(st.free).sum()) < req.k:
            return None
        self.placer.reset_failures()
        self.placer.set_state(st)
        try:
            return self.placer.place(req)
        except Deferred:
            return None

    def reserve(self, req: Request, from_now: bool = False) -> Reservation | None:
        """The earliest expected start of ``req`` and the GPUs the dispatcher picks for it then
        (``from_now``: now is a candidate too)."""
        if not self.can_reserve():
            return None
        est = self.estimates.of(req)
        for t in self._steps(from_now):
            sel = self.place_at(req, t, est)
            if sel is None:
                continue
            gpus = list(sel.gpus)
            r = Reservation(req.id, req.k, len(self.reservations), t, gpus, self.spec.to_mask(gpus),
                            _f(getattr(sel, "predicted_gbps", None)), est)
            self.reservations.append(r)
            return r
        return None

    def note_blocked(self, req: Request, hidden: np.ndarray | None, n_free: int, out: Any) -> None:
        """A request could not start: reserve for it (if a slot is left) or say which reservation it protects."""
        r = next((x for x in self.reservations if x.request_id == req.id), None) or self.reserve(req)
        if r is not None:
            out.reason, out.detail = "reserved", r.describe()
        elif hidden is not None and n_free >= req.k:
            ids = ", ".join(x.request_id for x in self.reservations if np.any(x.mask & hidden))
            out.reason = "protects_reservation"
            out.detail = f"starting now could delay the reservation of {ids} (its expected run time ends after they start)"

    # -- the store ----------------------------------------------------------------------------
    def write(self, conn: sa.Connection, batch_id: int | None, ts: float) -> None:
        write_reservations(conn, self.reservations, batch_id, self.mode, ts)


def write_reservations(conn: sa.Connection, reservations: list[Reservation], batch_id: int | None, mode: str, ts: float) -> None:
    """Replace the stored reservations with this batch's (recomputed each batch, never merged)."""
    conn.execute(sa.delete(T_RESERVE))
    if reservations:
        conn.execute(sa.insert(T_RESERVE), [
            {"request_id": r.request_id, "batch_id": batch_id, "rank": r.rank, "start_at": r.start_at,
             "gpus": json.dumps(r.gpus), "predicted_gbps": r.predicted_gbps, "mode": mode, "computed_at": ts}
            for r in reservations
        ])


def _f(v: Any) -> float | None:
    return None if v is None else float(v)
