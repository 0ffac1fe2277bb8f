"""``bandpilot-verify``: probe the fabric against the champion, gate the hardware, and when something is
wrong re-measure the cluster as a new dataset version and retrain -> gate, so the dispatcher's world
includes the fault. Nightly (``schedules.verify_cron``) and on demand after a repair."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE

from bandpilot import config
from flows._common import prepare, resolve
from flows.dispatch import store_url_for
from flows.ingest import dvc_track_task
from flows.retrain import retrain_flow


@task(cache_policy=NONE)
def verify_task(cluster: str, model_uri: str, runner: str, store_url: str | None) -> dict[str, Any]:
    """Probe plan -> verdicts; with a store, the verdicts gate the hardware in one transaction."""
    from bandpilot import queue as q
    from bandpilot.health.verify import verify_probes
    from bandpilot.model.surrogate import Surrogate
    from bandpilot.topology.cluster import load_cluster

    spec = load_cluster(resolve(cluster))
    rep = verify_probes(Surrogate.load(model_uri), spec, runner=runner)
    gate = None
    if store_url:
        with q.Store(store_url) as store:
            if not store.initialized:
                store.init_cluster(spec)
            gate = q.apply_verdicts(store, rep.to_json()["hosts"], rep.source)
            q.record_observations(store, rep.runs, source="verify")
    return {"cluster": spec.name, "healthy": rep.healthy, "verdicts": rep.to_json()["hosts"], "gate": gate,
            "markdown": rep.markdown()}


@task(retries=1, retry_delay_seconds=5, cache_policy=NONE)
def remeasure_task(cluster: str, data_root: str, runner: str, samples: int, seed: int) -> str:
    from bandpilot.health.relearn import remeasure
    from bandpilot.topology.cluster import load_cluster

    spec = load_cluster(resolve(cluster))
    rep = remeasure(spec, resolve(data_root), runner=runner, samples=samples, seed=seed)
    return str(rep.dataset_dir)


@flow(name="bandpilot-verify", log_prints=True)
def verify_flow(
    cluster: str,
    model_uri: str | None = None,
    runner: str = "emulator",
    store_url: str | None = None,
    relearn: bool = True,
    data_root: str = ".",
    samples: int = 600,
    seed: int = 0,
    params_file: str = "params/train.yaml",
    policy: str = "params/promotion.yaml",
    evaluate: dict[str, Any] | None = None,
    git: str = "leave",
) -> dict[str, Any]:
    """Verify ``cluster`` against ``model_uri`` (default: its champion); if anything is degraded or
    failed and ``relearn``: re-measure, version the dataset with DVC, retrain and gate."""
    prepare()
    log = get_run_logger()
    from bandpilot.topology.cluster import load_cluster

    name = load_cluster(resolve(cluster)).name
    uri = model_uri or config.model_uri(name)
    out = verify_task(cluster, uri, runner, store_url_for(name, store_url))
    create_markdown_artifact(markdown=out.pop("markdown"), key=f"verify-{name}", description="Verify verdicts per host")
    if out["healthy"]:
        log.info("%s: every host healthy", name)
        return out
    bad = {h: v for h, v in out["verdicts"].items() if v["status"] != "healthy"}
    log.warning("%s: %s", name, ", ".join(f"{h} {v['status']} {v['links'] or v['gpus']}" for h, v in bad.items()))
    if relearn:
        out["dataset"] = remeasure_task(cluster, data_root, runner, samples, seed)
        out["dvc_md5"] = dvc_track_task(data_root, git=git)
        out["retrain"] = retrain_flow(data_dir=out["dataset"], cluster_spec=cluster, params_file=params_file,
                                      policy=policy, evaluate=evaluate)
    return out
