"""Which scheduler profile should be the default? Cross-validation over workload generators and loads.

    python -m benchmarks profiles [--seeds 2] [--first-seed 0] [--loads 0.7,0.9,1.1] [--jobs 200]
                                  [--generators mixed,seed001,helios,philly] [--candidates NAME,...]
                                  [--workers 2] [--save CELLS.jsonl] [--quick]
    python -m benchmarks profiles --render CELLS.jsonl    # the tables from saved cells (seed sets averaged)

Each candidate profile (the named ones and YAML-expressible variants, :data:`CANDIDATES`) runs on
every (generator, offered load) cell, several seeds each, on the truth the other scheduling
benchmarks use (the measured H100 tables when ``../shared/data`` is present, else the emulated
``params/clusters/h100.yaml``; a perfect predictor, so this measures the scheduler, not the model):

* ``mixed``: our mixed workload (sizes 1-32, heavy-tailed run times, time limits off by up to 3x, half
  preemptible);
* ``seed001``: seed 001's 50 jobs of eight types (run-time estimates exact);
* ``helios`` / ``philly``: the published shapes of the SenseTime Helios and Microsoft Philly traces
  (mostly 1-GPU jobs, powers of two, log-normal run times with a long tail; estimates exact).

Every trace's arrival times are scaled so that it offers exactly the cell's load (GPU-seconds demanded
over the cluster's GPU-seconds in the arrival window, :func:`~bandpilot.simulation.workloads.offered_load`).

The rule (:func:`select`): a candidate's score is its WORST ratio of mean JCT (seed means) to
``fifo-greedy``'s over all cells; the lowest score wins. The report also lists every cell where a
candidate loses to ``fifo-greedy`` on mean JCT or makespan. Nothing is written into the repository
(``--save`` writes where it is told). Measured: ``docs/experiments/profile-crossval.md``.
"""

from __future__ import annotations

import argparse
import json
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from contextlib import nullcontext
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from benchmarks.bench_jct import run, truth_fabric  # noqa: E402
from bandpilot.scheduling.profile import FIFO_GREEDY, RECOMMENDED, SLURM_LIKE, SchedulerProfile  # noqa: E402
from bandpilot.simulation.engine import SimConfig  # noqa: E402
from bandpilot.simulation.trace import TraceJob  # noqa: E402
from bandpilot.simulation.workloads import mixed_workload, offered_load, public_trace_workload, seed001_workload  # noqa: E402

H = 3600.0
REF = FIFO_GREEDY.name
#: Relative difference below which two figures are the same run (float noise in the event times).
TIE = 1e-6
#: What each cell reports, per candidate (means over the seeds).
METRICS = ("avg_jct_s", "p95_jct_s", "max_jct_s", "makespan_s", "gpu_utilization")

#: The candidates: the named profiles and variants a profile YAML can express.
CANDIDATES: dict[str, SchedulerProfile] = {p.name: p for p in (
    RECOMMENDED,
    SLURM_LIKE,
    FIFO_GREEDY,
    replace(RECOMMENDED, name="recommended-easy", backfill="easy", reservations=1),
    replace(RECOMMENDED, name="recommended-no-wait", start_or_wait=False),
    replace(RECOMMENDED, name="recommended-easy-no-wait", backfill="easy", reservations=1, start_or_wait=False),
    replace(RECOMMENDED, name="hrrn-greedy", backfill="greedy", reservations=1, start_or_wait=False),
    SchedulerProfile("fifo-greedy-bandpilot", locality=0.5),
    SchedulerProfile("fifo-conservative-bandpilot", backfill="conservative", reservations=2, locality=0.5),
    # the queue order alone on top of fifo-greedy (no reservation, Slurm's placement)
    SchedulerProfile("hrrn-greedy-compact", queue_sort="hrrn", placement="compact"),
    SchedulerProfile("sjf-greedy-compact", queue_sort="sjf", placement="compact"),
)}


