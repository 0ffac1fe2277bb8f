"""An age slot (issue 21, the largest JCT): one reservation always goes to the longest-waiting
pending request, whatever the policy order says; the other slots follow the policy (``hrrn``).

Why: under ``hrrn`` with two reservations the job with the largest JCT is usually a small gang with
a long time limit that cannot backfill before the whole-cluster reservations of 32-GPU gangs, and
whose capped response ratio never wins one of the two slots (README, "Fourth round"). Slurm's
``sched/backfill`` reserves for jobs in priority order, and its priority has an age factor; FIFO +
EASY (the Slurm-like baseline) gives the oldest blocked job the reservation by construction. The age
slot is that bound without reordering the queue: the oldest request (once it has waited
:data:`AGE_SLOT_AFTER_S`) is reserved **first**, before the batch walks the policy order, so the
fresher gangs' reservations are planned around it rather than it around them (an extra slot appended
after hrrn's was measured not to move the maximum: the aged slot kept moving behind them).

* :data:`AGE_SLOT_AFTER_S` - ``inf`` = off (the default); ``0`` = always (Slurm's answer);
  ``12 h`` = age-triggered.
* :data:`AGE_SLOT_EXTRA` - False: the age slot **replaces** the last policy slot (the depth is
  unchanged); True: it is one more than the depth.
* :data:`AGE_SLOT_MAX_K` - only gangs up to this size compete for it (None = any).

Reserved ``from_now``: if the oldest request fits now its GPUs are held for it from now and it starts
when the walk reaches it (no request earlier in the order may take them unless it ends first).
"""

from __future__ import annotations

import math
from typing import Iterable

from bandpilot.scheduling.policies import Pending
from bandpilot.scheduling.reservations import Book, Reservation

#: Wait after which the longest-waiting pending request gets the age slot; ``inf`` = off.
AGE_SLOT_AFTER_S = math.inf
#: True: the age slot is one more than the reservation depth; False: it takes one of the depth's slots.
AGE_SLOT_EXTRA = False
#: Only gangs of at most this many GPUs compete for the age slot (None = any): a small gang's
#: reservation holds only its own GPUs, a whole-cluster gang's drains the cluster for every job
#: behind it (the reason ``hrrn-sized`` ages large gangs later).
AGE_SLOT_MAX_K: int | None = None
#: Who is "oldest": ``wait`` - the longest-waiting request (Slurm's age order); ``projected`` - the
#: largest projected JCT (wait + estimated run time: the request that would set the largest JCT if it
#: waited any longer), among requests whose projected JCT has reached :data:`AGE_SLOT_AFTER_S`.
AGE_SLOT_KEY = "wait"


def reserve_oldest(book: Book, pending: Iterable[Pending], after_s: float | None = None,
                   extra: bool | None = None) -> Reservation | None:
    """Reserve the longest-waiting request first if it has waited ``after_s`` (default
    :data:`AGE_SLOT_AFTER_S`). Call before the batch walks the order (nothing has started yet)."""
    after = AGE_SLOT_AFTER_S if after_s is None else after_s
    if not math.isfinite(after) or not book.active:
        return None
    cap = AGE_SLOT_MAX_K
    age = _projected(book) if AGE_SLOT_KEY == "projected" else (lambda p: book.now - p.submitted_at)
    oldest = max((p for p in pending if cap is None or p.req.k <= cap), key=lambda p: (age(p), -p.seq), default=None)
    if oldest is None or age(oldest) < after:
        return None
    if any(r.request_id == oldest.req.id for r in book.reservations):  # a drain target already
        return None
    if AGE_SLOT_EXTRA if extra is None else extra:
        book.limit += 1  # one more than the depth (it stays so if the request starts in this batch)
    return book.reserve(oldest.req, from_now=True)


def _projected(book: Book):
    """Wait so far + estimated run time (an unknown estimate counts as 0: it plans nothing)."""
    def key(p: Pending) -> float:
        est = book.estimates.of(p.req)
        return book.now - p.submitted_at + (est or 0.0)
    return key
