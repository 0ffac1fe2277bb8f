"""Configuration shared by the flows: quiet local environment, params, task runner."""

from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from bandpilot.config import project_root, settings, setup_env
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


@dataclass(frozen=True)
class ClusterSource:
    """One entry of ``clusters:`` resolved: what to ingest or profile and what scores the model."""

    path: str  # measurement directory (ingested; TraceFabric truth) or spec (profiled on the emulator)
    measured: bool
    note: str | None = None  # why an emulated fallback stands in for a measured directory
    missing: str | None = None  # the measurement directory that was not found

    @property
    def truth(self) -> str:
        return f"measured tables ({self.path})" if self.measured else f"emulator ({self.path})"


def cluster_sources(entries: Any, where: str = "params/pipeline.yaml") -> list[ClusterSource]:
    """``clusters:`` entries -> sources. An entry is a spec/directory path, or
    ``{measured: DIR, fallback: SPEC}``: the physical measurements when ``DIR`` exists, else ``SPEC``."""
    from bandpilot.topology.cluster import load_cluster

    if not isinstance(entries, list) or not entries:
        raise SpecError(f"{where}: clusters must be a non-empty list")
    out = []
    for i, e in enumerate(entries):
        if isinstance(e, str):
            out.append(ClusterSource(e, load_cluster(resolve(e)).source == "trace"))
            continue
        if not isinstance(e, dict) or not (e.get("measured") or e.get("fallback")):
            raise SpecError(f"{where}: clusters[{i}] must be a path or {{measured: DIR, fallback: SPEC}}")
        measured, fallback = e.get("measured"), e.get("fallback")
        if measured and resolve(measured).is_dir():
            out.append(ClusterSource(str(measured), load_cluster(resolve(measured)).source == "trace"))
        elif fallback:
            note = f"measurement directory {measured} not found: emulated {fallback} instead" if measured else None
            out.append(ClusterSource(str(fallback), load_cluster(resolve(fallback)).source == "trace", note,
                                     str(measured) if measured else None))
        else:
            raise SpecError(f"{where}: clusters[{i}]: measurement directory {measured} not found and no fallback")
    return out


def truth_line(sources: list[ClusterSource]) -> str:
    """The main job's first line: which truth scores the models, each thing said once
    (``truth: EMULATED, not measurements - A.yaml, B.yaml (not found: DIR/a, b)``)."""
    if all(s.measured for s in sources):
        return "truth: measured tables - " + ", ".join(s.path for s in sources)
    head = "truth: EMULATED, not measurements" if not any(s.measured for s in sources) else "truth: mixed"
    parts = [s.path if not s.measured else f"measured {s.path}" for s in sources]
    missing = [s.missing for s in sources if s.missing]
    line = f"{head} - {', '.join(parts)}"
    if missing:
        parent = os.path.commonpath(missing) if len(missing) > 1 else os.path.dirname(missing[0])
        names = [os.path.relpath(m, parent) if parent else m for m in missing]
        line += f" (not found: {os.path.join(parent, names[0]) if parent else names[0]}"
        line += "".join(f", {n}" for n in names[1:]) + ")"
    return line


def resolve(path: str | Path) -> Path:
    """Paths in params are relative to the project root."""
    p = Path(path)
    return p if p.is_absolute() else project_root() / p


def profile_param(disp: dict[str, Any]) -> str:
    """The scheduler profile of ``params/pipeline.yaml``'s ``dispatch`` block: a name, or a YAML file
    relative to the project root."""
    name = str(disp.get("profile", "recommended"))
    return str(resolve(name)) if name.endswith((".yaml", ".yml")) else name


def content_hash(*parts: Any) -> str:
    """Stable hash of JSON-able parts (dataset hash, params) for skip-if-unchanged checks."""
    h = hashlib.sha256()
    for part in parts:
        h.update(json.dumps(part, sort_keys=True, default=str).encode())
    return h.hexdigest()[:16]


def task_runner(kind: str | None = None, workers: int = 2):
    """``thread`` (default) or ``dask`` (prefect-dask LocalCluster, threads: no server per worker)."""
    kind = (kind or settings().task_runner or "thread").lower()
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
