"""The README's main command on a fresh clone (slow: the real main job, a few minutes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("e2e")]


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLFLOW_", "PREFECT_", "DVC_", "BANDPILOT_"))}
    env["BANDPILOT_HOME"] = str(home)
    return env


def test_main_job_on_fresh_clone(tmp_path):
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(ROOT), str(clone)], check=True)
    for k, v in (("user.email", "ci@example.invalid"), ("user.name", "ci")):
        subprocess.run(["git", "-C", str(clone), "config", k, v], check=True)
    env = _clean_env(clone)
    run = subprocess.run([sys.executable, "-m", "bandpilot", "pipeline"], cwd=clone, env=env,
                         capture_output=True, text=True, timeout=1500)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = run.stdout
    for name in ("h100", "het4mix"):
        assert f"== {name}:" in out, out
        assert list((clone / "reports" / name).glob("v*/decision.json")), out
        assert (clone / "data" / name / "measurements.parquet").is_file()
    assert "champion: vNone" not in out, out
    assert "dispatch batch #" in out
    assert (clone / "data.dvc").is_file() and (clone / "mlruns" / "mlflow.db").is_file()
    # Nothing generated is left for git to pick up: data, mlruns, reports and stores are ignored.
    status = subprocess.run(["git", "-C", str(clone), "status", "--porcelain", "--untracked-files=all"],
                            capture_output=True, text=True, check=True).stdout.splitlines()
    # dvc.lock and metrics/ are what a run leaves to commit beside data.dvc (dvc_git: commit does it).
    assert all(line[3:].startswith(("data.dvc", ".dvc/", ".dvcignore", "metrics/", "dvc.lock")) for line in status), status

    # A second run reuses what is unchanged: no new measurements, no new model versions.
    again = subprocess.run([sys.executable, "-m", "bandpilot", "pipeline"], cwd=clone, env=env,
                           capture_output=True, text=True, timeout=1500)
    assert again.returncode == 0, again.stdout[-3000:] + again.stderr[-3000:]
    assert "(reused)" in again.stdout and "(trained)" not in again.stdout, again.stdout

    # The DVC pipeline is the one the main job ran: clean status, nothing to repro, metrics, params.
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    dvc = [sys.executable, "-m", "dvc"]
    status = subprocess.run([*dvc, "status"], cwd=clone, env=env, capture_output=True, text=True)
    assert status.returncode == 0 and "up to date" in status.stdout.lower(), status.stdout
    repro = subprocess.run([*dvc, "repro"], cwd=clone, env=env, capture_output=True, text=True, timeout=1500)
    assert repro.returncode == 0 and "bandpilot stage" not in repro.stdout, repro.stdout[-3000:] + repro.stderr[-3000:]
    for stage in ("train", "evaluate"):  # one metrics file per cluster: `dvc metrics show` prints a row each
        got = {f.stem: json.loads(f.read_text()) for f in (clone / "metrics" / stage).glob("*.json")}
        assert set(got) == {"h100", "het4mix"} and all(got.values()), got
    shown = subprocess.run([*dvc, "metrics", "show"], cwd=clone, env=env, capture_output=True, text=True)
    assert shown.returncode == 0 and "gbe_idle" in shown.stdout, shown.stdout + shown.stderr
    diff = subprocess.run([*dvc, "params", "diff"], cwd=clone, env=env, capture_output=True, text=True)
    assert diff.returncode == 0, diff.stderr
