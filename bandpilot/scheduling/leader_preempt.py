"""Preemption for the queue's leading starving gang only (``--preempt leader``).

``--preempt on`` lets every starving gang evict, in policy order, including gangs behind the
batch's reservations (on GPUs no reservation holds), so evictions can serve a gang the order put
behind others. Here only the **first blocked gang of the batch** - the one no reservation is ahead
of (no GPUs hidden from it), i.e. the gang that would hold the first reservation - may evict, and
only once it has starved (:data:`~bandpilot.scheduling.preemption.STARVE_S`) or outranks the
victims: it starts now instead of waiting for its GPUs to drain. Measured on issue 21's mixed
workload under the default queue (README, "Fourth round"): worse than ``on`` (mean and largest
JCT), off by default. Victims, their price and the one-transaction eviction are
:class:`~bandpilot.scheduling.preemption.PreemptPostFilter`'s.
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
