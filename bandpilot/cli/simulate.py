"""``bandpilot simulate``, ``bandpilot workload`` and ``bandpilot queue report``: thin wrappers over
:mod:`bandpilot.simulation` and :func:`bandpilot.queue.report_entropy`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer

from bandpilot.cli.main import app
from bandpilot.dispatch import strategies
from bandpilot.cli.queue import JSON_OPT, STORE_OPT, _echo_json, _store, queue_app
from bandpilot.errors import BandPilotError
from bandpilot.scheduling import recommended as rec


@app.command("simulate")
def simulate_cmd(
    trace: Optional[Path] = typer.Option(None, "--trace", "-t", help="Trace CSV: id,submit_s,k,tenant,compute_s,comm_fraction[,priority,utility]."),
    sweep: Optional[Path] = typer.Option(None, "--sweep", help="SWEEP.yaml: traces x policies x algorithms x seeds."),
    cluster: Optional[str] = typer.Option(None, "--cluster", "-c", help="Cluster spec (YAML, measurement dir or name); default: the model's."),
    model: Optional[str] = typer.Option(None, "--model", "-m", help="Model URI, or `emulator` (the truth as a perfect predictor)."),
    truth: Optional[Path] = typer.Option(None, "--truth", help="Measured directory used as ground truth; default: the cluster's emulator."),
    policy: str = typer.Option(rec.POLICY, "--policy", "-p", help="fifo | priority | sjf | utility | hrrn | hrrn-aged (hrrn + starvation aging past 12 h) | hrrn-sized (the same, gangs over 16 GPUs from 18 h) | hrrn-jct (hrrn, a request expected past the 8 h cap ranked by wait + estimate) | las (least attained service; with --preempt on it evicts the most-attained preemptible jobs)"),
    algorithm: str = typer.Option("bandpilot", "--algorithm", "-a", help=strategies.help_text("simulate")),
    interval: float = typer.Option(60.0, "--interval", help="Dispatch interval (simulated seconds)."),
    epochs: int = typer.Option(20, "--epochs", help="Entropy reports per job (epoch boundaries)."),
    lam: float = typer.Option(0.5, "--lambda", help="Seed 001's utility balance between entropy level and progress."),
    seed: int = typer.Option(0, "--seed", help="Learning curves and random placement."),
    demand: str = typer.Option("full", "--demand", help="Co-tenant pressure: full (standalone bandwidth all the time) | comm (scaled by each job's communication fraction); the truth and the queue's predictor use the same."),
    backfill: str = typer.Option(rec.BACKFILL, "--backfill", help="greedy | easy (Slurm's EASY: the first blocked gang gets a reservation) | conservative (the first --reservations blocked gangs do)."),
    reservations: int = typer.Option(rec.RESERVATIONS, "--reservations", min=1, max=1024, help="Reservation depth under --backfill conservative: how many blocked gangs, in policy order, get a reservation (Maui's RESERVATIONDEPTH)."),
    locality: float = typer.Option(rec.LOCALITY, "--locality", help="Lifetime locality: a placement on fewer hosts wins unless spreading is predicted to gain more than this relative bandwidth (0 = always the best predicted now)."),
    placement_pricing: str = typer.Option(rec.PRICING, "--placement-pricing", help="How BandPilot values a placement: now (against the jobs running now) | lifetime (over its estimated run time: co-tenants that end, later cross-host jobs on its hosts from the arrival mix, the slowdown it imposes on co-tenants) | lifetime-queue (lifetime, and near-equal choices leave the next pending gangs their best placement)."),
    preempt: str = typer.Option(rec.PREEMPT, "--preempt", help="off | on | leader | overrun: a starving (waited 4 h) or higher-priority gang may evict preemptible jobs (cheapest checkpoint loss first, where it is predicted to get the most bandwidth); leader: only the first blocked gang, none behind a reservation; overrun: the first blocked gang, once it has waited 12 h, evicts only preemptible jobs past their time limit (each at most once)."),
    start_or_wait: str = typer.Option(rec.START_OR_WAIT, "--start-or-wait", help="off | on | local: a gang that could start now waits for a nearby job end when the better predicted placement saves more service time (comm fraction x bandwidth ratio x estimated run time) than the queueing it adds (at most 2 h; needs easy/conservative backfill); local: a gang that fits one host but was placed across hosts also waits for the nearest one-host placement within 2 h when that is shorter than its communicating share of run time (all its holds together: below that share and 4 h)."),
    age_slot: str = typer.Option(rec.AGE_SLOT, "--age-slot", help="off | oldest | projected | priced | overtaken: one reservation goes first to the longest-waiting request (oldest, Slurm's age order), to the largest projected JCT (wait + estimate, once past 30 h; priced: the first such whose drain idles no more GPU-hours than it brings) or to the request later-submitted jobs overtook most (overtaken: once they ran 8 h of the whole cluster while it waited), in place of the policy's last reservation slot (needs easy/conservative backfill; issue 21, the largest JCT)."),
    backfill_check: str = typer.Option(rec.BACKFILL_CHECK, "--backfill-check", help="set | replan | replan-waited | lend: set (default): a request may not take the planned GPUs of a reservation that starts before it ends; replan: it may, if every reservation it overlaps can be planned again at the same start on no more hosts (Slurm\'s \"does it delay a reserved job\" test); replan-waited: replan only for a request that has waited 8 h (issue 21, the largest JCT); lend: set, plus preemptible requests start on the reserved GPUs on loan until the reservation starts, when its gang reclaims them."),
    baseline: Optional[str] = typer.Option(None, "--baseline", help="A named baseline instead of --policy/--algorithm/--backfill: slurm (FIFO, EASY backfill, topo / block on NVLink domains) | greedy (this queue before reservations) | greedy-topo."),
    elastic: str = typer.Option("auto", "--elastic", help="auto (default): on when some job of the trace declares min_k < max_k, else off (a trace without ranges runs exactly as with off) | on: per-epoch GPU quotas by utility within each job's min_k..max_k (trace columns), resized at epoch boundaries | off: every job is a fixed gang of k."),
    blind_growth: bool = typer.Option(False, "--blind-growth", help="Elastic baseline: grow/shrink by GPU id, ignoring predicted bandwidth."),
    growth_pricing: str = typer.Option("welfare", "--growth-pricing", help="Elastic: welfare (a growth or admission size is priced by its total effect: the job's predicted epoch time plus what it imposes on the co-tenants of its NICs) | self (the job's own epoch time only; baseline)."),
    admission: str = typer.Option("fit-k", "--admission", help="Elastic: fit-k (a pending job is admitted while the requested k of every admitted one fits) | min-k (while its min_k fits, then every job that fits; baseline) | idle (seed 001's text: while its k fits the GPUs idle now; baseline) | srpt (by estimated remaining work: a newcomer claims half its k, only jobs with more remaining work yield to min_k) | srpt-suspend (shortest remaining work first, each claiming 2 x min_k up to a host; a running job left without GPUs is suspended to 0 at its epoch boundary and resumes later) | srpt-host (the same, running jobs keep min_k) | hesrpt-suspend (heSRPT shares by rank in remaining work, up to a host each; a running job whose share is below min_k is suspended) | srpt-marginal (srpt-suspend with each claim sized by marginal gain on the job's priced speed curve: the size minimising t(k)(1 + m k / G), m the jobs waiting behind it) | srpt-fill (srpt-suspend; GPUs the round leaves free while requests wait go to them, shortest remaining work first, each at the largest size up to its claim that fits one host)."),
    scaling_pricing: str = typer.Option("declared", "--scaling-pricing", help="Elastic: declared (a growth's compute share priced by the job's declared scaling efficiency, trace column `scaling`; undeclared: perfect) | perfect (every job priced as scaling perfectly; the pricing before)."),
    current_share: bool = typer.Option(False, "--current-share/--declared-share", help="Default declared (the declared collective share read as the share now). --current-share: a growth is priced from the job's collective share at its current size, derived from the declared share at its requested k (a flag: README issue 22)."),
    fill_idle: bool = typer.Option(False, "--fill-idle/--no-fill-idle", help="Default off. Elastic: GPUs still free after the round when no request waits are offered to the jobs at a boundary, shortest remaining work first, each growth priced as any (with the srpt rules, running jobs keep their size when nothing waits; a flag: README issue 22)."),
    relocate: bool = typer.Option(True, "--relocate/--no-relocate", help="Default on. Elastic: a resize may move the job onto a fresh placement (a growth onto an idle host; a job on several hosts onto one), priced like a growth."),
    resize_s: float = typer.Option(30.0, "--resize-s", help="Cost of one elastic resize (checkpoint-restart), seconds of the job's time."),
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

    cfg = SimConfig(policy=policy, algorithm=algorithm, interval_s=interval, epochs=epochs, lam=lam, seed=seed, demand=demand,
                    backfill=backfill, reservations=reservations, locality=locality, placement_pricing=placement_pricing,
                    blind=blind_growth, resize_s=resize_s, preempt=preempt, pricing=growth_pricing, admission=admission,
                    start_or_wait=start_or_wait, scaling_pricing=scaling_pricing, age_slot=age_slot,
                    backfill_check=backfill_check, relocate=relocate, current_share=current_share, fill_idle=fill_idle)
    cfg.check()
    elastic_for(elastic, [])  # a bad --elastic: the one-line error before loading anything
    _tracking(log)
    setup = load_setup(model, cluster=cluster, truth=truth, seed=seed)
    if baseline is not None:
        from bandpilot.simulation.presets import apply_preset

        cfg = apply_preset(cfg, baseline, setup.dispatcher.model.spec)
    jobs = _parse_trace(trace, n_gpus=setup.dispatcher.model.spec.n_gpus)  # all-or-nothing, before any run
    cfg = replace(cfg, elastic=elastic_for(elastic, jobs))
    _, s = run_one(jobs, setup, cfg, out, figures=figures, log=log)
    h = 3600.0
    typer.echo(
        f"{s['policy']}+{s['algorithm']}+{s['backfill']} on {s['cluster']} ({s['truth']}, demand {s['demand']}): {s['completed']}/{s['jobs']} jobs, "
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
    """Generate a trace: seed 001's 50 jobs, Poisson arrivals, or a public trace's published shape."""
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
    """Report a job's normalized entropy; its utility (seed 001) is updated for the next batch."""
    from bandpilot import queue as q

    doc = {"job": job, "entropy": entropy, **({"epoch": epoch} if epoch is not None else {})}
    res = q.report_entropy(_store(store), doc, lam=lam)[0]
    if as_json:
        _echo_json(res)
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
