"""Does moving GPUs from one host to another improve an allocation? Batched local search over
count vectors."""

from __future__ import annotations

import numpy as np

from bandpilot.dispatch.search.context import PRUNE_PAIRS, Found, SearchContext
from bandpilot.topology.cluster import popcount

#: Local-search iterations (each one batched prediction).
LOCAL_SEARCH_ITERS = 64


def _counts_of(mask: np.ndarray) -> np.ndarray:
    return popcount(np.asarray(mask, dtype=np.int64))


def local_search(ctx: SearchContext, start: Found, iters: int = LOCAL_SEARCH_ITERS) -> Found:
    """Hill-climb over count vectors: move 1, 2 or all GPUs of one host to another, batched."""
    best = start
    c = _counts_of(start.mask)
    # Re-map to the best per-host subsets (never worse under a monotone model).
    remap = ctx.best_of(ctx.masks_from_counts(c))
    if remap is not None and remap.value > best.value:
        best = remap
    f = ctx.fcount
    for _ in range(iters):
        c = _counts_of(best.mask)
        src = np.flatnonzero(c > 0)
        if src.size == 0:
            break
        # one representative source per (class, count); up to two targets per (class, count)
        _, si = np.unique(np.column_stack([ctx.cls[src], c[src]]), axis=0, return_index=True)
        src = src[np.sort(si)]
        tgt_all = np.flatnonzero((f > c) & (ctx.cls >= 0))
        if tgt_all.size == 0:
            break
        tkey = ctx.cls[tgt_all] * (ctx.G + 2) + c[tgt_all]
        order = np.lexsort((tgt_all, tkey))
        tk = tkey[order]
        rank = np.arange(tk.size) - np.searchsorted(tk, tk)
        tgt = np.sort(tgt_all[order][rank < 2])
        moves = []
        for a in src:
            for t in sorted({1, 2, int(c[a])}):
                if t > c[a]:
                    continue
                ok = (tgt != a) & (c[tgt] + t <= f[tgt])
                if not ok.any():
                    continue
                b = tgt[ok]
                rows = np.repeat(c[None, :], b.size, axis=0)
                rows[:, a] -= t
                rows[np.arange(b.size), b] += t
                moves.append(rows)
        if not moves:
            break
        rows = np.concatenate(moves)
        rows = rows[ctx.canonical_unique(rows)]
        got = ctx.best_of(ctx.masks_from_counts(rows), max_pairs=PRUNE_PAIRS)
        if got is None or got.value <= best.value * (1 + 1e-12) + 1e-12:
            break
        got.evaluated += best.evaluated
        best = got
    return best