def at_load(jobs: list[TraceJob], n_gpus: int, load: float) -> list[TraceJob]:
    """The same jobs with their arrival times scaled so the trace offers exactly ``load``."""
    scale = offered_load(jobs, n_gpus) / load
    t0 = jobs[0].submit_s
    return [replace(j, submit_s=round(t0 + (j.submit_s - t0) * scale, 3)) for j in jobs]


def _seed001(n: int, n_gpus: int, load: float, seed: int) -> list[TraceJob]:
    jobs = seed001_workload(seed)  # fixed 50 jobs: the generator has no size knob
    return jobs[:n] if n < len(jobs) else jobs


#: generator name -> (jobs, n_gpus, load, seed) -> trace (before the load scaling)
GENERATORS: dict[str, Callable[[int, int, float, int], list[TraceJob]]] = {
    "mixed": lambda n, g, load, s: mixed_workload(n, n_gpus=g, load=load, seed=s),
    "seed001": _seed001,
    "helios": lambda n, g, load, s: public_trace_workload("helios", n, n_gpus=g, load=load, seed=s),
    "philly": lambda n, g, load, s: public_trace_workload("philly", n, n_gpus=g, load=load, seed=s),
}


@dataclass(frozen=True)
class Grid:
    generators: tuple[str, ...]
    loads: tuple[float, ...]
    seeds: int
    jobs: int
    candidates: tuple[str, ...]
    first_seed: int = 0  # held-out seeds check a choice made on others


#: results[(generator, load)][candidate] -> {metric: mean over seeds}
Results = dict[tuple[str, float], dict[str, dict[str, float]]]


def run_cell(grid: Grid, gen: str, load: float, truth=None) -> dict[str, dict[str, float]]:
    """One (generator, load) cell: every candidate on ``grid.seeds`` traces, the seed means of :data:`METRICS`."""
    truth = truth if truth is not None else truth_fabric()[0]
    n_gpus = truth.spec.n_gpus
    per: dict[str, list[dict]] = {c: [] for c in grid.candidates}
    for s in range(grid.first_seed, grid.first_seed + grid.seeds):
        jobs = at_load(GENERATORS[gen](grid.jobs, n_gpus, load, s), n_gpus, load)
        for c in grid.candidates:
            per[c].append(run(jobs, truth, SimConfig(profile=CANDIDATES[c], seed=s)))
    cell = {c: {m: float(np.mean([r[m] for r in rs])) for m in METRICS} for c, rs in per.items()}
    for c, rs in per.items():
        cell[c]["incomplete"] = float(sum(r["jobs"] - r["completed"] for r in rs))
        cell[c]["n_seeds"] = float(len(rs))
    return cell


def _cell_task(args: tuple[Grid, str, float]) -> tuple[str, float, dict, float]:
    t0 = time.perf_counter()
    grid, gen, load = args
    return gen, load, run_cell(grid, gen, load), time.perf_counter() - t0


def run_grid(grid: Grid, workers: int = 1, save: Path | None = None,
             log: Callable[[str], None] = lambda m: print(m, flush=True)) -> Results:
    """Every candidate on every (generator, load) cell, ``workers`` cells at a time; one progress line
    per cell as it ends (and, with ``save``, the cell appended to that JSON-lines file)."""
    tasks = [(grid, gen, load) for load in grid.loads for gen in grid.generators]  # a cut-short run has every generator
    out: Results = {}
    with ProcessPoolExecutor(workers) if workers > 1 else nullcontext() as pool:
        done = as_completed([pool.submit(_cell_task, t) for t in tasks]) if pool else None
        for gen, load, cell, wall in ((f.result() for f in done) if done else map(_cell_task, tasks)):
            out[(gen, load)] = cell
            if save is not None:
                with save.open("a") as f:
                    seeds = list(range(grid.first_seed, grid.first_seed + grid.seeds))
                    f.write(json.dumps({"generator": gen, "load": load, "seeds": seeds, "cell": cell}) + "\n")
            best = min(cell, key=lambda c: cell[c]["avg_jct_s"])
            log(f"  {gen} @ load {load:g}: {grid.seeds} seeds x {len(grid.candidates)} candidates in {wall:.0f} s; "
                f"best mean {best} {cell[best]['avg_jct_s'] / H:.2f} h ({REF} {cell[REF]['avg_jct_s'] / H:.2f} h)")
    return out


