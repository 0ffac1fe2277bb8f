"""What is in ``measurements.parquet``, and how is it checked? The file's schema, its validation
(one-line :class:`DataError` naming the file and the row), the atomic write, and the reading of
files written before allocations were sparse.

Columns: cluster, gpus (comma-joined GPU ids in host/index order), hosts (list<int32>: the hosts
used, ascending, in spec order), host_masks (list<int64>: the GPU bitmask on each), counts
(list<int32>: GPUs on each), n_gpus, n_hosts, collective, bytes, busbw (GB/s), source, time.

Files written before (``masks`` / ``counts`` as dense lists over every host of the cluster) are
still read: their rows are converted on load, and saving the dataset again writes the sparse form.
Code that predates the sparse form fails on a new file with "missing columns ['masks']".
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from bandpilot.data.sparse_masks import SparseMasks
from bandpilot.errors import DataError

if TYPE_CHECKING:
    import pandas as pd
    import pyarrow as pa

COLUMNS = ("cluster", "gpus", "hosts", "host_masks", "counts", "n_gpus", "n_hosts", "collective", "bytes", "busbw",
           "source", "time")
LIST_COLUMNS = ("hosts", "host_masks", "counts")
LEGACY_MASKS = "masks"  # the dense per-host list of files written before the sparse form
_KINDS = {"cluster": "string", "gpus": "string", "collective": "string", "source": "string", "time": "string",
          "n_gpus": "integer", "n_hosts": "integer", "bytes": "integer", "busbw": "number"}


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{exc.__class__.__name__}: {text[0]}" if text else exc.__class__.__name__


def _kind_ok(kind: str, t: "pa.DataType") -> bool:
    import pyarrow as pa

    if kind == "string":
        return pa.types.is_string(t) or pa.types.is_large_string(t)
    if kind == "integer":
        return pa.types.is_integer(t)
    return pa.types.is_integer(t) or pa.types.is_floating(t)


def _list_values(table: "pa.Table", name: str, where: str) -> tuple[np.ndarray, np.ndarray]:
    """``(lengths, values)`` of an integer list column; a null list or element is an error."""
    import pyarrow as pa
    import pyarrow.compute as pc

    col = table.column(name)
    t = col.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_integer(t.value_type):
        raise DataError(f"{where}: column {name!r} must hold lists of integers (it holds {t})")
    arr = col.combine_chunks() if col.num_chunks != 1 else col.chunk(0)
    if arr.null_count:
        raise DataError(f"{where}: row {int(np.flatnonzero(arr.is_null().to_numpy(zero_copy_only=False))[0])}: "
                        f"{name} is null")
    lengths = pc.list_value_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    values = arr.flatten()
    if values.null_count:
        at = int(np.flatnonzero(values.is_null().to_numpy(zero_copy_only=False))[0])
        raise DataError(f"{where}: row {int(np.searchsorted(np.cumsum(lengths), at, side='right'))}: "
                        f"{name} holds a null")
    return lengths, values.to_numpy(zero_copy_only=False).astype(np.int64)


def _scalars(table: "pa.Table", where: str) -> None:
    for name, kind in _KINDS.items():
        col = table.column(name)
        if not _kind_ok(kind, col.type):
            raise DataError(f"{where}: column {name!r} must hold {kind}s (it holds {col.type})")
        if col.null_count:
            raise DataError(f"{where}: row {int(np.flatnonzero(col.is_null().to_numpy())[0])}: {name} is null")


def _sparse_of(table: "pa.Table", n_hosts: int, where: str) -> tuple[SparseMasks, np.ndarray | None]:
    """The rows' allocations and stored counts, from the sparse columns or (older files, no counts
    kept: they are derived) the dense ``masks`` list."""
    if "hosts" not in table.column_names and LEGACY_MASKS in table.column_names:
        lengths, values = _list_values(table, LEGACY_MASKS, where)
        bad = np.flatnonzero(lengths != n_hosts)
        if bad.size:
            raise DataError(f"{where}: row {int(bad[0])}: {int(lengths[bad[0]])} masks for a cluster of {n_hosts} hosts")
        return SparseMasks.from_dense(values.reshape(len(lengths), n_hosts)), None
    missing = [c for c in LIST_COLUMNS if c not in table.column_names]
    if missing:
        raise DataError(f"{where}: missing columns {missing}")
    (lh, hosts), (lm, masks), (lc, counts) = (_list_values(table, c, where) for c in LIST_COLUMNS)
    bad = np.flatnonzero((lh != lm) | (lh != lc))
    if bad.size:
        raise DataError(f"{where}: row {int(bad[0])}: hosts, host_masks and counts differ in length")
    indptr = np.zeros(lh.size + 1, dtype=np.int64)
    np.cumsum(lh, out=indptr[1:])
    return SparseMasks(indptr, hosts, masks, n_hosts), counts


def check_table(table: "pa.Table", spec_name: str, full_masks: np.ndarray, where: str) -> SparseMasks:
    """Every check a dataset file must pass; returns its allocations. Raises one-line DataErrors."""
    missing = [c for c in COLUMNS if c not in table.column_names and not (c in LIST_COLUMNS and LEGACY_MASKS in table.column_names)]
    if missing:
        raise DataError(f"{where}: missing columns {missing}")
    if table.num_rows == 0:
        raise DataError(f"{where}: dataset is empty")
    _scalars(table, where)
    sp, counts = _sparse_of(table, int(full_masks.shape[0]), where)
    problem = sp.problem(full_masks)
    if problem is not None:
        raise DataError(f"{where}: row {problem[0]}: the allocation {problem[1]}")
    wrong = np.flatnonzero(counts != np.bitwise_count(sp.masks)) if counts is not None else np.zeros(0, np.int64)
    if wrong.size:
        raise DataError(f"{where}: row {int(sp.row_of[wrong[0]])}: counts disagree with host_masks")
    for name, want in (("n_hosts", sp.hosts_per_row()), ("n_gpus", sp.gpus_per_row())):
        bad = np.flatnonzero(table.column(name).to_numpy() != want)
        if bad.size:
            raise DataError(f"{where}: row {int(bad[0])}: {name} disagrees with the allocation")
    bw = table.column("busbw").to_numpy().astype(float)
    bad = np.flatnonzero(~np.isfinite(bw) | (bw < 0))
    if bad.size:
        raise DataError(f"{where}: row {int(bad[0])} has a NaN or negative bandwidth")
    clusters = set(table.column("cluster").unique().to_pylist()) - {spec_name}
    if clusters:
        raise DataError(f"{where}: rows from cluster(s) {sorted(clusters)} in a dataset for {spec_name!r}")
    return sp


def _list_array(indptr: np.ndarray, values: np.ndarray, dtype: "pa.DataType") -> "pa.Array":
    import pyarrow as pa

    return pa.ListArray.from_arrays(pa.array(indptr.astype(np.int32)), pa.array(values, type=dtype))


def to_table(frame: "pd.DataFrame", n_hosts: int, where: str) -> "pa.Table":
    """The frame as the file's Arrow table: list columns built from CSR arrays (no per-cell Python
    lists through Arrow's conversion)."""
    import pyarrow as pa

    missing = [c for c in COLUMNS if c not in frame.columns]
    if missing:
        raise DataError(f"{where}: missing columns {missing}")
    try:
        sp = SparseMasks.from_lists(frame["hosts"], frame["host_masks"], n_hosts)
        counts = SparseMasks.from_lists(frame["hosts"], frame["counts"], n_hosts).masks
        rest = [c for c in frame.columns if c not in LIST_COLUMNS]
        table = pa.Table.from_pandas(frame[rest], preserve_index=False)
    except (ValueError, TypeError, OverflowError, pa.ArrowException) as exc:
        raise DataError(f"{where}: cannot convert the rows ({_first_line(exc)})") from None
    lists = {"hosts": _list_array(sp.indptr, sp.hosts, pa.int32()),
             "host_masks": _list_array(sp.indptr, sp.masks, pa.int64()),
             "counts": _list_array(sp.indptr, counts, pa.int32())}
    cols = {c: (lists[c] if c in lists else table.column(c)) for c in frame.columns}
    return pa.table(cols)


