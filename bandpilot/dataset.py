"""Measurement tables -> canonical dataset.

Readers for the BandPilot CSV layout (intra ``GPU_used`` tables, inter ``GPU_Mapping_Across_Nodes``
tables in list-of-lists or binary-mask form). Every malformed row is reported as ``file:line: what``.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from typing import TYPE_CHECKING

from bandpilot.errors import DataError

if TYPE_CHECKING:
    import pandas as pd

    from bandpilot.cluster import ClusterSpec

INTRA_COLUMNS = ("OP", "GPU_num", "GPU_used", "data_size(B)", "Bandwidth(GB/s)")
INTER_COLUMNS = ("OP", "Total_GPU_Count", "GPU_Mapping_Across_Nodes", "data_size(B)", "Bandwidth(GB/s)")


@dataclass(frozen=True)
class TableRow:
    """One measured allocation from a table: per-host masks (host order of the spec)."""

    masks: tuple[int, ...]
    op: str
    bytes: int
    busbw: float
    line: int


def _open_rows(path: Path, columns: tuple[str, ...]) -> list[tuple[int, dict[str, str]]]:
    if not path.is_file():
        raise DataError(f"measurement table not found: {path}")
    text = path.read_text()
    if not text.strip():
        raise DataError(f"{path}: empty table")
    reader = csv.DictReader(text.splitlines())
    missing = [c for c in columns if c not in (reader.fieldnames or [])]
    if missing:
        raise DataError(f"{path}:1: missing columns {missing}; expected {list(columns)}")
    return [(i + 2, row) for i, row in enumerate(reader)]


def _bandwidth(raw: str | None, path: Path, line: int) -> float:
    try:
        val = float(raw) if raw is not None else math.nan
    except ValueError:
        raise DataError(f"{path}:{line}: bandwidth {raw!r} is not a number") from None
    if not math.isfinite(val) or val < 0:
        raise DataError(f"{path}:{line}: bandwidth {raw!r} must be a finite non-negative number")
    return val


def _int(raw: str | None, what: str, path: Path, line: int) -> int:
    try:
        return int(str(raw).strip())
    except ValueError:
        raise DataError(f"{path}:{line}: {what} {raw!r} is not an integer") from None


def read_intra_table(path: str | Path, n_gpus: int) -> list[TableRow]:
    """Read a host's intra table; ``GPU_used`` is local indices as digits (``0137``)."""
    path = Path(path)
    out = []
    for line, row in _open_rows(path, INTRA_COLUMNS):
        used = (row.get("GPU_used") or "").strip()
        if not used or not used.isdigit():
            raise DataError(f"{path}:{line}: GPU_used {used!r} must be local GPU indices as digits")
        idx = [int(c) for c in used] if n_gpus <= 10 else [int(x) for x in used.split()]
        bad = [i for i in idx if i >= n_gpus]
        if bad:
            raise DataError(f"{path}:{line}: GPU index {bad[0]} out of range (host has {n_gpus} GPUs)")
        if len(set(idx)) != len(idx):
            raise DataError(f"{path}:{line}: GPU_used {used!r} repeats a GPU")
        num = _int(row.get("GPU_num"), "GPU_num", path, line)
        if num != len(idx):
            raise DataError(f"{path}:{line}: GPU_num {num} disagrees with GPU_used {used!r}")
        mask = 0
        for i in idx:
            mask |= 1 << i
        out.append(
            TableRow(
                (mask,),
                (row.get("OP") or "").strip(),
                _int(row.get("data_size(B)"), "data_size(B)", path, line),
                _bandwidth(row.get("Bandwidth(GB/s)"), path, line),
                line,
            )
        )
    if not out:
        raise DataError(f"{path}: table has a header but no rows")
    return out


def parse_mapping(raw: str, n_hosts: int, n_gpus: int, path: Path, line: int) -> tuple[int, ...]:
    """Parse ``GPU_Mapping_Across_Nodes``: ``[[0,1],[0],[],[]]`` or binary ``[[1,1,0,..],[..]]``."""
    try:
        doc = json.loads(raw)
    except (TypeError, ValueError):
        raise DataError(f"{path}:{line}: GPU_Mapping_Across_Nodes {raw!r} is not a list of lists") from None
    if not isinstance(doc, list) or not all(isinstance(x, list) for x in doc):
        raise DataError(f"{path}:{line}: GPU_Mapping_Across_Nodes must be a list of per-host lists")
    if len(doc) != n_hosts:
        raise DataError(f"{path}:{line}: mapping lists {len(doc)} hosts, the cluster has {n_hosts}")
    if not all(isinstance(v, int) and not isinstance(v, bool) for x in doc for v in x):
        raise DataError(f"{path}:{line}: mapping entries must be integers")
    # Binary form: every host list is n_gpus wide and 0/1. A valid index list of that width
    # cannot be all 0/1 (it would repeat an index) unless n_gpus <= 2, where indices win.
    index_ok = all(len(set(x)) == len(x) and all(0 <= v < n_gpus for v in x) for x in doc)
    binary = not index_ok and all(len(x) == n_gpus and set(x) <= {0, 1} for x in doc)
    masks = []
    for x in doc:
        m = 0
        if binary:
            for i, bit in enumerate(x):
                if bit:
                    m |= 1 << i
        else:
            for i in x:
                if not 0 <= i < n_gpus:
                    raise DataError(f"{path}:{line}: GPU index {i} out of range (hosts have {n_gpus} GPUs)")
                if m & (1 << i):
                    raise DataError(f"{path}:{line}: GPU index {i} listed twice on one host")
                m |= 1 << i
        masks.append(m)
    return tuple(masks)


