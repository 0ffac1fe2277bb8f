"""Submissions through real Slurm daemons: does Slurm grant exactly BandPilot's choice, and how long do
the state read and the placement take?

    python -m benchmarks slurm [--nodes 32] [--submissions 30] [--seed 0] [--busy 0.5] [--untyped]

Starts a Slurm cluster on this machine (tests/slurm/harness.py: munged, slurmctld, one slurmd per
node; ``--nodes`` hosts x 8 H100 of the built-in h100 spec, gres.conf with one type per GPU index
unless ``--untyped``, backfill every 2 s), then ``--submissions`` times: cancels every job, makes a
random busy state (one heterogeneous job holding 1-8 GPUs on each of a random ``--busy`` fraction of
the nodes), submits a job of k = 2-24 GPUs (every third with a parallelism shape) through
:func:`bandpilot.integrations.slurm.submit.submit` and reads back what Slurm granted.
Reported: the fraction whose granted nodes and per-node counts equal BandPilot's (target 100 %), the
fraction whose GPU indices do (per-index types promise 100 %; untyped gres promises none), and the
state read + placement time, p50 and p99 (targets <= 200 ms and <= 1 s), with the load.
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "slurm"))

from harness import SlurmCluster, ensure_slurm  # noqa: E402

from bandpilot.dispatch.dispatcher import Dispatcher  # noqa: E402
from bandpilot.fabric.emulator import make_fabric  # noqa: E402
from bandpilot.integrations.slurm.submit import read_live, submit  # noqa: E402
from bandpilot.topology.cluster import load_cluster  # noqa: E402

SHAPES = {4: "tp=2,dp=2", 6: "tp=2,dp=3", 8: "tp=4,dp=2", 12: "tp=4,dp=3", 16: "tp=8,dp=2", 24: "tp=8,dp=3"}


def spec_of(nodes: int, work: Path):
    text = (ROOT / "params" / "clusters" / "h100.yaml").read_text()
    text = re.sub(r"(?m)^name: h100$", f"name: h100x{nodes}", text)
    text = re.sub(r"(?m)^    count: 4$", f"    count: {nodes}", text)
    path = work / f"h100x{nodes}.yaml"
    path.write_text(text)
    return load_cluster(path)


def busy_state(c: SlurmCluster, rng: np.random.Generator, busy: float) -> None:
    c.cancel_all()
    chosen = rng.choice(len(c.nodes), size=max(1, round(len(c.nodes) * busy)), replace=False)
    hold = {c.nodes[i]: int(rng.integers(1, 9)) for i in sorted(chosen)}
    c.wait_running(c.hold(hold, seconds=3600), timeout=120)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--nodes", type=int, default=32)
    ap.add_argument("--submissions", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--busy", type=float, default=0.5, help="fraction of nodes holding 1-8 GPUs in each state")
    ap.add_argument("--untyped", action="store_true", help="gres.conf without per-index types")
    args = ap.parse_args(argv)
    reason = ensure_slurm()
    if reason:
        print(f"skipped: {reason}")
        return 0
    rng = np.random.default_rng(args.seed)
    with tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp:
        work = Path(tmp)
        spec = spec_of(args.nodes, work)
        t0 = time.perf_counter()
        c = SlurmCluster(work / "cluster", spec, gpu_type=None if args.untyped else "{gpu}_{index}",
                         start_timeout=600)
        with c:
            print(f"cluster: {args.nodes} nodes x 8 GPUs up in {time.perf_counter() - t0:.0f} s "
                  f"({'untyped gres' if args.untyped else 'one gres type per GPU index'}); load {os.getloadavg()[0]:.1f}")
            disp = Dispatcher(make_fabric(spec))
            rows = []
            for n in range(args.submissions):
                busy_state(c, rng, args.busy)
                free = read_live(spec, c.env).snapshot.state.n_free  # small clusters: k fits what is free
                k = min(int(rng.integers(2, 25)), free)
                shape = None
                if n % 3 == 2 and min(SHAPES) <= free:
                    k = int(rng.choice([s for s in SHAPES if s <= free]))
                    shape = SHAPES[k]
                t1 = time.perf_counter()
                sub = submit(disp, spec, k, "srun true\nsleep 3600\n", options=["--output=/dev/null"], shape=shape,
                             env=c.env, wait=120)
                total = (time.perf_counter() - t1) * 1e3
                v = sub.verdict()
                rows.append((k, shape, sub.single_job, v.get("nodes", False) and v.get("counts", False),
                             v.get("indices", False), sub.state_ms + sub.place_ms, total, sub.state_ms, sub.place_ms))
                print(f"{n:2d} k={k:2d} {shape or '':11s} {'one job' if sub.single_job else 'hetjob '} "
                      f"nodes+counts {'=' if rows[-1][3] else 'DIFFER'} indices {'=' if rows[-1][4] else 'differ'} "
                      f"read+place {rows[-1][5]:6.1f} ms, submit->grant {total:6.0f} ms", flush=True)
            c.cancel_all()
    rp = np.array([r[5] for r in rows])
    print(f"\n| {args.nodes} nodes, {len(rows)} submissions, busy {args.busy:g} | value | target |\n|---|---|---|")
    print(f"| nodes + per-node counts equal BandPilot's | {100 * np.mean([r[3] for r in rows]):.0f} % | 100 % |")
    print(f"| GPU indices equal BandPilot's | {100 * np.mean([r[4] for r in rows]):.0f} % | "
          f"{'0 % promised (untyped gres)' if args.untyped else '100 % (per-index gres types)'} |")
    print(f"| heterogeneous jobs (uneven counts / pinned indices) | {sum(not r[2] for r in rows)} of {len(rows)} | |")
    print(f"| state read + place p50 / p99 | {np.percentile(rp, 50):.0f} / {np.percentile(rp, 99):.0f} ms | "
          f"<= 200 / <= 1000 ms |")
    print(f"| of which state read (2 scontrol calls) / place, p50 | {np.percentile([r[7] for r in rows], 50):.0f} / "
          f"{np.percentile([r[8] for r in rows], 50):.0f} ms | |")
    print(f"| submit to grant read back, p50 | {np.percentile([r[6] for r in rows], 50):.0f} ms | |")
    print(f"\nload average after: {os.getloadavg()[0]:.1f} (2 cores)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
