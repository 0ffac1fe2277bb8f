"""Time to the first answer: wall and CPU seconds of CLI commands in a fresh process each.

    python -m benchmarks.bench_cli [--repeats 5] [--home DIR] [--before CHECKOUT]

Each command runs ``--repeats`` times as ``python -m bandpilot ...`` in a new interpreter (what a user
pays: start-up, imports, work; bytecode cached, after one untimed warm-up run); the table gives the median wall time, the median CPU time (user + sys
of the child: on a shared machine a steadier figure of the work than wall time) and the target.
Without ``--home`` a temporary project home gets a small ``bandpilot-h100`` model registered as
``champion`` in its SQLite registry. ``--before CHECKOUT`` also runs every command with another
source tree first on ``PYTHONPATH`` (e.g. ``git archive main | tar -x -C /tmp/before``), interleaved
with this one, for a before/after table under the same load.

Targets: an error for a missing input <= 1 s; ``select`` on a built-in 32-GPU cluster with a
registered model <= 1.5 s, both on a quiet machine.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MODEL = "models:/bandpilot-h100@champion"
ERROR_S, SELECT_S = 1.0, 1.5


def commands(tmp: Path) -> list[tuple[str, list[str], float | None, int]]:
    """(label, arguments, target seconds, expected exit code)."""
    state = tmp / "state.json"
    return [
        ("bandpilot --help", ["--help"], None, 0),
        ("select, missing state file", ["select", "4", "--state", str(tmp / "nope.json"), "--model", MODEL], ERROR_S, 2),
        ("select, unknown alias", ["select", "4", "--state", str(state), "--model", "models:/bandpilot-h100@nope"], ERROR_S, 2),
        ("simulate, missing trace", ["simulate", "--trace", str(tmp / "nope.csv"), "--model", MODEL, "-o", str(tmp / "o")],
         ERROR_S, 2),
        ("dispatch, missing store", ["dispatch", "--store", str(tmp / "nope.db"), "--model", MODEL], ERROR_S, 2),
        ("select 4 of 32 GPUs, the emulator (no model)",
         ["select", "4", "--state", str(state), "--cluster", str(ROOT / "params" / "clusters" / "h100.yaml")], None, 0),
        ("select 4 of 32 GPUs, registered model", ["select", "4", "--state", str(state), "--model", MODEL], SELECT_S, 0),
    ]


def register_model(home: Path, env: dict[str, str]) -> None:
    """A small h100 surrogate registered as champion in ``home``'s SQLite registry (~1 min)."""
    code = """
from bandpilot.data.synthetic import fabric_dataset
from bandpilot.fabric.emulator import EmulatorFabric
from bandpilot.model import registry
from bandpilot.model.crossval import fit
from bandpilot.topology.cluster import load_cluster
registry.tracking_setup()
res = fit(fabric_dataset(EmulatorFabric(load_cluster("h100")), n_cross=120, seed=0),
          {"epochs": 2, "hidden": 16, "heads": 2, "threads": 1, "folds": 2}, plots=False)
registry.log_and_register(res, alias="champion")
"""
    subprocess.run([sys.executable, "-c", code], env=env, cwd=home, check=True, capture_output=True, timeout=1800)


def run_once(args: list[str], env: dict[str, str], cwd: Path, want_rc: int) -> tuple[float, float]:
    """(wall s, CPU s) of one ``python -m bandpilot ARGS`` in a fresh interpreter."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    r = subprocess.run([sys.executable, "-m", "bandpilot", *args], env=env, cwd=cwd, capture_output=True, text=True,
                       timeout=600)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if r.returncode != want_rc:
        raise SystemExit(f"bandpilot {' '.join(args)}: exit {r.returncode}, expected {want_rc}: {r.stderr.strip()[-500:]}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--home", type=Path, default=None, help="project home with bandpilot-h100@champion (default: a new one)")
    ap.add_argument("--before", type=Path, default=None, help="another source tree to time first, interleaved")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="bench-cli-"))
    home = args.home or tmp / "home"
    home.mkdir(parents=True, exist_ok=True)
    # As on a user's machine, Python caches bytecode (without it every start compiles the package's
    # sources again: ~0.3 CPU s); one untimed warm-up round writes the caches.
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "BANDPILOT_", "PYTHONDONTWRITEBYTECODE"))}
    env.update(BANDPILOT_HOME=str(home.resolve()), OMP_NUM_THREADS="1")
    if args.home is None:
        register_model(home, env)
    (tmp / "state.json").write_text(json.dumps({"free": [f"h100-{h}:{g}" for h in range(4) for g in range(8)][4:],
                                                "jobs": [{"id": "a", "gpus": [f"h100-0:{g}" for g in range(4)],
                                                          "demand_gbps": 50.0}]}))
    trees = {"after": env}
    if args.before is not None:
        trees = {"before": {**env, "PYTHONPATH": str(args.before.resolve())}, "after": env}
    cmds = commands(tmp)
    for _, argv, _, rc in cmds:
        for e in trees.values():
            run_once(argv, e, tmp, rc)
    load0 = os.getloadavg()[0]
    times: dict[tuple[str, str], list[tuple[float, float]]] = {}
    for _ in range(args.repeats):  # interleaved: every command and tree once per round
        for label, argv, _, rc in cmds:
            for tree, e in trees.items():
                times.setdefault((label, tree), []).append(run_once(argv, e, tmp, rc))
    load1 = os.getloadavg()[0]
    print(f"Load average {load0:.1f} at start, {load1:.1f} at end; {os.cpu_count()} CPUs; {args.repeats} runs of each "
          f"command, a fresh interpreter each; median wall s (median CPU s).\n")
    head = " | ".join(f"{t} wall s (CPU s)" for t in trees)
    print(f"| command | {head} | target |")
    print("|---|" + "---:|" * len(trees) + "---|")
    for label, _, target, _ in cmds:
        cells = []
        for tree in trees:
            runs = times[(label, tree)]
            cells.append(f"{statistics.median(w for w, _ in runs):.2f} ({statistics.median(c for _, c in runs):.2f})")
        print(f"| {label} | {' | '.join(cells)} | {'' if target is None else f'<= {target:g} s quiet'} |")


if __name__ == "__main__":
    main()
