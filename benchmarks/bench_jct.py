"""Jobs finish sooner: the scheduler profiles (order, backfill, locality, start-or-wait), by JCT.

    python -m benchmarks jct                 # or: python -m benchmarks.bench_jct [--seeds 2] [--only mixed,fifo,seed001,batch,plan,helios]

Truth: the measured h100-16m tables when ``../shared/data`` (or ``$BANDPILOT_DATA``) is present, else
the emulated ``params/clusters/h100.yaml`` (labelled EMULATED). The dispatcher's model is the truth
itself (a perfect predictor): this measures the scheduler, not the surrogate's error; it is said so
in every table. Nothing is written into the repository.

1. ``mixed``: the 200-job mixed workload (:func:`~bandpilot.simulation.workloads.mixed_workload`:
   sizes 1-32, log-normal run times 5 min - 24 h, ~half preemptible, time limits off by up to 3x
   either way, offered load 1.0), per seed, under the ``full`` demand model (and ``comm`` for the
   recommended profile). Targets: mean JCT >= 25 % below FIFO + topo (greedy), >= 15 % below
   the Slurm-like baseline; p95 >= 15 % below Slurm-like; max JCT no worse than Slurm-like's.
2. ``fifo``: placement alone, FIFO, greedy queue, no reservations: a held-out-shaped workload (120
   jobs, 2-16 GPUs, 0.5-4 h, comm 0.2-0.7, overloaded) and the mixed one, BandPilot (locality 0 and
   the recommended margin) vs topo, under both demand models. Target: never worse on mean and p95.
3. ``seed001``: seed 001's 50-job workload: the utility policy vs FIFO (target: no longer loses).
4. ``batch`` (only when asked): one batch with 1,000 pending requests and reservations on the
   emulated 1,152-GPU ``nvl72x16`` (target: <= 60 s).
5. ``plan`` (only when asked): the preemption plug-in's time per call on the mixed workload, then
   at scale on a full emulated ``nvl72x16`` with starving gangs of 8-288 GPUs (target: one plan <= 1 s p99).
6. ``helios`` (only when asked, minutes a run): 2,000 Helios-shaped jobs on the emulated
   ``nvl72x16`` at ``--load`` (0.9), ``fifo-greedy`` and ``recommended`` vs ``slurm-like``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bandpilot.dispatch.dispatcher import Dispatcher  # noqa: E402
from bandpilot.fabric.emulator import make_fabric  # noqa: E402
from bandpilot.scheduling.profile import FIFO_GREEDY, RECOMMENDED, SLURM_LIKE, SchedulerProfile  # noqa: E402
from bandpilot.simulation.engine import SimConfig, simulate  # noqa: E402
from bandpilot.simulation.report import summarize  # noqa: E402
from bandpilot.simulation.workloads import mixed_workload, poisson_workload, seed001_workload  # noqa: E402
from bandpilot.topology.cluster import load_cluster  # noqa: E402

H = 3600.0
#: The recommended profile before its second reservation and start-or-wait (hrrn + EASY), the reference
#: the two changes were measured against (docs/experiments/scheduler-profiles.md).
PREVIOUS = replace(RECOMMENDED, name="previous", backfill="easy", reservations=1, start_or_wait=False)
CONFIGS: list[str] = []  # --configs
FIRST_SEED = [0]  # --first-seed: held-out seeds confirm a choice made on others
LOAD = [0.9]  # --load: helios's offered load


def truth_fabric():
    root = Path(os.environ.get("BANDPILOT_DATA", ROOT.parent.parent / "shared" / "data"))
    for cand in (root, ROOT.parent / "shared" / "data"):
        d = cand / "measurements" / "h100-16m"
        if d.is_dir():
            return make_fabric(load_cluster(d)), "measured H100 tables (h100-16m), perfect predictor"
    return make_fabric(load_cluster(ROOT / "params" / "clusters" / "h100.yaml")), \
        "EMULATED H100 (params/clusters/h100.yaml; ../shared/data absent), perfect predictor"


def run(jobs, truth, cfg: SimConfig) -> dict:
    """One simulation's summary (the truth as a perfect predictor)."""
    return summarize(simulate(jobs, Dispatcher(truth, seed=cfg.seed), truth, cfg))


def label(p: SchedulerProfile) -> str:
    return f"{p.name}: {p.describe()}"


def sim(p: SchedulerProfile, **kw) -> SimConfig:
    return SimConfig(profile=p, **kw)


