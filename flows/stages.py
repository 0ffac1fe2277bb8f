"""The main job's model stages as DVC sees them (``dvc.yaml``): ``train`` and ``evaluate``.

Why: DVC and the flows must describe one pipeline. ``bandpilot pipeline`` runs the stages' work
in its own flow (retrain -> gate per cluster), then writes the outputs ``dvc.yaml`` declares -
``models/<cluster>/`` (the registered version's self-contained artifact, with ``registered.json``
naming it), ``metrics/train/<cluster>.json`` (its cross-validated metrics) and
``metrics/evaluate/<cluster>.json`` (the gate's evaluation of it) - and records them with ``dvc commit``, so ``dvc status`` is clean
after a run and ``dvc metrics show`` reads them. ``dvc repro`` runs the same code through
``bandpilot stage train|evaluate`` when the dataset, params or code change.

The dataset enters through ``data.dvc`` (``dvc add`` by profiling/ingest: measurements are
observations, not a function of the repo). The registry is a side effect of ``train`` (MLflow is
where models are served from); a stage whose dataset and params did not change reuses the
registered version (its ``pipeline_key``), so a re-run registers nothing new.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from prefect import flow

from bandpilot.io import replaced_dir, write_text_atomic
from flows._common import cluster_sources, load_params, prepare, resolve

STAGES = ("train", "evaluate")
REGISTERED = "registered.json"


def _write_json(path: Path, doc: Any) -> None:
    write_text_atomic(path, json.dumps(doc, indent=1, sort_keys=True, default=str) + "\n")


def clusters(params_file: str) -> list[dict[str, Any]]:
    """The clusters of the pipeline: name, spec/measurement path and dataset directory."""
    from bandpilot.topology.cluster import load_cluster

    P = load_params(params_file)
    data_root = str(P.get("data_root", "."))
    out = []
    for src in cluster_sources(P["clusters"], str(params_file)):
        name = load_cluster(resolve(src.path)).name
        out.append({"name": name, "path": src.path, "data": str(Path(data_root) / "data" / name)})
    return out


def export_model(root: Path, cluster: str, name: str, version: str) -> Path:
    """``models/<cluster>/``: the registered version's artifact and ``registered.json`` (replaced whole)."""
    from bandpilot.model.artifacts import fetch_model_dir

    src, _, _ = fetch_model_dir(f"models:/{name}/{version}")
    dest = root / "models" / cluster
    with replaced_dir(dest) as tmp:
        shutil.copytree(src, tmp / "model")
        _write_json(tmp / REGISTERED, {"name": name, "version": str(version), "uri": f"models:/{name}/{version}"})
    return dest


#: The figures ``dvc metrics show`` lists per cluster (every metric stays in the model and in MLflow).
SHOWN = ("mape", "r2", "max_err")


def train_metrics(root: Path, cluster: str) -> dict[str, Any]:
    """The exported model's own metrics, named for what they are: ``cv`` - pattern-grouped
    cross-validation over every allocation the model was fit on (``bandpilot train``'s production
    fit, whose ``test_*`` MLflow metrics are these same out-of-fold predictions) - and ``test`` only
    where allocations were really held out (``--holdout``, a ``--split`` protocol, a fine-tune)."""
    from bandpilot.model.surrogate import Surrogate

    d = root / "models" / cluster
    reg = json.loads((d / REGISTERED).read_text())
    meta = Surrogate.load_dir(d / "model").meta
    m = {k: float(v) for k, v in (meta.get("metrics") or {}).items() if isinstance(v, (int, float))}
    out: dict[str, Any] = {"version": int(reg["version"])}
    if "cv_mape" in m:
        out["cv"] = {**{k: m[f"cv_{k}"] for k in SHOWN if f"cv_{k}" in m},
                     "folds": int(m.get("cv_folds", 0)), "n": int(m.get("n_train", 0))}
    held_out = not str((meta.get("data") or {}).get("metrics_from", "")).endswith("cross-validation")
    if held_out and "test_mape" in m:
        out["test"] = {**{k: m[f"test_{k}"] for k in SHOWN if f"test_{k}" in m}, "n": int(m.get("n_test", 0))}
    if "train_seconds" in m:
        out["train_seconds"] = round(m["train_seconds"], 1)
    return out


