"""How do measurements become a dataset? Ingestion of a measurement directory (CSV tables or
nccl-tests logs + manifest), with the checks of every log against what was planned.

Tables are read by :mod:`bandpilot.fabric.tables`, raw nccl-tests logs by :mod:`bandpilot.topology.nccl_log`.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from typing import TYPE_CHECKING

from bandpilot.errors import DataError
from bandpilot.fabric.tables import TableRow, intra_lookup, read_inter_table, read_intra_table
from bandpilot.data.dataset import DATASET_FILE, SPEC_FILE, Dataset, frame_from_masks, frame_from_sparse, save_dataset
from bandpilot.data.sparse_masks import SparseMasks

if TYPE_CHECKING:
    import pandas as pd

    from bandpilot.topology.cluster import ClusterSpec

# ------------------------------------------------------------------------------------------
# Ingestion: a measurement directory -> canonical dataset.
#
# Two directory forms, detected by their files:
#   (a) ``cluster.yaml`` referencing BandPilot CSV tables (``hosts[].intra`` + optional ``inter``)
#   (b) ``manifest.jsonl`` + ``raw/*.log`` written by ``bandpilot profile`` (any runner), with the
#       spec next to it in ``cluster.yaml``. Every log goes through :func:`bandpilot.topology.nccl_log.parse`.
# Everything is validated before anything is written, so a failure leaves ``out`` untouched.
MANIFEST_FILE = "manifest.jsonl"
MANIFEST_KEYS = ("id", "gpus", "hosts", "log", "status")


@dataclass
class IngestReport:
    """What :func:`ingest` read and wrote."""

    cluster: str
    out: Path
    form: str  # "csv" or "logs"
    rows: int
    hosts: tuple[str, ...]  # hosts that appear in at least one row
    single_host: int
    cross_host: int
    files: int  # tables or logs read
    skipped: dict[str, int]
    elapsed: float = 0.0

    def summary(self) -> str:
        skipped = ", ".join(f"{n} {why}" for why, n in sorted(self.skipped.items()) if n)
        return (
            f"{self.cluster}: {self.rows} rows ({self.single_host} single-host, {self.cross_host} cross-host) "
            f"on {len(self.hosts)} hosts from {self.files} {'logs' if self.form == 'logs' else 'tables'}"
            + (f"; skipped {skipped}" if skipped else "")
            + f" -> {self.out / DATASET_FILE}"
        )

    __str__ = summary


def ingest(directory: str | Path, out: str | Path) -> IngestReport:
    """Read a measurement directory (CSV tables or nccl-tests logs + manifest) into a dataset at ``out``."""
    import time as _time

    t0 = _time.perf_counter()
    directory = Path(directory)
    if not directory.exists():
        raise DataError(f"measurement directory not found: {directory}")
    if not directory.is_dir():
        raise DataError(f"{directory}: not a directory")
    if not any(directory.iterdir()):
        raise DataError(f"{directory}: empty directory (expected cluster.yaml with CSV tables, or {MANIFEST_FILE} with raw logs)")
    spec_path = directory / SPEC_FILE
    manifest = directory / MANIFEST_FILE
    if manifest.is_file():
        if not spec_path.is_file():
            raise DataError(f"{directory}: {MANIFEST_FILE} without the {SPEC_FILE} it was planned for")
        from bandpilot.topology.cluster import load_cluster

        spec = load_cluster(spec_path)
        frame, files, skipped = _frame_from_logs(directory, manifest, spec)
        form = "logs"
    elif spec_path.is_file():
        from bandpilot.topology.cluster import load_cluster

        spec = load_cluster(spec_path)
        if Path(out).resolve() == directory.resolve():
            raise DataError(f"{directory}: writing the dataset into the table directory would replace its {SPEC_FILE}")
        frame, files, skipped = _frame_from_tables(directory, spec)
        form = "csv"
    else:
        logs = sorted(directory.rglob("*.log"))
        if logs:
            raise DataError(f"{directory}: raw logs ({logs[0].name}, ...) without {MANIFEST_FILE}: cannot tell what was planned")
        raise DataError(f"{directory}: no {SPEC_FILE} or {MANIFEST_FILE} (not a measurement directory)")
    ds = Dataset(spec, frame)
    path = save_dataset(ds, out)
    n_hosts = frame["n_hosts"].to_numpy()
    used = np.unique(ds.sparse().hosts).tolist()
    return IngestReport(
        cluster=spec.name,
        out=path,
        form=form,
        rows=len(frame),
        hosts=tuple(spec.hosts[h].name for h in used),
        single_host=int((n_hosts == 1).sum()),
        cross_host=int((n_hosts >= 2).sum()),
        files=files,
        skipped=skipped,
        elapsed=_time.perf_counter() - t0,
    )


def _rel(path: Path, base: Path) -> str:
    import os

    try:
        return os.path.relpath(path, base)
    except ValueError:  # different drives
        return str(path)


def _frame_from_tables(directory: Path, spec: "ClusterSpec") -> "tuple[pd.DataFrame, int, dict[str, int]]":
    import pandas as pd

    from bandpilot.topology.cluster import popcount

    if spec.inter is None and all(h.intra is None for h in spec.hosts):
        raise DataError(f"{spec.path}: no measurement tables (hosts[].intra / inter.table) and no {MANIFEST_FILE}")
    for i, h in enumerate(spec.hosts):
        if h.intra is None:
            raise DataError(f"{spec.path}: host {h.name!r} (hosts[{i}]) has no intra table; every host needs one")
    frames = []
    tables: list[np.ndarray] = []
    for hi, h in enumerate(spec.hosts):
        assert h.intra is not None
        rows = read_intra_table(h.intra, h.n_gpus)
        tables.append(intra_lookup(rows, h.n_gpus, str(h.intra)))
        masks = np.zeros((len(rows), spec.n_hosts), dtype=np.int64)
        masks[:, hi] = [r.masks[0] for r in rows]
        frames.append(_table_frame(spec, masks, rows, [r.busbw for r in rows], _rel(h.intra, directory)))
    skipped = {"single-host rows of the inter table": 0}
    files = spec.n_hosts
    if spec.inter is not None:
        it = spec.inter
        n = int(spec.gpus_per_host.max())
        rows = read_inter_table(it.table, spec.n_hosts, n)
        files += 1
        keep = []
        for r in rows:
            for hi, m in enumerate(r.masks):
                if m >> spec.hosts[hi].n_gpus:
                    raise DataError(
                        f"{it.table}:{r.line}: GPU index {m.bit_length() - 1} out of range on host "
                        f"{spec.hosts[hi].name!r} ({spec.hosts[hi].n_gpus} GPUs)"
                    )
            if sum(1 for m in r.masks if m) < 2:
                skipped["single-host rows of the inter table"] += 1  # intra tables are authoritative
                continue
            keep.append(r)
        if keep:
            masks = np.array([r.masks for r in keep], dtype=np.int64)
            vals = np.array([r.busbw for r in keep]) * it.scale
            if it.combine == "min_intra":
                # The spec defines B(S) = min(scale * inter, intra of every host with >= 2 GPUs).
                intra = np.stack([tables[h][masks[:, h]] for h in range(spec.n_hosts)], axis=1)
                intra = np.where(popcount(masks) >= 2, intra, np.inf)
                vals = np.minimum(vals, intra.min(axis=1))
            frames.append(_table_frame(spec, masks, keep, vals, _rel(it.table, directory)))
    return pd.concat(frames, ignore_index=True), files, skipped


def _table_frame(spec: "ClusterSpec", masks: np.ndarray, rows: list[TableRow], vals, rel: str) -> "pd.DataFrame":
    frame = frame_from_masks(
        spec, masks, np.asarray(vals, dtype=float), collective=spec.collective, bytes_=spec.message_bytes,
        source=[f"{rel}:{r.line}" for r in rows],
    )
    frame["collective"] = [r.op or spec.collective for r in rows]
    frame["bytes"] = np.array([r.bytes for r in rows], dtype=np.int64)
    return frame


def _norm_collective(name: str) -> str:
    name = str(name).rsplit("/", 1)[-1].strip()
    return name[:-4] if name.endswith("_mpi") else name


def read_manifest(path: str | Path) -> list[tuple[int, dict]]:
    """``manifest.jsonl`` entries as ``(line, entry)``; a later line for the same id replaces an earlier one."""
    path = Path(path)
    text = path.read_text()
    entries: dict[str, tuple[int, dict]] = {}
    for line, raw in enumerate(text.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            doc = json.loads(raw)
        except (ValueError, RecursionError):
            raise DataError(f"{path}:{line}: not a JSON object") from None
        if not isinstance(doc, dict):
            raise DataError(f"{path}:{line}: manifest entries must be JSON objects")
        missing = [k for k in MANIFEST_KEYS if k not in doc]
        if missing:
            raise DataError(f"{path}:{line}: manifest entry lacks {missing}")
        if not isinstance(doc["id"], str) or not doc["id"]:
            raise DataError(f"{path}:{line}: id must be a non-empty string")
        if not isinstance(doc["gpus"], list) or not doc["gpus"] or not all(isinstance(g, str) for g in doc["gpus"]):
            raise DataError(f"{path}:{line}: gpus must be a non-empty list of '<host>:<index>' strings")
        if not isinstance(doc["hosts"], list) or not all(isinstance(h, str) for h in doc["hosts"]):
            raise DataError(f"{path}:{line}: hosts must be a list of host names")
        if not isinstance(doc["log"], str) or not doc["log"]:
            raise DataError(f"{path}:{line}: log must be a file name")
        entries.pop(doc["id"], None)
        entries[doc["id"]] = (line, doc)
    if not entries:
        raise DataError(f"{path}: empty manifest (no planned measurements)")
    return list(entries.values())


def _short(host: str) -> str:
    return host.split(".", 1)[0]


def _device_line(text: str) -> int:
    for i, raw in enumerate(text.splitlines(), 1):
        if "Using devices" in raw or "Rank" in raw:
            return i
    return 1


def check_log(text: str, log: Path | str, entry: dict, spec: "ClusterSpec", where: str = ""):
    """Parse one log and check it against its manifest entry; returns ``(NcclResult, busbw)``.

    The ``# Using devices`` table must list one rank per planned GPU, on the planned hosts, and the
    log must be the planned collective with a row at the planned message size.
    """
    from collections import Counter

    from bandpilot.topology.nccl_log import NcclParseError, parse

    plan = f" ({where})" if where else ""
    want = _norm_collective(entry.get("collective") or spec.collective)
    try:  # a wrapper script may have run several collectives into this log: read the planned one
        res = parse(text, source=str(log), collective=want)
    except NcclParseError as exc:
        raise DataError(f"{exc}{plan}") from None
    gpus = entry["gpus"]
    if not res.devices:
        raise DataError(f"{log}:1: no '# Using devices' table; cannot check the ranks against the plan{plan}")
    if len(res.devices) != len(gpus):
        raise DataError(
            f"{log}:{_device_line(text)}: device table lists {len(res.devices)} ranks, "
            f"the plan has {len(gpus)} GPUs{plan}"
        )
    planned = Counter(g.rpartition(":")[0] for g in gpus)
    known = set(spec.host_names)
    seen = Counter(d.host if d.host in known else _short(d.host) for d in res.devices)
    if seen != Counter({(h if h in known else _short(h)): n for h, n in planned.items()}):
        fmt = lambda c: ", ".join(f"{h}:{n}" for h, n in sorted(c.items()))  # noqa: E731
        raise DataError(f"{log}:{_device_line(text)}: ranks run on {fmt(seen)}, the plan puts them on {fmt(planned)}{plan}")
    size = int(entry.get("bytes") or spec.message_bytes)
    # all_gather & co. print the size rounded down per rank (to whole elements, 16777212 for 3 ranks
    # of floats; to 16-byte chunks since nccl-tests 2.17, 33553920 for 32 MiB on 48 ranks), so
    # accept the row just below the planned size.
    near = [r for r in res.rows if 0 <= size - r.size < 16 * len(gpus) or r.size == size]
    if not near:
        try:
            res.busbw_at(size)  # raises with the sizes the log has
        except NcclParseError as exc:
            raise DataError(f"{exc}{plan}") from None
    best = min(near, key=lambda r: size - r.size)
    return res, best.out_of_place.busbw


# Logs this process has just written and checked (profiling), keyed by file identity and what was
# planned, so ingesting right after a profile run does not parse every log a second time.
_CHECKED: dict[tuple, float] = {}


def _log_key(log: Path, entry: dict, spec: "ClusterSpec", fingerprint: str) -> tuple | None:
    try:
        st = log.stat()
    except OSError:
        return None
    plan = (tuple(entry["gpus"]), entry.get("collective") or spec.collective, entry.get("bytes") or spec.message_bytes)
    return (str(log.absolute()), st.st_mtime_ns, st.st_size, st.st_ino, plan, fingerprint)


def remember_checked_log(log: Path, entry: dict, spec: "ClusterSpec", busbw: float, fingerprint: str | None = None) -> None:
    """Record that ``log`` (as it is on disk now) passed :func:`check_log` for ``entry``."""
    if len(_CHECKED) > 200_000:
        _CHECKED.clear()
    key = _log_key(log, entry, spec, fingerprint or spec.fingerprint())
    if key is not None:
        _CHECKED[key] = float(busbw)


def _frame_from_logs(directory: Path, manifest: Path, spec: "ClusterSpec") -> "tuple[pd.DataFrame, int, dict[str, int]]":
    import datetime as _dt

    from bandpilot.errors import SpecError

    entries = read_manifest(manifest)
    fp = spec.fingerprint()
    hosts, masks, vals, sources, times, colls, sizes = [], [], [], [], [], [], []
    skipped: dict[str, int] = {}
    for line, e in entries:
        where = f"{manifest}:{line}"
        try:
            used, mask = spec.to_sparse_mask(e["gpus"])
        except SpecError as exc:
            raise DataError(f"{where}: {exc}") from None
        unknown = [h for h in e["hosts"] if h not in spec.host_index]
        if unknown:
            raise DataError(f"{where}: unknown host {unknown[0]!r} in cluster {spec.name!r}")
        if set(e["hosts"]) != {g.rpartition(":")[0] for g in e["gpus"]}:
            raise DataError(f"{where}: hosts {e['hosts']} disagree with the hosts of gpus {e['gpus']}")
        status = str(e["status"])
        if status != "done":
            skipped[status] = skipped.get(status, 0) + 1
            continue
        log = directory / e["log"]
        if not log.is_file():
            raise DataError(f"{where}: log {e['log']} of a done measurement not found")
        key = _log_key(log, e, spec, fp)
        busbw = _CHECKED.get(key) if key is not None else None
        if busbw is None:
            text = log.read_text(errors="replace")
            _, busbw = check_log(text, log, e, spec, where)
        hosts.append(used)
        masks.append(mask)
        vals.append(busbw)
        sources.append(e["log"])
        colls.append(_norm_collective(e.get("collective") or spec.collective))
        sizes.append(int(e.get("bytes") or spec.message_bytes))
        t = e.get("time")
        if not isinstance(t, str):
            t = _dt.datetime.fromtimestamp(log.stat().st_mtime, _dt.timezone.utc).isoformat(timespec="seconds")
        times.append(t)
    if not masks:
        raise DataError(f"{manifest}: no completed measurements ({len(entries)} planned, 0 done)")
    frame = frame_from_sparse(
        spec, SparseMasks.from_lists(hosts, masks, spec.n_hosts), np.array(vals), collective=spec.collective,
        bytes_=spec.message_bytes, source=sources, time=times,
    )
    frame["collective"] = colls
    frame["bytes"] = np.array(sizes, dtype=np.int64)
    return frame, len(masks), skipped
