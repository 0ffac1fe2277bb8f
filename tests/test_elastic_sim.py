"""Elastic jobs in the simulator: the epoch-time model, per-epoch entropy reports, the trace's
elastic columns, resizing simulations and `bandpilot simulate --elastic`."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from bandpilot import queue as q
from bandpilot.simulation.elastic import epoch_time
from bandpilot.topology.cluster import load_cluster
from bandpilot.scheduling.profile import SchedulerProfile

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "params" / "clusters" / "h100.yaml"


def test_epoch_time_model():
    # at its own size on the reference bandwidth: exactly its epoch time
    assert epoch_time(100.0, 8, 8, 0.4, 0.9, 150.0, 150.0) == pytest.approx(100.0)
    # half the bandwidth doubles the collective share only
    assert epoch_time(100.0, 8, 8, 0.4, 0.9, 150.0, 75.0) == pytest.approx(60 + 80)
    # twice the GPUs: compute / (2 x 0.9), collective scaled by ring traffic r(16)/r(8)
    want = 60 / (2 * 0.9) + 40 * ((2 * 15 / 16) / (2 * 7 / 8)) * 150 / 100
    assert epoch_time(100.0, 8, 16, 0.4, 0.9, 150.0, 100.0) == pytest.approx(want)
    # one GPU: no collective; perfect scaling: linear
    assert epoch_time(100.0, 8, 1, 0.4, 1.0, 150.0, 0.0) == pytest.approx(60 * 8)


def test_jobs_report_entropy_once_per_own_epoch(monkeypatch):
    """Seed 001 Sec. 4.6: each job reports once per epoch - a 50-epoch job 50 times, a job without
    an ``epochs`` column the configured default - on the job's own learning curve."""
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.simulation import engine
    from bandpilot.simulation.engine import SimConfig, simulate
    from bandpilot.simulation.trace import TraceJob

    seen: dict[str, set[int]] = {}
    orig = engine.report_entropy

    def capture(store, rows, **kw):
        for r in rows:
            seen.setdefault(r["job"], set()).add(r["epoch"])
        return orig(store, rows, **kw)

    monkeypatch.setattr(engine, "report_entropy", capture)
    fab = make_fabric(load_cluster(H100))
    jobs = [TraceJob("long", 0.0, 2, "t", 600.0, 0.2, 0, epochs=50), TraceJob("dflt", 0.0, 2, "t", 600.0, 0.2, 0)]
    simulate(jobs, Dispatcher(fab), fab, SimConfig(profile=SchedulerProfile("test", queue_sort="utility", backfill="conservative", reservations=2, start_or_wait=True, locality=0.5), epochs=20, interval_s=30))
    assert seen["long"] == set(range(51)) and seen["dflt"] == set(range(21))


def test_trace_elastic_columns_parse_and_round_trip():
    from bandpilot.simulation.trace import TraceError, format_trace, parse_trace

    text = "id,submit_s,k,tenant,compute_s,comm_fraction,min_k,max_k,epochs,scaling\na,0,8,t,100,0.3,2,16,20,0.85\nb,1,2,t,50,0.1,,,,\n"
    jobs = parse_trace(text, n_gpus=32)
    assert (jobs[0].min_k, jobs[0].max_k, jobs[0].epochs, jobs[0].scaling) == (2, 16, 20, 0.85)
    assert jobs[1].min_k is None and parse_trace(format_trace(jobs)) == jobs
    with pytest.raises(TraceError, match=r"<trace>:2: max_k=64 is larger than the cluster"):
        parse_trace("id,submit_s,k,tenant,compute_s,comm_fraction,max_k\na,0,8,t,100,0.3,64\n", n_gpus=32)
    with pytest.raises(TraceError, match="min_k=9 is above k=8"):
        parse_trace("id,submit_s,k,tenant,compute_s,comm_fraction,min_k\na,0,8,t,100,0.3,9\n")
    with pytest.raises(TraceError, match="must be min_k=2 plus a multiple of k_step=4"):
        parse_trace("id,submit_s,k,tenant,compute_s,comm_fraction,min_k,k_step\na,0,8,t,100,0.3,2,4\n")
    with pytest.raises(TraceError, match=r"scaling 1.5 must be in \(0, 1\]"):
        parse_trace("id,submit_s,k,tenant,compute_s,comm_fraction,scaling\na,0,8,t,100,0.3,1.5\n")


