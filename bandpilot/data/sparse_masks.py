"""How does a dataset hold its allocations? Sparsely: per row, the hosts (trays) it uses and their
GPU masks, never one entry per host of the cluster.

A dense row over all hosts made the 10,008-GPU profile (38,415 rows x 2,502 trays, 96 M cells)
fail to write; a row uses one host (stage 1) up to a few hundred. In memory the rows
are CSR arrays (:class:`SparseMasks`); in the frame and the Parquet file they are the list
columns ``hosts`` (ascending host indices in spec order) and ``host_masks`` (the GPU bitmask on
each of those hosts, > 0).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Sequence

import numpy as np


@dataclass(frozen=True)
class SparseMasks:
    """CSR rows: row ``i`` uses ``hosts[indptr[i]:indptr[i+1]]`` with masks ``masks[...]``."""

    indptr: np.ndarray  # (n + 1,) int64, starts at 0
    hosts: np.ndarray  # (nnz,) int64 host index
    masks: np.ndarray  # (nnz,) int64 GPU bitmask
    n_hosts: int

    def __len__(self) -> int:
        return int(self.indptr.shape[0] - 1)

    @classmethod
    def from_dense(cls, dense: np.ndarray) -> "SparseMasks":
        dense = np.atleast_2d(np.asarray(dense, dtype=np.int64))
        rows, hosts = np.nonzero(dense)  # row-major: hosts ascend within a row
        indptr = np.zeros(dense.shape[0] + 1, dtype=np.int64)
        np.cumsum(np.bincount(rows, minlength=dense.shape[0]), out=indptr[1:])
        return cls(indptr, hosts.astype(np.int64), dense[rows, hosts], int(dense.shape[1]))

    @classmethod
    def from_lists(cls, hosts: Iterable[Sequence[int]], masks: Iterable[Sequence[int]], n_hosts: int) -> "SparseMasks":
        """From per-row sequences (frame cells: lists or arrays); lengths must agree row by row."""
        hl = [np.asarray(h, dtype=np.int64).ravel() for h in hosts]
        ml = [np.asarray(m, dtype=np.int64).ravel() for m in masks]
        lens = np.array([h.size for h in hl], dtype=np.int64)
        if len(hl) != len(ml) or not np.array_equal(lens, [m.size for m in ml]):
            raise ValueError("hosts and host_masks differ in length")
        indptr = np.zeros(len(hl) + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        cat = lambda xs: np.concatenate(xs) if xs else np.zeros(0, np.int64)  # noqa: E731
        return cls(indptr, cat(hl), cat(ml), int(n_hosts))

    @property
    def row_of(self) -> np.ndarray:
        """Row index of every stored entry."""
        return np.repeat(np.arange(len(self)), np.diff(self.indptr))

    def hosts_per_row(self) -> np.ndarray:
        return np.diff(self.indptr)

    def gpus_per_row(self) -> np.ndarray:
        per = np.bitwise_count(self.masks).astype(np.int64)
        return np.bincount(self.row_of, weights=per, minlength=len(self)).astype(np.int64)

    def dense(self, rows: np.ndarray | None = None) -> np.ndarray:
        """``(len(rows), n_hosts)`` int64 - for the rows a consumer needs (a batch, the cross-host
        pool), not the whole dataset at scale."""
        sub = self if rows is None else self.take(rows)
        out = np.zeros((len(sub), sub.n_hosts), dtype=np.int64)
        out[sub.row_of, sub.hosts] = sub.masks
        return out

    def take(self, rows: np.ndarray) -> "SparseMasks":
        rows = np.asarray(rows, dtype=np.int64).ravel()
        starts, lens = self.indptr[rows], np.diff(self.indptr)[rows]
        indptr = np.zeros(rows.size + 1, dtype=np.int64)
        np.cumsum(lens, out=indptr[1:])
        idx = np.repeat(starts - indptr[:-1], lens) + np.arange(int(indptr[-1]))
        return SparseMasks(indptr, self.hosts[idx], self.masks[idx], self.n_hosts)

    def row_lists(self) -> tuple[list[list[int]], list[list[int]], list[list[int]]]:
        """Per-row Python lists (hosts, masks, counts) for a frame's cells."""
        cuts = self.indptr[1:-1]
        split = lambda a: [x.tolist() for x in np.split(a, cuts)] if len(self) else []  # noqa: E731
        return split(self.hosts), split(self.masks), split(np.bitwise_count(self.masks).astype(np.int64))

    def gpu_strings(self, host_names: Sequence[str], gpus_per_host: np.ndarray) -> list[str]:
        """The canonical ``gpus`` key of every row: comma-joined ``<host>:<index>`` in host/index order."""
        out: list[str] = []
        hosts, masks = self.hosts.tolist(), self.masks.tolist()
        for a, b in zip(self.indptr[:-1].tolist(), self.indptr[1:].tolist()):
            out.append(",".join(f"{host_names[h]}:{i}" for h, m in zip(hosts[a:b], masks[a:b])
                                for i in range(int(gpus_per_host[h])) if (m >> i) & 1))
        return out

    def problem(self, full_masks: np.ndarray) -> tuple[int, str] | None:
        """The first invalid row and why (None when every row is a valid allocation of the cluster
        whose per-host full masks are ``full_masks``)."""
        n = len(self)
        checks = []
        empty = np.flatnonzero(np.diff(self.indptr) == 0)
        checks.append((empty[0] if empty.size else n, "uses no host"))
        if self.hosts.size:
            row = self.row_of
            bad = (self.hosts < 0) | (self.hosts >= self.n_hosts)
            checks.append((row[bad][0] if bad.any() else n, f"has a host index outside 0..{self.n_hosts - 1}"))
            h = np.clip(self.hosts, 0, self.n_hosts - 1)
            bad = (self.masks <= 0) | ((self.masks & ~full_masks[h]) != 0)
            checks.append((row[bad][0] if bad.any() else n, "has a GPU mask that is empty or names a GPU its host lacks"))
            same = row[1:] == row[:-1]
            bad = same & (self.hosts[1:] <= self.hosts[:-1])
            checks.append((row[1:][bad][0] if bad.any() else n, "lists hosts out of order or twice"))
        first, why = min(checks, key=lambda c: c[0])
        return None if first >= n else (int(first), why)
