"""What is a dataset? The canonical form of measurements - one Parquet file plus its cluster spec -
and how to build, save, load and version it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from typing import TYPE_CHECKING

from bandpilot.errors import DataError

if TYPE_CHECKING:
    import pandas as pd

    from bandpilot.topology.cluster import ClusterSpec

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

    from bandpilot.topology.cluster import popcount

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

    from bandpilot.topology.cluster import load_cluster

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


def dataset_hash(path: str | Path) -> str:
    """Version id of a dataset for run tags: the DVC md5 of the tracked output holding the Parquet
    file when its recorded content is current, else the md5 of the Parquet file itself."""
    import hashlib

    p = Path(path)
    pq = p if p.suffix == ".parquet" else p / DATASET_FILE
    if not pq.is_file():
        raise DataError(f"no dataset at {p} (expected {DATASET_FILE})")
    h = hashlib.md5()
    with pq.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    own = h.hexdigest()
    from bandpilot.data.dvc import tracked_md5

    return tracked_md5(pq, own) or own


def repeat_noise(ds: Dataset) -> float | None:
    """Measurement noise: median standard deviation of log busbw over allocations measured more than
    once (None when nothing was repeated). Health checks set their tolerance from it."""
    f = ds.frame[ds.frame["busbw"] > 0]
    if f.empty:
        return None
    logs = np.log(f["busbw"].to_numpy(dtype=float))
    g = f.assign(_log=logs).groupby(["gpus", "collective", "bytes"], sort=False)["_log"]
    sd = g.std(ddof=1)[g.size() >= 2]
    return float(sd.median()) if len(sd) else None
