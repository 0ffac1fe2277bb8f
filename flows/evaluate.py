"""``bandpilot-evaluate``: a model URI against a truth fabric -> report, figures, MLflow.

Scenarios are split into k-chunks run as Prefect tasks, so the task runner decides where they
run: threads by default, a Dask cluster with ``BANDPILOT_TASK_RUNNER=dask`` (or any Dask address
through prefect-dask). Chunks are merged into one report; scenarios depend only on (seed, k, r),
so the result is the same however it was split.
"""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE

from bandpilot.errors import BandPilotError
from flows._common import prepare, resolve, task_runner


@task(retries=1, retry_delay_seconds=2, cache_policy=NONE)
def evaluate_chunk_task(model_uri: str, cluster: str | None, truth: str | None, profiles: list[str], repeats: int,
                        seed: int, ks: list[int]):
    """One k-chunk, in-process (the task runner provides the parallelism)."""
    from bandpilot.evaluation.runner import evaluate, load_model
    from bandpilot.evaluation.truth import resolve_truth

    model = load_model(model_uri)
    fabric = resolve_truth(model.spec, truth=resolve(truth) if truth else None, cluster=resolve(cluster) if cluster else None)
    return evaluate(model, fabric, profiles=profiles, repeats=repeats, seed=seed, workers=1, ks=ks, figures=False)


def k_chunks(n_gpus: int, n: int) -> list[list[int]]:
    """Interleaved chunks (k = 1, 1+n, ...) so every chunk gets small and large requests alike."""
    n = max(1, min(n, n_gpus))
    return [list(range(1 + i, n_gpus + 1, n)) for i in range(n)]


@flow(name="bandpilot-evaluate", log_prints=True)
def evaluate_flow(
    model_uri: str,
    cluster: str | None = None,
    truth: str | None = None,
    profiles: list[str] = ["idle", "moderate", "heavy"],  # noqa: B006 - Prefect copies parameters
    repeats: int = 10,
    seed: int = 0,
    chunks: int = 4,
    out_dir: str = "reports/evaluate",
    log_mlflow: bool = True,
) -> dict[str, Any]:
    prepare()
    from bandpilot.evaluation.report import markdown_table
    from bandpilot.evaluation.result import merge_results
    from bandpilot.evaluation.runner import load_model

    model = load_model(model_uri)
    futures = [
        evaluate_chunk_task.submit(model_uri, cluster, truth, list(profiles), repeats, seed, ks)
        for ks in k_chunks(model.spec.n_gpus, chunks)
    ]
    res = merge_results([f.result() for f in futures])
    report = res.write(resolve(out_dir))
    if log_mlflow:
        try:
            res.log_to_mlflow(None)
        except BandPilotError as exc:  # a path model has no registry run; the report still stands
            get_run_logger().warning("not logged to MLflow: %s", exc)
    table = markdown_table(res.gbe_table())
    create_markdown_artifact(markdown=f"# Evaluation of {model_uri}\n\nMean GBE (%) vs the exact optimum\n\n{table}\n\n"
                             f"Report: `{report}`", key="evaluation")
    return {"report": str(report), "gbe": res.summary()["gbe"], "scenarios": res.n_scenarios}


def evaluate_flow_with_runner(**kwargs: Any) -> dict[str, Any]:
    """Run :func:`evaluate_flow` on the configured task runner (``BANDPILOT_TASK_RUNNER``)."""
    return evaluate_flow.with_options(task_runner=task_runner())(**kwargs)
