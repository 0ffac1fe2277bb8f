"""``bandpilot-simulate-sweep``: a SWEEP.yaml's cells (trace x seed x policy x algorithm) as Prefect
tasks, so the task runner decides where they run: threads by default, Dask with
``BANDPILOT_TASK_RUNNER=dask``. The cells and the comparison are the library's
(:mod:`bandpilot.simulation.sweep`); ``bandpilot simulate --sweep`` runs the same cells on a plain
thread pool."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE

from flows._common import prepare, resolve, task_runner


@task(cache_policy=NONE)
def simulate_cell_task(sweep_path: str, name: str, jobs: list, cell: tuple, out_dir: str, log_mlflow: bool) -> tuple:
    from bandpilot.simulation.sweep import load_sweep, run_cell

    return run_cell(load_sweep(sweep_path), name, jobs, tuple(cell), Path(out_dir), log=log_mlflow)


@flow(name="bandpilot-simulate-sweep", log_prints=True)
def simulate_sweep_flow(sweep: str, out_dir: str = "reports/simulate-sweep", log_mlflow: bool = True) -> dict[str, Any]:
    prepare()
    from bandpilot.simulation.sweep import finish_sweep, load_sweep, markdown, plan_cells, comparison

    path = str(resolve(sweep))
    sw = load_sweep(path)
    traces, cells = plan_cells(sw)  # every trace checked before any task runs
    out = resolve(out_dir)
    futures = [simulate_cell_task.submit(path, traces[c[:2]][0], traces[c[:2]][1], c, str(out), log_mlflow) for c in cells]
    rows = finish_sweep([f.result() for f in futures], out)
    create_markdown_artifact(markdown=f"# Simulation sweep {sweep}\n\n{markdown(comparison(rows))}", key="simulate-sweep")
    return {"cells": len(rows), "comparison": str(out / "comparison.csv")}


def simulate_sweep_flow_with_runner(**kwargs: Any) -> dict[str, Any]:
    """Run :func:`simulate_sweep_flow` on the configured task runner (``BANDPILOT_TASK_RUNNER``)."""
    return simulate_sweep_flow.with_options(task_runner=task_runner())(**kwargs)