def read_inter_table(path: str | Path, n_hosts: int, n_gpus: int) -> list[TableRow]:
    """Read a cross-host table; ``Total_GPU_Count`` must equal the GPUs in the mapping."""
    path = Path(path)
    out = []
    for line, row in _open_rows(path, INTER_COLUMNS):
        masks = parse_mapping(row.get("GPU_Mapping_Across_Nodes") or "", n_hosts, n_gpus, path, line)
        total = _int(row.get("Total_GPU_Count"), "Total_GPU_Count", path, line)
        if total != sum(bin(m).count("1") for m in masks):
            raise DataError(f"{path}:{line}: Total_GPU_Count {total} disagrees with the mapping")
        out.append(
            TableRow(
                masks,
                (row.get("OP") or "").strip(),
                _int(row.get("data_size(B)"), "data_size(B)", path, line),
                _bandwidth(row.get("Bandwidth(GB/s)"), path, line),
                line,
            )
        )
    if not out:
        raise DataError(f"{path}: table has a header but no rows")
    return out


def intra_lookup(rows: list[TableRow], n_gpus: int, source: str) -> np.ndarray:
    """Dense stage-1 table ``table[mask]`` (mean over repeats); ≤1-GPU entries are 0."""
    size = 1 << n_gpus
    total = np.zeros(size)
    count = np.zeros(size)
    for r in rows:
        total[r.masks[0]] += r.busbw
        count[r.masks[0]] += 1
    table = np.divide(total, count, out=np.zeros(size), where=count > 0)
    pc = np.bitwise_count(np.arange(size, dtype=np.int64))
    need = (pc >= 2) & (count == 0)
    if need.any():
        missing = int(np.flatnonzero(need)[0])
        digits = "".join(str(i) for i in range(n_gpus) if missing >> i & 1)
        raise DataError(f"{source}: intra table has no row for GPU subset {digits} ({int(need.sum())} missing)")
    table[pc <= 1] = 0.0
    return table


# ------------------------------------------------------------------------------------------
# Canonical dataset: one Parquet file of measurements plus the cluster spec it belongs to.
#
#   <dir>/measurements.parquet   one row per measurement (repeats kept)
#   <dir>/cluster.yaml           the spec, self-contained (topologies inline, no table paths)
#
# Columns: cluster, gpus (comma-joined GPU ids, sorted in host/index order), masks (list<int64>,
# per-host bitmask in spec host order), counts (list<int64>), n_gpus, n_hosts, collective,
# bytes, busbw (GB/s), source (where the row came from), time (UTC ISO-8601).
DATASET_FILE = "measurements.parquet"
SPEC_FILE = "cluster.yaml"
COLUMNS = ("cluster", "gpus", "masks", "counts", "n_gpus", "n_hosts", "collective", "bytes", "busbw", "source", "time")


