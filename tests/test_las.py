"""Issue 21 item 6: least attained service first (Tiresias' 2D-LAS) with preemption of the
most-attained preemptible jobs, in the live batch and the simulator."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.queue.clock import use_clock
from bandpilot.queue.schema import T_AUDIT
from bandpilot.scheduling.las import load_attained
from bandpilot.scheduling.policies import LAS_THRESHOLDS_GPU_S, Pending, las_level, order_pending
from bandpilot.simulation.engine import SimConfig, simulate
from bandpilot.simulation.workloads import mixed_workload

H = 3600.0

# fab (the emulated 4 x 8 H100) and store (a fresh SQLite queue on it): tests/conftest.py


def test_las_orders_by_level_of_attained_service_then_fifo():
    mk = lambda rid, sub: Pending(q.Request(rid, 2, submitted_at=sub), 0, sub)  # noqa: E731
    pend = [mk("ran-a-lot", 0.0), mk("ran-a-bit", 1.0), mk("new", 2.0), mk("older-new", 1.5)]
    got = {"ran-a-lot": LAS_THRESHOLDS_GPU_S[-1] + 1, "ran-a-bit": LAS_THRESHOLDS_GPU_S[0] / 2}
    assert [p.req.id for p in order_pending(pend, "las", attained=got)] == ["ran-a-bit", "older-new", "new", "ran-a-lot"]
    assert [las_level(x) for x in (0.0, LAS_THRESHOLDS_GPU_S[0], LAS_THRESHOLDS_GPU_S[-1] + 1)] == [0, 1, 2]


def _fill(store, fab):
    """L (16 GPUs, preemptible) and N (16, not preemptible) fill the cluster at t=0; S (8) arrives at t=1."""
    ck = {"preemptible": True, "checkpoint_s": 60, "checkpoint_every_s": 600}
    q.submit(store, [{"id": "L", "k": 16, "submitted": 0, "time_limit_s": 20 * H, **ck},
                     {"id": "N", "k": 16, "submitted": 0, "time_limit_s": 20 * H}])
    assert len(sched.run_batch(store, Dispatcher(fab)).assigned) == 2
    q.submit(store, [{"id": "S", "k": 8, "submitted": 1, "time_limit_s": H}])


def test_a_new_job_evicts_the_most_attained_preemptible_job_and_its_service_is_remembered(store, fab):
    with use_clock(lambda: 0.0):
        _fill(store, fab)
    with use_clock(lambda: 600.0):  # L received 16 x 600 s = 2.7 GPU-h: level 1; S (0) is level 0
        rep = sched.run_batch(store, Dispatcher(fab), policy="las", preempt="on")
    out = {o.request_id: o for o in rep.outcomes}
    assert out["S"].status == "assigned" and rep.preempted[0]["victims"] == ["L"]  # never N (not preemptible)
    assert "least attained service: 0.0 GPU-h received, level 0" in out["S"].detail
    assert q.check_invariants(store) == []
    with store.read() as conn:
        assert load_attained(conn) == {"L": pytest.approx(16 * 600.0)}
        (detail,) = conn.execute(sa.select(T_AUDIT.c.detail).where(T_AUDIT.c.action == "preempt")).one()
    assert json.loads(detail)["attained_gpu_s"] == {"L": pytest.approx(9600.0)}
    # a fresh job of level 0 that arrives later still goes before the evicted L (level 1)
    with use_clock(lambda: 700.0):
        q.submit(store, [{"id": "T", "k": 8, "submitted": 700, "time_limit_s": H}])
        rep2 = sched.run_batch(store, Dispatcher(fab), policy="las", preempt="on")
    order = [o.request_id for o in rep2.outcomes]
    assert order.index("T") < order.index("L")
    assert not rep2.preempted  # S (level 0, just started) is never a victim for T (level 0)


def test_las_does_not_preempt_within_a_level(store, fab):
    with use_clock(lambda: 0.0):
        _fill(store, fab)
    with use_clock(lambda: 60.0):  # L received 16 x 60 s = 0.27 GPU-h: still level 0 like S
        rep = sched.run_batch(store, Dispatcher(fab), policy="las", preempt="on")
    assert not rep.preempted and {o.request_id: o.status for o in rep.outcomes}["S"] == "deferred"


@pytest.mark.slow
def test_the_simulator_runs_las_with_preemption_and_every_job_completes(fab):
    res = simulate(mixed_workload(40, seed=2), Dispatcher(fab), fab, SimConfig(policy="las", preempt="on", interval_s=300.0))
    assert all(j.status == "done" for j in res.jobs)
