"""What a new user meets in the first hour: files the CLI writes are as readable as the umask says,
errors for missing inputs come before heavy imports, built-in cluster names work everywhere,
``--help`` creates nothing, and output in a pipe is not wrapped."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from bandpilot.cli.main import main

ROOT = Path(__file__).resolve().parents[1]
H100 = ROOT / "params" / "clusters" / "h100.yaml"


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


@pytest.fixture(params=[0o022, 0o077, 0o002])
def umask(request):
    old = os.umask(request.param)
    try:
        yield request.param
    finally:
        os.umask(old)


def test_files_the_cli_writes_honour_the_umask(tmp_path, umask, capsys):
    topo = tmp_path / "topo.conf"
    assert main(["cluster", "topology", "--cluster", str(H100), "--format", "slurm", "-o", str(topo)]) == 0
    trace = tmp_path / "t.csv"
    assert main(["workload", "seed001", "-o", str(trace)]) == 0
    out = tmp_path / "sim"
    assert main(["simulate", "--trace", str(trace), "--cluster", str(H100), "--model", "emulator", "--no-log",
                 "--no-figures", "-o", str(out)]) == 0
    capsys.readouterr()
    for f in (topo, trace, out / "summary.json", out / "jobs.csv"):
        assert _mode(f) == 0o666 & ~umask, (f, oct(_mode(f)))
    assert _mode(out) == 0o777 & ~umask
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no temporary left behind


def test_atomic_writers_keep_the_old_file_on_failure(tmp_path):
    from bandpilot.io import write_json_atomic, write_text_atomic

    p = write_text_atomic(tmp_path / "a.txt", "old\n")
    with pytest.raises(TypeError):
        write_json_atomic(p, {"x": object()})
    assert p.read_text() == "old\n" and [q.name for q in tmp_path.iterdir()] == ["a.txt"]


def _clean_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLFLOW_", "BANDPILOT_", "PREFECT_", "DVC_", "XDG_"))}
    env.update(HOME=str(home), OMP_NUM_THREADS="1")
    return env


@pytest.mark.parametrize("args", [["--help"], [], ["select", "--help"], ["queue", "submit", "--help"]])
def test_help_outside_a_checkout_creates_nothing(tmp_path, args):
    home, cwd = tmp_path / "home", tmp_path / "cwd"
    home.mkdir()
    cwd.mkdir()
    r = subprocess.run([sys.executable, "-m", "bandpilot", *args], env=_clean_env(home), cwd=cwd,
                       capture_output=True, text=True, timeout=300)
    assert "Usage: bandpilot" in r.stdout + r.stderr, r.stderr[-2000:]
    assert [p for p in tmp_path.rglob("*") if p not in (home, cwd)] == []


def test_every_command_accepts_a_built_in_cluster_name(tmp_path, capsys):
    free = [f"h100-{h}:{g}" for h in range(4) for g in range(8)]
    state = tmp_path / "s.json"
    state.write_text(json.dumps({"free": free, "jobs": []}))
    assert main(["select", "4", "--state", str(state), "--cluster", "h100", "--json"]) == 0
    assert len(json.loads(capsys.readouterr().out)["gpus"]) == 4
    assert main(["cluster", "topology", "--cluster", "h100"]) == 0
    assert "cluster h100" in capsys.readouterr().out
    assert main(["select", "4", "--state", str(state), "--cluster", "nope"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cluster spec not found: nope") and err.count("\n") == 1


def test_select_output_in_a_pipe_is_not_wrapped(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("COLUMNS", raising=False)
    free = [f"h100-{h}:{g}" for h in range(4) for g in range(8)]
    state = tmp_path / "s.json"
    state.write_text(json.dumps({"free": free, "jobs": []}))
    assert main(["select", "16", "--state", str(state), "--cluster", "h100", "--shape", "tp=8,dp=2"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].startswith("shape k=16:") and lines[0].endswith("evaluations"), lines
    ranks = [ln for ln in lines if ln.strip().startswith("ranks:")]
    assert len(ranks) == 1 and len(ranks[0].split()) == 17 and max(map(len, lines)) > 80, lines


def test_topology_summary_names_the_hosts_of_a_cluster_without_domains(capsys):
    assert main(["cluster", "topology", "--cluster", "h100"]) == 0
    out = capsys.readouterr().out
    assert "(none)" not in out and "no NVLink or rack domains" in out
    assert "h100-[0-3]\tH100\t4 hosts\t32 GPUs" in out.splitlines()
    assert main(["cluster", "topology", "--cluster", "nvl72x16"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0].endswith("16 NVLink domains") and lines[1] == "gb200-nvl0\tnvlink\t18 hosts\t72 GPUs"


# -- the first answer comes before the heavy imports ----------------------------------------------
HEAVY = ("torch", "mlflow", "lightning", "pandas", "sqlalchemy", "prefect")
_PROBE = ("import sys, json; from bandpilot.cli.main import main; rc = main(sys.argv[1:]); "
          "print('@@' + json.dumps([rc, sorted(m for m in {heavy!r} if m in sys.modules)]))").format(heavy=HEAVY)


def _probe(args: list[str], env: dict[str, str], cwd: Path) -> tuple[int, list[str], str]:
    """Run the CLI in a fresh interpreter; its exit code, the heavy libraries it imported, stderr."""
    r = subprocess.run([sys.executable, "-c", _PROBE, *map(str, args)], env=env, cwd=cwd, capture_output=True,
                       text=True, timeout=300)
    rc, heavy = json.loads(r.stdout.rsplit("@@", 1)[1])
    return rc, heavy, r.stderr


@pytest.fixture(scope="module")
def registered(tmp_path_factory):
    """A project home whose SQLite registry holds bandpilot-h100 version 1 as champion."""
    home = tmp_path_factory.mktemp("home")
    code = """
