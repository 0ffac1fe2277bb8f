"""Issue 21 item 3: start now or wait for a better placement (bandpilot.scheduling.startwait), in the
live batch and in the simulator that drives the same code."""

from __future__ import annotations

import pytest
import sqlalchemy as sa

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.queue.clock import use_clock
from bandpilot.queue.schema import T_HOLDS
from bandpilot.scheduling import startwait
from bandpilot.scheduling.reservations import Book
from bandpilot.scheduling.startwait import MAX_HELD_S, MAX_HOLD_S, load_held
from bandpilot.simulation.engine import SimConfig, simulate
from bandpilot.simulation.trace import TraceJob
from bandpilot.simulation.workloads import mixed_workload
from bandpilot.scheduling.profile import ProfileError, SchedulerProfile

# fab (the emulated 4 x 8 H100) and store (a fresh SQLite queue on it): tests/conftest.py


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _half_busy(store, fab, clock):
    """4 GPUs busy on every host; host 3's job ends at ~1000 s, the others run for a day. An
    8-GPU gang can start now only across two hosts, or on all of host 3 after ~1000 s."""
    h = [x.name for x in fab.spec.hosts]
    q.submit(store, [{"id": f"R{i}", "k": 4, "time_limit_s": 1000 if i == 3 else 86400, "submitted": 0,
                      "constraints": {"allowed_hosts": [h[i]]}} for i in range(4)])
    sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test"))
    clock.t = 10.0
    return h


def test_a_gang_waits_for_a_nearby_end_when_the_better_placement_saves_more_than_the_wait(store, fab):
    clock = Clock()
    with use_clock(clock):
        h = _half_busy(store, fab, clock)
        q.submit(store, [{"id": "G", "k": 8, "time_limit_s": 36000, "comm_fraction": 0.7, "submitted": 5}])
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", queue_sort="hrrn", backfill="easy", locality=0.5, start_or_wait=True))
        (g,) = rep.outcomes
        assert g.status == "deferred" and g.reason == "waits_for_better_placement", g.detail
        # the price rule decides; the detail names the better placement one host (the one-host rule's wording)
        assert g.detail.startswith("waits for a one-host placement: ~0.3 h for ") and "GB/s now (saves ~" in g.detail
        (res,) = rep.reservations  # its hold on host 3, seen like any reservation
        assert res["request_id"] == "G" and res["start_at"] == pytest.approx(1000.0)
        assert {x.rpartition(":")[0] for x in res["gpus"]} == {h[3]}
        assert q.list_requests(store, request_id="G")[0]["reason"] == "waits_for_better_placement"
        assert q.check_invariants(store) == []
        # off (the default): the same gang starts now, spread over two hosts
        rep_off = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", queue_sort="hrrn", backfill="easy", locality=0.5))
        (g2,) = rep_off.assigned
        assert len({x.rpartition(":")[0] for x in g2.gpus}) == 2


def test_waiting_is_bounded_and_needs_a_comm_fraction(store, fab):
    clock = Clock()
    with use_clock(clock):
        _half_busy(store, fab, clock)
        clock.t = MAX_HOLD_S + 10.0  # R3 is overdue but still expected to end within the window
        q.submit(store, [{"id": "old", "k": 8, "time_limit_s": 36000, "comm_fraction": 0.7, "submitted": 5},
                         {"id": "nocomm", "k": 8, "time_limit_s": 36000, "submitted": MAX_HOLD_S}])
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", queue_sort="fifo", backfill="easy", locality=0.5, start_or_wait=True))
        out = {o.request_id: o for o in rep.outcomes}
        # waited MAX_HOLD_S already: the price rule lets it go, only the one-host rule may still hold it
        assert out["old"].status == "assigned" or out["old"].detail.startswith("waits for a one-host placement")
        assert out["nocomm"].reason != "waits_for_better_placement"  # nothing to price the wait with


def test_start_or_wait_without_reservations_is_a_one_line_error(store, fab):
    with pytest.raises(ProfileError, match="start_or_wait must be true or false"):
        SchedulerProfile("test", backfill="easy", start_or_wait="maybe")
    with pytest.raises(ProfileError, match="start_or_wait needs backfill: easy or conservative"):
        SchedulerProfile("test", backfill="greedy", start_or_wait=True)


