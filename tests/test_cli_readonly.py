"""Issue 26 item 4 (+ the store parts of item 9): read-only commands never create stores; they say
what to run instead (one line, exit 2). Plain paths are store URLs too; MLflow stays quiet."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from bandpilot.cli.main import main

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("args", [
    ["queue", "status"], ["queue", "list"], ["queue", "show", "j1"], ["cluster", "state"],
    ["cluster", "fragmentation"], ["cluster", "topology"], ["cluster", "health"], ["tokens", "list"],
    ["dispatch"], ["queue", "cancel", "r1"], ["queue", "submit", "-k", "1"],
])
def test_commands_on_a_missing_store_create_nothing(tmp_path, capsys, args):
    db = tmp_path / "sub" / "doesnotexist.db"
    assert main([*args, "--store", f"sqlite:///{db}"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and str(db) in err[0] and "bandpilot cluster init" in err[0], err
    assert not db.exists() and not db.parent.exists()


def test_init_creates_and_read_only_commands_then_work(tmp_path, capsys):
    db = tmp_path / "q.db"
    assert main(["cluster", "init", "--cluster", "h100", "--store", str(db)]) == 0  # a plain path is a store
    assert db.is_file()
    assert main(["queue", "status", "--store", str(db)]) == 0
    assert main(["queue", "status", "--store", f"sqlite:///{db}"]) == 0
    assert "cluster h100" in capsys.readouterr().out


def test_an_empty_database_file_is_not_silently_turned_into_a_store(tmp_path, capsys):
    db = tmp_path / "other.db"
    db.write_bytes(b"")
    assert main(["queue", "status", "--store", f"sqlite:///{db}"]) == 2
    assert "bandpilot cluster init" in capsys.readouterr().err
    import sqlite3

    with sqlite3.connect(db) as c:  # no BandPilot tables written into someone else's file
        assert c.execute("select count(*) from sqlite_master").fetchone()[0] == 0


def test_a_bad_store_url_hints_at_the_forms(capsys):
    assert main(["queue", "status", "--store", "nosuchdb://x"]) == 2
    err = capsys.readouterr().err
    assert "sqlite:///" in err and "postgresql://" in err


@pytest.mark.slow
def test_relative_hint_from_another_directory_creates_nothing(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BANDPILOT_", "MLFLOW_"))}
    env.update(BANDPILOT_HOME=str(tmp_path / "home"), OMP_NUM_THREADS="1")
    r = subprocess.run([sys.executable, "-m", "bandpilot", "queue", "status", "--store", "sqlite:///.bandpilot/queue-h100.db"],
                       cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2 and "Traceback" not in r.stderr
    assert str(tmp_path / ".bandpilot" / "queue-h100.db") in r.stderr  # says where it looked, absolutely
    assert not (tmp_path / ".bandpilot").exists()


@pytest.mark.slow
def test_select_without_a_registry_is_quiet_and_creates_no_mlflow_db(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BANDPILOT_", "MLFLOW_"))}
    env.update(HOME=str(tmp_path / "user"), XDG_DATA_HOME="", OMP_NUM_THREADS="1")
    state = tmp_path / "state.json"
    state.write_text('{"free": ["h100-0:0", "h100-0:1"], "jobs": []}')
    r = subprocess.run([sys.executable, "-m", "bandpilot", "select", "2", "--state", str(state), "--model",
                        "models:/bandpilot-h100@champion"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 2, r.stderr
    lines = r.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ") and "INFO" not in r.stderr, r.stderr
    assert "mlflow.db" in lines[0] and ("make run" in lines[0] or "bandpilot train" in lines[0])
    assert not list((tmp_path / "user").rglob("mlflow.db"))
