"""What is a dataset? The canonical form of measurements - one Parquet file plus its cluster spec -
and how to build, save, load and version it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from typing import TYPE_CHECKING

from bandpilot.data.dataset_file import COLUMNS, check_table, read_table, to_frame, to_table, write_atomic
from bandpilot.data.sparse_masks import SparseMasks
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
# Columns (:mod:`bandpilot.data.dataset_file`): cluster, gpus (comma-joined GPU ids, sorted in
# host/index order), hosts / host_masks / counts (sparse: the hosts a row uses, ascending in spec
# order, and their GPU bitmasks and GPU counts), n_gpus, n_hosts, collective, bytes, busbw (GB/s),
# source (where the row came from), time (UTC ISO-8601).
DATASET_FILE = "measurements.parquet"
SPEC_FILE = "cluster.yaml"


@dataclass
class Dataset:
    """A loaded dataset. Readers aggregate repeats by the mean (:meth:`aggregated`)."""

    spec: "ClusterSpec"
    frame: "pd.DataFrame"
    path: Path | None = None

    def __len__(self) -> int:
        return len(self.frame)

    def sparse(self) -> SparseMasks:
        """Every row's allocation as CSR arrays (the form to use at scale)."""
        return SparseMasks.from_lists(self.frame["hosts"], self.frame["host_masks"], self.spec.n_hosts)

    def masks(self) -> np.ndarray:
        """Dense ``(rows, n_hosts)`` masks: for small clusters or a subset of rows (the cross-host
        pool); 38,415 rows x 2,502 trays would be 770 MB."""
        return self.sparse().dense()

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
        single = self.single_host().sparse()  # one host per row
        if len(single):
            bw = self.frame.loc[self.frame["n_hosts"] == 1, "busbw"].to_numpy(dtype=float)
            np.add.at(total, (single.hosts, single.masks), bw)
            np.add.at(count, (single.hosts, single.masks), 1.0)
        table = np.divide(total, count, out=np.zeros_like(total), where=count > 0)
        pc = np.bitwise_count(np.arange(width, dtype=np.int64))
        valid = np.arange(width)[None, :] < (np.int64(1) << spec.gpus_per_host)[:, None]
        need = valid & (pc >= 2)[None, :] & (count == 0)
        lacking = np.flatnonzero(need.any(axis=1))
        if lacking.size:
            host = spec.hosts[int(lacking[0])]
            raise DataError(
                f"dataset for {spec.name!r} lacks {int(need[lacking[0]].sum())} intra-host subsets of host "
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
    """Build canonical rows from dense mask vectors (tables, tests; small clusters)."""
    return frame_from_sparse(spec, SparseMasks.from_dense(masks), busbw, collective=collective, bytes_=bytes_,
                             source=source, time=time)


def frame_from_sparse(
    spec: "ClusterSpec",
    sp: SparseMasks,
    busbw: np.ndarray,
    *,
    collective: str,
    bytes_: int,
    source: str | list[str],
    time: str | list[str] | None = None,
) -> "pd.DataFrame":
    """Build canonical rows from sparse allocations (shared by ingestion and profiling)."""
    import datetime as _dt

    import pandas as pd

    busbw = np.asarray(busbw, dtype=float)
    if len(sp) != busbw.shape[0]:
        raise DataError("masks and bandwidths differ in length")
    if not np.all(np.isfinite(busbw)) or np.any(busbw < 0):
        raise DataError(f"{source if isinstance(source, str) else 'rows'}: bandwidth must be finite and >= 0")
    hosts, masks, counts = sp.row_lists()
    now = time or _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")
    return pd.DataFrame(
        {
            "cluster": spec.name,
            "gpus": sp.gpu_strings(spec.host_names, spec.gpus_per_host),
            "hosts": hosts,
            "host_masks": masks,
            "counts": counts,
            "n_gpus": sp.gpus_per_row(),
            "n_hosts": sp.hosts_per_row(),
            "collective": collective,
            "bytes": np.int64(bytes_),
            "busbw": busbw,
            "source": source,
            "time": now,
        },
        columns=list(COLUMNS),
    )


def save_dataset(ds: Dataset, out: str | Path) -> Path:
    """Write ``measurements.parquet`` + ``cluster.yaml`` atomically (temp files, then rename), after
    the same checks a load makes: a bad row is an error and nothing is written."""
    import yaml

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    where = str(out / DATASET_FILE)
    table = to_table(ds.frame, ds.spec.n_hosts, where)
    check_table(table, ds.spec.name, ds.spec.full_masks, where)
    write_atomic({out / SPEC_FILE: yaml.safe_dump(ds.spec.to_dict(), sort_keys=False), out / DATASET_FILE: table})
    return out


def load_dataset(path: str | Path) -> Dataset:
    """Load a dataset directory (or its Parquet file). The spec comes from its ``cluster.yaml``.
    Files with dense per-host masks (written before the sparse form) are converted on load."""
    from bandpilot.topology.cluster import load_cluster

    p = Path(path)
    d = p.parent if p.suffix == ".parquet" else p
    pq = d / DATASET_FILE
    if not pq.is_file():
        raise DataError(f"no dataset at {d} (expected {DATASET_FILE})")
    spec = load_cluster(d / SPEC_FILE)
    table = read_table(pq)
    sp = check_table(table, spec.name, spec.full_masks, str(pq))
    return Dataset(spec, to_frame(table, sp), d)


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
