"""What did a simulation show? ``summary.json`` (JCT, queueing, service, utilization, bandwidth
efficiency), ``jobs.csv`` (one row per job), ``timeline.csv`` and the figures (JCT CDF, queue vs
service bars, utilization and fragmentation over time), written atomically; one MLflow run each.

``mean_gbe`` here is the time-averaged ``B_achieved / B_ref`` of multi-GPU jobs while they run (1 =
every job always had the best idle-cluster bandwidth of its size), averaged over jobs.
"""

from __future__ import annotations

import csv
import io
import math
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from bandpilot.io import replaced_dir, write_json_atomic
from bandpilot.simulation.engine import SimResult

JOB_COLUMNS = ("id", "tenant", "k", "priority", "status", "submit_s", "start_s", "end_s", "queue_s", "service_s", "jct_s",
               "compute_s", "comm_fraction", "slowdown", "n_hosts", "b_ref_gbps", "b_standalone_gbps", "bw_efficiency",
               "final_utility", "gpus")


def _pct(x: np.ndarray, q: float) -> float:
    return float(np.percentile(x, q)) if x.size else math.nan


def summarize(res: SimResult) -> dict[str, Any]:
    done = [j for j in res.jobs if j.end_s is not None]
    jct = np.array([j.jct_s for j in done], dtype=float)
    qd = np.array([j.queue_s for j in done], dtype=float)
    sv = np.array([j.service_s for j in done], dtype=float)
    slow = np.array([j.service_s / j.compute_s for j in done], dtype=float)
    eff = np.array([j.bw_time / j.service_s for j in done if j.k >= 2 and j.b_ref > 0 and j.service_s], dtype=float)
    t0 = min((j.submit_s for j in res.jobs), default=0.0)
    end = max((j.end_s for j in done), default=t0)
    makespan = end - t0
    t = np.array(res.timeline["t"])
    busy = np.array(res.timeline["busy"])
    if t.size > 1 and makespan > 0:
        area = float(np.sum(busy[:-1] * np.diff(t)))
        util = area / (res.n_gpus * makespan)
        frag_t = np.array(res.timeline["stranded"]) / np.maximum(1.0, np.array(res.timeline["free"]))
        frag = float(np.sum(frag_t[:-1] * np.diff(t)) / max(t[-1] - t[0], 1e-9))
    else:
        util, frag = 0.0, 0.0
    return {
        "cluster": res.cluster, "gpus": res.n_gpus, "profile": res.config.profile.name,
        "policy": res.config.policy, "algorithm": res.config.profile.placement,
        "truth": res.truth, "model": res.model, "interval_s": res.config.interval_s, "epochs": res.config.epochs,
        "lambda": res.config.lam, "seed": res.config.seed, "demand": res.config.demand,
        "backfill": res.config.profile.backfill, "reservations": res.config.profile.reservations,
        "locality": res.config.profile.locality, "preempt": res.config.profile.preempt,
        "start_or_wait": res.config.profile.start_or_wait,
        "jobs": len(res.jobs), "completed": len(done),
        "rejected": sum(j.status == "rejected" for j in res.jobs), "stuck": sum(j.status == "stuck" for j in res.jobs),
        "avg_jct_s": float(jct.mean()) if jct.size else math.nan, "p50_jct_s": _pct(jct, 50), "p95_jct_s": _pct(jct, 95),
        "max_jct_s": float(jct.max()) if jct.size else math.nan,
        "avg_queue_s": float(qd.mean()) if qd.size else math.nan, "avg_service_s": float(sv.mean()) if sv.size else math.nan,
        "avg_slowdown": float(slow.mean()) if slow.size else math.nan, "makespan_s": makespan,
        "gpu_utilization": util, "mean_fragmentation": frag,
        "mean_gbe": float(eff.mean()) if eff.size else 1.0,
        "batches": res.batches, "wall_s": res.wall_s,
        "gpu_hours": float(sum(j.gpu_s or j.k * j.service_s for j in done)) / 3600.0,
        "elastic": res.config.elastic, "blind_growth": res.config.blind, "resize_s": res.config.resize_s,
        "resizes": int(sum(j.resizes for j in res.jobs)),
        "max_wait_s": float(qd.max()) if qd.size else math.nan,
        "preemptions": int(sum(j.preemptions for j in res.jobs)),
        "wasted_gpu_hours": float(sum(j.wasted_gpu_s for j in res.jobs)) / 3600.0,
    }


def jobs_csv(res: SimResult) -> str:
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(JOB_COLUMNS)

    def f(x: float | None, nd: int = 3) -> str:
        return "" if x is None else f"{x:.{nd}f}"

    for j in res.jobs:
        slow = j.service_s / j.compute_s if j.service_s is not None else None
        eff = j.bw_time / j.service_s if j.service_s and j.k >= 2 and j.b_ref > 0 else None
        w.writerow([j.id, j.tenant, j.k, j.priority, j.status, f(j.submit_s), f(j.start_s), f(j.end_s), f(j.queue_s),
                    f(j.service_s), f(j.jct_s), f(j.compute_s), f(j.comm_fraction, 4), f(slow, 4), j.n_hosts,
                    f(j.b_ref, 2), f(j.b_standalone, 2), f(eff, 4), f(j.final_utility, 4), j.gpus])
    return buf.getvalue()


