"""Where are runs tracked and models registered? MLflow helpers: tracking setup, logging a trained
surrogate, the model registry and its aliases.

Shared by training (``bandpilot train/sweep/finetune``) and evaluation/promotion. The model is
an MLflow pyfunc (:class:`~bandpilot.model.pyfunc.SurrogatePyfunc`) whose only artifact is the
self-contained surrogate directory (:meth:`bandpilot.model.surrogate.Surrogate.save`);
:func:`~bandpilot.model.artifacts.fetch_model_dir` resolves a registry URI to that directory
without going through ``mlflow.pyfunc.load_model`` (fast, no Lightning, no env checks). Registry
failures (unknown name, alias or version) raise one-line :class:`ModelError`.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import tempfile
import time
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any

import mlflow
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from bandpilot.config import model_name, portable
from bandpilot.errors import ModelError
from bandpilot.model.artifacts import mlflow_client, one_line
from bandpilot.model.pyfunc import ARTIFACT_NAME, SurrogatePyfunc

if TYPE_CHECKING:
    from mlflow.entities.model_registry import ModelVersion

    from bandpilot.model.result import TrainResult

EXPERIMENT = "bandpilot"
PIP_REQUIREMENTS = ["torch==2.13.0", "numpy==2.4.6", "pandas==3.1.1", "pyyaml==6.0.3", "mlflow==3.17.2"]


# ------------------------------------------------------------------------------------------
def artifact_root_for(uri: str) -> str | None:
    """Artifacts next to a SQLite store (``<db dir>/artifacts``); servers choose their own."""
    if uri.startswith("sqlite:///"):
        db = Path(uri.removeprefix("sqlite:///")).expanduser()
        if not db.is_absolute():
            db = Path.cwd() / db
        return (db.parent / "artifacts").resolve().as_uri()
    if uri.startswith("file:"):
        return None
    if "://" not in uri:
        return None
    return None


def tracking_setup(uri: str | None = None, experiment: str | None = None) -> str:
    """Point MLflow at ``uri`` (else ``$MLFLOW_TRACKING_URI``, else SQLite under ``mlruns/``) and
    select the experiment (created with its artifacts beside a SQLite store). Returns the URI."""
    from bandpilot.config import default_tracking_uri, settings, setup_env

    setup_env()
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")
    for noisy in ("mlflow.pyfunc", "mlflow.store.db.utils", "mlflow.models.model", "alembic"):
        logging.getLogger(noisy).setLevel(logging.ERROR)
    explicit = uri
    uri = uri or os.environ.get("MLFLOW_TRACKING_URI") or default_tracking_uri()
    if uri.startswith("sqlite:///"):
        Path(uri.removeprefix("sqlite:///")).expanduser().parent.mkdir(parents=True, exist_ok=True)
    mlflow.set_tracking_uri(uri)
    mlflow.set_registry_uri(explicit or os.environ.get("MLFLOW_REGISTRY_URI") or uri)
    name = experiment or settings().experiment or EXPERIMENT
    try:
        client = MlflowClient()
        exp = client.get_experiment_by_name(name)
        if exp is None:
            client.create_experiment(name, artifact_location=artifact_root_for(uri))
        mlflow.set_experiment(name)
    except MlflowException as exc:
        raise ModelError(f"MLflow tracking store {uri!r} unusable: {one_line(exc)}") from None
    return uri


# ------------------------------------------------------------------------------------------
def describe_result(result: "TrainResult", name: str) -> str:
    """Operator-facing description: what data, how trained, how good, with what caveats."""
    m, d, p = result.metrics, result.data, result.params
    sur = result.surrogate
    spec = sur.spec
    lines = [
        f"{name}: bandwidth surrogate ({sur.kind}) for cluster '{spec.name}' - {spec.n_hosts} hosts, "
        f"{spec.n_gpus} GPUs ({', '.join(spec.gpu_types)}), {spec.collective} at {spec.message_bytes} B.",
        f"Data: dataset {str(d.get('dataset_hash', ''))[:16]} ({d.get('dataset_rows')} rows"
        + (f", {portable(d['dataset_path'])}" if d.get("dataset_path") else "")
        + f"); cross-host pool {d.get('pool')} allocations; stage-1 tables for every subset of every host.",
    ]
    if d.get("split") == "finetune":
        lines.append(
            f"Fine-tuned from {d.get('base_model')} (version {d.get('base_version')}) on {int(m.get('n_train', 0))} new "
            f"allocations with {int(m.get('n_replay', 0))} replayed originals; {p.finetune_epochs} epochs, lr {p.finetune_lr}."
        )
        if "replay_mape_before" in m:
            lines.append(f"Forgetting check: replay MAPE {m['replay_mape_before']:.2f}% -> {m['replay_mape_after']:.2f}%.")
        if "test_mape_before" in m:
            lines.append(f"New-data MAPE before fine-tuning {m['test_mape_before']:.2f}%.")
    elif d.get("split") == "all":
        folds = ", ".join(f"{f['mape']:.2f}" for f in d.get("cv_folds") or [])
        lines.append(
            f"Training: fit on all {int(m.get('n_train', 0))} cross-host allocations, seed {p.seed}; metrics from the "
            f"{d.get('metrics_from')} (per-fold MAPE %: {folds}); {p.layers} encoder layers, hidden {p.hidden}, "
            f"{int(m.get('epochs_run', 0))} epochs, lr {p.lr}, prior fit to the data: {p.prior_fit}, {m.get('train_seconds', 0):.1f} s."
        )
    else:
        lines.append(
            f"Training: {int(m.get('n_train', 0))} cross-host allocations, split '{d.get('split')}' "
            f"(test disjoint from training, {d.get('test_patterns')} test count patterns), seed {p.seed}; "
            f"{p.layers} encoder layers, hidden {p.hidden}, {p.head_layers}-layer head, {int(m.get('epochs_run', 0))} epochs, "
            f"lr {p.lr}, loss {p.loss} on log busbw, {m.get('train_seconds', 0):.1f} s."
        )
    what = "Cross-validated, out-of-fold" if cross_validated(result) else "Test"
    lines.append(
        f"{what} ({int(m.get('n_test', 0))} cross-host allocations): R2 {m.get('test_r2', float('nan')):.4f}, "
        f"MAPE {m.get('test_mape', float('nan')):.2f}%, max error {m.get('test_max_err', float('nan')):.1f} GB/s "
        f"({m.get('test_max_rel_err', float('nan')):.0f}%), Spearman {m.get('test_spearman', float('nan')):.4f}."
    )
    if d.get("prior"):
        pr = d["prior"]
        lines.append("Physics prior: " + ", ".join(f"{k} {v:.3g}" for k, v in pr.items())
                     + f"; final min with stage-1 bandwidth: {d.get('min_intra', True)}.")
    commit = sur.meta.get("git_commit")
    lines.append(f"Code: git {commit[:12] if commit else 'unknown'}. Single-host allocations are exact stage-1 lookups.")
    for n in result.notes:
        lines.append(f"Note: {n}.")
    return "\n".join(lines)


def cross_validated(result: "TrainResult") -> bool:
    """True when the result's ``test_*`` figures are its pooled out-of-fold predictions (a fit on
    every measurement without a holdout), not a test set the model never saw in any form."""
    return result.data.get("split") == "all" and not result.params.holdout > 0


def metric_tags(result: "TrainResult") -> dict[str, str]:
    """Accuracy figures for the model version's tags, named for what they are: ``cv_*`` for
    cross-validation, ``test_*`` only for a real held-out test set."""
    m = result.metrics
    out = {k: f"{v:.6g}" for k, v in m.items() if k.startswith("cv_") and not re.match(r"cv_fold\d", k) and math.isfinite(v)}
    if not cross_validated(result):
        out.update({k: f"{v:.6g}" for k, v in m.items() if k.startswith("test_") and math.isfinite(v)})
    return out


def _flat_params(p: dict[str, Any]) -> dict[str, Any]:
    return {k: ("" if v is None else v) for k, v in p.items()}


def log_history(history: list[dict[str, float]]) -> None:
    """Per-epoch metrics into the active run in one batch."""
    from mlflow.entities import Metric

    run = mlflow.active_run()
    if run is None or not history:
        return
    now = int(time.time() * 1000)
    ms = []
    for row in history:
        step = int(row.get("epoch", 0))
        for k, v in row.items():
            if k != "epoch" and v is not None and math.isfinite(v):
                ms.append(Metric(f"epoch_{k}", float(v), now, step))
    client = mlflow_client()
    for i in range(0, len(ms), 900):
        client.log_batch(run.info.run_id, metrics=ms[i : i + 900], synchronous=True)


def log_result(result: "TrainResult", prefix: str = "") -> None:
    """Params, metrics, per-epoch history, plots, tags of a result into the active run."""
    d = result.data
    mlflow.log_params({f"{prefix}{k}": v for k, v in _flat_params(result.params.as_dict()).items()})
    # A cross-validated fit's test_* are its cv_* under another name: the run records them once, honestly.
    cv_only = cross_validated(result)
    mlflow.log_metrics({f"{prefix}{k}": float(v) for k, v in result.metrics.items()
                        if math.isfinite(v) and not (cv_only and k.startswith("test_"))})
    log_history(result.history)
    for path in result.plots.values():
        mlflow.log_artifact(str(path), artifact_path="plots")
    details = result.details.get("test") or {}
    if details:
        with tempfile.TemporaryDirectory() as tmp:
            f = Path(tmp) / "test_breakdown.json"
            f.write_text(json.dumps({k: details[k] for k in ("by_hosts", "by_pattern") if k in details}, indent=1))
            mlflow.log_artifact(str(f), artifact_path="eval")
    tags = {
        "bandpilot.cluster": d.get("cluster", ""),
        "bandpilot.fingerprint": d.get("fingerprint", ""),
        "bandpilot.dataset_hash": d.get("dataset_hash", ""),
        "bandpilot.split": d.get("split", ""),
        "bandpilot.model_kind": result.surrogate.kind,
    }
    commit = result.surrogate.meta.get("git_commit")
    if commit:
        tags["bandpilot.git_commit"] = commit
        tags["mlflow.source.git.commit"] = commit
    if d.get("dataset_path"):
        tags["bandpilot.dataset_path"] = portable(d["dataset_path"])
    mlflow.set_tags({k: str(v) for k, v in tags.items() if v is not None})


def log_and_register(result: "TrainResult", name: str | None = None, description: str | None = None,
                     tags: dict[str, Any] | None = None, alias: str | None = None) -> "ModelVersion":
    """Log ``result`` (in the active run, else a new one) and register it as a new version of
    ``name`` (default ``bandpilot-<cluster>``) with an operator-readable description."""
    name = name or model_name(result.surrogate.spec.name)
    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.\-]*", name):
        raise ModelError(f"invalid model name {name!r}")
    description = description or describe_result(result, name)
    own_run = mlflow.active_run() is None
    if own_run:
        mlflow.start_run(run_name=f"{result.data.get('split', 'train')}-{result.surrogate.spec.name}")
    try:
        run = mlflow.active_run()
        assert run is not None
        log_result(result)
        if tags:
            mlflow.set_tags({str(k): str(v) for k, v in tags.items()})
        result.surrogate.name = name
        with tempfile.TemporaryDirectory() as tmp:
            d = result.surrogate.save(Path(tmp) / ARTIFACT_NAME)
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                info = mlflow.pyfunc.log_model(
                    name="model",
                    python_model=SurrogatePyfunc(),
                    artifacts={ARTIFACT_NAME: str(d)},
                    pip_requirements=PIP_REQUIREMENTS,
                    metadata={"bandpilot_cluster": result.surrogate.spec.name, "bandpilot_kind": result.surrogate.kind},
                )
        client = mlflow_client()
        try:
            client.get_registered_model(name)
        except MlflowException:
            client.create_registered_model(
                name, description=f"BandPilot bandwidth surrogate B(S) for cluster '{result.surrogate.spec.name}'."
            )
        mv = client.create_model_version(name, source=info.model_uri, run_id=run.info.run_id,
                                         description=description, model_id=getattr(info, "model_id", None))
        vt = {
            "cluster": result.surrogate.spec.name,
            "kind": result.surrogate.kind,
            "dataset_hash": str(result.data.get("dataset_hash", "")),
            "git_commit": str(result.surrogate.meta.get("git_commit") or ""),
            **metric_tags(result),
            **{str(k): str(v) for k, v in (tags or {}).items()},
        }
        for k, v in vt.items():
            client.set_model_version_tag(name, mv.version, k, v)
        mlflow.set_tags({"bandpilot.registered_model": name, "bandpilot.model_version": str(mv.version)})
        if alias:
            set_alias(name, alias, mv.version)
        return client.get_model_version(name, mv.version)
    finally:
        if own_run:
            mlflow.end_run()


# ------------------------------------------------------------------------------------------
def set_alias(name: str, alias: str, version: str | int) -> None:
    try:
        mlflow_client().set_registered_model_alias(name, alias, str(version))
    except MlflowException as exc:
        raise ModelError(f"cannot set alias {alias!r} of {name!r} to version {version}: {one_line(exc)}") from None


def get_alias(name: str, alias: str) -> str | None:
    """Version an alias points to, or None (also when the model does not exist)."""
    try:
        return str(mlflow_client().get_model_version_by_alias(name, alias).version)
    except MlflowException:
        return None


def describe(name: str, version: str | int, text: str) -> None:
    try:
        mlflow_client().update_model_version(name, str(version), description=text)
    except MlflowException:
        raise ModelError(f"model {name!r} has no version {version!r}") from None


def set_tags(name: str, version: str | int, tags: dict[str, Any]) -> None:
    client = mlflow_client()
    try:
        for k, v in tags.items():
            client.set_model_version_tag(name, str(version), str(k), str(v))
    except MlflowException:
        raise ModelError(f"model {name!r} has no version {version!r}") from None
