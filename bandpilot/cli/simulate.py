"""``bandpilot simulate``, ``bandpilot workload`` and ``bandpilot queue report``: thin wrappers over
:mod:`bandpilot.simulation` and :func:`bandpilot.queue.report_entropy`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from bandpilot.cli.main import app
from bandpilot.cli.common import cli_store, echo_json
from bandpilot.cli.queue import JSON_OPT, STORE_OPT, queue_app
from bandpilot.errors import BandPilotError


@app.command("simulate")
def simulate_cmd(
    trace: Optional[Path] = typer.Option(None, "--trace", "-t", help="Trace CSV: id,submit_s,k,tenant,compute_s,comm_fraction[,priority,utility]."),
    sweep: Optional[Path] = typer.Option(None, "--sweep", help="SWEEP.yaml: traces x profiles x demand models x seeds."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster spec (YAML, measurement dir or name); default: the model's."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model URI, or `emulator` (the truth as a perfect predictor)."),
    truth: Optional[Path] = typer.Option(None, "--truth", help="Measured directory used as ground truth; default: the cluster's emulator."),
    profile: str = typer.Option("recommended", "--profile", "-p", help="Scheduler profile: recommended | slurm-like (FIFO, EASY backfill, compact placement) | fifo-greedy (FIFO, greedy backfill, compact), or a profile YAML file (docs/guide/profiles.md)."),
    interval: float = typer.Option(60.0, "--interval", help="Dispatch interval (simulated seconds)."),
    epochs: int = typer.Option(20, "--epochs", help="Entropy reports per job (epoch boundaries)."),
    lam: float = typer.Option(0.5, "--lambda", help="Entropy-guided utility: the balance between entropy level and progress."),
    seed: int = typer.Option(0, "--seed", help="Learning curves and random placement."),
    demand: str = typer.Option("full", "--demand", help="Co-tenant pressure: full (standalone bandwidth all the time) | comm (scaled by each job's communication fraction); the truth and the queue's predictor use the same."),
    elastic: str = typer.Option("auto", "--elastic", help="auto (default): on when some job of the trace declares min_k < max_k, else off (a trace without ranges runs exactly as with off) | on: per-epoch GPU quotas by utility within each job's min_k..max_k (trace columns), resized at epoch boundaries | off: every job is a fixed gang of k."),
    out: Path = typer.Option(..., "--out", "-o", help="Report directory."),
    log: bool = typer.Option(True, "--log/--no-log", help="Log each simulation as an MLflow run."),
    figures: bool = typer.Option(True, "--figures/--no-figures", help="Render the figures."),
) -> None:
    """Simulate a trace through the real queue and dispatcher: JCT, queueing delay, utilization."""
    if (trace is None) == (sweep is None):
        raise BandPilotError("give exactly one of --trace TRACE.csv or --sweep SWEEP.yaml")
    if sweep is not None:
        from bandpilot.simulation.sweep import load_sweep, run_sweep

        sw = load_sweep(sweep)
        _tracking(log)
        rows = run_sweep(sw, out, log=log, figures=figures, progress=lambda tag: typer.echo(f"done {tag}", err=True))
        typer.echo((out / "comparison.md").read_text())
        typer.echo(f"{len(rows)} simulations; comparison: {out / 'comparison.csv'}")
        return
    if model is None:
        raise BandPilotError("--model is required with --trace (a model URI, or `emulator`)")
    # The inputs are checked before MLflow, torch and the model start (seconds): the trace's own
    # lines now, its job sizes against the cluster once the cluster is known.
    _parse_trace(trace, n_gpus=None)
    if cluster is not None:
        from bandpilot.topology.cluster import resolve_spec

        resolve_spec(cluster)
    from bandpilot.simulation.elastic import elastic_for
    from bandpilot.simulation.engine import SimConfig
    from bandpilot.simulation.run import load_setup, run_one

    from bandpilot.scheduling.profile import get_profile

    cfg = SimConfig(profile=get_profile(profile), interval_s=interval, epochs=epochs, lam=lam, seed=seed, demand=demand)
    cfg.check()
    elastic_for(elastic, [])  # a bad --elastic: the one-line error before loading anything
    _tracking(log)
    setup = load_setup(model, cluster=cluster, truth=truth, seed=seed)
    jobs = _parse_trace(trace, n_gpus=setup.dispatcher.model.spec.n_gpus)  # all-or-nothing, before any run
    cfg = replace(cfg, elastic=elastic_for(elastic, jobs))
    _, s = run_one(jobs, setup, cfg, out, figures=figures, log=log)
    h = 3600.0
    typer.echo(
        f"{s['profile']} ({cfg.profile.describe()}) on {s['cluster']} ({s['truth']}, demand {s['demand']}): {s['completed']}/{s['jobs']} jobs, "
        f"mean JCT {s['avg_jct_s'] / h:.2f} h, p95 {s['p95_jct_s'] / h:.2f} h, queueing {s['avg_queue_s'] / h:.2f} h, "
        f"GPU utilization {s['gpu_utilization']:.2f}, mean GBE {s['mean_gbe']:.3f}"
        + (f", {s['resizes']} resizes" if s.get("elastic") else "")
    )
    typer.echo(f"report: {out / 'summary.json'}" + (f"  (MLflow run {s['mlflow_run_id']})" if "mlflow_run_id" in s else ""))


@app.command("workload")
def workload_cmd(
    kind: str = typer.Argument(..., help="seed001 | poisson | philly | helios | mixed"),
    out: Path = typer.Option(..., "--out", "-o", help="Trace CSV to write."),
    n: int = typer.Option(500, "--jobs", "-n", min=1, help="Jobs (poisson, philly, helios, mixed)."),
    gpus: int = typer.Option(32, "--gpus", min=1, help="Cluster size the load refers to."),
    load: float = typer.Option(0.9, "--load", help="Offered load (philly, helios)."),
    rate: float = typer.Option(20.0, "--rate", help="Arrivals per hour (poisson)."),
    seed: int = typer.Option(0, "--seed", help="Seed of the generated trace."),
) -> None:
    """Generate a trace: the entropy-guided scheduling paper's 50 jobs (seed001), Poisson arrivals, or a public trace's published shape."""
    from bandpilot.simulation import workloads as w
    from bandpilot.simulation.trace import write_trace

    if kind == "seed001":
        jobs = w.seed001_workload(seed)
    elif kind == "poisson":
        jobs = w.poisson_workload(n, rate_per_h=rate, sizes={1: 0.3, 2: 0.25, 4: 0.25, 8: 0.15, 16: 0.05}, seed=seed, max_k=gpus)
    elif kind == "mixed":
        jobs = w.mixed_workload(n, n_gpus=gpus, load=load, seed=seed)
    elif kind in w.PUBLIC_SHAPES:
        jobs = w.public_trace_workload(kind, n, n_gpus=gpus, load=load, seed=seed)
    else:
        raise BandPilotError(f"unknown workload {kind!r}: use seed001, poisson, mixed, {', '.join(w.PUBLIC_SHAPES)}")
    write_trace(jobs, out)
    typer.echo(f"wrote {len(jobs)} jobs to {out}")


@queue_app.command("report")
def report_cmd(
    job: str = typer.Argument(..., help="Job (= request) id."),
    entropy: float = typer.Option(..., "--entropy", help="Normalized predictive entropy in [0, 1] at this epoch boundary."),
    epoch: Optional[int] = typer.Option(None, "--epoch", min=0, help="Epoch number (default: the next one)."),
    lam: float = typer.Option(0.5, "--lambda", help="Utility balance between entropy level and progress."),
    store: Optional[str] = STORE_OPT,
    as_json: bool = JSON_OPT,
) -> None:
    """Report a job's normalized entropy; its entropy-guided utility is updated for the next batch."""
    from bandpilot import queue as q

    doc = {"job": job, "entropy": entropy, **({"epoch": epoch} if epoch is not None else {})}
    res = q.report_entropy(cli_store(store), doc, lam=lam)[0]
    if as_json:
        echo_json(res)
        return
    typer.echo(f"{job}: epoch {res['epoch']} entropy {res['entropy']:.4f} -> utility {res['utility']:.4f}")


def _tracking(log: bool) -> None:
    if log:
        from bandpilot.model import registry

        registry.tracking_setup()


def _parse_trace(path: Path, n_gpus: int | None):
    """The trace's jobs (imported here: the CLI starts without the simulator's trace parser)."""
    from bandpilot.simulation.trace import parse_trace

    return parse_trace(path, n_gpus=n_gpus)
