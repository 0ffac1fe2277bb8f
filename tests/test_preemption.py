"""Issue 21, topology-aware preemption: a starving or higher-priority gang evicts the cheapest
preemptible jobs that let it start, in one transaction, audited; never a non-preemptible job."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import sqlalchemy as sa
from crash import kill_mid_run

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.errors import RequestError
from bandpilot.queue.clock import use_clock
from bandpilot.queue.schema import T_AUDIT, T_ESTIMATES, T_REQ
from bandpilot.scheduling.profile import ProfileError, SchedulerProfile

H100 = Path(__file__).resolve().parents[1] / "params" / "clusters" / "h100.yaml"
H = 3600.0


# fab (the emulated 4 x 8 H100) and store (a fresh SQLite queue on it): tests/conftest.py


def _fill(store, fab, *, preemptible=(True, True, False)):
    """P1 (16 GPUs), P2 (8) and N (8) fill the 32-GPU cluster at t=0; G (16 GPUs) arrives at t=1."""
    def job(rid, k, pre):
        ck = {"preemptible": True, "checkpoint_s": 60, "checkpoint_every_s": 600} if pre else {}
        return {"id": rid, "k": k, "submitted": 0, "time_limit_s": 20 * H, **ck}

    q.submit(store, [job("P1", 16, preemptible[0]), job("P2", 8, preemptible[1]), job("N", 8, preemptible[2])])
    rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test"))
    assert len(rep.assigned) == 3
    q.submit(store, [{"id": "G", "k": 16, "submitted": 1, "time_limit_s": 2 * H}])


def _raw(store):
    with store.read() as conn:
        return dict(conn.execute(sa.select(T_REQ.c.id, T_REQ.c.status)).all())


def scenario_starving_gang_preempts(store, fab):
    """Shared with test_queue_pg.py: the same plan on PostgreSQL."""
    with use_clock(lambda: 0.0):
        _fill(store, fab)
    with use_clock(lambda: 5 * H + 300):  # G waited 5 h: starving; P1/P2 lost 300 s since their checkpoint
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", preempt=True))
    out = {o.request_id: o for o in rep.outcomes}
    assert out["G"].status == "assigned" and len(out["G"].gpus) == 16
    assert rep.preempted and rep.preempted[0]["request_id"] == "G"
    victims = rep.preempted[0]["victims"]
    assert victims and "N" not in victims
    st = _raw(store)
    assert st["N"] == "assigned" and st["G"] == "assigned"
    assert all(st[v] == "pending" for v in victims)
    assert q.check_invariants(store) == []
    detail = out["G"].detail
    assert detail.startswith(f"evict {', '.join(victims)}; admit G on ") and "GB/s" in detail
    with store.read() as conn:
        audit = conn.execute(sa.select(T_AUDIT.c.action, T_AUDIT.c.target, T_AUDIT.c.detail)).all()
        est = dict(conn.execute(sa.select(T_ESTIMATES.c.request_id, T_ESTIMATES.c.expected_s)).all())
    assert [(a.action, a.target) for a in audit if a.action == "preempt"] == [("preempt", "G")]
    assert json.loads(audit[-1].detail)["victims"] == victims
    for v in victims:  # progress kept: 5 h of a 20 h limit checkpointed -> ~15 h left (+ restart)
        assert 14.9 * H < est[v] < 15.1 * H
    return victims


def test_a_starving_gang_evicts_preemptible_jobs_and_starts(store, fab):
    victims = scenario_starving_gang_preempts(store, fab)
    assert victims in (["P1"], ["P2"]) or set(victims) <= {"P1", "P2"}


def test_the_cheapest_victims_are_chosen(store, fab):
    """P2 checkpointed just now (nothing lost), P1 lost 9 minutes: 8 GPUs from P2 + N's host cannot
    work (N is not preemptible), so the 16 GPUs come from P1 alone or P2 + ... - the plan costs the least."""
    with use_clock(lambda: 0.0):
        _fill(store, fab)
    with use_clock(lambda: 5 * H + 540):
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", preempt=True))
    plan = rep.preempted[0]
    # P1 alone frees 16 GPUs: 16 x (540 + 60) s; P2 cannot free 16 without N
    assert plan["victims"] == ["P1"]
    assert plan["lost_gpu_h"] == pytest.approx(16 * 600 / H)


def test_never_evicts_non_preemptible_jobs(store, fab):
    with use_clock(lambda: 0.0):
        _fill(store, fab, preemptible=(False, False, False))
    with use_clock(lambda: 5 * H):
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", preempt=True))
    assert rep.preempted == [] and rep.assigned == []
    assert _raw(store) == {"P1": "assigned", "P2": "assigned", "N": "assigned", "G": "pending"}
    assert q.check_invariants(store) == []


def test_no_preemption_when_off_or_not_starving_unless_higher_priority(store, fab):
    with use_clock(lambda: 0.0):
        _fill(store, fab)
    with use_clock(lambda: 5 * H):
        assert sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test")).preempted == []  # off by default in run_batch
    with use_clock(lambda: 1 * H):  # waited 1 h, same priority: not starving
        assert sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", preempt=True)).preempted == []
        q.submit(store, [{"id": "U", "k": 8, "submitted": 3000, "priority": 5}])
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", preempt=True))
    assert [p["request_id"] for p in rep.preempted] == ["U"]
    assert q.check_invariants(store) == []
    with pytest.raises(ProfileError, match="preempt must be true or false"):
        SchedulerProfile("test", preempt="maybe")
    with pytest.raises(RequestError, match="unknown profile 'preempting'"):
        sched.run_batch(store, Dispatcher(fab), "preempting")


_RUNNER = """
import sys
from bandpilot.scheduling.profile import ProfileError, SchedulerProfile
import time
from bandpilot import queue as q, scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.fabric.emulator import make_fabric
from bandpilot.queue.clock import use_clock
store = q.Store(sys.argv[1])
print("START", flush=True)
with use_clock(lambda: 5 * 3600.0):
    # after_each sleeps inside the transaction, after the eviction: a window to kill -9 mid-preemption
    sched.run_batch(store, Dispatcher(make_fabric(store.spec)), SchedulerProfile("test", preempt=True), after_each=lambda o: time.sleep(0.5))
