"""Exposure-aware shape candidates: which tenants a job's spanning groups meet, and how to pay fewest.

Under the contention rule a spanning group pays the demand of every distinct cross-host tenant on
its hosts. With TP groups inside hosts, each DP group of a stage has a rank on every host of that
stage, so the DP axis (the slowest of its groups) pays the tenants of the worst stage's exposed
hosts. When the clean hosts cannot hold the job (large jobs on busy clusters) two choices decide
the DP axis: which exposed units take the rest (:func:`counts_least_demand`: those adding the least
demand not already paid) and how those units' TP groups are dealt to the stages
(:func:`balance_stages`: spread so that the worst DP group meets the least demand). Spanning TP
groups (no host has room for one) are cut from halves on two hosts (:func:`paired`), tenant-free
halves first and each tenant half beside a clean one.
"""

from __future__ import annotations

import numpy as np

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.search.shape_units import counts_greedy
from bandpilot.dispatch.shape import Shape


def host_tenants(pred: ContentionPredictor) -> np.ndarray:
    """``(n_hosts, n_jobs)``: which contending tenants touch each host."""
    return (pred.jobs_on(np.arange(pred.spec.n_hosts)) != 0).T


def unit_tenants(touch_h: np.ndarray, unit: np.ndarray, n_units: int) -> np.ndarray:
    """``(n_units, n_jobs)``: which contending tenants touch any host of each unit."""
    out = np.zeros((n_units, touch_h.shape[1]), dtype=bool)
    h, j = np.nonzero(touch_h)
    out[unit[h], j] = True
    return out


def counts_least_demand(cap: np.ndarray, clean: np.ndarray, touch: np.ndarray, demand: np.ndarray,
                        G: int) -> np.ndarray | None:
    """TP groups per unit: the clean room first (fullest units), then, one unit at a time, the
    exposed unit whose tenants add the least demand not yet paid (``touch``: ``(U, n_jobs)``), the
    most room on ties - a unit whose tenants are already paid costs the DP axis nothing more.
    Short of ``G`` when the aligned room runs out (the rest are spanning groups); None when the
    clean room holds the job (the clean orders cover that)."""
    if int(clean.sum()) >= G:
        return None
    loc = np.arange(cap.size)
    n = counts_greedy(clean, np.lexsort((loc, -clean)), G)
    need = G - int(n.sum())
    paid = np.zeros(touch.shape[1], dtype=bool)
    while need > 0:
        room = cap - n
        ok = np.flatnonzero(room > 0)
        if not ok.size:  # no aligned room left: the rest span, from the cheapest leftovers
            return n
        new = (touch[ok] & ~paid).astype(float) @ demand
        u = int(ok[np.lexsort((ok, -room[ok], new))[0]])
        take = min(int(room[u]), need)
        n[u] += take
        need -= take
        paid |= touch[u]
    return n


def paired(left: dict[int, list[tuple[int, int]]], rack: np.ndarray, need: int, tp: int,
            cost: np.ndarray | None = None) -> list[list[tuple[int, int]]]:
    """Up to ``need`` TP groups of two halves from two units, the two fullest leftover pools of a
    rack first, then across racks; takes the GPUs it uses out of ``left``. With ``cost`` (per unit:
    the tenant demand a spanning group there pays) see :func:`_paired_cost`."""
    if cost is not None:
        return _paired_cost(left, rack, need, tp, cost)
    half, out = tp // 2, []
    for same_rack in (True, False):
        while len(out) < need:
            pools = [u for u in left if len(left[u]) >= half]
            pools.sort(key=lambda u: -len(left[u]))
            pair = next(((a, b) for i, a in enumerate(pools) for b in pools[i + 1:]
                         if not same_rack or rack[a] == rack[b]), None)
            if pair is None:
                break
            out.append(left[pair[0]][:half] + left[pair[1]][:half])
            for u in pair:
                left[u] = left[u][half:]
    return out


