"""The emulator's column-restricted prediction (:meth:`EmulatorFabric.predict_columns`) on NVLink-
domain clusters, computed per unit and only where a row differs from the batch's first row.

Its value depends on per-unit sums (GPUs, NIC line rate, trays, slowest rail) and on per-tray
stage-1 values - the network term is a function of the per-domain count pattern. A unit-level
local-search batch on 10,008 GPUs holds ~1,000 rows of ~1,000 trays that differ from each other in
two or three of the 29-57 domains they span (contending jobs' super allocations in a few more): the
sums of the units a row shares with the first row are the first row's, so only the changed units'
trays are read again. Exact: the same sums in the same order, so the same floats as the dense path.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bandpilot.topology.cluster import popcount, ranges

#: Rows from which the per-unit delta path is used (below it the dense one is as fast).
DELTA_FROM = 32
#: Share of (row, unit) blocks differing from the first row above which the dense path is faster
#: (unrelated rows: the delta path took 1.4-2.2x the dense one's time on 1,000 random rows).
DELTA_MAX_CHANGED = 0.25


def unit_sums(counts: np.ndarray, rails: np.ndarray, rail_gbps: np.ndarray, starts: np.ndarray
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Per-segment (unit) sums of per-tray counts ``(n, w)`` with segments starting at ``starts``:
    GPUs, NIC line rate ``Σ min(count, rails) * rail``, trays used, slowest rail of a used tray."""
    used = counts > 0
    ucount = np.add.reduceat(counts, starts, axis=1)
    urails = np.add.reduceat(np.minimum(counts, rails[None, :]) * rail_gbps[None, :], starts, axis=1)
    utrays = np.add.reduceat(used.astype(np.int64), starts, axis=1)
    railmin = np.minimum.reduceat(np.where(used, rail_gbps[None, :], np.inf), starts, axis=1)
    return ucount, urails, utrays, railmin


def _block_sums(fab: Any, masks: np.ndarray, cols: np.ndarray, starts: np.ndarray) -> tuple[np.ndarray, ...]:
    """:func:`unit_sums` plus the smallest stage-1 value of a tray holding >= 2 GPUs, per segment."""
    counts = popcount(masks)
    intra = fab.stage1[cols[None, :], masks]
    big = np.minimum.reduceat(np.where(counts >= 2, intra, np.inf), starts, axis=1)
    return (*unit_sums(counts, fab._rails[cols], fab._rail_gbps[cols], starts), big)


def predict_columns_delta(fab: Any, masks: np.ndarray, cols: np.ndarray) -> np.ndarray | None:
    """``fab.predict_columns(masks, cols)`` from per-unit sums: the first row's once, then only the
    (row, unit) blocks that differ from it. None when the rows are too unlike the first (a sample
    of them differs in more than :data:`DELTA_MAX_CHANGED` of the blocks): the dense path then."""
    order, starts, seg_unit, gcols = fab._groups(cols)
    if order is not None:
        masks, cols = masks[:, order], gcols
    n, c = masks.shape
    base = masks[0]
    sample = masks[:: max(1, n // 16)]
    if np.logical_or.reduceat(sample != base[None, :], starts, axis=1).mean() > DELTA_MAX_CHANGED:
        return None
    r, s = np.nonzero(np.logical_or.reduceat(masks != base[None, :], starts, axis=1))
    sums = [np.repeat(v, n, axis=0) for v in _block_sums(fab, base[None, :], cols, starts)]
    if r.size:
        # the changed blocks' trays, block after block, as one row segmented by block
        lo = starts[s]
        lens = np.r_[starts[1:], c][s] - lo
        idx = ranges(lo, lens)
        sub = masks[np.repeat(r, lens), idx][None, :]
        for whole, part in zip(sums, _block_sums(fab, sub, cols[idx], np.r_[0, np.cumsum(lens)[:-1]])):
            whole[r, s] = part[0]
    ucount, urails, utrays, railmin, big = sums
    out = np.zeros(n)
    n_used = utrays.sum(axis=1)
    single = np.flatnonzero(n_used == 1)
    if single.size:  # one tray: its stage-1 value (read as the dense path does)
        out[single] = fab.stage1[cols[None, :], masks[single]].sum(axis=1)
    cross = n_used >= 2
    if cross.any():
        net = fab._network_units(ucount[cross], urails[cross], utrays[cross], railmin[cross], seg_unit)
        out[cross] = np.minimum(net, big[cross].min(axis=1))
    return out
