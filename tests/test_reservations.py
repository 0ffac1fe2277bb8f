"""Issue 21, slice 3: reservations and EASY / conservative backfill in the live queue (stored, shown,
recomputed each batch) and in the simulator that drives it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from crash import kill_mid_run

from bandpilot import queue as q
from bandpilot import scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.errors import RequestError
from bandpilot.queue.clock import use_clock
from bandpilot.simulation.engine import SimConfig, SimulationError, simulate
from bandpilot.simulation.trace import TraceJob

H100 = Path(__file__).resolve().parents[1] / "params" / "clusters" / "h100.yaml"


# fab (the emulated 4 x 8 H100) and store (a fresh SQLite queue on it): tests/conftest.py


class Clock:
    def __init__(self, t: float = 0.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def _setup(store, fab, clock):
    """A (24 GPUs on hosts 0-2, ends ~1000) runs; B (16 GPUs, hosts 2-3 only) is blocked behind it;
    C (8 GPUs, long) and D (8 GPUs, short) could take host 3 now."""
    h = [x.name for x in fab.spec.hosts]
    q.submit(store, [{"id": "A", "k": 24, "time_limit_s": 1000, "submitted": 0,
                      "constraints": {"allowed_hosts": h[:3]}}])
    sched.run_batch(store, Dispatcher(fab))
    clock.t = 10.0
    q.submit(store, [{"id": "B", "k": 16, "time_limit_s": 3000, "submitted": 1, "constraints": {"allowed_hosts": h[2:]}},
                     {"id": "C", "k": 8, "time_limit_s": 5000, "submitted": 2},
                     {"id": "D", "k": 8, "time_limit_s": 500, "submitted": 3}])
    return h


def test_greedy_lets_small_jobs_take_what_the_gang_needs(store, fab):
    clock = Clock()
    with use_clock(clock):
        _setup(store, fab, clock)
        rep = sched.run_batch(store, Dispatcher(fab), backfill="greedy")
    assert [o.request_id for o in rep.assigned] == ["C"] and rep.reservations == []


def test_easy_reserves_for_the_blocked_gang_and_backfills_only_what_cannot_delay_it(store, fab):
    scenario_easy(store, fab)


def scenario_easy(store, fab):
    """Shared with test_queue_pg.py: the same plan on PostgreSQL."""
    clock = Clock()
    d = Dispatcher(fab)
    with use_clock(clock):
        h = _setup(store, fab, clock)
        rep = sched.run_batch(store, d, backfill="easy")
        out = {o.request_id: o for o in rep.outcomes}
        assert out["B"].reason == "reserved" and "expected start" in out["B"].detail
        (res,) = rep.reservations
        assert res["request_id"] == "B" and res["start_at"] == pytest.approx(1000.0)  # A's expected end
        assert sorted({g.rpartition(":")[0] for g in res["gpus"]}) == h[2:] and res["predicted_gbps"] > 0
        assert out["C"].status == "deferred" and out["C"].reason == "protects_reservation"  # would end at 5010
        assert out["D"].status == "assigned"  # ends at 510, before B's start: backfilled
        rows = {r["id"]: r for r in q.list_requests(store)}
        assert rows["B"]["reservation"]["gpus"] == res["gpus"] and rows["C"]["reservation"] is None
        assert q.status(store)["reservations"][0]["request_id"] == "B"
        assert q.check_invariants(store) == []
        clock.t = 600.0
        q.release(store, "D")
        clock.t = 1000.0
        q.release(store, "A")
        rep = sched.run_batch(store, d, backfill="easy")
        assert {o.request_id for o in rep.assigned} == {"B", "C"}  # B on its hosts, C fits beside it
        assert rep.reservations == [] and q.status(store)["reservations"] == []
        assert q.check_invariants(store) == []


def test_an_overdue_job_moves_the_reservation_and_cancel_drops_it(store, fab):
    clock = Clock()
    with use_clock(clock):
        _setup(store, fab, clock)
        clock.t = 4000.0  # A ran past its 1000 s limit: nothing kills it, the plan moves
        rep = sched.run_batch(store, Dispatcher(fab), backfill="easy")
        assert rep.reservations[0]["start_at"] == pytest.approx(4000.0 + 0.5 * 1000.0)  # half its estimate more
        q.cancel(store, "B")
        assert q.status(store)["reservations"] == [] and q.check_invariants(store) == []


def test_conservative_reservations_do_not_overlap(store, fab):
    clock = Clock()
    with use_clock(clock):
        q.submit(store, [{"id": "A", "k": 32, "time_limit_s": 1000, "submitted": 0}])
        sched.run_batch(store, Dispatcher(fab))
        q.submit(store, [{"id": f"G{i}", "k": 24, "time_limit_s": 2000, "submitted": 1 + i} for i in range(3)])
        rep = sched.run_batch(store, Dispatcher(fab), backfill="conservative")
        res = rep.reservations
        assert [r["request_id"] for r in res] == ["G0", "G1", "G2"]
        assert [r["start_at"] for r in res] == pytest.approx([1000.0, 3000.0, 5000.0])  # one 24-GPU gang at a time
        eas = sched.run_batch(store, Dispatcher(fab), backfill="easy")
        assert [r["request_id"] for r in eas.reservations] == ["G0"]  # recomputed, not merged
        assert q.check_invariants(store) == []
    with pytest.raises(RequestError, match="unknown backfill mode"):
        sched.run_batch(store, Dispatcher(fab), backfill="lazy")


def test_request_commit_mode_reserves_too(store, fab):
    clock = Clock()
    with use_clock(clock):
        _setup(store, fab, clock)
        rep = sched.run_batch(store, Dispatcher(fab), backfill="easy", commit="request")
    assert [r["request_id"] for r in rep.reservations] == ["B"] and [o.request_id for o in rep.assigned] == ["D"]
    assert q.check_invariants(store) == []


def test_cli_status_shows_the_reservation(store, fab, capsys):
    from bandpilot.cli.main import main

    clock = Clock()
    with use_clock(clock):
        _setup(store, fab, clock)
        sched.run_batch(store, Dispatcher(fab), backfill="easy")
    assert main(["queue", "status", "--store", store.url]) == 0
    text = capsys.readouterr().out
    assert "reservation B (easy): expected start" in text
    assert main(["queue", "status", "--store", store.url, "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["reservations"][0]["request_id"] == "B"


@pytest.mark.slow
def test_simulated_easy_backfill_stops_small_jobs_starving_a_gang(fab):
    # a 32-GPU gang arrives behind a stream of 8-GPU jobs that always leaves someone running
    jobs = [TraceJob(f"s{i}", 100.0 * i, 8, "small", 1500.0, 0.2) for i in range(40)]
    jobs.insert(3, TraceJob("big", 250.0, 32, "big", 1000.0, 0.5))
    jobs.sort(key=lambda j: j.submit_s)
    starts = {}
    for mode in ("greedy", "easy"):
        res = simulate(jobs, Dispatcher(fab), fab, SimConfig(backfill=mode))
        assert all(j.status == "done" for j in res.jobs)
        starts[mode] = {j.id: j.start_s for j in res.jobs}
        ev = sorted([(j.start_s, j.k) for j in res.jobs] + [(j.end_s, -j.k) for j in res.jobs], key=lambda e: (e[0], e[1]))
        assert np.cumsum([k for _, k in ev]).max() <= 32
    assert starts["easy"]["big"] < starts["greedy"]["big"]
    with pytest.raises(SimulationError, match="unknown backfill mode"):
        simulate(jobs, Dispatcher(fab), fab, SimConfig(backfill="lazy"))


def test_api_submits_runtime_fields_and_shows_reservations_per_tenant(store, fab):
    from fastapi.testclient import TestClient

    from bandpilot.api import create_app

    admin, _ = q.create_token(store, "ops", admin=True)
    alice, _ = q.create_token(store, "alice")
    client = TestClient(create_app(store, sample_s=None))
    hdr = lambda tok: {"Authorization": f"Bearer {tok}"}  # noqa: E731
    with client:
        r = client.post("/v1/requests", json={"id": "a1", "k": 2, "time_limit_s": 600, "preemptible": True,
                                              "checkpoint_s": 30, "comm_fraction": 0.4}, headers=hdr(alice))
        assert r.status_code == 201 and r.json()["time_limit_s"] == 600 and r.json()["preemptible"] is True
        bad = client.post("/v1/requests", json={"k": 2, "comm_fraction": 2}, headers=hdr(alice))
        assert bad.status_code == 422
        bad = client.post("/v1/requests", json={"k": 2, "checkpoint_s": 30}, headers=hdr(alice))
        assert bad.status_code in (400, 422) and "preemptible" in bad.text  # a 4xx naming the field
        clock = Clock()
        with use_clock(clock):
            _setup(store, fab, clock)  # tenant "default" gets B's reservation
            sched.run_batch(store, Dispatcher(fab), backfill="easy")
        mine = client.get("/v1/cluster", headers=hdr(alice)).json()["status"]["reservations"]
        assert [x["request_id"] for x in mine] == [None] and len(mine[0]["gpus"]) == 16  # reserved, not hers
        ops = client.get("/v1/cluster", headers=hdr(admin)).json()["status"]["reservations"]
        assert [x["request_id"] for x in ops] == ["B"]


@pytest.mark.slow
def test_summary_fields_and_sweep_axes_with_the_slurm_baseline(tmp_path, fab):
    from bandpilot.cli.main import main
    from bandpilot.simulation.presets import apply_preset
    from bandpilot.simulation.report import summarize
    from bandpilot.simulation.sweep import SweepError, load_sweep
    from bandpilot.simulation.trace import write_trace
    from bandpilot.simulation.workloads import seed001_workload

    jobs = seed001_workload(2)[:10]
    s = summarize(simulate(jobs, Dispatcher(fab), fab, SimConfig(backfill="easy")))
    assert s["backfill"] == "easy" and s["preemptions"] == 0 and s["wasted_gpu_hours"] == 0.0
    assert s["gpu_hours"] > 0 and 0 <= s["max_wait_s"] <= s["max_jct_s"]
    cfg = apply_preset(SimConfig(policy="utility"), "slurm", fab.spec)
    assert (cfg.policy, cfg.backfill, cfg.algorithm) == ("fifo", "easy", "topo")
    write_trace(jobs, tmp_path / "a.csv")
    y = tmp_path / "sweep.yaml"
    y.write_text(f"cluster: {H100}\nmodel: emulator\ntraces: [a.csv]\npolicies: [fifo]\nalgorithms: [bandpilot]\n"
                 "backfill: [greedy, easy]\ndemand: [full, comm]\nbaselines: [slurm]\nseeds: [0]\nworkers: 2\n")
    out = tmp_path / "sw"
    assert main(["simulate", "--sweep", str(y), "--out", str(out), "--no-log", "--no-figures"]) == 0
    rows = (out / "comparison.csv").read_text().splitlines()
    assert rows[0].startswith("trace,policy,algorithm,seeds,backfill,demand,")
    combos = {tuple(r.split(",")[1:6:]) for r in rows[1:]}
    assert len(rows) == 1 + 6 and ("fifo", "topo", "1", "easy", "comm") in combos  # 2 x 2 + slurm x 2 demands
    y.write_text("model: emulator\ntraces: [a.csv]\nbackfill: [lazy]\n")
    with pytest.raises(SweepError, match="backfill: unknown 'lazy'"):
        load_sweep(y)
    assert main(["simulate", "--trace", str(tmp_path / "a.csv"), "--cluster", str(H100), "--model", "emulator",
                 "--baseline", "slurm", "--out", str(tmp_path / "one"), "--no-log", "--no-figures"]) == 0
    one = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert (one["algorithm"], one["backfill"]) == ("topo", "easy")
    assert main(["simulate", "--trace", str(tmp_path / "a.csv"), "--cluster", str(H100), "--model", "emulator",
                 "--baseline", "pbs", "--out", str(tmp_path / "two"), "--no-log"]) != 0


def test_locality_prefers_fewer_hosts_only_within_its_margin(fab):
    from bandpilot.dispatch.state import State

    rng = np.random.default_rng(7)
    spec = fab.spec
    d0, d5 = Dispatcher(fab), Dispatcher(fab).with_locality(0.5)
    changed = 0
    for _ in range(30):
        busy = rng.random(spec.n_gpus) < 0.45
        ids = spec.gpu_ids
        free = [g for g, b in zip(ids, busy) if not b]
        taken = [g for g, b in zip(ids, busy) if b]
        jobs = [{"id": f"j{i}", "gpus": taken[i::3], "demand_gbps": 100.0} for i in range(3) if taken[i::3]]
        st = State.from_dict(spec, {"free": free, "jobs": jobs})
        k = int(rng.choice([4, 6, 8]))
        if st.n_free < k:
            continue
        a, b = d0.select(k, st), d5.select(k, st)
        hosts = lambda sel: len({g.rpartition(":")[0] for g in sel.gpus})  # noqa: E731
        assert hosts(b) <= hosts(a) and b.predicted_gbps >= 0.5 * a.predicted_gbps - 1e-9
        changed += hosts(b) < hosts(a)
    assert changed > 0  # the margin does change decisions on a busy cluster
    with pytest.raises(ValueError, match="locality"):
        Dispatcher(fab, locality=1.5)
    with pytest.raises(RequestError, match="locality"):
        q_store = q.Store("sqlite://")
        q_store.init_cluster(spec)
        sched.run_batch(q_store, d0, locality=-1)


_RUNNER = """
import sys
import time
from bandpilot import queue as q, scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.fabric.emulator import make_fabric
from bandpilot.queue.clock import use_clock
store = q.Store(sys.argv[1])
print("START", flush=True)
with use_clock(lambda: 20.0):
    # after_each sleeps inside the transaction: a window to kill -9 mid-batch
    sched.run_batch(store, Dispatcher(make_fabric(store.spec)), backfill="easy", after_each=lambda o: time.sleep(0.3))
