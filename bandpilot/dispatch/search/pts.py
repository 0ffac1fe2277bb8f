"""Which allocation is left after greedily removing the weakest GPU? Pruned Tree Search.

Pruned Tree Search (paper Sec. IV-D3): from the free set remove the weakest GPU step by
step; each step's removals are de-duplicated (same host class, count and stage-1 before/after)
and evaluated in ONE batched prediction. Single-host prioritisation adds the best
single-host subsets as candidates.
"""

from __future__ import annotations

import numpy as np

from bandpilot.dispatch.search.context import PRUNE_PAIRS, Found, SearchContext
from bandpilot.topology.cluster import popcount


def pts(ctx: SearchContext, start: np.ndarray | None = None, single_host_first: bool = True) -> Found:
    """Pruned Tree Search (paper Sec. IV-D3): greedy elimination of the weakest GPU.

    Starts from ``start`` (default: every free GPU). Each step's removal candidates are
    de-duplicated - on unexposed hosts a removal is characterised by (host class, count, stage-1
    before, stage-1 after) - and evaluated in one batch.
    """
    H, G, k = ctx.H, ctx.G, ctx.k
    found: list[Found | None] = []
    if single_host_first:
        found.append(ctx.best_single_host())
    S = (ctx.free if start is None else np.asarray(start, dtype=np.int64)).copy()
    if int(popcount(S).sum()) < k:
        raise ValueError("PTS start set smaller than k")
    bit = np.int64(1) << np.arange(G, dtype=np.int64)
    cur: Found | None = None
    evaluated = 0
    while int(popcount(S).sum()) > k:
        has = (S[:, None] & bit[None, :]) != 0
        h_idx, g_idx = np.nonzero(has)
        new = S[h_idx] & ~bit[g_idx]
        nv = ctx.stage1[h_idx, new]
        cnt = popcount(S)[h_idx]
        before = ctx.stage1[h_idx, S[h_idx]]
        exp = ctx.exposed[h_idx]
        key = np.column_stack([
            np.where(exp, H + h_idx, ctx.cls[h_idx]),
            cnt,
            np.round(before * 1e6).astype(np.int64),
            np.round(nv * 1e6).astype(np.int64),
            np.where(exp, new, -1),
        ])
        _, first = np.unique(np.ascontiguousarray(key).view(np.dtype((np.void, 8 * key.shape[1]))).ravel(),
                             return_index=True)
        first = np.sort(first)
        rows = np.repeat(S[None, :], first.size, axis=0)
        rows[np.arange(first.size), h_idx[first]] = new[first]
        p = ctx.evaluate(rows, max_pairs=PRUNE_PAIRS)  # -inf: provably below the best (never chosen)
        evaluated += rows.shape[0]
        i = ctx.choose(rows, p.value)
        S = rows[i]
        cur = Found(S.copy(), float(p.value[i]), float(p.standalone[i]))
    if cur is None:
        p = ctx.evaluate(S[None, :])
        cur = Found(S.copy(), float(p.value[0]), float(p.standalone[0]))
        evaluated += 1
    cur.evaluated = evaluated
    found.append(cur)
    return ctx.pick(found)
