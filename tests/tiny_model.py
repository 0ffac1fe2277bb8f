"""A tiny surrogate registered as ``bandpilot-<cluster>@champion`` in a temp project's own MLflow
store (``<home>/mlruns/mlflow.db``, where the CLI and the library look): for tests that need a
promoted model without the main job (README examples, the API's batch loop)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY = {"epochs": 3, "layers": 1, "hidden": 16, "heads": 2, "prior_steps": 20, "n_train": 80, "threads": 1,
        "split": "random", "replay_size": 16}


def make_project(home: Path) -> Path:
    """A directory the project finds as its home (``params/pipeline.yaml`` + ``dvc.yaml``) with the shipped params."""
    shutil.copytree(ROOT / "params", home / "params", dirs_exist_ok=True)
    shutil.copy(ROOT / "dvc.yaml", home / "dvc.yaml")
    return home


def register_champion(home: Path, cluster: str = "h100") -> str:
    """Train on emulated data and register in ``home``'s store; returns that store's URI. The
    process's MLflow URIs are restored afterwards."""
    import mlflow

    from bandpilot.data.synthetic import fabric_dataset
    from bandpilot.fabric.emulator import EmulatorFabric
    from bandpilot.model import registry
    from bandpilot.model.train import train
    from bandpilot.topology.cluster import load_cluster

    uri = f"sqlite:///{home / 'mlruns' / 'mlflow.db'}"
    saved = {k: os.environ.get(k) for k in ("MLFLOW_TRACKING_URI", "MLFLOW_REGISTRY_URI")}
    old = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    try:
        os.environ["MLFLOW_TRACKING_URI"] = os.environ["MLFLOW_REGISTRY_URI"] = uri
        registry.tracking_setup(uri)
        fab = EmulatorFabric(load_cluster(ROOT / "params" / "clusters" / f"{cluster}.yaml"))
        registry.log_and_register(train(fabric_dataset(fab, n_cross=120, seed=1), TINY), alias="champion")
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
        mlflow.set_tracking_uri(old[0])
        mlflow.set_registry_uri(old[1])
    return uri
