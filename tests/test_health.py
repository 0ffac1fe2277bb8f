"""Fault injection, the probe plan, the single-fault decoder, ``bandpilot verify``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import yaml
from hypothesis import given, settings
from hypothesis import strategies as st

from bandpilot.errors import DataError, SpecError
from bandpilot.fabric.emulator import EmulatorFabric, make_fabric
from bandpilot.fabric.faults import KINDS, Fault, FaultyFabric, parse_faults, random_fault
from bandpilot.health.diagnosis import Tolerance, diagnose
from bandpilot.health.probes import plan_probes, runs_per_host
from bandpilot.health.verify import verify_probes
from bandpilot.topology.cluster import load_cluster, spec_from_dict
from bandpilot.scheduling.profile import SchedulerProfile

ROOT = Path(__file__).resolve().parent.parent
H100 = ROOT / "params" / "clusters" / "h100.yaml"
HET = ROOT / "params" / "clusters" / "het4mix.yaml"


@pytest.fixture(scope="module")
def h100():
    return load_cluster(H100)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, h100):
    from bandpilot.data.synthetic import fabric_dataset
    from bandpilot.model.crossval import fit

    res = fit(fabric_dataset(EmulatorFabric(h100), n_cross=150, seed=3),
              {"epochs": 20, "hidden": 16, "heads": 2, "threads": 1, "folds": 2, "replay_size": 16}, plots=False)
    d = tmp_path_factory.mktemp("model") / "m"
    res.surrogate.save(d)
    return d


# ------------------------------------------------------------------------------------------
def test_fault_entries_are_validated(h100):
    good = parse_faults([{"kind": "nvlink_pair", "host": "h100-1", "gpu": 2, "peer": 5, "factor": 0.4}], h100)
    assert good == [Fault("nvlink_pair", "h100-1", 2, 5, 0.4)]
    bad = [
        ([{"kind": "melted", "host": "h100-1"}], "kind must be one of"),
        ([{"kind": "slow_host", "host": "nowhere"}], "not in cluster"),
        ([{"kind": "nvlink_width", "host": "h100-1", "gpu": 8}], "needs gpu"),
        ([{"kind": "nvlink_pair", "host": "h100-1", "gpu": 2, "peer": 2}], "two different"),
        ([{"kind": "nic_rail", "host": "h100-1", "gpu": 1, "factor": 1.5}], "factor"),
        ([{"kind": "slow_host", "host": "h100-1", "colour": "red"}], "unknown keys"),
        ({"kind": "slow_host"}, "must be a list"),
    ]
    for items, msg in bad:
        with pytest.raises(SpecError, match=msg):
            parse_faults(items, h100, "f.yaml")


def test_spec_faults_make_a_faulty_fabric():
    doc = yaml.safe_load(H100.read_text())
    doc["faults"] = [{"kind": "missing_gpu", "host": "h100-0", "gpu": 7}]
    spec = spec_from_dict(doc, H100.parent, "h100")
    fab = make_fabric(spec)
    assert isinstance(fab, FaultyFabric)
    m = np.array([[0b10000001, 0, 0, 0], [0b11, 0, 0, 0]])
    assert fab.bandwidth_masks(m)[0] == 0 and fab.bandwidth_masks(m)[1] > 0
    assert spec.fingerprint() == load_cluster(H100).fingerprint()  # faults are the fabric's, not the cluster's


@given(st.sampled_from(KINDS), st.integers(0, 10_000), st.lists(st.lists(st.integers(0, 255), min_size=4, max_size=4),
                                                             min_size=1, max_size=30))
@pytest.mark.slow
@settings(max_examples=60, deadline=None)
def test_faults_only_lower_what_they_touch(kind, seed, rows):
    spec = load_cluster(H100)
    base = EmulatorFabric(spec, noise=0.0)
    f = random_fault(spec, kind, np.random.default_rng(seed))
    fab = FaultyFabric(base, [f])
    masks = np.array(rows, dtype=np.int64)
    b, d = base.bandwidth_masks(masks), fab.bandwidth_masks(masks)
    h = spec.host_index[f.host]
    untouched = masks[:, h] == 0
    assert np.allclose(d[untouched], b[untouched]) and (d <= b + 1e-9).all()
    single = (np.bitwise_count(masks) > 0).sum(axis=1) == 1
    own = single & (masks[:, h] != 0)
    assert np.allclose(fab.stage1[h][masks[own, h]], d[own])


# ------------------------------------------------------------------------------------------
def test_probe_plan_is_small_and_complete(h100):
    probes = plan_probes(h100)
    assert runs_per_host(probes, h100) == 16.0  # 8 leave-one-out + 8 one-GPU-per-host rail runs, amortised
    loo = [p for p in probes if p.kind == "leave_one_out"]
    assert len(loo) == 32 and all(bin(sum(p.masks)).count("1") == 7 for p in loo)
    rails = [p for p in probes if p.kind == "rail"]
    for p in rails:  # one GPU per host, the same index on both: the network alone decides the run
        used = [m for m in p.masks if m]
        assert len(used) == 2 and used[0] == used[1] and bin(used[0]).count("1") == 1
    assert len(rails) == 32
    with pytest.raises(SpecError, match="not in cluster"):
        plan_probes(h100, ["h100-9"])
    sub = plan_probes(h100, ["h100-1", "h100-2"])
    assert {h for p in sub for h in p.measurement.hosts} == {"h100-1", "h100-2"}


@pytest.mark.slow
@given(st.sampled_from(KINDS), st.integers(0, 10_000))
@settings(max_examples=80, deadline=None)
def test_decoder_localizes_every_single_fault_without_noise(kind, seed):
    spec = load_cluster(HET)
    base = EmulatorFabric(spec, noise=0.0)
    f = random_fault(spec, kind, np.random.default_rng(seed))
    probes = plan_probes(spec)
    masks = np.array([p.masks for p in probes])
    measured = FaultyFabric(base, [f]).bandwidth_masks(masks)
    verdicts = diagnose(spec, masks, measured, base.bandwidth_masks(masks), Tolerance())
    v = verdicts[f.host]
    assert v.status == ("failed" if kind == "missing_gpu" else "degraded")
    expect = {"nvlink_width": "gpu", "missing_gpu": "gpu", "nvlink_pair": "pair", "nic_rail": "rail", "slow_host": "host"}
    assert v.fault == expect[kind]
    if kind in ("nvlink_width", "missing_gpu"):
        assert v.gpus == [f"{f.host}:{f.gpu}"]
    elif kind == "nvlink_pair":
        assert sorted(v.gpus) == sorted([f"{f.host}:{f.gpu}", f"{f.host}:{f.peer}"])
    elif kind == "nic_rail":
        assert v.links == [f"{f.host}:nic-rail{f.gpu}"]
    assert all(o.status == "healthy" for h, o in verdicts.items() if h != f.host)


def test_verify_through_nccl_logs_with_noise(h100):
    perfect = EmulatorFabric(h100, noise=0.0)
    rep = verify_probes(perfect, h100, fabric=EmulatorFabric(h100, seed=5))
    assert rep.healthy and rep.exit_code == 0 and len(rep.runs) == 64
    bad = FaultyFabric(EmulatorFabric(h100, seed=6), [Fault("nic_rail", "h100-2", 6)])
    rep = verify_probes(perfect, h100, fabric=bad)
    assert rep.exit_code == 3
    assert rep.to_json()["hosts"]["h100-2"] == {"status": "degraded", "gpus": [], "links": ["h100-2:nic-rail6"],
                                                "ratio": pytest.approx(0.5, abs=0.05)}


# ------------------------------------------------------------------------------------------
def _cli(args):
    from bandpilot.cli.main import main

    return main(args)


@pytest.mark.slow
def test_cli_verify_json_exit_codes_and_errors(model_dir, tmp_path, capsys):
    rc = _cli(["verify", "--model", str(model_dir), "--json"])
    out = json.loads(capsys.readouterr().out)
    assert rc == 0 and set(out) == {"hosts"} and len(out["hosts"]) == 4
    assert all(set(v) == {"status", "gpus", "links", "ratio"} and v["status"] == "healthy" for v in out["hosts"].values())

    faults = tmp_path / "faults.yaml"
    faults.write_text(yaml.safe_dump({"faults": [{"kind": "nvlink_width", "host": "h100-3", "gpu": 4}]}))
    rc = _cli(["verify", "--model", str(model_dir), "--inject", str(faults), "--json", "--out", str(tmp_path / "rep")])
    out = json.loads(capsys.readouterr().out)
    assert rc == 3 and out["hosts"]["h100-3"]["status"] == "degraded" and out["hosts"]["h100-3"]["gpus"] == ["h100-3:4"]
    assert "h100-3:4" in (tmp_path / "rep" / "verify.md").read_text()
    assert json.loads((tmp_path / "rep" / "verify.json").read_text())["hosts"] == out["hosts"]

    rc = _cli(["verify", "--model", str(model_dir), "--dry-run"])
    lines = capsys.readouterr().out.splitlines()
    assert rc == 0 and len(lines) == 65 and "16.0 per host" in lines[-1]
    # every line says where it runs: ssh to the host inside one host, mpirun -H across hosts
    assert lines[0].startswith("ssh h100-0 CUDA_VISIBLE_DEVICES=1,2,3,4,5,6,7 ")
    assert sum(ln.startswith("ssh h100-") for ln in lines) == 32 and sum("-H h100-" in ln for ln in lines) == 32
    rc = _cli(["verify", "--model", str(model_dir), "--dry-run", "--json"])
    plan = json.loads(capsys.readouterr().out)
    assert rc == 0 and plan["total"] == 64 and plan["per_host"] == 16.0 and len(plan["runs"]) == 64
    assert plan["runs"][0]["hosts"] == ["h100-0"] and plan["runs"][0]["gpus"] == {"h100-0": [1, 2, 3, 4, 5, 6, 7]}
    assert [c for r in plan["runs"] for c in r["commands"]] == lines[:-1]

    for args, msg in ((["--hosts", "h100-0,nope"], "nope"), (["--runner", "rdma"], "--runner"),
                      (["--inject", str(tmp_path / "missing.yaml")], "missing.yaml")):
        rc = _cli(["verify", "--model", str(model_dir), *args])
        err = capsys.readouterr().err
        assert rc == 2 and err.startswith("error:") and err.count("\n") == 1 and msg in err


def test_verify_measurement_directory(shared_data, model_dir):
    from bandpilot.fabric.trace import TraceFabric
    from bandpilot.health.verify import verify_measurements

    d = shared_data / "h100-16m"
    rep = verify_measurements(TraceFabric(load_cluster(d)), d)
    assert rep.healthy and len(rep.runs) > 1000
    from bandpilot.model.surrogate import Surrogate

    with pytest.raises(DataError, match="the model is for cluster"):
        verify_measurements(Surrogate.load(model_dir), d)


# ------------------------------------------------------------------------------------------
def test_gate_drains_suspects_undrains_after_a_pass_and_keeps_operator_drains(h100, tmp_path):
    from bandpilot import queue as q
    from bandpilot import scheduling as sched
    from bandpilot.errors import StateError

    store = q.Store(f"sqlite:///{tmp_path / 'q.db'}")
    store.init_cluster(h100)
    from bandpilot.dispatch.dispatcher import Dispatcher

    q.submit(store, [{"id": "job", "k": 8, "tenant": "t", "constraints": {"allowed_hosts": ["h100-0"]}}])
    sched.run_batch(store, Dispatcher(EmulatorFabric(h100)), SchedulerProfile("test"))  # the job holds all of h100-0
    q.drain(store, "h100-3:0", reason="operator: fan")
    verdicts = {
        "h100-0": {"status": "degraded", "gpus": ["h100-0:2"], "links": [], "ratio": 0.5},
        "h100-1": {"status": "degraded", "gpus": [], "links": ["h100-1:nic-rail5"], "ratio": 0.5},
        "h100-2": {"status": "degraded", "gpus": [], "links": ["h100-2"], "ratio": 0.7},
        "h100-3": {"status": "healthy", "gpus": [], "links": [], "ratio": 1.0},
    }
    g = q.apply_verdicts(store, verdicts, "test")
    assert g["pending"] == ["h100-0:2"] and "h100-1:5" in g["drained"] and len(g["drained"]) == 9
    st = q.export_state(store)
    assert "h100-1:5" not in st["free"] and not any(x.startswith("h100-2:") for x in st["free"])
    assert "h100-3:0" not in st["free"]
    rows = {r["host"]: r for r in q.health(store)}
    assert rows["h100-1"]["status"] == "degraded" and rows["h100-1"]["gated_gpus"] == 1 and rows["h100-2"]["gated_gpus"] == 8
    assert q.check_invariants(store) == []

    before = q.export_state(store)
    with pytest.raises(StateError, match="not in cluster"):
        q.apply_verdicts(store, {"h100-1": {"status": "healthy"}, "h100-9": {"status": "healthy"}})
    with pytest.raises(StateError, match="status must be"):
        q.apply_verdicts(store, {"h100-1": {"status": "so-so"}})
    assert q.export_state(store) == before  # nothing stored half

    q.apply_verdicts(store, {h: {"status": "healthy", "gpus": [], "links": [], "ratio": 1.0} for h in verdicts})
    st = q.export_state(store)
    assert "h100-1:5" in st["free"] and all(f"h100-2:{i}" in st["free"] for i in range(8))
    assert "h100-3:0" not in st["free"]  # the operator's drain is the operator's to lift
    assert all(r["status"] == "healthy" and r["gated_gpus"] == 0 for r in q.health(store))
    assert q.check_invariants(store) == []


@pytest.mark.slow
def test_cli_verify_gate_and_cluster_health(model_dir, tmp_path, capsys):
    url = f"sqlite:///{tmp_path / 'q.db'}"
    assert _cli(["cluster", "init", "--cluster", str(H100), "--store", url]) == 0
    faults = tmp_path / "f.yaml"
    faults.write_text(yaml.safe_dump([{"kind": "slow_host", "host": "h100-1"}]))
    capsys.readouterr()
    assert _cli(["verify", "--model", str(model_dir), "--inject", str(faults), "--gate", "--store", url]) == 3
    capsys.readouterr()
    assert _cli(["cluster", "health", "--store", url, "--json"]) == 0
    rows = {r["host"]: r for r in json.loads(capsys.readouterr().out)}
    assert rows["h100-1"]["status"] == "degraded" and rows["h100-1"]["gated_gpus"] == 8
    assert _cli(["verify", "--model", str(model_dir), "--gate", "--store", url]) == 0
    capsys.readouterr()
    assert _cli(["cluster", "health", "--store", url, "--json"]) == 0
    rows = {r["host"]: r for r in json.loads(capsys.readouterr().out)}
    assert all(r["status"] == "healthy" and r["gated_gpus"] == 0 for r in rows.values())


def test_cli_verify_pairwise_with_the_model(model_dir, h100, tmp_path, capsys):
    """--pairwise with --model: the model's expectation per pair is divided out before the peer comparison."""
    from bandpilot.health.sweeps import emulate_sweep, write_sweep_logs

    fab = FaultyFabric(EmulatorFabric(h100, seed=8), [Fault("slow_host", "h100-2")])
    write_sweep_logs(emulate_sweep(fab, seed=8), tmp_path / "sweep")
    assert _cli(["verify", "--pairwise", str(tmp_path / "sweep"), "--model", str(model_dir), "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert {n for n, v in out["nodes"].items() if v["status"] != "healthy"} == {"h100-2"}
    assert out["nodes"]["h100-2"]["fault"] == "node" and len(out["links"]) == 6


# ------------------------------------------------------------------------------------------
def test_job_telemetry_is_stored_atomically_and_drives_drift(h100, tmp_path, capsys):
    import sqlalchemy as sa

    from bandpilot import queue as q
    from bandpilot import scheduling as sched
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.errors import StateError
    from bandpilot.queue.schema import T_OBS

    url = f"sqlite:///{tmp_path / 'q.db'}"
    store = q.Store(url)
    store.init_cluster(h100)
    q.submit(store, [{"id": f"j{i}", "k": 4, "tenant": "t"} for i in range(6)])
    rep = sched.run_batch(store, Dispatcher(EmulatorFabric(h100)), SchedulerProfile("test"))
    pred = {o.request_id: o.predicted_gbps for o in rep.outcomes}

    def n_obs():
        with store.read() as conn:
            return conn.execute(sa.select(sa.func.count()).select_from(T_OBS)).scalar()

    for bad, msg in (({"j0": float("nan")}, "finite"), ({"j0": "fast"}, "number"), ({"nope": 1.0}, "not being released")):
        with pytest.raises(StateError, match=msg):
            q.release_many(store, ["j0"], bad)
    assert n_obs() == 0 and "j0" in {j["id"] for j in q.export_state(store)["jobs"]}  # nothing released either
    q.release(store, "j0", measured_gbps=pred["j0"] * 0.98)
    with pytest.raises(StateError, match="already released"):
        q.release(store, "j0", measured_gbps=1.0)
    assert n_obs() == 1
    d = q.drift(store, min_observations=1)
    assert d["observations"] == 1 and not d["event"]
    for j in ("j1", "j2", "j3", "j4", "j5"):  # the fabric now delivers half of what the model predicts
        q.release(store, j, measured_gbps=pred[j] * 0.5)
    d = q.drift(store, min_observations=3)
    assert d["event"] and d["median_log_error"] > 0.6  # overall
    hosts = q.drift(store, min_observations=1)["drifting_hosts"]  # and per host
    assert hosts and set(hosts) <= set(h100.host_names)

    from bandpilot.cli.main import main

    capsys.readouterr()
    assert main(["cluster", "drift", "--store", url, "--json"]) == 3
    assert json.loads(capsys.readouterr().out)["event"] is True
    params = tmp_path / "drift.yaml"
    params.write_text("threshold: 5.0\n")
    assert main(["cluster", "drift", "--store", url, "--params", str(params)]) == 0
    params.write_text("colour: red\n")
    assert main(["cluster", "drift", "--store", url, "--params", str(params)]) == 2
    assert main(["queue", "release", "a", "b", "--measured-gbps", "3", "--store", url]) == 2
    assert "one job" in capsys.readouterr().err
