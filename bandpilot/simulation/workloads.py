"""Which workloads can be simulated without downloading anything? Seeded generators of traces.

* :func:`seed001_workload` - the entropy-guided scheduling paper's 50-job workload: eight job types (J1-J3 fifty epochs,
  priority 1; J4-J6 twenty epochs, priority 2; J7-J8 twenty epochs, priority 3). The seed's
  Table 2 is not in the text we have, so models, sizes and epoch times are ours (vision models on
  MNIST ... Tiny ImageNet, sized for a 32-GPU cluster where the seed had 4 GPUs); the submission
  is a burst, as the seed's queueing delays (most of the JCT) imply.
* :func:`poisson_workload` - Poisson arrivals with a size mix and log-normal run times.
* :func:`public_trace_workload` - the published *shape* of public GPU-cluster traces as parameters:
  Microsoft Philly (Jeon et al., "Analysis of Large-Scale Multi-Tenant GPU Clusters for DNN
  Training Workloads", USENIX ATC'19) and SenseTime Helios (Hu et al., "Characterization and
  Prediction of Deep Learning Workloads in Large-Scale GPU Datacenters", SC'21): most jobs use
  one GPU, multi-GPU jobs are powers of two and rarer as they grow, run times are heavy-tailed
  (log-normal, median of minutes to tens of minutes, a long tail of multi-hour jobs), and large
  jobs take most GPU time. The numbers below are approximations read off the papers' figures,
  not fitted to the raw traces.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np

from bandpilot.errors import BandPilotError
from bandpilot.simulation.trace import TraceJob


@dataclass(frozen=True)
class JobType:
    name: str
    model: str
    epochs: int
    epoch_s: float  # per-epoch compute time at the type's size on a best placement
    k: int
    comm_fraction: float
    priority: int
    count: int
    tenant: str


#: Seed-001-like job types for a 32-GPU cluster (4 x 8 H100); counts add up to 50.
SEED001_TYPES = (
    JobType("J1", "ResNet-50/Tiny-ImageNet", 50, 180.0, 16, 0.45, 1, 6, "vision"),
    JobType("J2", "ResNet-18/CIFAR-100", 50, 150.0, 8, 0.35, 1, 6, "vision"),
    JobType("J3", "VGG-16/CIFAR-10", 50, 140.0, 8, 0.50, 1, 6, "vision"),
    JobType("J4", "ResNet-18/CIFAR-10", 20, 150.0, 4, 0.30, 2, 7, "course"),
    JobType("J5", "MobileNetV2/CIFAR-100", 20, 120.0, 4, 0.20, 2, 7, "course"),
    JobType("J6", "DenseNet-121/Fashion-MNIST", 20, 90.0, 2, 0.25, 2, 6, "course"),
    JobType("J7", "LeNet-5/MNIST", 20, 45.0, 2, 0.15, 3, 6, "student"),
    JobType("J8", "CNN/Fashion-MNIST", 20, 40.0, 1, 0.10, 3, 6, "student"),
)


def seed001_workload(seed: int = 0, *, mean_gap_s: float = 120.0, jitter: float = 0.15) -> list[TraceJob]:
    """50 jobs of the eight types in random order, Poisson arrivals (mean gap ``mean_gap_s``),
    each job's compute time jittered by a log-normal of sigma ``jitter``."""
    rng = np.random.default_rng(seed)
    kinds = [t for t in SEED001_TYPES for _ in range(t.count)]
    order = rng.permutation(len(kinds))
    t = 0.0
    jobs = []
    for n, i in enumerate(order):
        jt = kinds[i]
        compute = jt.epochs * jt.epoch_s * float(rng.lognormal(0.0, jitter))
        jobs.append(TraceJob(f"{jt.name.lower()}-{n:02d}", round(t, 3), jt.k, jt.tenant, round(compute, 3),
                             jt.comm_fraction, jt.priority, epochs=jt.epochs))
        t += float(rng.exponential(mean_gap_s))
    return jobs


