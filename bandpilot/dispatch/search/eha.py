"""Which balanced split of ``k`` over the fewest hosts is best? EHA, and the best single host.

Equilibrium-driven Heuristic Algorithm (paper Sec. IV-D2): best single-host subset if a
host fits ``k``, else balanced splits of ``k`` over combinations of the minimum number of hosts.
"""

from __future__ import annotations

import math

import numpy as np

from bandpilot.dispatch.search.context import PRUNE_PAIRS, Found, SearchContext
from bandpilot.errors import PlacementError

#: Host combinations EHA considers at most (class multisets, best-ranked first) and candidates
#: it evaluates at most (balanced splits of k over them).
EHA_MAX_COMBOS = 512
EHA_MAX_CANDIDATES = 1_024


def single_host(ctx: SearchContext) -> Found:
    """Best single-host allocation (the ``single_host`` constraint)."""
    got = ctx.best_single_host()
    if got is None:
        raise PlacementError("constraint_unmet", f"no single host has {ctx.k} free GPUs")
    return got


def _balanced(f: np.ndarray, k: int, top: np.ndarray) -> list[np.ndarray]:
    """Even splits of ``k`` over hosts with capacities ``f`` (water-filling); the remainder goes
    to every choice of hosts when there are few choices, else to the best stage-1 hosts."""
    qmax = int(f.max())
    q = 0
    for cand in range(qmax + 1):
        if np.minimum(f, cand).sum() <= k:
            q = cand
    base = np.minimum(f, q)
    extra = k - int(base.sum())
    if extra == 0:
        return [base]
    elig = np.flatnonzero(f > q)
    if extra > elig.size:  # cannot happen when sum(f) >= k; defensive
        return []
    from itertools import combinations

    if math.comb(elig.size, extra) <= 16:
        outs = []
        for pick in combinations(elig.tolist(), extra):
            c = base.copy()
            c[list(pick)] += 1
            outs.append(c)
        return outs
    order = elig[np.lexsort((elig, -top[elig]))]
    c = base.copy()
    c[order[:extra]] += 1
    return [c]


def _class_combos(ctx: SearchContext, m: int, cap: int) -> list[np.ndarray]:
    """Host sets of size ``m`` that can hold ``k`` GPUs, one per multiset of host classes."""
    classes = ctx.classes()
    if not classes:
        return []
    topv = [float(ctx.best_val[cl.hosts[0], cl.f]) for cl in classes]
    order = sorted(range(len(classes)), key=lambda i: (-classes[i].f, -topv[i], int(classes[i].hosts[0])))
    cl = [classes[i] for i in order]
    fs = [c.f for c in cl]
    mult = [len(c.hosts) for c in cl]
    k = ctx.k
    out: list[np.ndarray] = []

    def best_fill(i: int, r: int) -> int:
        tot = 0
        for j in range(i, len(cl)):
            take = min(r, mult[j])
            tot += take * fs[j]
            r -= take
            if r == 0:
                break
        return tot

    def rec(i: int, r: int, acc: list[np.ndarray], total: int) -> None:
        if len(out) >= cap:
            return
        if r == 0:
            if total >= k:
                out.append(np.concatenate(acc))
            return
        if i == len(cl) or total + best_fill(i, r) < k:
            return
        for take in range(min(r, mult[i]), -1, -1):
            rec(i + 1, r - take, acc + [cl[i].hosts[:take]], total + take * fs[i])

    rec(0, m, [], 0)
    return out


def eha(ctx: SearchContext) -> Found:
    """Equilibrium-driven Heuristic Algorithm (paper Sec. IV-D2)."""
    got = ctx.best_single_host()
    if got is not None:
        return got
    f_sorted = np.sort(ctx.fcount)[::-1]
    m = int(np.searchsorted(np.cumsum(f_sorted), ctx.k) + 1)
    counts = []
    for hosts in _class_combos(ctx, m, EHA_MAX_COMBOS):
        f = ctx.fcount[hosts]
        variants = _balanced(f, ctx.k, ctx.best_val[hosts, np.minimum(f, ctx.k // m + 1)])
        for c in variants[: max(1, (EHA_MAX_CANDIDATES - len(counts)) // 8)]:
            row = np.zeros(ctx.H, dtype=np.int64)
            row[hosts] = c
            counts.append(row)
        if len(counts) >= EHA_MAX_CANDIDATES:
            break
    counts = np.array(counts, dtype=np.int64)
    counts = counts[ctx.canonical_unique(counts)]
    return ctx.best_of(ctx.masks_from_counts(counts), max_pairs=PRUNE_PAIRS)
