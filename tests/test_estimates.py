"""Issue 21, slice 2: run-time estimates - explicit, the request's time limit, learned per tenant and
size from finished jobs - used for planning (sjf order) only; the simulated clock in the store; the
trace's optional run-time and preemption columns."""

from __future__ import annotations

from pathlib import Path

import pytest
import sqlalchemy as sa

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.queue.clock import now, use_clock
from bandpilot.queue.schema import T_JOBS
from bandpilot.scheduling.estimates import Estimates, expected_end
from bandpilot.simulation.engine import SimConfig, simulate
from bandpilot.simulation.trace import TraceError, TraceJob, format_trace, parse_trace
from bandpilot.scheduling.profile import SchedulerProfile

H100 = Path(__file__).resolve().parents[1] / "params" / "clusters" / "h100.yaml"
HEADER = "id,submit_s,k,tenant,compute_s,comm_fraction"


# fab (the emulated 4 x 8 H100) and store (a fresh SQLite queue on it): tests/conftest.py


def test_clock_override_is_scoped():
    with use_clock(lambda: 123.0):
        assert now() == 123.0
        with use_clock(lambda: 7.0):
            assert now() == 7.0
        assert now() == 123.0
    assert now() > 1e9


def test_estimate_sources_in_order_and_learning_from_finished_jobs(store, fab):
    d = Dispatcher(fab)
    t = [1000.0]
    with use_clock(lambda: t[0]):
        q.submit(store, [{"id": f"old{i}", "k": 2, "tenant": "a"} for i in range(3)] + [{"id": "old-b", "k": 2, "tenant": "b"}])
        sched.run_batch(store, d, SchedulerProfile("test"))
        for i, dur in enumerate((100.0, 300.0, 200.0)):
            t[0] = 1000.0 + dur
            q.release(store, f"old{i}")
        t[0] = 1900.0
        q.release(store, "old-b")
        q.submit(store, [{"id": "x", "k": 2, "tenant": "a"}, {"id": "y", "k": 2, "tenant": "c"},
                         {"id": "z", "k": 4, "tenant": "a"}, {"id": "lim", "k": 2, "tenant": "a", "time_limit_s": 50},
                         {"id": "exp", "k": 2, "tenant": "a", "time_limit_s": 50}])
        q.set_estimates(store, {"exp": 10.0})
    with store.read() as conn:
        est = Estimates.load(conn)
        reqs = {p.req.id: p.req for p in sched.batch.load_pending(conn)[0]}
        (started,) = conn.execute(sa.select(T_JOBS.c.started_at).where(T_JOBS.c.id == "old0")).one()
    assert started == 1000.0  # the store wrote the overridden clock
    assert est.source(reqs["exp"]) == (10.0, "estimate")
    assert est.source(reqs["lim"]) == (50.0, "time_limit")
    assert est.source(reqs["x"]) == (200.0, "learned_tenant_size")  # median of a's 100, 300, 200
    assert est.source(reqs["y"])[1] == "learned_size"  # tenant c never ran: any tenant's 2-GPU jobs
    assert est.source(reqs["z"]) == (None, None)
    assert expected_end(0.0, None, 5.0) == float("inf") and expected_end(0.0, 3.0, 5.0) > 5.0  # overdue: still ahead


def test_sjf_orders_by_time_limit_when_nothing_better_is_known(store, fab):
    q.submit(store, [{"id": "long", "k": 32, "time_limit_s": 9000, "submitted": 1},
                     {"id": "short", "k": 32, "time_limit_s": 60, "submitted": 2}])
    rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", queue_sort="sjf"))
    assert rep.assigned[0].request_id == "short"


def test_trace_runtime_columns_round_trip_and_errors():
    text = (HEADER + ",time_limit_s,preemptible,checkpoint_s,checkpoint_every_s\n"
            "a,0,2,t,100,0.5,300,1,30,600\nb,1,1,t,50,0,,0,,\n")
    a, b = parse_trace(text)
    assert (a.time_limit_s, a.preemptible, a.checkpoint_s, a.checkpoint_every_s) == (300.0, True, 30.0, 600.0)
    assert (b.time_limit_s, b.preemptible, b.checkpoint_s) == (None, False, None)
    assert parse_trace(format_trace([a, b])) == [a, b]
    for row, needle in [("c,0,2,t,1,0,-5,0,,", "time_limit_s -5 must be > 0"), ("c,0,2,t,1,0,,maybe,,", "preemptible"),
                        ("c,0,2,t,1,0,,0,30,", "need preemptible = 1")]:
        with pytest.raises(TraceError, match=needle):
            parse_trace(HEADER + ",time_limit_s,preemptible,checkpoint_s,checkpoint_every_s\n" + row + "\n")


