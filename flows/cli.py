"""``bandpilot pipeline`` (the main job) and ``bandpilot serve`` (scheduled deployments).

The orchestration layer adds these commands to the library's CLI through the
``bandpilot.commands`` entry point (``pyproject.toml``), so nothing in ``bandpilot`` imports ``flows``."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Optional

import typer



def register(app: typer.Typer) -> None:
    """Add ``pipeline`` and ``serve`` to the ``bandpilot`` command group."""
    app.command("pipeline")(pipeline_cmd)
    app.command("serve")(serve_cmd)
    app.command("stage")(stage_cmd)


def pipeline_cmd(
    params: Path = typer.Option(Path("params/pipeline.yaml"), "--params", help="Pipeline parameters (clusters, sampling, gate)."),
    task_runner: Optional[str] = typer.Option(None, "--task-runner", help="thread | dask (default from params)."),
) -> None:
    """Run the whole loop once: profile -> DVC -> train/sweep -> register -> evaluate -> promote -> dispatch."""
    from flows._common import cluster_sources, load_params, truth_line

    P = load_params(params)
    typer.echo(truth_line(cluster_sources(P["clusters"], str(params))))
    os.environ.setdefault("BANDPILOT_TASK_RUNNER", task_runner or str(P.get("task_runner", "thread")))
    from bandpilot import progress
    from flows.pipeline import pipeline_flow, summary_lines

    t0 = time.perf_counter()
    # The CLI's reporter (bandpilot/cli/reporting.py) prints a line per stage with elapsed time and
    # an estimate - rich bars on a terminal - on stderr; this outer stage carries the whole run's.
    with progress.stage("pipeline"):
        _start_local_prefect()
        results = pipeline_flow(params_file=str(params))
    for line in summary_lines(results):
        typer.echo(line)
    typer.echo(f"\npipeline finished in {time.perf_counter() - t0:.0f} s")


def _start_local_prefect() -> None:
    """Without PREFECT_API_URL the first flow starts a local Prefect API, which takes tens of seconds
    on a busy machine: started here, in a stage of its own, so the wait is announced. Prefect keeps
    one such server per process, and the flows reuse it."""
    from prefect.settings import PREFECT_API_URL, PREFECT_SERVER_EPHEMERAL_ENABLED

    if PREFECT_API_URL.value() or not PREFECT_SERVER_EPHEMERAL_ENABLED.value():
        return
    from bandpilot import progress
    from prefect.server.api.server import SubprocessASGIServer

    with progress.stage("local Prefect API (PREFECT_API_URL unset)"):
        SubprocessASGIServer().start()


def serve_cmd(
    params: Path = typer.Option(Path("params/pipeline.yaml"), "--params", help="Pipeline parameters and schedules."),
    dry_run: bool = typer.Option(False, "--dry-run", help="List the deployments and schedules without serving."),
) -> None:
    """Serve the scheduled deployments (nightly retrain, frequent dispatch) on the Prefect API in PREFECT_API_URL."""
    from flows.serve import deployments, serve_all

    if dry_run:
        for d in deployments(str(params)):
            sched = [str(getattr(s, "schedule", s)) for s in (d.schedules or [])]
            typer.echo(f"{d.flow_name}/{d.name}: {'; '.join(sched)} params={sorted(d.parameters)}")
        return
    if not os.environ.get("PREFECT_API_URL"):
        typer.echo("note: PREFECT_API_URL is not set; start `prefect server start` and export "
                   "PREFECT_API_URL=http://127.0.0.1:4200/api so the schedules persist", err=True)
    serve_all(str(params))


def stage_cmd(
    name: str = typer.Argument(..., metavar="NAME", help="train or evaluate"),
    params: Path = typer.Option(Path("params/pipeline.yaml"), "--params", help="Pipeline parameters (clusters, sweep, gate)."),
) -> None:
    """Run one stage of dvc.yaml for every cluster of the pipeline (what `dvc repro` runs)."""
    stages = ("train", "evaluate")
    if name not in stages:
        raise typer.BadParameter(f"unknown stage {name!r}: use one of {', '.join(stages)}", param_hint="NAME")
    from flows.stages import stage_flow

    typer.echo(f"{name}: wrote {stage_flow(name, str(params))}")
