"""Preemptible loans onto reserved GPUs (``--backfill-check lend``; issue 21, the largest JCT, README
"Thirteenth round"): Kueue's borrow + reclaim, per reservation.

* **Loan** - when the reservations' planned GPU sets block a ``preemptible`` request that fits the GPUs
  free now and has waited :data:`LEND_AFTER_S`, it starts on them **on loan** until the earliest start
  among the reservations it overlaps, provided that is at least one checkpoint period
  (``checkpoint_every_s + checkpoint_s``) away: a shorter loan keeps no progress when it is reclaimed
  (a victim restarts from its last checkpoint). A request that never checkpoints, is not preemptible
  or has not waited is treated exactly as under ``set``.
* **Marker** - the loan is an audit row (``action = 'loan'``, its end and the gangs it borrowed from)
  written in the assignment's transaction; a batch reads the loans of the jobs running now (a row
  older than the job's current start belongs to an earlier run), so a restart of the queue or the
  simulator's store sees them.
* **Planning** - the backfill :class:`~bandpilot.scheduling.reservations.Book` plans a loaned job's
  GPUs free from now (:meth:`Book.lend`; from the loan's end in the batch that admits it): a loan never
  pushes a reservation back, even one that comes earlier than planned because jobs ended early.
* **Reclaim** - :class:`ReclaimPostFilter`: a request that cannot start now may evict loaned jobs - only
  those, never another preemptible job - if that lets it start now and it is the gang they borrowed
  from, or the batch's first blocked gang (no reservation ahead of it: its reservation, planned with
  the loans' GPUs free, would start now), or the loan has ended. Victims go back to pending with their
  progress, the gang is assigned, in one transaction (:func:`~bandpilot.scheduling.preemption.evict`,
  audit ``action = 'reclaim'``: ``reclaim loan P; admit G on h100-0+h100-1: … GB/s``).

Why (README issue 21): the job with the largest JCT is usually a small gang with a long time limit
that cannot backfill because its run overlaps reservations' planned sets - whole-cluster ones above
all, whose set is every GPU - so during a drain of up to ~18 h the GPUs no short job can use sit idle.
A preemptible job can use them and give them back at the reservation's start.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import sqlalchemy as sa

from bandpilot.dispatch.state import State
from bandpilot.queue.clock import iso
from bandpilot.queue.requests import Request
from bandpilot.queue.schema import T_AUDIT, T_JOBS, T_REQ
from bandpilot.scheduling.estimates import Estimates
from bandpilot.scheduling.placer import Deferred, Placer
from bandpilot.scheduling.policies import HRRN_AGE_CAP_S
from bandpilot.scheduling.postfilter import Plan, Unschedulable
from bandpilot.scheduling.preemption import Candidate, PreemptPlan, PreemptPostFilter
from bandpilot.scheduling.reservations import Book

#: A request must have waited this long to start on loan: ``hrrn``'s age cap, reused (not searched; as
#: ``replan.REPLAN_AFTER_S``). Why (README issue 21, "Thirteenth round", seeds 0-7): lending to every
#: preemptible request lets fresh long jobs borrow too - ~3x the reclaims, mean +10-14 % vs the default;
#: gated, mean and p95 are below the default's.
LEND_AFTER_S = HRRN_AGE_CAP_S


@dataclass(frozen=True)
class Loan:
    job: str
    until: float  # the earliest start of the reservations it borrowed from: reclaimable from then
    holders: tuple[str, ...]  # the gangs whose reservations it borrowed from

    def describe(self) -> str:
        return f"on loan until ~{iso(self.until)} (reservation of {', '.join(self.holders)})"


# the loans of the jobs running now: a row written before the job's current start is an earlier run's
_LOANS = (
    sa.select(T_AUDIT.c.target, T_AUDIT.c.detail)
    .join(T_JOBS, T_JOBS.c.id == T_AUDIT.c.target)
    .where(T_AUDIT.c.action == "loan", T_AUDIT.c.outcome == "ok", T_JOBS.c.status == "active",
           T_AUDIT.c.at >= T_JOBS.c.started_at)
)


def load_loans(conn: sa.Connection) -> dict[str, Loan]:
    out: dict[str, Loan] = {}
    for jid, detail in conn.execute(_LOANS):
        try:
            d = json.loads(detail or "{}")
            out[jid] = Loan(jid, float(d["until"]), tuple(d.get("holders", ())))
        except (ValueError, KeyError, TypeError):
            continue  # a hand-written audit row: not ours
    return out


def write_loan(conn: sa.Connection, loan: Loan, ts: float) -> None:
    """The durable marker, in the caller's transaction (the assignment's); the request row's detail
    says it (``queue list`` / the API show it while the job runs)."""
    conn.execute(sa.update(T_REQ).where(T_REQ.c.id == loan.job, T_REQ.c.status == "assigned").values(detail=loan.describe()))
    conn.execute(sa.insert(T_AUDIT).values(
        at=ts, actor="scheduler", action="loan", target=loan.job, outcome="ok",
        detail=json.dumps({"until": loan.until, "holders": list(loan.holders), "detail": loan.describe()}, sort_keys=True)))


def period_s(req: Request) -> float | None:
    """One checkpoint period and restart: the shortest loan that keeps progress (None: never checkpoints)."""
    if not req.preemptible or not req.checkpoint_every_s:
        return None
    return float(req.checkpoint_every_s) + float(req.checkpoint_s or 0.0)


class LendCheck:
    """``lend``: ``set``, plus loans of the reserved GPUs to preemptible requests (a backfill check of
    :mod:`bandpilot.scheduling.replan`'s registry)."""

    def __init__(self, placer: Placer, book: Book | None) -> None:
        self.placer, self.book = placer, book
        self.loans: dict[str, Loan] = {}
        self.offer: Loan | None = None  # the loan of the selection place() returned last

    def prepare(self, conn: sa.Connection, state: State, placer: Placer, now: float, estimates: Estimates) -> list[Any]:
        """Read the running loans; the book plans their GPUs free from now (a gang that fits with them
        reclaims them: a loan never delays a reservation, even one that comes earlier than the loan's
        planned end because jobs ended before their estimates); the reclaim plug-in."""
        self.loans = load_loans(conn)
        if self.book is not None:
            self.book.lend({j: now for j in self.loans})
        return [ReclaimPostFilter.load(conn, state, placer, now, estimates=estimates, loans=self.loans)]

    def place(self, req: Request, hidden: np.ndarray | None) -> Any:
        self.offer = None
        try:
            return self.placer.place(req, hidden)
        except Deferred as d:
            sel, loan = self.lend(req, hidden, d)
            if sel is None:
                raise d from None
            self.offer = loan
            return sel

    def lend(self, req: Request, hidden: np.ndarray | None, d: Deferred) -> tuple[Any, Loan | None]:
        book, period = self.book, period_s(req)
        if hidden is None or book is None or d.status != "deferred" or period is None:
            return None, None
        if LEND_AFTER_S > 0 and (req.submitted_at is None or book.now - req.submitted_at < LEND_AFTER_S):
            return None, None
        est = book.estimates.of(req)
        end = math.inf if est is None else book.now + est
        try:
            sel = self.placer.place(req, None)
        except Deferred:
            return None, None
        mask = book.spec.to_mask(list(sel.gpus))
        hit = [r for r in book.reservations if r.start_at < end and np.any(r.mask & mask) and r.request_id != req.id]
        if not hit:
            return None, None
        until = min(r.start_at for r in hit)
        if until - book.now < period:  # reclaimed before its first checkpoint: the loan would keep nothing
            return None, None
        return sel, Loan(req.id, until, tuple(dict.fromkeys(r.request_id for r in hit)))

    def written(self, conn: sa.Connection, req: Request, ts: float, out: Any) -> None:
        """``req`` was assigned: if on loan, its marker in the same transaction and the outcome's detail."""
        loan = self.offer
        if loan is None or loan.job != req.id:
            return
        write_loan(conn, loan, ts)
        self.loans[req.id] = loan
        if self.book is not None:  # only a loan that started: the book plans its GPUs free from its end (Book.started)
            self.book.loans[req.id] = loan.until
        out.detail = loan.describe()


class ReclaimPostFilter(PreemptPostFilter):
    """A gang takes back the GPUs of loans that have ended: victims only loaned jobs past their loan."""

    name = "loan_reclaim"

    def __init__(self, state: State, placer: Placer, rows: list[tuple], estimates: Estimates, now: float,
                 loans: dict[str, Loan] | None = None, **kw: Any) -> None:
        kw["starve_s"] = math.inf  # how long a loaned job waited before it started does not protect it
        super().__init__(state, placer, rows, estimates, now, **kw)
        self.loans = loans if loans is not None else {}
        self.cands = {i: c for i, c in self.cands.items() if i in self.loans}

    def eligible(self, req: Request) -> tuple[list[Candidate], str]:
        # a loan that has ended goes back to any request that fits with it; before its end only to the
        # gang it borrowed from or the batch's first blocked gang (no reservation ahead of it: the one
        # whose reservation, planned with the loans' GPUs free, would start now)
        elig = [c for c in self.cands.values()
                if self.loans[c.id].until <= self.now or self._leader or req.id in self.loans[c.id].holders]
        return elig, "loans reclaimed"

    def post_filter(self, u: Unschedulable) -> Plan | None:
        self._leader = u.hidden is None or not u.hidden.any()
        plan = super().post_filter(u)
        if isinstance(plan, PreemptPlan):
            plan = replace(plan, detail="reclaim loan " + plan.detail.removeprefix("evict "), action="reclaim")
        return plan

    _leader = False