def timeline_csv(res: SimResult) -> str:
    keys = list(res.timeline)
    rows = zip(*(res.timeline[k] for k in keys))
    return ",".join(keys) + "\n" + "".join(",".join(f"{v:g}" for v in r) + "\n" for r in rows)


def figure_axes(*args: Any, figsize: tuple[float, float] = (6, 4), **kw: Any) -> tuple[Any, Any]:
    """A figure off pyplot (no global state: sweeps draw from several threads), Agg canvas."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=figsize)
    return fig, fig.subplots(*args, **kw)


def label(res: SimResult) -> str:
    return res.config.profile.name


def _groups(results: Sequence[SimResult]) -> dict[str, list[SimResult]]:
    """Results by policy+algorithm (seeds pooled), in first-seen order."""
    out: dict[str, list[SimResult]] = {}
    for r in results:
        out.setdefault(label(r), []).append(r)
    return out


def plot_cdf(results: Sequence[SimResult], path: Path) -> Path:
    """JCT CDF per policy x algorithm (jobs of every seed pooled)."""
    fig, ax = figure_axes(figsize=(6, 4))
    for name, rs in _groups(results).items():
        jct = np.sort([j.jct_s / 3600 for r in rs for j in r.jobs if j.jct_s is not None])
        if jct.size:
            ax.step(jct, np.arange(1, jct.size + 1) / jct.size, where="post", label=name)
    ax.set_xlabel("job completion time (h)")
    ax.set_ylabel("CDF")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_breakdown(results: Sequence[SimResult], path: Path) -> Path:
    """Mean queueing delay and service time per policy x algorithm (means over seeds)."""
    groups = _groups(results)
    names = list(groups)
    x = np.arange(len(names))
    fig, ax = figure_axes(figsize=(max(4, 1.1 * len(names) + 2), 4))
    sums = {n: [summarize(r) for r in rs] for n, rs in groups.items()}
    q = [np.mean([s["avg_queue_s"] for s in sums[n]]) / 3600 for n in names]
    sv = [np.mean([s["avg_service_s"] for s in sums[n]]) / 3600 for n in names]
    ax.bar(x, q, label="queueing delay", color="#1f77b4")
    ax.bar(x, sv, bottom=q, label="service time", color="#ff7f0e")
    ax.set_xticks(x, names, rotation=30, ha="right", fontsize=8)
    ax.set_ylabel("mean time per job (h)")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def plot_timeline(res: SimResult, path: Path) -> Path:
    t = np.array(res.timeline["t"]) / 3600
    busy = np.array(res.timeline["busy"]) / max(1, res.n_gpus)
    free = np.array(res.timeline["free"])
    frag = np.array(res.timeline["stranded"]) / np.maximum(1.0, free)
    fig, (a1, a2) = figure_axes(2, 1, figsize=(7, 5), sharex=True)
    a1.step(t, busy, where="post", color="#2ca02c")
    a1.set_ylabel("GPU utilization")
    a1.set_ylim(0, 1.05)
    a2.step(t, frag, where="post", color="#d62728", label="stranded / free GPUs")
    a2.step(t, np.array(res.timeline["pending"]) / max(1.0, max(res.timeline["pending"] or [1])), where="post",
            color="#7f7f7f", alpha=0.6, label="pending (normalised)")
    a2.set_ylabel("fragmentation")
    a2.set_xlabel("time (h)")
    a2.legend(fontsize=8)
    a1.set_title(label(res))
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def write_outputs(res: SimResult, out_dir: str | Path, *, figures: bool = True) -> dict[str, Any]:
    """Write the report directory atomically (built beside it, then swapped in); returns the summary."""
    summary = summarize(res)
    with replaced_dir(out_dir) as tmp:
        write_json_atomic(tmp / "summary.json", summary)
        (tmp / "jobs.csv").write_text(jobs_csv(res))
        (tmp / "timeline.csv").write_text(timeline_csv(res))
        if figures:
            plot_cdf([res], tmp / "jct_cdf.png")
            plot_breakdown([res], tmp / "queue_service.png")
            plot_timeline(res, tmp / "utilization.png")
    return summary


def log_to_mlflow(summary: dict[str, Any], out_dir: str | Path, *, experiment: str = "bandpilot-simulation",
                  run_name: str | None = None) -> str:
    """One MLflow run per simulation: configuration as params, the metrics, the report directory."""
    import mlflow
    from mlflow.tracking import MlflowClient

    from bandpilot.model.registry import artifact_root_for

    client = MlflowClient()
    exp = client.get_experiment_by_name(experiment)
    exp_id = exp.experiment_id if exp is not None else client.create_experiment(
        experiment, artifact_location=artifact_root_for(mlflow.get_tracking_uri()))
    name = run_name or f"simulate-{summary['profile']}"
    run_id = client.create_run(exp_id, run_name=name).info.run_id
    try:
        for k in ("cluster", "gpus", "profile", "policy", "algorithm", "backfill", "reservations", "locality", "preempt",
                  "start_or_wait", "truth", "model", "interval_s", "epochs", "lambda", "seed"):
            client.log_param(run_id, k, str(summary[k])[:500])
        for k, v in summary.items():
            if isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(float(v)):
                client.log_metric(run_id, k, float(v))
        client.log_artifacts(run_id, str(out_dir), "simulation")
    finally:
        client.set_terminated(run_id)
    return run_id