@pytest.mark.slow
def test_the_simulator_runs_start_or_wait_and_every_job_completes(fab):
    jobs = mixed_workload(40, seed=3)
    res = simulate(jobs, Dispatcher(fab), fab, SimConfig(profile=SchedulerProfile("test", queue_sort="hrrn", backfill="conservative", reservations=2, start_or_wait=True, locality=0.5), interval_s=300.0))
    assert all(j.status == "done" for j in res.jobs)


def test_local_a_gang_that_fits_one_host_waits_for_it_even_after_the_hold_bound(store, fab):
    """The price rule alone would start a long-waiting 8-GPU gang across two hosts (its wait is past
    MAX_HOLD_S); the one-host rule holds it for the one host that frees up within the window."""
    clock = Clock()
    with use_clock(clock):
        h = _half_busy(store, fab, clock)
        clock.t = MAX_HOLD_S + 10.0
        q.submit(store, [{"id": "old", "k": 8, "time_limit_s": 36000, "comm_fraction": 0.7, "submitted": 5}])
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", queue_sort="fifo", backfill="easy", locality=0.5, start_or_wait=True))
        (g,) = rep.outcomes
        assert g.status == "deferred" and g.reason == "waits_for_better_placement", g.detail
        assert g.detail.startswith("waits for a one-host placement: "), g.detail
        (res,) = rep.reservations
        assert {x.rpartition(":")[0] for x in res["gpus"]} == {h[3]}
        assert q.check_invariants(store) == []


def test_local_never_holds_a_gang_larger_than_a_host(store, fab):
    clock = Clock()
    with use_clock(clock):
        _half_busy(store, fab, clock)
        q.submit(store, [{"id": "big", "k": 12, "time_limit_s": 36000, "comm_fraction": 0.7, "submitted": 5}])
        clock.t = MAX_HOLD_S + 10.0
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", queue_sort="fifo", backfill="easy", locality=0.5, start_or_wait=True))
        assert [o.request_id for o in rep.assigned] == ["big"]


def test_start_or_wait_is_in_the_recommended_profile_only():
    from bandpilot.scheduling.profile import PROFILES

    assert SimConfig().profile.start_or_wait is True
    assert [p.name for p in PROFILES.values() if p.start_or_wait] == ["recommended"]


# ---- cumulative hold bound (issue 21, "Cumulative hold bound") ----------------------------------

def _slipping(store, fab, clock, g, first=10.0, step=200.0, batches=12, reopen=None, forget=False):
    """G (``g``: its fields) fits host 3 once R3 ends; R3 is overdue from 1,000 s on, so its expected
    end slips to "in 500 s" at every batch (one batch per ``step`` s from ``first``). ``reopen(i)``: a
    new Store on the same file before batch i (a process restart); ``forget``: the stored hold times
    are dropped before each batch (the queue before the bound). Returns the store and (time,
    outcome) of each batch until G starts."""
    _half_busy(store, fab, clock)
    q.submit(store, [{"id": "G", "k": 8, "submitted": 5, **g}])
    clock.t, seen = first, []
    for i in range(batches):
        if reopen is not None and reopen(i):
            url = store.url
            store.close()
            store = q.Store(url)
        if forget:
            with store.write() as conn:
                conn.execute(sa.delete(T_HOLDS))
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", queue_sort="hrrn", backfill="conservative", reservations=2, locality=0.5, start_or_wait=True))
        (o,) = rep.outcomes
        seen.append((clock.t, o))
        if o.status == "assigned":
            break
        clock.t += step
    return store, seen


def _fresh(tmp_path, fab, name):
    s = q.Store(f"sqlite:///{tmp_path / name}")
    s.init_cluster(fab.spec)
    return s


def _spread(o) -> bool:
    return o.status == "assigned" and len({x.rpartition(":")[0] for x in o.gpus}) == 2


def scenario_one_host_bound(store, fab, forget=False):
    """G (comm share 0.5 x 2,000 s = 1,000 s) is told "wait for a one-host placement" batch after
    batch while R3's expected end slips; once the time held plus the next wait reaches its comm share
    it starts across hosts (also run on PostgreSQL, tests/test_queue_pg.py). Returns the batches."""
    clock = Clock()
    with use_clock(clock):
        store, seen = _slipping(store, fab, clock, {"time_limit_s": 2000, "comm_fraction": 0.5}, forget=forget)
        if forget:
            return seen
        held = [o for _, o in seen[:-1]]
        assert held and all(o.reason == "waits_for_better_placement" for o in held)
        assert held[0].detail.startswith("waits for a one-host placement: ") and \
            held[0].detail.endswith("; held 0.0 h of at most 0.3 h)"), held[0].detail
        t_start, o = seen[-1]
        assert _spread(o) and t_start - 10.0 <= 1000.0 + 200.0  # the bound plus one batch interval
        assert q.list_requests(store, request_id="G")[0]["status"] == "assigned"
        with store.read() as conn:  # a started request leaves the hold ledger
            assert conn.execute(sa.select(T_HOLDS.c.request_id)).all() == []
    return seen


