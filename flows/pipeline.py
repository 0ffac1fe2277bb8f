"""The main job: measured clusters (ingested) or emulated ones (profiled) -> DVC -> train (+ sweep) -> register -> evaluate
-> promote -> dispatch a demo queue, with a short summary of where to look.

Re-running reuses what is unchanged: profiling resumes (nothing re-measured), DVC keeps the same
version, the registry version with the same pipeline key is reused and not gated twice, and the
demo queue continues (some jobs finish, deferred requests get placed).
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from bandpilot.progress import stage
from flows._common import cluster_sources, load_params, prepare, profile_param, resolve, truth_line
from flows.dispatch import dispatch_flow, store_url_for
from flows.ingest import dvc_track_task, ingest_flow
from flows.retrain import retrain_flow


def demo_requests(spec_name: str, n_gpus: int, count: int, seed: int = 0) -> list[dict[str, Any]]:
    """A reproducible mix of tenants, sizes, priorities and utilities (some cannot fit at once)."""
    rng = random.Random(f"{spec_name}-{seed}")
    sizes = [1, 2, 2, 3, 4, 4, 6, 8, 8, 10, 12, 16]
    out = []
    for i in range(count):
        k = min(rng.choice(sizes), n_gpus)
        req: dict[str, Any] = {
            "id": f"demo-{spec_name}-{i:03d}",
            "k": k,
            "tenant": rng.choice(["vision", "llm", "speech", "research"]),
            "priority": rng.choice([0, 0, 1, 2]),
            "utility": round(rng.uniform(0.1, 1.0), 3),
        }
        if k <= 4 and rng.random() < 0.2:
            req["constraints"] = {"single_host": True}
        out.append(req)
    return out


@task(cache_policy=NONE)
def prepare_queue_task(cluster_spec: str, store_url: str, count: int) -> dict[str, Any]:
    """First run: init the queue and submit the demo requests. Later runs: the oldest half of the
    running jobs finish (their GPUs are released), so deferred requests can be placed."""
    from bandpilot import queue as q
    from bandpilot.topology.cluster import load_cluster

    spec = load_cluster(resolve(cluster_spec))
    with q.Store(store_url) as store:
        if not store.initialized:
            store.init_cluster(spec)
        if not q.list_requests(store):
            rep = q.submit(store, demo_requests(spec.name, spec.n_gpus, count))
            return {"submitted": rep.to_dict(), "released": []}
        jobs = q.export_state(store)["jobs"]
        released = [j["id"] for j in jobs[: len(jobs) // 2]]
        for jid in released:
            q.release(store, jid)
        return {"submitted": None, "released": released}


@flow(name="bandpilot-pipeline", log_prints=True)
def pipeline_flow(params_file: str = "params/pipeline.yaml") -> dict[str, Any]:
    """Run the whole loop once for every cluster in ``params/pipeline.yaml``."""
    prepare()
    log = get_run_logger()
    P = load_params(params_file)
    prof, ev, disp = P["profile"], P["evaluate"], P["dispatch"]
    sweep = P.get("sweep") or {}
    data_root = str(P.get("data_root", "."))
    sources = cluster_sources(P["clusters"], str(params_file))
    results: dict[str, Any] = {"clusters": {}, "truth": truth_line(sources)}
    log.info(results["truth"])
    datasets = {}
    for src in sources:
        with stage(f"dataset {Path(src.path).stem}"):  # the profiling inside reports run by run
            if src.measured:  # physical measurements: ingest them as they are, nothing to profile
                ing = ingest_flow(source_dir=src.path, data_root=data_root, track=False)
            else:
                ing = ingest_flow(cluster=src.path, data_root=data_root, samples=int(prof.get("samples", 600)),
                                  seed=int(prof.get("seed", 0)), runner=str(prof.get("runner", "emulator")), track=False)
        datasets[src.path] = (src, ing)
    with stage("dvc add data"):
        results["dvc_md5"] = dvc_track_task(data_root, git=str(P.get("dvc_git", "leave")))
    for cluster, (src, ing) in datasets.items():
        name = ing["cluster"]
        with stage(f"retrain {name}"):  # sweep, training and the gate's evaluations report inside
            rt = retrain_flow(
                data_dir=ing["dataset"], cluster_spec=cluster, params_file=P["train_params"],
                sweep_trials=int(sweep.get("n_trials", 0)), sweep_timeout=sweep.get("timeout"),
                policy=P["promotion_policy"], evaluate=ev,
            )
        url = store_url_for(name, disp.get("store"))
        batch = None
        with stage(f"dispatch {name}"):
            q = prepare_queue_task(cluster, url, int(disp.get("demo_requests", 24)))
            if rt.get("champion"):
                batch = dispatch_flow(cluster=name, profile=profile_param(disp), store_url=url)
            else:
                log.warning("no champion for %s yet: the queue waits", name)
        results["clusters"][name] = {"ingest": ing, "retrain": rt, "queue": q, "batch": batch, "store": url,
                                     "truth": src.truth}
    with stage("dvc commit train evaluate"):  # dvc.yaml's stages recorded: `dvc status` is clean after the run
        record_stages_task(data_root, results, str(P.get("dvc_git", "leave")))
    return results


@task(cache_policy=NONE)
def record_stages_task(data_root: str, results: dict[str, Any], git: str) -> None:
    """dvc.yaml's train/evaluate outputs from this run, recorded in dvc.lock (``dvc status`` clean)."""
    from flows.stages import record

    record(resolve(data_root), results, git=git)


