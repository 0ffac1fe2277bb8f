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
from bandpilot.queue.clock import use_clock
from bandpilot.simulation.engine import SimConfig, simulate
from bandpilot.simulation.trace import TraceJob
from bandpilot.scheduling.profile import ProfileError, SchedulerProfile

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
    sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test"))
    clock.t = 10.0
    q.submit(store, [{"id": "B", "k": 16, "time_limit_s": 3000, "submitted": 1, "constraints": {"allowed_hosts": h[2:]}},
                     {"id": "C", "k": 8, "time_limit_s": 5000, "submitted": 2},
                     {"id": "D", "k": 8, "time_limit_s": 500, "submitted": 3}])
    return h


def test_greedy_lets_small_jobs_take_what_the_gang_needs(store, fab):
    clock = Clock()
    with use_clock(clock):
        _setup(store, fab, clock)
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", backfill="greedy"))
    assert [o.request_id for o in rep.assigned] == ["C"] and rep.reservations == []


def test_easy_reserves_for_the_blocked_gang_and_backfills_only_what_cannot_delay_it(store, fab):
    scenario_easy(store, fab)


def scenario_easy(store, fab):
    """Shared with test_queue_pg.py: the same plan on PostgreSQL."""
    clock = Clock()
    d = Dispatcher(fab)
    with use_clock(clock):
        h = _setup(store, fab, clock)
        rep = sched.run_batch(store, d, SchedulerProfile("test", backfill="easy"))
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
        rep = sched.run_batch(store, d, SchedulerProfile("test", backfill="easy"))
        assert {o.request_id for o in rep.assigned} == {"B", "C"}  # B on its hosts, C fits beside it
        assert rep.reservations == [] and q.status(store)["reservations"] == []
        assert q.check_invariants(store) == []


def test_an_overdue_job_moves_the_reservation_and_cancel_drops_it(store, fab):
    clock = Clock()
    with use_clock(clock):
        _setup(store, fab, clock)
        clock.t = 4000.0  # A ran past its 1000 s limit: nothing kills it, the plan moves
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", backfill="easy"))
        assert rep.reservations[0]["start_at"] == pytest.approx(4000.0 + 0.5 * 1000.0)  # half its estimate more
        q.cancel(store, "B")
        assert q.status(store)["reservations"] == [] and q.check_invariants(store) == []


def test_conservative_reservations_do_not_overlap(store, fab):
    clock = Clock()
    with use_clock(clock):
        q.submit(store, [{"id": "A", "k": 32, "time_limit_s": 1000, "submitted": 0}])
        sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test"))
        q.submit(store, [{"id": f"G{i}", "k": 24, "time_limit_s": 2000, "submitted": 1 + i} for i in range(3)])
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", backfill="conservative", reservations=16))
        res = rep.reservations
        assert [r["request_id"] for r in res] == ["G0", "G1", "G2"]
        assert [r["start_at"] for r in res] == pytest.approx([1000.0, 3000.0, 5000.0])  # one 24-GPU gang at a time
        eas = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", backfill="easy"))
        assert [r["request_id"] for r in eas.reservations] == ["G0"]  # recomputed, not merged
        assert q.check_invariants(store) == []
    with pytest.raises(ProfileError, match="backfill: unknown value 'lazy'"):
        SchedulerProfile("test", backfill="lazy")


def test_request_commit_mode_reserves_too(store, fab):
    clock = Clock()
    with use_clock(clock):
        _setup(store, fab, clock)
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", backfill="easy"), commit="request")
    assert [r["request_id"] for r in rep.reservations] == ["B"] and [o.request_id for o in rep.assigned] == ["D"]
    assert q.check_invariants(store) == []


