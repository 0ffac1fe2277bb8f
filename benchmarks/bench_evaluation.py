"""Evaluation benchmark: the paper's Table II / Fig. 6 protocol on the embedded default clusters.

    python benchmarks/bench_evaluation.py [--repeats 50] [--workers 2] [--clusters h100,het4mix]
                                          [--out reports/bench_evaluation] [--retrain] [--strict]

Per cluster (``params/clusters/h100.yaml`` and ``het4mix.yaml``, emulated):

1. profile: every intra-host subset + a stratified cross-host sample (``profiling.plan``), measured
   on the emulator with its seeded noise;
2. train the hierarchical surrogate on 250 cross-host allocations (the paper's data budget); the
   model is cached under ``<out>/models/<cluster>`` and reused unless ``--retrain`` (training is
   not part of the timed evaluation);
3. evaluate (``bandpilot.evaluation.runner.evaluate``): k = 1..32 x ``--repeats`` scenarios x idle /
   moderate / heavy, every algorithm, GBE vs the exact optimum, in a ``--workers`` process pool.

Targets (printed as PASS/FAIL; ``--strict`` turns a miss into exit code 1):

* BandPilot's mean GBE vs exact >= 97 % for every profile on both clusters;
* BandPilot within 1 GBE point of Ideal-BP (the same search on the true bandwidth);
* the full evaluation (both clusters, all profiles, k = 1..32 x 50) within 10 minutes on 2 cores.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("MKL_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bandpilot.config import setup_env  # noqa: E402

TARGET_GBE = 0.97
TARGET_GAP = 0.01
TARGET_SECONDS = 600.0


def build_dataset(spec, fabric, samples: int, seed: int):
    """Emulated profiling run: all intra-host subsets + a stratified cross-host sample."""
    from bandpilot.data.dataset import Dataset, frame_from_masks
    from bandpilot.data.planning import plan

    pl = plan(spec, cross_host_samples=samples, seed=seed)
    masks = np.array([m.masks for m in pl], dtype=np.int64)
    y = fabric.measure(masks, seed=seed)
    frame = frame_from_masks(spec, masks, y, collective=spec.collective, bytes_=spec.message_bytes, source="emulator")
    return Dataset(spec, frame)


def get_model(name: str, spec, fabric, out: Path, args) -> tuple[object, dict]:
    from bandpilot.errors import BandPilotError
    from bandpilot.model.surrogate import Surrogate
    from bandpilot.model.train import train

    cache = out / "models" / name
    if cache.is_dir() and not args.retrain:
        try:
            sur = Surrogate.load(str(cache))
            if sur.spec.fingerprint() == spec.fingerprint() and sur.meta.get("metrics"):
                return sur, {"cached": True, **sur.meta["metrics"]}
        except BandPilotError as exc:  # stale format: retrain
            print(f"  cached model unusable ({exc}); retraining", flush=True)
    t0 = time.perf_counter()
    ds = build_dataset(spec, fabric, args.samples, args.seed)
    res = train(ds, {"n_train": args.n_train, "seed": args.seed, "threads": args.threads}, plots=False)
    res.surrogate.save(cache)
    info = {"cached": False, "seconds": time.perf_counter() - t0, **res.metrics}
    return res.surrogate, info


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clusters", default="h100,het4mix")
    ap.add_argument("--repeats", type=int, default=50)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--samples", type=int, default=1500, help="cross-host allocations profiled (pool for train/test)")
    ap.add_argument("--n-train", type=int, default=250)
    ap.add_argument("--threads", type=int, default=2, help="torch threads for training")
    ap.add_argument("--out", type=Path, default=ROOT / "reports" / "bench_evaluation")
    ap.add_argument("--retrain", action="store_true")
    ap.add_argument("--no-figures", action="store_true")
    ap.add_argument("--strict", action="store_true", help="exit 1 when a target is missed")
    return ap.parse_args(argv)


def _evaluate_clusters(args: argparse.Namespace, con) -> tuple[dict, dict, float, float]:
    """Train (or reuse) each cluster's surrogate and run the paper's scenarios on it."""
    from bandpilot.evaluation.report import rich_table
    from bandpilot.evaluation.runner import evaluate
    from bandpilot.evaluation.truth import resolve_cluster
    from bandpilot.fabric.emulator import make_fabric

    results, models = {}, {}
    eval_seconds = eval_cpu = 0.0
    for name in [c.strip() for c in args.clusters.split(",") if c.strip()]:
        spec = resolve_cluster(name)
        fabric = make_fabric(spec)
        con.print(f"[bold]{spec.name}[/bold]: {spec.n_hosts} hosts, {spec.n_gpus} GPUs ({', '.join(spec.gpu_types)})")
        sur, info = get_model(name, spec, fabric, args.out, args)
        models[name] = info
        how = "cached" if info.get("cached") else f"trained in {info.get('seconds', 0):.0f} s"
        con.print(f"  surrogate: {how}, "
                  f"test MAPE {info.get('test_mape', float('nan')):.2f} %, R² {info.get('test_r2', float('nan')):.4f}")
        t0 = time.perf_counter()
        res = evaluate(sur, fabric, repeats=args.repeats, seed=args.seed, workers=args.workers,
                       out_dir=None, progress=True)
        dt = time.perf_counter() - t0
        eval_seconds += dt
        eval_cpu += res.cpu_s
        res.write(args.out / spec.name, figures=not args.no_figures)
        results[name] = res
        con.print(rich_table(res, title=f"Mean GBE (%) vs exact - {spec.name} ({res.n_scenarios} scenarios, {dt:.0f} s)"))
        for n in res.notes:
            con.print(f"  note: {n}")
    return results, models, eval_seconds, eval_cpu


def _table2(results: dict, con, out: Path) -> list[dict]:
    """Table II across clusters: printed, and written as table2.csv."""
    import pandas as pd
    from rich.table import Table

    from bandpilot.evaluation.params import LABELS, PROFILES

    t = Table(title="Table II - mean GBE (%) vs the exact optimum")
    t.add_column("Cluster")
    t.add_column("Algorithm")
    for p in PROFILES:
        t.add_column(f"τ_{p}", justify="right")
    rows = []
    for res in results.values():
        g = res.gbe_table()
        for a in g.index:
            t.add_row(res.cluster, LABELS[a], *[f"{g.loc[a, p]:.1f}" for p in res.profiles],
                      style="bold" if a == "bandpilot" else None)
            rows.append({"cluster": res.cluster, "algorithm": LABELS[a], **{p: round(float(g.loc[a, p]), 2) for p in res.profiles}})
    con.print(t)
    pd.DataFrame(rows).to_csv(out / "table2.csv", index=False)
    return rows


def _checks(results: dict, args: argparse.Namespace, eval_seconds: float) -> list[tuple[str, bool]]:
    checks = []
    for res in results.values():
        for p in res.profiles:
            bp, ideal = res.gbe(p), res.gbe(p, "ideal")
            checks.append((f"{res.cluster} {p}: BandPilot GBE {100 * bp:.2f} % >= {100 * TARGET_GBE:.0f} %", bp >= TARGET_GBE))
            checks.append((f"{res.cluster} {p}: Ideal-BP - BandPilot = {100 * (ideal - bp):.2f} pts <= {100 * TARGET_GAP:.0f}",
                           ideal - bp <= TARGET_GAP))
    full = args.repeats >= 50 and set(results) >= {"h100", "het4mix"}
    scale = 50 / max(args.repeats, 1)
    checks.append((f"evaluation wall time {eval_seconds:.0f} s"
                   + ("" if full else f" (x{scale:.1f} -> ~{eval_seconds * scale:.0f} s at 50 repeats)")
                   + f" <= {TARGET_SECONDS:.0f} s on {args.workers} workers", eval_seconds * (1 if full else scale) <= TARGET_SECONDS))
    return checks


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    setup_env(ROOT)
    from rich.console import Console

    con = Console()
    out = args.out
    out.mkdir(parents=True, exist_ok=True)
    results, models, eval_seconds, eval_cpu = _evaluate_clusters(args, con)
    rows = _table2(results, con, out)
    checks = _checks(results, args, eval_seconds)
    full = args.repeats >= 50 and set(results) >= {"h100", "het4mix"}
    scale = 50 / max(args.repeats, 1)
    # Other processes on a shared machine stretch the wall time; the kernels' CPU time does not.
    con.print(f"  info: scenario kernels used {eval_cpu:.0f} CPU-s -> ~{eval_cpu / max(args.workers, 1) * (1 if full else scale):.0f} s "
              f"wall on {args.workers} otherwise idle cores at 50 repeats")
    for text, ok in checks:
        con.print(f"  {'[green]PASS[/green]' if ok else '[red]FAIL[/red]'} {text}")
    summary = {
        "repeats": args.repeats,
        "workers": args.workers,
        "eval_seconds": eval_seconds,
        "eval_cpu_seconds": eval_cpu,
        "models": models,
        "table2": rows,
        "latency": {n: r.latency_table().reset_index().to_dict(orient="records") for n, r in results.items()},
        "checks": [{"check": c, "passed": ok} for c, ok in checks],
        "reports": {n: str(out / r.cluster) for n, r in results.items()},
    }
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str))
    con.print(f"reports: {out}")
    return 1 if args.strict and not all(ok for _, ok in checks) else 0

if __name__ == "__main__":
    sys.exit(main())
