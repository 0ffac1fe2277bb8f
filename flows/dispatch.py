"""``bandpilot-dispatch``: one batch of the request queue with the champion model."""

from __future__ import annotations

from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NONE

from bandpilot import config
from flows._common import prepare


def store_url_for(cluster: str, url: str | None = None) -> str:
    """One queue store per cluster; the default is a local SQLite file (WAL)."""
    if url:
        return url
    from bandpilot.config import project_root

    path = project_root() / ".bandpilot" / f"queue-{cluster}.db"
    path.parent.mkdir(parents=True, exist_ok=True)
    return f"sqlite:///{path}"


@task(retries=2, retry_delay_seconds=3, cache_policy=NONE)
def load_dispatcher_task(model_uri: str):
    """Resolve the registry alias now, so a missing/unpromoted model fails before any assignment."""
    from bandpilot.dispatch.dispatcher import Dispatcher

    return Dispatcher.load(model_uri)


@task(cache_policy=NONE)
def run_batch_task(store_url: str, dispatcher, profile: str, limit: int | None, model_uri: str,
                   demand: str = "full") -> dict[str, Any]:
    from bandpilot import queue as q
    from bandpilot import scheduling as sched

    with q.Store(store_url) as store:
        rep = sched.run_batch(store, dispatcher, profile, limit, model_uri=model_uri, demand=demand)
        problems = q.check_invariants(store)
    if problems:
        raise RuntimeError(f"queue invariants violated after batch: {problems[:3]}")
    return rep.to_dict()


def batch_markdown(rep: dict[str, Any]) -> str:
    lines = [
        f"# Dispatch batch #{rep.get('batch_id')} ({rep.get('policy')}, model {rep.get('model_version')})",
        "",
        "| request | tenant | k | status | GPUs / reason | predicted GB/s |",
        "|---|---|---:|---|---|---:|",
    ]
    for o in rep.get("outcomes", []):
        what = ",".join(o.get("gpus") or []) or (o.get("reason") or "")
        pred = o.get("predicted_gbps")
        lines.append(
            f"| {o.get('request_id')} | {o.get('tenant')} | {o.get('k')} | {o.get('status')} | {what} | "
            f"{'' if pred is None else f'{pred:.1f}'} |"
        )
    return "\n".join(lines)


@flow(name="bandpilot-dispatch", log_prints=True)
def dispatch_flow(
    cluster: str,
    model_uri: str | None = None,
    profile: str = "recommended",
    store_url: str | None = None,
    limit: int | None = None,
    demand: str = "full",
) -> dict[str, Any]:
    """Assign the pending requests of ``cluster``'s queue with its champion model (:func:`bandpilot.config.model_uri`),
    as the scheduler ``profile`` says (a name or a YAML file; :mod:`bandpilot.scheduling.profile`)."""
    prepare()
    from bandpilot.scheduling import get_profile

    get_profile(profile)  # a bad profile fails the flow before the store or the model is touched
    log = get_run_logger()
    uri = model_uri or config.model_uri(cluster)
    url = store_url_for(cluster, store_url)
    from bandpilot import queue as q

    with q.Store(url) as store:
        idle = q.nothing_to_place(store) if store.initialized else "the store has no cluster yet"
    if idle is not None:  # the every-minute schedule's usual case: no model load at all
        log.info("no batch on %s: %s", cluster, idle)
        return {"batch_id": None, "skipped": idle, "outcomes": []}
    dispatcher = load_dispatcher_task(uri)
    rep = run_batch_task(url, dispatcher, profile, limit, uri, demand)
    create_markdown_artifact(markdown=batch_markdown(rep), key=f"dispatch-{cluster}", description="Batch assignments")
    counts = {s: sum(1 for o in rep.get("outcomes", []) if o.get("status") == s) for s in ("assigned", "deferred", "rejected")}
    log.info("batch on %s: %s", cluster, counts)
    return rep