def table(rows: dict[str, list[dict]], ref: str | None = None) -> str:
    out = ["| configuration | mean JCT (h) | p95 (h) | max (h) | queueing (h) | service (h) | GPU util | preemptions | wasted GPU-h (% used) | vs ref mean | vs ref p95 |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    m = lambda k, key: float(np.mean([r[key] for r in rows[k]]))  # noqa: E731
    for k in rows:
        rel = ""
        if ref is not None and k != ref:
            rel = f"{(m(k, 'avg_jct_s') / m(ref, 'avg_jct_s') - 1) * 100:+.1f} % | {(m(k, 'p95_jct_s') / m(ref, 'p95_jct_s') - 1) * 100:+.1f} %"
        else:
            rel = " | "
        out.append(f"| {k} | {m(k, 'avg_jct_s') / H:.2f} | {m(k, 'p95_jct_s') / H:.2f} | {m(k, 'max_jct_s') / H:.2f} | "
                   f"{m(k, 'avg_queue_s') / H:.2f} | {m(k, 'avg_service_s') / H:.2f} | {m(k, 'gpu_utilization'):.2f} | "
                   f"{m(k, 'preemptions'):.1f} | {m(k, 'wasted_gpu_hours'):.1f} ({100 * m(k, 'wasted_gpu_hours') / max(m(k, 'gpu_hours'), 1e-9):.2f} %) | {rel} |")
    return "\n".join(out)


def mixed(truth, seeds: int) -> str:
    cfgs = {
        label(FIFO_GREEDY): FIFO_GREEDY,
        "fifo + bandpilot, greedy": SchedulerProfile("fifo-greedy-bandpilot"),
        "Slurm-like (FIFO + topo + EASY)": SLURM_LIKE,
        f"recommended: {RECOMMENDED.describe()}": RECOMMENDED,
        label(PREVIOUS): PREVIOUS,
        "recommended without start-or-wait (2 reservations)": replace(RECOMMENDED, name="no-wait", start_or_wait=False),
        "previous + start-or-wait (1 reservation)": replace(PREVIOUS, name="previous-wait", start_or_wait=True),
        "fifo + bandpilot (locality 0.5) + easy": SchedulerProfile("fifo-easy", backfill="easy", locality=0.5),
        "recommended + preempt": replace(RECOMMENDED, name="recommended-preempt", preempt=True),
    }
    if CONFIGS:  # a subset (keeps a run under ~5 min on a loaded machine); Slurm-like and the recommended row stay (the reference and the targets)
        cfgs = {k: v for k, v in cfgs.items() if k.startswith(("Slurm-like", "recommended")) or any(c in k for c in CONFIGS)}
    blocks = []
    for demand in ("full", "comm"):
        rows: dict[str, list[dict]] = {}
        for s in range(FIRST_SEED[0], FIRST_SEED[0] + seeds):
            jobs = mixed_workload(200, seed=s)
            for name, c in cfgs.items():
                rows.setdefault(name, []).append(run(jobs, truth, sim(c, seed=s, demand=demand)))
        blocks.append(f"demand model `{demand}` (means over {seeds} seeds from seed {FIRST_SEED[0]}; ref = Slurm-like)\n\n"
                      + table(rows, "Slurm-like (FIFO + topo + EASY)"))
        blocks.append(targets(rows))
    return "\n\n".join(blocks)


def targets(rows: dict[str, list[dict]]) -> str:
    m = lambda k, key: float(np.mean([r[key] for r in rows[k]]))  # noqa: E731
    rec = next(k for k in rows if k.startswith("recommended"))
    fifo, slurm = label(FIFO_GREEDY), "Slurm-like (FIFO + topo + EASY)"
    checks = [] if fifo not in rows else [
        ("mean JCT >= 25 % below FIFO + topo", m(rec, "avg_jct_s") <= 0.75 * m(fifo, "avg_jct_s"), m(rec, "avg_jct_s") / m(fifo, "avg_jct_s") - 1)]
    checks += [
        ("mean JCT >= 15 % below Slurm-like", m(rec, "avg_jct_s") <= 0.85 * m(slurm, "avg_jct_s"), m(rec, "avg_jct_s") / m(slurm, "avg_jct_s") - 1),
        ("p95 JCT >= 15 % below Slurm-like", m(rec, "p95_jct_s") <= 0.85 * m(slurm, "p95_jct_s"), m(rec, "p95_jct_s") / m(slurm, "p95_jct_s") - 1),
        ("max JCT no worse than Slurm-like", m(rec, "max_jct_s") <= m(slurm, "max_jct_s"), m(rec, "max_jct_s") / m(slurm, "max_jct_s") - 1),
        ("every job completes", all(r["completed"] == r["jobs"] for r in rows[rec]), 0.0),
    ]
    pre = next((k for k in rows if k.endswith("+ preempt")), None)
    if pre is not None:
        waste = m(pre, "wasted_gpu_hours") / max(m(pre, "gpu_hours"), 1e-9)
        checks += [
            ("with preemption: mean JCT >= 15 % below Slurm-like", m(pre, "avg_jct_s") <= 0.85 * m(slurm, "avg_jct_s"), m(pre, "avg_jct_s") / m(slurm, "avg_jct_s") - 1),
            ("with preemption: p95 JCT >= 15 % below Slurm-like", m(pre, "p95_jct_s") <= 0.85 * m(slurm, "p95_jct_s"), m(pre, "p95_jct_s") / m(slurm, "p95_jct_s") - 1),
            ("with preemption: max JCT no worse than Slurm-like", m(pre, "max_jct_s") <= m(slurm, "max_jct_s"), m(pre, "max_jct_s") / m(slurm, "max_jct_s") - 1),
            ("with preemption: wasted GPU-hours <= 2 % of GPU-hours used", waste <= 0.02, waste),
            ("with preemption: every job completes", all(r["completed"] == r["jobs"] for r in rows[pre]), 0.0),
        ]
    return "\n".join(f"- {name}: {'met' if ok else 'MISSED'} ({d * 100:+.1f} %)" for name, ok, d in checks)


#: placement alone: (name, profile) rows of the ``fifo`` part (FIFO, greedy queue, no reservations)
PLACEMENT_ROWS = (
    ("topo", SchedulerProfile("fifo-greedy-topo", placement="topo")),
    ("bandpilot, locality 0", SchedulerProfile("fifo-greedy-bandpilot")),
    ("bandpilot, locality 0.5", SchedulerProfile("fifo-greedy-local", locality=0.5)),
)


def fifo_placement(truth, seeds: int) -> str:
    blocks = []
    for wl in ("held-out shape (120 jobs, 2-16 GPUs)", "mixed (200 jobs)"):
        for demand in ("full", "comm"):
            rows: dict[str, list[dict]] = {}
            for s in range(seeds):
                jobs = (poisson_workload(120, rate_per_h=12, sizes={2: 1, 4: 1, 8: 1, 16: 1}, median_s=5400, sigma=0.5,
                                         comm=(0.2, 0.7), seed=s, max_k=32) if wl.startswith("held") else mixed_workload(200, seed=s))
                for name, c in PLACEMENT_ROWS:
                    if CONFIGS and name != "topo" and not any(x in name for x in CONFIGS):
                        continue
                    rows.setdefault(name, []).append(run(jobs, truth, sim(c, seed=s, demand=demand)))
            # the queue is chaotic (one placement shifts every later start): say how often each row beats topo
            wins = "\n".join(f"- {k}: mean below topo in {sum(r['avg_jct_s'] < t['avg_jct_s'] for r, t in zip(v, rows['topo']))}/{seeds} "
                              f"seeds; per seed mean / p95 (h): " + ", ".join(f"{r['avg_jct_s'] / H:.2f} / {r['p95_jct_s'] / H:.2f}" for r in v)
                              for k, v in rows.items())
            blocks.append(f"{wl}, demand `{demand}`, FIFO, greedy (means over {seeds} seeds; ref = topo)\n\n" + table(rows, "topo")
                          + f"\n\n{wins}")
    return "\n\n".join(blocks)


def seed001(truth, seeds: int) -> str:
    rows: dict[str, list[dict]] = {}
    for s in range(seeds):
        jobs = seed001_workload(s)
        for name, c in (("fifo + bandpilot, greedy", SchedulerProfile("fifo-greedy-bandpilot")),
                        ("utility + bandpilot, greedy", SchedulerProfile("utility-greedy", queue_sort="utility")),
                        ("recommended, fifo order", replace(RECOMMENDED, name="recommended-fifo", queue_sort="fifo")),
                        ("recommended, utility order", replace(RECOMMENDED, name="recommended-utility", queue_sort="utility")),
                        (f"recommended: {RECOMMENDED.describe()}", RECOMMENDED)):
            rows.setdefault(name, []).append(run(jobs, truth, sim(c, seed=s)))
    return f"seed 001's 50 jobs (means over {seeds} seeds; ref = fifo + bandpilot, greedy)\n\n" + table(rows, "fifo + bandpilot, greedy")


def batch_latency(truth, seeds: int) -> str:
    """One batch with 1,000 pending requests on the emulated nvl72x16 (1,152 GPUs), half the cluster
    busy with jobs that have time limits, under greedy / easy / conservative backfill."""
    import tempfile

    from bandpilot import queue as q
    from bandpilot import scheduling as sched
    from bandpilot.queue.clock import use_clock

    spec = load_cluster(ROOT / "params" / "clusters" / "nvl72x16.yaml")
    fab = make_fabric(spec)
    rng = np.random.default_rng(0)
    out = ["| backfill | pending | assigned | reservations | batch wall (s) |", "|---|---|---|---|---|"]
    for mode in ("greedy", "easy", "conservative"):
        with tempfile.TemporaryDirectory() as tmp, use_clock(lambda: 1000.0):
            store = q.Store(f"sqlite:///{tmp}/q.db")
            store.init_cluster(spec)
            busy = [{"id": f"run{i}", "k": 8, "time_limit_s": float(rng.uniform(600, 36000)), "submitted": 0} for i in range(72)]
            q.submit(store, busy)
            sched.run_batch(store, Dispatcher(fab), SchedulerProfile("bench", backfill="greedy", locality=0.5))
            sizes = rng.choice([1, 2, 4, 8, 16, 32, 64, 128], size=1000, p=[.3, .15, .15, .15, .1, .08, .05, .02])
            q.submit(store, [{"id": f"p{i}", "k": int(k), "time_limit_s": float(rng.uniform(300, 20000)), "submitted": 1 + i}
                             for i, k in enumerate(sizes)])
            t0 = time.perf_counter()
            depth = 16 if mode == "conservative" else 1
            rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("bench", queue_sort="hrrn", backfill=mode,
                                                                            reservations=depth, locality=0.5))
            wall = time.perf_counter() - t0
            out.append(f"| {mode} | {rep.pending_before} | {len(rep.assigned)} | {len(rep.reservations)} | {wall:.1f} |")
            store.close()
    return "nvl72x16 (1,152 GPUs, emulated, perfect predictor), 576 GPUs busy, 1,000 pending (target: <= 60 s)\n\n" + "\n".join(out)


