"""Per-unit count rows -> mask rows on the host columns they touch, exact row de-duplication that
keeps :func:`numpy.unique`'s order, and the tray order count patterns are placed in - the domain
search's hot spots on big clusters.

A gang of 2,048-4,096 GPUs spans 29-57 NVLink domains (~1,000 trays); one local-search batch holds
500-1,100 rows that differ from the current best in two domains each. Scattering every row's
~1,000 tray parts (and ``np.unique(axis=0)`` over ~10,000 candidate moves) cost more than the
model's evaluation of them. Here each batch is one base row copied, then only the units where a
row differs from it are rewritten: work per row is the trays of the changed units, not of the gang.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bandpilot.dispatch.contention import unique_rows
from bandpilot.topology.cluster import ranges


def mask_rows(units: Any, D: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit count rows ``(n, U)`` -> the best mask rows for them on the hosts they touch:
    ``(masks (n, len(cols)), cols)``, equal to ``masks_from_counts(units.rows(D))[:, cols]``."""
    D = np.atleast_2d(np.asarray(D, dtype=np.int64))
    n = D.shape[0]
    ri, ui = np.nonzero(D)
    width = int(D.max(initial=0)) + 1
    keys = np.unique(ui * width + D[ri, ui])
    # every distinct (unit, count) part: its hosts and counts, concatenated (``ptr`` into them)
    hs, cs = [], []
    for key in keys.tolist():
        h, c = units.part_hosts(key // width, key % width)
        hs.append(h)
        cs.append(c)
    if not hs:
        return np.zeros((n, 0), dtype=np.int64), np.zeros(0, dtype=np.int64)
    h_of, c_of = np.concatenate(hs), np.concatenate(cs)
    ptr = np.r_[0, np.cumsum([h.size for h in hs])]
    cols = np.unique(h_of)
    col_of = np.searchsorted(cols, h_of)
    m_of = units.ctx.best_mask[h_of, c_of]
    base = D[0]
    out = np.zeros((n, cols.size), dtype=np.int64)
    bu = np.flatnonzero(base)
    _put(out, np.zeros(bu.size, dtype=np.int64), bu, base[bu], keys, width, ptr, col_of, m_of, True)
    out[1:] = out[0]
    # only the units where a row differs from the base: clear the base's part, write the row's
    r, u = np.nonzero(D != base[None, :])
    had = base[u] > 0
    _put(out, r[had], u[had], base[u[had]], keys, width, ptr, col_of, m_of, False)
    has = D[r, u] > 0
    _put(out, r[has], u[has], D[r[has], u[has]], keys, width, ptr, col_of, m_of, True)
    return out, cols


def _put(out: np.ndarray, r: np.ndarray, u: np.ndarray, t: np.ndarray, keys: np.ndarray, width: int,
         ptr: np.ndarray, col_of: np.ndarray, m_of: np.ndarray, write: bool) -> None:
    """Rows ``r`` get unit ``u``'s part for ``t`` GPUs written (``write``) or cleared."""
    if r.size == 0:
        return
    j = np.searchsorted(keys, u * width + t)
    lo, lens = ptr[j], ptr[j + 1] - ptr[j]
    idx = ranges(lo, lens)
    out[np.repeat(r, lens), col_of[idx]] = m_of[idx] if write else 0


def first_rows(rows: np.ndarray) -> np.ndarray:
    """Ascending indices of the first occurrence of each distinct row: ``np.sort(np.unique(rows,
    axis=0, return_index=True)[1])``, by hashing (exact: :func:`unique_rows` verifies the groups)."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if rows.shape[0] <= 1:
        return np.arange(rows.shape[0])
    _, inv = unique_rows(rows)
    first = np.full(int(inv.max()) + 1, rows.shape[0], dtype=np.int64)
    np.minimum.at(first, inv, np.arange(rows.shape[0]))
    return np.sort(first)


def unique_sorted(rows: np.ndarray) -> np.ndarray:
    """``np.unique(rows, axis=0)`` (distinct rows in lexicographic order) for int64 rows."""
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    if rows.shape[0] <= 1 or rows.shape[1] == 0:
        return np.unique(rows, axis=0)
    uniq = rows[first_rows(rows)]
    return uniq[np.lexsort(uniq.T[::-1])]


def pattern_fill(ctx: Any, trays_of: dict[int, np.ndarray]):
    """``fill(u, c)``: unit ``u``'s trays that can take a part of ``c`` GPUs, in the order a part
    takes them - best fit (unexposed, fewest free), then the best model value for ``c`` GPUs
    (constant over trays holding ``c`` when trays are symmetric: the order is then the value-blind
    one), then exposure, then host. A pattern's part goes on the first tray not yet taken: sorted
    once per (unit, c), not once per part (k = 32: 228 patterns, ~3,000 parts per request)."""
    cache: dict[tuple[int, int], list[int]] = {}

    def fill(u: int, c: int) -> list[int]:
        got = cache.get((u, c))
        if got is None:
            hs = trays_of[u]
            fit = hs[ctx.fcount[hs] >= c]
            got = fit[np.lexsort((fit, ctx.exposure[fit], -np.round(ctx.best_val[fit, c], 9), ctx.fcount[fit], ctx.exposed[fit]))].tolist()
            cache[(u, c)] = got
        return got

    return fill