def _paired_cost(left: dict[int, list[tuple[int, int]]], rack: np.ndarray, need: int, tp: int,
                 cost: np.ndarray) -> list[list[tuple[int, int]]]:
    """Halves for ``need`` spanning TP groups, paired so that the worst group pays least: the TP axis
    is its slowest group, and a half beside a tenant caps its group near that tenant's share (~20
    GB/s on the H100 fabric; a clean 4+4 in a rack runs at 139, across racks at 70, and beside a
    tenant a group across racks falls further). Tenant-free halves all go in (fuller pools first);
    each tenant half needed gets a tenant-free partner in its rack (cheapest tenant halves that
    have one first), then anywhere; then tenant-free halves pair (same rack first), then tenant
    halves, the cheapest with the dearest."""
    half = tp // 2
    halves = sorted((float(cost[u]), -len(left[u]), u) for u in left for _ in range(len(left[u]) // half))
    clean = [u for c, _, u in halves if c <= 0]
    dear = [u for c, _, u in halves if c > 0]
    clean = clean[:2 * need]
    n_dear = max(2 * need - len(clean), 0)  # tenant halves the job cannot do without
    pairs: list[tuple[int, int]] = []

    def partner(a: int, pool: list[int], same: bool) -> int | None:
        at = next((i for i, b in enumerate(pool) if b != a and rack[b] == rack[a]), None)
        at = next((i for i, b in enumerate(pool) if b != a), None) if at is None and not same else at
        return None if at is None else pool.pop(at)

    used: list[int] = []
    for same in (True, False):  # a tenant half with a clean partner in its rack, then anywhere
        for i, a in enumerate(dear):
            if len(used) >= n_dear or not clean:
                break
            if a < 0:
                continue
            b = partner(a, clean, same)
            if b is not None:
                pairs.append((a, b))
                used.append(a)
                dear[i] = -1
    while len(clean) >= 2:
        a = clean.pop(0)
        b = partner(a, clean, False)
        if b is None:
            break
        pairs.append((a, b))
    rest = [a for a in dear if a >= 0][:max(2 * (need - len(pairs)), 0)]
    rest.sort(key=lambda u: cost[u])
    while len(rest) >= 2:
        a = rest.pop(0)
        b = next((rest.pop(i) for i in range(len(rest) - 1, -1, -1) if rest[i] != a), None)
        if b is None:
            break
        pairs.append((a, b))
    out = []
    for j, (a, b) in enumerate(pairs[:need]):
        a, b = (a, b) if j % 2 == 0 else (b, a)  # tenant halves alternate between the DP groups of
        out.append(left[a][:half] + left[b][:half])  # the low and the high TP ranks
        left[a], left[b] = left[a][half:], left[b][half:]
    return out


def balance_stages(groups: list[list[tuple[int, int]]], touch_h: np.ndarray, demand: np.ndarray,
                   shape: Shape) -> list[list[tuple[int, int]]] | None:
    """The TP groups reordered so that, laid out DP-inner (stage ``p`` = groups ``p*dp ..``), the
    stage meeting the most tenant demand meets as little as a greedy deal finds. Groups move in
    *blocks* (the consecutive groups cut from one host): a host whose groups serve two stages makes
    every DP group of both stages a sibling of the others there, which costs more than the balance
    gains. Exposed blocks, heaviest first, go each to a stage with room (three greedy keys,
    :func:`_deal`; the best deal kept), then moves of single blocks and of blocks sharing a tenant
    improve the worst stage (:func:`_improve`); clean blocks fill the rest, largest first into the
    stage with the most room (split only when no stage has room for a whole block). None when
    fewer than two stages or fewer than two exposed blocks (nothing to balance), or when the deal
    is no better than the given order (:func:`worst_dp_demand`)."""
    P, D = shape.pp, shape.dp
    if P < 2 or len(groups) != P * D:
        return None
    first = np.array([g[0][0] for g in groups])
    starts = np.flatnonzero(np.r_[True, first[1:] != first[:-1]])
    blocks = np.split(np.arange(len(groups)), starts[1:])
    # per block and TP rank: the tenants on that rank's hosts (DP group (stage, t) meets rank t of
    # every group of its stage: halves of a spanning group serve different DP groups)
    hosts = np.array([[h for h, _ in g] for g in groups])  # (G, tp)
    own = np.stack([touch_h[hosts[b]].any(axis=0) for b in blocks])  # (blocks, tp, n_jobs)
    size = np.array([b.size for b in blocks])
    exp = np.flatnonzero(own.any(axis=(1, 2)))
    if exp.size < 2:
        return None
    # three greedy deals (the new stage total, or the demand it adds, first), the best one improved:
    # one key alone misses splits such as {A, B} / {C, D} when A's hosts also carry B
    deals = [d for d in (_deal(exp, own, size, demand, P, D, key) for key in range(3)) if d is not None]
    if not deals:
        return None
    at = min(deals, key=lambda a: _cost(a, exp, own, demand, P))
    _improve(at, exp, own, size, demand, P, D)
    load = np.bincount(at[exp], weights=size[exp], minlength=P).astype(np.int64)
    out: list[list[int]] = [[] for _ in range(P)]
    for b in np.flatnonzero(at >= 0):
        out[at[b]] += blocks[b].tolist()
    for b in sorted(np.flatnonzero(at < 0).tolist(), key=lambda b: -size[b]):
        fit = np.flatnonzero(load + size[b] <= D)
        if fit.size:  # the stage with the most room that holds the whole block
            s = int(fit[np.argmin(load[fit])])
            out[s] += blocks[b].tolist()
            load[s] += size[b]
            continue
        for i in blocks[b].tolist():  # no stage holds it whole: split
            s = int(np.argmin(load))
            out[s].append(i)
            load[s] += 1
    if any(len(o) != D for o in out):
        return None
    spread = [groups[i] for o in out for i in sorted(o)]
    # kept only when its worst DP group meets less demand than the given order's
    return spread if worst_dp_demand(spread, touch_h, demand, shape) < worst_dp_demand(groups, touch_h, demand, shape) \
        else None


def worst_dp_demand(groups: list[list[tuple[int, int]]], touch_h: np.ndarray, demand: np.ndarray,
                    shape: Shape) -> float:
    """The most tenant demand one DP group (stage, TP rank) meets when ``groups`` (TP groups in
    order) are laid out DP-inner: the distinct tenants on the hosts of its ``dp`` ranks."""
    hosts = np.array([[h for h, _ in g] for g in groups]).reshape(shape.pp, shape.dp, shape.tp)
    meet = touch_h[hosts].any(axis=1)  # (pp, tp, n_jobs)
    return float((meet.astype(float) @ demand).max()) if meet.size else 0.0


def _deal(exp: np.ndarray, own: np.ndarray, size: np.ndarray, demand: np.ndarray, P: int, D: int,
          key: int) -> np.ndarray | None:
    """Exposed blocks, heaviest first, each to the stage with room chosen by ``key``: 0 the least
    resulting stage demand, 1 the same then the least added demand (a stage that already pays the
    block's tenants), 2 the least added demand then the least resulting. None when a block fits no
    stage."""
    at = np.full(own.shape[0], -1)
    load = np.zeros(P, dtype=np.int64)
    stage_t = np.zeros((P,) + own.shape[1:], dtype=bool)
    for b in exp[np.lexsort((exp, -(own[exp].astype(float) @ demand).max(axis=1)))]:
        ok = np.flatnonzero(load + size[b] <= D)
        if not ok.size:
            return None
        grow = ((stage_t[ok] | own[b]).astype(float) @ demand).max(axis=1)
        add = ((own[b] & ~stage_t[ok]).astype(float) @ demand).max(axis=1)
        keys = ((ok, load[ok], grow), (ok, load[ok], add, grow), (ok, load[ok], grow, add))[key]
        s = int(ok[np.lexsort(keys)[0]])
        at[b], stage_t[s] = s, stage_t[s] | own[b]
        load[s] += size[b]
    return at


def _cost(at: np.ndarray, exp: np.ndarray, own: np.ndarray, demand: np.ndarray, P: int,
          ow: np.ndarray | None = None) -> tuple[float, float]:
    """(worst, sum of squares) of the DP groups' demands when exposed block ``exp[i]`` is in stage
    ``at[exp[i]]`` (``ow``: ``own[exp]`` flattened, when the caller has it)."""
    E, T, J = own[exp].shape
    ow = own[exp].reshape(E, T * J).astype(np.float64) if ow is None else ow
    onehot = (at[exp][None, :] == np.arange(P)[:, None]).astype(np.float64)
    d = ((onehot @ ow) > 0).reshape(P, T, J) @ demand  # each DP group's distinct tenants' demand
    return float(d.max()), float((d * d).sum())


def _improve(at: np.ndarray, exp: np.ndarray, own: np.ndarray, size: np.ndarray, demand: np.ndarray,
             P: int, D: int, rounds: int = 50) -> tuple[float, float]:
    """Move exposed blocks between stages (``at``, in place, within each stage's ``D`` groups) while
    the worst DP group's demand, then the sum of squares of their demands, falls: single blocks,
    and every block sharing a tenant with one (a single move cannot take a tenant out of a stage
    when it is on two of the stage's blocks). Returns the final (worst, sum of squares)."""

    anyt = own[exp].any(axis=1)  # (E, J): the tenants each exposed block meets
    kin = [exp[(anyt & anyt[i]).any(axis=1)] for i in range(exp.size)]
    ow = own[exp].reshape(exp.size, -1).astype(np.float64)

    def cost(a: np.ndarray) -> tuple[float, float]:
        return _cost(a, exp, own, demand, P, ow)

    best = cost(at)
    for _ in range(rounds):
        moved = False
        for i, b in enumerate(exp):
            for mv in (np.array([b]), kin[i]):
                for s in range(P):
                    go = mv[at[mv] != s]
                    if not go.size or int(size[exp[at[exp] == s]].sum()) + int(size[go].sum()) > D:
                        continue
                    old = at[go].copy()
                    at[go] = s
                    c = cost(at)
                    if c < best:
                        best, moved = c, True
                    else:
                        at[go] = old
        if not moved:
            break
    return best
