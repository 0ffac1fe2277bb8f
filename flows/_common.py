"""Configuration shared by the flows: quiet local environment, params, task runner."""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import yaml

from bandpilot.config import project_root, setup_env
from bandpilot.errors import SpecError

PIPELINE_PARAMS = "params/pipeline.yaml"
REQUIRED_KEYS = ("clusters", "profile", "train_params", "evaluate", "promotion_policy", "dispatch")


def load_params(path: str | Path | None = None) -> dict[str, Any]:
    """Read ``params/pipeline.yaml``; missing keys fail at flow start, not halfway through."""
    root = project_root()
    p = Path(path) if path else root / PIPELINE_PARAMS
    if not p.is_absolute():
        p = root / p
    if not p.is_file():
        raise SpecError(f"pipeline parameters not found: {p}")
    try:
        doc = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise SpecError(f"{p}: invalid YAML ({exc.__class__.__name__})") from None
    missing = [k for k in REQUIRED_KEYS if k not in doc]
    if missing:
        raise SpecError(f"{p}: missing required keys {missing}")
    return doc


def resolve(path: str | Path) -> Path:
    """Paths in params are relative to the project root."""
    p = Path(path)
    return p if p.is_absolute() else project_root() / p


def content_hash(*parts: Any) -> str:
    """Stable hash of JSON-able parts (dataset hash, params) for skip-if-unchanged checks."""
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def task_runner(kind: str | None = None, workers: int = 2):
    """``thread`` (default) or ``dask`` (prefect-dask LocalCluster, threads: no server per worker)."""
    kind = (kind or os.environ.get("BANDPILOT_TASK_RUNNER") or "thread").lower()
    if kind == "dask":
        from prefect_dask import DaskTaskRunner

        return DaskTaskRunner(cluster_kwargs={"n_workers": workers, "processes": False, "threads_per_worker": 1})
    if kind != "thread":
        raise SpecError(f"task_runner must be 'thread' or 'dask', got {kind!r}")
    from prefect.task_runners import ThreadPoolTaskRunner

    return ThreadPoolTaskRunner(max_workers=workers)


def prepare() -> Path:
    """Quiet offline defaults; returns the project root."""
    setup_env()
    return project_root()
