"""Elastic jobs: per-epoch GPU quotas by utility vs fixed gangs, by JCT.

    python -m benchmarks elastic             # or: python -m benchmarks.bench_elastic [--seeds 10]
    python -m benchmarks.bench_elastic --first-seed 10 --seeds 8 --only "best non-elastic"   # held-out seeds

Workload: seed 001's 50-job shape (:func:`~bandpilot.simulation.workloads.seed001_workload`: eight
job types, 20/50 epochs, a burst onto 32 GPUs), every job data-parallel with the stated range
``min_k = max(1, k / 4)``, ``max_k = min(2 k, 32)``, step 1, compute scaling efficiency 0.9 per
doubling (the simulator's default, :mod:`bandpilot.simulation.elastic`), declared in the trace so the
queue prices growth by it (``--scaling-pricing perfect``: the row priced as before), ``resize_s = 30``.
Elastic rows: the default (``fit-k`` admission, ``welfare`` pricing, resizes may relocate) and the variants as flags
(``idle``: seed 001's admission as written, into the GPUs idle now; ``srpt``: by estimated remaining
work, only longer jobs yield; ``srpt-suspend``: shortest remaining work first at 2 x min_k each, the
others suspended to 0 GPUs at their boundary; ``srpt-host``: the same without suspension; ``hesrpt-suspend``:
heSRPT shares by rank in remaining work; ``srpt-marginal``: srpt-suspend with each claim sized by marginal
gain on the job's priced speed curve; ``srpt-fill``: srpt-suspend whose round's leftover GPUs go to waiting
requests at a smaller legal size; ``no relocation``: resizes grow around the old GPUs only, the default
before; ``current-share``: growths priced from the collective share at the job's current size, a flag;
``fill-idle``: GPUs free when nothing waits offered to the jobs at a boundary, a flag).
``--scale N``: N Helios-shaped jobs on the emulated 1,024-GPU cluster instead (FIFO vs elastic, wall time).
Truth: the measured h100-16m tables when ``../shared/data`` is present, else the emulated H100
(labelled EMULATED); the dispatcher's model is the truth (a perfect predictor). Fixed-gang rows
ignore the ranges. Targets (issue 22): mean JCT >= 45 % below FIFO, p95 >= 25 % below, makespan
>= 15 % below; bandwidth-aware growth beats blind growth on mean JCT.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_jct import truth_fabric  # noqa: E402
from bandpilot.scheduling.profile import RECOMMENDED, SchedulerProfile  # noqa: E402
from bandpilot.dispatch.dispatcher import Dispatcher  # noqa: E402
from bandpilot.simulation.elastic import DEFAULT_SCALING, simulate  # noqa: E402
from bandpilot.simulation.engine import SimConfig  # noqa: E402
from bandpilot.simulation.report import summarize  # noqa: E402
from bandpilot.fabric.emulator import make_fabric  # noqa: E402
from bandpilot.simulation.workloads import public_trace_workload, seed001_workload  # noqa: E402
from bandpilot.topology.cluster import load_cluster  # noqa: E402

H = 3600.0
#: The recommended profile ordered by job utility: the queue the elastic rounds admit through.
UTILITY = replace(RECOMMENDED, name="recommended-utility", queue_sort="utility")


def plain(policy: str, **kw) -> SimConfig:
    """A fixed-gang baseline as the queue ran it before reservations (greedy backfill, no locality margin)."""
    return SimConfig(profile=SchedulerProfile(f"{policy}-greedy", queue_sort=policy), **kw)


CONFIGS = {
    "fifo (fixed gangs)": plain("fifo"),
    "sjf (fixed gangs)": plain("sjf"),
    "utility (fixed gangs)": plain("utility"),
    "best non-elastic (the default queue: hrrn + conservative 2 + start-or-wait + locality 0.5)": SimConfig(profile=RECOMMENDED),
    "elastic + utility": SimConfig(profile=UTILITY, elastic=True),
    "elastic + utility, perfect-scaling pricing (before)": SimConfig(profile=UTILITY, elastic=True, scaling_pricing="perfect"),
    # resizes grow around the old GPUs only (before relocation became the default)
    "elastic + utility, no relocation (before)": SimConfig(profile=UTILITY, elastic=True, relocate=False),
    "elastic + utility, self pricing": SimConfig(profile=UTILITY, elastic=True, pricing="self"),
    "elastic + utility, blind growth": SimConfig(profile=UTILITY, elastic=True, blind=True),
    "elastic + utility, min-k admission": SimConfig(profile=UTILITY, elastic=True, admission="min-k"),
    "elastic + utility, idle admission (seed 001's text)": SimConfig(profile=UTILITY, elastic=True, admission="idle"),
    "elastic + utility, srpt admission": SimConfig(profile=UTILITY, elastic=True, admission="srpt"),
    # shortest remaining work first, 2 x min_k each; suspension to 0 GPUs at a boundary, or not
    "elastic, srpt-suspend admission": SimConfig(profile=UTILITY, elastic=True, admission="srpt-suspend"),
    "elastic, srpt-host admission (no suspension)": SimConfig(profile=UTILITY, elastic=True, admission="srpt-host"),
    # heSRPT shares by rank in remaining work (the mean-JCT optimum for a speedup k^p), suspension below min_k
    "elastic, hesrpt-suspend admission": SimConfig(profile=UTILITY, elastic=True, admission="hesrpt-suspend"),
    # growths priced from the collective share at the current size (a flag), not the declared one
    "elastic + utility, current-share pricing": SimConfig(profile=UTILITY, elastic=True, current_share=True),
    "elastic, srpt-suspend admission, current-share pricing": SimConfig(profile=UTILITY, elastic=True,
                                                                      admission="srpt-suspend", current_share=True),
    # srpt-suspend with claims sized by marginal gain on each job's priced speed curve (a flag)
    "elastic, srpt-marginal admission, current-share pricing": SimConfig(profile=UTILITY, elastic=True,
                                                                       admission="srpt-marginal", current_share=True),
    # srpt-suspend whose round's leftover GPUs go to waiting requests at a smaller legal size (a flag)
    "elastic, srpt-fill admission, current-share pricing": SimConfig(profile=UTILITY, elastic=True,
                                                                   admission="srpt-fill", current_share=True),
    # GPUs free when nothing waits offered to the jobs at a boundary (running jobs keep their size), a flag
    "elastic, srpt-suspend admission, current-share pricing, fill-idle": SimConfig(
        profile=UTILITY, elastic=True, admission="srpt-suspend", current_share=True, fill_idle=True),
    "elastic + utility, fill-idle": SimConfig(profile=UTILITY, elastic=True, fill_idle=True),
    "elastic + utility, min-k admission, self pricing (before)": SimConfig(profile=UTILITY, elastic=True,
                                                                          admission="min-k", pricing="self"),
    "elastic + utility, min-k admission, self pricing, blind (before)": SimConfig(profile=UTILITY, elastic=True,
                                                                                 admission="min-k", pricing="self", blind=True),
    "elastic + utility, step = min_k": SimConfig(profile=UTILITY, elastic=True),
    "elastic + utility, step = min_k, blind growth": SimConfig(profile=UTILITY, elastic=True, blind=True),
    # the other demand model (co-tenant pressure scaled by the communication fraction), both sides
    "fifo (fixed gangs), demand comm": plain("fifo", demand="comm"),
    "elastic + utility, demand comm": SimConfig(profile=UTILITY, elastic=True, demand="comm"),
}
REF = "fifo (fixed gangs)"


def workload(seed: int, n_gpus: int, step: bool = False) -> list:
    """The stated ranges; ``step``: sizes are multiples of ``min_k`` (whole quarters of k)."""
    return [replace(j, min_k=max(1, j.k // 4), max_k=min(2 * j.k, n_gpus), k_step=max(1, j.k // 4) if step else None,
                    scaling=j.scaling or DEFAULT_SCALING)  # declared in the trace, so the queue prices growth by it
            for j in seed001_workload(seed)]


def scale(n_jobs: int, configs: list[str]) -> int:
    """Helios-shaped jobs (offered load 0.9, ranges ``k/4 .. 2k``) on the emulated 1,024-GPU
    ``h100-128`` with the emulator as a perfect predictor: FIFO fixed gangs vs elastic, wall time."""
    spec = load_cluster(ROOT / "params" / "clusters" / "h100-128.yaml")
    fab = make_fabric(spec)
    jobs = [replace(j, min_k=max(1, j.k // 4), max_k=min(2 * j.k, spec.n_gpus))
            for j in public_trace_workload("helios", n_jobs, n_gpus=spec.n_gpus, load=0.9, seed=0)]
    print(f"{n_jobs} Helios-shaped jobs on {spec.n_gpus} GPUs (emulated); load before {open('/proc/loadavg').read().split()[:3]}")
    out = {}
    for name in configs:
        t0, c0 = time.perf_counter(), time.process_time()
        out[name] = summarize(simulate(jobs, Dispatcher(fab, seed=0), fab, SCALE[name]))
        r = out[name]
        print(f"- {name}: mean JCT {r['avg_jct_s']:.0f} s, p95 {r['p95_jct_s']:.0f} s, makespan {r['makespan_s']:.0f} s, "
              f"{r['completed']}/{r['jobs']} done, {r.get('resizes', 0)} resizes, simulation {time.perf_counter() - t0:.0f} s wall, "
              f"{time.process_time() - c0:.0f} s CPU "
              f"(load {open('/proc/loadavg').read().split()[:3]})", flush=True)
    if "fifo" in out and "elastic" in out:
        rel = (out["elastic"]["avg_jct_s"] / out["fifo"]["avg_jct_s"] - 1) * 100
        print(f"elastic vs FIFO mean JCT: {rel:+.1f} % (target <= -25 %)")
    return 0


#: The scale run's configurations (``--scale N --scale-configs fifo,elastic``).
SCALE = {"fifo": plain("fifo"), "elastic": SimConfig(profile=UTILITY, elastic=True),
         "elastic-min-k-self": SimConfig(profile=UTILITY, elastic=True, admission="min-k", pricing="self"),
         "elastic-srpt": SimConfig(profile=UTILITY, elastic=True, admission="srpt"),
         "elastic-srpt-suspend": SimConfig(profile=UTILITY, elastic=True, admission="srpt-suspend"),
         "elastic-no-relocate": SimConfig(profile=UTILITY, elastic=True, relocate=False),
         "elastic-current-share": SimConfig(profile=UTILITY, elastic=True, current_share=True),
         "elastic-fill": SimConfig(profile=UTILITY, elastic=True, fill_idle=True),
         "elastic-srpt-suspend-cs": SimConfig(profile=UTILITY, elastic=True, admission="srpt-suspend", current_share=True),
         "elastic-srpt-suspend-cs-fill": SimConfig(profile=UTILITY, elastic=True, admission="srpt-suspend",
                                                   current_share=True, fill_idle=True),
         "elastic-srpt-marginal-cs": SimConfig(profile=UTILITY, elastic=True, admission="srpt-marginal", current_share=True),
         "elastic-srpt-fill-cs": SimConfig(profile=UTILITY, elastic=True, admission="srpt-fill", current_share=True)}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--seeds", type=int, default=10)
    ap.add_argument("--first-seed", type=int, default=0, help="seeds first..first+seeds-1 (held-out checks: e.g. 10)")
    ap.add_argument("--only", default="", help="comma-separated substrings: run only the configurations whose name has one "
                    "(FIFO and the rows the checks need are always run)")
    ap.add_argument("--scale", type=int, default=0, help="instead: N Helios-shaped jobs on the emulated 1,024-GPU cluster")
    ap.add_argument("--scale-configs", default="fifo,elastic", help=f"of {', '.join(SCALE)}")
    args = ap.parse_args()
    if args.scale:
        return scale(args.scale, args.scale_configs.split(","))
    truth, what = truth_fabric()
    print(f"truth: {what}; load before {open('/proc/loadavg').read().split()[:3]}\n")
    keep = [x for x in args.only.split(",") if x]
    need = (REF, "elastic + utility", "elastic + utility, blind growth", "elastic + utility, demand comm",
            "fifo (fixed gangs), demand comm")
    configs = {k: c for k, c in CONFIGS.items() if not keep or k in need or any(x in k for x in keep)}
    rows: dict[str, list[dict]] = {k: [] for k in configs}
    t0 = time.perf_counter()
    for s in range(args.first_seed, args.first_seed + args.seeds):
        jobs, stepped = workload(s, truth.spec.n_gpus), workload(s, truth.spec.n_gpus, step=True)
        for name, c in configs.items():
            wl = stepped if "step" in name else jobs
            rows[name].append(summarize(simulate(wl, Dispatcher(truth, seed=s), truth, replace(c, seed=s))))
    m = lambda k, key: float(np.mean([r[key] for r in rows[k]]))  # noqa: E731
    rel = lambda k, key: (m(k, key) / m(REF, key) - 1) * 100  # noqa: E731
    print(f"seed 001's 50 jobs, means over seeds {args.first_seed}..{args.first_seed + args.seeds - 1} (ref = {REF})\n")
    print("| configuration | mean JCT (h) | p95 (h) | makespan (h) | queueing (h) | service (h) | GPU-h | resizes | "
          "vs FIFO mean | vs FIFO p95 | vs FIFO makespan |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for k in configs:
        print(f"| {k} | {m(k, 'avg_jct_s') / H:.2f} | {m(k, 'p95_jct_s') / H:.2f} | {m(k, 'makespan_s') / H:.2f} | "
              f"{m(k, 'avg_queue_s') / H:.2f} | {m(k, 'avg_service_s') / H:.2f} | {m(k, 'gpu_hours'):.0f} | "
              f"{m(k, 'resizes'):.0f} | {rel(k, 'avg_jct_s'):+.1f} % | {rel(k, 'p95_jct_s'):+.1f} % | {rel(k, 'makespan_s'):+.1f} % |")
    e, b = "elastic + utility", "elastic + utility, blind growth"
    checks = [("mean JCT >= 45 % below FIFO", -rel(e, "avg_jct_s") >= 45, f"{rel(e, 'avg_jct_s'):+.1f} %"),
              ("p95 JCT >= 25 % below FIFO", -rel(e, "p95_jct_s") >= 25, f"{rel(e, 'p95_jct_s'):+.1f} %"),
              ("makespan >= 15 % below FIFO", -rel(e, "makespan_s") >= 15, f"{rel(e, 'makespan_s'):+.1f} %"),
              ("bandwidth-aware growth beats blind on mean JCT", m(e, "avg_jct_s") < m(b, "avg_jct_s"),
               f"{m(e, 'avg_jct_s') / H:.2f} h vs {m(b, 'avg_jct_s') / H:.2f} h")]
    c_e, c_f = "elastic + utility, demand comm", "fifo (fixed gangs), demand comm"
    print(f"\nunder demand `comm` (ref = its own FIFO): mean {(m(c_e, 'avg_jct_s') / m(c_f, 'avg_jct_s') - 1) * 100:+.1f} %, "
          f"p95 {(m(c_e, 'p95_jct_s') / m(c_f, 'p95_jct_s') - 1) * 100:+.1f} %, "
          f"makespan {(m(c_e, 'makespan_s') / m(c_f, 'makespan_s') - 1) * 100:+.1f} %")
    print()
    for name, ok, fig in checks:
        print(f"- {name}: {'met' if ok else 'MISSED'} ({fig})")
    print(f"\n({time.perf_counter() - t0:.0f} s; load after {open('/proc/loadavg').read().split()[:3]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
