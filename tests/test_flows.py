"""Prefect flows run in-process (prefect_test_harness) on a tiny emulated cluster.

Real Prefect, real MLflow registry (SQLite in tmp), real DVC in a temp git repo: the flows are
thin, so these tests check the wiring, idempotence and failure behaviour, not the models.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

import flows  # noqa: F401  (quiet env before prefect is imported)

ROOT = Path(__file__).resolve().parents[1]

TINY_SPEC = {
    "name": "tiny",
    "collective": "all_gather_perf",
    "gpus_per_host": 4,
    "host_groups": [
        {
            "prefix": "t-",
            "count": 3,
            "gpu": "A6000",
            "topology": ["X NV4 PXB SYS", "NV4 X SYS PXB", "PXB SYS X NV4", "SYS PXB NV4 X"],
        }
    ],
    "network": {"nic_gbps": 200, "rails_per_host": 4},
    "emulator": {"seed": 3, "noise": 0.01},
}
TINY_TRAIN = {"train": {"epochs": 25, "layers": 1, "hidden": 16, "n_train": 60, "prior_steps": 40, "split": "random", "threads": 1}}


@pytest.fixture(scope="module")
def harness():
    from prefect.testing.utilities import prefect_test_harness

    with prefect_test_harness(server_startup_timeout=60):
        yield


@pytest.fixture
def project(tmp_path, monkeypatch, mlflow_uri):
    """A throw-away project root: params, a git repo (for DVC), isolated stores."""
    root = tmp_path / "proj"
    shutil.copytree(ROOT / "params", root / "params")
    (root / "params" / "clusters" / "tiny.yaml").write_text(yaml.safe_dump(TINY_SPEC))
    (root / "params" / "train-tiny.yaml").write_text(yaml.safe_dump(TINY_TRAIN))
    pipeline = {
        "clusters": ["params/clusters/tiny.yaml"],
        "profile": {"samples": 80, "seed": 0, "runner": "emulator"},
        "data_root": ".",
        "train_params": "params/train-tiny.yaml",
        "sweep": {"n_trials": 0},
        "evaluate": {"profiles": ["idle", "heavy"], "repeats": 1, "seed": 0, "workers": 1},
        "promotion_policy": "params/promotion.yaml",
        "dispatch": {"profile": "params/scheduler-utility.yaml", "demo_requests": 8, "store": None},
        "task_runner": "thread",
    }
    (root / "params" / "pipeline-tiny.yaml").write_text(yaml.safe_dump(pipeline))
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    subprocess.run(["git", "-C", str(root), "config", "user.email", "ci@example.invalid"], check=True)
    subprocess.run(["git", "-C", str(root), "config", "user.name", "ci"], check=True)
    monkeypatch.setenv("BANDPILOT_HOME", str(root))
    monkeypatch.chdir(root)
    return root


def _versions(name: str) -> list[str]:
    from mlflow import MlflowClient

    return sorted(str(v.version) for v in MlflowClient().search_model_versions(f"name='{name}'"))


@pytest.mark.slow
def test_ingest_flow_profiles_tracks_and_resumes(harness, project):
    from flows.ingest import ingest_flow

    first = ingest_flow(cluster="params/clusters/tiny.yaml", samples=40)
    assert first["measured"] == 3 * 15 + 40 and first["skipped"] == 0
    assert (project / "data.dvc").is_file() and first["dvc_md5"].endswith(".dir")
    again = ingest_flow(cluster="params/clusters/tiny.yaml", samples=40)
    assert again["measured"] == 0 and again["dvc_md5"] == first["dvc_md5"]  # no new DVC version


@pytest.mark.slow
def test_ingest_flow_needs_exactly_one_source(harness, project):
    from flows.ingest import ingest_flow

    with pytest.raises(ValueError, match="exactly one"):
        ingest_flow()


@pytest.mark.slow
def test_retrain_flow_registers_once_and_gates(harness, project):
    from bandpilot.model import registry
    from flows.ingest import ingest_flow
    from flows.retrain import retrain_flow

    ingest_flow(cluster="params/clusters/tiny.yaml", samples=60, track=False)
    args = dict(data_dir="data/tiny", cluster_spec="params/clusters/tiny.yaml", params_file="params/train-tiny.yaml",
                evaluate={"profiles": ["idle"], "repeats": 1, "workers": 1})
    out = retrain_flow(**args)
    assert out["trained"] and out["version"] == "1"
    assert out["gate"]["action"] in {"promoted", "challenger"}
    assert (project / "reports" / "tiny" / "v1" / "decision.json").is_file()
    # A re-run (e.g. after a crash) with unchanged data and params registers nothing new
    # and does not gate the same version twice.
    again = retrain_flow(**args)
    assert not again["trained"] and again["version"] == "1" and again["gate"].get("reused")
    assert _versions("bandpilot-tiny") == ["1"]
    if out["gate"]["action"] == "promoted":
        assert registry.get_alias("bandpilot-tiny", "champion") == "1"


@pytest.mark.slow
def test_pipeline_flow_end_to_end_and_dispatch(harness, project):
    from bandpilot import queue as q
    from flows.pipeline import pipeline_flow, summary_lines

    from bandpilot import progress

    class Stages(progress.Reporter):  # what the CLI's line/bar reporter is fed
        def __init__(self):
            self.seen = []

        def finished(self, st, error):
            self.seen.append((st.depth, st.name, st.done, st.total, error is None))

    rec = Stages()
    with progress.use(rec):
        res = pipeline_flow(params_file="params/pipeline-tiny.yaml")
    names = [n for _, n, *_ in rec.seen]
    assert {"dataset tiny", "profile tiny", "dvc add data", "retrain tiny", "train tiny", "evaluate tiny",
            "dispatch tiny"} <= set(names), rec.seen
    assert all(ok for *_, ok in rec.seen)
    prof = next(s for s in rec.seen if s[1] == "profile tiny")
    assert prof[0] == 1 and prof[2] == prof[3] > 0  # inside "dataset tiny", every run counted
    tiny = res["clusters"]["tiny"]
    assert tiny["retrain"]["champion"] is not None, tiny["retrain"]
    batch = tiny["batch"]
    assert batch is not None and batch["outcomes"], batch
    assigned = [o for o in batch["outcomes"] if o["status"] == "assigned"]
    assert assigned
    with q.Store(tiny["store"]) as store:
        assert q.check_invariants(store) == []
        jobs = q.export_state(store)["jobs"]
    gpus = [g for j in jobs for g in j["gpus"]]
    assert len(gpus) == len(set(gpus))  # no GPU in two jobs
    text = "\n".join(summary_lines(res))
    assert "bandpilot-tiny" in text and "mlflow ui" in text
    # Second run: reuses data and model, some jobs finish and the queue moves on.
    res2 = pipeline_flow(params_file="params/pipeline-tiny.yaml")
    assert res2["clusters"]["tiny"]["retrain"]["trained"] is False
    assert res2["clusters"]["tiny"]["queue"]["released"]
    assert _versions("bandpilot-tiny") == ["1"]


@pytest.mark.slow
def test_dispatch_flow_without_champion_assigns_nothing(harness, project):
    from bandpilot import queue as q
    from bandpilot.topology.cluster import load_cluster
    from bandpilot.errors import ModelError
    from flows.dispatch import dispatch_flow, store_url_for

    url = store_url_for("tiny")
    with q.Store(url) as store:
        store.init_cluster(load_cluster(project / "params" / "clusters" / "tiny.yaml"))
        q.submit(store, [{"id": "r1", "k": 2}])
    with pytest.raises(ModelError):
        dispatch_flow(cluster="tiny")
    with q.Store(url) as store:
        assert q.export_state(store)["jobs"] == []


def test_missing_configuration_fails_at_flow_start(harness, project):
    from bandpilot.errors import SpecError
    from flows.pipeline import pipeline_flow

    bad = project / "params" / "bad.yaml"
    bad.write_text(yaml.safe_dump({"clusters": ["params/clusters/tiny.yaml"]}))
    with pytest.raises(SpecError, match="missing required keys"):
        pipeline_flow(params_file="params/bad.yaml")
    assert not (project / "data").exists()  # nothing started


def test_deployments_declare_schedules(project):
    from flows.serve import deployments

    deps = {d.name: d for d in deployments("params/pipeline-tiny.yaml")}
    assert set(deps) == {"ingest-tiny", "retrain-tiny", "dispatch-tiny", "verify-tiny"}
    assert deps["verify-tiny"].schedules and deps["verify-tiny"].parameters["cluster"] == "params/clusters/tiny.yaml"
    assert deps["retrain-tiny"].schedules and deps["dispatch-tiny"].schedules
    assert deps["retrain-tiny"].parameters["data_dir"].endswith("data/tiny")


@pytest.mark.slow
def test_evaluate_flow_same_on_threads_and_dask(harness, project):
    """Evaluation chunks as Prefect tasks: the Dask path (prefect-dask LocalCluster) and the
    default thread pool give the same merged result."""
    from bandpilot.model import registry
    from bandpilot.data.dataset import load_dataset
    from bandpilot.model.params import TrainParams
    from bandpilot.model.train import train
    from flows._common import task_runner
    from flows.evaluate import evaluate_flow
    from flows.ingest import ingest_flow

    ingest_flow(cluster="params/clusters/tiny.yaml", samples=60, track=False)
    registry.tracking_setup()
    res = train(load_dataset(project / "data" / "tiny"), TrainParams.load(project / "params" / "train-tiny.yaml"), plots=False)
    mv = registry.log_and_register(res)
    uri = f"models:/bandpilot-tiny/{mv.version}"
    args = dict(model_uri=uri, cluster="params/clusters/tiny.yaml", profiles=["idle", "heavy"], repeats=1, chunks=3)
    on_dask = evaluate_flow.with_options(task_runner=task_runner("dask"))(out_dir="reports/dask", **args)
    on_threads = evaluate_flow.with_options(task_runner=task_runner("thread"))(out_dir="reports/threads", log_mlflow=False, **args)
    assert on_dask["scenarios"] == on_threads["scenarios"] == 12
    assert on_dask["gbe"] == pytest.approx(on_threads["gbe"])
    assert (project / "reports" / "dask" / "report.md").is_file()


@pytest.mark.slow
def test_flows_cli_pipeline_help():
    out = subprocess.run([sys.executable, "-m", "bandpilot", "pipeline", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "profile" in out.stdout


def test_summary_has_where_to_look():
    from flows.pipeline import summary_lines

    lines = summary_lines({"dvc_md5": "abc.dir", "clusters": {}})
    assert any("mlflow ui" in line for line in lines)
    assert json.dumps(lines)


@pytest.mark.slow
def test_verify_flow_gates_a_fault_relearns_and_clears_after_repair(harness, project):
    """The verify loop: a slow host in the world (faults: in the spec) is found, drained, re-measured
    as a new dataset version and retrained; after the repair a re-verify returns the hardware."""
    from bandpilot import queue as q
    from flows.ingest import ingest_flow
    from flows.retrain import retrain_flow
    from flows.verify import verify_flow

    ingest_flow(cluster="params/clusters/tiny.yaml", samples=60, track=False)
    ev = {"profiles": ["idle"], "repeats": 1, "workers": 1}
    retrain_flow(data_dir="data/tiny", cluster_spec="params/clusters/tiny.yaml", params_file="params/train-tiny.yaml",
                 evaluate=ev)
    broken = dict(TINY_SPEC, faults=[{"kind": "slow_host", "host": "t-1", "factor": 0.6}])
    (project / "params" / "clusters" / "tiny-broken.yaml").write_text(yaml.safe_dump(broken))
    out = verify_flow(cluster="params/clusters/tiny-broken.yaml", model_uri="models:/bandpilot-tiny/1",
                      params_file="params/train-tiny.yaml", evaluate=ev, samples=60)
    assert not out["healthy"] and out["verdicts"]["t-1"]["status"] == "degraded"
    assert out["verdicts"]["t-1"]["links"] == ["t-1"] and len(out["gate"]["drained"]) == 4
    assert out["retrain"]["trained"] and out["retrain"]["version"] == "2"
    assert out["dvc_md5"]
    store = q.Store(f"sqlite:///{project / '.bandpilot' / 'queue-tiny.db'}")
    assert not any(g.startswith("t-1:") for g in q.export_state(store)["free"])

    fixed = verify_flow(cluster="params/clusters/tiny.yaml", model_uri="models:/bandpilot-tiny/1", relearn=False)
    assert fixed["healthy"] and len(fixed["gate"]["undrained"]) == 4
    assert sum(g.startswith("t-1:") for g in q.export_state(store)["free"]) == 4


@pytest.mark.slow
def test_simulate_sweep_flow_matches_the_thread_pool(harness, tmp_path):
    """The sweep's cells as Prefect tasks give the same comparison as `bandpilot simulate --sweep`."""
    from bandpilot.simulation.sweep import load_sweep, run_sweep
    from bandpilot.simulation.trace import write_trace
    from bandpilot.simulation.workloads import seed001_workload
    from flows.simulate import simulate_sweep_flow

    h100 = Path(__file__).resolve().parents[1] / "params" / "clusters" / "h100.yaml"
    write_trace(seed001_workload(4)[:8], tmp_path / "a.csv")
    y = tmp_path / "sweep.yaml"
    y.write_text(f"cluster: {h100}\nmodel: emulator\ntraces: [a.csv]\nprofiles: [fifo-greedy, slurm-like]\nseeds: [0]\n")
    res = simulate_sweep_flow(sweep=str(y), out_dir=str(tmp_path / "flow"), log_mlflow=False)
    assert res["cells"] == 2
    run_sweep(load_sweep(y), tmp_path / "pool", figures=False)
    assert (tmp_path / "flow" / "comparison.csv").read_text() == (tmp_path / "pool" / "comparison.csv").read_text()
    assert (tmp_path / "flow" / "jct_cdf-0-a.png").is_file()
