"""Issue 21, thirteenth round: preemptible loans onto reserved GPUs (``--backfill-check lend``,
:mod:`bandpilot.scheduling.loans`) - borrow a reservation's GPUs until its start, reclaimed then."""

from __future__ import annotations

import json

import pytest
import sqlalchemy as sa
from test_reservations import Clock

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.queue.clock import use_clock
from bandpilot.queue.schema import T_AUDIT, T_ESTIMATES, T_REQ

H = 3600.0
CKPT = {"preemptible": True, "checkpoint_s": 60, "checkpoint_every_s": 600}


T0 = 9 * H  # the batches run 9 h in: P has waited hrrn's 8 h cap (loans.LEND_AFTER_S)


def _blocked(store, fab, clock, check: str, p: dict, a_preemptible: bool = False, p_submitted: float = 1.0):
    """A (8 GPUs, host 0, 1000 s limit) runs from T0; at T0 + 10 G (all 32 GPUs, submitted at 0) is
    reserved at A's end (T0 + 1000) and P (8 GPUs, 10 h limit, ``p``'s runtime keys, submitted at
    ``p_submitted``) fits the 24 free GPUs but overlaps G's set."""
    h = [x.name for x in fab.spec.hosts]
    d = Dispatcher(fab)
    clock.t = T0
    a = {"id": "A", "k": 8, "time_limit_s": 1000, "submitted": T0, "constraints": {"allowed_hosts": h[:1]}}
    q.submit(store, [{**a, **(CKPT if a_preemptible else {})}])
    sched.run_batch(store, d)
    clock.t = T0 + 10.0
    q.submit(store, [{"id": "G", "k": 32, "time_limit_s": 2 * H, "submitted": 0},
                     {"id": "P", "k": 8, "time_limit_s": 10 * H, "submitted": p_submitted, **p}])
    rep = sched.run_batch(store, d, policy="fifo", backfill="easy", backfill_check=check)
    assert q.check_invariants(store) == []
    return d, rep


def _out(rep, rid):
    return {o.request_id: o for o in rep.outcomes}[rid]


def _g_start(rep):
    return next(r for r in rep.reservations if r["request_id"] == "G")["start_at"]


def _status(store):
    with store.read() as conn:
        return dict(conn.execute(sa.select(T_REQ.c.id, T_REQ.c.status)).all())


def _audit(store, action):
    with store.read() as conn:
        return conn.execute(sa.select(T_AUDIT.c.target, T_AUDIT.c.detail).where(T_AUDIT.c.action == action)).all()


def test_set_keeps_the_preemptible_job_off_the_reserved_gpus(store, fab):
    clock = Clock()
    with use_clock(clock):
        _, rep = _blocked(store, fab, clock, "set", CKPT)
    assert rep.assigned == [] and _out(rep, "P").reason == "protects_reservation"
    assert _g_start(rep) == T0 + 1000.0


def scenario_loan_and_reclaim(store, fab, reopen=None):
    """Shared with test_queue_pg.py. P starts on loan with ``lend``; G's start stays at T0 + 1000 s (a
    batch at T0 + 500 s plans P's GPUs free); at T0 + 1100 s (A released) G reclaims P in one transaction."""
    clock = Clock()
    with use_clock(clock):
        d, rep = _blocked(store, fab, clock, "lend", CKPT)
        assert [o.request_id for o in rep.assigned] == ["P"]
        assert _out(rep, "P").detail.startswith("on loan until ~") and "(reservation of G)" in _out(rep, "P").detail
        assert _g_start(rep) == T0 + 1000.0
        [(target, detail)] = _audit(store, "loan")
        assert target == "P" and json.loads(detail)["until"] == T0 + 1000.0 and json.loads(detail)["holders"] == ["G"]
        clock.t = T0 + 500.0  # another batch: the loan (a 10 h run) does not push G back
        q.submit(store, [{"id": "X", "k": 1, "time_limit_s": 60, "submitted": T0 + 499}])
        rep = sched.run_batch(store, d, policy="fifo", backfill="easy", backfill_check="lend")
        assert _g_start(rep) == T0 + 1000.0 and _status(store)["P"] == "assigned"
        clock.t = T0 + 1100.0
        q.release(store, "A")
        if "X" in {o.request_id for o in rep.assigned}:
            q.release(store, "X")
        st = reopen() if reopen is not None else store  # a fresh store object: the loan is read back from the rows
        rep = sched.run_batch(st, d, policy="fifo", backfill="easy", backfill_check="lend")
    g = _out(rep, "G")
    assert g.status == "assigned" and len(g.gpus) == 32
    assert rep.preempted and rep.preempted[0]["victims"] == ["P"]
    assert g.detail.startswith("reclaim loan P; admit G on ") and "GB/s" in g.detail
    assert _status(st)["P"] == "pending" and _status(st)["G"] == "assigned"
    [(target, detail)] = _audit(st, "reclaim")
    assert target == "G" and json.loads(detail)["victims"] == ["P"]
    with st.read() as conn:
        est = dict(conn.execute(sa.select(T_ESTIMATES.c.request_id, T_ESTIMATES.c.expected_s)).all())
    assert est["P"] == pytest.approx(10 * H - 600 + 60)  # one 600 s checkpoint kept (+ restart)
    assert q.check_invariants(st) == []
    return st


