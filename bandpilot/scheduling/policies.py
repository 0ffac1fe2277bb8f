"""In which order are pending requests tried, and how many GPUs may each tenant take?

Policies order the pending requests: ``fifo`` (submit time), ``priority`` (higher first, then FIFO),
``sjf`` (shortest expected run time first, :mod:`bandpilot.queue.learning` estimates; requests
without one after, FIFO) and ``utility`` (higher job utility first; when the queued demand exceeds the free GPUs, each
tenant gets a GPU quota proportional to its requests' utility, seed 001 eq. 31, and requests over
their tenant's quota only get what is left after everyone within quota). Every request in the
order is tried (backfill): one that does not fit is deferred with its reason and a later, smaller
one may still be placed.
"""

from __future__ import annotations

import json
import math
import operator
from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Mapping, Sequence

import numpy as np
import sqlalchemy as sa

from bandpilot.dispatch.shape import Shape
from bandpilot.errors import RequestError
from bandpilot.dispatch.constraints import Constraints
from bandpilot.queue.requests import Request
from bandpilot.queue.schema import T_REQ

#: ``hrrn`` ages a request whose expected run time is longer than this as if it were this long, so
#: its response ratio grows at least ``wait / 8 h`` (a long gang no longer waits ~1.6x its own run
#: time behind a stream of short jobs). Measured (the mixed workload, 2 seeds x 2 demand models):
#: uncapped 4.64 / 4.54 h mean, max 86 / 62 h; 8 h: 4.04 / 4.20 h, max 57 / 58 h; 4-5 h: max
#: 45-49 h but the ``full`` mean rises to ~5.1 h.
HRRN_AGE_CAP_S = 8 * 3600.0
@dataclass(frozen=True)
class Pending:
    req: Request
    seq: int
    submitted_at: float


@lru_cache(maxsize=4096)
def _stored_constraints(text: str | None) -> Constraints:
    return Constraints.from_dict(json.loads(text)) if text else Constraints()


@lru_cache(maxsize=4096)
def _stored_shape(text: str | None) -> Shape | None:
    return Shape.parse(json.loads(text)) if text else None


_PENDING_COLS = (T_REQ.c.seq, T_REQ.c.id, T_REQ.c.k, T_REQ.c.tenant, T_REQ.c.priority, T_REQ.c.utility,
                 T_REQ.c.submitted_at, T_REQ.c.constraints, T_REQ.c.time_limit_s, T_REQ.c.comm_fraction,
                 T_REQ.c.preemptible, T_REQ.c.checkpoint_s, T_REQ.c.checkpoint_every_s, T_REQ.c.shape,
                 T_REQ.c.min_k, T_REQ.c.max_k, T_REQ.c.k_step, T_REQ.c.scaling, T_REQ.c.reason, T_REQ.c.detail)
#: How many leading columns of a pending row describe the request (the rest are its stored note).
PENDING_REQ_COLS = len(_PENDING_COLS) - 2
PENDING_STMT = sa.select(*_PENDING_COLS).where(T_REQ.c.status == "pending").order_by(T_REQ.c.submitted_at, T_REQ.c.seq)
_pending_cache: dict[tuple, "Pending"] = {}


def row_to_pending(row: tuple) -> Pending:
    p = _pending_cache.get(row)
    if p is None:
        seq, rid, k, tenant, prio, util, sub, cons, limit, comm, pre, ckpt, every, shape, lo, hi, step, eta = row
        req = Request(rid, int(k), tenant, int(prio), util, float(sub), _stored_constraints(cons),
                      limit, comm, bool(pre), ckpt, every, _stored_shape(shape), lo, hi, step, eta)
        p = Pending(req, int(seq), float(sub))
        if len(_pending_cache) > 200_000:
            _pending_cache.clear()
        _pending_cache[row] = p  # keyed by the whole row: an edited row is parsed afresh
    return p


def utility_prior(pending: Sequence[Pending]) -> float:
    """Utility of a request that gives none: the mean of those that do (1.0 if none do) - a
    neutral prior, as the seed's scheduler falls back to a default for jobs without a score."""
    known = [p.req.utility for p in pending if p.req.utility is not None]
    return float(np.mean(known)) if known else 1.0


#: (submitted_at, seq): the FIFO order, as a C-level key (the batch sorts every pending request)
_FIFO_KEY = operator.attrgetter("submitted_at", "seq")


@dataclass(frozen=True)
class QueueSort:
    """A QueueSort plug-in (the first extension point of a scheduler profile): the order pending
    requests are tried in. ``order(pending, expected, now)`` returns them sorted; ``expected`` holds
    the run-time estimates when ``estimates`` is set (else it is empty); ``quotas``: the batch gives
    each tenant a GPU quota by utility (:func:`utility_quotas`) when requests compete."""

    name: str
    order: Callable[[Sequence[Pending], Mapping[str, float], float | None], list[Pending]]
    doc: str
    estimates: bool = False
    quotas: bool = False


