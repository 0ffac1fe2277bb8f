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
