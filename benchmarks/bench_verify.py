"""Verified discovery: detection and localization of injected faults, against the targets.

    python -m benchmarks.bench_verify [--faults 200] [--clusters h100,het4mix]

On the emulated clusters (measurement noise on, a fresh noise seed per trial) a surrogate is fit as
``bandpilot train`` does; then for each fault kind, ``--faults`` seeded single faults at random
hosts/GPUs/pairs/rails (default severities: NVLink width, pair and NIC rail x0.5, slow host x0.7,
missing GPU x0) are injected and ``verify`` runs its probe plan. Reported: detection (the faulty host
is not healthy), localization (the right GPU / pair / rail / host), false alarms (healthy hosts
flagged), nccl-tests runs per host. Targets: >= 98 %, >= 95 %, <= 1 %, <= 16.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import zlib

import numpy as np

from benchmarks.bench_surrogate import ROOT
from bandpilot.data.synthetic import fabric_dataset
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.fabric.faults import KINDS, FaultyFabric, random_fault
from bandpilot.health.verify import tolerance_for, verify_probes
from bandpilot.model.crossval import fit
from bandpilot.model.params import TrainParams
from bandpilot.topology.cluster import load_cluster


def localized(fault, v) -> bool:
    h = fault.host
    if fault.kind in ("nvlink_width", "missing_gpu"):
        return v.gpus == [f"{h}:{fault.gpu}"]
    if fault.kind == "nvlink_pair":
        return sorted(v.gpus) == sorted([f"{h}:{fault.gpu}", f"{h}:{fault.peer}"])
    if fault.kind == "nic_rail":
        return v.links == [f"{h}:nic-rail{fault.gpu}"]
    return v.fault == "host"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--faults", type=int, default=200)
    ap.add_argument("--clusters", default="h100,het4mix")
    ap.add_argument("--factor", type=float, default=None, help="one severity for every kind but missing_gpu (default: per kind)")
    args = ap.parse_args()
    base = TrainParams.load(ROOT / "params" / "train.yaml", {"threads": 1})
    sev = "default severities" if args.factor is None else f"severity x{args.factor:g}"
    lines = [f"Load average at start: {os.getloadavg()[0]:.1f}; {args.faults} seeded single faults per kind and cluster, {sev}.", "",
             "| cluster | fault | detected % | localized % | false alarms % of healthy hosts | runs per host | status seen |",
             "|---|---|---:|---:|---:|---:|---|"]
    t0 = time.perf_counter()
    for name in args.clusters.split(","):
        spec = load_cluster(ROOT / "params" / "clusters" / f"{name}.yaml")
        model = fit(fabric_dataset(EmulatorFabric(spec), n_cross=600, seed=0), base, plots=False).surrogate
        tol = tolerance_for(model)
        healthy_flags = 0
        for trial in range(min(args.faults, 50)):  # no fault at all: every flag is a false alarm
            rep = verify_probes(model, spec, fabric=EmulatorFabric(spec, seed=10_000 + trial), tolerance=tol)
            healthy_flags += sum(v.status != "healthy" for v in rep.hosts.values())
        lines.append(f"| {name} | none | - | - | {100 * healthy_flags / (min(args.faults, 50) * spec.n_hosts):.2f} | "
                     f"{len(rep.runs) / spec.n_hosts:.1f} | - |")
        for kind in KINDS:
            rng = np.random.default_rng(zlib.crc32(f"{name}/{kind}".encode()))
            det = loc = fa = 0
            statuses: set[str] = set()
            for trial in range(args.faults):
                f = random_fault(spec, kind, rng, None if kind == "missing_gpu" else args.factor)
                truth = FaultyFabric(EmulatorFabric(spec, seed=trial + 1), [f])
                rep = verify_probes(model, spec, fabric=truth, tolerance=tol)
                v = rep.hosts[f.host]
                statuses.add(v.status)
                det += v.status != "healthy"
                loc += v.status != "healthy" and localized(f, v)
                fa += sum(o.status != "healthy" for h, o in rep.hosts.items() if h != f.host)
            n = args.faults
            lines.append(f"| {name} | {kind} | {100 * det / n:.1f} | {100 * loc / n:.1f} | "
                         f"{100 * fa / (n * (spec.n_hosts - 1)):.2f} | {len(rep.runs) / spec.n_hosts:.1f} | {', '.join(sorted(statuses))} |")
            print(lines[-1], file=sys.stderr, flush=True)
    lines += ["", f"Wall time {time.perf_counter() - t0:.0f} s; load average at end {os.getloadavg()[0]:.1f}."]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
