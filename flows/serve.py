"""Scheduled deployments per cluster: nightly ``verify`` (probe, gate, relearn on a fault), ``ingest``
and ``retrain``, and a frequent ``dispatch``.

``bandpilot serve`` calls :func:`serve_all` against whatever Prefect API ``PREFECT_API_URL``
names (start one with ``prefect server start``). Parameters come from ``params/pipeline.yaml``.
"""

from __future__ import annotations

import asyncio
import signal
from typing import Any

from flows._common import cluster_sources, load_params, prepare, profile_param, resolve


def deployments(params_file: str = "params/pipeline.yaml") -> list[Any]:
    """The RunnerDeployments the pipeline params describe (built, not yet served)."""
    from bandpilot.topology.cluster import load_cluster
    from flows.dispatch import dispatch_flow
    from flows.ingest import ingest_flow
    from flows.retrain import retrain_flow
    from flows.verify import verify_flow

    prepare()
    P = load_params(params_file)
    sched = P.get("schedules") or {}
    cron = str(sched.get("retrain_cron", "0 2 * * *"))
    ingest_cron = str(sched.get("ingest_cron", "0 1 * * *"))
    verify_cron = str(sched.get("verify_cron", "30 0 * * *"))
    every = int(sched.get("dispatch_interval_s", 60))
    prof, ev, disp, sweep = P["profile"], P["evaluate"], P["dispatch"], P.get("sweep") or {}
    data_root = str(P.get("data_root", "."))
    git = str(P.get("dvc_git", "leave"))
    out = []
    for src in cluster_sources(P["clusters"], str(params_file)):
        cluster = src.path
        name = load_cluster(resolve(cluster)).name
        what = ({"source_dir": cluster} if src.measured else
                {"cluster": cluster, "samples": int(prof.get("samples", 600)), "seed": int(prof.get("seed", 0)),
                 "runner": str(prof.get("runner", "emulator"))})
        out.append(ingest_flow.to_deployment(
            name=f"ingest-{name}", cron=ingest_cron, tags=["bandpilot", name],
            parameters={**what, "data_root": data_root, "git": git},
        ))
        out.append(retrain_flow.to_deployment(
            name=f"retrain-{name}", cron=cron, tags=["bandpilot", name],
            parameters={"data_dir": f"{data_root}/data/{name}", "cluster_spec": cluster,
                        "params_file": P["train_params"], "sweep_trials": int(sweep.get("n_trials", 0)),
                        "sweep_timeout": sweep.get("timeout"), "policy": P["promotion_policy"], "evaluate": ev},
        ))
        out.append(verify_flow.to_deployment(
            name=f"verify-{name}", cron=verify_cron, tags=["bandpilot", name],
            parameters={"cluster": cluster, "runner": str(prof.get("runner", "emulator")), "store_url": disp.get("store"),
                        "data_root": data_root, "samples": int(prof.get("samples", 600)),
                        "params_file": P["train_params"], "policy": P["promotion_policy"], "evaluate": ev, "git": git},
        ))
        out.append(dispatch_flow.to_deployment(
            name=f"dispatch-{name}", interval=every, tags=["bandpilot", name],
            parameters={"cluster": name, "profile": profile_param(disp), "store_url": disp.get("store")},
        ))
    return out


def serve_all(params_file: str = "params/pipeline.yaml", *, stop_timeout: float = 8.0) -> None:
    """Serve the deployments until SIGTERM or SIGINT, then stop within ``stop_timeout`` seconds.

    Prefect's own ``serve`` calls the async ``Runner.stop`` from its SIGTERM handler without awaiting it
    ("coroutine 'Runner.astop' was never awaited") and keeps running, so a service manager's stop hangs
    until SIGKILL. Here the signal schedules ``astop`` on the runner's loop; a run in flight is cancelled
    (its store writes are transactions, so an abandoned batch leaves nothing half-written)."""
    deps = deployments(params_file)
    asyncio.run(_serve(deps, stop_timeout))


async def _serve(deps: list[Any], stop_timeout: float) -> None:
    from prefect.runner import Runner

    loop = asyncio.get_running_loop()
    stop = asyncio.Event()

    class _Runner(Runner):
        def handle_sigterm(self, *_: Any) -> None:  # Runner.start installs this for SIGTERM
            loop.call_soon_threadsafe(stop.set)

    runner = _Runner(pause_on_shutdown=False)
    for d in deps:
        await runner.aadd_deployment(d)
    started = asyncio.create_task(runner.start())
    await asyncio.sleep(0)  # let start() install its SIGTERM handler, then take both signals over
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    print(f"serving {len(deps)} deployments; SIGTERM or Ctrl-C stops", flush=True)
    waiter = asyncio.create_task(stop.wait())
    await asyncio.wait({started, waiter}, return_when=asyncio.FIRST_COMPLETED)
    if started.done():
        waiter.cancel()
        started.result()  # the runner ended by itself: surface its error
        return
    print("stopping: cancelling runs in flight", flush=True)
    try:
        await asyncio.wait_for(runner.astop(), stop_timeout / 2)
        await asyncio.wait_for(started, stop_timeout / 2)
    except (asyncio.TimeoutError, asyncio.CancelledError, RuntimeError):
        started.cancel()
    print("stopped", flush=True)
