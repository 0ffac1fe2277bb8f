"""Queue benchmark: 1,000 queued requests assigned by batch runs with releases in between.

    python benchmarks/bench_queue.py                 # 32-GPU h100 and 1,024-GPU h100-128 scenarios
    python benchmarks/bench_queue.py --scenario small --store postgresql://postgres@127.0.0.1/test
    python benchmarks/bench_queue.py --model models:/bandpilot-h100@champion --scenario small

Each scenario: submit N seeded requests (mixed k, tenants, priorities, utilities, ~20% with
constraints) from JSONL in one call, then loop { run_batch; release a random half of the active
jobs } until nothing is pending. The model is the cluster's fabric (a perfect predictor) unless
``--model`` names a registered one. Targets: small <= 30 s end to end, large <= 300 s.
Figures are printed as Markdown.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time
import uuid
from pathlib import Path

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bandpilot import queue as q  # noqa: E402
from bandpilot import scheduling as sched  # noqa: E402
from bandpilot.topology.cluster import ClusterSpec, load_cluster, spec_from_dict  # noqa: E402
from bandpilot.config import setup_env  # noqa: E402
from bandpilot.scheduling.profile import SchedulerProfile  # noqa: E402

TARGETS = {"small": 30.0, "large": 300.0, "100k": 60.0}  # 100k: batch time (bench_scale.bench_queue_100k)


def large_spec() -> ClusterSpec:
    """``params/clusters/h100-128.yaml`` if present, else 128 x 8 H100 in 8 domains of 16 hosts."""
    p = ROOT / "params" / "clusters" / "h100-128.yaml"
    if p.is_file():
        return load_cluster(p)
    doc = yaml.safe_load((ROOT / "params" / "clusters" / "h100.yaml").read_text())
    doc["name"] = "h100-128"
    doc["host_groups"][0].update(count=128, domain_size=16)
    return spec_from_dict(doc, ROOT / "params" / "clusters", "h100-128 (built)")


def workload(spec: ClusterSpec, n: int, seed: int) -> str:
    """Seeded JSONL: k mostly small, a few large; 4 tenants; ~20% constrained."""
    rng = np.random.default_rng(seed)
    big = spec.n_gpus >= 256
    ks = np.array([1, 2, 4, 8, 16, 32, 64] if big else [1, 2, 3, 4, 8, 16])
    p = np.array([0.2, 0.25, 0.2, 0.2, 0.08, 0.05, 0.02] if big else [0.2, 0.25, 0.1, 0.25, 0.15, 0.05])
    hosts = list(spec.host_names)
    lines = []
    t0 = time.time() - n
    for i in range(n):
        k = int(rng.choice(ks, p=p / p.sum()))
        doc = {
            "id": f"bench-{i:05d}", "k": k, "tenant": f"t{int(rng.integers(4))}", "priority": int(rng.integers(4)),
            "utility": round(float(rng.random()), 3), "submitted": t0 + i,
        }
        u = rng.random()
        if u < 0.1 and k <= 8:
            doc["constraints"] = {"single_host": True}
        elif u < 0.15:
            pick = sorted(rng.choice(len(hosts), size=max(2, min(len(hosts), (k + 7) // 8 * 2)), replace=False).tolist())
            doc["constraints"] = {"allowed_hosts": [hosts[j] for j in pick]}
        elif u < 0.2 and k >= 2:
            doc["constraints"] = {"min_gbps": 20.0}
        lines.append(json.dumps(doc))
    return "\n".join(lines)


def make_dispatcher(spec: ClusterSpec, model: str | None):
    from bandpilot.dispatch.dispatcher import Dispatcher

    if model:
        return Dispatcher.load(model), model
    from bandpilot.fabric.emulator import make_fabric

    return Dispatcher(make_fabric(spec)), "fabric (perfect predictor)"


def run_scenario(name: str, spec: ClusterSpec, args, url: str, schema: str | None) -> dict:
    store = q.Store(url, schema=schema)
    store.init_cluster(spec)
    dispatcher, model_label = make_dispatcher(spec, args.model)
    rng = np.random.default_rng(args.seed + 1)
    t_start = time.perf_counter()
    cpu_start = time.process_time()
    parsed = q.parse_jsonl(workload(spec, args.requests, args.seed).splitlines(), name="bench.jsonl")
    sub = q.submit(store, parsed.requests, labels=[f"bench.jsonl:{n}" for n in parsed.lines], partial=True)
    t_submit = time.perf_counter() - t_start
    batches, batch_s, release_s, search_ms, n_search = 0, [], 0.0, 0.0, 0
    assigned = rejected = deferred_attempts = 0
    while True:
        t = time.perf_counter()
        rep = sched.run_batch(store, dispatcher, SchedulerProfile("bench", queue_sort=args.policy), commit=args.commit)
        batch_s.append(time.perf_counter() - t)
        batches += 1
        c = rep.counts()
        assigned += c["assigned"]
        rejected += c["rejected"]
        deferred_attempts += c["deferred"]
        for o in rep.outcomes:
            if o.search_ms is not None:
                search_ms += o.search_ms
                n_search += 1
        pending = rep.pending_before - c["assigned"] - c["rejected"] - c["skipped"]
        if pending == 0 or batches >= args.max_batches:
            break
        t = time.perf_counter()
        active = [j["id"] for j in q.export_state(store)["jobs"]]
        q.release_many(store, rng.permutation(active)[: max(1, len(active) // 2)].tolist())
        release_s += time.perf_counter() - t
    total = time.perf_counter() - t_start
    cpu = time.process_time() - cpu_start
    bad = q.check_invariants(store)
    frag = q.fragmentation(store)
    store.close()
    bs = np.array(batch_s)
    return {
        "scenario": name, "cluster": spec.name, "gpus": spec.n_gpus, "backend": store.backend,
        "commit": args.commit, "policy": args.policy, "model": model_label,
        "requests": args.requests, "submitted": len(sub.submitted), "assigned": assigned, "rejected": rejected,
        "pending_left": args.requests - assigned - rejected, "batches": batches, "deferrals": deferred_attempts,
        "submit_s": t_submit, "batch_total_s": float(bs.sum()), "batch_median_s": float(np.median(bs)),
        "batch_max_s": float(bs.max()), "release_s": release_s, "search_s": search_ms / 1e3, "selects": n_search,
        "overhead_s": float(bs.sum()) - search_ms / 1e3, "total_s": total, "cpu_s": cpu, "target_s": TARGETS[name],
        "invariants": "ok" if not bad else f"{len(bad)} violations", "fragmentation_end": frag["fragmentation"],
    }


def markdown(results: list[dict]) -> str:
    rows = [
        ("cluster (GPUs)", lambda r: f"{r['cluster']} ({r['gpus']})"),
        ("store / commit / policy", lambda r: f"{r['backend']} / {r['commit']} / {r['policy']}"),
        ("model", lambda r: r["model"]),
        ("requests submitted / assigned / rejected", lambda r: f"{r['submitted']} / {r['assigned']} / {r['rejected']}"),
        ("batches (releases of half the jobs in between)", lambda r: str(r["batches"])),
        ("deferrals (request-batch attempts)", lambda r: str(r["deferrals"])),
        ("submit 1,000 from JSONL (s)", lambda r: f"{r['submit_s']:.2f}"),
        ("batch runs total (s)", lambda r: f"{r['batch_total_s']:.2f}"),
        ("batch median / max (s)", lambda r: f"{r['batch_median_s']:.3f} / {r['batch_max_s']:.3f}"),
        ("of which dispatcher search (s, selects)", lambda r: f"{r['search_s']:.2f} ({r['selects']})"),
        ("queue/store overhead (s)", lambda r: f"{r['overhead_s']:.2f}"),
        ("releases (s)", lambda r: f"{r['release_s']:.2f}"),
        ("**end to end, wall (s)**", lambda r: f"**{r['total_s']:.1f}**"),
        ("end to end, CPU of this process (s)", lambda r: f"{r['cpu_s']:.1f}"),
        ("target (s)", lambda r: f"<= {r['target_s']:.0f} ({'met' if r['total_s'] <= r['target_s'] else 'MISSED'})"),
        ("invariants after run", lambda r: r["invariants"]),
    ]
    head = "| | " + " | ".join(r["scenario"] for r in results) + " |"
    sep = "|---|" + "---|" * len(results)
    body = [f"| {label} | " + " | ".join(fn(r) for r in results) + " |" for label, fn in rows]
    return "\n".join([head, sep, *body])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--scenario", choices=["small", "large", "all"], default="all")
    ap.add_argument("--requests", type=int, default=1000)
    ap.add_argument("--policy", choices=sched.POLICIES, default="utility")
    ap.add_argument("--commit", choices=sched.COMMIT_MODES, default="batch")
    ap.add_argument("--store", default=None, help="Store URL (default: a fresh SQLite file per scenario).")
    ap.add_argument("--model", default=None, help="Model URI (default: the fabric as a perfect predictor).")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-batches", type=int, default=500)
    ap.add_argument("--json", action="store_true", help="Also print the raw figures as JSON.")
    args = ap.parse_args(argv)
    setup_env(threads=2)
    tmp = Path(tempfile.mkdtemp(prefix="bench-queue-"))
    scen = ["small", "large"] if args.scenario == "all" else [args.scenario]
    results = []
    for name in scen:
        spec = load_cluster(ROOT / "params" / "clusters" / "h100.yaml") if name == "small" else large_spec()
        schema = None
        url = args.store or f"sqlite:///{tmp / (name + '.db')}"
        if url.startswith("postgresql"):
            schema = f"bench_{uuid.uuid4().hex[:10]}"
        try:
            results.append(run_scenario(name, spec, args, url, schema))
        finally:
            if schema:
                import sqlalchemy as sa

                eng = sa.create_engine(url)
                with eng.begin() as conn:
                    conn.exec_driver_sql(f'DROP SCHEMA IF EXISTS "{schema}" CASCADE')
                eng.dispose()
        print(f"done: {name} in {results[-1]['total_s']:.1f}s", file=sys.stderr, flush=True)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"## Queue benchmark (Python {platform.python_version()}, {os.cpu_count()} cores, "
          f"OMP_NUM_THREADS={os.environ.get('OMP_NUM_THREADS')}, load average {load:.1f})\n")
    print(markdown(results))
    if args.json:
        print("\n```json\n" + json.dumps(results, indent=2) + "\n```")
    return 0 if all(r["total_s"] <= r["target_s"] and r["invariants"] == "ok" for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
