"""Reading the dispatcher's state from a real Slurm: time per read on a 32-node x 8-GPU test cluster.

    python -m benchmarks.bench_slurm_state [--nodes 32] [--jobs 48] [--reads 40]

Starts the real-Slurm test cluster (tests/slurm/harness.py: munged, slurmctld, one slurmd per node
on this machine), fills it with sleeping jobs holding 1-4 GPUs on one or two nodes (uneven counts
as heterogeneous jobs), then times ``read_state`` in both forms, interleaved (text: ``scontrol -o
show node|job -d``; json: ``sinfo --json`` + ``squeue --json``). Each read is two Slurm client
calls plus the parse; the figures depend on the machine's load, printed with them.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
import time

import numpy as np
import yaml

from benchmarks.bench_surrogate import ROOT
from bandpilot.integrations.slurm.state import read_state
from bandpilot.topology.cluster import spec_from_dict


def fill(c, n_jobs: int, rng: random.Random) -> list[str]:
    """Sleeping jobs that never oversubscribe a node (every one of them runs)."""
    free = {n: 8 for n in c.nodes}
    jobs = []
    for _ in range(n_jobs):
        nodes = rng.sample([n for n in c.nodes if free[n]], rng.choice([1, 1, 2]))
        want = {n: rng.randint(1, min(4, free[n])) for n in nodes}
        for n, k in want.items():
            free[n] -= k
        jobs.append(c.hold(want, 3600))
    for j in jobs:
        c.wait_running(j, timeout=300)
    return jobs


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--jobs", type=int, default=48)
    ap.add_argument("--reads", type=int, default=40)
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from tests.slurm.harness import SlurmCluster, ensure_slurm

    reason = ensure_slurm()
    if reason:
        print(f"skipped: {reason}")
        return 0
    doc = yaml.safe_load((ROOT / "params" / "clusters" / "h100-64.yaml").read_text())
    doc["host_groups"][0]["count"] = args.nodes
    doc["name"] = f"h100-{args.nodes}"
    spec = spec_from_dict(doc)
    t0 = time.perf_counter()
    with SlurmCluster(tempfile.mkdtemp(prefix="bench-slurm-"), spec) as c:
        started = time.perf_counter() - t0
        fill(c, args.jobs, random.Random(1))
        times: dict[str, list[float]] = {"text": [], "json": []}
        snaps = {}
        for _ in range(args.reads):
            for form in times:
                t = time.perf_counter()
                snaps[form] = read_state(spec, env=c.env, form=form)
                times[form].append(time.perf_counter() - t)
        same = snaps["text"].state.to_dict() == snaps["json"].state.to_dict()
    load = os.getloadavg()[0]
    held = sum(len(j.gpus) for j in snaps["text"].state.jobs)
    print(f"{args.nodes} nodes x 8 GPUs (started in {started:.0f} s), {len(snaps['text'].state.jobs)} Slurm jobs holding "
          f"{held} GPUs, {args.reads} reads per form interleaved; load {load:.1f} on {os.cpu_count()} CPUs; "
          f"both forms give the same state: {same}\n")
    print("| form | p50 ms | p99 ms | max ms |\n|---|---:|---:|---:|")
    for form, ts in times.items():
        a = np.array(ts) * 1000
        print(f"| {form} | {np.percentile(a, 50):.0f} | {np.percentile(a, 99):.0f} | {a.max():.0f} |")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
