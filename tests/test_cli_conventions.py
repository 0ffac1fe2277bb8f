"""Issue 15 (slice): usage errors exit 2 with click's message; the MLflow registry follows the tracking URI."""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from bandpilot.scheduling.profile import SchedulerProfile

ROOT = Path(__file__).resolve().parents[1]


def _run(args, env, cwd):
    return subprocess.run([sys.executable, "-m", "bandpilot", *args], env=env, cwd=cwd, capture_output=True,
                          text=True, timeout=600)


def _env(home: Path, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "BANDPILOT_"))}
    env.update(BANDPILOT_HOME=str(home), OMP_NUM_THREADS="1", **extra)
    return env


@pytest.mark.parametrize("args, what", [
    (["verifyy"], "No such command 'verifyy'"),
    (["train", "--bogus"], "No such option: --bogus"),
    (["select", "abc", "--state", "s.json"], "Invalid value for 'k'"),
])
@pytest.mark.slow
def test_usage_errors_exit_2_with_clicks_message(tmp_path, args, what):
    r = _run(args, _env(tmp_path), tmp_path)
    assert r.returncode == 2, r.stderr[-2000:]
    assert what in r.stderr and "Usage: " in r.stderr and "bandpilot" in r.stderr and "Traceback" not in r.stderr


@pytest.fixture(scope="module")
def tiny_dataset(tmp_path_factory):
    from bandpilot.data.dataset import save_dataset
    from bandpilot.data.synthetic import fabric_dataset
    from bandpilot.fabric.emulator import EmulatorFabric
    from bandpilot.topology.cluster import load_cluster

    d = tmp_path_factory.mktemp("ds") / "het"
    save_dataset(fabric_dataset(EmulatorFabric(load_cluster(ROOT / "params/clusters/het4mix.yaml")), n_cross=60, seed=2), d)
    p = d.parent / "train.yaml"
    p.write_text("train:\n  epochs: 3\n  hidden: 16\n  heads: 2\n  folds: 2\n  threads: 1\n  replay_size: 8\n")
    return d, p


def _models(db: Path) -> list[str]:
    with sqlite3.connect(db) as c:
        return [r[0] for r in c.execute("select name from registered_models")]


@pytest.mark.slow
def test_registry_follows_the_tracking_uri(tmp_path, tiny_dataset):
    ds, params = tiny_dataset
    home = tmp_path / "home"
    home.mkdir()
    server = tmp_path / "server.db"
    r = _run(["train", "--data", str(ds), "--params", str(params)],
             _env(home, MLFLOW_TRACKING_URI=f"sqlite:///{server}"), home)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _models(server) == ["bandpilot-het4mix"]  # runs and registry in the same store
    assert not (home / "mlruns").exists()  # no split registry in the project


