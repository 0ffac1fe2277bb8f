"""``bandpilot-retrain``: dataset -> (sweep) -> train -> register -> evaluate + promotion gate.

Idempotent: a model version is tagged with ``pipeline_key`` = hash(dataset, training params,
sweep settings); a re-run (or a retry after a crash) with the same key reuses that version
instead of registering a duplicate, and a version that already carries a promotion decision
is not gated twice.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE

from bandpilot.config import model_name
from flows._common import content_hash, prepare, resolve


def find_version(name: str, key: str) -> str | None:
    """The newest version of ``name`` tagged with this pipeline key, if any."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient()
    try:
        found = client.search_model_versions(f"name='{name}' and tags.pipeline_key='{key}'")
    except MlflowException:
        return None
    found = [v for v in found if v.tags.get("pipeline_key") == key]
    return str(max(int(v.version) for v in found)) if found else None


@task(cache_policy=NONE)
def fingerprint_task(data_dir: str, params_file: str, sweep_trials: int) -> dict[str, Any]:
    from bandpilot.data.dataset import dataset_hash, load_dataset
    from bandpilot.model.params import TrainParams

    ds = load_dataset(resolve(data_dir))
    params = TrainParams.load(resolve(params_file), {})
    dhash = dataset_hash(resolve(data_dir))
    key = content_hash(dhash, dataclasses.asdict(params), sweep_trials)
    return {"cluster": ds.spec.name, "dataset_hash": dhash, "pipeline_key": key}


@task(retries=1, retry_delay_seconds=5, cache_policy=NONE)
def train_task(data_dir: str, params_file: str, sweep_trials: int, sweep_timeout: float | None, key: str) -> str:
    """Sweep (optional) then train and register; returns the new model version."""
    from bandpilot.model import registry
    from bandpilot.data.dataset import load_dataset
    from bandpilot.model.params import TrainParams
    from bandpilot.model.sweep import sweep
    from bandpilot.model.crossval import fit

    registry.tracking_setup()
    ds = load_dataset(resolve(data_dir))
    params = TrainParams.load(resolve(params_file), {})
    tags = {"pipeline_key": key, "bandpilot.command": "retrain-flow"}
    if sweep_trials > 0:
        sw = sweep(ds, params, n_trials=sweep_trials, timeout=sweep_timeout)
        params = sw.best_params
    res = fit(ds, params)
    mv = registry.log_and_register(res, tags=tags)
    return str(mv.version)


@task(retries=1, retry_delay_seconds=5, cache_policy=NONE)
def gate_task(name: str, version: str, cluster_spec: str | None, policy: str, evaluate: dict[str, Any], out_dir: str) -> dict[str, Any]:
    """Evaluate + promotion gate; skipped when this version already has a decision."""
    from mlflow import MlflowClient

    from bandpilot.model import registry
    from bandpilot.evaluation.decision import TAG_PREFIX
    from bandpilot.evaluation.gate import promote

    registry.tracking_setup()
    tags = MlflowClient().get_model_version(name, version).tags
    # The gate's own tags record the decision; "promotion.*" is what flows wrote before (read only).
    action = tags.get(TAG_PREFIX + "action") or tags.get("promotion.action")
    if action:
        passed = tags.get(TAG_PREFIX + "passed") or tags.get("promotion.passed") or ""
        return {"action": action, "reused": True, "passed": passed.lower() == "true"}
    dec = promote(
        f"models:/{name}/{version}",
        policy=resolve(policy),
        cluster=resolve(cluster_spec) if cluster_spec else None,
        profiles=evaluate.get("profiles"),
        repeats=evaluate.get("repeats"),
        seed=evaluate.get("seed"),
        workers=evaluate.get("workers"),
        out_dir=resolve(out_dir),
    )
    return {"action": dec.action, "passed": dec.passed, "reasons": dec.reasons, "report": str(dec.report_dir),
            "decision": dec.to_dict()}


def decision_markdown(name: str, version: str, gate: dict[str, Any]) -> str:
    from bandpilot.config import default_tracking_uri

    lines = [f"# Retrain {name} v{version}: {gate.get('action')}", ""]
    dec = gate.get("decision") or {}
    cand = (dec.get("candidate") or {}).get("gbe") or {}
    champ = (dec.get("champion") or {}).get("gbe") or {}
    if cand:
        lines += ["| profile | candidate GBE % | champion GBE % |", "|---|---:|---:|"]
        for prof, v in cand.items():
            c = champ.get(prof)
            lines.append(f"| {prof} | {100 * v:.1f} | {'' if c is None else f'{100 * c:.1f}'} |")
    for r in gate.get("reasons") or []:
        lines.append(f"- {r}")
    lines += ["", f"MLflow: `mlflow ui --backend-store-uri {default_tracking_uri()}` -> Models -> {name}"]
    if gate.get("report"):
        lines.append(f"Report: `{gate['report']}`")
    return "\n".join(lines)


@flow(name="bandpilot-retrain", log_prints=True)
def retrain_flow(
    data_dir: str,
    cluster_spec: str | None = None,
    params_file: str = "params/train.yaml",
    sweep_trials: int = 0,
    sweep_timeout: float | None = None,
    policy: str = "params/promotion.yaml",
    evaluate: dict[str, Any] | None = None,
    gate: bool = True,
    force: bool = False,
    reports_dir: str = "reports",
) -> dict[str, Any]:
    """Retrain when the dataset or params changed, then gate the new version for promotion."""
    prepare()
    from bandpilot.model import registry

    registry.tracking_setup()
    log = get_run_logger()
    fp = fingerprint_task(data_dir, params_file, sweep_trials)
    name = model_name(fp["cluster"])
    version = None if force else find_version(name, fp["pipeline_key"])
    trained = version is None
    if trained:
        version = train_task(data_dir, params_file, sweep_trials, sweep_timeout, fp["pipeline_key"])
        log.info("registered %s version %s", name, version)
    else:
        log.info("dataset and params unchanged: reusing %s version %s", name, version)
    out: dict[str, Any] = {"name": name, "version": version, "trained": trained, **fp}
    if gate:
        out["gate"] = gate_task(name, version, cluster_spec, policy, evaluate or {}, str(Path(reports_dir) / fp["cluster"] / f"v{version}"))
        create_markdown_artifact(markdown=decision_markdown(name, version, out["gate"]), key=f"retrain-{fp['cluster']}",
                                 description="Promotion gate decision")
    out["champion"] = registry.get_alias(name, "champion")
    return out
