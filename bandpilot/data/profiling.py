"""How does a profile run? Execute a cluster's measurement plan with a runner, keep the logs, build
the dataset.

Runs are resumable: each log is written atomically and ``manifest.jsonl`` records what is
done, so an interrupted profile continues where it stopped, and a deleted log is re-measured.
What is measured comes from :mod:`bandpilot.data.planning`, how from :mod:`bandpilot.data.runners`.

Layout under ``out_dir``::

    data/<cluster>/cluster.yaml          self-contained spec
    data/<cluster>/manifest.jsonl        one JSON line per planned measurement (status: planned/done/failed)
    data/<cluster>/raw/<id>.log          nccl-tests stdout per measurement
    data/<cluster>/measurements.parquet  the dataset (:func:`bandpilot.data.ingest.ingest`)
"""

from __future__ import annotations

import datetime as _dt
import functools
import json
import os
import sys
import threading
import time
from collections import deque
from contextlib import nullcontext
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

from bandpilot.topology.cluster import ClusterSpec
from bandpilot.data.dataset import SPEC_FILE
from bandpilot.data.ingest import (
    MANIFEST_FILE,
    IngestReport,
    check_log,
    ingest,
    read_manifest,
    remember_checked_log,
)
from bandpilot.data.planning import RAW_DIR, PlannedMeasurement, plan, safe
from bandpilot.data.runners import command_lines, make_runner
from bandpilot.errors import BandPilotError, DataError
from bandpilot.progress import stage


@dataclass
class ProfileReport:
    cluster: str
    dataset_dir: Path
    planned: int
    measured: int  # run in this invocation
    skipped: int  # already measured (resume)
    failed: int
    elapsed: float
    ingest: IngestReport | None = None
    failures: list[tuple[str, str]] = field(default_factory=list)  # (id, error), first few
    dvc_md5: str | None = None

    def summary(self) -> str:
        s = (
            f"{self.cluster}: {self.planned} planned, {self.measured} measured, {self.skipped} already done, "
            f"{self.failed} failed in {self.elapsed:.1f} s"
        )
        if self.ingest is not None:
            s += f"\n{self.ingest.summary()}"
        if self.dvc_md5:
            s += f"\ndvc: data tracked as {self.dvc_md5}"
        for ident, err in self.failures[:5]:
            s += f"\nfailed {ident}: {err}"
        return s

    __str__ = summary


def cluster_dir(out_dir: str | Path, spec: ClusterSpec) -> Path:
    return Path(out_dir) / "data" / safe(spec.name)


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


#: Emulated measurements carry a fixed logical timestamp and no duration, so profiling the same
#: spec with the same seed gives byte-identical data (and the same DVC version) on any machine.
EMULATED_TIME = "2026-01-01T00:00:00+00:00"


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.parent / f".{path.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    tmp.write_text(text)
    os.replace(tmp, path)


class _Manifest:
    """Entries by id in a stable order; rewritten atomically (throttled) as measurements finish."""

    def __init__(self, path: Path, entries: dict[str, dict]) -> None:
        self.path = path
        self.entries = entries
        self._last = 0.0

    def save(self, force: bool = False) -> None:
        now = time.monotonic()
        if not force and now - self._last < 1.0:
            return
        self._last = now
        _atomic_write(self.path, "".join(json.dumps(e, separators=(",", ":")) + "\n" for e in self.entries.values()))


def _prepare_dir(cdir: Path, spec: ClusterSpec, resume: bool) -> dict[str, dict]:
    """Create the layout, check a resumed directory belongs to this cluster, load its manifest."""
    import yaml

    from bandpilot.topology.cluster import load_cluster

    (cdir / RAW_DIR).mkdir(parents=True, exist_ok=True)
    spec_file = cdir / SPEC_FILE
    if spec_file.is_file() and resume:
        old = load_cluster(spec_file)
        if old.fingerprint() != spec.fingerprint():
            raise DataError(
                f"{spec_file}: {cdir} holds measurements of a different cluster spec "
                f"(hosts/GPUs/topology changed); use another --out or resume=False"
            )
    _atomic_write(spec_file, yaml.safe_dump(spec.to_dict(), sort_keys=False))
    manifest = cdir / MANIFEST_FILE
    if resume and manifest.is_file():
        return {e["id"]: e for _, e in read_manifest(manifest)}
    return {}


