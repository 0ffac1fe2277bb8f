"""Issue 21, ``--preempt overrun``: the leading blocked gang, once it has waited
``GANG_WAIT_S``, may evict preemptible jobs that ran past their estimate (the limit its reservation
was planned around) - only those, only once each, and only when that starts it now."""

from __future__ import annotations

import sqlalchemy as sa

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.queue.clock import use_clock
from bandpilot.queue.schema import T_ESTIMATES, T_REQ
from bandpilot.scheduling import overrun_preempt as op

H = 3600.0


# fab (the emulated 4 x 8 H100) and store (a fresh SQLite queue on it): tests/conftest.py


def _fill(store, fab, p1_limit=2 * H):
    """P1 (16 GPUs, preemptible, limit ``p1_limit``), P2 (8, preemptible, 20 h) and N (8, not
    preemptible, 2 h) fill the cluster at t=0; G (16) arrives at t=1."""
    def job(rid, k, pre, limit):
        ck = {"preemptible": True, "checkpoint_s": 60, "checkpoint_every_s": 600} if pre else {}
        return {"id": rid, "k": k, "submitted": 0, "time_limit_s": limit, **ck}

    with use_clock(lambda: 0.0):
        q.submit(store, [job("P1", 16, True, p1_limit), job("P2", 8, True, 20 * H), job("N", 8, False, 2 * H)])
        assert len(sched.run_batch(store, Dispatcher(fab)).assigned) == 3
    q.submit(store, [{"id": "G", "k": 16, "submitted": 1, "time_limit_s": 2 * H}])


def _batch(store, fab, at):
    with use_clock(lambda: at):
        return sched.run_batch(store, Dispatcher(fab), policy="fifo", backfill="easy", preempt="overrun")


def _status(store):
    with store.read() as conn:
        return dict(conn.execute(sa.select(T_REQ.c.id, T_REQ.c.status)).all())


def test_a_waiting_leader_evicts_only_the_overrun_preemptible_job(store, fab):
    _fill(store, fab)
    rep = _batch(store, fab, op.GANG_WAIT_S + 300)  # P1 ran far past its 2 h limit; P2 is within its 20 h
    assert [(p["request_id"], p["victims"]) for p in rep.preempted] == [("G", ["P1"])]
    assert {o.request_id: o.status for o in rep.outcomes}["G"] == "assigned"
    assert _status(store) == {"P1": "pending", "P2": "assigned", "N": "assigned", "G": "assigned"}
    assert "victims past their time limit" in rep.preempted[0]["detail"]
    with store.read() as conn:
        est = dict(conn.execute(sa.select(T_ESTIMATES.c.request_id, T_ESTIMATES.c.expected_s)).all())
    # planned as an overrun (half its 2 h estimate more) + 300 s lost since its checkpoint + 60 s restart,
    # not "estimate minus checkpointed work" (~0: it would rank as the shortest job)
    assert abs(est["P1"] - (1 * H + 300 + 60)) < 1.0
    with store.read() as conn:
        assert op.evicted_before(conn) == {"P1"}
    assert q.check_invariants(store) == []


def test_no_eviction_before_the_gang_waited_or_of_jobs_within_their_limit(store, fab):
    _fill(store, fab)
    rep = _batch(store, fab, op.GANG_WAIT_S - 600)  # P1 overran, but G has not waited long enough
    assert rep.preempted == [] and _status(store)["G"] == "pending"


def test_jobs_within_their_limit_are_never_victims(store, fab):
    _fill(store, fab, p1_limit=40 * H)  # now only N overran, and N is not preemptible
    rep = _batch(store, fab, op.GANG_WAIT_S + 300)
    assert rep.preempted == [] and _status(store)["G"] == "pending"


def test_a_job_is_evicted_for_overrunning_at_most_once(store, fab):
    _fill(store, fab)
    _batch(store, fab, op.GANG_WAIT_S + 300)  # P1 evicted for G
    with use_clock(lambda: op.GANG_WAIT_S + 400):
        q.release(store, "G")  # G ends; P1 restarts on its GPUs ...
    assert [o.request_id for o in _batch(store, fab, op.GANG_WAIT_S + 500).assigned] == ["P1"]
    q.submit(store, [{"id": "G2", "k": 16, "submitted": op.GANG_WAIT_S + 600, "time_limit_s": 2 * H}])
    # ... and overruns its new estimate; G2 has waited long enough, but P1 was evicted once already
    rep = _batch(store, fab, 3 * op.GANG_WAIT_S)
    assert "P1" not in {v for p in rep.preempted for v in p["victims"]}
    assert _status(store)["P1"] == "assigned"


def test_overrun_mode_in_the_simulator(fab):
    """A 32-GPU gang behind preemptible jobs that run 20 h on a 2 h limit: it evicts them once it has
    waited GANG_WAIT_S; the victims restart from their checkpoints and every job completes."""
    from bandpilot.simulation.engine import SimConfig, simulate
    from bandpilot.simulation.report import summarize
    from bandpilot.simulation.trace import TraceJob

    def pre(i):
        return TraceJob(f"p{i}", 0, 8, "a", 20 * H, 0.3, time_limit_s=2 * H, preemptible=True,
                        checkpoint_s=120.0, checkpoint_every_s=1800.0)

    late = op.GANG_WAIT_S + 1800  # an arrival: the simulator runs a batch only when something changed
    jobs = [pre(0), pre(1), pre(2), pre(3), TraceJob("G", 60, 32, "b", 2 * H, 0.5, time_limit_s=2 * H),
            TraceJob("late", late, 1, "c", H, 0.0, time_limit_s=H)]
    res = simulate(jobs, Dispatcher(fab), fab, SimConfig(policy="fifo", backfill="easy", preempt="overrun", interval_s=300))
    s, recs = summarize(res), {j.id: j for j in res.jobs}
    assert s["completed"] == 6 and s["preemptions"] == 4 and s["wasted_gpu_hours"] > 0
    assert recs["G"].queue_s < late + 600