def poisson_workload(
    n: int, *, rate_per_h: float, sizes: dict[int, float], median_s: float = 1800.0, sigma: float = 1.0,
    comm: tuple[float, float] = (0.1, 0.6), tenants: int = 4, seed: int = 0, max_k: int | None = None,
) -> list[TraceJob]:
    """``n`` jobs, exponential inter-arrival times at ``rate_per_h``, sizes drawn from ``sizes``
    (``{k: weight}``), log-normal run times (median ``median_s``), comm fraction uniform in ``comm``
    (0 for 1-GPU jobs: nothing to synchronise)."""
    if n < 1 or rate_per_h <= 0 or not sizes:
        raise BandPilotError("poisson_workload needs n >= 1, a positive rate and a size mix")
    ks = np.array(sorted(sizes), dtype=np.int64)
    if max_k is not None:
        ks = ks[ks <= max_k]
    if ks.size == 0:
        raise BandPilotError(f"no job size in the mix fits {max_k} GPUs")
    p = np.array([sizes[int(k)] for k in ks], dtype=float)
    rng = np.random.default_rng(seed)
    gaps = rng.exponential(3600.0 / rate_per_h, size=n)
    gaps[0] = 0.0
    times = np.cumsum(gaps)
    k = rng.choice(ks, size=n, p=p / p.sum())
    dur = np.maximum(30.0, median_s * rng.lognormal(0.0, sigma, size=n))
    f = np.where(k > 1, rng.uniform(comm[0], comm[1], size=n), 0.0)
    ten = rng.integers(tenants, size=n)
    prio = rng.integers(0, 3, size=n)
    width = len(str(n - 1))
    return [
        TraceJob(f"job-{i:0{width}d}", round(float(times[i]), 3), int(k[i]), f"t{int(ten[i])}", round(float(dur[i]), 3),
                 round(float(f[i]), 4), int(prio[i]))
        for i in range(n)
    ]


#: Published shapes (approximate, see the module docstring): size mix {k: share of jobs}, log-normal
#: run time (median seconds, sigma).
PUBLIC_SHAPES = {
    # Philly (ATC'19): ~ 80 % single-GPU jobs; 2-4-8 GPU jobs most of the rest; few > 8.
    "philly": {"sizes": {1: 0.80, 2: 0.08, 4: 0.06, 8: 0.04, 16: 0.015, 32: 0.005}, "median_s": 900.0, "sigma": 1.6},
    # Helios (SC'21): single-GPU the majority of GPU jobs; multi-GPU jobs up to 64+ GPUs, with the
    # large ones (>= 8 GPUs) taking most GPU time; run-time median of minutes, long tail.
    "helios": {"sizes": {1: 0.60, 2: 0.10, 4: 0.10, 8: 0.12, 16: 0.05, 32: 0.025, 64: 0.005},
               "median_s": 600.0, "sigma": 1.8},
}


def offered_load(jobs: list[TraceJob], n_gpus: int) -> float:
    """The load a trace offers: GPU-seconds demanded (``k`` x ``compute_s``, summed) over the
    cluster's GPU-seconds in the arrival window (first to last submission)."""
    window = jobs[-1].submit_s - jobs[0].submit_s if jobs else 0.0
    if window <= 0 or n_gpus < 1:
        raise BandPilotError("offered load needs at least two submission times and n_gpus >= 1")
    return sum(j.k * j.compute_s for j in jobs) / (n_gpus * window)