def read_saved(path: Path) -> Results:
    """The cells a ``--save`` file holds. Runs appended to one file merge: further candidates join a
    cell, and runs on other seeds of the same (generator, load, candidate) are averaged, weighted by
    their seed counts (a run on the same seeds replaces the earlier one; overlapping seed sets are an
    error)."""
    runs: dict[tuple[str, float], dict[str, dict[tuple[int, ...], dict[str, float]]]] = {}
    for line in path.read_text().splitlines():
        d = json.loads(line)
        seeds = tuple(d.get("seeds", ()))
        for c, figures in d["cell"].items():
            runs.setdefault((d["generator"], float(d["load"])), {}).setdefault(c, {})[seeds] = figures
    out: Results = {}
    for key, cands in runs.items():
        for c, by_seeds in cands.items():
            sets = list(by_seeds)
            if len({s for ss in sets for s in ss}) != sum(len(ss) for ss in sets):
                raise ValueError(f"{key[0]} @ {key[1]:g}, {c}: overlapping seed sets {sets}")
            w = [max(len(ss), 1) for ss in sets]
            figs = list(by_seeds.values())
            out.setdefault(key, {})[c] = {m: (sum(f[m] for f in figs) if m in ("incomplete", "n_seeds")
                                              else sum(wi * f[m] for wi, f in zip(w, figs)) / sum(w)) for m in figs[0]}
    return out


@dataclass(frozen=True)
class Verdict:
    winner: str
    score: dict[str, float]  # candidate -> worst mean-JCT ratio to the reference over the cells
    worst_cell: dict[str, tuple[str, float]]
    losses: dict[str, list[tuple[str, float, str, float]]]  # candidate -> (generator, load, metric, ratio) where > 1
    strict: dict[str, float]  # candidate -> worst ratio to the reference over the cells, mean JCT and makespan alike
    strict_winner: str
    regret: dict[str, float]  # candidate -> worst ratio of mean JCT to the best candidate's in the cell


def select(results: Results, ref: str = REF) -> Verdict:
    """The candidate whose worst mean-JCT ratio to ``ref`` over all cells is lowest (ties: the lower
    mean ratio, then the name); and each candidate's cells where it is above ``ref`` on mean JCT or
    makespan. The stricter reading (``strict``): the worst ratio over the cells on mean JCT and
    makespan alike, the lowest winning. For information (not the rule): each candidate's worst
    regret, its mean JCT over the best candidate's in the same cell."""
    cands = sorted({c for cell in results.values() for c in cell})
    score, worst, mean_ratio, losses, strict, regret = {}, {}, {}, {}, {}, {}
    for c in cands:
        ratios = {key: cell[c]["avg_jct_s"] / cell[ref]["avg_jct_s"] for key, cell in results.items()}
        worst[c] = max(ratios, key=ratios.get)
        score[c] = ratios[worst[c]]
        mean_ratio[c] = float(np.mean(list(ratios.values())))
        losses[c] = [(g, load, m, results[(g, load)][c][m] / results[(g, load)][ref][m])
                     for (g, load) in results for m in ("avg_jct_s", "makespan_s")
                     if results[(g, load)][c][m] > (1 + TIE) * results[(g, load)][ref][m]]
        regret[c] = max(cell[c]["avg_jct_s"] / min(r["avg_jct_s"] for r in cell.values()) for cell in results.values())
        strict[c] = max(cell[c][m] / cell[ref][m] for cell in results.values() for m in ("avg_jct_s", "makespan_s"))
    winner = min(cands, key=lambda c: (score[c], mean_ratio[c], c))
    strict_winner = min(cands, key=lambda c: (strict[c], score[c], mean_ratio[c], c))
    return Verdict(winner, score, worst, losses, strict, strict_winner, regret)


