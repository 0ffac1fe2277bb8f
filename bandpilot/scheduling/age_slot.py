"""An age slot (issue 21, the largest JCT): one reservation always goes to the longest-waiting
pending request, whatever the policy order says; the other slots follow the policy (``hrrn``).

Why: under ``hrrn`` with two reservations the job with the largest JCT is usually a small gang with
a long time limit that cannot backfill before the whole-cluster reservations of 32-GPU gangs, and
whose capped response ratio never wins one of the two slots (README, "Fourth round"). Slurm's
``sched/backfill`` reserves for jobs in priority order, and its priority has an age factor; FIFO +
EASY (the Slurm-like baseline) gives the oldest blocked job the reservation by construction. The age
slot is that bound without reordering the queue: the oldest request is reserved **first**, before the batch walks the policy order, so the
fresher gangs' reservations are planned around it rather than it around them (an extra slot appended
after hrrn's was measured not to move the maximum: the aged slot kept moving behind them).

``--age-slot`` (:data:`AGE_SLOT_MODES`; ``off`` by default, README issue 21 "Sixth round"):

* ``oldest`` - the longest-waiting request (Slurm's age order), from the first batch it waits
  (:data:`OLDEST_AFTER_S`);
* ``projected`` - the request with the largest projected JCT (wait so far + estimated run time: the
  one that would set the largest JCT if it waited longer), once that reaches
  :data:`PROJECTED_AFTER_S` (30 h, chosen before the held-out seeds were run);
* ``priced`` - as ``projected``, but the slot's drain is priced (:mod:`bandpilot.scheduling.slot_price`):
  a request whose reservation would idle more GPU-hours than it brings passes the slot to the next
  by projected JCT (README issue 21, "Eighth round");
* ``overtaken`` - the request that later-submitted jobs have overtaken most (GPU-seconds they ran
  while it waited), once that is :data:`~bandpilot.scheduling.overtaken.OVERTAKEN_CLUSTER_S` of the
  whole cluster (:mod:`bandpilot.scheduling.overtaken`; README issue 21, "Tenth round").

Measurement knobs: :data:`AGE_SLOT_EXTRA` - False: the age slot **replaces** the last policy slot
(the depth is unchanged); True: it is one more than the depth. :data:`AGE_SLOT_MAX_K` - only gangs up
to this size compete for it (None = any).

Reserved ``from_now``: if the oldest request fits now its GPUs are held for it from now and it starts
when the walk reaches it (no request earlier in the order may take them unless it ends first).
"""

from __future__ import annotations

from typing import Iterable, Mapping

from bandpilot.errors import one_of
from bandpilot.scheduling.policies import Pending
from bandpilot.scheduling.reservations import Book, Reservation
from bandpilot.scheduling import overtaken as _overtaken
from bandpilot.scheduling.slot_price import reserve_priced

AGE_SLOT_MODES = ("off", "oldest", "projected", "priced", "overtaken")
#: ``oldest``: the age slot goes to the longest-waiting request once it has waited this long.
OLDEST_AFTER_S = 0.0
#: ``projected``: ... to the largest projected JCT (wait + estimate) once it reaches this.
PROJECTED_AFTER_S = 30 * 3600.0
#: True: the age slot is one more than the reservation depth; False: it takes one of the depth's slots.
AGE_SLOT_EXTRA = False
#: Only gangs of at most this many GPUs compete for the age slot (None = any): a small gang's
#: reservation holds only its own GPUs but pushes every whole-cluster reservation behind its end
#: (measured worse, README issue 21 "Sixth round").
AGE_SLOT_MAX_K: int | None = None


def check_age_slot(mode: str) -> str:
    return one_of(mode, AGE_SLOT_MODES, "age slot")


def reserve_oldest(book: Book, pending: Iterable[Pending], mode: str,
                   overtaken: Mapping[str, float] | None = None) -> Reservation | None:
    """Reserve the age slot's request first (``mode``: :data:`AGE_SLOT_MODES`). Call before the
    batch walks the policy order (nothing of this batch has started yet). ``overtaken``: the
    ``overtaken`` mode's GPU-seconds per request (:func:`~bandpilot.scheduling.overtaken.load_overtaken`)."""
    if check_age_slot(mode) == "off" or not book.active:
        return None
    after = {"oldest": OLDEST_AFTER_S, "overtaken": _overtaken.OVERTAKEN_CLUSTER_S}.get(mode, PROJECTED_AFTER_S)
    if mode == "overtaken":
        age = _overtaken.overtaken_key(overtaken or {}, book.spec.n_gpus, lambda p: book.estimates.of(p.req))
    else:
        age = (lambda p: book.now - p.submitted_at) if mode == "oldest" else _projected(book)
    cap = AGE_SLOT_MAX_K
    pending = [p for p in pending if cap is None or p.req.k <= cap]
    if AGE_SLOT_EXTRA:
        book.limit += 1  # one more than the depth (it stays so if the request starts in this batch)
    r = reserve_priced(book, pending, age, after) if mode == "priced" else _reserve_first(book, pending, age, after)
    if r is None and AGE_SLOT_EXTRA:
        book.limit -= 1  # no age slot this batch: the depth is the policy's
    return r


def _reserve_first(book: Book, pending: list[Pending], age, after: float) -> Reservation | None:
    """``oldest`` / ``projected``: the request first by ``age``, once it reaches ``after``."""
    oldest = max(pending, key=lambda p: (age(p), -p.seq), default=None)
    if oldest is None or age(oldest) < after:
        return None
    if any(r.request_id == oldest.req.id for r in book.reservations):  # a drain target already
        return None
    return book.reserve(oldest.req, from_now=True)


def _projected(book: Book):
    """Wait so far + estimated run time (an unknown estimate counts as 0: it plans nothing)."""
    def key(p: Pending) -> float:
        est = book.estimates.of(p.req)
        return book.now - p.submitted_at + (est or 0.0)
    return key
