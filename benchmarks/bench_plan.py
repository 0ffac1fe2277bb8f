"""Profiling-plan cost: wall time, CPU time and peak RSS of ``bandpilot profile``'s plan
(:func:`bandpilot.data.domain_planning.plan_domains`) on NVL72 clusters of 1,152, 10,008 and
100,008 GPUs (288 / 2,502 / 25,002 trays), each size in its own process so the peak is its own.

    python -m benchmarks.bench_plan [--trays 288 2502 25002] [--samples 600] [--seed 0]

``--samples`` is ``bandpilot profile --samples`` (the cross-domain sample; 600 is what
``bench_rackmodel`` profiles). Peak RSS is the child's ``ru_maxrss``; "spec" is the RSS after
loading the spec, before planning. The plan's stages: per tray (every GPU subset of every tray),
in-domain count patterns once per class of identical domains, cross-domain rows on the ladder.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

_CHILD = r"""
import json, resource, sys, tempfile, time
from pathlib import Path
sys.path.insert(0, {root!r})
from benchmarks.bench_scale import spec_for
from bandpilot.topology.cluster import load_cluster
from bandpilot.data.domain_planning import plan_domains
with tempfile.TemporaryDirectory() as tmp:
    spec = load_cluster(spec_for({trays}, Path(tmp)))
r0 = resource.getrusage(resource.RUSAGE_SELF)
t = time.perf_counter()
plan = plan_domains(spec, cross_domain_samples={samples}, seed={seed})
wall = time.perf_counter() - t
r1 = resource.getrusage(resource.RUSAGE_SELF)
stages = {{"tray": 0, "domain": 0, "cross": 0}}
for m in plan:
    stages["tray" if m.stratum.startswith("1h:") else "domain" if m.stratum.startswith("1d:") else "cross"] += 1
print(json.dumps({{"gpus": spec.n_gpus, "trays": spec.n_hosts, "n": len(plan), "wall": wall,
                  "cpu": r1.ru_utime + r1.ru_stime - r0.ru_utime - r0.ru_stime,
                  "spec_mb": r0.ru_maxrss / 1024, "peak_mb": r1.ru_maxrss / 1024, **stages}}))
"""


def measure(trays: int, samples: int, seed: int) -> dict:
    code = _CHILD.format(root=str(ROOT), trays=trays, samples=samples, seed=seed)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trays", type=int, nargs="+", default=[288, 2502, 25002])
    ap.add_argument("--samples", type=int, default=600)
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args(argv)
    print(f"load {os.getloadavg()[0]:.1f} (1 min) at the start; --samples {a.samples}, seed {a.seed}\n")
    print("| GPUs (trays) | measurements (tray / in-domain / cross-domain) | wall s | CPU s | RSS spec / peak MB |")
    print("|---|---|---:|---:|---|")
    for trays in a.trays:
        r = measure(trays, a.samples, a.seed)
        print(f"| {r['gpus']:,} ({r['trays']:,}) | {r['n']:,} ({r['tray']:,} / {r['domain']:,} / {r['cross']:,}) | "
              f"{r['wall']:.1f} | {r['cpu']:.1f} | {r['spec_mb']:.0f} / {r['peak_mb']:.0f} |", flush=True)
    print(f"\nload {os.getloadavg()[0]:.1f} (1 min) at the end")
    return 0


if __name__ == "__main__":
    sys.exit(main())
