"""Issue 21, tenth round: the age slot for the request later-submitted work has overtaken most
(``--age-slot overtaken``, :mod:`bandpilot.scheduling.overtaken`)."""

from __future__ import annotations

import pytest
from test_reservations import Clock

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.queue.clock import use_clock
from bandpilot.queue.requests import Request
from bandpilot.scheduling.overtaken import overtaken_work
from bandpilot.scheduling.policies import Pending

H = 3600.0


def _p(rid: str, submitted: float) -> Pending:
    return Pending(Request(rid, 8, "t", submitted_at=submitted), 0, submitted)


def test_overtaken_work_counts_only_later_submitted_jobs_up_to_now():
    rows = [(5.0, 8, 10.0, 110.0),  # submitted before L: not overtaking it
            (20.0, 4, 30.0, 80.0),  # after L, ended: 4 x 50
            (40.0, 2, 50.0, None)]  # after L, still running at 200: 2 x 150
    work = overtaken_work(rows, [_p("L", 10.0), _p("M", 45.0), _p("N", 300.0)], now=200.0)
    assert work == {"L": 4 * 50 + 2 * 150, "M": 0.0, "N": 0.0}
    assert overtaken_work([], [_p("L", 1.0)], now=5.0) == {"L": 0.0}


def _overtaken_scenario(store, fab, clock, x_run_h: float, age_slot: str) -> list[str]:
    """L (8 GPUs on host 0, 40 h limit) queues behind A on host 0; X (24 GPUs, submitted after L) runs
    ``x_run_h`` on hosts 1-3; then a whole-cluster short S that hrrn ranks far above L (ratio 6 vs
    1 + 11 h / 8 h) is blocked too. EASY has one slot: whose is it? (The fixture cluster has 32 GPUs.)"""
    h = [x.name for x in fab.spec.hosts]
    d = Dispatcher(fab)
    run = lambda: sched.run_batch(store, d, policy="hrrn", backfill="easy", age_slot=age_slot)  # noqa: E731
    q.submit(store, [{"id": "A", "k": 8, "time_limit_s": 100_000, "submitted": 0, "constraints": {"allowed_hosts": h[:1]}}])
    run()
    clock.t = 10.0
    q.submit(store, [{"id": "L", "k": 8, "time_limit_s": 40 * H, "submitted": 1, "constraints": {"allowed_hosts": h[:1]}},
                     {"id": "X", "k": 24, "time_limit_s": 40_000, "submitted": 2, "constraints": {"allowed_hosts": h[1:]}}])
    first = run()
    assert [o.request_id for o in first.assigned] == ["X"]
    clock.t = 10.0 + x_run_h * H
    q.release(store, "X")
    clock.t += 1.0
    q.submit(store, [{"id": "S", "k": 32, "time_limit_s": 600, "submitted": clock.t - 3000}])
    rep = run()
    assert q.check_invariants(store) == []
    return [r["request_id"] for r in rep.reservations]


def test_only_requests_past_hrrns_cap_compete_by_default():
    from bandpilot.scheduling import overtaken
    from bandpilot.scheduling.policies import HRRN_AGE_CAP_S

    assert overtaken.OVERTAKEN_MIN_EST_S == HRRN_AGE_CAP_S
    key = overtaken.overtaken_key({"L": 9 * 32 * H, "M": 9 * 32 * H}, 32, lambda p: {"L": 40 * H, "M": 8 * H}[p.req.id])
    assert key(_p("L", 0.0)) == 9 * H and key(_p("M", 0.0)) == 0.0


@pytest.mark.parametrize("mode, x_run_h, reserved", [
    ("off", 11.0, ["S"]),  # hrrn's order: S's ratio 6 wins the one slot
    ("overtaken", 11.0, ["L"]),  # X ran 24 x 11 GPU-h = 8.25 h of the cluster after L was submitted
    ("overtaken", 10.0, ["S"]),  # 7.5 h of the cluster: below the 8 h threshold, hrrn's order
])
def test_the_overtaken_slot_goes_to_a_request_later_work_passed_by(store, fab, mode, x_run_h, reserved):
    clock = Clock()
    with use_clock(clock):
        assert _overtaken_scenario(store, fab, clock, x_run_h, mode) == reserved


def test_the_overtaken_slot_is_kept_for_requests_past_the_cap(store, fab, monkeypatch):
    """Only requests expected past ``OVERTAKEN_MIN_EST_S`` (8 h by default) compete: raised above
    L's 40 h limit, L no longer does and hrrn's S keeps the slot."""
    from bandpilot.scheduling import overtaken

    monkeypatch.setattr(overtaken, "OVERTAKEN_MIN_EST_S", 41 * H)
    clock = Clock()
    with use_clock(clock):
        assert _overtaken_scenario(store, fab, clock, 11.0, "overtaken") == ["S"]
