"""Issue 21, twelfth round: the backfill check (``--backfill-check set|replan|replan-waited``,
:mod:`bandpilot.scheduling.replan`) - may a long request start on GPUs a reservation planned to use?"""

from __future__ import annotations

import numpy as np
import pytest
from test_reservations import Clock

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.errors import RequestError
from bandpilot.queue.clock import use_clock
from bandpilot.simulation.engine import SimConfig, SimulationError
from bandpilot.simulation.presets import apply_preset

H = 3600.0


def _scenario(store, fab, clock, check: str, host3_busy: bool = False, l_waited: float = 7.0, t0: float = 0.0):
    """A runs on host 0 for days; B (8 GPUs, host 1) and C (4 GPUs, host 2) end at ~1000 s; host 3 is
    free (or, ``host3_busy``, held by a long D). G (16 GPUs) is blocked until 1000 s and reserved then;
    L (4 GPUs, host 2 only, 10 h limit, waited ``l_waited`` s) fits host 2's 4 free GPUs now but would
    run past G's start. Everything happens ``t0`` seconds in."""
    h = [x.name for x in fab.spec.hosts]
    d = Dispatcher(fab)
    first = [{"id": "A", "k": 8, "time_limit_s": 400_000, "submitted": 0, "constraints": {"allowed_hosts": h[:1]}},
             {"id": "B", "k": 8, "time_limit_s": 1000, "submitted": 0, "constraints": {"allowed_hosts": h[1:2]}},
             {"id": "C", "k": 4, "time_limit_s": 1000, "submitted": 0, "constraints": {"allowed_hosts": h[2:3]}}]
    if host3_busy:
        first.append({"id": "D", "k": 8, "time_limit_s": 400_000, "submitted": 0, "constraints": {"allowed_hosts": h[3:]}})
    for j in first:
        j["submitted"] = t0
    clock.t = t0
    q.submit(store, first)
    sched.run_batch(store, d)
    clock.t = t0 + 10.0
    q.submit(store, [{"id": "G", "k": 16, "time_limit_s": 3000, "submitted": min(t0 + 2, clock.t - l_waited - 1)},
                     {"id": "L", "k": 4, "time_limit_s": 10 * H, "submitted": clock.t - l_waited,
                      "constraints": {"allowed_hosts": h[2:3]}}])
    rep = sched.run_batch(store, d, policy="fifo", backfill="easy", backfill_check=check)
    assert q.check_invariants(store) == []
    return h, rep


def _reserved(rep, rid):
    return next(r for r in rep.reservations if r["request_id"] == rid)


def test_set_check_keeps_the_long_request_off_the_reserved_gpus(store, fab):
    clock = Clock()
    with use_clock(clock):
        h, rep = _scenario(store, fab, clock, "set")
    assert [o.request_id for o in rep.assigned] == []
    g = _reserved(rep, "G")
    assert any(x.startswith(h[2]) for x in g["gpus"])  # the planned set uses host 2: L protects it
    assert {o.request_id: o for o in rep.outcomes}["L"].reason == "protects_reservation"


def test_replan_starts_the_long_request_when_the_reservation_still_starts_on_time(store, fab, tmp_path):
    clock = Clock()
    with use_clock(clock):
        h, before = _scenario(store, fab, clock, "set")
    start_set = _reserved(before, "G")["start_at"]
    store2 = q.Store(f"sqlite:///{tmp_path / 'q2.db'}")
    store2.init_cluster(fab.spec)
    clock = Clock()
    with use_clock(clock):
        h, rep = _scenario(store2, fab, clock, "replan")
    assert [o.request_id for o in rep.assigned] == ["L"]
    g = _reserved(rep, "G")
    assert g["start_at"] == start_set  # not delayed
    l_gpus = set(next(o for o in rep.assigned if o.request_id == "L").gpus)
    assert not l_gpus & set(g["gpus"])  # the reservation moved off L's GPUs
    assert {x.split(":")[0] for x in g["gpus"]} == {h[1], h[3]}  # still two hosts
    store2.close()


def test_replan_leaves_the_reservation_alone_when_it_cannot_start_on_time_elsewhere(store, fab):
    clock = Clock()
    with use_clock(clock):
        h, rep = _scenario(store, fab, clock, "replan", host3_busy=True)
    assert [o.request_id for o in rep.assigned] == []
    assert {o.request_id: o for o in rep.outcomes}["L"].reason == "protects_reservation"


@pytest.mark.parametrize("waited_h, started", [(9.0, ["L"]), (7.0, [])])
def test_replan_waited_only_helps_a_request_that_has_waited_the_cap(store, fab, waited_h, started):
    clock = Clock()
    with use_clock(clock):
        _, rep = _scenario(store, fab, clock, "replan-waited", l_waited=waited_h * H, t0=10 * H)
    assert [o.request_id for o in rep.assigned] == started


def test_an_unknown_backfill_check_is_refused(store, fab):
    with pytest.raises(RequestError, match="backfill check"):
        sched.run_batch(store, Dispatcher(fab), backfill="easy", backfill_check="sometimes")
    with pytest.raises(SimulationError, match="backfill check"):
        SimConfig(backfill_check="sometimes").check()


def test_baselines_pin_the_set_check(fab):
    cfg = apply_preset(SimConfig(backfill_check="replan"), "slurm", fab.spec)
    assert cfg.backfill_check == "set"


def test_replan_restores_every_set_when_one_reservation_cannot_move(store, fab):
    """Unit: a failed replan leaves the book as it was (sets, masks, running jobs)."""
    from bandpilot.scheduling.replan import replan_around
    clock = Clock()
    with use_clock(clock):
        _scenario(store, fab, clock, "set", host3_busy=True)
        from bandpilot.scheduling.pending import load_pending
        from bandpilot.scheduling.placer import Placer
        from bandpilot.scheduling.reservations import Book
        with store.write() as conn:
            state = store.load_state(conn, fab.spec)
            d = Dispatcher(fab)
            book = Book.load(conn, "easy", state, Placer(fab.spec, d, "bandpilot"), clock.t)
        with store.read() as conn:
            pend = {p.req.id: p.req for p in load_pending(conn)[0]}
        r = book.reserve(pend["G"])
        assert r is not None
        gpus, mask, n_running = list(r.gpus), r.mask.copy(), len(book.running)
        l_gpus = [g for g in fab.spec.from_mask(state.free) if g.startswith(fab.spec.hosts[2].name + ":")]
        assert len(l_gpus) == 4
        assert not replan_around(book, pend["L"], l_gpus, 0.0)
        assert r.gpus == gpus and np.array_equal(r.mask, mask) and len(book.running) == n_running
