"""Which running jobs should make room for a gang that cannot start? Topology-aware preemption, a
PostFilter plug-in (:mod:`bandpilot.scheduling.postfilter`) and the eviction step that carries it out.

When a gang is deferred and it is **starving** (waited at least ``starve_s``) or outranks
preemptible running jobs (higher ``priority``), :class:`PreemptPostFilter` plans victims per
candidate region - an NVLink domain on a domain cluster, a host otherwise, widened by the next
most promising domains/hosts when the gang is larger than one:

* only ``preemptible`` running jobs, of lower priority (or equal, for a starving gang), that did
  not start in this batch and did not start starving themselves (no eviction ping-pong), are
  candidates - never anything else;
* victims are taken cheapest first: GPU-hours lost since the victim's last checkpoint (from its
  start and ``checkpoint_every_s``; all its run when it never checkpoints) plus ``checkpoint_s``
  (one checkpoint + restart) times its GPUs;
* a plan exists only if the placer (the dispatcher, on the state with the victims removed, the gang
  confined to the region and kept off other gangs' reservations) places the gang: a plan never
  evicts without letting the gang start;
* among regions, the cheapest plan wins; plans within :data:`COST_SLACK` of it are ranked by the
  gang's predicted bandwidth there (the bandwidth decides between near-equal prices).

The batch carries a plan out in ONE transaction (:func:`evict`): victims go back to ``pending`` with
their progress (the expected remaining run time, ``bp_estimates``), an audit row says why ("evict a,
b; admit Z on nvl3: 438 GB/s"), then the gang is assigned on the planned GPUs. Because eviction and
admission are one commit, the freed GPUs cannot be taken by anyone else in between - the wasted
eviction Kueue fell into (evict in one clique, admit elsewhere later) cannot happen here, and no
targeted set has to be carried across batches. At most ``max_plans`` plans per batch bound churn.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import numpy as np
import sqlalchemy as sa

from bandpilot.dispatch.state import State
from bandpilot.queue.requests import Request
from bandpilot.queue.schema import T_AUDIT, T_JOBS, T_REQ
from bandpilot.scheduling.estimates import Estimates
from bandpilot.scheduling.placer import Deferred, Placer, merit
from bandpilot.scheduling.postfilter import Plan, Unschedulable
from bandpilot.scheduling.requeue import requeue_running
from bandpilot.topology.cluster import popcount
from bandpilot.topology.domains import domain_index

#: A gang that has waited this long may evict preemptible jobs of equal priority.
STARVE_S = 4 * 3600.0
#: Plans whose cost is within this share of the cheapest are ranked by predicted bandwidth.
COST_SLACK = 0.10
#: Preemption plans carried out per batch (bounds churn when many gangs starve at once).
MAX_PLANS = 1
#: Victims tried per region before the region is given up.
MAX_VICTIMS = 16
#: Regions (domains/hosts as seeds) planned per gang: one preemption plan stays well under a second.
MAX_REGIONS = 32


@dataclass
class Candidate:
    """A running job that may be evicted."""

    id: str
    k: int
    priority: int
    started_at: float
    mask: np.ndarray
    checkpoint_s: float
    every_s: float | None
    expected_s: float | None

    def lost_s(self, now: float) -> float:
        """Wall seconds of work since the last checkpoint (all of it if it never checkpoints)."""
        ran = max(0.0, now - self.started_at)
        return ran % self.every_s if self.every_s else ran

    def cost_gpu_h(self, now: float) -> float:
        return self.k * (self.lost_s(now) + self.checkpoint_s) / 3600.0

    def remaining_s(self, now: float) -> float | None:
        """Expected run time left after a restart: the estimate minus the checkpointed work, plus the restart."""
        if self.expected_s is None:
            return None
        kept = max(0.0, now - self.started_at) - self.lost_s(now)
        return max(60.0, self.expected_s - kept) + self.checkpoint_s


_CANDIDATES = (
    sa.select(T_JOBS.c.id, T_REQ.c.k, T_REQ.c.priority, T_JOBS.c.started_at, T_REQ.c.tenant, T_REQ.c.time_limit_s,
              T_REQ.c.checkpoint_s, T_REQ.c.checkpoint_every_s, T_REQ.c.submitted_at)
    .join(T_REQ, T_REQ.c.id == T_JOBS.c.id)
    .where(T_JOBS.c.status == "active", T_REQ.c.preemptible.is_(True))
    .order_by(T_JOBS.c.id)
)


@dataclass(frozen=True)
class PreemptPlan(Plan):
    selection: Any = None  # the placement the plan was scored with (written as is)
    cost_gpu_h: float = 0.0
    remaining: tuple[tuple[str, float | None], ...] = ()  # (victim, expected remaining run time)


class PreemptPostFilter:
    """Plans victims for a starving or higher-priority gang; never writes."""

    name = "preemption"

    def __init__(self, state: State, placer: Placer, rows: list[tuple], estimates: Estimates, now: float,
                 starve_s: float = STARVE_S, max_plans: int = MAX_PLANS) -> None:
        self.spec = state.spec
        self.placer = placer  # a planning placer of its own: its failure cache must not leak
        self.now, self.starve_s, self.max_plans = now, starve_s, max_plans
        masks = {j.id: j.mask for j in state.jobs}
        self.cands: dict[str, Candidate] = {}
        for jid, k, prio, started, tenant, limit, ckpt, every, submitted in rows:
            # a job that itself started starving is not bounced back (no eviction ping-pong)
            if jid in masks and float(started) - float(submitted) < starve_s:
                est = estimates.of(Request(jid, int(k), tenant, time_limit_s=limit))
                self.cands[jid] = Candidate(jid, int(k), int(prio), float(started), masks[jid], float(ckpt or 0.0),
                                            float(every) if every else None, est)
        self.plans = 0
        self.dom_ids, self.dom_names = domain_index(self.spec.hosts)
        self.full = np.array([(1 << h.n_gpus) - 1 for h in self.spec.hosts], dtype=np.int64)
        self.groups = self._groups()

    @classmethod
    def load(cls, conn: sa.Connection, state: State, placer: Placer, now: float, estimates: Estimates | None = None,
             **kw: Any) -> "PreemptPostFilter":
        est = estimates if estimates is not None else Estimates.load(conn)  # the batch's copy when given
        return cls(state, placer, conn.execute(_CANDIDATES).all(), est, now, **kw)

    def _groups(self) -> list[tuple[str, np.ndarray]]:
        """(name, host indices) per NVLink domain on a domain cluster, per host otherwise."""
        if self.spec.nvlink_domains:
            return [(str(self.dom_names[d]), np.flatnonzero(self.dom_ids == d)) for d in range(len(self.dom_names))]
        return [(h.name, np.array([i])) for i, h in enumerate(self.spec.hosts)]

    def evicted(self, ids: tuple[str, ...], planned: bool) -> None:
        """A plan evicted ``ids``: they are no longer candidates; this plug-in's own plans are counted
        (at most ``max_plans`` a batch)."""
        for v in ids:
            self.cands.pop(v, None)
        self.plans += planned

    # -- planning -------------------------------------------------------------------------------
    def post_filter(self, u: Unschedulable) -> Plan | None:
        req = u.request
        if u.status != "deferred" or self.plans >= self.max_plans or not self.cands:
            return None
        elig, why = self.eligible(req)
        if not elig:
            return None
        best = self._best(req, u.state, u.hidden, elig)
        if best is None:
            return None
        cost, gbps, name, victims, sel = best
        step = (getattr(sel, "placement", None) or {}).get("step_ms")
        pred = f"{gbps:.0f} GB/s" + (f", step {step:.1f} ms" if step is not None else "")
        detail = (f"evict {', '.join(v.id for v in victims)}; admit {req.id} on {name}: "
                  f"{pred} predicted ({why}; {cost:.2f} GPU-h lost)")
        return PreemptPlan(self.name, "preempted", detail, tuple(v.id for v in victims), sel, cost,
                           tuple((v.id, v.remaining_s(self.now)) for v in victims))

    def eligible(self, req: Request) -> tuple[list[Candidate], str]:
        """Victims ``req`` may evict and why: lower priority, or equal when ``req`` is starving."""
        waited = self.now - (req.submitted_at if req.submitted_at is not None else self.now)
        starving = waited >= self.starve_s
        elig = [c for c in self.cands.values()
                if c.priority < req.priority or (starving and c.priority <= req.priority)]
        return elig, (f"waited {waited / 3600:.1f} h" if starving else f"priority {req.priority}")

    def _best(self, req: Request, state: State, hidden: np.ndarray | None, elig: list[Candidate]) -> tuple | None:
        free = state.free & ~(hidden if hidden is not None else 0)
        vic_gpus = np.zeros(self.spec.n_hosts, dtype=np.int64)
        for c in elig:
            vic_gpus |= c.mask
        room = popcount((free | vic_gpus) & self.full)  # GPUs per host the gang could get
        cap = [(int(room[hosts].sum()), name, hosts) for name, hosts in self.groups]
        order = sorted(range(len(cap)), key=lambda i: -cap[i][0])
        plans = []
        for i in order[:MAX_REGIONS]:
            if cap[i][0] == 0:
                break
            hosts, names = list(cap[i][2]), [cap[i][1]]
            for j in order:  # widen by the roomiest other groups until the gang could fit
                if int(room[hosts].sum()) >= req.k:
                    break
                if j != i and cap[j][0] > 0:
                    hosts += list(cap[j][2])
                    names.append(cap[j][1])
            if int(room[hosts].sum()) < req.k:
                continue
            plan = self._region(req, state, hidden, elig, np.array(hosts), "+".join(names))
            if plan is not None:
                plans.append(plan)
        if not plans:
            return None
        cheapest = min(p[0] for p in plans)
        near = [p for p in plans if p[0] <= cheapest * (1 + COST_SLACK) + 1e-9]
        return max(near, key=lambda p: (p[1], -p[0]))

    def _region(self, req: Request, state: State, hidden: np.ndarray | None, elig: list[Candidate],
                hosts: np.ndarray, name: str) -> tuple | None:
        region = np.zeros(self.spec.n_hosts, dtype=np.int64)
        region[hosts] = self.full[hosts]
        inside = [c for c in elig if np.any(c.mask & region)]
        # cheapest GPU-hours per GPU freed inside the region first
        inside.sort(key=lambda c: (c.cost_gpu_h(self.now) / max(1, int(popcount(c.mask & region).sum())), c.id))
        hide = ~region & self.full
        if hidden is not None:
            hide = hide | hidden
        st, victims = state, []
        for c in inside[:MAX_VICTIMS]:
            st = st.without_job(c.id)
            victims.append(c)
            if int(popcount(st.free & ~hide).sum()) < req.k:
                continue
            self.placer.reset_failures()
            self.placer.set_state(st)
            try:
                sel = self.placer.place(req, hide)
            except Deferred:
                continue
            used = self.spec.to_mask(list(sel.gpus))
            # drop victims the placement did not need (their GPUs stayed unused)
            need = [v for v in victims if np.any(v.mask & used)]
            if len(need) < len(victims):
                victims = need
            cost = sum(v.cost_gpu_h(self.now) for v in victims)
            return cost, merit(sel), name, victims, sel  # shaped: by step time
        return None


# -- carrying a plan out (inside the batch's transaction) -----------------------------------------
def evict(conn: sa.Connection, plan: PreemptPlan, gang: Request, ts: float) -> None:
    """Victims back to pending with their expected remaining run time, one audit row. The caller
    assigns the gang in the same savepoint; any surprise raises so the savepoint rolls back."""
    for vid, remaining in plan.remaining:
        if not requeue_running(conn, vid, reason="preempted", detail=f"evicted for {gang.id}",
                               remaining_s=remaining, ts=ts):
            raise EvictionConflict(f"victim {vid!r} is no longer running")
    conn.execute(sa.insert(T_AUDIT).values(
        at=ts, actor="scheduler", action="preempt", target=gang.id, outcome="ok",
        detail=json.dumps({"detail": plan.detail, "victims": list(plan.victims), "lost_gpu_h": plan.cost_gpu_h}, sort_keys=True)))


class EvictionConflict(Exception):
    """A victim changed under the batch (released or evicted by another process)."""