import sys
from bandpilot.data.synthetic import fabric_dataset
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.model import registry
from bandpilot.model.crossval import fit
from bandpilot.topology.cluster import load_cluster
registry.tracking_setup()
res = fit(fabric_dataset(EmulatorFabric(load_cluster(sys.argv[1])), n_cross=60, seed=3),
          {"epochs": 1, "hidden": 8, "heads": 2, "threads": 1, "folds": 2, "replay_size": 8}, plots=False)
registry.log_and_register(res, alias="champion")
"""
    env = _clean_env(home) | {"BANDPILOT_HOME": str(home)}
    r = subprocess.run([sys.executable, "-c", code, str(H100)], env=env, cwd=home, capture_output=True, text=True,
                       timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    return home, env


@pytest.mark.slow
def test_missing_inputs_are_reported_before_heavy_imports(registered, tmp_path):
    home, env = registered
    state = tmp_path / "s.json"
    state.write_text(json.dumps({"free": [f"h100-{h}:{g}" for h in range(4) for g in range(8)], "jobs": []}))
    model = "models:/bandpilot-h100@champion"
    cases = [
        (["select", "4", "--state", tmp_path / "nope.json", "--model", model], "state file not found"),
        (["select", "4", "--state", state, "--model", "models:/bandpilot-h100@nope"], "has no alias 'nope'"),
        (["select", "4", "--state", state, "--model", "models:/nobody@champion"], "no registered model 'nobody'"),
        (["select", "4", "--state", state, "--model", "models:/bandpilot-h100/9"], "has no version '9'"),
        (["select", "4", "--state", state, "--model", tmp_path / "no-model"], "model not found"),
        (["simulate", "--trace", tmp_path / "nope.csv", "--model", model, "-o", tmp_path / "o"], "trace file not found"),
        (["dispatch", "--store", tmp_path / "nope.db", "--model", model], "no queue store at"),
    ]
    for args, msg in cases:
        rc, heavy, err = _probe(args, env, home)
        assert rc == 2 and msg in err and err.count("\n") == 1, (args, err)
        assert [m for m in heavy if m != "sqlalchemy" or args[0] != "dispatch"] == [], (args, heavy)
    rc, heavy, err = _probe(["select", "4", "--state", state, "--model", model, "--json"], env, home)
    assert rc == 0 and heavy == ["torch"], (heavy, err)  # the model needs torch, and nothing else heavy


@pytest.mark.slow
def test_registry_lookup_agrees_with_mlflow(registered):
    home, env = registered
    code = """
import sys, json
from bandpilot.model.local_registry import lookup
from bandpilot.errors import ModelError
def fast(u):
    try:
        r = lookup(u)
        return None if r is None else [str(r[0]), r[1], r[2]]
    except ModelError as e:
        return str(e)
uris = sys.argv[1:]
got = [fast(u) for u in uris]
assert "mlflow" not in sys.modules
from bandpilot.model.artifacts import fetch_model_dir
def slow(u):
    try:
        r = fetch_model_dir(u)
        return [str(r[0]), r[1], r[2]]
    except ModelError as e:
        return str(e)
