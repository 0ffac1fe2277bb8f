"""load_pending remembers pending rows per store (bandpilot.scheduling.pending): what it returns must be
what a full read of every pending row returns, batch after batch, as requests arrive, are assigned,
report entropy (utility changes), get notes and are preempted back to pending."""

from __future__ import annotations

import sqlalchemy as sa

from bandpilot import queue as q
from bandpilot.queue.schema import T_REQ
from bandpilot.scheduling import run_batch
from bandpilot.scheduling.pending import load_pending
from bandpilot.scheduling.policies import PENDING_REQ_COLS, PENDING_STMT, row_to_pending
from bandpilot.scheduling.profile import SchedulerProfile


def _full(conn):
    rows = [tuple(r) for r in conn.execute(PENDING_STMT).all()]
    return ([row_to_pending(t[:PENDING_REQ_COLS]) for t in rows],
            {t[1]: (t[PENDING_REQ_COLS], t[PENDING_REQ_COLS + 1]) for t in rows})


def _same(store):
    with store.read() as conn:
        got, notes = load_pending(conn)
        want, want_notes = _full(conn)
    assert [p.req for p in got] == [p.req for p in want]
    assert [(p.seq, p.submitted_at) for p in got] == [(p.seq, p.submitted_at) for p in want]
    assert notes == want_notes
    return got


def test_cached_pending_reads_match_full_reads(store, fab):
    from bandpilot.dispatch.dispatcher import Dispatcher

    d = Dispatcher(fab)
    n = fab.spec.n_gpus
    q.submit(store, [{"id": f"r{i}", "k": n // 2 + i % 2, "tenant": "t", "utility": 0.5} for i in range(6)])
    assert len(_same(store)) == 6
    run_batch(store, d, SchedulerProfile("test"))  # two fit, the rest are deferred with a note
    pend = _same(store)
    assert len(pend) == 4  # r0 and r2 (16 GPUs each) fill the 32; the 17-GPU ones wait
    q.report_entropy(store, [{"job": "r3", "entropy": 0.9}, {"job": "r3", "entropy": 0.4}])  # utility changes
    got = {p.req.id: p.req.utility for p in _same(store)}
    with store.read() as conn:
        assert got["r3"] == conn.execute(sa.select(T_REQ.c.utility).where(T_REQ.c.id == "r3")).scalar()
    q.submit(store, [{"id": "late", "k": 1, "tenant": "u"}])
    assert "late" in {p.req.id for p in _same(store)}
    running = q.list_requests(store, status="assigned")[0]["id"]
    with store.write() as conn:  # back to pending (as a preemption does): the same seq, a new note
        conn.execute(sa.update(T_REQ).where(T_REQ.c.id == running).values(status="pending", reason="preempted",
                                                                          detail="evicted"))
    assert running in {p.req.id for p in _same(store)}
    q.cancel(store, "late")
    assert "late" not in {p.req.id for p in _same(store)}


def test_new_rows_between_known_ones_and_a_full_memory(store, fab, monkeypatch):
    """Rows not seen before are filled in at their place in the order (a request submitted with an
    earlier time lands between known rows), also with a utility that changed meanwhile, and a full
    memory starts afresh without losing a row."""
    from bandpilot.scheduling import pending

    q.submit(store, [{"id": f"r{i}", "k": 2, "submitted_at": 1000.0 + 10 * i, "utility": 0.5} for i in range(5)])
    _same(store)
    q.submit(store, [{"id": "early", "k": 1, "submitted_at": 1015.0}, {"id": "first", "k": 1, "submitted_at": 1.0}])
    q.report_entropy(store, [{"job": "r1", "entropy": 0.9}, {"job": "early", "entropy": 0.7}])
    assert [p.req.id for p in _same(store)] == ["first", "r0", "r1", "early", "r2", "r3", "r4"]
    monkeypatch.setattr(pending, "_SEEN_MAX", 8)  # 7 known + 2 new > 8: every row read in full again
    q.submit(store, [{"id": "mid", "k": 1, "submitted_at": 1025.0}, {"id": "last", "k": 1}])
    assert [p.req.id for p in _same(store)] == ["first", "r0", "r1", "early", "r2", "mid", "r3", "r4", "last"]
