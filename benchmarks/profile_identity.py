"""Do the named scheduler profiles decide exactly what the same configurations decided before them?

    python -m benchmarks.profile_identity record --out before.json   # on a checkout before the change
    python -m benchmarks.profile_identity record --out after.json    # on this one
    python -m benchmarks.profile_identity compare before.json after.json

``record`` simulates several workloads (the 200-job mixed workload cut to ``--jobs``, seed 001's
50-job burst, Helios-shaped jobs) on several seeds under the ``recommended`` and ``slurm-like``
configurations, through the real queue and dispatcher (the truth as a perfect predictor, as
``bench_jct`` does), and writes every job's start, end, GPU set and preemption count, and each run's
batch count. ``compare`` fails (exit 1) unless every run, job, start time and GPU set is identical.
Nothing is written into the repository.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

#: (workload, seed) pairs: 25 per configuration, 50 queue runs in all.
RUNS = ([("mixed", s) for s in range(12)] + [("seed001", s) for s in range(8)] + [("helios", s) for s in range(5)])
CONFIGS = ("recommended", "slurm-like")


def _config(name: str, spec):
    """The simulator configuration of ``name``: the named profile where the checkout has profiles,
    else the same configuration as the flags spelled it (the simulator's defaults; ``--baseline slurm``)."""
    from bandpilot.simulation.engine import SimConfig

    try:
        from bandpilot.scheduling.profile import get_profile
    except ImportError:
        from bandpilot.simulation.presets import apply_preset

        return SimConfig() if name == "recommended" else apply_preset(SimConfig(), "slurm", spec)
    return SimConfig(profile=get_profile(name))


def _truth():
    """The measured H100 tables (``$BANDPILOT_DATA`` or ``../shared/data``), else the emulated H100 spec."""
    import os

    from bandpilot.fabric.emulator import make_fabric
    from bandpilot.topology.cluster import load_cluster

    for root in (os.environ.get("BANDPILOT_DATA"), ROOT.parent.parent / "shared" / "data", ROOT.parent / "shared" / "data"):
        d = Path(root or "") / "measurements" / "h100-16m"
        if root and d.is_dir():
            return make_fabric(load_cluster(d)), "measured H100 tables (h100-16m), perfect predictor"
    return make_fabric(load_cluster(ROOT / "params" / "clusters" / "h100.yaml")), "EMULATED H100, perfect predictor"


def _jobs(kind: str, seed: int, n: int):
    from bandpilot.simulation.workloads import mixed_workload, public_trace_workload, seed001_workload

    if kind == "mixed":
        return mixed_workload(n, seed=seed)
    if kind == "seed001":
        return seed001_workload(seed)
    return public_trace_workload("helios", n, n_gpus=32, load=0.9, seed=seed)


def record(out: Path, n: int, limit: int | None) -> None:
    from dataclasses import replace

    from bandpilot.dispatch.dispatcher import Dispatcher
    from bandpilot.simulation.engine import simulate

    truth, label = _truth()
    doc: dict = {"truth": label, "jobs_per_run": n, "runs": {}}
    t0 = time.perf_counter()
    for kind, seed in RUNS[:limit]:
        jobs = _jobs(kind, seed, n)
        for name in CONFIGS:
            cfg = replace(_config(name, truth.spec), seed=seed)
            res = simulate(jobs, Dispatcher(truth, seed=seed), truth, cfg)
            doc["runs"][f"{name}/{kind}/{seed}"] = {
                "batches": res.batches,
                "jobs": {j.id: [j.start_s, j.end_s, j.gpus, j.preemptions, j.status] for j in res.jobs}}
            print(f"{name}/{kind}/{seed}: {len(jobs)} jobs, {res.batches} batches "
                  f"({time.perf_counter() - t0:.0f} s)", file=sys.stderr, flush=True)
    out.write_text(json.dumps(doc, indent=0, sort_keys=True))


def compare(before: Path, after: Path) -> int:
    a, b = json.loads(before.read_text()), json.loads(after.read_text())
    if a["runs"].keys() != b["runs"].keys():
        print(f"different runs: {sorted(a['runs'].keys() ^ b['runs'].keys())[:5]}")
        return 1
    placements = batches = 0
    diffs: list[str] = []
    for key, ra in a["runs"].items():
        rb = b["runs"][key]
        batches += ra["batches"]
        if ra["batches"] != rb["batches"]:
            diffs.append(f"{key}: {ra['batches']} vs {rb['batches']} batches")
        for jid, ja in ra["jobs"].items():
            placements += ja[2] != ""
            if rb["jobs"].get(jid) != ja:
                diffs.append(f"{key} {jid}: {ja} vs {rb['jobs'].get(jid)}")
    print(f"{len(a['runs'])} queue runs, {batches} batches, {placements} placed jobs (start time + GPU set) compared: "
          f"{'identical' if not diffs else f'{len(diffs)} differences'}")
    for d in diffs[:20]:
        print("  " + d)
    return 1 if diffs else 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("record")
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--jobs", type=int, default=120, help="jobs per mixed / Helios-shaped run")
    r.add_argument("--limit", type=int, default=None, help="only the first N (workload, seed) pairs")
    c = sub.add_parser("compare")
    c.add_argument("before", type=Path)
    c.add_argument("after", type=Path)
    args = ap.parse_args(argv)
    if args.cmd == "record":
        record(args.out, args.jobs, args.limit)
        return 0
    return compare(args.before, args.after)


if __name__ == "__main__":
    sys.exit(main())