def test_cli_status_shows_the_reservation(store, fab, capsys):
    from bandpilot.cli.main import main

    clock = Clock()
    with use_clock(clock):
        _setup(store, fab, clock)
        sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", backfill="easy"))
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
        res = simulate(jobs, Dispatcher(fab), fab, SimConfig(profile=SchedulerProfile("test", backfill=mode)))
        assert all(j.status == "done" for j in res.jobs)
        starts[mode] = {j.id: j.start_s for j in res.jobs}
        ev = sorted([(j.start_s, j.k) for j in res.jobs] + [(j.end_s, -j.k) for j in res.jobs], key=lambda e: (e[0], e[1]))
        assert np.cumsum([k for _, k in ev]).max() <= 32
    assert starts["easy"]["big"] < starts["greedy"]["big"]
    with pytest.raises(ProfileError, match="backfill: unknown value 'lazy'"):
        SchedulerProfile("test", backfill="lazy")


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
            sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", backfill="easy"))
        mine = client.get("/v1/cluster", headers=hdr(alice)).json()["status"]["reservations"]
        assert [x["request_id"] for x in mine] == [None] and len(mine[0]["gpus"]) == 16  # reserved, not hers
        ops = client.get("/v1/cluster", headers=hdr(admin)).json()["status"]["reservations"]
        assert [x["request_id"] for x in ops] == ["B"]


@pytest.mark.slow
def test_summary_fields_and_sweep_axes_with_the_slurm_like_profile(tmp_path, fab):
    from bandpilot.cli.main import main
    from bandpilot.scheduling.profile import SLURM_LIKE
    from bandpilot.simulation.report import summarize
    from bandpilot.simulation.sweep import SweepError, load_sweep
    from bandpilot.simulation.trace import write_trace
    from bandpilot.simulation.workloads import seed001_workload

    jobs = seed001_workload(2)[:10]
    s = summarize(simulate(jobs, Dispatcher(fab), fab, SimConfig(profile=SchedulerProfile("test", queue_sort="hrrn", backfill="easy", start_or_wait=True, locality=0.5))))
    assert s["backfill"] == "easy" and s["preemptions"] == 0 and s["wasted_gpu_hours"] == 0.0
    assert s["gpu_hours"] > 0 and 0 <= s["max_wait_s"] <= s["max_jct_s"]
    assert (SLURM_LIKE.queue_sort, SLURM_LIKE.backfill, SLURM_LIKE.algorithm_for(fab.spec)) == ("fifo", "easy", "topo")
    write_trace(jobs, tmp_path / "a.csv")
    (tmp_path / "fifo-easy.yaml").write_text("base: slurm-like\nplacement: bandpilot\n")
    y = tmp_path / "sweep.yaml"
    y.write_text(f"cluster: {H100}\nmodel: emulator\ntraces: [a.csv]\nprofiles: [fifo-greedy, slurm-like, fifo-easy.yaml]\n"
                 "demand: [full, comm]\nseeds: [0]\nworkers: 2\n")
    out = tmp_path / "sw"
    assert main(["simulate", "--sweep", str(y), "--out", str(out), "--no-log", "--no-figures"]) == 0
    rows = (out / "comparison.csv").read_text().splitlines()
    assert rows[0].startswith("trace,profile,seeds,demand,")
    combos = {tuple(r.split(",")[1:4]) for r in rows[1:]}
    assert len(rows) == 1 + 6 and ("fifo-easy", "1", "comm") in combos  # 3 profiles x 2 demands
    y.write_text("model: emulator\ntraces: [a.csv]\nprofiles: [pbs]\n")
    with pytest.raises(SweepError, match="profiles: unknown profile 'pbs'"):
        load_sweep(y)
    assert main(["simulate", "--trace", str(tmp_path / "a.csv"), "--cluster", str(H100), "--model", "emulator",
                 "--profile", "slurm-like", "--out", str(tmp_path / "one"), "--no-log", "--no-figures"]) == 0
    one = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert (one["profile"], one["algorithm"], one["backfill"]) == ("slurm-like", "compact", "easy")
    assert main(["simulate", "--trace", str(tmp_path / "a.csv"), "--cluster", str(H100), "--model", "emulator",
                 "--profile", "pbs", "--out", str(tmp_path / "two"), "--no-log"]) != 0


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
    with pytest.raises(ProfileError, match="locality"):
        SchedulerProfile("test", locality=-1)


