"""Which scheduler profile should an operator run? A sweep of traces x profiles x demand models x
seeds, fanned out on a thread pool, into one comparison table and figure.

SWEEP.yaml::

    cluster: h100                      # spec, measurement dir or embedded name (or omit: the model's)
    model: emulator                    # surrogate URI, or `emulator` (perfect predictor)
    truth: null                        # measured directory (optional), as `bandpilot evaluate --truth`
    traces: [a.csv, {generate: seed001}, {generate: helios, n: 500}]   # paths relative to the YAML
    profiles: [recommended, slurm-like, mine.yaml]   # named profiles or profile YAML files (docs/guide/profiles.md)
    demand: [full, comm]               # co-tenant pressure model (truth and predictor alike)
    seeds: [0, 1]                       # learning curves, random placement, generated traces
    interval_s: 60
    epochs: 20
    lambda: 0.5
    workers: 2                          # threads

Each cell is a full simulation with its own temporary store; every cell's report directory lands
under ``OUT/cells/``; ``OUT/comparison.{csv,md,png}`` compares them (means over seeds) and
``OUT/jct_cdf-TRACE.png`` / ``OUT/queue_service-TRACE.png`` show every profile of a trace.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np
import yaml

from bandpilot.errors import BandPilotError
from bandpilot.io import write_json_atomic, write_text_atomic
from bandpilot.scheduling import DEMAND_MODELS, ProfileError, SchedulerProfile, get_profile
from bandpilot.simulation.engine import SimConfig
from bandpilot.simulation.trace import TraceJob, parse_trace
from bandpilot.simulation.workloads import PUBLIC_SHAPES, public_trace_workload, seed001_workload

_KEYS = {"cluster", "model", "truth", "traces", "profiles", "seeds", "interval_s", "epochs", "lambda", "workers", "demand"}
GENERATED = ("seed001",) + tuple(PUBLIC_SHAPES)


class SweepError(BandPilotError):
    pass


@dataclass
class Sweep:
    cluster: str | None
    model: str
    truth: str | None
    traces: list[Any]  # Path or {"generate": kind, ...}
    profiles: list[SchedulerProfile]
    seeds: list[int]
    interval_s: float
    epochs: int
    lam: float
    workers: int
    base: Path
    demands: list[str] = dataclasses.field(default_factory=lambda: ["full"])


def load_sweep(path: str | Path) -> Sweep:
    """Read and check SWEEP.yaml; errors name the file and the key."""
    p = Path(path)
    if not p.is_file():
        raise SweepError(f"sweep file not found: {path}")
    try:
        doc = yaml.safe_load(p.read_text())
    except yaml.YAMLError as exc:
        raise SweepError(f"{path}: invalid YAML ({exc})") from None
    if not isinstance(doc, dict):
        raise SweepError(f"{path}: a sweep is a mapping of keys ({', '.join(sorted(_KEYS))})")
    unknown = sorted(set(doc) - _KEYS)
    if unknown:
        raise SweepError(f"{path}: unknown key {unknown[0]!r} (known: {', '.join(sorted(_KEYS))})")

    def names(key: str, allowed: tuple[str, ...], default: list[str]) -> list[str]:
        v = doc.get(key, default)
        if isinstance(v, str):
            v = [v]
        if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
            raise SweepError(f"{path}: '{key}' must be a non-empty list of names")
        bad = [x for x in v if x not in allowed]
        if bad:
            raise SweepError(f"{path}: {key}: unknown {bad[0]!r} (use {', '.join(allowed)})")
        return list(dict.fromkeys(v))

    traces = doc.get("traces")
    if not isinstance(traces, list) or not traces:
        raise SweepError(f"{path}: 'traces' must be a non-empty list of CSV paths or {{generate: KIND}} entries")
    out_traces: list[Any] = []
    for i, t in enumerate(traces):
        if isinstance(t, str):
            tp = (p.parent / t) if not Path(t).is_absolute() else Path(t)
            if not tp.is_file():
                raise SweepError(f"{path}: traces[{i}]: trace file not found: {t}")
            out_traces.append(tp)
        elif isinstance(t, dict) and t.get("generate") in GENERATED and set(t) <= {"generate", "n", "load"}:
            out_traces.append(dict(t))
        else:
            raise SweepError(f"{path}: traces[{i}]: use a CSV path or {{generate: {'|'.join(GENERATED)}[, n, load]}}")
    seeds = doc.get("seeds", [0])
    if isinstance(seeds, int):
        seeds = [seeds]
    if not isinstance(seeds, list) or not seeds or not all(isinstance(s, int) and not isinstance(s, bool) for s in seeds):
        raise SweepError(f"{path}: 'seeds' must be a list of integers")
    model = doc.get("model")
    if not isinstance(model, str) or not model:
        raise SweepError(f"{path}: 'model' is required (a model URI, or `emulator`)")
    workers = doc.get("workers", 2)
    if isinstance(workers, bool) or not isinstance(workers, int) or workers < 1:
        raise SweepError(f"{path}: 'workers' must be an integer >= 1")
    cfg = SimConfig(interval_s=float(doc.get("interval_s", 60.0)), epochs=int(doc.get("epochs", 20)),
                    lam=float(doc.get("lambda", 0.5)))
    try:
        cfg.check()
    except BandPilotError as exc:
        raise SweepError(f"{path}: {exc}") from None
    cluster, truth = doc.get("cluster"), doc.get("truth")
    return Sweep(None if cluster is None else str(cluster), model, None if truth is None else str(truth), out_traces,
                 _profiles(path, p.parent, doc.get("profiles", ["recommended", "slurm-like"])),
                 list(dict.fromkeys(seeds)), cfg.interval_s, cfg.epochs, cfg.lam, workers, p.parent,
                 names("demand", DEMAND_MODELS, ["full"]))


def _profiles(path: str | Path, base: Path, v: Any) -> list[SchedulerProfile]:
    """The sweep's profiles: names, or YAML files relative to the sweep file; each one checked (and
    simulable) before anything runs."""
    if isinstance(v, str):
        v = [v]
    if not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v):
        raise SweepError(f"{path}: 'profiles' must be a non-empty list of profile names or YAML files")
    out: dict[str, SchedulerProfile] = {}
    for x in v:
        ref = str(base / x) if x.endswith((".yaml", ".yml")) and not Path(x).is_absolute() else x
        try:
            prof = get_profile(ref)
            SimConfig(profile=prof).check()
        except (ProfileError, BandPilotError) as exc:
            raise SweepError(f"{path}: profiles: {exc}") from None
        out.setdefault(prof.name, prof)
    return list(out.values())


def trace_jobs(t: Any, seed: int, n_gpus: int) -> tuple[str, list[TraceJob]]:
    if isinstance(t, Path):
        return t.stem, parse_trace(t, n_gpus=n_gpus)
    kind = t["generate"]
    if kind == "seed001":
        return "seed001", seed001_workload(seed)
    return kind, public_trace_workload(kind, int(t.get("n", 500)), n_gpus=n_gpus, load=float(t.get("load", 0.9)), seed=seed)


def _resolve(sw: Sweep, v: str | None) -> str | None:
    return None if v is None else (str(sw.base / v) if (sw.base / v).exists() else v)


Cell = tuple  # (trace index, seed, profile name, demand)


def plan_cells(sw: Sweep) -> tuple[dict[tuple[int, int], tuple[str, list[TraceJob]]], list[Cell]]:
    """Every trace parsed or generated up front (one bad line: nothing simulated) and the cells
    ``(trace index, seed, profile name, demand)``."""
    from bandpilot.simulation.run import load_setup

    first = load_setup(sw.model, cluster=_resolve(sw, sw.cluster), truth=_resolve(sw, sw.truth))
    n_gpus = first.dispatcher.model.spec.n_gpus
    traces = {(i, s): trace_jobs(t, s, n_gpus) for i, t in enumerate(sw.traces) for s in sw.seeds}
    cells = [(i, s, p.name, d) for i in range(len(sw.traces)) for s in sw.seeds for p in sw.profiles for d in sw.demands]
    return traces, cells


def run_cell(sw: Sweep, name: str, jobs: list[TraceJob], cell: Cell, out: Path, *,
             log: bool = False, figures: bool = True) -> tuple[dict[str, Any], Any]:
    """One simulation of the sweep (its own dispatcher and temporary store) -> (summary row, result)."""
    from bandpilot.simulation.run import load_setup, run_one

    i, s, p, d = cell
    prof = next(x for x in sw.profiles if x.name == p)
    setup = load_setup(sw.model, cluster=_resolve(sw, sw.cluster), truth=_resolve(sw, sw.truth), seed=s)
    cfg = SimConfig(profile=prof, interval_s=sw.interval_s, epochs=sw.epochs, lam=sw.lam, seed=s, demand=d)
    res, summ = run_one(jobs, setup, cfg, out / "cells" / f"{i}-{name}-s{s}-{p}-{d}", figures=figures, log=log)
    return {"trace": f"{i}-{name}", **summ}, res


def finish_sweep(done: list[tuple[dict[str, Any], Any]], out: Path, *, figures: bool = True) -> list[dict[str, Any]]:
    """The comparison table and figures from every cell's (row, result)."""
    rows = [r for r, _ in done]
    write_comparison(rows, out, figures=figures)
    if figures:
        from bandpilot.simulation.report import plot_breakdown, plot_cdf

        for t in dict.fromkeys(r["trace"] for r in rows):
            results = [res for r, res in done if r["trace"] == t]
            plot_cdf(results, out / f"jct_cdf-{t}.png")
            plot_breakdown(results, out / f"queue_service-{t}.png")
    return rows


