"""Per-select setup of the per-unit coarse searches, done once for all units instead of per unit.

On an asymmetric model (a surrogate's stage 1 differs by which GPUs of a tray are free) a gang that
fits a domain is searched in every fitting domain (107-139 on 10,008 GPUs). Each search first asks
how many coarse count vectors the domain has (:meth:`SearchContext.count_vectors` with ``coarse``:
host classes of the domain, one polynomial per class) and builds the greedy fill as a row over all
hosts - ~0.25 ms apiece, most of a median select (k = 8-64), although most domains' answers repeat:
the count depends only on the domain's multiset of (class size, free GPUs per member).

Here the classes of every unit come from one sort over all hosts, the count is computed once per
distinct class structure (kept across selects), and the greedy fill is written straight onto the
unit's own columns. The values are the same floats in the same order as ``count_vectors`` (classes
ascending by label, one ``np.convolve`` each), so every decision is unchanged
(``tests/test_unit_setup.py``).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bandpilot.dispatch.search.partitions import class_codes, partition_counts, partitions

#: ``units``: a :class:`bandpilot.dispatch.search.domains.Units` (not imported: domains imports this)
Units = Any

#: (k, ((class size, free GPUs), ...)) -> number of coarse count vectors (process-wide: units and
#: states repeat the same structures)
_COUNTS: dict[tuple[int, tuple[tuple[int, int], ...]], float] = {}
_COUNTS_MAX = 65_536
#: (k, G, structure) -> count-vector codes (None: none sums to k); an entry holds at most
#: PER_DOMAIN_LIMIT (2,000) rows x one int16 per tray (72 KB at 18 trays): <= ~37 MB in all
_CODES: dict[tuple, np.ndarray | None] = {}
_CODES_MAX = 512


def _poly_count(k: int, structure: tuple[tuple[int, int], ...]) -> float:
    got = _COUNTS.get((k, structure))
    if got is None:
        poly = np.zeros(k + 1)
        poly[0] = 1.0
        for n, f in structure:  # the order of count_vectors: classes ascending by label
            poly = np.convolve(poly, np.asarray(partition_counts(n, f, k)))[: k + 1]
        got = float(poly[k])
        if len(_COUNTS) >= _COUNTS_MAX:
            _COUNTS.clear()
        _COUNTS[(k, structure)] = got
    return got


def _layout(units: Units) -> tuple[np.ndarray, list[int], list[int], list[int], np.ndarray]:
    """Every unit's coarse classes from one sort: free hosts ordered as
    :meth:`SearchContext.classes` orders one unit's (``coarse``: class label, then least exposed,
    then host), grouped by unit. Returns ``(hosts, class sizes, class free counts, class starts of
    each unit (+ end), unit of each unit start)``."""
    got = units.setup.get("layout")
    if got is None:
        ctx = units.ctx
        h = np.flatnonzero(ctx.ccls >= 0)
        u, lab = units.unit[h], ctx.ccls[h]
        o = np.lexsort((h, ctx.exposure[h], lab, u))  # a class restricted to a unit: (unit, label)
        h, u, lab = h[o], u[o], lab[o]
        cut = np.flatnonzero(np.r_[True, (u[1:] != u[:-1]) | (lab[1:] != lab[:-1])]) if h.size else np.zeros(0, np.int64)
        size = np.diff(np.r_[cut, h.size]).tolist()
        f = ctx.fcount[h[cut]].tolist()
        cu = u[cut]
        ustart = np.flatnonzero(np.r_[True, cu[1:] != cu[:-1]]).tolist() if cu.size else []
        got = (h, size, f, [*ustart, cu.size], cu[ustart] if cu.size else cu)
        units.setup["layout"] = got
    return got


def _structures(units: Units) -> dict[int, tuple[int, tuple[tuple[int, int], ...]]]:
    """Unit -> (offset of its first host in the layout, its classes' (size, free GPUs))."""
    got = units.setup.get("structures")
    if got is None:
        h, size, f, ustart, uid = _layout(units)
        got, off = {}, 0
        for i, u in enumerate(uid.tolist()):
            a, b = ustart[i], ustart[i + 1]
            got[u] = (off, tuple(zip(size[a:b], f[a:b])))
            off += sum(size[a:b])
        units.setup["structures"] = got
    return got


def coarse_counts(units: Units) -> np.ndarray:
    """Per unit ``u``: ``ctx.count_vectors(units.allowed(u), coarse=True)`` for ``k = ctx.k``, all
    units at once (cached on ``units``: one request)."""
    got = units.setup.get("coarse_counts")
    if got is None:
        k = units.ctx.k
        got = np.full(units.U, 1.0 if k == 0 else 0.0)  # no classes: poly[k] of the empty product
        for u, (_, structure) in _structures(units).items():
            got[u] = _poly_count(k, structure)
        units.setup["coarse_counts"] = got
    return got


def _codes(k: int, G: int, structure: tuple[tuple[int, int], ...]) -> np.ndarray | None:
    """:meth:`SearchContext.enumerate`'s dynamic programme for unexposed classes (coarse): the
    per-member counts of every count vector with sum ``k``, in its row order (cached per structure:
    it depends on nothing else)."""
    key = (k, G, structure)
    if key in _CODES:
        return _CODES[key]
    code_t = np.int16 if G <= 8 else np.int32
    caps = [min(n * f, k) for n, f in structure]
    got = class_codes(caps, k, code_t, lambda i, t: partitions(t, *structure[i]).astype(code_t))
    if len(_CODES) >= _CODES_MAX:
        _CODES.clear()
    _CODES[key] = got
    return got


def enumerate_coarse(units: Units, u: int, cols: np.ndarray) -> np.ndarray:
    """``ctx.enumerate(units.allowed(u), coarse=True, cols=cols)``: the same rows in the same order,
    the count-vector codes shared by every unit with the same class structure."""
    ctx = units.ctx
    st = _structures(units).get(u)
    if st is None:
        return np.zeros((0, cols.size), dtype=np.int64)
    off, structure = st
    codes = _codes(ctx.k, ctx.G, structure)
    if codes is None:
        return np.zeros((0, cols.size), dtype=np.int64)
    hosts = _layout(units)[0][off : off + codes.shape[1]]
    out = np.zeros((codes.shape[0], cols.size), dtype=np.int64)
    out[:, np.searchsorted(cols, hosts)] = ctx.best_mask[hosts[None, :], codes]
    return out


def greedy_on_cols(units: Units, u: int, cols: np.ndarray) -> np.ndarray:
    """The greedy fill of the whole gang in unit ``u`` (:meth:`Units.part`) as one mask row on the
    sorted columns ``cols`` (which hold the unit's hosts) - no row over every host."""
    ctx = units.ctx
    hosts, counts = _greedy_all(units).get(u) or units.part_hosts(u, ctx.k)
    row = np.zeros((1, cols.size), dtype=np.int64)
    row[0, np.searchsorted(cols, hosts)] = ctx.best_mask[hosts, counts]
    return row


def _greedy_all(units: Units) -> dict[int, tuple[np.ndarray, np.ndarray]]:
    """:meth:`Units.part_hosts` ``(u, k)`` of every unit that holds ``k``, from one sort of all free
    trays (the per-unit fill orders were two sorts per unit: most of the setup left in a median
    select). Same rule: whole trays in fill order (unexposed, fullest, best stage-1 value, host)
    until a later tray fits the rest, the rest on the best-fitting tray at or after that step
    (unexposed, fewest free, best stage-1 value for the rest, step)."""
    got = units.setup.get("greedy")
    if got is not None:
        return got
    ctx, k = units.ctx, units.ctx.k
    got = {}
    h = np.flatnonzero((ctx.fcount > 0) & (units.free >= k)[units.unit])
    if h.size:
        f = ctx.fcount[h]
        o = np.lexsort((h, -ctx.best_val[h, f], -f, ctx.exposed[h], units.unit[h]))
        h, f, u = h[o], f[o], units.unit[h[o]]
        seg = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
        seg_of = np.repeat(np.arange(seg.size), np.diff(np.r_[seg, h.size]))
        step = np.arange(h.size) - seg[seg_of]
        excl = np.cumsum(f) - f
        cum = excl - excl[seg][seg_of]  # GPUs in the unit's trays before this step
        ok = (cum == k) | (_seg_suffix_max(f, seg, seg_of) >= k - cum)
        first = np.minimum.reduceat(np.where(ok, step, h.size), seg)  # every unit here holds k: found
        left = k - cum[seg + first]  # GPUs still needed after the unit's whole trays
        cand = (step >= first[seg_of]) & (f >= left[seg_of])
        bv = ctx.best_val[h, np.clip(left[seg_of], 0, ctx.G)]
        r = np.lexsort((step, -bv, f, ctx.exposed[h], ~cand, seg_of))
        best_r = r[np.r_[0, np.flatnonzero(np.diff(seg_of[r])) + 1]]  # the best candidate of each unit
        for j, (a, i) in enumerate(zip(seg.tolist(), first.tolist())):
            hosts, counts = h[a : a + i], f[a : a + i]
            if left[j] > 0:
                p = best_r[j]
                hosts, counts = np.r_[hosts, h[p]], np.r_[counts, left[j]]
            got[int(u[a])] = (hosts, counts)
    units.setup["greedy"] = got
    return got


def _seg_suffix_max(x: np.ndarray, seg: np.ndarray, seg_of: np.ndarray) -> np.ndarray:
    """Per position the maximum of ``x`` from it to the end of its segment."""
    # offsets falling with the segment id: a later segment's values never reach an earlier one's
    span = int(x.max()) + 1
    y = (x + (seg.size - 1 - seg_of) * span)[::-1]
    return np.maximum.accumulate(y)[::-1] - (seg.size - 1 - seg_of) * span
