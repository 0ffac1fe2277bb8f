"""The rack-scale surrogate on ``nvl72x16``, end to end.

1. ``bandpilot profile -c nvl72x16 --samples N`` on the emulator (2 % measurement noise): stage 1
   per tray, stage 1.5 per class of domains, N cross-domain allocations (domain_planning).
2. ``bandpilot train`` on that dataset (it picks the ``domain`` model on NVLink-domain clusters),
   registered in a scratch MLflow registry; wall time against the 15-minute target (``--gate``:
   then ``bandpilot promote`` on it, a reduced k grid).
3. Accuracy against the emulator's noiseless truth on held-out rows - another seed's plan, minus
   any allocation the training set holds: cross-domain MAPE (target <= 5 %) and in-domain MAPE
   (>= 2 trays of one domain, target <= 2 %), by the number of domains spanned.
4. GBE with the trained model vs the exact optimum where it is tractable (gangs that fit a domain,
   ``Dispatcher.select(..., "exact")`` on the emulator), idle / moderate / heavy states of
   ``bench_dispatch``; both selections scored by the emulator with contention (target >= 99 %).

Usage: ``python -m benchmarks.bench_rackmodel [--samples 600] [--states 3] [--gate] [--model DIR]``
(``--model``: score an already trained model directory, skipping 1-2).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_dispatch import PROFILES, random_state  # noqa: E402
from bandpilot.data.domain_planning import domain_levels, plan_domains  # noqa: E402
from bandpilot.dispatch.contention import ContentionPredictor  # noqa: E402
from bandpilot.dispatch.dispatcher import Dispatcher, IntractableError  # noqa: E402
from bandpilot.fabric.emulator import make_fabric  # noqa: E402
from bandpilot.topology.cluster import load_cluster  # noqa: E402

SPEC = ROOT / "params" / "clusters" / "nvl72x16.yaml"
KS = [2, 3, 4, 6, 8, 12, 16, 24, 32, 36, 48, 64, 72]
TARGET_TRAIN_S, TARGET_CROSS, TARGET_IN, TARGET_GBE = 900.0, 5.0, 2.0, 0.99
BIN = Path(sys.executable).parent / "bandpilot"


def load() -> str:
    return " / ".join(f"{x:.1f}" for x in os.getloadavg())


def _run(args: list[str], env: dict | None = None) -> float:
    t = time.perf_counter()
    r = subprocess.run([str(BIN), *args], capture_output=True, text=True, env=None if env is None else {**os.environ, **env})
    if r.returncode:
        raise SystemExit(f"bandpilot {' '.join(args[:1])} failed ({r.returncode}): {r.stderr.strip()[-400:]}")
    _run.stdout = r.stdout  # type: ignore[attr-defined]
    return time.perf_counter() - t


def gate(work: Path) -> tuple[float, list[str]]:
    """``bandpilot promote`` on the registered version (a reduced k grid and 3 scenarios per k:
    the full gate on 1,152 GPUs takes far longer); returns its time and decision lines."""
    secs = _run(["promote", "--candidate", f"models:/bandpilot-{SPEC.stem}/1", "--ks", "2,4,8,16,36,72", "-r", "3",
                 "-w", "1", "--algorithms", "bandpilot,ideal", "-o", str(work / "promo"), "--no-progress"],
                env={"MLFLOW_TRACKING_URI": f"sqlite:///{work / 'mlflow.db'}"})
    keep = [ln.strip() for ln in _run.stdout.splitlines() if any(w in ln for w in ("PASS", "FAIL", "candidate v"))]  # type: ignore[attr-defined]
    return secs, keep


def profile_and_train(work: Path, samples: int, seed: int) -> tuple[Path, dict]:
    prof_s = _run(["profile", "-c", str(SPEC), "--samples", str(samples), "--seed", str(seed), "-o", str(work),
                   "--no-track", "--no-progress"])
    data = work / "data" / SPEC.stem
    train_s = _run(["train", "-d", str(data), "--tracking-uri", f"sqlite:///{work / 'mlflow.db'}",
                    "--out", str(work / "out"), "--metrics-out", str(work / "metrics.json")])
    metrics = json.loads((work / "metrics.json").read_text())
    return work / "out" / "model", {"profile_s": prof_s, "train_wall_s": train_s, **metrics, "data": data}


def held_out(spec, fab, train_masks: np.ndarray, samples: int, seed: int) -> dict:
    """MAPE vs the noiseless emulator on another seed's plan rows the training set does not hold."""
    from bandpilot.model.surrogate import Surrogate  # noqa: F401  (import cost outside the timings)

    plan = [m for m in plan_domains(spec, cross_domain_samples=samples, seed=seed, intra=False)]
    masks = np.array([m.masks for m in plan], dtype=np.int64)
    seen = {r.tobytes() for r in train_masks}
    keep = np.array([r.tobytes() not in seen for r in masks])
    return {"masks": masks[keep], "truth": fab.bandwidth_masks(masks[keep]), "dropped": int((~keep).sum())}


