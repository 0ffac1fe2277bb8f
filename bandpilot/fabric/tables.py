"""Measured bandwidth tables in the BandPilot CSV layout: intra-host ``GPU_used`` tables and
inter-host ``GPU_Mapping_Across_Nodes`` tables (list-of-lists or binary-mask form).

Every malformed row is reported as ``file:line: what``. :class:`~bandpilot.fabric.trace.TraceFabric`
serves these tables as ground truth; :mod:`bandpilot.data.ingest` ingests them.
"""

from __future__ import annotations

import csv
import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from bandpilot.errors import DataError

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
        out.append(_table_row((mask,), row, path, line))
    if not out:
        raise DataError(f"{path}: table has a header but no rows")
    return out



def _table_row(masks: tuple[int, ...], row: dict, path: Path, line: int) -> TableRow:
    """The columns every table layout shares (op, size, bandwidth), checked the same way."""
    return TableRow(
        masks,
        (row.get("OP") or "").strip(),
        _int(row.get("data_size(B)"), "data_size(B)", path, line),
        _bandwidth(row.get("Bandwidth(GB/s)"), path, line),
        line,
    )

def parse_mapping(raw: str, n_hosts: int, n_gpus: int, path: Path, line: int) -> tuple[int, ...]:
    """Parse ``GPU_Mapping_Across_Nodes``: ``[[0,1],[0],[],[]]`` or binary ``[[1,1,0,..],[..]]``."""
    try:
        doc = json.loads(raw)
    except (TypeError, ValueError, RecursionError):  # RecursionError: absurdly deep nesting
        raise DataError(f"{path}:{line}: GPU_Mapping_Across_Nodes {str(raw)[:60]!r} is not a list of lists") from None
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
        out.append(_table_row(masks, row, path, line))
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