def test_simulation_plans_with_the_trace_limits_not_the_truth(fab):
    # sjf with limits that lie: the truly short job says it is long, so it runs second
    jobs = [TraceJob("liar", 0.0, 32, "t", 100.0, 0.0, time_limit_s=10_000.0),
            TraceJob("honest", 0.0, 32, "t", 5000.0, 0.0, time_limit_s=5000.0)]
    res = simulate(jobs, Dispatcher(fab), fab, SimConfig(profile=SchedulerProfile("test", queue_sort="sjf", backfill="conservative", reservations=2, start_or_wait=True, locality=0.5)))
    rec = {j.id: j for j in res.jobs}
    assert rec["honest"].start_s < rec["liar"].start_s
    oracle = simulate([TraceJob(j.id, j.submit_s, j.k, j.tenant, j.compute_s, j.comm_fraction) for j in jobs],
                      Dispatcher(fab), fab, SimConfig(profile=SchedulerProfile("test", queue_sort="sjf", backfill="conservative", reservations=2, start_or_wait=True, locality=0.5)))
    rec = {j.id: j for j in oracle.jobs}
    assert rec["liar"].start_s < rec["honest"].start_s  # without limits: the stated oracle estimate


def test_hrrn_orders_short_first_and_ages_long_waiters():
    from bandpilot.scheduling.policies import Pending, order_pending

    mk = lambda rid, sub: Pending(q.Request(rid, 2, submitted_at=sub), 0, sub)  # noqa: E731
    pend = [mk("long-old", 0.0), mk("short-new", 900.0), mk("unknown", 0.0)]
    exp = {"long-old": 3600.0, "short-new": 60.0}
    # at t=1000: long-old ratio (1000+3600)/3600 = 1.28, short-new (100+60)/60 = 2.67
    assert [p.req.id for p in order_pending(pend, "hrrn", exp, now=1000.0)] == ["short-new", "long-old", "unknown"]
    # much later the long job has waited long enough to overtake a fresh short one
    pend2 = [mk("long-old", 0.0), mk("short-new", 20000.0)]
    assert [p.req.id for p in order_pending(pend2, "hrrn", exp, now=20010.0)][0] == "long-old"


def test_hrrn_ages_a_very_long_job_as_if_it_were_the_cap_long():
    from bandpilot.scheduling.policies import HRRN_AGE_CAP_S, Pending, order_pending

    mk = lambda rid, sub: Pending(q.Request(rid, 16, submitted_at=sub), 0, sub)  # noqa: E731
    day, t = 24 * 3600.0, 30 * 3600.0
    # a 24 h gang waiting 30 h vs a 1 h job waiting 5 h: uncapped ratios 2.25 vs 6 (the short one
    # first); with the 24 h capped to 8 h the gang's ratio is 1 + 30/8 = 4.75 < 6 - and at 50 h
    # waited its 7.25 overtakes the short one's 6, where uncapped (3.08) it would still lose.
    assert HRRN_AGE_CAP_S == 8 * 3600.0
    exp = {"gang": day, "short": 3600.0}
    order = lambda now, sub_short: [p.req.id for p in order_pending([mk("gang", 0.0), mk("short", sub_short)], "hrrn", exp, now=now)]  # noqa: E731
    assert order(t, t - 5 * 3600.0) == ["short", "gang"]
    assert order(50 * 3600.0, 45 * 3600.0) == ["gang", "short"]
    # below the cap nothing changes: plain response ratios
    exp2 = {"gang": 4 * 3600.0, "short": 3600.0}
    assert [p.req.id for p in order_pending([mk("gang", 0.0), mk("short", 3.5 * 3600)], "hrrn", exp2, now=4 * 3600.0)] == ["gang", "short"]


def test_an_overdue_job_is_expected_to_run_half_its_estimate_more():
    from bandpilot.scheduling.estimates import OVERDUE_SHARE

    assert expected_end(0.0, 100.0, 50.0) == 100.0  # on time: its estimate
    assert expected_end(0.0, 100.0, 300.0) == 300.0 + OVERDUE_SHARE * 100.0 > 300.0  # overdue: never in the past