def plan_latency(truth, seeds: int) -> str:
    """Time of the preemption plug-in per call on the mixed workload (hrrn + EASY + preempt on)."""
    import bandpilot.scheduling.preemption as pre

    calls, plans = [], []
    orig = pre.PreemptPostFilter.post_filter

    def timed(self, u):
        t0 = time.perf_counter()
        r = orig(self, u)
        dt = time.perf_counter() - t0
        calls.append(dt)
        if r is not None:
            plans.append(dt)
        return r

    pre.PreemptPostFilter.post_filter = timed
    try:
        for s in range(seeds):
            simulate(mixed_workload(200, seed=s), Dispatcher(truth, seed=s), truth,
                     sim(replace(RECOMMENDED, name="recommended-preempt", preempt=True), seed=s))
        h100 = _plan_line(f"preemption plug-in on {truth.spec.name} ({truth.spec.n_gpus} GPUs), {seeds} seeds", calls, plans)
        calls.clear()
        plans.clear()
        carried = plan_scale(seeds)
        assert carried == len(plans), (carried, len(plans))  # every plan returned was carried out (one process: no conflicts)
    finally:
        pre.PreemptPostFilter.post_filter = orig
    return h100 + "\n" + _plan_line(f"preemption plug-in on nvl72x16 (1,152 GPUs, emulated), {seeds} seeds x "
                                    f"{PLAN_ROUNDS} full clusters, {carried} plans carried out (each assigned its gang)", calls, plans)