@dataclass
class Dataset:
    """A loaded dataset. Readers aggregate repeats by the mean (:meth:`aggregated`)."""

    spec: "ClusterSpec"
    frame: "pd.DataFrame"
    path: Path | None = None

    def __len__(self) -> int:
        return len(self.frame)

    def masks(self) -> np.ndarray:
        return np.array(self.frame["masks"].tolist(), dtype=np.int64).reshape(len(self.frame), self.spec.n_hosts)

    def busbw(self) -> np.ndarray:
        return self.frame["busbw"].to_numpy(dtype=float)

    def aggregated(self) -> "Dataset":
        """One row per distinct allocation (and collective/bytes), bandwidth = mean of repeats."""
        f = self.frame
        keys = ["gpus", "collective", "bytes"]
        agg = f.groupby(keys, sort=False, as_index=False).agg(
            {c: ("mean" if c == "busbw" else "first") for c in f.columns if c not in keys}
        )
        agg["repeats"] = f.groupby(keys, sort=False).size().to_numpy()
        return Dataset(self.spec, agg[list(f.columns) + ["repeats"]], self.path)

    def single_host(self) -> "Dataset":
        return Dataset(self.spec, self.frame[self.frame["n_hosts"] == 1].reset_index(drop=True), self.path)

    def cross_host(self) -> "Dataset":
        return Dataset(self.spec, self.frame[self.frame["n_hosts"] >= 2].reset_index(drop=True), self.path)

    def stage1_tables(self) -> np.ndarray:
        """``(n_hosts, 2**max_gpus)`` stage-1 tables from the single-host rows (mean of repeats).

        Every subset of >= 2 GPUs of every host must be present: stage 1 is a lookup, not a guess.
        """
        spec = self.spec
        width = 1 << int(spec.gpus_per_host.max())
        total = np.zeros((spec.n_hosts, width))
        count = np.zeros((spec.n_hosts, width))
        single = self.frame[self.frame["n_hosts"] == 1]
        if len(single):
            m = np.array(single["masks"].tolist(), dtype=np.int64)
            h = np.argmax(m != 0, axis=1)
            sub = m[np.arange(len(m)), h]
            np.add.at(total, (h, sub), single["busbw"].to_numpy(dtype=float))
            np.add.at(count, (h, sub), 1.0)
        table = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
        pc = np.bitwise_count(np.arange(width, dtype=np.int64))
        for hi, host in enumerate(spec.hosts):
            valid = np.arange(width) < (1 << host.n_gpus)
            need = valid & (pc >= 2) & (count[hi] == 0)
            if need.any():
                raise DataError(
                    f"dataset for {spec.name!r} lacks {int(need.sum())} intra-host subsets of host "
                    f"{host.name!r} (stage 1 needs all of them; profile the host first)"
                )
        table[:, pc <= 1] = 0.0
        return table


def frame_from_masks(
    spec: "ClusterSpec",
    masks: np.ndarray,
    busbw: np.ndarray,
    *,
    collective: str,
    bytes_: int,
    source: str | list[str],
    time: str | list[str] | None = None,
) -> "pd.DataFrame":
    """Build canonical rows from mask vectors (shared by ingestion and profiling)."""
    import datetime as _dt

    import pandas as pd

    from bandpilot.cluster import popcount

    masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
    busbw = np.asarray(busbw, dtype=float)
    if masks.shape[0] != busbw.shape[0]:
        raise DataError("masks and bandwidths differ in length")
    if not np.all(np.isfinite(busbw)) or np.any(busbw < 0):
        raise DataError(f"{source if isinstance(source, str) else 'rows'}: bandwidth must be finite and >= 0")
    counts = popcount(masks)
    now = time or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return pd.DataFrame(
        {
            "cluster": spec.name,
            "gpus": [",".join(spec.from_mask(m)) for m in masks],
            "masks": [list(map(int, m)) for m in masks],
            "counts": [list(map(int, c)) for c in counts],
            "n_gpus": counts.sum(axis=1).astype(np.int64),
            "n_hosts": (counts > 0).sum(axis=1).astype(np.int64),
            "collective": collective,
            "bytes": np.int64(bytes_),
            "busbw": busbw,
            "source": source,
            "time": now,
        },
        columns=list(COLUMNS),
    )


def save_dataset(ds: Dataset, out: str | Path) -> Path:
    """Write ``measurements.parquet`` + ``cluster.yaml`` atomically (temp files, then rename)."""
    import os

    import yaml

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    pq_tmp = out / f".{DATASET_FILE}.tmp"
    spec_tmp = out / f".{SPEC_FILE}.tmp"
    ds.frame.to_parquet(pq_tmp, index=False)
    spec_tmp.write_text(yaml.safe_dump(ds.spec.to_dict(), sort_keys=False))
    os.replace(spec_tmp, out / SPEC_FILE)
    os.replace(pq_tmp, out / DATASET_FILE)
    return out


def load_dataset(path: str | Path) -> Dataset:
    """Load a dataset directory (or its Parquet file). The spec comes from its ``cluster.yaml``."""
    import pandas as pd

    from bandpilot.cluster import load_cluster

    p = Path(path)
    d = p.parent if p.suffix == ".parquet" else p
    pq = d / DATASET_FILE
    if not pq.is_file():
        raise DataError(f"no dataset at {d} (expected {DATASET_FILE})")
    spec = load_cluster(d / SPEC_FILE)
    try:
        frame = pd.read_parquet(pq)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise DataError(f"{pq}: unreadable Parquet ({exc.__class__.__name__})") from None
    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(f"{pq}: missing columns {missing}")
    if len(frame) == 0:
        raise DataError(f"{pq}: dataset is empty")
    bad = frame["busbw"].isna() | (frame["busbw"] < 0)
    if bad.any():
        raise DataError(f"{pq}: row {int(np.flatnonzero(bad.to_numpy())[0])} has a NaN or negative bandwidth")
    others = set(frame["cluster"]) - {spec.name}
    if others:
        raise DataError(f"{pq}: rows from cluster(s) {sorted(others)} in a dataset for {spec.name!r}")
    return Dataset(spec, frame, d)