SHOWN_OUTCOMES = 8  # outcomes listed per cluster; the rest are counted ("and N more")
STATUS_ORDER = ("assigned", "deferred", "rejected", "skipped")


def batch_counts(outcomes: list[dict[str, Any]]) -> str:
    """``9 assigned, 15 deferred``: every status that occurs, in a stable order."""
    counts: dict[str, int] = {}
    for o in outcomes:
        counts[o["status"]] = counts.get(o["status"], 0) + 1
    order = [s for s in STATUS_ORDER if s in counts] + sorted(set(counts) - set(STATUS_ORDER))
    return ", ".join(f"{counts[s]} {s}" for s in order) or "no requests"


def _batch_lines(batch: dict[str, Any], store: str) -> list[str]:
    from bandpilot.queue import format_gpus

    outcomes = batch.get("outcomes", [])
    out = [f"   dispatch batch #{batch.get('batch_id')} ({batch.get('policy')}): {batch_counts(outcomes)}"]
    for o in outcomes[:SHOWN_OUTCOMES]:
        why = o.get("reason") or ""
        if o.get("detail"):  # the reason code and what it means here ("needs 12 GPUs, fewer are free")
            why = f"{why}: {o['detail']}" if why else o["detail"]
        what = format_gpus(o["gpus"]) if o.get("gpus") else why
        pred = o.get("predicted_gbps")
        out.append(f"     {o['request_id']:<22} k={o['k']:<3} {o['status']:<9} {what}" + (f"  {pred:.1f} GB/s" if pred else ""))
    if len(outcomes) > SHOWN_OUTCOMES:
        out.append(f"     and {len(outcomes) - SHOWN_OUTCOMES} more: bandpilot queue list --store {store}")
    return out


def _cluster_lines(name: str, r: dict[str, Any], root: Path) -> list[str]:
    rt, batch = r["retrain"], r["batch"]
    gate = rt.get("gate") or {}
    out = ["", f"== {name}: dataset {str(rt.get('dataset_hash', ''))[:12]}, model {rt['name']} v{rt['version']} "
               f"({'trained' if rt['trained'] else 'reused'}), gate: {gate.get('action')}, champion: v{rt.get('champion')}",
           f"   truth: {r.get('truth')}"]
    dec = gate.get("decision") or {}
    cand = (dec.get("candidate") or {}).get("gbe") or {}
    if cand:
        out.append("   mean GBE vs exact optimum: " + ", ".join(f"{p} {100 * v:.1f}%" for p, v in cand.items()))
        if (dec.get("candidate") or {}).get("mape") is not None:
            src = dec["candidate"].get("mape_source") or "held-out"
            out.append(f"   {src} MAPE: {dec['candidate']['mape']:.2f}%")
    if gate.get("report"):
        rep = Path(gate["report"])
        out.append(f"   report: {rep.relative_to(root) if rep.is_relative_to(root) else rep}")
    if batch and batch.get("skipped"):
        out.append(f"   dispatch: no batch ({batch['skipped']})")
    elif batch:
        out += _batch_lines(batch, r.get("store", ""))
    return out


def summary_lines(results: dict[str, Any]) -> list[str]:
    """Plain-text summary printed by ``bandpilot pipeline``."""
    from bandpilot.config import default_tracking_uri, project_root

    root = project_root()
    out = [f"dataset (data.dvc): {results.get('dvc_md5')}"]  # the truth line opens the run (flows/cli.py)
    for name, r in results["clusters"].items():
        out += _cluster_lines(name, r, root)
    # Store URLs as the run used them (absolute): the hint works from any directory.
    stores = [r["store"] for r in results["clusters"].values() if r.get("store")]
    out += [
        "",
        "Where to look:",
        f"  mlflow ui --backend-store-uri {default_tracking_uri()}",
        "  reports/<cluster>/v<version>/   (evaluation report, figures, promotion decision)",
        "  dvc status; dvc metrics show; git diff data.dvc",
        "  prefect server start   (then `bandpilot serve` for the scheduled deployments)",
    ]
    out += [f"  bandpilot queue status --store {url}" for url in stores] or [
        "  bandpilot queue status --store " + f"sqlite:///{root / '.bandpilot'}/queue-<cluster>.db"]
    return out
