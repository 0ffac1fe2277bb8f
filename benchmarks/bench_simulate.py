"""Workload simulation: job completion time by queue policy and placement algorithm.

    python -m benchmarks simulate            # or: python -m benchmarks.bench_simulate [--seeds 10] [--scale-jobs 10000]
    python -m benchmarks.bench_simulate --seeds 0 --scale-jobs 0 --scale-surrogate 1000   # the surrogate scale run alone

1. Seed 001's 50-job workload (:func:`bandpilot.simulation.workloads.seed001_workload`, one trace per
   seed) on the physical H100 configuration: the measured h100-16m tables as the truth when
   ``../shared/data`` is present (else the emulated ``params/clusters/h100.yaml``, labelled), a
   surrogate trained here on the same tables (params/train.yaml) as the dispatcher's model. A table
   like seed 001's Tables 4-5 for fifo / sjf / utility x bandpilot / topo: mean, p50, p95, max JCT,
   queueing delay, service time, makespan (hours, means over seeds), and the utility policy at two
   other values of lambda (sensitivity, not tuning: the default stays 0.5).
   Target: utility + bandpilot lowers mean JCT vs fifo + topo by >= 25 % and p95 by >= 20 %.
2. Scale: a Helios-shaped trace of ``--scale-jobs`` jobs on the 1,024-GPU emulated cluster
   (``params/clusters/h100-128.yaml``), fifo + bandpilot with the emulator as a perfect predictor
   Target: 10,000 jobs in <= 10 minutes on 2 cores. Then ``--scale-surrogate`` jobs of it with a
   surrogate trained here on the emulated 128-host cluster (issue 24: 10,000 jobs in <= 300 s), on
   ``--queue default`` (the recommended queue users run) or ``greedy`` (fifo + greedy backfill, the
   earlier figures); fewer than 10,000 jobs are extrapolated, labelled so. ``--seeds 0`` skips part 1.
Nothing is written into the repository.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bandpilot.config import setup_env  # noqa: E402
from bandpilot.dispatch.dispatcher import Dispatcher  # noqa: E402
from bandpilot.fabric.emulator import make_fabric  # noqa: E402
from bandpilot.scheduling.profile import RECOMMENDED, SchedulerProfile  # noqa: E402
from bandpilot.simulation.engine import SimConfig, simulate  # noqa: E402
from bandpilot.simulation.report import summarize  # noqa: E402
from bandpilot.simulation.workloads import public_trace_workload, seed001_workload  # noqa: E402
from bandpilot.topology.cluster import load_cluster  # noqa: E402
from benchmarks.bench_surrogate import data_root, h100_dataset  # noqa: E402

CELLS = [("fifo", "topo"), ("fifo", "bandpilot"), ("sjf", "topo"), ("sjf", "bandpilot"), ("utility", "topo"), ("utility", "bandpilot")]
H = 3600.0


def h100_setup(threads: int):
    """(surrogate, truth fabric, label): trained on the measured tables when present."""
    from bandpilot.model.params import TrainParams
    from bandpilot.model.train import train

    ds, src = h100_dataset()
    t0 = time.perf_counter()
    params = TrainParams.load(ROOT / "params" / "train.yaml", {"threads": threads}).as_dict()
    res = train(ds, params, plots=False)
    print(f"surrogate trained on {src} in {time.perf_counter() - t0:.1f} s: test R² {res.metrics['test_r2']:.3f}, "
          f"MAPE {res.metrics['test_mape']:.2f} %", file=sys.stderr, flush=True)
    root = data_root()
    if root is not None:
        truth = make_fabric(load_cluster(root / "measurements" / "h100-16m"))
        label = "measured H100 tables (h100-16m)"
    else:
        truth = make_fabric(load_cluster(ROOT / "params" / "clusters" / "h100.yaml"))
        label = "EMULATED H100 (params/clusters/h100.yaml; ../shared/data absent)"
    return res.surrogate, truth, label


def table_50(seeds: int, threads: int) -> str:
    model, truth, label = h100_setup(threads)
    rows: dict[tuple[str, str, float], list[dict]] = {}
    cells = [(p, a, 0.5) for p, a in CELLS] + [("utility", "bandpilot", 0.3), ("utility", "bandpilot", 0.7)]
    t0 = time.perf_counter()
    for s in range(seeds):
        jobs = seed001_workload(s)
        for p, a, lam in cells:
            res = simulate(jobs, Dispatcher(model, seed=s), truth, SimConfig(profile=SchedulerProfile(f"{p}-{a}", queue_sort=p, placement=a), lam=lam, seed=s))
            rows.setdefault((p, a, lam), []).append(summarize(res))
    wall = time.perf_counter() - t0

    def m(key: tuple, metric: str) -> float:
        return float(np.mean([r[metric] for r in rows[key]]))

    base = ("fifo", "topo", 0.5)
    out = [f"Truth: {label}; model: surrogate trained on it; {seeds} workload seeds (50 jobs each), dispatch every 60 s, "
           f"20 epochs per job; {len(cells) * seeds} simulations in {wall:.0f} s. Hours, means over seeds.", "",
           "| policy | algorithm | λ | mean JCT | p50 | p95 | max | queueing | service | makespan | GPU util | mean GBE | mean JCT vs fifo+topo | p95 vs fifo+topo |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for key in cells:
        p, a, lam = key
        d_mean = m(key, "avg_jct_s") / m(base, "avg_jct_s") - 1
        d_p95 = m(key, "p95_jct_s") / m(base, "p95_jct_s") - 1
        out.append(f"| {p} | {a} | {lam:g} | {m(key, 'avg_jct_s') / H:.2f} | {m(key, 'p50_jct_s') / H:.2f} | "
                   f"{m(key, 'p95_jct_s') / H:.2f} | {m(key, 'max_jct_s') / H:.2f} | {m(key, 'avg_queue_s') / H:.2f} | "
                   f"{m(key, 'avg_service_s') / H:.2f} | {m(key, 'makespan_s') / H:.2f} | {m(key, 'gpu_utilization'):.3f} | "
                   f"{m(key, 'mean_gbe'):.3f} | {d_mean:+.1%} | {d_p95:+.1%} |")
    ub = ("utility", "bandpilot", 0.5)
    d_mean = 1 - m(ub, "avg_jct_s") / m(base, "avg_jct_s")
    d_p95 = 1 - m(ub, "p95_jct_s") / m(base, "p95_jct_s")
    ok = "met" if d_mean >= 0.25 and d_p95 >= 0.20 else "MISSED"
    per_seed = [1 - a["avg_jct_s"] / b["avg_jct_s"] for a, b in zip(rows[ub], rows[base])]
    word = lambda d: f"{'reduced' if d >= 0 else 'RAISED'} by {abs(d):.1%}"  # noqa: E731
    out += ["", f"Target utility+bandpilot vs fifo+topo: mean JCT {word(d_mean)} (target: reduced by >= 25 %), p95 "
                f"{word(d_p95)} (target: reduced by >= 20 %): {ok}. Per-seed mean-JCT reduction: "
                f"{', '.join(f'{x:+.1%}' for x in per_seed)}."]
    return "\n".join(out)


def scale(n_jobs: int) -> str:
    spec = load_cluster(ROOT / "params" / "clusters" / "h100-128.yaml")
    fab = make_fabric(spec)
    jobs = public_trace_workload("helios", n_jobs, n_gpus=spec.n_gpus, load=0.9, seed=0)
    t0 = time.perf_counter()
    res = simulate(jobs, Dispatcher(fab), fab, SimConfig(profile=SchedulerProfile("fifo-greedy-bandpilot")))
    wall = time.perf_counter() - t0
    s = summarize(res)
    ok = "met" if wall <= 600 else "MISSED"
    extra = "" if n_jobs >= 10_000 else f" (extrapolated linearly to 10,000 jobs: {wall * 10_000 / n_jobs:.0f} s)"
    return (f"{n_jobs} Helios-shaped jobs (load 0.9) on {spec.name} ({spec.n_gpus} GPUs, emulated; emulator as a perfect "
            f"predictor), fifo + bandpilot: {wall:.0f} s wall{extra}, {s['batches']} batches, {s['completed']} completed, "
            f"mean JCT {s['avg_jct_s'] / H:.2f} h, GPU utilization {s['gpu_utilization']:.2f}. "
            f"Target <= 600 s for 10,000 jobs: {ok if n_jobs >= 10_000 else 'see extrapolation'}.")


#: Queue configurations of the surrogate scale run: the recommended profile users run and the
#: fifo + greedy-backfill one measured before.
SCALE_QUEUES = {
    "default": SimConfig(profile=RECOMMENDED),
    "greedy": SimConfig(profile=SchedulerProfile("fifo-greedy-bandpilot")),
}


def _progress(label: str, t0: float, c0: float, every: int = 1000):
    """A progress hook: every ``every`` finished jobs one stderr line (wall, CPU, peak RSS, load) -
    a long run shows where its time goes, and how far it got if it is stopped."""
    import resource

    last = [0]

    def hook(done: int, n: int) -> None:
        if done >= last[0] + every or (done == n and done > last[0]):
            last[0] = done
            rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
            print(f"  {label}: {done}/{n} jobs done, {time.perf_counter() - t0:.0f} s wall, "
                  f"{time.process_time() - c0:.0f} CPU s, peak RSS {rss:.2f} GB, load {os.getloadavg()[0]:.1f}",
                  file=sys.stderr, flush=True)

    return hook


def scale_surrogate(n_jobs: int, threads: int, memo: bool = True, queue: str = "default", perfect: bool = True) -> str:
    """The scale run's first ``n_jobs`` jobs with a surrogate (params/train.yaml, trained here on 600
    emulated cross-host allocations of the 128-host cluster) instead of the perfect predictor.
    ``memo=False``: the surrogate's prediction memo off (every row through the net - the baseline).
    ``queue``: a key of :data:`SCALE_QUEUES`; ``perfect=False`` skips the perfect-predictor comparison
    run. Wall and CPU seconds of the simulation are reported (CPU: the share the machine's other
    jobs leave does not count), and the process's peak RSS."""
    import resource
    from bandpilot.data.synthetic import fabric_dataset
    from bandpilot.model.params import TrainParams
    from bandpilot.model.train import train

    spec = load_cluster(ROOT / "params" / "clusters" / "h100-128.yaml")
    fab = make_fabric(spec)
    t0 = time.perf_counter()
    res = train(fabric_dataset(fab, n_cross=600, seed=0), TrainParams.load(ROOT / "params" / "train.yaml", {"threads": threads}).as_dict(),
                plots=False)
    t_train = time.perf_counter() - t0
    jobs = public_trace_workload("helios", n_jobs, n_gpus=spec.n_gpus, load=0.9, seed=0)
    res.surrogate.memo_enabled = memo
    walls, cpus, runs = {}, {}, {}
    for label, model in (("surrogate", res.surrogate), ("perfect predictor", fab))[: 2 if perfect else 1]:
        t0, c0 = time.perf_counter(), time.process_time()
        runs[label] = simulate(jobs, Dispatcher(model), fab, SCALE_QUEUES[queue], progress=_progress(label, t0, c0))
        walls[label], cpus[label] = time.perf_counter() - t0, time.process_time() - c0
    s = walls["surrogate"]
    sr = summarize(runs["surrogate"])
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1e6
    vs = f" vs {walls['perfect predictor']:.0f} s with the perfect predictor" if perfect else ""
    measured = n_jobs >= 10_000
    ok = ("met" if s <= 300 else "MISSED") if measured else "not measured at 10,000 jobs"
    cfg = SCALE_QUEUES[queue]
    return (f"{n_jobs} of the same jobs, queue {queue} ({cfg.profile.describe()}), with a trained surrogate (trained in {t_train:.0f} s; prediction memo "
            f"{'on' if memo else 'OFF'}): {s:.0f} s wall ({cpus['surrogate']:.0f} CPU s, {sr['batches']} batches, mean JCT "
            f"{sr['avg_jct_s'] / H:.2f} h, peak RSS {rss:.2f} GB){vs}"
            f"{'' if measured else f'; linear extrapolation to 10,000 jobs (not a measurement): {s * 10_000 / n_jobs:.0f} s'} "
            f"(issue 24 target for 10,000 jobs: <= 300 s, {ok}).")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--scale-jobs", type=int, default=10_000, help="0 skips the scale run")
    ap.add_argument("--scale-surrogate", type=int, default=1000, help="jobs of the scale run with a surrogate (0 skips)")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--memo", choices=["on", "off"], default="on", help="the surrogate's prediction memo (off: baseline)")
    ap.add_argument("--queue", choices=sorted(SCALE_QUEUES), default="default",
                    help="queue of the surrogate scale run: default (what users run) or greedy (fifo + greedy backfill, the earlier figures)")
    ap.add_argument("--perfect", choices=["on", "off"], default="on",
                    help="also run the surrogate scale run's jobs with the perfect predictor (off: the surrogate alone)")
    args = ap.parse_args()
    setup_env()
    import torch

    torch.set_num_threads(args.threads)
    print(f"Load average at start: {os.getloadavg()[0]:.1f}\n")
    if args.seeds:
        print(table_50(args.seeds, args.threads))
    if args.scale_jobs:
        print()
        print(scale(args.scale_jobs), flush=True)
    if args.scale_surrogate:
        print()
        print(scale_surrogate(args.scale_surrogate, args.threads, args.memo == "on", args.queue, args.perfect == "on"), flush=True)
    print(f"\nLoad average at end: {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