_SORTS: dict[str, QueueSort] = {}


def register_queue_sort(sort: QueueSort) -> QueueSort:
    """Add a QueueSort plug-in; a profile may then name it (``queue_sort: NAME``)."""
    if sort.name in _SORTS:
        raise ValueError(f"queue sort {sort.name!r} is already registered")
    _SORTS[sort.name] = sort
    return sort


def queue_sorts() -> tuple[str, ...]:
    """The registered QueueSort names, in registration order."""
    return tuple(_SORTS)


def queue_sort(name: str) -> QueueSort:
    """The QueueSort plug-in ``name``; an unknown one is a one-line :class:`RequestError`."""
    try:
        return _SORTS[name]
    except KeyError:
        raise RequestError(f"unknown policy {name!r}: use one of {', '.join(_SORTS)}") from None


def order_pending(pending: Sequence[Pending], policy: str, expected: Mapping[str, float] | None = None,
                  now: float | None = None) -> list[Pending]:
    """``pending`` in the order of the QueueSort plug-in ``policy`` (the built-ins below)."""
    return queue_sort(policy).order(pending, expected or {}, now)


def _sjf(pending: Sequence[Pending], exp: Mapping[str, float], now: float | None) -> list[Pending]:
    return sorted(pending, key=lambda p: (p.req.id not in exp, exp.get(p.req.id, 0.0), p.submitted_at, p.seq))


def _utility(pending: Sequence[Pending], exp: Mapping[str, float], now: float | None) -> list[Pending]:
    prior = utility_prior(pending)
    return sorted(
        pending,
        key=lambda p: (-(p.req.utility if p.req.utility is not None else prior), -p.req.priority, p.submitted_at, p.seq),
    )


def _hrrn(pending: Sequence[Pending], exp: Mapping[str, float], now: float | None) -> list[Pending]:
    """``hrrn`` order: the response ratio with the expected run time capped at :data:`HRRN_AGE_CAP_S`."""
    t = max((p.submitted_at for p in pending), default=0.0) if now is None else now
    cap = HRRN_AGE_CAP_S

    def ratio(p: Pending) -> float:
        e = exp.get(p.req.id)
        if e is None:
            return 0.0
        capped = max(min(e, cap), 1e-9)
        wait = max(0.0, t - p.submitted_at)
        return (wait + capped) / capped

    return sorted(pending, key=lambda p: (p.req.id not in exp, -ratio(p), p.submitted_at, p.seq))


for _sort in (
    QueueSort("fifo", lambda pending, exp, now: sorted(pending, key=_FIFO_KEY), "submit time, then arrival"),
    QueueSort("priority", lambda pending, exp, now: sorted(pending, key=lambda p: (-p.req.priority, p.submitted_at, p.seq)),
              "higher priority first, then FIFO"),
    QueueSort("sjf", _sjf, "shortest expected run time first; requests without an estimate last, FIFO", estimates=True),
    QueueSort("utility", _utility, "higher job utility first, then priority, then FIFO; per-tenant GPU quotas by "
              "utility when requests compete", quotas=True),
    QueueSort("hrrn", _hrrn, "highest response ratio (wait + expected) / expected first, the expected run time capped "
              "at 8 h: short jobs go early like sjf, and a long one cannot starve behind them", estimates=True),
):
    register_queue_sort(_sort)
#: The built-in QueueSort plug-ins.
POLICIES = queue_sorts()


def utility_quotas(pending: Sequence[Pending], n_free: int) -> dict[str, int] | None:
    """Per-tenant GPU quotas proportional to utility when requests compete (seed 001, eq. 31).

    Each request's share of the free GPUs is ``F * U_j / sum U``; a tenant's quota is the sum over
    its requests, made integer by largest remainders so quotas add up to ``F`` exactly. ``None``
    when the queued demand fits in the free GPUs (no competition, no quotas).
    """
    if not pending or sum(p.req.k for p in pending) <= n_free:
        return None
    prior = utility_prior(pending)
    stake: dict[str, float] = {}
    for p in pending:
        u = p.req.utility if p.req.utility is not None else prior
        stake[p.req.tenant] = stake.get(p.req.tenant, 0.0) + u
    total = sum(stake.values())
    if total <= 0:
        stake = {t: 1.0 for t in stake}
        total = float(len(stake))
    exact = {t: n_free * s / total for t, s in stake.items()}
    quota = {t: math.floor(x) for t, x in exact.items()}
    left = n_free - sum(quota.values())
    for t in sorted(exact, key=lambda t: (-(exact[t] - quota[t]), -stake[t], t))[:left]:
        quota[t] += 1
    return quota