def run(
    spec: ClusterSpec,
    out_dir: str | Path,
    *,
    runner: str | Callable[[PlannedMeasurement], str] = "emulator",
    resume: bool = True,
    progress: bool = True,
    jobs: int | None = None,
    cross_host_samples: int = 200,
    seed: int = 0,
    sizes: Iterable[int] | None = None,
    measurements: list[PlannedMeasurement] | None = None,
    binary: str | None = None,
    mpirun: str = "mpirun",
    do_ingest: bool = True,
) -> ProfileReport:
    """Execute the plan into ``<out_dir>/data/<cluster>/`` and ingest it into ``measurements.parquet``.

    ``jobs`` bounds concurrent runs (default: one per host); a run starts only when all its hosts
    are idle, so each host works through its own intra-host list while the others do theirs, and
    cross-host runs take whole hosts. With ``resume`` a measurement whose log exists and is done (or
    valid) is skipped; failed runs are recorded as ``failed`` and retried by the next run.
    """
    t0 = time.perf_counter()
    todo_plan = measurements if measurements is not None else plan(spec, cross_host_samples=cross_host_samples, seed=seed, sizes=sizes)
    execute = make_runner(runner, spec, binary=binary, mpirun=mpirun)
    runner_name = runner if isinstance(runner, str) else getattr(runner, "__name__", type(runner).__name__)
    cdir = cluster_dir(out_dir, spec)
    old = _prepare_dir(cdir, spec, resume)
    entries, todo, skipped = _pending(todo_plan, old, cdir, spec, resume, binary, mpirun)
    manifest = _Manifest(cdir / MANIFEST_FILE, entries)
    manifest.save(force=True)
    one = functools.partial(_measure, execute, cdir, spec, spec.fingerprint())
    prepare = getattr(execute, "prepare", None)
    if callable(prepare) and todo:
        prepare(todo)
    failures, measured = _execute(spec, todo, jobs, progress, one, entries, manifest, runner_name)
    report = ProfileReport(cluster=spec.name, dataset_dir=cdir, planned=len(todo_plan), measured=measured,
                           skipped=skipped, failed=len(failures), elapsed=0.0, failures=failures)
    if do_ingest and any(e.get("status") == "done" for e in entries.values()):
        report.ingest = ingest(cdir, cdir)
    report.elapsed = time.perf_counter() - t0
    return report


def _pending(todo_plan: list[PlannedMeasurement], old: dict[str, dict], cdir: Path, spec: ClusterSpec, resume: bool,
             binary: str | None, mpirun: str) -> tuple[dict[str, dict], list[PlannedMeasurement], int]:
    """The manifest entries (earlier ones kept), the measurements still to run, and how many were
    skipped: with ``resume`` a measurement whose log exists and is done (or valid) is not re-run."""
    entries: dict[str, dict] = {}
    todo: list[PlannedMeasurement] = []
    skipped = 0
    for m in todo_plan:
        if m.id in entries:
            continue  # a plan never repeats an id; be safe with hand-made lists
        prev = old.get(m.id)
        log = cdir / m.log
        if resume and prev is not None and log.is_file():
            if prev.get("status") == "done":
                entries[m.id] = prev
                skipped += 1
                continue
            try:  # a log written just before an interruption: keep it when it is valid
                _, bw = check_log(log.read_text(errors="replace"), log, m.entry("done"), spec)
                entries[m.id] = m.entry("done", busbw=bw, runner=prev.get("runner"), time=_now(), recovered=True)
                skipped += 1
                continue
            except DataError:
                pass
        entries[m.id] = m.entry("planned", command=command_lines(m, spec, binary, mpirun))
        todo.append(m)
    for ident, e in old.items():  # measurements of earlier plans stay (repeats are data too)
        entries.setdefault(ident, e)
    return entries, todo, skipped


