"""Unit orders for the shape search: how many TP groups each unit (host, or NVLink domain) takes.

Each order is a *count vector* (TP groups per unit) computed from free / clean room alone, without
model calls; :func:`bandpilot.dispatch.search.shape.candidates` cuts each into TP groups and lays
them out. A new order is one more entry in :func:`count_vectors`.
"""

from __future__ import annotations

import numpy as np

from bandpilot.dispatch.shape import Shape


def counts_greedy(cap: np.ndarray, order: np.ndarray, G: int) -> np.ndarray:
    n = np.zeros(cap.size, dtype=np.int64)
    need = G
    for u in order:
        if need == 0:
            break
        n[u] = min(int(cap[u]), need)
        need -= int(n[u])
    return n


def _counts_bestfit(cap: np.ndarray, loc: np.ndarray, G: int) -> np.ndarray:
    fit = np.flatnonzero(cap >= G)
    if fit.size:
        n = np.zeros(cap.size, dtype=np.int64)
        n[fit[np.lexsort((loc[fit], cap[fit]))[0]]] = G
        return n
    order = np.lexsort((loc, -cap))
    n = np.zeros(cap.size, dtype=np.int64)
    need = G
    for u in order:
        rest = [v for v in order if n[v] == 0 and cap[v] >= need]
        if rest:
            n[min(rest, key=lambda v: (cap[v], loc[v]))] = need
            return n
        n[u] = cap[u]
        need -= int(cap[u])
        if need <= 0:
            break
    return n


def _counts_segment(cap: np.ndarray, free_u: np.ndarray, loc: np.ndarray, G: int, block: int) -> np.ndarray:
    """Slurm ``--segment`` = TP (``block`` TP groups per segment) with block placement, as a unit
    split (the cut :func:`bandpilot.dispatch.baselines.block_select` makes, without its per-segment
    compact search): the whole job on the best-fit unit (fewest free GPUs) when one holds it, else
    each segment in turn on the best-fit unit that holds one - the unit just filled stays the
    tightest fit, so that is a greedy fill of the units in ascending free order."""
    fit = np.flatnonzero(cap >= G)
    n = np.zeros(cap.size, dtype=np.int64)
    if fit.size:
        n[fit[np.lexsort((loc[fit], free_u[fit]))[0]]] = G
        return n
    order = np.lexsort((loc, free_u))
    return counts_greedy(cap, order[cap[order] >= block], G)