def test_one_host_holds_are_bounded_in_total_by_the_communicating_share(tmp_path, fab):
    """The live queue; without the stored hold times G is held at every batch."""
    scenario_one_host_bound(_fresh(tmp_path, fab, "bounded.db"), fab)
    forget = scenario_one_host_bound(_fresh(tmp_path, fab, "forget.db"), fab, forget=True)
    assert [o.status for _, o in forget] == ["deferred"] * 12  # the queue before the bound


def test_a_store_before_v12_gains_the_hold_ledger(tmp_path, fab):
    s = _fresh(tmp_path, fab, "old.db")
    with s.write() as conn:
        conn.execute(sa.text("DROP TABLE bp_holds"))
        conn.execute(sa.text("DELETE FROM bp_schema WHERE version = 12"))
    url = s.url
    s.close()
    s = q.Store(url)
    try:
        assert s.migrate() >= 12
        scenario_one_host_bound(s, fab)
    finally:
        s.close()


def test_a_long_waiting_gang_is_held_at_most_max_held_s_in_total_also_across_restarts(tmp_path, fab):
    """The eleventh round's case: G has waited ~2.8 h when it is first held, so the price rule's
    MAX_HOLD_S (since submission) ends soon and the one-host rule goes on holding it - until the
    total held reaches MAX_HELD_S. Restarts in between give the same decisions (the hold times are
    in the store); without them G is still held after MAX_HELD_S + 2 h."""
    g = {"time_limit_s": 36000, "comm_fraction": 0.7}
    kw = {"first": 10000.0, "step": 2000.0}
    runs = {}
    for name, extra in (("plain", {}), ("restart", {"reopen": lambda i: i in (1, 4)}), ("forget", {"forget": True})):
        clock = Clock()
        with use_clock(clock):
            s, seen = _slipping(_fresh(tmp_path, fab, f"{name}.db"), fab, clock, g, **kw, **extra)
            runs[name] = [(t, o.status, o.detail) for t, o in seen]
            s.close()
    assert runs["restart"] == runs["plain"]
    t_start, status, _ = runs["plain"][-1]
    assert status == "assigned" and MAX_HELD_S - 2000.0 <= t_start - 10000.0 <= MAX_HELD_S + 2000.0
    assert runs["plain"][-2][2].endswith("of at most 4.0 h)"), runs["plain"][-2][2]
    assert [st for _, st, _ in runs["forget"]] == ["deferred"] * 12


def test_hold_times_are_read_from_the_store(store, fab):
    clock = Clock()
    with use_clock(clock):
        _half_busy(store, fab, clock)
        q.submit(store, [{"id": "G", "k": 8, "time_limit_s": 7200, "comm_fraction": 0.5, "submitted": 5}])
        sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", backfill="easy", locality=0.5, start_or_wait=True))
        with store.read() as conn:
            assert load_held(conn, 10.0) == {"G": 0.0}
            assert load_held(conn, 610.0) == {"G": pytest.approx(600.0)}  # held since the batch at 10 s
        clock.t = 610.0
        (g,) = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", backfill="easy", locality=0.5, start_or_wait=True)).outcomes
        assert g.reason == "waits_for_better_placement" and "held 0.2 h of at most" in g.detail, g.detail
        assert q.list_requests(store, request_id="G")[0]["detail"] == g.detail  # what queue show / the API show
        with store.read() as conn:
            row = conn.execute(sa.select(T_HOLDS)).one()
            assert (row.request_id, row.held_s, row.at, row.holding) == ("G", pytest.approx(600.0), 610.0, True)