"""


@pytest.mark.slow
def test_kill9_mid_preemption_leaves_the_old_state(store, fab):
    with use_clock(lambda: 0.0):
        _fill(store, fab)
        q.submit(store, [{"id": f"s{i}", "k": 1, "submitted": 5 + i} for i in range(6)])
    before = _raw(store)
    kill_mid_run(_RUNNER, store.url, after_s=2.0)
    assert _raw(store) == before  # one transaction: no victim evicted, G still pending
    assert q.check_invariants(store) == []
    with use_clock(lambda: 5 * H):
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", preempt=True))
    assert rep.preempted and q.check_invariants(store) == []


def test_simulated_preemption_restarts_victims_and_counts_the_waste(fab):
    """A 32-GPU gang behind preemptible 8-GPU jobs: with preempt on it starts after 4 h of waiting,
    the victims restart from their checkpoint and finish; summary counts preemptions and waste."""
    from bandpilot.simulation.engine import SimConfig, simulate
    from bandpilot.simulation.report import summarize
    from bandpilot.simulation.trace import TraceJob

    def pre(i, t):
        return TraceJob(f"p{i}", t, 8, "a", 20 * H, 0.3, preemptible=True, checkpoint_s=120.0, checkpoint_every_s=1800.0)

    jobs = [pre(0, 0), pre(1, 0), pre(2, 0), pre(3, 0), TraceJob("G", 60, 32, "b", 2 * H, 0.5)]
    d = Dispatcher(fab)
    out = {}
    for mode in ("off", "on"):
        cfg = SimConfig(profile=SchedulerProfile("test", backfill="easy", preempt=mode == "on"), interval_s=300)
        res = simulate(jobs, d, fab, cfg)
        out[mode] = (summarize(res), {j.id: j for j in res.jobs})
    s_off, recs_off = out["off"]
    s_on, recs_on = out["on"]
    assert s_off["preemptions"] == 0 and s_off["wasted_gpu_hours"] == 0
    assert s_on["completed"] == s_off["completed"] == 5
    assert s_on["preemptions"] >= 1 and s_on["wasted_gpu_hours"] > 0
    assert recs_on["G"].jct_s < recs_off["G"].jct_s  # the gang no longer waits for 20 h jobs
    assert recs_on["G"].queue_s < 4 * H + 600
    for j in recs_on.values():  # a victim lost at most one checkpoint period + restart per eviction
        assert j.wasted_gpu_s <= j.preemptions * j.k * (1800 + 120) + 1e-6
    assert s_on["preempt"] is True


def test_preemption_is_off_in_every_named_profile():
    from bandpilot.scheduling.profile import PROFILES
    from bandpilot.simulation.engine import SimConfig

    # measured: on top of the recommended order it costs the mean and does not bound the largest JCT
    assert SimConfig().profile.preempt is False
    assert not any(p.preempt for p in PROFILES.values())
