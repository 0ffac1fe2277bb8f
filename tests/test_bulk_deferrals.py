"""Bulk deferrals: a batch defers the requests that cannot fit what is free without trying them
(:meth:`BatchReport.add_quick`) and builds their Outcomes only when read. What the report says and
what the store records must be exactly what the eager path (one Outcome per request, as with an
``after_each`` hook) gives: same outcomes in the same order, counts, request rows and batch rows.
Shared with ``test_queue_pg.py`` (:func:`scenario_bulk_matches_eager`)."""

from __future__ import annotations

import sqlalchemy as sa

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.queue.clock import use_clock
from bandpilot.queue.schema import T_BATCH, T_REQ

from test_queue import GreedyDispatcher, h100, new_store
from bandpilot.scheduling.profile import SchedulerProfile


def _rows(store: q.Store) -> tuple[list[tuple], list[tuple]]:
    with store.read() as conn:
        reqs = conn.execute(sa.select(T_REQ.c.id, T_REQ.c.status, T_REQ.c.reason, T_REQ.c.detail, T_REQ.c.attempts,
                                      T_REQ.c.last_batch, T_REQ.c.updated_at).order_by(T_REQ.c.id)).all()
        batches = conn.execute(sa.select(T_BATCH.c.id, T_BATCH.c.n_considered, T_BATCH.c.n_assigned, T_BATCH.c.n_deferred,
                                         T_BATCH.c.n_rejected).order_by(T_BATCH.c.id)).all()
    return [tuple(r) for r in reqs], [tuple(r) for r in batches]


def _workload(store: q.Store, wave: int) -> None:
    ks = [16, 8, 32, 4, 16, 2, 32, 8, 24, 4, 16, 32]
    q.submit(store, [{"id": f"w{wave}-{i:02d}", "k": k, "tenant": "AB"[i % 2], "utility": 0.2 + 0.05 * i} for i, k in enumerate(ks)]
             + [{"id": f"w{wave}-host", "k": 8, "constraints": {"single_host": True}}])


def scenario_bulk_matches_eager(bulk: q.Store, eager: q.Store) -> None:
    """Three waves of batches (fifo, utility with quotas, per-request commits) on two stores: the
    bulk path's report and rows equal the eager path's."""
    t = [1000.0]
    with use_clock(lambda: t[0]):
        for wave, (policy, commit) in enumerate([("fifo", "batch"), ("utility", "batch"), ("fifo", "request")]):
            for s in (bulk, eager):
                _workload(s, wave)
            t[0] += 60.0
            reps = []
            for s, hook in ((bulk, None), (eager, lambda o: None)):
                reps.append(sched.run_batch(s, GreedyDispatcher(s.spec), SchedulerProfile("test", queue_sort=policy), commit=commit, after_each=hook))
            rb, re_ = reps
            # the bulk path did not try the requests it deferred (under quotas a held request is
            # tried on its second pass); the eager one tried every request
            assert (len(rb.tried()) < rb.n_outcomes) == (policy == "fifo") and len(re_.tried()) == re_.n_outcomes
            assert rb.counts() == re_.counts() and rb.counts()["deferred"] > 0
            assert [o.to_dict() for o in rb.outcomes] == [o.to_dict() for o in re_.outcomes]
            assert rb.to_dict() == re_.to_dict()
            assert _rows(bulk) == _rows(eager)
            # release the first two running jobs of this wave: the next batch sees freed GPUs
            for s, rep in ((bulk, rb), (eager, re_)):
                for o in rep.assigned[:2]:
                    q.release(s, o.request_id)
    with bulk.read() as conn:  # a request deferred in bulk three times was counted three times
        att = conn.execute(sa.select(T_REQ.c.attempts).where(T_REQ.c.id == "w0-02")).scalar_one()
    assert att == 3


def test_bulk_deferrals_match_eager_sqlite(tmp_path):
    bulk, eager = (new_store(f"sqlite:///{tmp_path / n}.db", h100()) for n in ("bulk", "eager"))
    try:
        scenario_bulk_matches_eager(bulk, eager)
    finally:
        bulk.close()
        eager.close()


def test_quick_deferral_timestamps_follow_the_last_request_tried(tmp_path):
    """A quick deferral is stamped with the time its stretch of deferrals began (after the last
    request tried), not the batch's start."""
    s = new_store(f"sqlite:///{tmp_path / 'q.db'}", h100())
    t = [0.0]

    def clock() -> float:
        t[0] += 1.0
        return t[0]

    try:
        # the first request of each k in a batch is tried (and validated); later ones are quick
        q.submit(s, [{"id": i, "k": k} for i, k in (("a", 32), ("b1", 8), ("b2", 8), ("c1", 4), ("c2", 4), ("b3", 8))])
        with use_clock(clock):
            rep = sched.run_batch(s, GreedyDispatcher(s.spec), SchedulerProfile("test"))
        assert [o.request_id for o in rep.tried()] == ["a", "b1", "c1"]
        a, b1, b2, c1, c2, b3 = rep.outcomes
        assert a.status == "assigned"
        assert all((o.status, o.reason, o.detail) == ("deferred", "insufficient_gpus", f"needs {o.k} GPUs, fewer are free")
                   for o in (b1, b2, c1, c2, b3))
        assert a.at < b1.at < b2.at < c1.at < c2.at == b3.at
    finally:
        s.close()