def run_sweep(sw: Sweep, out: str | Path, *, log: bool = False, figures: bool = True,
              progress: Callable[[str], None] | None = None) -> list[dict[str, Any]]:
    """Every cell on a thread pool (``flows/simulate.py`` runs the same cells as Prefect tasks)."""
    out = Path(out)
    traces, cells = plan_cells(sw)

    def one(cell: Cell) -> tuple[dict[str, Any], Any]:
        name, jobs = traces[cell[:2]]
        row, res = run_cell(sw, name, jobs, cell, out, log=log, figures=figures)
        if progress:
            progress(f"{row['trace']} seed {cell[1]} {'+'.join(map(str, cell[2:]))}")
        return row, res

    with ThreadPoolExecutor(max_workers=sw.workers, thread_name_prefix="simulate") as pool:
        done = list(pool.map(one, cells))
    return finish_sweep(done, out, figures=figures)


_METRICS = ("avg_jct_s", "p50_jct_s", "p95_jct_s", "max_jct_s", "avg_queue_s", "avg_service_s", "makespan_s",
            "gpu_utilization", "mean_gbe", "completed", "max_wait_s", "gpu_hours", "preemptions", "wasted_gpu_hours")


def comparison(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean over seeds per (trace, profile, demand)."""
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["trace"], r["profile"], r.get("demand", "full")), []).append(r)
    out = []
    for (t, p, d), rs in groups.items():
        row: dict[str, Any] = {"trace": t, "profile": p, "seeds": len(rs), "demand": d}
        for m in _METRICS:
            vals = [float(r[m]) for r in rs if r.get(m) is not None and math.isfinite(float(r[m]))]
            row[m] = float(np.mean(vals)) if vals else math.nan
        out.append(row)
    return out


def write_comparison(rows: list[dict[str, Any]], out: Path, *, figures: bool = True) -> list[dict[str, Any]]:
    table = comparison(rows)
    cols = ["trace", "profile", "seeds", "demand", *_METRICS]
    buf = io.StringIO()
    w = csv.DictWriter(buf, fieldnames=cols, lineterminator="\n", extrasaction="ignore")
    w.writeheader()
    w.writerows(table)
    write_text_atomic(out / "comparison.csv", buf.getvalue())
    write_text_atomic(out / "comparison.md", markdown(table))
    write_json_atomic(out / "cells.json", rows)
    if figures and table:
        _figure(table, out / "comparison.png")
    return table


def markdown(table: list[dict[str, Any]]) -> str:
    lines = ["| trace | profile | demand | mean JCT (h) | p50 (h) | p95 (h) | max (h) | queueing (h) | service (h) | makespan (h) | GPU util | mean GBE |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    h = lambda v: f"{v / 3600:.2f}"  # noqa: E731
    for r in table:
        lines.append(f"| {r['trace']} | {r['profile']} | {r.get('demand', 'full')} | "
                     f"{h(r['avg_jct_s'])} | {h(r['p50_jct_s'])} | "
                     f"{h(r['p95_jct_s'])} | {h(r['max_jct_s'])} | {h(r['avg_queue_s'])} | {h(r['avg_service_s'])} | "
                     f"{h(r['makespan_s'])} | {r['gpu_utilization']:.3f} | {r['mean_gbe']:.3f} |")
    return "\n".join(lines) + "\n"


def _figure(table: list[dict[str, Any]], path: Path) -> None:
    from bandpilot.simulation.report import figure_axes

    traces = list(dict.fromkeys(r["trace"] for r in table))
    fig, axes = figure_axes(1, len(traces), figsize=(max(5, 4.5 * len(traces)), 4), squeeze=False)
    for ax, t in zip(axes[0], traces):
        rs = [r for r in table if r["trace"] == t]
        x = np.arange(len(rs))
        ax.bar(x - 0.2, [r["avg_jct_s"] / 3600 for r in rs], 0.4, label="mean JCT")
        ax.bar(x + 0.2, [r["p95_jct_s"] / 3600 for r in rs], 0.4, label="p95 JCT")
        ax.set_xticks(x, [f"{r['profile']}/{r.get('demand', 'full')}" for r in rs],
                      rotation=35, ha="right", fontsize=8)
        ax.set_title(t, fontsize=9)
        ax.set_ylabel("hours")
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
