"""``bandpilot-ingest``: profile a cluster (or ingest a measured directory) -> dataset -> DVC."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NONE

from flows._common import prepare, resolve


@task(retries=2, retry_delay_seconds=5, cache_policy=NONE)
def profile_task(cluster: str, data_root: str, samples: int, seed: int, runner: str) -> dict[str, Any]:
    """Run the measurement plan; resumable, so a retry only re-measures what is missing."""
    from bandpilot.topology.cluster import load_cluster
    from bandpilot.data.profiling import run

    spec = load_cluster(resolve(cluster))
    rep = run(spec, resolve(data_root), runner=runner, cross_host_samples=samples, seed=seed, progress=False)
    if rep.failed:
        raise RuntimeError(f"{rep.failed} measurements failed on {spec.name}: {rep.failures[:3]}")
    return {"cluster": spec.name, "dataset": str(rep.dataset_dir), "measured": rep.measured, "skipped": rep.skipped}


@task(cache_policy=NONE)
def ingest_task(source_dir: str, out: str) -> dict[str, Any]:
    """Measured tables or nccl-tests logs -> canonical Parquet dataset (atomic)."""
    from bandpilot.data.ingest import ingest

    rep = ingest(resolve(source_dir), resolve(out))
    return {"cluster": rep.cluster if hasattr(rep, "cluster") else None, "dataset": str(resolve(out)), "summary": rep.summary()}


@task(retries=3, retry_delay_seconds=2, cache_policy=NONE)
def dvc_track_task(data_root: str, push: bool = True, git: str = "leave") -> str:
    """``dvc add data`` (idempotent: unchanged data -> same md5, no new version) and push.
    ``git``: leave (default: never touch the git index), commit (data.dvc with the version), stage."""
    from bandpilot.data import dvc

    root = resolve(data_root)
    md5 = dvc.track(root / "data", root, git=git)
    if push:
        dvc.push(root)
    return md5


@flow(name="bandpilot-ingest", log_prints=True)
def ingest_flow(
    cluster: str | None = None,
    source_dir: str | None = None,
    data_root: str = ".",
    samples: int = 600,
    seed: int = 0,
    runner: str = "emulator",
    track: bool = True,
    git: str = "leave",
) -> dict[str, Any]:
    """Profile ``cluster`` (a spec) or ingest ``source_dir`` (a measurement directory), then version it."""
    prepare()
    log = get_run_logger()
    if (cluster is None) == (source_dir is None):
        raise ValueError("give exactly one of cluster= (profile) or source_dir= (ingest)")
    if cluster is not None:
        out = profile_task(cluster, data_root, samples, seed, runner)
    else:
        from bandpilot.topology.cluster import load_cluster

        name = load_cluster(resolve(source_dir)).name
        out = ingest_task(source_dir, str(Path(data_root) / "data" / name))
        out["cluster"] = name
    if track:
        out["dvc_md5"] = dvc_track_task(data_root, git=git)
    log.info("dataset %s ready (%s)", out["dataset"], out.get("dvc_md5", "untracked"))
    return out