print("@@" + json.dumps([got, [slow(u) for u in uris]]))
"""
    uris = ["models:/bandpilot-h100@champion", "models:/bandpilot-h100/1", "models:/bandpilot-h100@nope",
            "models:/bandpilot-h100/2", "models:/nobody@champion"]
    r = subprocess.run([sys.executable, "-c", code, *uris], env=env, cwd=home, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    fast, slow = json.loads(r.stdout.rsplit("@@", 1)[1])
    assert fast == slow and fast[0][2] == "1" and Path(fast[0][0]).is_dir(), (fast, slow)


# -- make test installs nothing system-wide without saying so, and can be told not to -----------
def _make_browser(tmp_path: Path, *args: str, **env: str) -> tuple[str, str]:
    log = tmp_path / "apt.log"
    fake = tmp_path / "fake-apt-get"
    fake.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    fake.chmod(0o755)
    r = subprocess.run(["make", "-s", "browser", "CHROMIUM=bandpilot-no-such-chromium", f"APT_GET={fake}", *args],
                       cwd=ROOT, env={**os.environ, **env}, capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    return r.stdout, log.read_text() if log.exists() else ""


def test_make_says_what_it_installs_before_installing(tmp_path):
    out, apt = _make_browser(tmp_path)
    first = out.splitlines()[0]
    assert first.startswith("browser: installing Debian's chromium and chromium-driver") and "APT=no" in first
    assert "install -y -q --no-install-recommends chromium chromium-driver" in apt


@pytest.mark.parametrize("how", [("APT=no",), ()])
def test_make_can_be_told_not_to_install(tmp_path, how):
    out, apt = _make_browser(tmp_path, *how, **({} if how else {"BANDPILOT_NO_APT": "1"}))
    assert apt == "" and "installing" not in out and "the dashboard test will skip" in out


def test_pytest_prints_skip_reasons():
    import tomllib

    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    assert "-rs" in cfg["addopts"].split()
    test_lines = [ln for ln in (ROOT / "Makefile").read_text().splitlines() if "-m pytest" in ln]
    assert test_lines and all(" -rs " in ln for ln in test_lines)


# -- training says nothing about Slurm on a machine that has it -----------------------------------
@pytest.mark.skipif(shutil.which("srun") is None, reason="Slurm's srun is not installed: Lightning has nothing to warn about")
def test_training_on_a_slurm_machine_does_not_warn_about_srun(monkeypatch):
    import warnings

    from bandpilot.data.synthetic import fabric_dataset
    from bandpilot.fabric.emulator import EmulatorFabric
    from bandpilot.model.crossval import fit
    from bandpilot.topology.cluster import load_cluster

    for k in [k for k in os.environ if k.startswith("SLURM_")]:
        monkeypatch.delenv(k)  # not a job step, as in `make run`
    ds = fabric_dataset(EmulatorFabric(load_cluster(H100)), n_cross=40, seed=1)
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        fit(ds, {"epochs": 1, "hidden": 8, "heads": 2, "threads": 1, "folds": 2, "replay_size": 8}, plots=False)
    assert not [w for w in seen if "srun" in str(w.message)]


# -- dvc metrics show: one narrow row per cluster, named for what it measures ---------------------
def test_train_metrics_say_cross_validated_and_list_one_row_per_cluster(tmp_path):
    from bandpilot.data.synthetic import fabric_dataset
    from bandpilot.fabric.emulator import EmulatorFabric
    from bandpilot.model.crossval import fit
    from bandpilot.topology.cluster import load_cluster
    from flows.stages import train_metrics, write_metrics

    ds = fabric_dataset(EmulatorFabric(load_cluster(H100)), n_cross=80, seed=2)
    tiny = {"epochs": 1, "hidden": 8, "heads": 2, "threads": 1, "folds": 2, "replay_size": 8}
    for name, extra in (("cv-only", {}), ("held", {"holdout": 0.25})):
        res = fit(ds, {**tiny, **extra}, plots=False)
        res.surrogate.save(tmp_path / "models" / name / "model")
        (tmp_path / "models" / name / "registered.json").write_text('{"version": "1"}')
    (tmp_path / "metrics").mkdir()
    (tmp_path / "metrics" / "train.json").write_text("{}")  # an earlier run's layout
    write_metrics(tmp_path, "train", {c: train_metrics(tmp_path, c) for c in ("cv-only", "held")})
    assert not (tmp_path / "metrics" / "train.json").exists()

    subprocess.run(["git", "init", "-q"], cwd=tmp_path, check=True)
    dvc = [sys.executable, "-m", "dvc"]
    env = {**os.environ, "DVC_NO_ANALYTICS": "1", "DVC_SITE_CACHE_DIR": str(tmp_path / ".dvc-site")}
    subprocess.run([*dvc, "init", "-q"], cwd=tmp_path, env=env, check=True)
    (tmp_path / "dvc.yaml").write_text((ROOT / "dvc.yaml").read_text())
    shown = subprocess.run([*dvc, "metrics", "show", "--json"], cwd=tmp_path, env=env, capture_output=True, text=True)
    rows = {Path(f).stem: v["data"] for f, v in json.loads(shown.stdout)[""]["data"].items() if "data" in v}
    cv, held = rows["cv-only"], rows["held"]
    assert set(cv) == {"version", "cv", "train_seconds"}, cv  # no "test" that is the CV again
    assert cv["cv"]["n"] == 80 and cv["cv"]["folds"] == 2 and set(cv["cv"]) >= {"mape", "r2"}
    assert 0 < held["test"]["n"] < 80 and held["cv"]["n"] == 80 - held["test"]["n"]
    table = subprocess.run([*dvc, "metrics", "show"], cwd=tmp_path, env=env, capture_output=True, text=True).stdout
    lines = [ln for ln in table.splitlines() if ln.startswith(("Path", "metrics/train/"))]
    assert len(lines) == 3 and max(map(len, lines)) < 200, table
