"""Issue 15: long-running services stop cleanly on SIGTERM / SIGINT (what a service manager sends)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _project(tmp_path: Path) -> Path:
    """A project copy (params + dvc.yaml) so scheduled runs write nothing into the checkout."""
    proj = tmp_path / "proj"
    shutil.copytree(ROOT / "params", proj / "params")
    shutil.copy(ROOT / "dvc.yaml", proj / "dvc.yaml")
    return proj


class _Output:
    """Collect a process's output on a thread (a pipe read never blocks the test)."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.text = ""
        self._t = threading.Thread(target=self._pump, args=(proc,), daemon=True)
        self._t.start()

    def _pump(self, proc: subprocess.Popen) -> None:
        for line in proc.stdout:
            self.text += line

    def wait_for(self, proc: subprocess.Popen, text: str, timeout: float) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and text not in self.text and proc.poll() is None:
            time.sleep(0.2)
        if text not in self.text:
            proc.kill()
            raise AssertionError(f"no {text!r} within {timeout} s; output:\n{self.text}")


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_serve_stops_within_10_s(tmp_path, sig):
    proj = _project(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("BANDPILOT_", "PREFECT_API_URL"))}
    env["PREFECT_HOME"] = str(tmp_path / "prefect")
    proc = subprocess.Popen([sys.executable, "-m", "bandpilot", "serve"], cwd=proj, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        out = _Output(proc)
        out.wait_for(proc, "serving 8 deployments", 240)
        t0 = time.monotonic()
        proc.send_signal(sig)
        rc = proc.wait(timeout=30)
        took = time.monotonic() - t0
        out._t.join(5)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took <= 10.0, f"stopped after {took:.1f} s"
    assert rc == 0, out.text
    assert "stopped" in out.text and "never awaited" not in out.text, out.text


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_api_stops_within_10_s_and_leaves_the_store_consistent(tmp_path, sig):
    import httpx

    from bandpilot import queue as q

    url = f"sqlite:///{tmp_path / 'queue.db'}"
    store = q.Store(url)
    store.init_cluster(__import__("bandpilot.topology.cluster", fromlist=["load_cluster"]).load_cluster(ROOT / "params/clusters/h100.yaml"))
    token, _ = q.create_token(store, "alice")
    port = _free_port()
    env = {**os.environ, "BANDPILOT_HOME": str(tmp_path)}
    proc = subprocess.Popen([sys.executable, "-m", "bandpilot", "api", "--store", url, "--port", str(port)], env=env,
                            text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    out = _Output(proc)
    try:
        base = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{base}/healthz", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline and proc.poll() is None, out.text
            time.sleep(0.2)
        h = {"Authorization": f"Bearer {token}"}
        for i in range(20):
            assert httpx.post(f"{base}/v1/requests", json={"id": f"r{i}", "k": 2}, headers=h).status_code == 201
        acked: list[str] = []

        def submitter() -> None:  # keeps requests in flight while the signal arrives
            for i in range(20, 10_000):
                try:
                    r = httpx.post(f"{base}/v1/requests", json={"id": f"r{i}", "k": 2}, headers=h, timeout=5)
                except httpx.TransportError:
                    return
                if r.status_code == 201:
                    acked.append(f"r{i}")

        t = threading.Thread(target=submitter)
        t.start()
        time.sleep(1.0)
        t0 = time.monotonic()
        proc.send_signal(sig)
        rc = proc.wait(timeout=30)
        took = time.monotonic() - t0
        t.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert took <= 10.0 and rc == 0, (took, rc, out.text)
    stored = [r["id"].removeprefix("alice:") for r in q.list_requests(store)]  # the store keys API ids by tenant
    assert len(acked) > 0 and stored[:20] == [f"r{i}" for i in range(20)]
    assert set(acked) <= set(stored) and len(stored) - 20 - len(acked) <= 1  # at most the one in flight is unanswered
    # every stored request has its audit row; refusals past the tenant's GPU limit (429) are audited as errors
    assert q.check_invariants(store) == [] and len([r for r in q.audit_log(store) if r["outcome"] == "ok"]) == len(stored)
