"""How many ways, and which, can ``t`` GPUs spread over ``n`` interchangeable hosts of ``f`` free
GPUs each - and which subsets of an exposed host are Pareto-optimal? Combinatorics for the search."""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np


@lru_cache(maxsize=4096)
def partition_counts(n: int, f: int, kmax: int) -> np.ndarray:
    """``p[t]`` = number of partitions of ``t`` (0..kmax) into at most ``n`` parts each <= ``f``."""
    n = min(n, kmax)
    dp = np.zeros((n + 1, kmax + 1))
    dp[0, 0] = 1.0
    for v in range(1, min(f, kmax) + 1):
        for j in range(1, n + 1):
            dp[j, v:] += dp[j - 1, : kmax + 1 - v]
    out = dp.sum(axis=0)
    out.setflags(write=False)
    return out


@lru_cache(maxsize=65536)
def _partitions(t: int, n: int, f: int) -> np.ndarray:
    if t == 0:
        return np.zeros((1, n), dtype=np.int64)
    if n == 0 or f == 0 or t > n * f:
        return np.zeros((0, n), dtype=np.int64)
    blocks = []
    lo = -(-t // n)
    for v in range(min(f, t), lo - 1, -1):
        sub = _partitions(t - v, n - 1, v)
        if sub.shape[0]:
            blk = np.empty((sub.shape[0], n), dtype=np.int64)
            blk[:, 0] = v
            blk[:, 1:] = sub
            blocks.append(blk)
    out = np.concatenate(blocks) if blocks else np.zeros((0, n), dtype=np.int64)
    out.setflags(write=False)
    return out


def partitions(t: int, n: int, f: int) -> np.ndarray:
    """All partitions of ``t`` into at most ``n`` parts each <= ``f``, as descending rows of width ``n``."""
    ne = min(n, t)
    core = _partitions(t, ne, f)
    if ne == n:
        return core
    out = np.zeros((core.shape[0], n), dtype=np.int64)
    out[:, :ne] = core
    return out


def class_codes(caps: list[int], k: int, code_t: type, options: Callable[[int, int], np.ndarray]) -> np.ndarray | None:
    """Every vector of per-class codes whose counts sum to ``k``: a dynamic programme over classes,
    class ``i`` holding at most ``caps[i]`` GPUs and ``options(i, t)`` giving its code rows for ``t``
    of them (``code_t``). Partial vectors that cannot reach ``k`` are pruned, so no intermediate
    table is larger than the result. Row order: the earlier classes' counts ascending, outermost
    first. None when no vector sums to ``k``."""
    rest = np.r_[np.cumsum(caps[::-1])[::-1][1:], 0]
    acc: dict[int, np.ndarray] = {0: np.zeros((1, 0), dtype=code_t)}
    for i, cap in enumerate(caps):
        new: dict[int, list[np.ndarray]] = {}
        for s_, A in acc.items():
            for t in range(cap + 1):
                s2 = s_ + t
                if s2 > k:
                    break
                if s2 + rest[i] < k:
                    continue
                R = options(i, t)
                if R.shape[0] == 0:
                    continue
                if A.shape[0] == 1:
                    block = np.concatenate([np.repeat(A, R.shape[0], axis=0), R], axis=1)
                else:
                    block = np.concatenate([np.repeat(A, R.shape[0], axis=0), np.tile(R, (A.shape[0], 1))], axis=1)
                new.setdefault(s2, []).append(block)
        acc = {s_: (v[0] if len(v) == 1 else np.concatenate(v)) for s_, v in new.items()}
    return acc.get(k)


def pareto_options(feats: np.ndarray, masks: np.ndarray, counts: np.ndarray) -> dict[int, np.ndarray]:
    """Per count, the Pareto-optimal masks over ``feats`` (maximisation), best-first, duplicates dropped.

    ``feats[:, 0]`` is the subset's stage-1 value, the other columns its unions' stage-1 values.
    Order within a count: stage-1, then the worst union value, then their sum, then mask.
    """
    f = np.round(feats, 9)
    mins = f[:, 1:].min(axis=1) if f.shape[1] > 1 else np.zeros(f.shape[0])
    sums = f[:, 1:].sum(axis=1) if f.shape[1] > 1 else np.zeros(f.shape[0])
    order = np.lexsort((masks, -sums, -mins, -f[:, 0], counts))
    f, m, c = f[order], masks[order], counts[order]
    out: dict[int, np.ndarray] = {}
    bounds = np.flatnonzero(np.diff(c)) + 1
    for lo, hi in zip(np.r_[0, bounds], np.r_[bounds, c.size]):
        fb = f[lo:hi]
        ge = (fb[:, None, :] >= fb[None, :, :]).all(axis=2)  # ge[i, j]: i weakly dominates j
        eq = (fb[:, None, :] == fb[None, :, :]).all(axis=2)
        dominated = (ge & ~eq).any(axis=0)
        earlier_eq = np.triu(eq, k=1).any(axis=0)  # identical rows: keep the best-ordered one
        out[int(c[lo])] = m[lo:hi][~dominated & ~earlier_eq]
    return out
