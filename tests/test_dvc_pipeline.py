"""Issue 26 item 5: dvc.yaml and the main job describe one pipeline. After ``bandpilot pipeline``
(the flow), real DVC in a temp git repo says the stages are up to date, ``dvc metrics show`` reads
the metrics the run wrote, ``dvc repro`` has nothing to do, and a params change makes exactly the
stages that depend on it stale."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from test_flows import TINY_SPEC, TINY_TRAIN, harness  # noqa: F401 - pytest fixtures

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture
def dvc_project(tmp_path, monkeypatch, mlflow_uri):
    """A project with the shipped dvc.yaml and the code its stages depend on, on the tiny cluster."""
    root = tmp_path / "proj"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "params", root / "params")
    for d in ("bandpilot", "flows"):
        shutil.copytree(ROOT / d, root / d, ignore=ignore)
    shutil.copy(ROOT / "dvc.yaml", root / "dvc.yaml")
    (root / "params" / "clusters" / "tiny.yaml").write_text(yaml.safe_dump(TINY_SPEC))
    (root / "params" / "train.yaml").write_text(yaml.safe_dump(TINY_TRAIN))
    P = yaml.safe_load((ROOT / "params" / "pipeline.yaml").read_text())
    P.update({"clusters": ["params/clusters/tiny.yaml"], "profile": {"samples": 80, "seed": 0, "runner": "emulator"},
              "sweep": {"n_trials": 0}, "evaluate": {"profiles": ["idle", "heavy"], "repeats": 1, "seed": 0, "workers": 1},
              "dispatch": {"policy": "utility", "demo_requests": 8, "store": None}})
    (root / "params" / "pipeline.yaml").write_text(yaml.safe_dump(P))
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    shutil.copy(ROOT / ".gitignore", root / ".gitignore")
    monkeypatch.setenv("BANDPILOT_HOME", str(root))
    monkeypatch.chdir(root)
    return root


def _dvc(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([sys.executable, "-m", "dvc", *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=600)


@pytest.mark.slow  # trains, gates and dispatches a (tiny) cluster end to end
def test_dvc_status_is_clean_after_the_pipeline(harness, dvc_project):
    from flows.pipeline import pipeline_flow

    res = pipeline_flow(params_file="params/pipeline.yaml")
    version = res["clusters"]["tiny"]["retrain"]["version"]
    reg = json.loads((dvc_project / "models" / "tiny" / "registered.json").read_text())
    assert reg == {"name": "bandpilot-tiny", "version": str(version), "uri": f"models:/bandpilot-tiny/{version}"}
    assert (dvc_project / "models" / "tiny" / "model").is_dir() and (dvc_project / "dvc.lock").is_file()

    status = _dvc(dvc_project, "status")
    assert status.returncode == 0 and "up to date" in status.stdout.lower(), status.stdout + status.stderr
    shown = _dvc(dvc_project, "metrics", "show", "--json")
    assert shown.returncode == 0, shown.stderr
    metrics = {str(Path(f).parent.name): v["data"] for f, v in json.loads(shown.stdout)[""]["data"].items()}
    assert metrics["train"]["version"] == int(version) and "mape" in metrics["train"]["cv"]
    ev = metrics["evaluate"]
    assert 0 < ev["gbe_idle"] <= 1 and 0 < ev["gbe_heavy"] <= 1 and ev["version"] == int(version)
    dry = _dvc(dvc_project, "repro", "--dry")
    assert dry.returncode == 0 and "bandpilot stage" not in dry.stdout, dry.stdout  # nothing to re-run
    # generated data stays out of git: models/ is ignored, the lock and the metrics are what to commit
    porcelain = subprocess.run(["git", "-C", str(dvc_project), "status", "--porcelain", "--untracked-files=all"],
                               capture_output=True, text=True, check=True).stdout
    assert "models/" not in porcelain and "dvc.lock" in porcelain and "metrics/train/tiny.json" in porcelain

    # a second run reuses the model and leaves DVC clean
    pipeline_flow(params_file="params/pipeline.yaml")
    assert "up to date" in _dvc(dvc_project, "status").stdout.lower()

    # an evaluation setting changes: evaluate is stale; a training one: train
    P = yaml.safe_load((dvc_project / "params" / "pipeline.yaml").read_text())
    P["evaluate"]["repeats"] = 2
    (dvc_project / "params" / "pipeline.yaml").write_text(yaml.safe_dump(P))
    stale = _dvc(dvc_project, "status", "--json")
    assert set(json.loads(stale.stdout)) == {"evaluate"}, stale.stdout
    # dvc repro runs the stage's own command (`bandpilot stage evaluate`): the same code as the flow
    repro = _dvc(dvc_project, "repro", "evaluate")
    assert repro.returncode == 0 and "bandpilot stage evaluate" in repro.stdout, repro.stdout[-3000:] + repro.stderr[-3000:]
    assert "up to date" in _dvc(dvc_project, "status").stdout.lower()
    assert json.loads((dvc_project / "metrics" / "evaluate" / "tiny.json").read_text())["version"] == int(version)
    T = yaml.safe_load((dvc_project / "params" / "train.yaml").read_text())
    T["train"]["epochs"] = 26
    (dvc_project / "params" / "train.yaml").write_text(yaml.safe_dump(T))
    assert set(json.loads(_dvc(dvc_project, "status", "--json").stdout)) == {"train"}  # evaluate follows on repro


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(root), *args], check=True, capture_output=True, text=True).stdout


@pytest.mark.slow
@pytest.mark.parametrize("git", ["leave", "commit"])
def test_recorded_stages_are_clean_and_only_the_lock_and_metrics_reach_git(tmp_path, git):
    """commit_stages on a stage whose outputs were written outside ``dvc repro`` (as the flow does)."""
    from bandpilot.data import dvc

    root = tmp_path / "repo"
    root.mkdir()
    _git(root, "init", "-q")
    _git(root, "config", "user.email", "ci@example.invalid")
    _git(root, "config", "user.name", "ci")
    (root / ".gitignore").write_text("/data/\n/models/\n")
    (root / "data").mkdir()
    (root / "data" / "m.csv").write_text("k,gbps\n2,100\n")
    (root / "params.yaml").write_text("train:\n  epochs: 3\n")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train": {
        "cmd": "mkdir -p models metrics && cp data/m.csv models/ && echo '{\"mape\": 1.5}' > metrics/train.json",
        "deps": ["data"], "params": ["train"], "outs": ["models"],
        "metrics": [{"metrics/train.json": {"cache": False}}]}}}))
    dvc.track(root / "data", root, git="stage")
    _git(root, "add", "-A")
    _git(root, "commit", "-qm", "project")
    (root / "models").mkdir()  # what the flow writes, without dvc repro
    (root / "models" / "m.csv").write_text("k,gbps\n2,100\n")
    (root / "metrics").mkdir()
    (root / "metrics" / "train.json").write_text('{"mape": 1.5}\n')
    assert "train" in _dvc(root, "status", "--json").stdout  # never recorded: stale

    dvc.commit_stages(root, ["train"], git=git)
    status = _dvc(root, "status")
    assert status.returncode == 0 and "up to date" in status.stdout.lower(), status.stdout + status.stderr
    assert json.loads(_dvc(root, "metrics", "show", "--json").stdout)[""]["data"]["metrics/train.json"]["data"] == {"mape": 1.5}
    porcelain = _git(root, "status", "--porcelain", "--untracked-files=all")
    if git == "leave":  # the working tree has the lock and the metrics, the index is untouched
        assert _git(root, "diff", "--cached", "--name-only") == ""
        assert "dvc.lock" in porcelain and "metrics/train.json" in porcelain
    else:
        assert porcelain == "", porcelain
        assert set(_git(root, "show", "--name-only", "--format=", "HEAD").split()) == {"dvc.lock", "metrics/train.json"}
    assert "models" not in porcelain and ".gitignore" not in porcelain
    (root / "params.yaml").write_text("train:\n  epochs: 4\n")
    assert set(json.loads(_dvc(root, "status", "--json").stdout)) == {"train"}