def test_lend_starts_the_preemptible_job_on_loan_and_the_gang_reclaims_it(store, fab, tmp_path):
    url = str(store.engine.url)
    opened = []

    def reopen():
        opened.append(q.Store(url))
        return opened[0]

    scenario_loan_and_reclaim(store, fab, reopen)
    opened[0].close()


@pytest.mark.parametrize("p", [{}, {**CKPT, "checkpoint_every_s": 1800}, {"preemptible": True}],
                         ids=["not-preemptible", "loan-shorter-than-a-checkpoint-period", "never-checkpoints"])
def test_no_loan_for_a_non_preemptible_or_too_short_one(store, fab, p):
    clock = Clock()
    with use_clock(clock):
        _, rep = _blocked(store, fab, clock, "lend", p)
    assert rep.assigned == [] and _out(rep, "P").reason == "protects_reservation"
    assert _audit(store, "loan") == []


def test_no_loan_before_the_request_has_waited_the_cap(store, fab):
    clock = Clock()
    with use_clock(clock):
        _, rep = _blocked(store, fab, clock, "lend", CKPT, p_submitted=T0 - 7 * H)  # waited 7 h
    assert rep.assigned == [] and _out(rep, "P").reason == "protects_reservation"


def test_reclaim_never_evicts_a_job_that_is_not_on_loan(store, fab):
    """A is preemptible but started normally and overran its limit: at T0 + 1100 s G still cannot start
    (A holds host 0), so nothing is evicted - neither A (no loan) nor P (useless alone)."""
    clock = Clock()
    with use_clock(clock):
        d, rep = _blocked(store, fab, clock, "lend", CKPT, a_preemptible=True)
        assert [o.request_id for o in rep.assigned] == ["P"]
        clock.t = T0 + 1100.0
        q.submit(store, [{"id": "Y", "k": 1, "time_limit_s": 60, "submitted": T0 + 1099}])  # something to batch for
        rep = sched.run_batch(store, d, policy="fifo", backfill="easy", backfill_check="lend", preempt="off")
    assert rep.preempted == [] and _out(rep, "G").status == "deferred"
    st = _status(store)
    assert st["A"] == "assigned" and st["P"] == "assigned"
    assert _audit(store, "reclaim") == []


def test_a_simulation_with_loans_completes_every_job_and_counts_the_preemptions(fab):
    from bandpilot.simulation.engine import SimConfig, simulate
    from bandpilot.simulation.report import summarize
    from bandpilot.simulation.workloads import mixed_workload

    jobs = mixed_workload(80, seed=0)
    res = simulate(jobs, Dispatcher(fab, seed=0), fab, SimConfig(seed=0, backfill_check="lend"))
    s = summarize(res)
    assert s["completed"] == s["jobs"] == 80
    assert s["preemptions"] == sum(j.preemptions for j in res.jobs) > 0
    assert s["wasted_gpu_hours"] == pytest.approx(sum(j.wasted_gpu_s for j in res.jobs) / 3600.0) and s["wasted_gpu_hours"] > 0
    pre = {j.id: j.preemptible for j in jobs}
    assert all(not j.preemptions for j in res.jobs if not pre[j.id])  # only loans are reclaimed