def _plan_line(what: str, calls: list[float], plans: list[float]) -> str:
    a, b = np.array(calls) * 1e3, np.array(plans or [0.0]) * 1e3
    return (f"{what}: {len(a)} calls, "
            f"p99 {np.percentile(a, 99):.1f} ms, max {a.max():.1f} ms; {len(plans)} plans, p99 {np.percentile(b, 99):.1f} ms, "
            f"max {b.max():.1f} ms (target: one plan <= 1 s p99)")


PLAN_ROUNDS = 3  # fresh full clusters per seed on nvl72x16; a round ends at its first batch without a plan
PLAN_GANGS = (8, 16, 64, 72, 144, 288)  # starving gang sizes, each three times, in a shuffled order


def plan_scale(seeds: int) -> int:
    """Preemption at scale: the emulated nvl72x16 (1,152 GPUs, 16 NVLink domains) full - ~80 % of its
    GPUs held by preemptible jobs of mixed sizes that checkpoint, the rest by jobs that may not be
    evicted - started 6 h before starving gangs of 8-288 GPUs are batched under hrrn + conservative
    backfill + preempt on, one batch a minute, until a batch carries no plan out (preemption.MAX_PLANS:
    one a batch). Returns the plans carried out; asserts each started its gang and evicted only
    preemptible jobs (the timing is the caller's wrapper around the plug-in)."""
    import tempfile

    from bandpilot import queue as q
    from bandpilot import scheduling as sched
    from bandpilot.queue.clock import use_clock

    spec = load_cluster(ROOT / "params" / "clusters" / "nvl72x16.yaml")
    fab, carried = make_fabric(spec), 0
    for s in range(seeds):
        rng = np.random.default_rng(100 + s)
        for _ in range(PLAN_ROUNDS):
            with tempfile.TemporaryDirectory() as tmp:
                store = q.Store(f"sqlite:///{tmp}/q.db")
                store.init_cluster(spec)
                with use_clock(lambda: 0.0):
                    _fill_busy(store, spec, fab, rng)
                    q.submit(store, [{"id": f"gang{i}-{k}", "k": int(k), "submitted": 1, "time_limit_s": 4 * H}
                                     for i, k in enumerate(rng.permutation(PLAN_GANGS * 3))])
                for b in range(4 * len(PLAN_GANGS) * 3):
                    with use_clock(lambda: 6 * H + 60.0 * b):
                        rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("bench", queue_sort="hrrn", backfill="conservative", reservations=16, preempt=True))
                    out = {o.request_id: o for o in rep.outcomes}
                    for p in rep.preempted:
                        o = out[p["request_id"]]
                        assert o.status == "assigned" and len(o.gpus) == o.k, (p, o)
                        assert all(v.startswith("pre") for v in p["victims"]), p  # never a job that is not preemptible
                    carried += len(rep.preempted)
                    if not rep.preempted:
                        break
                assert q.check_invariants(store) == []
                store.close()
    return carried


