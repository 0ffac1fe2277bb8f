"""May a request start now on GPUs a reservation planned to use? The backfill check
(``--backfill-check set|replan|replan-waited|lend``; issue 21, the largest JCT, README "Twelfth round").

* ``set`` (the default) - a request may not take the planned GPU set of any reservation that starts
  before it is expected to end (:meth:`~bandpilot.scheduling.reservations.Book.hidden_for`): a request
  with a long run may still start at once on GPUs no reservation's set uses.
* ``replan`` - Slurm's ``sched/backfill`` test, "does starting it now delay a reserved job?", rather
  than "does it touch the reserved GPUs?": when the sets block a request that fits what is free now,
  the dispatcher places it on the free GPUs, and every reservation it overlaps is planned again at
  **the same start time** on the cluster expected then with the request running until its expected
  end. If each one still fits, on no more hosts than its planned set (a placement lives for hours:
  moving a reservation must not spread it), the request starts and those reservations keep their start
  on their new GPU sets; otherwise nothing changes and the request protects them as before.

* ``lend`` - ``set``, plus preemptible requests that have waited 8 h start on the reserved GPUs on
  loan, reclaimed when the reservation's gang fits (:mod:`bandpilot.scheduling.loans`; README
  "Thirteenth round").

Why (README issue 21, "Twelfth round" trace, seed 4 ``comm``): the default's largest JCT is a
4-GPU job with a 12 h limit that waits 57 h (13 h under Slurm-like); in many of its batches it fits
the free GPUs but its run overlaps the planned sets of the two reservations, 8- and 16-GPU gangs
whose GPUs could have come from jobs ending before their start (with ``replan-waited`` it waits 28 h).
A whole-cluster reservation cannot move: where one blocks (seeds 0, 2, 6; held-out 106) nothing changes. A reservation whose holder is unknown
(a start-or-wait hold, :mod:`bandpilot.scheduling.startwait`) or a drain target is never moved.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import sqlalchemy as sa

from bandpilot.dispatch.state import State
from bandpilot.errors import one_of
from bandpilot.queue.requests import Request
from bandpilot.scheduling.estimates import Estimates
from bandpilot.scheduling.loans import LendCheck
from bandpilot.scheduling.placer import Deferred, Placer
from bandpilot.scheduling.policies import HRRN_AGE_CAP_S
from bandpilot.scheduling.reservations import Book, Reservation

BACKFILL_CHECKS = ("set", "replan", "replan-waited", "lend")  # lend: bandpilot.scheduling.loans
#: ``replan-waited``: only a request that has waited this long may start on a reservation's re-planned
#: GPUs - ``hrrn``'s age cap, reused (not searched): a request past it is one ``hrrn`` ages as if it
#: were shorter than it is. Why a gate (README issue 21, "Twelfth round"): ``replan`` for every
#: request lets fresh long jobs onto the re-planned GPUs too, and the gangs with no reservation yet
#: (whole-cluster ones above all) wait for them: seeds 0-7, ``full`` max +3.4 %, ``comm`` p95 +2.7 %
#: vs ``set``; gated, all six figures are below ``set``'s there (not on held-out seeds 104-111).
REPLAN_AFTER_S = HRRN_AGE_CAP_S


def check_backfill_check(mode: str) -> str:
    return one_of(mode, BACKFILL_CHECKS, "backfill check")


class SetCheck:
    """``set``: the reservations' planned GPU sets are hidden from the request (``hidden``)."""

    def __init__(self, placer: Placer, book: Book | None) -> None:
        self.placer, self.book = placer, book

    def prepare(self, conn: sa.Connection, state: State, placer: Placer, now: float, estimates: Estimates) -> list[Any]:
        """Read what the check needs from the store; the PostFilter plug-ins it brings (none)."""
        return []

    def place(self, req: Request, hidden: np.ndarray | None) -> Any:
        """A selection for ``req`` now, or raise :class:`~bandpilot.scheduling.placer.Deferred`."""
        return self.placer.place(req, hidden)

    def written(self, conn: sa.Connection, req: Request, ts: float, out: Any) -> None:
        """``req`` was assigned in ``conn``'s transaction (a loan writes its marker there)."""


class ReplanCheck(SetCheck):
    """``replan``: a request the sets block may start if every reservation it overlaps still starts on time."""

    after_s = 0.0  # how long a request must have waited to be replanned for

    def place(self, req: Request, hidden: np.ndarray | None) -> Any:
        try:
            return self.placer.place(req, hidden)
        except Deferred as d:
            if hidden is None or self.book is None or d.status != "deferred" or not self.waited(req):
                raise
            try:
                sel = self.placer.place(req, None)
            except Deferred:
                raise d from None
            if not replan_around(self.book, req, list(sel.gpus), float(getattr(sel, "standalone_gbps", None) or 0.0)):
                raise d from None
            return sel


    def waited(self, req: Request) -> bool:
        if self.after_s <= 0:
            return True
        return req.submitted_at is not None and self.book is not None and self.book.now - req.submitted_at >= self.after_s


class WaitedReplanCheck(ReplanCheck):
    """``replan-waited``: ``replan`` only for a request that has waited :data:`REPLAN_AFTER_S`."""

    @property
    def after_s(self) -> float:  # type: ignore[override]  # read at call time: measurements set the module constant
        return REPLAN_AFTER_S


CHECKS: dict[str, Any] = {"set": SetCheck, "replan": ReplanCheck, "replan-waited": WaitedReplanCheck, "lend": LendCheck}


def _hosts(mask: np.ndarray) -> int:
    return int(np.count_nonzero(mask))


def replan_around(book: Book, req: Request, gpus: list[str], demand: float) -> bool:
    """Plan again, at their own start times, the reservations that ``req`` on ``gpus`` (from now to its
    expected end) would overlap; True (and the new sets kept) if each still fits on no more hosts."""
    est = book.estimates.of(req)
    if est is None:  # never ends, as far as planning knows: it would delay every reservation it touches
        return False
    end, mask = book.now + est, book.spec.to_mask(gpus)
    hit = [r for r in book.reservations if r.start_at < end and np.any(r.mask & mask) and r.request_id != req.id]
    if not hit or any(r.req is None or r.drain for r in hit):
        return False
    saved = [(r, r.gpus, r.mask, r.predicted_gbps) for r in hit]
    with book.as_if_started(req, mask, demand):
        for r in hit:
            if not _move(book, r):
                for x, g, m, p in saved:
                    x.gpus, x.mask, x.predicted_gbps = g, m, p
                return False
        return True


def _move(book: Book, r: Reservation) -> bool:
    """Re-place ``r``'s holder at ``r.start_at`` with ``r`` itself out of the plan; keep the new set if it fits."""
    i = book.reservations.index(r)
    del book.reservations[i]
    try:
        assert r.req is not None
        sel = book.place_at(r.req, r.start_at, r.expected_s)
    finally:
        book.reservations.insert(i, r)
    if sel is None:
        return False
    new = book.spec.to_mask(list(sel.gpus))
    if _hosts(new) > _hosts(r.mask):
        return False
    r.gpus, r.mask = list(sel.gpus), new
    gbps = getattr(sel, "predicted_gbps", None)
    r.predicted_gbps = None if gbps is None else float(gbps)
    return True