def count_vectors(cap1: np.ndarray, clean1: np.ndarray, unit: np.ndarray, exposed: np.ndarray,
                   rack_of_unit: np.ndarray, shape: Shape, free_u: np.ndarray) -> dict[str, np.ndarray]:
    """TP groups per unit for each unit order: fullest first, best fit, least exposed, rack-compact,
    segment (Slurm ``--segment`` = TP block placement: the segment baseline's split, so the search
    re-lays that set out itself), and clean (most TP groups on hosts no cross-host tenant touches)
    whole or water-filled over the fewest units - the splits the bandwidth-only search starts from,
    here without its model calls. ``cap1`` / ``clean1``: a unit's room / clean room in TP groups;
    ``free_u``: its free GPUs."""
    U, G = cap1.size, shape.pp * shape.dp
    loc = np.arange(U)  # units are numbered in host order: neighbours in the spec are neighbours here
    exposed_u = np.bincount(unit, weights=exposed.astype(np.int64), minlength=U)
    counts: dict[str, np.ndarray] = {}
    # whole stages (DP-inner) or whole pipelines (PP-inner) per unit keep DP / PP groups inside units
    for tag, block in (("", 1), ("+dp-blocks", shape.dp), ("+pp-blocks", shape.pp)):
        cap, clean = cap1 // block * block, np.minimum(clean1, cap1) // block * block
        if tag and (block == 1 or cap.sum() < G):
            continue  # (without blocks, too little aligned room still gives every unit's room + spanning groups)
        counts["fullest" + tag] = counts_greedy(cap, np.lexsort((loc, -cap)), G)
        counts["bestfit" + tag] = _counts_bestfit(cap, loc, G)
        counts["quiet" + tag] = counts_greedy(cap, np.lexsort((loc, -cap, exposed_u > 0)), G)
        rack_cap = np.bincount(rack_of_unit, weights=cap)
        counts["rack" + tag] = counts_greedy(cap, np.lexsort((loc, -cap, -rack_cap[rack_of_unit])), G)
        if not tag:  # (its per-block variants found nothing the others miss: not worth their scoring)
            counts["segment"] = _counts_segment(cap, free_u, loc, G, block)
        by_clean = np.lexsort((loc, -cap, -clean))
        counts["clean" + tag] = counts_greedy(cap, by_clean, G)
        # water-filled on clean room alone when it holds the job (a unit's share beyond its clean room
        # lands on trays a cross-host tenant touches, and one such DP group slows the whole axis)
        use = clean if clean.sum() >= G else cap
        by_clean = by_clean[use[by_clean] > 0]
        m0 = int(np.searchsorted(np.cumsum(use[by_clean]), G)) + 1
        # the fewest units, and twice as many: spread groups share each unit's NICs with fewer siblings
        spreads = ((m0, "clean-balanced"), (min(2 * m0, by_clean.size), "clean-spread"))  # all units: no gain
        for i, (m, name) in enumerate(spreads):
            if 1 < m <= by_clean.size and all(m != prev for prev, _ in spreads[:i]):
                n = np.zeros(U, dtype=np.int64)
                n[by_clean[:m]] = _balanced(use[by_clean[:m]] // block, G // block) * block
                if n.sum() == G:
                    counts[name + tag] = n
    clean = np.minimum(clean1, cap1)
    # (whole hosts only: a stage's DP groups then meet every host with the same count, the most)
    whole = np.where(clean == clean.max(initial=0), clean, 0)
    for name, room in (("rack-stages", clean), ("rack-stages-whole", whole), ("rack-stages-any", cap1)):
        n = counts_rack_stages(room, rack_of_unit, shape)
        if n is not None:
            counts[name] = n
    n = counts_rack_stages(clean, rack_of_unit, shape, tail=True)
    if n is not None and not np.array_equal(n, counts.get("rack-stages")):
        counts["rack-stages-tail"] = n
    return counts


def counts_rack_stages(room: np.ndarray, rack_of_unit: np.ndarray, shape: Shape,
                       tail: bool = False) -> np.ndarray | None:
    """Whole pipeline stages per rack: each rack takes a multiple of ``dp`` TP groups (its fullest
    units first), so the DP-inner layout keeps every DP group inside one rack and only the PP
    boundaries between racks cross them (a PP axis pays the cross-rack rate once; a DP axis
    spread over racks pays it on the larger DP volume). None when the racks' room holds no
    ``pp`` whole stages, or when the job has no stages to split (pp = 1) or one rack is all. With
    ``tail``, each rack's ragged end is spread (:func:`_spread_tail`)."""
    racks = np.unique(rack_of_unit)
    if shape.pp < 2 or racks.size < 2 or racks.size == rack_of_unit.size:
        return None
    dp = shape.dp
    per_rack = np.bincount(rack_of_unit, weights=room, minlength=int(racks.max()) + 1).astype(np.int64)
    stages = per_rack // dp
    if int(stages.sum()) < shape.pp:
        return None
    n = np.zeros(room.size, dtype=np.int64)
    need = shape.pp
    loc = np.arange(room.size)
    for r in np.lexsort((np.arange(stages.size), -stages)):  # racks holding the most stages first
        if need == 0:
            break
        s = min(int(stages[r]), need)
        if s == 0:
            break
        us = np.flatnonzero(rack_of_unit == r)
        got = counts_greedy(np.where(rack_of_unit == r, room, 0), us[np.lexsort((loc[us], -room[us]))], s * dp)
        n += _spread_tail(got, np.where(rack_of_unit == r, room, 0)) if tail else got
        need -= s
    return n


def _spread_tail(got: np.ndarray, room: np.ndarray) -> np.ndarray:
    """A fullest-first split whose last unit holds one TP group, re-spread: the last full unit's
    groups and the partial units' go water-filled over the fewest partial units (less room than
    the fullest) that hold them with >= 2 each. A unit holding one group gives each DP group one
    rank there, the slowest count pattern of the ring (a busy tp=2,pp=2,dp=32 case: 8 groups
    as 4+3+1 vs 3+3+2, DP 20.7 vs 29.6 GB/s on the emulator). ``got`` unchanged when no unit holds
    one group or no such spread exists."""
    used = np.flatnonzero(got)
    top = int(room.max(initial=0))
    full = np.flatnonzero((got == top) & (got > 0))
    if not used.size or int(got[used].min()) != 1 or not full.size:
        return got
    total = int(got[(got > 0) & (got < top)].sum()) + top
    part = np.flatnonzero((room < top) & (room >= 2))
    part = part[np.lexsort((part, -room[part]))]
    for m in range(1, part.size + 1):
        if int(room[part[:m]].sum()) >= total and 2 * m <= total:
            b = _balanced(room[part[:m]], total)
            if int(b.min()) >= 2:
                out = np.where(got == top, got, 0)
                out[full[-1]] = 0
                out[part[:m]] = b
                return out
    return got


def _balanced(cap: np.ndarray, n: int) -> np.ndarray:
    """Water-filling split of ``n`` over units with capacities ``cap`` (largest share first)."""
    q = max(c for c in range(int(cap.max()) + 1) if np.minimum(cap, c).sum() <= n)
    base = np.minimum(cap, q)
    extra = n - int(base.sum())
    elig = np.flatnonzero(cap > q)
    base[elig[:extra]] += 1
    return base