# -- 5. the simulator with elastic quotas -----------------------------------------------------
def _elastic_jobs(n=14, seed=0):
    from dataclasses import replace

    from bandpilot.simulation.workloads import seed001_workload

    return [replace(j, min_k=max(1, j.k // 4), max_k=min(32, 2 * j.k), compute_s=j.compute_s / 20)
            for j in seed001_workload(seed)[:n]]


@pytest.mark.slow
def test_elastic_simulation_resizes_and_keeps_invariants(monkeypatch):
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.simulation import elastic as sim_el
    from bandpilot.simulation.elastic import simulate
    from bandpilot.simulation.engine import SimConfig
    from bandpilot.simulation.report import summarize

    fab = make_fabric(load_cluster(H100))
    checked = []
    orig = sim_el.ElasticSim._batch

    def checking(self, t):
        n = orig(self, t)
        bad = q.check_invariants(self.store)
        checked.append(bad)
        assert bad == [], bad
        return n

    monkeypatch.setattr(sim_el.ElasticSim, "_batch", checking)
    jobs = _elastic_jobs()
    on = summarize(simulate(jobs, Dispatcher(fab), fab, SimConfig(profile=SchedulerProfile("test", queue_sort="utility", backfill="conservative", reservations=2, start_or_wait=True, locality=0.5), elastic=True, interval_s=30)))
    assert on["completed"] == len(jobs) and on["resizes"] > 0 and on["elastic"] is True and len(checked) > 3
    off = summarize(simulate(jobs, Dispatcher(fab), fab, SimConfig(profile=SchedulerProfile("test", queue_sort="utility", backfill="conservative", reservations=2, start_or_wait=True, locality=0.5), interval_s=30)))
    assert off["resizes"] == 0 and off["completed"] == len(jobs)
    # elastic off ignores the ranges: the same as the trace without them
    from dataclasses import replace

    plain = summarize(simulate([replace(j, min_k=None, max_k=None) for j in jobs], Dispatcher(fab), fab,
                               SimConfig(profile=SchedulerProfile("test", queue_sort="utility", backfill="conservative", reservations=2, start_or_wait=True, locality=0.5), interval_s=30)))
    assert plain["avg_jct_s"] == pytest.approx(off["avg_jct_s"])


@pytest.mark.slow
def test_cli_simulate_elastic_on_writes_resizes(tmp_path, capsys):
    from bandpilot.cli.main import main
    from bandpilot.simulation.trace import write_trace

    trace = write_trace(_elastic_jobs(8), tmp_path / "t.csv")
    out = tmp_path / "out"
    (tmp_path / "by-utility.yaml").write_text("base: recommended\nqueue_sort: utility\n")
    rc = main(["simulate", "--trace", str(trace), "--model", "emulator", "--cluster", str(H100),
               "--profile", str(tmp_path / "by-utility.yaml"),
               "--elastic", "on", "--out", str(out), "--no-log", "--no-figures"])
    assert rc == 0, capsys.readouterr().err
    s = json.loads((out / "summary.json").read_text())
    assert s["elastic"] is True and s["resizes"] >= 0 and s["completed"] == 8
    assert "resizes" in capsys.readouterr().out
    assert main(["simulate", "--trace", str(trace), "--model", "emulator", "--cluster", str(H100), "--elastic", "maybe",
                 "--out", str(out), "--no-log"]) == 2
    assert "--elastic must be one of auto, on, off, got 'maybe'" in capsys.readouterr().err


def test_elastic_auto_is_on_only_for_traces_that_declare_a_range():
    from dataclasses import replace

    from bandpilot.errors import BandPilotError
    from bandpilot.simulation.elastic import elastic_for

    jobs = _elastic_jobs(4)
    fixed = [replace(j, min_k=None, max_k=None) for j in jobs]
    pinned = [replace(j, min_k=j.k, max_k=j.k) for j in jobs]  # a range of one size is a fixed gang
    assert elastic_for("auto", jobs) and not elastic_for("auto", fixed) and not elastic_for("auto", pinned)
    assert elastic_for("on", fixed) and not elastic_for("OFF", jobs)
    with pytest.raises(BandPilotError, match="--elastic must be one of auto, on, off, got 'maybe'"):
        elastic_for("maybe", jobs)


@pytest.mark.slow
def test_cli_simulate_default_leaves_fixed_gang_traces_unchanged(tmp_path, capsys):
    """The default ``--elastic auto``: a trace without ranges gives exactly the ``off`` figures; one
    with ranges runs elastic."""
    from dataclasses import replace

    from bandpilot.cli.main import main
    from bandpilot.simulation.trace import write_trace

    fixed = write_trace([replace(j, min_k=None, max_k=None) for j in _elastic_jobs(8)], tmp_path / "f.csv")
    ranged = write_trace(_elastic_jobs(8), tmp_path / "r.csv")
    runs = {}
    for name, trace, extra in (("auto", fixed, []), ("off", fixed, ["--elastic", "off"]), ("ranged", ranged, [])):
        out = tmp_path / name
        assert main(["simulate", "--trace", str(trace), "--model", "emulator", "--cluster", str(H100), *extra,
                     "--out", str(out), "--no-log", "--no-figures"]) == 0, capsys.readouterr().err
        runs[name] = json.loads((out / "summary.json").read_text())
    keys = ("avg_jct_s", "p95_jct_s", "makespan_s", "avg_queue_s", "gpu_hours", "completed")
    assert runs["auto"]["elastic"] is False and {k: runs["auto"][k] for k in keys} == {k: runs["off"][k] for k in keys}
    assert runs["ranged"]["elastic"] is True and runs["ranged"]["completed"] == 8