"""


@pytest.mark.slow
def test_kill9_mid_batch_leaves_the_old_reservations_or_the_new(store, fab):
    clock = Clock()
    with use_clock(clock):
        _setup(store, fab, clock)
        sched.run_batch(store, Dispatcher(fab), backfill="easy")  # B reserved, D started
        q.submit(store, [{"id": f"s{i}", "k": 1, "time_limit_s": 100, "submitted": 5 + i} for i in range(6)])
    before = q.status(store)["reservations"]
    kill_mid_run(_RUNNER, store.url, after_s=1.5)
    assert q.status(store)["reservations"] == before  # one transaction: the old plan, whole
    assert q.check_invariants(store) == []
    with use_clock(lambda: 20.0):
        rep = sched.run_batch(store, Dispatcher(fab), backfill="easy")
    assert [r["request_id"] for r in rep.reservations] == ["B"] and q.check_invariants(store) == []


def _a_blocks_g(store, fab, clock, a_limit_s: float = 100_000, **batch) -> Dispatcher:
    """A (24 GPUs on three hosts, ``a_limit_s``) runs; at 10 s G (32 GPUs: the whole cluster, 20 h)
    queues behind it. ``batch``: run_batch options beside hrrn + EASY. The dispatcher, for later batches."""
    h = [x.name for x in fab.spec.hosts]
    d = Dispatcher(fab)
    q.submit(store, [{"id": "A", "k": 24, "time_limit_s": a_limit_s, "submitted": 0, "constraints": {"allowed_hosts": h[:3]}}])
    sched.run_batch(store, d, policy="hrrn", backfill="easy", **batch)
    clock.t = 10.0
    q.submit(store, [{"id": "G", "k": 32, "time_limit_s": 72_000, "submitted": 1}])
    return d


def _drain_scenario(store, fab, clock, drain_after_s, monkeypatch, age_slot="off"):
    """G (32 GPUs: the whole cluster) is blocked behind A and holds the EASY reservation; 9 h later a
    short 16-GPU S overtakes it in hrrn order (ratio 2.17 vs G's capped 2.13), then A ends."""
    from bandpilot.scheduling import reservations

    monkeypatch.setattr(reservations, "DRAIN_AFTER_S", drain_after_s)
    d = _a_blocks_g(store, fab, clock, age_slot=age_slot)
    run = lambda: sched.run_batch(store, d, policy="hrrn", backfill="easy", age_slot=age_slot)  # noqa: E731
    first = run()
    assert [r["request_id"] for r in first.reservations] == ["G"]
    clock.t = 9 * 3600.0
    q.submit(store, [{"id": "S", "k": 16, "time_limit_s": 600, "submitted": clock.t - 700}])
    mid = run()
    clock.t = 40_000.0
    q.release(store, "A")
    last = run()
    assert q.check_invariants(store) == []
    return mid, last


def test_a_drain_target_keeps_the_reservation_when_hrrn_reorders(store, fab, monkeypatch):
    clock = Clock()
    with use_clock(clock):
        mid, last = _drain_scenario(store, fab, clock, 8 * 3600.0, monkeypatch)
    assert [r["request_id"] for r in mid.reservations] == ["G"]  # S overtook G in order, not the slot
    assert "drain target" in {o.request_id: o for o in mid.outcomes}["G"].detail
    out = {o.request_id: o for o in last.outcomes}
    assert out["G"].status == "assigned" and out["S"].status == "deferred"  # the drained cluster goes to G
    assert out["S"].reason == "protects_reservation"


def test_without_a_drain_target_the_overtaker_takes_the_slot(store, fab, monkeypatch):
    """The reference behaviour (DRAIN_AFTER_S = inf, the default): the reservation follows hrrn's order."""
    clock = Clock()
    with use_clock(clock):
        mid, last = _drain_scenario(store, fab, clock, float("inf"), monkeypatch)
    assert [r["request_id"] for r in mid.reservations] == ["S"]
    out = {o.request_id: o for o in last.outcomes}
    assert out["S"].status == "assigned" and out["G"].status == "deferred"


def test_a_holder_that_has_not_waited_long_enough_is_not_kept(store, fab, monkeypatch):
    clock = Clock()
    with use_clock(clock):
        mid, _ = _drain_scenario(store, fab, clock, 10 * 3600.0, monkeypatch)  # G waited 9 h < 10 h
    assert [r["request_id"] for r in mid.reservations] == ["S"]


@pytest.mark.parametrize("slack, t_starts", [(1.0, True), (3.0, False)])
def test_a_drain_target_admits_only_backfill_that_ends_in_time_at_slack_times_its_estimate(store, fab, monkeypatch,
                                                                                            slack, t_starts):
    """G drains the cluster for A's expected end (100,000 s); at 9 h, T (8 GPUs, 40,000 s limit) would
    end by 72,400 s: plain EASY backfills it, at 3x its estimate (112,400 s + 9 h) it could delay G."""
    from bandpilot.scheduling import reservations

    monkeypatch.setattr(reservations, "DRAIN_AFTER_S", 8 * 3600.0)
    monkeypatch.setattr(reservations, "DRAIN_ESTIMATE_SLACK", slack)
    clock = Clock()
    with use_clock(clock):
        d = _a_blocks_g(store, fab, clock)
        sched.run_batch(store, d, policy="hrrn", backfill="easy")
        clock.t = 9 * 3600.0
        q.submit(store, [{"id": "T", "k": 8, "time_limit_s": 40_000, "submitted": clock.t}])
        rep = sched.run_batch(store, d, policy="hrrn", backfill="easy")
    out = {o.request_id: o for o in rep.outcomes}
    assert [r["request_id"] for r in rep.reservations] == ["G"]
    assert (out["T"].status == "assigned") is t_starts
    if not t_starts:
        assert out["T"].reason == "protects_reservation"
    assert q.check_invariants(store) == []


@pytest.mark.parametrize("mode, extra, reserved", [
    ("off", False, ["S"]),  # the default: the slot follows hrrn's order
    ("oldest", False, ["G"]),  # G has waited longest: the age slot replaces EASY's one policy slot
    ("oldest", True, ["G", "S"]),  # one slot more than the depth: G first, then hrrn's S
])
def test_the_age_slot_goes_to_the_longest_waiting_request_first(store, fab, monkeypatch, mode, extra, reserved):
    """The drain scenario with the age slot instead of the drain target (issue 21, the largest JCT):
    at 9 h a short S overtakes G in hrrn order; G, the oldest pending request, is reserved first."""
    from bandpilot.scheduling import age_slot

    monkeypatch.setattr(age_slot, "AGE_SLOT_EXTRA", extra)
    clock = Clock()
    with use_clock(clock):
        mid, _ = _drain_scenario(store, fab, clock, float("inf"), monkeypatch, age_slot=mode)
    assert [r["request_id"] for r in mid.reservations] == reserved


@pytest.mark.parametrize("after_h, reserved", [(20, ["G"]), (40, ["S"])])
def test_the_projected_age_slot_waits_for_its_threshold(store, fab, monkeypatch, after_h, reserved):
    """G's projected JCT at 9 h is ~9 h waited + its 20 h limit = 29 h: past 20 h it takes the slot, not before 40 h."""
    from bandpilot.scheduling import age_slot

    monkeypatch.setattr(age_slot, "PROJECTED_AFTER_S", after_h * 3600.0)
    clock = Clock()
    with use_clock(clock):
        mid, _ = _drain_scenario(store, fab, clock, float("inf"), monkeypatch, age_slot="projected")
    assert [r["request_id"] for r in mid.reservations] == reserved


def test_the_age_slot_skips_gangs_above_its_size_cap(store, fab, monkeypatch):
    """G (32 GPUs) is the oldest, but only gangs of <= 16 GPUs compete for the age slot: G gets none."""
    from bandpilot.scheduling import age_slot

    monkeypatch.setattr(age_slot, "AGE_SLOT_MAX_K", 16)
    clock = Clock()
    with use_clock(clock):
        mid, _ = _drain_scenario(store, fab, clock, float("inf"), monkeypatch, age_slot="oldest")
    assert "G" not in [r["request_id"] for r in mid.reservations]


def test_an_unknown_age_slot_is_refused(store, fab):
    with pytest.raises(RequestError):
        sched.run_batch(store, Dispatcher(fab), backfill="easy", age_slot="eldest")
