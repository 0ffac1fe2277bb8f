"""How far is the shape search from the best achievable placement? (the shape benchmark's emulated mix)

    python -m benchmarks.bench_shape_gap [--busy 2] [--seed 0] [--clusters h100-128 nvl72x16]

For every case of ``bench_shape``'s emulated mix (same shapes, same idle + busy states, same seed),
the shape search's pick and the blind baseline's rank map (both placed by the 5 %-noise guide, as in
``bench_shape``) are compared on the truth (the emulator) with the best placement a much larger
search finds **on the truth itself** (an oracle: no guide noise):

* start points: the guide's shape pick, the blind / segment / bandwidth-only rank maps, and the
  shape search run on the truth with the bandwidth-only seed always on;
* then best-improvement hill climbing on the truth, up to ``--rounds`` rounds of up to
  ``--rows`` model rows each, over local moves (:mod:`bandpilot.dispatch.search.shape_refine`:
  swaps, replacements, regroupings) and non-local ones (:mod:`bandpilot.dispatch.search.shape_moves`:
  a whole TP group relocated to another unit's spare GPUs, all of a host's ranks moved to another
  host);
* climbs from every start point, then ``--kicks`` rounds of iterated local search (three random
  moves in a row from the best so far, then a climb; kept when faster).

The oracle is an upper bound on the optimum (not exact), so "our pick = oracle" means "no better
placement found", and the headroom ``1 - geomean(oracle / blind)`` is the most this mix can show
against blind as far as the large search can tell. Printed per case and pooled per cluster.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")

import argparse
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.bench_dispatch import NoisyPredictor  # noqa: E402
from benchmarks.bench_shape import CLUSTERS, SHAPES, _states  # noqa: E402
from bandpilot.dispatch.contention import ContentionPredictor  # noqa: E402
from bandpilot.dispatch.dispatcher import Dispatcher  # noqa: E402
from bandpilot.dispatch.search import shape_refine  # noqa: E402
from bandpilot.dispatch.search.shape import Placement, from_ranks, score  # noqa: E402
from bandpilot.dispatch.search.shape_moves import nonlocal_moves  # noqa: E402
from bandpilot.dispatch.search.shape_refine import best_move  # noqa: E402
from bandpilot.dispatch.shape import Shape  # noqa: E402
from bandpilot.fabric.emulator import make_fabric  # noqa: E402
from bandpilot.topology.cluster import load_cluster  # noqa: E402

TIE = 5e-4  # relative step-time difference counted as a tie (0.05 %, as the README's tie figures)


def climb(truth: ContentionPredictor, shape: Shape, start: Placement, free: np.ndarray, rounds: int,
          rows: int, seed: int) -> Placement:
    """Best-improvement hill climbing on the truth: each round scores a sample of the non-local and
    the local moves (``rows`` model rows in all, half for each kind at most) and keeps the best if faster."""
    spec = truth.spec
    unit, bits = spec.units[0], int(spec.gpus_per_host.max())
    rows_each = 2 * sum(g.shape[0] for g in shape_refine.group_ranks(shape).values())
    cap = max(rows // rows_each, 16)
    best, rng = start, np.random.default_rng(seed)
    for _ in range(rounds):
        H2, I2 = nonlocal_moves(spec, best, free, shape, cap // 2, rng)
        H1, I1 = shape_refine._moves(best, free, shape, unit, bits, cap - H2.shape[0], rng, cover=0.0)
        H, Ix = np.concatenate([H1, H2]), np.concatenate([I1, I2])
        if not H.shape[0]:
            break
        top = best_move(truth, shape, best, H, Ix, label="")
        if top is None:
            break
        best = top
    return best


def kick(spec, shape: Shape, p: Placement, free: np.ndarray, rng: np.random.Generator, n: int = 3) -> Placement:
    """``n`` random moves in a row (each a random non-local or local one), to leave a local optimum."""
    unit, bits = spec.units[0], int(spec.gpus_per_host.max())
    for _ in range(n):
        H, Ix = (nonlocal_moves(spec, p, free, shape, 1, rng) if rng.random() < 0.5
                 else shape_refine._moves(p, free, shape, unit, bits, 1, rng, cover=0.0))
        if H.shape[0]:
            p = Placement(H[0], Ix[0])
    return p


def search(truth: ContentionPredictor, shape: Shape, starts: list[Placement], free: np.ndarray, rounds: int,
           rows: int, kicks: int, seed: int) -> Placement:
    """Climb from every start, then iterated local search from the best: ``kicks`` random kicks, each
    followed by a climb, kept when faster."""
    rng = np.random.default_rng(seed)
    best = min((climb(truth, shape, s, free, rounds, rows, seed) for s in starts), key=lambda p: p.step_ms)
    for i in range(kicks):
        k = kick(truth.spec, shape, best, free, rng)
        score(truth, shape, [k])
        c = climb(truth, shape, k, free, rounds, rows, seed + 1 + i)
        if c.step_ms < best.step_ms * (1 - 1e-9):
            best = c
    return best


def run(name: str, busy: int, seed: int, rounds: int, rows: int, kicks: int) -> list[dict]:
    spec = load_cluster(ROOT / "params" / "clusters" / f"{name}.yaml")
    fab = make_fabric(spec)
    guide = Dispatcher(NoisyPredictor(fab, 0.05, seed), seed)
    oracle = Dispatcher(fab, seed)
    oracle.shape_bandwidth_seed = True
    rng = np.random.default_rng([seed, len(name)])  # bench_shape's states, in its order
    out = []
    for label, st in _states(spec, fab, rng, busy, 0):
        truth = ContentionPredictor(fab, st)
        for tp, pp, dp in SHAPES:
            shp = Shape.parse({"tp": tp, "pp": pp, "dp": dp})
            if shp.k > st.n_free:
                continue
            t0 = time.perf_counter()
            got = {}
            for a in ("shape", "blind", "segment", "bandpilot"):
                got[a] = from_ranks(spec, guide.select(shp.k, st, a, shape=shp).ranks)
            got["oracle-search"] = from_ranks(spec, oracle.select(shp.k, st, "shape", shape=shp).ranks)
            score(truth, shp, list(got.values()))
            best = search(truth, shp, list(got.values()), st.free, rounds, rows, kicks, seed)
            out.append({"cluster": name, "state": label, "shape": str(shp), "k": shp.k,
                        **{a: p.step_ms for a, p in got.items()}, "oracle": best.step_ms,
                        "start": min(got, key=lambda a: got[a].step_ms), "s": time.perf_counter() - t0})
            r = out[-1]
            print(f"| {name} | {label} | {shp} | {shp.k} | {r['shape']:.1f} | {r['blind']:.1f} | {r['oracle']:.1f} | "
                  f"{r['shape'] / r['oracle'] - 1:+.2%} | {r['blind'] / r['oracle'] - 1:+.2%} | {r['start']} | {r['s']:.0f} |",
                  flush=True)
    return out


def _gm(x: list[float]) -> float:
    return float(np.exp(np.mean(np.log(x)))) if x else float("nan")


def summary_vs(rows: list[dict], ref: str, heads: list[str], extra: tuple | None = None) -> None:
    """Per cluster and state class: the shape pick and blind against a reference step time `ref` (the
    hill-climb oracle here, the certified bound in bench_shape_bound); `extra` is (header, rows -> cell)."""
    heads = heads + ([extra[0]] if extra else [])
    print("\n| cluster | states | cases | " + " | ".join(heads) + " |")
    print("|---" * (3 + len(heads)) + "|")
    for name in dict.fromkeys(r["cluster"] for r in rows):
        for sub, sel in (("idle", lambda r: r["state"] == "idle"), ("busy", lambda r: r["state"] != "idle"),
                         ("idle+busy", lambda r: True)):
            rs = [r for r in rows if r["cluster"] == name and sel(r)]
            if not rs:
                continue
            eq = lambda a, r: r[a] <= r[ref] * (1 + TIE)  # noqa: E731
            cells = [f"{1 - _gm([r['shape'] / r['blind'] for r in rs]):+.1%}",
                     f"{1 - _gm([r[ref] / r['blind'] for r in rs]):+.1%}",
                     f"{_gm([r['shape'] / r[ref] for r in rs]) - 1:+.2%}",
                     str(sum(eq("shape", r) for r in rs)), str(sum(eq("blind", r) for r in rs))]
            if extra:
                cells.append(str(extra[1](rs)))
            print(f"| {name} | {sub} | {len(rs)} | " + " | ".join(cells) + " |")


def summary(rows: list[dict]) -> None:
    summary_vs(rows, "oracle", ["shape vs blind (true)", "oracle vs blind (headroom)", "shape above oracle (gm)",
                                "shape = oracle", "blind = oracle"],
               ("shape > oracle by >= 1 %", lambda rs: sum(r["shape"] > r["oracle"] * 1.01 for r in rs)))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--busy", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--clusters", nargs="*", default=list(CLUSTERS))
    ap.add_argument("--rounds", type=int, default=30, help="hill-climbing rounds on the truth")
    ap.add_argument("--rows", type=int, default=30_000, help="model rows per round")
    ap.add_argument("--kicks", type=int, default=10, help="iterated-local-search kicks after the climbs")
    args = ap.parse_args(argv)
    print("| cluster | state | shape | k | shape ms | blind ms | oracle ms | shape above oracle | blind above oracle "
          "| best start (before climbing) | s |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    rows = []
    for name in args.clusters:
        rows += run(name, args.busy, args.seed, args.rounds, args.rows, args.kicks)
    summary(rows)
    with open("/proc/loadavg") as f:
        print(f"\nload: {f.read().strip()}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
