"""Preemption for the queue's leading starving gang only (``--preempt leader``).

``--preempt on`` lets every starving gang evict, in policy order, so under ``hrrn`` a gang far down
the order could take the GPUs another gang's reservation is draining (or evict for a gang the
reservations would have started soon anyway). Here only the **first blocked gang of the batch** -
the one no reservation is ahead of (no GPUs hidden from it), i.e. the gang that would hold the
first reservation - may evict, and only once it has starved (:data:`~bandpilot.scheduling.preemption.STARVE_S`)
or outranks the victims: it starts now instead of waiting for the whole set to drain. Victims,
their price and the one-transaction eviction are :class:`~bandpilot.scheduling.preemption.PreemptPostFilter`'s.
"""

from __future__ import annotations

from bandpilot.scheduling.postfilter import Plan, Unschedulable
from bandpilot.scheduling.preemption import PreemptPostFilter


class LeaderPreemptPostFilter(PreemptPostFilter):
    """:class:`PreemptPostFilter` restricted to the batch's first blocked gang."""

    name = "leader_preemption"

    def post_filter(self, u: Unschedulable) -> Plan | None:
        if u.hidden is not None and u.hidden.any():
            return None  # a reservation made earlier in this batch is ahead of it: not the leader
        return super().post_filter(u)
