"""Dispatcher benchmark: select latency and allocation quality (mean GBE vs Exact).

    python benchmarks/bench_dispatch.py [--quick] [--states 20] [--seed 0]

* latency of ``Dispatcher.select`` on the 32-GPU H100 and Het-4Mix emulated clusters (2 threads):
  median / p99 over k = 1..32 and random states, per algorithm, with model evaluations;
* p50 latency on 512- and 1,024-GPU emulated clusters (64 / 128 H100 hosts; the spec files
  ``params/clusters/h100-64.yaml`` / ``h100-128.yaml`` are used when present);
* quality: mean GBE vs Exact (true contention-aware bandwidth of the chosen GPUs / true optimum)
  for k = 1..32, N random states per k, under the idle / moderate / heavy traffic profiles.

"EHA+PTS (paper)" is the paper's hybrid (both, keep the better), and EHA / PTS alone, guided
by the true fabric (an ablation of the search, like Ideal-BP). "bandpilot (noisy 5%)" is BandPilot guided by the fabric with 5 % multiplicative log-normal
noise on cross-host predictions (deterministic per allocation) - a stand-in for the trained
surrogate; "Ideal-BP" is BandPilot guided by the fabric itself.

States: random background jobs of mixed sizes (some spanning 2-3 hosts) until ~30-70 % of the
GPUs are busy (capped so that k GPUs stay free). Job demands follow the profile: idle d_j = 0,
moderate d_j = U[0.25, 0.75] * B(S_j), heavy d_j = B(S_j).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "2")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
os.environ.setdefault("MKL_NUM_THREADS", "2")

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bandpilot.topology.cluster import ClusterSpec, load_cluster, popcount, spec_from_dict  # noqa: E402
from bandpilot.dispatch.contention import ContentionPredictor  # noqa: E402
from bandpilot.dispatch.dispatcher import Dispatcher  # noqa: E402
from bandpilot.fabric.emulator import make_fabric  # noqa: E402
from bandpilot.dispatch.state import State  # noqa: E402

PROFILES = ("idle", "moderate", "heavy")


class NoisyPredictor:
    """A fabric with multiplicative log-normal noise on cross-host predictions (a surrogate
    stand-in): stage-1 stays exact (it is measured), noise is deterministic per allocation."""

    def __init__(self, fabric, sigma: float = 0.05, seed: int = 0) -> None:
        self.fabric = fabric
        self.spec = fabric.spec
        self.stage1 = fabric.stage1
        self.sigma = sigma
        self.seed = seed
        w = np.random.default_rng(seed).integers(1, 2**62, size=(2, self.spec.n_hosts))
        self._w = w | 1

    def predict_masks(self, masks: np.ndarray) -> np.ndarray:
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        truth = self.fabric.predict_masks(masks)
        with np.errstate(over="ignore"):
            h1 = (masks * self._w[0]).sum(axis=1)
            h2 = (masks * self._w[1]).sum(axis=1)
        u1 = (_mix(h1) >> np.uint64(11)).astype(float) / 2.0**53
        u2 = (_mix(h2) >> np.uint64(11)).astype(float) / 2.0**53
        z = np.sqrt(-2 * np.log(np.maximum(u1, 1e-300))) * np.cos(2 * np.pi * u2)
        cross = (masks != 0).sum(axis=1) >= 2
        return np.where(cross, truth * np.exp(self.sigma * z), truth)


def _mix(x: np.ndarray) -> np.ndarray:
    """splitmix64 finaliser (vectorised)."""
    z = x.astype(np.uint64)
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return z


def random_state(spec: ClusterSpec, fabric, rng: np.random.Generator, profile: str, k: int = 1) -> State:
    """Random background jobs (mixed sizes, some cross-host) covering ~30-70 % of the GPUs."""
    n = spec.n_gpus
    target = min(int(rng.uniform(0.3, 0.7) * n), n - k)
    free = spec.full_masks.copy()
    jobs = []
    busy = 0
    sizes = np.array([1, 2, 2, 4, 4, 8, 3, 6, 12, 16])
    while busy < target:
        size = int(min(rng.choice(sizes), target - busy))
        f = popcount(free)
        cross = rng.random() < 0.4 or size > f.max()
        if not cross:
            hs = np.flatnonzero(f >= size)
            h = int(rng.choice(hs))
            parts = {h: size}
        else:
            hs = np.flatnonzero(f > 0)
            nh = int(min(len(hs), rng.integers(2, 4), size)) if size >= 2 else 1
            pick = rng.choice(hs, size=nh, replace=False)
            parts = {int(h): 1 for h in pick}
            left = size - nh
            while left > 0:
                cand = [h for h in parts if parts[h] < f[h]]
                if not cand:
                    extra = [int(h) for h in np.flatnonzero(f > 0) if int(h) not in parts]
                    parts[extra[0]] = 0
                    cand = [extra[0]]
                h = int(rng.choice(cand))
                parts[h] += 1
                left -= 1
        mask = np.zeros(spec.n_hosts, dtype=np.int64)
        for h, c in parts.items():
            bits = [i for i in range(spec.hosts[h].n_gpus) if free[h] >> i & 1]
            for i in rng.choice(bits, size=c, replace=False):
                mask[h] |= np.int64(1) << int(i)
        free &= ~mask
        busy += size
        b = float(fabric.bandwidth_masks(mask[None, :])[0])
        d = {"idle": 0.0, "moderate": float(rng.uniform(0.25, 0.75)) * b, "heavy": b}[profile]
        jobs.append({"id": f"j{len(jobs)}", "gpus": spec.from_mask(mask), "demand_gbps": d})
    return State.from_dict(spec, {"free": spec.from_mask(free), "jobs": jobs})


def big_spec(hosts: int) -> ClusterSpec:
    p = ROOT / "params" / "clusters" / f"h100-{hosts}.yaml"
    if p.is_file():
        return load_cluster(p)
    base = ROOT / "params" / "clusters" / "h100.yaml"
    doc = yaml.safe_load(base.read_text())
    doc["name"] = f"h100-{hosts}"
    doc["host_groups"][0]["count"] = hosts
    return spec_from_dict(doc, base.parent, f"h100-{hosts}")


def pct(a, q):
    return float(np.percentile(np.asarray(a, dtype=float), q)) if len(a) else float("nan")


# ------------------------------------------------------------------------------------------
def bench_latency(cluster: str, states_per_k: int, seed: int, algos: list[str]) -> list[dict]:
    spec = load_cluster(ROOT / "params" / "clusters" / f"{cluster}.yaml")
    fab = make_fabric(spec)
    noisy = NoisyPredictor(fab, 0.05, seed)
    rng = np.random.default_rng(seed)
    disp = {"ideal": Dispatcher(fab, seed), "noisy": Dispatcher(noisy, seed)}
    if "BandPilot (trained)" in algos:
        disp["trained"] = Dispatcher(trained_surrogate(fab, seed), seed)
    rows: dict[str, dict] = {a: {"ms": [], "ev": []} for a in algos}
    cases = []
    for k in range(1, spec.n_gpus + 1):
        for _ in range(states_per_k):
            prof = PROFILES[int(rng.integers(3))]
            cases.append((k, random_state(spec, fab, rng, prof, k)))
    # warm-up
    for a in algos:
        _select(a, disp, 4, cases[0][1], fab)
    for k, st in cases:
        for a in algos:
            t = time.perf_counter()
            s = _select(a, disp, k, st, fab)
            rows[a]["ms"].append((time.perf_counter() - t) * 1e3)
            rows[a]["ev"].append(s.evaluations)
    out = []
    for a in algos:
        r = rows[a]
        out.append({"cluster": cluster, "algorithm": a, "p50": pct(r["ms"], 50), "p99": pct(r["ms"], 99),
                    "max": max(r["ms"]), "ev_mean": float(np.mean(r["ev"])), "ev_max": int(max(r["ev"]))})
    return out


def saved_surrogate(fab, seed: int, where: str | None):
    """:func:`trained_surrogate`, kept in the directory ``where`` (loaded from it when it holds one
    for this cluster): before/after runs of the decision path compare the same model."""
    from bandpilot.model.surrogate import Surrogate

    if where and (Path(where) / "surrogate.json").is_file():
        sur = Surrogate.load(where)
        if sur.spec.fingerprint() != fab.spec.fingerprint():
            raise SystemExit(f"--surrogate {where} was trained for {sur.spec.name!r}, not {fab.spec.name!r}")
        return sur
    sur = trained_surrogate(fab, seed)
    if where:
        sur.save(where)
    return sur


def bench_trained(cluster: str, states_per_k: int, seed: int, where: str | None) -> dict:
    """A trained surrogate's decisions on ``cluster`` (k = 1..n_gpus, ``states_per_k`` random states
    each, the latency table's cases): wall and CPU time per select and every pick (GPUs and
    predicted GB/s), for a before/after comparison of the decision path (``--picks-out`` /
    ``--picks-against``)."""
    spec = load_cluster(ROOT / "params" / "clusters" / f"{cluster}.yaml")
    fab = make_fabric(spec)
    d = Dispatcher(saved_surrogate(fab, seed, where), seed)
    rng = np.random.default_rng(seed)
    cases = [(k, random_state(spec, fab, rng, PROFILES[int(rng.integers(3))], k))
             for k in range(1, spec.n_gpus + 1) for _ in range(states_per_k)]
    d.select(4, cases[0][1])
    ms, cpu, picks = [], [], []
    for k, st in cases:
        t, c = time.perf_counter(), time.process_time()
        sel = d.select(k, st)
        ms.append((time.perf_counter() - t) * 1e3)
        cpu.append((time.process_time() - c) * 1e3)
        picks.append({"k": k, "gpus": sel.gpus, "gbps": sel.predicted_gbps})
    return {"cluster": cluster, "n": len(cases), "p50": pct(ms, 50), "p99": pct(ms, 99), "max": max(ms),
            "cpu_p50": pct(cpu, 50), "cpu_p99": pct(cpu, 99), "picks": picks,
            "slowest": sorted(zip(cpu, [k for k, _ in cases]), reverse=True)[:4]}


def compare_picks(picks: list[dict], path: str) -> int:
    """Picks that differ from those recorded in ``path`` (GPUs, or predicted GB/s beyond 1e-9)."""
    import json

    ref = json.loads(Path(path).read_text())
    if len(ref) != len(picks):
        raise SystemExit(f"{path}: {len(ref)} recorded picks, this run made {len(picks)} (other cases or seed)")
    bad = [i for i, (a, b) in enumerate(zip(picks, ref))
           if a["k"] != b["k"] or a["gpus"] != b["gpus"] or abs(a["gbps"] - b["gbps"]) > 1e-9 * max(1.0, abs(b["gbps"]))]
    for i in bad[:5]:
        print(f"  case {i} (k={picks[i]['k']}): {picks[i]['gpus']} {picks[i]['gbps']:.4f} GB/s, recorded "
              f"{ref[i]['gpus']} {ref[i]['gbps']:.4f} GB/s")
    return len(bad)


def trained_surrogate(fab, seed: int):
    """The real product path: a surrogate trained (default params/train.yaml) on 250 noisy
    cross-host measurements of the emulated cluster plus its stage-1 tables."""
    from bandpilot.data.synthetic import fabric_dataset
    from bandpilot.model.params import TrainParams
    from bandpilot.model.train import train

    params = TrainParams.load(ROOT / "params" / "train.yaml", {"seed": seed})
    return train(fabric_dataset(fab, n_cross=400, seed=seed), params, plots=False).surrogate


def _algo(a: str, disp: dict):
    """(algorithm, dispatcher) for a table row. EHA / PTS are guided by the true fabric (an
    algorithm ablation, like Ideal-BP); "bandpilot (noisy 5%)" by the noisy stand-in model."""
    if a == "bandpilot (noisy 5%)":
        return "bandpilot", disp["noisy"]
    if a == "Ideal-BP":
        return "bandpilot", disp["ideal"]
    if a == "BandPilot (trained)":
        return "bandpilot", disp["trained"]
    return a, disp["ideal"]


def _select(a: str, disp: dict, k: int, st: State, fab):
    if a == "EHA+PTS (paper)":  # the paper's hybrid: run both, keep the higher prediction
        e = disp["ideal"].select(k, st, "eha")
        p = disp["ideal"].select(k, st, "pts")
        best = e if e.predicted_gbps >= p.predicted_gbps else p
        best.evaluations = e.evaluations + p.evaluations
        best.search_ms = e.search_ms + p.search_ms
        return best
    name, d = _algo(a, disp)
    return d.select(k, st, name, fabric=fab)


def bench_large(hosts: int, n_states: int, seed: int, ks: list[int], algos: list[str]) -> list[dict]:
    spec = big_spec(hosts)
    fab = make_fabric(spec)
    noisy = NoisyPredictor(fab, 0.05, seed)
    rng = np.random.default_rng(seed)
    d = {"Ideal-BP": Dispatcher(fab, seed), "bandpilot (noisy 5%)": Dispatcher(noisy, seed)}
    out = []
    cases = []
    for k in ks:
        for _ in range(n_states):
            cases.append((k, random_state(spec, fab, rng, "moderate", k)))
    for a in algos:
        disp = d.get(a, d["bandpilot (noisy 5%)"])
        name = "bandpilot" if a in d else a
        disp.select(ks[0], cases[0][1], name)  # warm-up
        ms, ev = [], []
        for k, st in cases:
            t = time.perf_counter()
            s = disp.select(k, st, name)
            ms.append((time.perf_counter() - t) * 1e3)
            ev.append(s.evaluations)
        out.append({"gpus": spec.n_gpus, "algorithm": a, "p50": pct(ms, 50), "p90": pct(ms, 90),
                    "max": max(ms), "ev_mean": float(np.mean(ev))})
    return out


def bench_quality(cluster: str, states_per_k: int, seed: int, algos: list[str]) -> dict:
    spec = load_cluster(ROOT / "params" / "clusters" / f"{cluster}.yaml")
    fab = make_fabric(spec)
    noisy = NoisyPredictor(fab, 0.05, seed)
    disp = {"ideal": Dispatcher(fab, seed), "noisy": Dispatcher(noisy, seed)}
    res: dict[str, dict[str, list[float]]] = {p: {a: [] for a in algos} for p in PROFILES}
    for pi, prof in enumerate(PROFILES):
        rng = np.random.default_rng([seed, pi])
        for k in range(1, spec.n_gpus + 1):
            for _ in range(states_per_k):
                st = random_state(spec, fab, rng, prof, k)
                truth = ContentionPredictor(fab, st)
                best = disp["ideal"].select(k, st, "exact", fabric=fab)
                bstar = best.predicted_gbps
                for a in algos:
                    s = _select(a, disp, k, st, fab)
                    b = float(truth.predict(s.mask[None, :]).value[0])
                    if b > bstar * (1 + 1e-9) + 1e-9:
                        raise AssertionError(f"{a} beat Exact: {b} > {bstar} ({cluster}, k={k})")
                    res[prof][a].append(1.0 if bstar <= 0 else b / bstar)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--states", type=int, default=20, help="random states per k (quality)")
    ap.add_argument("--latency-states", type=int, default=5, help="random states per k (latency)")
    ap.add_argument("--large-states", type=int, default=3, help="random states per k (512/1,024 GPUs)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--quick", action="store_true", help="few states, for a smoke run")
    ap.add_argument("--skip", nargs="*", default=[], choices=["latency", "large", "quality"])
    ap.add_argument("--trained", action="store_true", help="only a trained surrogate's decisions on the 32-GPU "
                    "H100 cluster (latency, CPU time, picks)")
    ap.add_argument("--surrogate", help="directory of that surrogate: loaded when it holds one, else trained and saved there")
    ap.add_argument("--picks-out", help="write that run's picks (JSON) here")
    ap.add_argument("--picks-against", help="compare that run's picks with these (JSON from --picks-out); exit 1 on a difference")
    args = ap.parse_args()
    if args.trained:
        import json

        r = bench_trained("h100", args.latency_states, args.seed, args.surrogate)
        print(f"load: {open('/proc/loadavg').read().strip()}")
        print("| cluster | selects | p50 ms | p99 ms | max ms | CPU p50 ms | CPU p99 ms | target p50 / p99 (quiet) |")
        print("|---|---:|---:|---:|---:|---:|---:|---|")
        print(f"| {r['cluster']} (trained surrogate) | {r['n']} | {r['p50']:.2f} | {r['p99']:.2f} | {r['max']:.2f} "
              f"| {r['cpu_p50']:.2f} | {r['cpu_p99']:.2f} | 1 / 8 ms |")
        print("slowest decisions (CPU ms, k): " + ", ".join(f"{c:.1f} (k={k})" for c, k in r["slowest"]))
        if args.picks_out:
            Path(args.picks_out).write_text(json.dumps(r["picks"]))
        if args.picks_against:
            bad = compare_picks(r["picks"], args.picks_against)
            print(f"picks vs {args.picks_against}: {r['n'] - bad} of {r['n']} identical")
            sys.exit(1 if bad else 0)
        return
    if args.quick:
        args.states, args.latency_states, args.large_states = 2, 1, 1
    algos = ["Ideal-BP", "bandpilot (noisy 5%)", "EHA+PTS (paper)", "eha", "pts", "topo", "default", "random"]
    print(f"# BandPilot dispatcher benchmark (OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, seed={args.seed})\n")
    if "latency" not in args.skip:
        print(f"## select latency, 32-GPU clusters (k = 1..32, {args.latency_states} random states per k)\n")
        print("| cluster | algorithm | p50 ms | p99 ms | max ms | evaluations mean | evaluations max |")
        print("|---|---|---:|---:|---:|---:|---:|")
        for cl in ("h100", "het4mix"):
            for r in bench_latency(cl, args.latency_states, args.seed, ["BandPilot (trained)"] + algos + ["exact"]):
                print(f"| {r['cluster']} | {r['algorithm']} | {r['p50']:.2f} | {r['p99']:.2f} | {r['max']:.2f} | {r['ev_mean']:.0f} | {r['ev_max']} |")
        print()
    if "large" not in args.skip:
        ks = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128]
        print(f"## select latency, large emulated H100 clusters (moderate profile, k in {ks}, {args.large_states} states per k)\n")
        print("| GPUs | algorithm | p50 ms | p90 ms | max ms | evaluations mean |")
        print("|---:|---|---:|---:|---:|---:|")
        for hosts in (64, 128):
            for r in bench_large(hosts, args.large_states, args.seed, ks, ["Ideal-BP", "bandpilot (noisy 5%)", "eha"]):
                print(f"| {r['gpus']} | {r['algorithm']} | {r['p50']:.1f} | {r['p90']:.1f} | {r['max']:.1f} | {r['ev_mean']:.0f} |")
        print()
    if "quality" not in args.skip:
        print(f"## mean GBE vs Exact (%), k = 1..32, {args.states} random states per k\n")
        for cl in ("h100", "het4mix"):
            t = time.perf_counter()
            res = bench_quality(cl, args.states, args.seed, algos)
            print(f"### {cl}  ({time.perf_counter() - t:.0f} s)\n")
            print("| algorithm | " + " | ".join(f"{p}" for p in PROFILES) + " | min GBE (all) |")
            print("|---|" + "---:|" * (len(PROFILES) + 1))
            for a in algos:
                cells = [f"{100 * np.mean(res[p][a]):.1f}" for p in PROFILES]
                mn = min(min(res[p][a]) for p in PROFILES)
                print(f"| {a} | " + " | ".join(cells) + f" | {100 * mn:.1f} |")
            print()


if __name__ == "__main__":
    main()
