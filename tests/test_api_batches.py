"""Issue 26 item 7: the API process assigns what it accepts (its own batch loop with the champion),
says why it cannot when there is no model, and a 422 lists every problem of a body."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from bandpilot import queue as q
from bandpilot.api import create_app

from test_queue import h100, new_store  # pytest puts tests/ on sys.path
from tiny_model import make_project, register_champion


@pytest.fixture(scope="module")
def champion(tmp_path_factory):
    home = make_project(tmp_path_factory.mktemp("proj"))
    return register_champion(home, "h100")


def _client(store, **kw):
    token, _ = q.create_token(store, "alice")
    return TestClient(create_app(store, sample_s=None, **kw)), {"Authorization": f"Bearer {token}"}


def _wait(client, auth, rid, status, timeout=60.0):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        r = client.get(f"/v1/requests/{rid}", headers=auth).json()
        if r["status"] == status:
            return r
        time.sleep(0.1)
    raise AssertionError(f"{rid} still {r['status']} after {timeout} s; loop: {client.get('/healthz').json()}")


@pytest.mark.slow
def test_api_assigns_submitted_requests_with_the_champion(tmp_path, champion, monkeypatch):
    import mlflow

    monkeypatch.setenv("MLFLOW_TRACKING_URI", champion)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", champion)
    mlflow.set_tracking_uri(champion)
    mlflow.set_registry_uri(champion)
    store = new_store(f"sqlite:///{tmp_path / 'queue.db'}", h100())
    client, auth = _client(store, dispatch_s=0.2)
    with client:
        assert client.post("/v1/requests", json={"id": "j1", "k": 8}, headers=auth).status_code == 201
        got = _wait(client, auth, "j1", "assigned")
        assert len(got["gpus"]) == 8 and got["predicted_gbps"] > 0
        launch = client.get("/v1/requests/j1/launch?format=slurm", headers=auth)
        assert launch.status_code == 200 and "--nodelist" in launch.text
        loop = client.get("/healthz").json()["batches"]
        assert loop["model"] == "models:/bandpilot-h100@champion" and loop["model_version"] == "1"
        assert loop["error"] is None and loop["last_batch"]["assigned"] == 1
        assert (loop["profile"], loop["policy"]) == ("recommended", "hrrn")  # the API's batches run a profile
        # more than fits waits, with the reason, and no batch loads anything for it
        assert client.post("/v1/requests", json={"id": "j2", "k": 32}, headers=auth).status_code == 201
        time.sleep(0.6)
        assert client.get("/v1/requests/j2", headers=auth).json()["status"] == "pending"
        assert client.get("/healthz").json()["batches"]["waiting"] == "1 pending, the smallest needs 32 GPUs, 24 free"
    store.close()


@pytest.mark.slow
def test_without_a_model_requests_wait_and_the_health_check_says_why(tmp_path, mlflow_uri):
    store = new_store(f"sqlite:///{tmp_path / 'queue.db'}", h100())
    client, auth = _client(store, dispatch_s=0.1)
    with client:
        assert client.post("/v1/requests", json={"id": "j1", "k": 2}, headers=auth).status_code == 201
        deadline = time.monotonic() + 30
        while not (loop := client.get("/healthz").json()["batches"])["error"]:
            assert time.monotonic() < deadline, loop
            time.sleep(0.1)
        assert "no MLflow registry at" in loop["error"]
        assert client.get("/v1/requests/j1", headers=auth).json()["status"] == "pending"
    store.close()
    assert not Path(mlflow_uri.removeprefix("sqlite:///")).exists()  # looking for a model made no store


@pytest.mark.slow
def test_the_loop_is_off_when_asked(tmp_path, champion):
    store = new_store(f"sqlite:///{tmp_path / 'queue.db'}", h100())
    client, auth = _client(store, dispatch_s=None)
    with client:
        client.post("/v1/requests", json={"id": "j1", "k": 2}, headers=auth)
        time.sleep(0.3)
        assert client.get("/v1/requests/j1", headers=auth).json()["status"] == "pending"
        assert client.get("/healthz").json()["batches"]["interval_s"] is None
    store.close()


def test_a_422_names_every_problem(tmp_path):
    store = new_store(f"sqlite:///{tmp_path / 'queue.db'}", h100())
    client, auth = _client(store)
    with client:
        r = client.post("/v1/requests", json={"k": 0, "priority": "high"}, headers=auth)
    assert r.status_code == 422
    err = r.json()["error"]
    assert "more)" not in err and "k:" in err and "priority:" in err, err
    store.close()
