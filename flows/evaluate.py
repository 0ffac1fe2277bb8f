"""``bandpilot-evaluate``: a model URI against a truth fabric -> report, figures, MLflow."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE

from flows._common import prepare, resolve


@task(cache_policy=NONE)
def evaluate_task(
    model_uri: str, cluster: str | None, truth: str | None, profiles: list[str], repeats: int, seed: int,
    workers: int, out_dir: str,
) -> dict[str, Any]:
    from bandpilot import evaluation as ev

    model = ev.load_model(model_uri)
    truth_fabric = ev.resolve_truth(model.spec, truth=resolve(truth) if truth else None, cluster=resolve(cluster) if cluster else None)
    res = ev.evaluate(model, truth_fabric, profiles=profiles, repeats=repeats, seed=seed, workers=workers, out_dir=resolve(out_dir))
    report = ev.write_report(res, resolve(out_dir))
    try:
        ev.log_to_mlflow(res, None)
    except Exception as exc:  # a path model has no run to attach to; the report still stands
        get_run_logger().warning("not logged to MLflow: %s", exc)
    return {"report": str(report), "summary_md": ev.markdown_table(res.summary()) if hasattr(res, "summary") else ""}


@flow(name="bandpilot-evaluate", log_prints=True)
def evaluate_flow(
    model_uri: str,
    cluster: str | None = None,
    truth: str | None = None,
    profiles: list[str] = ["idle", "moderate", "heavy"],  # noqa: B006 - Prefect parameters are copied
    repeats: int = 10,
    seed: int = 0,
    workers: int = 2,
    out_dir: str = "reports/evaluate",
) -> dict[str, Any]:
    prepare()
    out = evaluate_task(model_uri, cluster, truth, list(profiles), repeats, seed, workers, out_dir)
    create_markdown_artifact(markdown=f"# Evaluation of {model_uri}\n\n{out['summary_md']}\n\nReport: `{out['report']}`", key="evaluation")
    return out
