"""Declared-constant sweep: does surrogate accuracy depend on the NIC speed an operator writes in the spec?

    python -m benchmarks.bench_constants [--seeds 1] [--factors 0.25,0.5,1,2,4]

For both shared tables (``../shared/data`` or ``$BANDPILOT_DATA``; else the emulated specs) the spec's
``nic_gbps`` is multiplied by each factor - the measurements stay the same - and the surrogate is trained
with the prior fit to the data (``prior_fit: data``, the default) and with the declared constants
trusted (``prior_fit: declared``, the first release's behaviour). Protocol as in ``bench_surrogate``:
250 training allocations, H100 pattern-disjoint test, Het-4Mix random allocations.
Target (issue 11): across the sweep R² moves by at most 0.005 and MAPE by at most 0.3 points.
Nothing is written into the repository.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import numpy as np

from benchmarks.bench_surrogate import ROOT, h100_dataset, het_fabric
from bandpilot.data.dataset import Dataset
from bandpilot.data.synthetic import fabric_dataset
from bandpilot.model.params import TrainParams
from bandpilot.model.train import train


def with_nic(ds: Dataset, factor: float) -> Dataset:
    """The same measurements under a spec whose declared NIC speed is ``factor`` times the real one."""
    spec = dataclasses.replace(ds.spec, nic_gbps=ds.spec.nic_gbps * factor)
    return Dataset(spec, ds.frame, ds.path)


def sweep(ds: Dataset, params: dict, factors: list[float], seeds: int) -> list[tuple[float, float, float]]:
    rows = []
    for f in factors:
        r2, mape = [], []
        for s in range(seeds):
            res = train(with_nic(ds, f), {**params, "seed": s}, plots=False)
            r2.append(res.metrics["test_r2"])
            mape.append(res.metrics["test_mape"])
        rows.append((f, float(np.mean(r2)), float(np.mean(mape))))
        print(f"  {params['prior_fit']:<8} x{f:<5} R2 {rows[-1][1]:.4f} MAPE {rows[-1][2]:.2f}", file=sys.stderr, flush=True)
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=1)
    ap.add_argument("--factors", default="0.25,0.5,1,2,4")
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    factors = [float(x) for x in args.factors.split(",")]
    base = TrainParams.load(ROOT / "params" / "train.yaml", {"threads": args.threads, "n_train": 250}).as_dict()
    h_ds, h_src = h100_dataset()
    fab, het_src = het_fabric()
    het_ds = fabric_dataset(fab, n_cross=1500, seed=0, noisy=False)
    cases = [(f"H100 ({h_src}), pattern-disjoint", h_ds, "pattern"), (f"Het-4Mix ({het_src}), random", het_ds, "random")]
    t0 = time.perf_counter()
    out = [f"Load average at start: {os.getloadavg()[0]:.1f}; seeds {args.seeds}; declared nic_gbps x {factors}.", "",
           "| data | prior | " + " | ".join(f"x{f:g} R² / MAPE %" for f in factors) + " | spread R² | spread MAPE | target |",
           "|---|---|" + "---|" * len(factors) + "---|---|---|"]
    for label, ds, split in cases:
        for mode in ("data", "declared"):
            rows = sweep(ds, {**base, "split": split, "prior_fit": mode}, factors, args.seeds)
            r2 = [r[1] for r in rows]
            mape = [r[2] for r in rows]
            d_r2, d_mape = max(r2) - min(r2), max(mape) - min(mape)
            ok = "met" if d_r2 <= 0.005 and d_mape <= 0.3 else "missed"
            out.append(f"| {label} | {mode} | " + " | ".join(f"{a:.4f} / {b:.2f}" for _, a, b in rows)
                       + f" | {d_r2:.4f} | {d_mape:.2f} | {ok if mode == 'data' else '-'} |")
    out += ["", f"Wall time {time.perf_counter() - t0:.0f} s; load average at end {os.getloadavg()[0]:.1f}."]
    print("\n".join(out))


if __name__ == "__main__":
    main()
