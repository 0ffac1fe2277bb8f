"""Issue 21, ``--preempt leader``: only the batch's first blocked gang (no reservation ahead of it)
may evict; the eviction itself is the preemption plug-in's (one transaction, audited)."""

from __future__ import annotations

import sqlalchemy as sa

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.queue.clock import use_clock
from bandpilot.queue.schema import T_REQ

H = 3600.0


# fab (the emulated 4 x 8 H100) and store (a fresh SQLite queue on it): tests/conftest.py


def _fill(store, fab):
    """P1 (16 GPUs) and P2 (8) preemptible, N (8) not, fill the cluster; A (32) then G (16) wait."""
    def job(rid, k, pre, t=0, limit=20 * H):
        ck = {"preemptible": True, "checkpoint_s": 60, "checkpoint_every_s": 600} if pre else {}
        return {"id": rid, "k": k, "submitted": t, "time_limit_s": limit, **ck}

    with use_clock(lambda: 0.0):
        q.submit(store, [job("P1", 16, True), job("P2", 8, True), job("N", 8, False)])
        assert len(sched.run_batch(store, Dispatcher(fab)).assigned) == 3
        # G runs long: started now it would still hold its GPUs when A's reservation begins
        q.submit(store, [job("A", 32, False, 1), job("G", 16, False, 2, limit=30 * H)])


def _batch(store, fab, mode):
    with use_clock(lambda: 5 * H):  # both waited 5 h: starving
        return sched.run_batch(store, Dispatcher(fab), policy="fifo", backfill="easy", preempt=mode)


def test_only_the_leading_blocked_gang_may_evict(store, fab):
    _fill(store, fab)
    rep = _batch(store, fab, "leader")
    # A leads but cannot start even with every preemptible job gone (N holds 8 GPUs): it reserves;
    # G, starving too, is behind A's reservation: it may not evict
    assert rep.preempted == [] and rep.assigned == []
    out = {o.request_id: o for o in rep.outcomes}
    assert out["A"].reason == "reserved" and out["G"].reason != "preempted"
    with store.read() as conn:
        st = dict(conn.execute(sa.select(T_REQ.c.id, T_REQ.c.status)).all())
    assert st == {"P1": "assigned", "P2": "assigned", "N": "assigned", "A": "pending", "G": "pending"}
    assert q.check_invariants(store) == []


def test_the_leader_evicts_and_starts(store, fab):
    """With A gone, G leads: it evicts the cheapest preemptible jobs and starts in one transaction."""
    _fill(store, fab)
    with use_clock(lambda: 1.0):
        q.cancel(store, "A")
    rep = _batch(store, fab, "leader")
    assert [p["request_id"] for p in rep.preempted] == ["G"]
    assert set(rep.preempted[0]["victims"]) <= {"P1", "P2"}
    assert {o.request_id: o.status for o in rep.outcomes}["G"] == "assigned"
    assert q.check_invariants(store) == []


def test_leader_mode_in_the_simulator(fab):
    """A 32-GPU gang behind preemptible 8-GPU jobs: it leads the queue, starves at 4 h, evicts and
    starts; the victims restart from their checkpoints and every job completes."""
    from bandpilot.simulation.engine import SimConfig, simulate
    from bandpilot.simulation.report import summarize
    from bandpilot.simulation.trace import TraceJob

    def pre(i):
        return TraceJob(f"p{i}", 0, 8, "a", 20 * H, 0.3, preemptible=True, checkpoint_s=120.0, checkpoint_every_s=1800.0)

    jobs = [pre(0), pre(1), pre(2), pre(3), TraceJob("G", 60, 32, "b", 2 * H, 0.5)]
    res = simulate(jobs, Dispatcher(fab), fab, SimConfig(policy="fifo", backfill="easy", preempt="leader", interval_s=300))
    s, recs = summarize(res), {j.id: j for j in res.jobs}
    assert s["completed"] == 5 and s["preemptions"] >= 1 and s["wasted_gpu_hours"] > 0
    assert recs["G"].queue_s < 4 * H + 600