def _measure(execute: Callable[[PlannedMeasurement], str], cdir: Path, spec: ClusterSpec, fingerprint: str,
             m: PlannedMeasurement) -> tuple[float, float]:
    """One run: its output checked, then written (a bad output is kept as ``.failed`` for a post-mortem)."""
    t = time.perf_counter()
    text = execute(m)
    log = cdir / m.log
    entry = m.entry("done")
    try:
        _, bw = check_log(text, log, entry, spec)
    except DataError:
        _atomic_write(cdir / f"{m.log}.failed", text)  # keep the output for a post-mortem
        raise
    _atomic_write(log, text)
    remember_checked_log(log, entry, spec, bw, fingerprint)
    stale = cdir / f"{m.log}.failed"
    if stale.exists():  # an earlier attempt's post-mortem
        stale.unlink(missing_ok=True)
    return bw, time.perf_counter() - t


def _execute(spec: ClusterSpec, todo: list[PlannedMeasurement], jobs: int | None, progress: bool, one: Callable,
             entries: dict[str, dict], manifest: "_Manifest", runner_name: str) -> tuple[list[tuple[str, str]], int]:
    """Run ``todo`` (one by one, or ``jobs`` at a time on idle hosts), recording each outcome in the
    manifest as it lands; returns the failures and the number measured."""
    failures: list[tuple[str, str]] = []
    measured = 0

    def done(m: PlannedMeasurement, fut: Future | None, value: Any = None, error: BaseException | None = None) -> None:
        nonlocal measured
        if fut is not None:
            error = fut.exception()
            value = None if error is not None else fut.result()
        e = entries[m.id]
        if error is not None:
            if not isinstance(error, BandPilotError):
                raise error
            e.update(status="failed", error=str(error), time=_now(), runner=runner_name)
            failures.append((m.id, str(error)))
        else:
            bw, secs = value
            if runner_name == "emulator":
                e.update(status="done", busbw=round(bw, 4), time=EMULATED_TIME, runner=runner_name)
            else:
                e.update(status="done", busbw=round(bw, 4), time=_now(), runner=runner_name, seconds=round(secs, 4))
            e.pop("error", None)
            measured += 1
        bar.update(1)
        st.advance()
        manifest.save()

    from tqdm.auto import tqdm

    bar = tqdm(total=len(todo), desc=f"profile {spec.name}", unit="run", disable=not progress or not todo,
               file=sys.stderr, dynamic_ncols=True, mininterval=0.5)
    try:
        # A resumed run with nothing left opens no stage (no "0 runs" line).
        with stage(f"profile {spec.name}", total=len(todo), unit="runs") if todo else nullcontext() as st:
            n_jobs = max(1, int(jobs if jobs is not None else spec.n_hosts))
            if n_jobs == 1:
                for m in todo:
                    try:
                        val = one(m)
                    except BandPilotError as exc:
                        done(m, None, error=exc)
                    else:
                        done(m, None, value=val)
            else:
                _schedule(todo, n_jobs, one, done)
    finally:
        bar.close()
        manifest.save(force=True)
    return failures, measured


def _schedule(todo: list[PlannedMeasurement], jobs: int, work: Callable, done: Callable) -> None:
    """Run ``work`` on a pool; a measurement starts only when none of its hosts is busy.

    Queues are grouped by host set and served in plan order, so per-host intra lists run
    concurrently and cross-host runs wait for their hosts.
    """
    queues: dict[tuple[str, ...], deque] = {}
    for m in todo:
        queues.setdefault(m.hosts, deque()).append(m)
    busy: set[str] = set()
    running: dict[Future, PlannedMeasurement] = {}
    with ThreadPoolExecutor(max_workers=jobs, thread_name_prefix="profile") as pool:
        try:
            while queues or running:
                for key in list(queues):
                    if len(running) >= jobs:
                        break
                    if busy.isdisjoint(key):
                        q = queues[key]
                        m = q.popleft()
                        if not q:
                            del queues[key]
                        busy.update(key)
                        running[pool.submit(work, m)] = m
                if not running:  # pragma: no cover - every queue head is startable when idle
                    raise RuntimeError("scheduler stalled")
                finished, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in finished:
                    m = running.pop(fut)
                    busy.difference_update(m.hosts)
                    done(m, fut)
        except BaseException:
            for fut in running:
                fut.cancel()
            raise
