"""kill -9 a batch mid-way: the crash tests' shared subprocess handling."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def kill_mid_run(script: str, *args: str, after_s: float) -> None:
    """Run ``python -c script args...``; once it prints START, wait ``after_s`` and SIGKILL it
    (it must still be running: a script that finished first would test nothing)."""
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    p = subprocess.Popen([sys.executable, "-c", script, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, env=env)
    try:
        assert p.stdout.readline().strip() == "START", p.stderr.read()
        time.sleep(after_s)
        assert p.poll() is None, "batch finished before it could be killed"
        os.kill(p.pid, signal.SIGKILL)
        p.wait(10)
    finally:
        if p.poll() is None:
            p.kill()
        p.stdout.close()
        p.stderr.close()