def public_trace_workload(shape: str, n: int, *, n_gpus: int, load: float = 0.9, seed: int = 0) -> list[TraceJob]:
    """``n`` jobs with a public trace's shape whose arrivals offer ``load`` times the cluster's GPU
    capacity (``n_gpus``), as :func:`offered_load` measures it; sizes above the cluster are dropped.

    The rate is not taken from the shape's analytic mean GPU-seconds per job: with log-normal run
    times (sigma 1.6-1.8) and gangs up to 64 GPUs, a few thousand jobs' realised demand is far from
    it (2,000 Helios jobs on 1,152 GPUs, eight seeds: 0.65-1.77 for a nominal 0.9). The jobs are
    drawn as before and the Poisson arrival times scaled so that the window carries the realised
    demand at ``load`` (the arrivals of a Poisson process conditioned on that window)."""
    if shape not in PUBLIC_SHAPES:
        raise BandPilotError(f"unknown trace shape {shape!r}: use one of {', '.join(PUBLIC_SHAPES)}")
    if not 0 < load:
        raise BandPilotError(f"load must be > 0, got {load}")
    sh = PUBLIC_SHAPES[shape]
    sizes = {k: w for k, w in sh["sizes"].items() if k <= n_gpus}
    total = sum(sizes.values())
    mean_k = sum(k * w for k, w in sizes.items()) / total
    mean_dur = max(30.0, sh["median_s"] * float(np.exp(sh["sigma"] ** 2 / 2)))
    rate_per_h = load * n_gpus * 3600.0 / (mean_k * mean_dur)
    jobs = poisson_workload(n, rate_per_h=rate_per_h, sizes=sizes, median_s=sh["median_s"], sigma=sh["sigma"], seed=seed,
                            max_k=n_gpus)
    if n < 2:
        return jobs  # one arrival has no window to offer a load over
    scale = offered_load(jobs, n_gpus) / load
    return [replace(j, submit_s=round(j.submit_s * scale, 3)) for j in jobs]


def mixed_workload(n: int = 200, *, n_gpus: int = 32, load: float = 1.0, seed: int = 0,
                   preemptible_share: float = 0.5, estimate_error: float = 3.0) -> list[TraceJob]:
    """The mixed workload: sizes 1-32 (powers of two, capped at ``n_gpus``), heavy-tailed
    log-normal run times (median 40 min, sigma 1.2, 5 min to 24 h), comm fraction 0.2-0.7 for
    multi-GPU jobs, about ``preemptible_share`` preemptible (checkpoint + restart 1-5 min, a
    checkpoint every 30 min), and a ``time_limit_s`` off the true run time by a log-uniform factor
    within ``estimate_error`` either way (users pad, jobs end early). Arrivals Poisson at the rate
    that offers ``load`` times the cluster's GPU capacity."""
    if n < 1 or load <= 0 or estimate_error < 1:
        raise BandPilotError("mixed_workload needs n >= 1, load > 0 and estimate_error >= 1")
    sizes = {k: w for k, w in {1: 0.25, 2: 0.2, 4: 0.2, 8: 0.2, 16: 0.1, 32: 0.05}.items() if k <= n_gpus}
    rng = np.random.default_rng(seed)
    ks = np.array(sorted(sizes))
    p = np.array([sizes[int(k)] for k in ks], dtype=float)
    k = rng.choice(ks, size=n, p=p / p.sum())
    dur = np.clip(2400.0 * rng.lognormal(0.0, 1.2, size=n), 300.0, 86400.0)
    rate_per_s = load * n_gpus / float(np.mean(k * dur))
    gaps = rng.exponential(1.0 / rate_per_s, size=n)
    gaps[0] = 0.0
    times = np.cumsum(gaps)
    f = np.where(k > 1, rng.uniform(0.2, 0.7, size=n), 0.0)
    pre = rng.random(n) < preemptible_share
    ckpt = rng.uniform(60.0, 300.0, size=n)
    err = np.exp(rng.uniform(-np.log(estimate_error), np.log(estimate_error), size=n))
    ten = rng.integers(4, size=n)
    width = len(str(n - 1))
    return [
        TraceJob(f"mix-{i:0{width}d}", round(float(times[i]), 3), int(k[i]), f"t{int(ten[i])}", round(float(dur[i]), 3),
                 round(float(f[i]), 4), 0, None, round(float(dur[i] * err[i]), 3), bool(pre[i]),
                 round(float(ckpt[i]), 3) if pre[i] else None, 1800.0 if pre[i] else None)
        for i in range(n)
    ]
