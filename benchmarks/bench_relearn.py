"""After a fault: dispatching on the degraded truth with the stale model and after re-measure + refit.

    python -m benchmarks.bench_relearn [--seeds 2] [--repeats 5]

Emulated H100 and Het-4Mix: a surrogate fit on the healthy cluster (the stale model); one seeded fault
(NVLink width, NVLink pair or slow host - what stage 1 can see) is injected; the cluster is profiled
again (``bandpilot.health.relearn.remeasure``, the ``bandpilot profile`` plan) and refit. Both models
are scored on the faulty truth against its exact optimum. Target (issue 12): >= 99 % after the loop.
NIC-rail faults and missing GPUs are the gate's: the model has no per-GPU rail, and a missing GPU is
drained, not predicted. Nothing is written into the repository.
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time
import zlib

import numpy as np

from benchmarks.bench_surrogate import ROOT
from bandpilot.data.dataset import load_dataset
from bandpilot.data.synthetic import fabric_dataset
from bandpilot.evaluation.runner import evaluate
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.fabric.faults import FaultyFabric, random_fault
from bandpilot.health.relearn import remeasure
from bandpilot.model.crossval import fit
from bandpilot.model.params import TrainParams
from bandpilot.topology.cluster import load_cluster

PROFILES = ("idle", "moderate", "heavy")
KINDS = ("nvlink_width", "nvlink_pair", "slow_host")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--repeats", type=int, default=5)
    args = ap.parse_args()
    p = TrainParams.load(ROOT / "params" / "train.yaml", {"threads": 1})
    lines = [f"Load average at start: {os.getloadavg()[0]:.1f}; {args.seeds} faults per kind, {args.repeats} scenarios "
             "per k and profile; mean GBE % on the faulty truth (idle / moderate / heavy).", "",
             "| cluster | fault | stale model | after re-measure + refit |", "|---|---|---|---|"]
    t0 = time.perf_counter()
    for name in ("h100", "het4mix"):
        spec = load_cluster(ROOT / "params" / "clusters" / f"{name}.yaml")
        base = EmulatorFabric(spec)
        stale = fit(fabric_dataset(base, n_cross=600, seed=0), p, plots=False).surrogate
        for kind in KINDS:
            rng = np.random.default_rng(zlib.crc32(f"relearn/{name}/{kind}".encode()))
            before, after = [], []
            for _ in range(args.seeds):
                truth = FaultyFabric(base, [random_fault(spec, kind, rng)])
                with tempfile.TemporaryDirectory(prefix="bench-relearn-") as tmp:
                    rep = remeasure(spec, tmp, fabric=truth, samples=600)
                    new = fit(load_dataset(rep.dataset_dir), p, plots=False).surrogate
                for model, acc in ((stale, before), (new, after)):
                    ev = evaluate(model, truth, profiles=PROFILES, repeats=args.repeats, seed=1, workers=2,
                                  algorithms=("bandpilot",), figures=False)
                    acc.append([100 * ev.gbe(q) for q in PROFILES])
            fmt = lambda a: " / ".join(f"{v:.2f}" for v in np.mean(a, axis=0))  # noqa: E731
            lines.append(f"| {name} | {kind} | {fmt(before)} | {fmt(after)} |")
            print(lines[-1], file=sys.stderr, flush=True)
    lines += ["", f"Wall time {time.perf_counter() - t0:.0f} s; load average at end {os.getloadavg()[0]:.1f}."]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
