"""How much can ANY placement gain over blind on the shape benchmark's mix? A certified bound (emulated clusters).

    python -m benchmarks shape_bound   (python -m benchmarks.bench_shape_bound [--busy 2] [--seed 0])

For every case of ``bench_shape``'s emulated idle + busy mix (same shapes, states and seed), the
lower bound of :mod:`benchmarks.shape_bound` on the true step time of any placement, beside the
true step times of the blind baseline's and the shape search's rank maps (placed by the same
5 %-noise guide as in ``bench_shape``). ``1 - geomean(bound / blind)`` caps the reduction vs
blind any placement can show on the mix (the target is 15 %); ``shape / bound`` is how far the
shipped search can at most be from the optimum. A pick at the bound is certified optimal.

``--small N``: exact where it is tractable - N random small states of the emulated 4 x 8 H100
cluster (``params/clusters/h100.yaml``; 7-9 free GPUs, up to three tenants, some cross-host) and
k = 4 / 6 shapes: every rank map of the free GPUs is scored on the truth (the exact optimum), beside
the bound and the shape search's pick (placed by the truth itself and by the 5 %-noise guide).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")

import argparse
import itertools
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_dispatch import NoisyPredictor  # noqa: E402
from benchmarks.bench_shape import CLUSTERS, SHAPES, _states  # noqa: E402
from benchmarks.bench_shape_gap import _gm, summary_vs  # noqa: E402
from benchmarks.shape_bound import Bounder, lower_bound  # noqa: E402
from bandpilot.dispatch.contention import ContentionPredictor  # noqa: E402
from bandpilot.dispatch.dispatcher import Dispatcher  # noqa: E402
from bandpilot.dispatch.search.shape import Placement, from_ranks, score  # noqa: E402
from bandpilot.dispatch.state import State  # noqa: E402
from bandpilot.dispatch.shape import Shape  # noqa: E402
from bandpilot.fabric.emulator import make_fabric  # noqa: E402
from bandpilot.topology.cluster import load_cluster  # noqa: E402

TIE = 5e-4  # as bench_shape_gap: within 0.05 % counts as equal


def run(name: str, busy: int, seed: int) -> list[dict]:
    spec = load_cluster(ROOT / "params" / "clusters" / f"{name}.yaml")
    fab = make_fabric(spec)
    guide = Dispatcher(NoisyPredictor(fab, 0.05, seed), seed)
    bounder = Bounder(fab)
    rng = np.random.default_rng([seed, len(name)])  # bench_shape's states, in its order
    out = []
    for label, st in _states(spec, fab, rng, busy, 0):
        truth = ContentionPredictor(fab, st)
        fb = bounder.state(st.free, truth.host_exposure, truth)
        for tp, pp, dp in SHAPES:
            shp = Shape.parse({"tp": tp, "pp": pp, "dp": dp})
            if shp.k > st.n_free:
                continue
            t0 = time.perf_counter()
            got = {a: from_ranks(spec, guide.select(shp.k, st, a, shape=shp).ranks) for a in ("shape", "blind")}
            score(truth, shp, list(got.values()))
            t1 = time.perf_counter()
            lb, arg = lower_bound(bounder, fb, shp)
            r = {"cluster": name, "state": label, "shape": str(shp), "k": shp.k, "bound": lb, "at": arg,
                 **{a: p.step_ms for a, p in got.items()}, "s": time.perf_counter() - t1, "sel_s": t1 - t0}
            out.append(r)
            print(f"| {name} | {label} | {shp} | {shp.k} | {r['shape']:.1f} | {r['blind']:.1f} | {lb:.1f} | "
                  f"{1 - lb / r['blind']:+.1%} | {r['shape'] / lb - 1:+.2%} | {arg} | {r['s']:.2f} |", flush=True)
    return out


#: Shapes of the exhaustive small-state check: k = 4 (every rank map: <= 3,024) and k = 6 (<= 60,480)
SMALL_SHAPES = {4: [(2, 1, 2), (2, 2, 1), (1, 2, 2)], 6: [(2, 1, 3), (2, 3, 1), (3, 1, 2)]}


def small_state(fab, seed: int) -> State:
    """7-9 free GPUs over the cluster; the rest held by up to three 4-GPU tenants (random GPUs, so
    some cross hosts) with random demand."""
    rng = np.random.default_rng(seed)
    gpus = list(fab.spec.gpu_ids)
    free = [gpus[i] for i in sorted(rng.choice(len(gpus), size=int(rng.integers(7, 10)), replace=False))]
    taken = [g for g in gpus if g not in free]
    rng.shuffle(taken)
    jobs = [{"id": f"t{j}", "gpus": taken[j * 4:(j + 1) * 4], "demand_gbps": float(rng.uniform(5, 300))}
            for j in range(int(rng.integers(0, 4)))]
    return State.from_dict(fab.spec, {"free": free, "jobs": jobs})


def exact_small(n: int, ks: tuple[int, ...] = (4, 6)) -> None:
    """The ``--small`` table: exhaustive optimum vs bound, shape picks and blind per k."""
    fab = make_fabric(load_cluster(ROOT / "params" / "clusters" / "h100.yaml"))
    spec, bounder = fab.spec, Bounder(fab)
    algos = {"shape (truth)": Dispatcher(fab, 0), "shape (guide)": Dispatcher(NoisyPredictor(fab, 0.05, 0), 0)}
    print("\n| k | cases | optimum above bound (gm) | bound = optimum | shape (truth) = optimum | shape (guide) = "
          "optimum | shape (guide) above optimum (gm) | optimum vs blind |")
    print("|---|---|---|---|---|---|---|---|")
    for k in ks:
        r: dict[str, list[float]] = {"bound": [], "blind": [], **{a: [] for a in algos}}
        for seed in range(n):
            st = small_state(fab, seed)
            truth = ContentionPredictor(fab, st)
            fb = bounder.state(st.free, truth.host_exposure, truth)
            free = [spec.parse_gpu(g, "free") for g in spec.from_mask(st.free)]
            for tp, pp, dp in SMALL_SHAPES[k]:
                shp = Shape.parse({"tp": tp, "pp": pp, "dp": dp})
                every = [Placement(np.array([h for h, _ in q]), np.array([i for _, i in q]))
                         for q in itertools.permutations(free, k)]
                score(truth, shp, every)
                opt = min(c.step_ms for c in every)
                picks = {a: from_ranks(spec, d.select(k, st, shape=shp).ranks) for a, d in algos.items()}
                picks["blind"] = from_ranks(spec, algos["shape (truth)"].select(k, st, "blind", shape=shp).ranks)
                score(truth, shp, list(picks.values()))
                r["bound"].append(opt / lower_bound(bounder, fb, shp)[0])
                for a, p in picks.items():
                    r[a].append(p.step_ms / opt)
        eq = lambda a: sum(x <= 1 + TIE for x in r[a])  # noqa: E731
        print(f"| {k} | {len(r['bound'])} | {_gm(r['bound']) - 1:+.2%} | {eq('bound')} | {eq('shape (truth)')} | "
              f"{eq('shape (guide)')} | {_gm(r['shape (guide)']) - 1:+.2%} | {1 - 1 / _gm(r['blind']):+.1%} |", flush=True)


def summary(rows: list[dict]) -> None:
    summary_vs(rows, "bound", ["shape vs blind (true)", "bound vs blind (most any placement can gain)",
                               "shape above bound (gm)", "shape = bound (certified optimal)", "blind = bound"])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--busy", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clusters", nargs="*", default=list(CLUSTERS))
    ap.add_argument("--small", type=int, default=0, help="exhaustive small states (seeds) instead of the mix")
    args = ap.parse_args(argv)
    if args.small:
        exact_small(args.small)
        with open("/proc/loadavg") as f:
            print(f"\nload: {f.read().strip()}")
        return 0
    print("| cluster | state | shape | k | shape ms | blind ms | bound ms | bound vs blind | shape above bound "
          "| attained at (axis statuses) | bound s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name in args.clusters:
        rows += run(name, args.busy, args.seed)
    summary(rows)
    with open("/proc/loadavg") as f:
        print(f"\nload: {f.read().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