@pytest.mark.slow
def test_local_default_only_when_neither_uri_is_set(tmp_path, tiny_dataset):
    ds, params = tiny_dataset
    home = tmp_path / "home"
    home.mkdir()
    r = _run(["train", "--data", str(ds), "--params", str(params)], _env(home), home)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _models(home / "mlruns" / "mlflow.db") == ["bandpilot-het4mix"]
    reg = tmp_path / "registry.db"
    r = _run(["train", "--data", str(ds), "--params", str(params)],
             _env(home, MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path / 't.db'}", MLFLOW_REGISTRY_URI=f"sqlite:///{reg}"), home)
    assert r.returncode == 0, r.stderr[-3000:]
    assert _models(reg) == ["bandpilot-het4mix"]  # an explicit registry URI wins


@pytest.mark.slow
def test_queue_show_renders_launcher_input(tmp_path, capsys):
    import json as _json

    from bandpilot import queue as q
    from bandpilot import scheduling as sched
    from bandpilot.cli.main import main
    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.fabric.emulator import EmulatorFabric
    from bandpilot.topology.cluster import load_cluster

    spec = load_cluster(ROOT / "params/clusters/h100.yaml")
    url = f"sqlite:///{tmp_path / 'q.db'}"
    store = q.Store(url)
    store.init_cluster(spec)
    q.submit(store, [{"id": "big", "k": 12, "tenant": "t"}, {"id": "wait", "k": 32, "tenant": "t"}])
    sched.run_batch(store, Dispatcher(EmulatorFabric(spec)), SchedulerProfile("test"))
    a = q.assignment(store, "big")
    assert sum(len(v) for v in a["hosts"].values()) == 12 and len(a["hosts"]) >= 2
    capsys.readouterr()
    assert main(["queue", "show", "big", "--format", "hostfile", "--store", url]) == 0
    lines = capsys.readouterr().out.split("\n")
    assert [ln for ln in lines if ln] == [f"{h} slots={len(v)}" for h, v in a["hosts"].items()]
    assert main(["queue", "show", "big", "--format", "slurm", "--store", url]) == 0
    out = capsys.readouterr().out
    assert out.startswith("#!/bin/bash\n") and "SLURM_TASK_PROLOG" in out
    for h, v in a["hosts"].items():
        assert f"--nodelist={h}" in out or f",{h}" in out.split("\n")[1]
        assert f"#   {h}: GPUs {','.join(map(str, v))} (rank order)" in out
    assert main(["queue", "show", "big", "--format", "k8s", "--store", url]) == 0
    doc = _json.loads(capsys.readouterr().out)
    assert doc["metadata"]["annotations"]["bandpilot.io/job"] == "big"
    assert "advisory" in doc["metadata"]["annotations"]["bandpilot.io/advisory"]
    assert main(["queue", "show", "big", "--format", "env", "--store", url]) == 0
    assert "BANDPILOT_NGPUS=12" in capsys.readouterr().out
    for args, msg in ((["wait"], "has no GPUs"), (["nope"], "no request"), (["big", "--format", "pbs"], "unknown format")):
        assert main(["queue", "show", *args, "--store", url]) == 2
        err = capsys.readouterr().err
        assert err.startswith("error:") and msg in err and err.count("\n") == 1


@pytest.mark.slow
def test_no_op_batch_skips_the_model_and_torch(tmp_path):
    from bandpilot import queue as q
    from bandpilot.topology.cluster import load_cluster

    url = f"sqlite:///{tmp_path / 'q.db'}"
    store = q.Store(url)
    store.init_cluster(load_cluster(ROOT / "params/clusters/h100.yaml"))
    code = ("import sys, time; from bandpilot.cli.main import main; t = time.perf_counter(); "
            f"rc = main(['dispatch', '--batch', '--store', '{url}', '--model', 'models:/nowhere@champion']); "
            "print(rc, 'torch' in sys.modules, 'mlflow' in sys.modules, round(time.perf_counter() - t, 3))")
    env = _env(tmp_path)
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    rc, torch_loaded, mlflow_loaded, _ = r.stdout.split()[-4:]
    assert (rc, torch_loaded, mlflow_loaded) == ("0", "False", "False"), r.stdout + r.stderr
    assert "no batch: nothing pending" in r.stdout
    q.submit(store, [{"id": "huge", "k": 30, "tenant": "t"}])
    q.drain(store, "h100-0")
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.stdout.split()[-4:-1] == ["0", "False", "False"] and "smallest needs 30 GPUs, 24 free" in r.stdout
    q.undrain(store, "h100-0")  # now it fits: the model is needed, and the bad URI is a clear error
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert r.stdout.split()[-4] == "2" and "nowhere" in r.stderr


def test_project_home_is_never_just_the_current_directory(tmp_path, monkeypatch):
    from bandpilot.config import project_root

    monkeypatch.setenv("BANDPILOT_HOME", str(tmp_path / "home"))
    assert project_root() == (tmp_path / "home").resolve()
    monkeypatch.delenv("BANDPILOT_HOME")
    monkeypatch.chdir(ROOT / "bandpilot" / "model")  # inside the checkout: its root
    assert project_root() == ROOT.resolve()
    monkeypatch.setenv("XDG_DATA_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)  # anywhere else: the per-user data directory
    assert project_root() == (tmp_path / "xdg" / "bandpilot").resolve()


@pytest.mark.slow
@pytest.mark.parametrize("args", [["queue", "status"], ["queue", "list"], ["queue", "show", "r1"], ["tokens", "list"]])
def test_queue_views_never_import_torch_or_mlflow(tmp_path, args):
    from bandpilot import queue as q
    from bandpilot.topology.cluster import load_cluster

    url = f"sqlite:///{tmp_path / 'q.db'}"
    store = q.Store(url)
    store.init_cluster(load_cluster(ROOT / "params/clusters/h100.yaml"))
    q.submit(store, [{"id": "r1", "k": 2, "tenant": "t"}])
    code = ("import sys; from bandpilot.cli.main import main; "
            f"rc = main({args + ['--store', url]!r}); "
            "print('@@', rc, 'torch' in sys.modules, 'mlflow' in sys.modules)")
    r = subprocess.run([sys.executable, "-c", code], env=_env(tmp_path), capture_output=True, text=True, timeout=120)
    tail = r.stdout.rsplit("@@", 1)[-1].split()
    assert tail[1:] == ["False", "False"], r.stdout + r.stderr