def render(results: Results, verdict: Verdict) -> str:
    """Markdown: per generator a table of every (load, candidate), then the rule's summary."""
    blocks = []
    gens = list(dict.fromkeys(g for g, _ in results))
    cands = list(dict.fromkeys(c for cell in results.values() for c in cell))
    for gen in gens:
        lines = [f"### {gen}", "",
                 "| load | candidate | mean JCT (h) | p95 (h) | max (h) | makespan (h) | GPU util | mean vs fifo-greedy | makespan vs fifo-greedy |",
                 "|---|---|---|---|---|---|---|---|---|"]
        for load in sorted(x for g, x in results if g == gen):
            cell = results[(gen, load)]
            for c in cands:
                r, ref = cell[c], cell[REF]
                bad = "" if not r["incomplete"] else f" ({r['incomplete']:.0f} jobs unfinished)"
                if r.get("n_seeds") != ref.get("n_seeds"):  # a merged --save file: not the same seeds as the reference
                    bad += f" ({r.get('n_seeds', 0):.0f} seeds, {REF} {ref.get('n_seeds', 0):.0f})"
                lines.append(f"| {load:g} | {c}{bad} | {r['avg_jct_s'] / H:.2f} | {r['p95_jct_s'] / H:.2f} | {r['max_jct_s'] / H:.2f} | "
                             f"{r['makespan_s'] / H:.1f} | {r['gpu_utilization']:.2f} | {_pct(r['avg_jct_s'], ref['avg_jct_s'])} | "
                             f"{_pct(r['makespan_s'], ref['makespan_s'])} |")
        blocks.append("\n".join(lines))
    summary = ["### The rule: best on the worst cell", "",
               "| candidate | profile | worst mean JCT vs fifo-greedy | at | cells lost on mean JCT | cells lost on makespan | "
               "worst of mean JCT and makespan | worst mean JCT vs the cell's best |",
               "|---|---|---|---|---|---|---|---|"]
    for c in sorted(verdict.score, key=lambda c: verdict.score[c]):
        g, load = verdict.worst_cell[c]
        lost = verdict.losses[c]
        n_mean = sum(m == "avg_jct_s" for *_, m, _ in lost)
        n_span = sum(m == "makespan_s" for *_, m, _ in lost)
        summary.append(f"| {'**' + c + '**' if c == verdict.winner else c} | {CANDIDATES[c].describe() if c in CANDIDATES else ''} | "
                       f"{(verdict.score[c] - 1) * 100:+.1f} % | {g} @ {load:g} | {n_mean} / {len(results)} | {n_span} / {len(results)} | "
                       f"{(verdict.strict[c] - 1) * 100:+.1f} % | {(verdict.regret[c] - 1) * 100:+.1f} % |")
    w = verdict.losses[verdict.winner]
    summary += ["", f"- winner: {verdict.winner}" + (f" ({CANDIDATES[verdict.winner].describe()})" if verdict.winner in CANDIDATES else ""),
                f"- winner loses to {REF}: " + ("never" if not w else
                                              "; ".join(f"{g} @ {load:g} {m.removesuffix('_s').replace('avg_jct', 'mean JCT')} "
                                                        f"{(x - 1) * 100:+.2f} %" for g, load, m, x in w)),
                f"- stricter rule (worst of mean JCT and makespan): {verdict.strict_winner} "
                f"({(verdict.strict[verdict.strict_winner] - 1) * 100:+.1f} %)"]
    return "\n\n".join(blocks) + "\n\n" + "\n".join(summary)


def _pct(x: float, ref: float) -> str:
    return f"{(x / ref - 1) * 100:+.1f} %" if ref > 0 else "n/a"


def _floats(text: str, what: str, ap: argparse.ArgumentParser) -> tuple[float, ...]:
    try:
        vals = tuple(float(x) for x in text.split(",") if x)
    except ValueError:
        ap.error(f"--{what}: expected comma-separated numbers, got {text!r}")
    if not vals or any(not v > 0 for v in vals):
        ap.error(f"--{what}: every value must be > 0, got {text!r}")
    return vals