def evaluate_metrics(decision: dict[str, Any]) -> dict[str, Any]:
    """The gate's evaluation of the candidate: mean GBE per profile, MAPE and the decision."""
    cand = decision.get("candidate") or {}
    out: dict[str, Any] = {f"gbe_{p}": float(v) for p, v in (cand.get("gbe") or {}).items()}
    if cand.get("mape") is not None:
        out["mape"] = float(cand["mape"])
    out["version"] = int(cand.get("version") or 0)
    out["promoted"] = decision.get("action") == "promoted"
    ev = (decision.get("policy") or {}).get("evaluation") or {}
    out.update({k: ev[k] for k in ("repeats", "seed") if k in ev})
    return out


def decision_for(root: Path, cluster: str, version: str, gate: dict[str, Any] | None) -> dict[str, Any]:
    """The gate's decision: from this run, else the ``decision.json`` it wrote when the version was gated."""
    if gate and gate.get("decision"):
        return gate["decision"]
    for cand in ([Path(gate["report"])] if gate and gate.get("report") else []) + [root / "reports" / cluster / f"v{version}"]:
        p = cand / "decision.json"
        if p.is_file():
            return json.loads(p.read_text())
    return {}


def write_metrics(root: Path, stage: str, per_cluster: dict[str, dict[str, Any]]) -> Path:
    """``metrics/<stage>/<cluster>.json``: ``dvc metrics show`` prints one row per cluster (one file
    keyed by cluster was a single row of every cluster's every figure). The directory is replaced whole."""
    dest = root / "metrics" / stage
    with replaced_dir(dest) as tmp:
        for cluster, doc in per_cluster.items():
            _write_json(tmp / f"{cluster}.json", doc)
    (root / "metrics" / f"{stage}.json").unlink(missing_ok=True)  # the one-file layout of earlier runs
    return dest


def record(root: Path, results: dict[str, Any], *, git: str = "leave") -> None:
    """After ``pipeline_flow``: write what ``dvc.yaml`` declares from the run's results, then
    ``dvc commit`` both stages (dvc.lock), as if ``dvc repro`` had run them. A data root without
    ``dvc.yaml`` (a deployment's own data directory) has no stages to record."""
    if not (root / "dvc.yaml").is_file():
        return
    train, evaluate = {}, {}
    for cluster, r in results["clusters"].items():
        rt = r["retrain"]
        export_model(root, cluster, rt["name"], str(rt["version"]))
        train[cluster] = train_metrics(root, cluster)
        evaluate[cluster] = evaluate_metrics(decision_for(root, cluster, str(rt["version"]), rt.get("gate")))
    write_metrics(root, "train", train)
    write_metrics(root, "evaluate", evaluate)
    from bandpilot.data.dvc import commit_stages

    commit_stages(root, list(STAGES), git=git)


@flow(name="bandpilot-stage", log_prints=True)
def stage_flow(stage: str, params_file: str = "params/pipeline.yaml") -> Path:
    """What ``dvc repro`` runs (``bandpilot stage NAME``): the pipeline's step for every cluster."""
    from flows.retrain import gate_task, retrain_flow

    root = prepare()
    P = load_params(params_file)
    sweep = P.get("sweep") or {}
    per: dict[str, dict[str, Any]] = {}
    for c in clusters(params_file):
        if stage == "train":
            rt = retrain_flow(data_dir=c["data"], cluster_spec=c["path"], params_file=P["train_params"],
                              sweep_trials=int(sweep.get("n_trials", 0)), sweep_timeout=sweep.get("timeout"),
                              policy=P["promotion_policy"], evaluate=P["evaluate"], gate=False)
            export_model(root, c["name"], rt["name"], str(rt["version"]))
            per[c["name"]] = train_metrics(root, c["name"])
        else:
            reg = json.loads((root / "models" / c["name"] / REGISTERED).read_text())
            out = str(Path("reports") / c["name"] / f"v{reg['version']}")
            gate = gate_task(reg["name"], reg["version"], c["path"], P["promotion_policy"], P["evaluate"], out)
            per[c["name"]] = evaluate_metrics(decision_for(root, c["name"], reg["version"], gate))
    return write_metrics(root, stage, per)
