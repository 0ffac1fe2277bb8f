"""What happens when nothing fits? The PostFilter extension point of the Kubernetes scheduler
framework: after the Filter step (:meth:`Constraints.filter <bandpilot.dispatch.constraints.Constraints.filter>`)
and the dispatcher leave no placement for a request, the placer calls its PostFilter plug-ins, in
order, until one returns a :class:`Plan`.

Interface (a :class:`PostFilter` is any object with ``name``, ``post_filter`` and ``evicted``):

* **input** - one :class:`Unschedulable`: the request, the in-memory state the placer tried it on
  (earlier assignments of the batch included), and why it did not fit (``status`` ``deferred`` or
  ``rejected``, the ``reason`` code and the one-line ``detail``; ``hidden``: free GPUs the request
  was not allowed to take, e.g. another gang's reservation).
* **output** - a :class:`Plan` or ``None`` (this plug-in has nothing to say; the next one is asked).
  A plan carries the reason and detail stored on the request row and shown by ``queue show`` /
  the API, and optionally ``victims``: running jobs to evict so the request fits (preemption).
  A plug-in must not write: the batch loop owns the transaction and acts on the plan.
* **after an eviction** - ``evicted(ids, planned)``: every plug-in is told which running jobs a
  carried-out plan evicted (``planned``: the plan was this plug-in's), so none plans with them again.

Plug-ins, first to last: with a profile's ``preempt`` the preemption plug-in
(:class:`~bandpilot.scheduling.preemption.PreemptPostFilter`, asked first: a plan that starts the
gang now beats a reservation for later), those added with :meth:`Placer.add_post_filter
<bandpilot.scheduling.placer.Placer.add_post_filter>` (the backfill book's
:class:`ReservationPostFilter` under ``easy`` / ``conservative`` backfill), then the default
:class:`RecordReason`, which always answers and records why nothing fit (the deferral's own reason
and detail, as stored before this extension point existed). A plan with victims is carried out by
the batch loop (:func:`~bandpilot.scheduling.preemption.evict` and the gang's assignment, one savepoint).
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, Protocol

import numpy as np

from bandpilot.dispatch.state import State
from bandpilot.queue.requests import Request

__all__ = ["Plan", "PostFilter", "RecordReason", "ReservationPostFilter", "Unschedulable", "run_post_filters"]


@dataclass(frozen=True)
class Unschedulable:
    """A request nothing fit, and why."""

    request: Request
    state: State  # the in-memory state it was tried on
    status: str  # "deferred" (retried next batch) | "rejected" (never placeable)
    reason: str  # a code: insufficient_gpus, constraint_unmet, invalid_request, dispatcher_error, ...
    detail: str  # one line, shown to the tenant
    hidden: np.ndarray | None = None  # free GPUs the request could not take (reservations)


@dataclass(frozen=True)
class Plan:
    """What a PostFilter plug-in proposes for an unschedulable request."""

    plugin: str
    reason: str  # the code stored on the request row
    detail: str  # the one line stored with it
    victims: tuple[str, ...] = ()  # running job ids to evict so the request fits (preemption)


class PostFilter(Protocol):
    name: str

    def post_filter(self, u: Unschedulable) -> Plan | None:
        """A plan for ``u``, or None to let the next plug-in answer. Never writes."""
        ...

    def evicted(self, ids: tuple[str, ...], planned: bool) -> None:
        """A carried-out plan evicted the running jobs ``ids`` (``planned``: the plan was this plug-in's)."""
        ...


class RecordReason:
    """The default, last plug-in: record why nothing fit (the deferral's reason and detail)."""

    name = "record_reason"

    def post_filter(self, u: Unschedulable) -> Plan:
        return Plan(self.name, u.reason, u.detail)

    def evicted(self, ids: tuple[str, ...], planned: bool) -> None:
        """Nothing to forget: it plans with nothing."""


class ReservationPostFilter:
    """Backfill (:mod:`bandpilot.scheduling.reservations`): a blocked gang gets a reservation if a
    slot is left, or is told which reservation it protects."""

    name = "reservations"

    def __init__(self, book: Any) -> None:
        self.book = book

    def post_filter(self, u: Unschedulable) -> Plan | None:
        if u.status != "deferred":
            return None
        note = SimpleNamespace(reason=u.reason, detail=u.detail)
        self.book.note_blocked(u.request, u.hidden, u.state.n_free, note)
        if (note.reason, note.detail) == (u.reason, u.detail):
            return None
        return Plan(self.name, note.reason, note.detail)

    def evicted(self, ids: tuple[str, ...], planned: bool) -> None:
        """The evicted jobs' GPUs are free now: the book plans with them."""
        self.book.evicted(ids)


def run_post_filters(plugins: list[Any], u: Unschedulable) -> Plan:
    """Ask ``plugins`` in order; the first plan wins (:class:`RecordReason` if none answers)."""
    for plugin in plugins:
        plan = plugin.post_filter(u)
        if plan is not None:
            return plan
    return RecordReason().post_filter(u)