def _names(text: str, known, what: str, ap: argparse.ArgumentParser) -> tuple[str, ...]:
    names = tuple(x for x in text.split(",") if x)
    unknown = [x for x in names if x not in known]
    if not names or unknown:
        ap.error(f"--{what}: unknown {unknown[0] if unknown else 'empty list'!r}: use {', '.join(known)}")
    return names


def parse(argv: list[str]) -> tuple[Grid, argparse.Namespace]:
    ap = argparse.ArgumentParser(prog="python -m benchmarks profiles", description=__doc__.split("\n")[0])
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--loads", default="0.7,0.9,1.1", help="offered loads (comma-separated)")
    ap.add_argument("--generators", default=",".join(GENERATORS))
    ap.add_argument("--candidates", default=",".join(CANDIDATES), help=f"comma-separated; {REF} is always run (the reference)")
    ap.add_argument("--first-seed", type=int, default=0, help="the first seed (the run takes --seeds from it)")
    ap.add_argument("--jobs", type=int, default=200, help="jobs per trace (seed001 has 50 at most)")
    ap.add_argument("--quick", action="store_true", help="a smoke run: 12 jobs, 1 seed, load 0.9, mixed + seed001 + helios, 3 candidates")
    ap.add_argument("--workers", type=int, default=2, help="cells simulated at a time (processes)")
    ap.add_argument("--save", type=Path, help="append each cell's figures to this JSON-lines file as it ends")
    ap.add_argument("--render", type=Path, metavar="SAVED", help="no simulation: the tables and the rule from a --save file")
    a = ap.parse_args(argv)
    if a.quick:
        a.seeds, a.jobs, a.loads, a.generators = 1, 12, "0.9", "mixed,seed001,helios"
        a.candidates = f"{RECOMMENDED.name},{SLURM_LIKE.name}"
    if a.seeds < 1 or a.jobs < 2 or a.workers < 1 or a.first_seed < 0:
        ap.error(f"--seeds and --workers must be >= 1, --jobs >= 2 and --first-seed >= 0, "
                 f"got {a.seeds}, {a.workers}, {a.jobs} and {a.first_seed}")
    cands = _names(a.candidates, CANDIDATES, "candidates", ap)
    cands = cands if REF in cands else (*cands, REF)
    gens = _names(a.generators, GENERATORS, "generators", ap)
    return Grid(gens, _floats(a.loads, "loads", ap), a.seeds, a.jobs, cands, a.first_seed), a


def main(argv: list[str] | None = None) -> int:
    grid, a = parse(sys.argv[1:] if argv is None else argv)
    if a.render is not None:
        try:
            results = read_saved(a.render)
        except (OSError, ValueError, KeyError, TypeError) as exc:
            print(f"error: --render {a.render}: not a file of saved cells ({exc})", file=sys.stderr)
            return 2
        if not results:
            print(f"error: --render {a.render}: no saved cells", file=sys.stderr)
            return 2
        print(render(results, select(results)))
        return 0
    truth, what = truth_fabric()
    print(f"truth: {what}; {truth.spec.n_gpus} GPUs; load {open('/proc/loadavg').read().split()[:3]}")
    print(f"{len(grid.generators)} generators x {len(grid.loads)} loads x {grid.seeds} seeds x {len(grid.candidates)} candidates, "
          f"{grid.jobs} jobs a trace, seeds from {grid.first_seed}, {a.workers} workers; demand model `full`\n", flush=True)
    t0 = time.perf_counter()
    results = run_grid(grid, a.workers, a.save)
    print("\n" + render(results, select(results)))
    cpu = sum(resource.getrusage(w).ru_utime + resource.getrusage(w).ru_stime for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN))
    print(f"\n({time.perf_counter() - t0:.0f} s wall, {cpu:.0f} s CPU; load {open('/proc/loadavg').read().split()[:3]})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