_RUNNER = """
import sys
from bandpilot.scheduling.profile import SchedulerProfile
import time
from bandpilot import queue as q, scheduling as sched
from bandpilot.dispatch.dispatcher import Dispatcher
from bandpilot.fabric.emulator import make_fabric
from bandpilot.queue.clock import use_clock
store = q.Store(sys.argv[1])
print("START", flush=True)
with use_clock(lambda: 20.0):
    # after_each sleeps inside the transaction: a window to kill -9 mid-batch
    sched.run_batch(store, Dispatcher(make_fabric(store.spec)), SchedulerProfile("test", backfill="easy"), after_each=lambda o: time.sleep(0.3))
"""


@pytest.mark.slow
def test_kill9_mid_batch_leaves_the_old_reservations_or_the_new(store, fab):
    clock = Clock()
    with use_clock(clock):
        _setup(store, fab, clock)
        sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", backfill="easy"))  # B reserved, D started
        q.submit(store, [{"id": f"s{i}", "k": 1, "time_limit_s": 100, "submitted": 5 + i} for i in range(6)])
    before = q.status(store)["reservations"]
    kill_mid_run(_RUNNER, store.url, after_s=1.5)
    assert q.status(store)["reservations"] == before  # one transaction: the old plan, whole
    assert q.check_invariants(store) == []
    with use_clock(lambda: 20.0):
        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("test", backfill="easy"))
    assert [r["request_id"] for r in rep.reservations] == ["B"] and q.check_invariants(store) == []


HRRN_EASY = SchedulerProfile("test", queue_sort="hrrn", backfill="easy")


def _a_blocks_g(store, fab, clock, a_limit_s: float = 100_000) -> Dispatcher:
    """A (24 GPUs on three hosts, ``a_limit_s``) runs; at 10 s G (32 GPUs: the whole cluster, 20 h)
    queues behind it (hrrn + EASY). The dispatcher, for later batches."""
    h = [x.name for x in fab.spec.hosts]
    d = Dispatcher(fab)
    q.submit(store, [{"id": "A", "k": 24, "time_limit_s": a_limit_s, "submitted": 0, "constraints": {"allowed_hosts": h[:3]}}])
    sched.run_batch(store, d, HRRN_EASY)
    clock.t = 10.0
    q.submit(store, [{"id": "G", "k": 32, "time_limit_s": 72_000, "submitted": 1}])
    return d


def test_the_easy_reservation_follows_hrrn_order_when_a_short_gang_overtakes(store, fab):
    """G (32 GPUs: the whole cluster) is blocked behind A and holds the EASY reservation; 9 h later a
    short 16-GPU S overtakes it in hrrn order (ratio 2.17 vs G's capped 2.13) and takes the slot."""
    clock = Clock()
    with use_clock(clock):
        d = _a_blocks_g(store, fab, clock)
        first = sched.run_batch(store, d, HRRN_EASY)
        assert [r["request_id"] for r in first.reservations] == ["G"]
        clock.t = 9 * 3600.0
        q.submit(store, [{"id": "S", "k": 16, "time_limit_s": 600, "submitted": clock.t - 700}])
        mid = sched.run_batch(store, d, HRRN_EASY)
        clock.t = 40_000.0
        q.release(store, "A")
        last = sched.run_batch(store, d, HRRN_EASY)
        assert q.check_invariants(store) == []
    assert [r["request_id"] for r in mid.reservations] == ["S"]
    out = {o.request_id: o for o in last.outcomes}
    assert out["S"].status == "assigned" and out["G"].status == "deferred"