@pytest.mark.parametrize("memory", [True, False])
def test_the_simulator_bounds_the_total_hold_like_the_live_queue(fab, monkeypatch, memory):
    """B3's limit (600 s) is far below its run (40,000 s): its expected end slips at every batch (the
    1-GPU jobs make one every 600 s). G fits host 3 when B3 ends. The price rule holds it until it
    has waited MAX_HOLD_S; the one-host rule then may hold it only while its total hold stays below
    its comm share (0.5 x 20,000 s), already spent: it starts across hosts. Without the stored hold
    times the one-host rule holds it on, until B3's real end."""
    if not memory:
        monkeypatch.setattr(startwait, "write_held", lambda *a, **k: None)
    jobs = [TraceJob(f"B{i}", 0.0, 5, "t", 40000.0 if i == 3 else 100000.0, 0.3,
                     time_limit_s=600.0 if i == 3 else None) for i in range(4)]
    jobs += [TraceJob("G", 100.0, 8, "t", 20000.0, 0.5)]
    jobs += [TraceJob(f"S{i}", 200.0 + 600 * i, 1, "t", 60.0, 0.1) for i in range(60)]
    res = simulate(sorted(jobs, key=lambda j: j.submit_s), Dispatcher(fab), fab, SimConfig(profile=SchedulerProfile("test", queue_sort="hrrn", backfill="conservative", reservations=2, start_or_wait=True, locality=0.5)))
    g = next(j for j in res.jobs if j.id == "G")
    assert all(j.status == "done" for j in res.jobs)
    if memory:
        assert MAX_HOLD_S <= g.start_s - 100.0 <= MAX_HOLD_S + 600.0 and g.n_hosts > 1
    else:
        assert g.start_s >= 40000.0 and g.n_hosts == 1


# ---- pruned planning: steps that cannot pay are not planned (same decisions) --------------------

def _count_place_at(monkeypatch):
    calls = [0]
    orig = Book.place_at

    def counted(self, *a, **k):
        calls[0] += 1
        return orig(self, *a, **k)

    monkeypatch.setattr(Book, "place_at", counted)
    return calls


@pytest.mark.parametrize("limit", [36000, 4000])
def test_pruned_planning_makes_the_same_decisions_in_the_live_queue(tmp_path, fab, monkeypatch, limit):
    """The slipping-end case (G is held by the price rule, then the one-host rule, then starts; with
    a 4,000 s limit its first hold saves only ~100 s more than ``min_gain_s``, so a bound 20 % too low
    changes it): every batch decides the same with and without the pruning, with fewer placements planned."""
    calls = _count_place_at(monkeypatch)
    runs, planned = {}, {}
    for prune in (False, True):
        monkeypatch.setattr(startwait, "PRUNE", prune)
        calls[0] = 0
        clock = Clock()
        with use_clock(clock):
            store = _fresh(tmp_path, fab, f"{prune}.db")
            _half_busy(store, fab, clock)
            q.submit(store, [{"id": "G", "k": 8, "time_limit_s": limit, "comm_fraction": 0.5, "submitted": 5},
                             {"id": "small", "k": 4, "time_limit_s": 3600, "comm_fraction": 0.5, "submitted": 6}])
            seen = []
            for _ in range(6):
                rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", backfill="easy", locality=0.5,
                                                                               start_or_wait=True))
                seen += [(clock.t, o.request_id, o.status, o.reason, o.detail, tuple(o.gpus or ())) for o in rep.outcomes]
                clock.t += 3000.0
            store.close()
        runs[prune], planned[prune] = seen, calls[0]
    assert runs[True] == runs[False]
    assert any(r[3] == "waits_for_better_placement" for r in runs[True])  # not a trivial case
    # "small" fits one host now: already at its idle best, none of its steps is planned
    assert planned[True] < planned[False]


@pytest.mark.slow
def test_pruned_planning_makes_the_same_decisions_in_the_simulator(fab, monkeypatch):
    holds = [0]
    orig = startwait.StartOrWait._hold

    def counted(self, *a, **k):
        holds[0] += 1
        return orig(self, *a, **k)

    monkeypatch.setattr(startwait.StartOrWait, "_hold", counted)
    out = {}
    for prune in (False, True):
        monkeypatch.setattr(startwait, "PRUNE", prune)
        res = simulate(mixed_workload(100, seed=2), Dispatcher(fab, seed=2), fab, SimConfig(seed=2))
        out[prune] = [(j.id, j.start_s, j.gpus, j.end_s) for j in res.jobs]
    assert out[True] == out[False] and holds[0] >= 2 * 10  # seed 2 holds 16 gangs in each run
