"""Shared test set-up: quiet, offline tools and every store in a temp dir.

Set before any test module imports mlflow/prefect/dvc so nothing writes to the project or ~.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SHARED_DATA = ROOT.parent / "shared" / "data" / "measurements"

_session_tmp = Path(tempfile.mkdtemp(prefix="bandpilot-tests-"))
os.environ.setdefault("BANDPILOT_HOME", str(_session_tmp / "home"))
os.environ["PREFECT_HOME"] = str(_session_tmp / "prefect")
os.environ["DVC_SITE_CACHE_DIR"] = str(_session_tmp / "dvc-site")
os.environ["MLFLOW_TRACKING_URI"] = f"sqlite:///{_session_tmp / 'mlflow.db'}"
os.environ["MLFLOW_REGISTRY_URI"] = os.environ["MLFLOW_TRACKING_URI"]
for k, v in {
    "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
    "DO_NOT_TRACK": "true",
    "MLFLOW_DISABLE_TELEMETRY": "true",
    "DVC_NO_ANALYTICS": "1",
    "OMP_NUM_THREADS": "1",
    "PREFECT_LOGGING_LEVEL": "WARNING",
}.items():
    os.environ[k] = v


@pytest.fixture(scope="session")
def root() -> Path:
    return ROOT


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """The real measurement directories; tests using them skip where ../shared/data is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA


@pytest.fixture
def mlflow_uri(tmp_path, monkeypatch) -> str:
    """A fresh MLflow tracking + registry store (SQLite) for one test."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", uri)
    import mlflow

    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(uri)
    yield uri
    mlflow.set_tracking_uri(os.environ.get("MLFLOW_TRACKING_URI", uri))


@pytest.fixture(scope="module")
def fab():
    """The emulated 4 x 8 H100 cluster as a fabric (the queue and simulator tests' truth and model)."""
    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.topology.cluster import load_cluster

    return make_fabric(load_cluster(ROOT / "params" / "clusters" / "h100.yaml"))


@pytest.fixture
def store(tmp_path, fab):
    """A fresh SQLite queue store holding ``fab``'s cluster (test files with their own ``store`` override it)."""
    from bandpilot import queue as q

    s = q.Store(f"sqlite:///{tmp_path / 'q.db'}")
    s.init_cluster(fab.spec)
    yield s
    s.close()