def _fill_busy(store, spec, fab, rng) -> None:
    """~80 % of the GPUs to preemptible jobs (4-72 GPUs, checkpointing every 10-60 min), the rest but
    2 GPUs to jobs that may not be evicted; all placed by one greedy batch (largest first)."""
    from bandpilot import queue as q
    from bandpilot import scheduling as sched

    busy, used = [], 0
    while used < 0.8 * spec.n_gpus:
        k = int(rng.choice([4, 8, 12, 16, 32, 36, 72]))
        busy.append({"id": f"pre{len(busy)}", "k": k, "submitted": 0, "time_limit_s": float(rng.uniform(12, 48)) * H,
                     "preemptible": True, "checkpoint_s": float(rng.uniform(30, 300)),
                     "checkpoint_every_s": float(rng.choice([600, 1800, 3600]))})
        used += k
    busy.sort(key=lambda d: -d["k"])
    fixed = [{"id": f"fix{i}", "k": k, "submitted": 0, "time_limit_s": 48 * H}
             for i, k in enumerate(_fill_sizes(spec.n_gpus - used - 2, rng))]
    q.submit(store, busy + fixed)
    rep = sched.run_batch(store, Dispatcher(fab), SchedulerProfile("bench", backfill="greedy", locality=0.5))
    assert len(rep.assigned) == len(busy) + len(fixed), "the busy cluster did not fit"


def _fill_sizes(n: int, rng) -> list[int]:
    """Non-preemptible job sizes summing to ``n``, large first (small ones take the leftovers)."""
    out = []
    while n > 0:
        k = min(n, int(rng.choice([1, 2, 4, 8, 16])))
        out.append(k)
        n -= k
    return sorted(out, reverse=True)