def to_frame(table: "pa.Table", sp: SparseMasks) -> "pd.DataFrame":
    """The checked table as the in-memory frame: list cells as Python lists, sparse in either case."""
    keep = [c for c in table.column_names if c not in LIST_COLUMNS and c != LEGACY_MASKS]
    frame = table.select(keep).to_pandas()
    hosts, masks, counts = sp.row_lists()
    for name, cells in (("hosts", hosts), ("host_masks", masks), ("counts", counts)):
        frame[name] = cells
    order = [c for c in COLUMNS if c in frame.columns] + [c for c in frame.columns if c not in COLUMNS]
    return frame[order]


def read_table(path: Path) -> "pa.Table":
    import pyarrow.parquet as pq

    try:
        return pq.read_table(path)
    except Exception as exc:  # pyarrow raises several types for corrupt files
        raise DataError(f"{path}: unreadable Parquet ({exc.__class__.__name__})") from None


def write_atomic(tables: dict[Path, "pa.Table | str"]) -> None:
    """Write every file to a temporary name first, then rename them all: a failure (disk full,
    Arrow's allocation) leaves every target as it was and no temporary file behind."""
    import pyarrow.parquet as pq

    tmps = {p: p.parent / f".{p.name}.{os.getpid()}.tmp" for p in tables}
    p = next(iter(tables))
    try:
        for p, content in tables.items():
            if isinstance(content, str):
                tmps[p].write_text(content)
            else:
                pq.write_table(content, tmps[p])
    except Exception as exc:
        for t in tmps.values():
            t.unlink(missing_ok=True)
        raise DataError(f"cannot write {p}: {_first_line(exc)}") from None
    for p, t in tmps.items():
        os.replace(t, p)
