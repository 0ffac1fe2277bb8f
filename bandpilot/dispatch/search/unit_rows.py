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
from bandpilot.dispatch.search.context import host_ids
from bandpilot.topology.cluster import ranges


def mask_rows(units: Any, D: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-unit count rows ``(n, U)`` -> the best mask rows for them on the hosts they touch:
    ``(masks (n, len(cols)), cols)``, equal to ``masks_from_counts(units.rows(D))[:, cols]``."""
    D = np.atleast_2d(np.asarray(D, dtype=np.int64))
    n = D.shape[0]
    ri, ui = np.nonzero(D)
    width = int(D.max(initial=0)) + 1
    keys = np.unique(ui * width + D[ri, ui])
    if keys.size == 0:
        return np.zeros((n, 0), dtype=np.int64), np.zeros(0, dtype=np.int64)
    # every distinct (unit, count) part: its hosts and counts, concatenated (``ptr`` into them)
    ptr, h_of, c_of = part_table(units, keys // width, keys % width)
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


def part_table(units: Any, u: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:meth:`Units.part_hosts` of many ``(u, t)`` pairs at once (``t`` = 0: no part), concatenated:
    ``(ptr, hosts, counts)``, pair ``j``'s part being ``hosts[ptr[j]:ptr[j + 1]]``. Each part is
    computed once per request (:func:`_parts_of`) and kept in flat arrays indexed by ``(u, t)``: a
    2,048-4,096-GPU gang's screened chunks need ~100-1,000 parts per call, nearly all seen before -
    one Python call per part was most of ``mask_rows``."""
    u, t = np.asarray(u, dtype=np.int64), np.asarray(t, dtype=np.int64)
    big = t > units.free[u]
    if big.any():
        j = int(np.flatnonzero(big)[0])
        raise ValueError(f"unit {u[j]} cannot hold {t[j]} GPUs")
    store = units.setup.get("parts")
    if store is None:
        width = int(units.free.max(initial=0)) + 1
        store = {"lo": np.full((units.U, width), -1, dtype=np.int64), "len": np.zeros((units.U, width), dtype=np.int64),
                 "hosts": np.zeros(0, dtype=np.int64), "counts": np.zeros(0, dtype=np.int64)}
        units.setup["parts"] = store
    lo, ln = store["lo"], store["len"]
    new = lo[u, t] < 0
    if new.any():
        code = np.unique(u[new] * lo.shape[1] + t[new])
        nu, nt = code // lo.shape[1], code % lo.shape[1]
        ptr, hosts, counts = _parts_of(units, nu, nt)
        lo[nu, nt], ln[nu, nt] = ptr[:-1] + store["hosts"].size, np.diff(ptr)
        store["hosts"], store["counts"] = np.r_[store["hosts"], hosts], np.r_[store["counts"], counts]
    lens = ln[u, t]
    idx = ranges(lo[u, t], lens)
    return np.r_[0, np.cumsum(lens)], store["hosts"][idx], store["counts"][idx]


def _parts_of(units: Any, u: np.ndarray, t: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """:func:`part_table` computed: the :meth:`Units.part_hosts` rule on padded per-unit fill
    orders - whole trays in fill order up to the first step whose remainder is 0 or fits a tray at
    or after it, the remainder on the best-fitting such tray (unexposed, fewest free, best stage-1
    value for it, step)."""
    ctx = units.ctx
    order, free, cum, suf, n = fill_table(units)
    L = order.shape[1]
    steps = np.arange(L)
    m = n[u]
    c = cum[u, :L]
    ok = (steps[None, :] < m[:, None]) & ((c == t[:, None]) | (suf[u] >= t[:, None] - c))
    i = np.where(ok.any(axis=1), ok.argmax(axis=1), m)
    left = t - cum[u, i]  # > 0 with i == m only for t > the unit's free GPUs (refused above)
    # the remainder's tray: lexicographic best over the candidate steps, one key at a time
    hs, fs = order[u], free[u]
    cand = (steps[None, :] >= i[:, None]) & (fs >= np.maximum(left, 1)[:, None]) & (left > 0)[:, None]
    for key in (ctx.exposed[hs].astype(np.int64), fs, -ctx.best_val[hs, np.minimum(left, ctx.G)[:, None]]):
        low = np.where(cand, key, np.inf).min(axis=1, keepdims=True)
        cand &= key == low
    p = cand.argmax(axis=1)
    rem = left > 0
    lens = i + rem
    ptr = np.r_[0, np.cumsum(lens)]
    hosts, counts = np.empty(int(ptr[-1]), dtype=np.int64), np.empty(int(ptr[-1]), dtype=np.int64)
    j = np.repeat(np.arange(u.size), i)
    s = ranges(np.zeros(u.size, dtype=np.int64), i)
    at = ranges(ptr[:-1], i)
    hosts[at], counts[at] = hs[j, s], fs[j, s]
    hosts[ptr[1:][rem] - 1], counts[ptr[1:][rem] - 1] = hs[rem, p[rem]], left[rem]
    return ptr, hosts, counts


def fill_table(units: Any) -> tuple[np.ndarray, ...]:
    """Every unit's free trays in fill order (unexposed, fullest, best stage-1 value, host), padded
    to the largest unit: ``(hosts (U, L), free (U, L), prefix sums (U, L + 1), suffix maxima (U, L),
    free trays (U,))`` (padding: host 0 with 0 free) - once per request, from one sort of all free
    trays (as :meth:`Units._tray_order` per unit)."""
    got = units.setup.get("fill_table")
    if got is not None:
        return got
    ctx = units.ctx
    h = np.flatnonzero(ctx.fcount > 0)
    f = ctx.fcount[h]
    o = np.lexsort((h, -ctx.best_val[h, f], -f, ctx.exposed[h], units.unit[h]))
    h, f, uo = h[o], f[o], units.unit[h[o]]
    n = np.bincount(uo, minlength=units.U).astype(np.int64)
    L = int(n.max(initial=0))
    pos = np.arange(h.size) - np.r_[0, np.cumsum(n)[:-1]][uo]
    order, free = np.zeros((units.U, L), dtype=np.int64), np.zeros((units.U, L), dtype=np.int64)
    order[uo, pos], free[uo, pos] = h, f
    cum = np.zeros((units.U, L + 1), dtype=np.int64)
    np.cumsum(free, axis=1, out=cum[:, 1:])
    suf = np.maximum.accumulate(free[:, ::-1], axis=1)[:, ::-1]
    got = (order, free, cum, suf, n)
    units.setup["fill_table"] = got
    return got


def _put(out: np.ndarray, r: np.ndarray, u: np.ndarray, t: np.ndarray, keys: np.ndarray, width: int,
         ptr: np.ndarray, col_of: np.ndarray, m_of: np.ndarray, write: bool) -> None:
    """Rows ``r`` get unit ``u``'s part for ``t`` GPUs written (``write``) or cleared."""
    if r.size == 0:
        return
    j = np.searchsorted(keys, u * width + t)
    lo, lens = ptr[j], ptr[j + 1] - ptr[j]
    idx = ranges(lo, lens)
    out[np.repeat(r, lens), col_of[idx]] = m_of[idx] if write else 0


def move_targets(units: Any, d: np.ndarray, cap: np.ndarray, n_unused: int
                 ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Where a unit move of the count row ``d`` may go: ``(src, unused, targets, room)`` - the used
    units, the ``n_unused`` most promising unused units with room (most room, then most GPUs no
    contending job touches, then unit id), ``targets`` = used then those, and each unit's room."""
    src = np.flatnonzero(d > 0)
    clean = units.free - units.exposed_free
    unused = np.flatnonzero((d == 0) & (cap > 0))
    unused = unused[np.lexsort((unused, -cap[unused], -clean[unused]))][:n_unused]
    return src, unused, np.concatenate([src, unused]), cap - d


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


class UnitSlices:
    """``self[u]``: the entries of ``hosts`` (grouped by their sorted unit ids ``units``) in unit ``u``
    - sliced when asked: a request's patterns land on one or a few of 1,389 units, and splitting
    every unit's trays up front cost ~2 ms a request at 100,008 GPUs."""

    def __init__(self, hosts: np.ndarray, units: np.ndarray) -> None:
        self.hosts, self.units = hosts, units

    def __getitem__(self, u: int) -> np.ndarray:
        lo, hi = np.searchsorted(self.units, [u, u + 1])
        return self.hosts[lo:hi]


def mixed_types(ctx: Any, hosts: np.ndarray) -> bool:
    gpu_id, _ = host_ids(ctx.spec)
    g = gpu_id[hosts]
    return bool(g.size and g.min() != g.max())


def symmetric_trays(ctx: Any, hosts: np.ndarray) -> bool:
    """True when, per GPU type, a tray's best ``c``-subset value depends only on ``c`` (not on which
    GPUs of it are free): then trays differ only in free count and count patterns are exact."""
    if hosts.size == 0:
        return True
    if mixed_types(ctx, hosts):
        return False
    # one host per distinct (stage-1 row, free mask) pair: the values are the pair's
    hosts = hosts[np.unique(ctx.pair[hosts], return_index=True)[1]]
    vals = np.round(ctx.best_val[hosts, 1:], 9)
    have = np.arange(1, ctx.G + 1)[None, :] <= ctx.fcount[hosts][:, None]
    hi = np.where(have, vals, -np.inf).max(axis=0)
    lo = np.where(have, vals, np.inf).min(axis=0)
    seen = have.any(axis=0)
    return bool(np.all(hi[seen] == lo[seen]))


def best_fit_units(ge: np.ndarray, need: np.ndarray, in_cand: np.ndarray, order: np.ndarray) -> list[int]:
    """Per pattern (its trays needed with >= c free GPUs, ``need``) the first unit of ``order`` among
    ``in_cand`` whose trays (``ge``) can hold it, or -1. Units with equal ``ge`` rows are feasible
    for the same patterns: tested once per distinct row (an idle 100,008-GPU cluster: 1 of 1,389)."""
    rows, grp = unique_rows(ge)
    feasible = (rows[None, :, 1:] >= need[:, None, 1:]).all(axis=2)  # (patterns, distinct rows)
    rank = np.empty(order.size, dtype=np.int64)
    rank[order] = np.arange(order.size)
    first = np.full(rows.shape[0], order.size, dtype=np.int64)  # per row its best-fit candidate unit
    np.minimum.at(first, grp, np.where(in_cand, rank, order.size))
    pos = np.where(feasible, first[None, :], order.size).min(axis=1)
    return np.where(pos < order.size, order[np.minimum(pos, order.size - 1)], -1).tolist()


def pattern_fill(ctx: Any, trays_of: Any):
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

    alike: dict[int, list[int] | None] = {}

    def same_order(u: int) -> list[int] | None:
        """Unit ``u``'s trays in host order when they are alike (free count, exposure, best values:
        every ``fill(u, c)`` is then that order, ties broken by host), else None."""
        if u not in alike:
            hs = trays_of[u]
            keys = np.column_stack([ctx.fcount[hs], ctx.exposed[hs], ctx.exposure[hs], np.round(ctx.best_val[hs], 9)])
            alike[u] = hs.tolist() if bool((keys == keys[0]).all()) else None
        return alike[u]

    fill.same_order = same_order  # type: ignore[attr-defined]
    return fill


def place_parts(fill: Any, u: int, parts: list[int], last: dict) -> list[int]:
    """The trays of unit ``u`` a pattern's ``parts`` (descending) go on: each part on the first tray
    of ``fill(u, part)`` not taken yet. The placement of a prefix does not depend on what follows,
    and patterns come in lexicographic order, so the prefix shared with the previous pattern placed
    on ``u`` (``last[u]``) keeps its trays: k = 32 on an NVL72 domain is ~600 patterns, ~3,300 parts
    placed one by one otherwise (most of an idle 10,008-GPU select). On a unit of alike trays
    (``fill.same_order``) the i-th part simply takes the i-th tray."""
    same = fill.same_order(u)
    if same is not None:  # alike trays: the i-th part takes the i-th tray
        return same[: len(parts)]
    prev = last.get(u)
    n = 0
    if prev is not None:
        for a, b in zip(prev[0], parts):
            if a != b:
                break
            n += 1
    hosts = [] if prev is None else prev[1][:n]
    taken = set(hosts)
    for c in parts[n:]:
        h = next(x for x in fill(u, c) if x not in taken)
        taken.add(h)
        hosts.append(h)
    last[u] = (parts, hosts)
    return hosts


def moves_sorted(base: np.ndarray, pa: np.ndarray, pb: np.ndarray, t: np.ndarray) -> np.ndarray:
    """``unique_sorted`` of the rows ``base`` with ``t`` taken from column ``pa`` and added to
    column ``pb`` (``t > 0``, ``pa != pb``): the rows of :func:`moves_order`'s moves."""
    order = moves_order(base.size, pa, pb, t)
    pa, pb, t = (np.asarray(x, dtype=np.int64)[order] for x in (pa, pb, t))
    R = np.tile(base, (order.size, 1))
    at = np.arange(order.size)
    R[at, pa] -= t
    R[at, pb] += t
    return R


def moves_order(width: int, pa: np.ndarray, pb: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Indices of the distinct moves (``t`` from column ``pa`` to column ``pb`` of one base row of
    ``width`` columns) in the lexicographic order of their rows, from the moves alone: a row
    differs from the base by -t at ``pa`` and +t at ``pb``, so rows are equal when their moves are,
    and their order is their differences': at the first column where two differ, the one whose
    first change comes there and is negative is smaller (key ``sign * (columns - position)``, then
    the value, then the same for the second change). A batch of ~5,000 moves over ~100 columns was
    sorted row-wise by ``np.lexsort`` over every column."""
    pa, pb, t = (np.asarray(x, dtype=np.int64) for x in (pa, pb, t))
    if np.any(t <= 0) or np.any(pa == pb):
        raise ValueError("a move takes t > 0 GPUs from one column to another")
    a_first = pa < pb
    v1 = np.where(a_first, -t, t)
    s1 = np.sign(v1) * (width - np.minimum(pa, pb))
    s2 = -np.sign(v1) * (width - np.maximum(pa, pb))
    order = np.lexsort((s2, v1, s1))  # the second value is -v1: decided by v1
    keys = np.stack([s1, v1, s2], axis=1)[order]
    return order[np.r_[True, (keys[1:] != keys[:-1]).any(axis=1)]] if order.size else order


def move_sequences(base: np.ndarray, sid: np.ndarray, pa: np.ndarray, pb: np.ndarray, t: np.ndarray) -> np.ndarray:
    """Per move (``t`` from column ``pa`` to ``pb`` of ``base``; ``t <= base[pa]``) its row's
    nonzero cells as codes ``(sid[column], count)`` in column order, zero-padded: ``(moves,
    nonzero columns of base + 1)``. Rows with equal sequences are alike up to which column of a
    signature holds a count. Built from the moves - the base's sequence with the source's cell
    changed or dropped and the target's changed or inserted - not by building every full row and
    compacting it with an argsort per row (~5,000 rows x ~100 cells per batch)."""
    pa, pb, t = (np.asarray(x, dtype=np.int64) for x in (pa, pb, t))
    S = np.flatnonzero(base)
    s, n = S.size, pa.size
    va, vb = base[pa] - t, base[pb] + t
    if np.any(va < 0):
        raise ValueError("a move takes at most the GPUs its source column holds")
    W = int(max(base.max(initial=0), vb.max(initial=0))) + 1  # counts < W: codes are injective
    rows = np.arange(n)
    ra = np.searchsorted(S, pa)  # the source holds GPUs: it is a base column
    rb = np.searchsorted(S, pb)
    in_b = rb < s
    in_b[in_b] = S[rb[in_b]] == pb[in_b]
    drop, ins = va == 0, ~in_b
    codes = np.tile(sid[S] * W + base[S], (n, 1))
    codes[rows, ra] = sid[pa] * W + va
    codes[rows[in_b], rb[in_b]] = sid[pb[in_b]] * W + vb[in_b]
    # each base cell's place: one left past a dropped source, one right from an inserted target on
    j = np.arange(s)[None, :]
    p1 = j - (drop[:, None] & (j > ra[:, None]))
    ip = rb - (drop & (rb > ra))  # the inserted target's place among the remaining cells
    f = p1 + (ins[:, None] & (p1 >= ip[:, None]))
    keep = ~(drop[:, None] & (j == ra[:, None]))
    seq = np.zeros((n, s + 1), dtype=np.int64)
    seq[np.broadcast_to(rows[:, None], f.shape)[keep], f[keep]] = codes[keep]
    seq[rows[ins], ip[ins]] = sid[pb[ins]] * W + vb[ins]
    return seq