def helios(truth, seeds: int) -> str:
    """The second workload: 2,000 Helios-shaped jobs (offered load ``--load``, 0.9 by default,
    realised exactly: :func:`~bandpilot.simulation.workloads.offered_load`) on the emulated 1,152-GPU
    ``nvl72x16`` (the emulator as truth and as a perfect predictor): FIFO + topo (greedy), the
    Slurm-like baseline and the default. Each run's line is printed as it ends (a seed takes minutes)."""
    from bandpilot.simulation.workloads import offered_load, public_trace_workload

    spec = load_cluster(ROOT / "params" / "clusters" / "nvl72x16.yaml")
    fab = make_fabric(spec)
    ref = "Slurm-like (FIFO + block + EASY)"
    cfgs = {label(FIFO_GREEDY): FIFO_GREEDY, ref: SLURM_LIKE, f"recommended: {RECOMMENDED.describe()}": RECOMMENDED}
    if CONFIGS:
        cfgs = {k: v for k, v in cfgs.items() if k == ref or any(c in k for c in CONFIGS)}
    rows: dict[str, list[dict]] = {}
    loads, floor = [], []
    for s in range(FIRST_SEED[0], FIRST_SEED[0] + seeds):
        jobs = public_trace_workload("helios", 2000, n_gpus=spec.n_gpus, load=LOAD[0], seed=s)
        # no schedule beats every job starting on arrival on an uncontended best placement
        floor.append(np.array([j.compute_s for j in jobs]))
        t = np.array([j.submit_s for j in jobs])
        k, d = np.array([j.k for j in jobs]), np.array([j.compute_s for j in jobs])
        # the share of the demand that falls inside the arrival window: the rest (the heavy tail) runs after arrivals stop
        inside = float((k * np.minimum(d, t[-1] - t)).sum() / (spec.n_gpus * t[-1]))
        loads.append(f"seed {s}: offered {offered_load(jobs, spec.n_gpus):.2f} over {t[-1] / H:.1f} h, {inside:.2f} inside it")
        for name, c in cfgs.items():
            t0 = time.perf_counter()
            rows.setdefault(name, []).append(summarize(simulate(jobs, Dispatcher(fab, seed=s), fab, sim(c, seed=s))))
            r = rows[name][-1]
            r["wall_s"] = time.perf_counter() - t0
            print(f"  seed {s} {name}: mean {r['avg_jct_s'] / H:.3f} h, p95 {r['p95_jct_s'] / H:.3f} h, max {r['max_jct_s'] / H:.2f} h, "
                  f"queueing {r['avg_queue_s'] / H:.3f} h, service {r['avg_service_s'] / H:.3f} h ({r['wall_s']:.0f} s)", flush=True)
    walls = ", ".join(f"{k}: {np.mean([r['wall_s'] for r in v]):.0f} s" for k, v in rows.items())
    fm, fp = np.mean([f.mean() for f in floor]) / H, np.mean([np.percentile(f, 95) for f in floor]) / H
    rm, rp = (float(np.mean([r[key] for r in rows[ref]])) / H for key in ("avg_jct_s", "p95_jct_s"))
    return (f"2,000 Helios-shaped jobs on {spec.name} ({spec.n_gpus} GPUs, emulated, perfect predictor), demand `full`, "
            f"load {LOAD[0]:g} ({'; '.join(loads)}); wall {walls}\n\n" + table(rows, ref)
            + f"\n\nfloor (every job starts on arrival, uncontended): mean {fm:.2f} h ({(fm / rm - 1) * 100:+.1f} % vs Slurm-like), "
              f"p95 {fp:.2f} h ({(fp / rp - 1) * 100:+.1f} %)")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--only", default="mixed,fifo,seed001")
    ap.add_argument("--first-seed", type=int, default=0, help="mixed, helios: the first seed (the run takes --seeds from it)")
    ap.add_argument("--load", type=float, default=0.9, help="helios: the offered load (GPU-seconds demanded / GPU-seconds in the arrival window)")
    ap.add_argument("--configs", default="", help="mixed, fifo, helios: only configurations whose name contains one of these (comma-separated)")
    args = ap.parse_args()
    CONFIGS[:] = [c for c in args.configs.split(",") if c]
    FIRST_SEED[0] = args.first_seed
    if args.load <= 0:
        ap.error(f"--load must be > 0, got {args.load}")
    LOAD[0] = args.load
    truth, what = truth_fabric()
    print(f"truth: {what}; load {open('/proc/loadavg').read().split()[:3]}\n")
    for part in args.only.split(","):
        t0 = time.perf_counter()
        print({"mixed": mixed, "fifo": fifo_placement, "seed001": seed001, "batch": batch_latency, "plan": plan_latency,
               "helios": helios}[part](truth, args.seeds))
        print(f"\n({part}: {time.perf_counter() - t0:.0f} s)\n", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