def uniform_rows(spec, fab, n: int, seed: int) -> dict:
    """Cross-domain rows from another distribution than the plan's: 2..all domains uniformly,
    per-domain counts uniform over 1..72, each on the fewest trays plus a random number more."""
    rng = np.random.default_rng(seed)
    unit = spec.units[0]
    doms = np.unique(unit)
    masks = np.zeros((n, spec.n_hosts), dtype=np.int64)
    for i in range(n):
        for u in rng.choice(doms, size=int(rng.integers(2, doms.size + 1)), replace=False):
            trays = np.flatnonzero(unit == u)
            t = int(rng.integers(1, 4 * trays.size + 1))
            used = rng.choice(trays, size=int(rng.integers(-(-t // 4), min(t, trays.size) + 1)), replace=False)
            per = np.full(used.size, t // used.size)
            per[: t % used.size] += 1
            for h, c in zip(used, per):
                masks[i, h] = int(sum(1 << int(b) for b in rng.choice(4, size=int(c), replace=False)))
    return {"masks": masks, "truth": fab.bandwidth_masks(masks)}


def accuracy(sur, rows: dict) -> dict:
    spec = sur.spec
    masks, truth = rows["masks"], rows["truth"]
    ape = np.abs(sur.predict_masks(masks) / truth - 1) * 100
    unit = spec.units[0]
    n_dom = np.array([np.unique(unit[r != 0]).size for r in masks])
    out = {"in": ape[n_dom == 1], "cross": ape[n_dom > 1], "by_domains": {}}
    edges = domain_levels(len(spec.nvlink_domains))
    for lo, hi in zip(edges, edges[1:] + [10**9]):
        hit = (n_dom >= lo) & (n_dom < hi)
        if hit.any():
            out["by_domains"][f"{lo}" if min(hi - 1, edges[-1]) == lo else f"{lo}-{min(hi - 1, edges[-1])}"] = ape[hit]
    return out


def gbe(sur, fab, states: int, seed: int) -> dict:
    spec = fab.spec
    ours, exact = Dispatcher(sur, seed), Dispatcher(fab, seed)
    out: dict[str, list[float]] = {p: [] for p in PROFILES}
    skipped = 0
    for pi, prof in enumerate(PROFILES):
        rng = np.random.default_rng([seed, pi])
        for k in KS:
            for _ in range(states):
                st = random_state(spec, fab, rng, prof, k)
                try:
                    ref_sel = exact.select(k, st, "exact")
                except IntractableError:
                    skipped += 1
                    continue
                truth = ContentionPredictor(fab, st)
                ref = float(truth.predict(ref_sel.mask[None, :]).value[0])
                b = float(truth.predict(ours.select(k, st).mask[None, :]).value[0])
                out[prof].append(1.0 if ref <= 0 else b / ref)
    return {"gbe": out, "skipped": skipped}


def _stats(x: np.ndarray) -> str:
    if not x.size:
        return "- | - | 0"
    return f"{x.mean():.2f} | {np.percentile(x, 95):.2f} | {x.max():.1f} | {x.size}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=600, help="cross-domain allocations profiled")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--states", type=int, default=3, help="states per (k, profile) for GBE")
    ap.add_argument("--test-samples", type=int, default=600, help="cross-domain rows of the held-out plan")
    ap.add_argument("--gate", action="store_true", help="also run `bandpilot promote` on the registered model")
    ap.add_argument("--model", type=Path, help="score this trained model directory (skip profile + train)")
    ap.add_argument("--data", type=Path, help="with --model: its dataset (held-out rows exclude its allocations)")
    args = ap.parse_args()
    import torch

    torch.set_num_threads(1)
    from bandpilot.data.dataset import load_dataset
    from bandpilot.model.surrogate import Surrogate

    print(f"load at start: {load()}")
    t0 = time.perf_counter()
    info: dict = {}
    with tempfile.TemporaryDirectory(prefix="bench-rackmodel-") as tmp:
        if args.model is None:
            model_dir, info = profile_and_train(Path(tmp), args.samples, args.seed)
            data = info.pop("data")
            if args.gate:
                info["gate"] = gate(Path(tmp))
        else:
            model_dir, data = args.model, args.data
        sur = Surrogate.load(model_dir)
        train_masks = load_dataset(data).masks() if data else np.zeros((0, sur.spec.n_hosts), np.int64)
    spec = load_cluster(SPEC)
    fab = make_fabric(spec, noise=0.0)
    if info:
        print(f"\nprofile {info['profile_s']:.0f} s; `bandpilot train` {info['train_wall_s']:.0f} s wall "
              f"(fit {info['train_seconds']:.0f} s, target {TARGET_TRAIN_S:.0f} s: "
              f"{'met' if info['train_wall_s'] <= TARGET_TRAIN_S else 'MISSED'}); "
              f"cross-validated MAPE vs the noisy measurements {info['cv_mape']:.2f} % on {info['n_train']:.0f} rows")
    if "gate" in info:
        secs, lines = info["gate"]
        print(f"\n`bandpilot promote` ({secs:.0f} s):\n\n" + "\n".join(f"    {ln}" for ln in lines))
    rows = held_out(spec, fab, train_masks, args.test_samples, args.seed + 1)
    acc = accuracy(sur, rows)
    print(f"\nheld-out rows (plan seed {args.seed + 1}, {rows['dropped']} already in training dropped), "
          f"APE % vs the noiseless emulator\n")
    print("| rows | mean | p95 | max | n | target |\n|---|---:|---:|---:|---:|---|")
    for name, key, target in (("in-domain (>= 2 trays)", "in", TARGET_IN), ("cross-domain", "cross", TARGET_CROSS)):
        hit = acc[key].size and acc[key].mean() <= target
        print(f"| {name} | {_stats(acc[key])} | <= {target:.0f} % {'met' if hit else 'MISSED'} |")
    for lab, x in acc["by_domains"].items():
        print(f"| cross-domain, {lab} domains | {_stats(x)} | |")
    uni = accuracy(sur, uniform_rows(spec, fab, args.test_samples, args.seed + 2))
    print(f"| cross-domain, uniform shares (not the plan's distribution) | {_stats(uni['cross'])} | |")
    q = gbe(sur, fab, args.states, args.seed)
    print(f"\nGBE with the trained model vs the exact optimum (emulator with contention), k in {KS}, "
          f"{args.states} states per k ({q['skipped']} not certifiable, skipped)\n")
    print("| state | mean GBE % | min % | cases |\n|---|---:|---:|---:|")
    allv = []
    for prof, v in q["gbe"].items():
        allv += v
        print(f"| {prof} | {100 * np.mean(v):.2f} | {100 * np.min(v):.2f} | {len(v)} |")
    print(f"| all | {100 * np.mean(allv):.2f} | {100 * np.min(allv):.2f} | {len(allv)} | "
          f"target >= {100 * TARGET_GBE:.0f} %: {'met' if np.mean(allv) >= TARGET_GBE else 'MISSED'}")
    print(f"\nload at end: {load()}; {time.perf_counter() - t0:.0f} s in all")


if __name__ == "__main__":
    main()
