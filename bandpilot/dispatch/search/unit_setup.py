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

from bandpilot.dispatch.search.partitions import partition_counts

#: ``units``: a :class:`bandpilot.dispatch.search.domains.Units` (not imported: domains imports this)
Units = Any

#: (k, ((class size, free GPUs), ...)) -> number of coarse count vectors (process-wide: units and
#: states repeat the same structures)
_COUNTS: dict[tuple[int, tuple[tuple[int, int], ...]], float] = {}
_COUNTS_MAX = 65_536


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


def coarse_counts(units: Units) -> np.ndarray:
    """Per unit ``u``: ``ctx.count_vectors(units.allowed(u), coarse=True)`` for ``k = ctx.k``, all
    units at once (cached on ``units``: one request)."""
    got = units.setup.get("coarse_counts")
    if got is not None:
        return got
    ctx = units.ctx
    out = np.zeros(units.U)
    hosts = np.flatnonzero(ctx.ccls >= 0)
    if hosts.size:
        # a class restricted to a unit is a (unit, label) pair; labels ascending inside a unit
        u, lab = units.unit[hosts], ctx.ccls[hosts]
        o = np.lexsort((lab, u))
        u, lab, h = u[o], lab[o], hosts[o]
        cut = np.flatnonzero(np.r_[True, (u[1:] != u[:-1]) | (lab[1:] != lab[:-1])])
        size = np.diff(np.r_[cut, u.size]).tolist()
        f = ctx.fcount[h[cut]].tolist()
        cu = u[cut]
        ustart = np.flatnonzero(np.r_[True, cu[1:] != cu[:-1]]).tolist()
        for a, b in zip(ustart, [*ustart[1:], cu.size]):
            out[cu[a]] = _poly_count(ctx.k, tuple(zip(size[a:b], f[a:b])))
    if ctx.k == 0:
        out[:] = 1.0  # the empty vector (poly[0] of no classes)
    units.setup["coarse_counts"] = out
    return out


def greedy_on_cols(units: Units, u: int, cols: np.ndarray) -> np.ndarray:
    """The greedy fill of the whole gang in unit ``u`` (:meth:`Units.part`) as one mask row on the
    sorted columns ``cols`` (which hold the unit's hosts) - no row over every host."""
    ctx = units.ctx
    hosts, counts = units.part_hosts(u, ctx.k)
    row = np.zeros((1, cols.size), dtype=np.int64)
    row[0, np.searchsorted(cols, hosts)] = ctx.best_mask[hosts, counts]
    return row
