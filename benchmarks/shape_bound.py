"""A certified lower bound on the step time of ANY placement of a shape (the shape search's headroom).

The gap benchmark's oracle is a hill climb: a placement it finds is an upper bound on the optimum,
so "the best found is 13.8 % below blind" says nothing about what no search found. This module
bounds the optimum from the other side, on the truth the benchmarks score with (the emulator under
:mod:`bandpilot.dispatch.search.shape`'s step-time score), so ``1 - bound / blind`` caps what any
placement can gain over blind. Every step below is an inequality the truth satisfies:

* **Per group**: a group's contended value is ``solo * min(1, cap / demand) <= solo`` and, with
  ``demand >= solo + sum of its spanning siblings' solos``, ``<= solo * cap / demand``.
* **In-unit groups** (one host; on NVLink-domain clusters one domain) are never contended:
  at most the best in-unit bandwidth of ``g`` free GPUs (``b_in``: stage-1 over free subsets, or
  the domain's NVLink term).
* **Spanning groups**: ``B = min(network(counts), stage-1 of hosts with >= 2 GPUs)``; the network
  term depends on the units used ``m``, the smallest count ``c``, the mean count and whether racks
  are crossed, so the best spanning group of ``g`` GPUs is a max over ``(m, c)`` rows (mean
  ``g / m``), each on one rack when one rack's free GPUs have room for it, else across racks.
  The best spanning set of any size (balanced rows) bounds every capacity ``cap``.
* **Siblings**: if a host carries ``n`` spanning groups of one axis, each has all ``n`` in its
  demand, so the slowest gets at most ``cap / n`` (min <= mean). The truth counts siblings per
  HOST; on NVLink-domain clusters a unit has many hosts, so the lemmas below that need ``n > 1``
  are used only where units are hosts.
* **Structure**, per status of each axis (``in``: every group inside one unit, ``mix``, ``span``:
  none): the ``in`` axes' connected components of the rank grid each lie in one unit (they must
  pack into the units' free GPUs; a unit holds whole components, which caps a group's GPUs per
  unit); an ``a``-group inside a unit drags its closure in, so when every closure (with an
  in-unit group of another axis, too) exceeds the free GPUs of any unit, the groups meeting it
  span; for two orthogonal all-spanning axes, the most ``a``-groups one host carries (``X_a``)
  caps every ``b``-group's GPUs per host (see :func:`_status_time`).
* **Tenants** and **racks** (:mod:`benchmarks.shape_lemmas`, given the tenants: ``state(...,
  truth)``): ranks beyond the clean hosts' free GPUs sit on exposed hosts, where their spanning
  groups pay the tenants' demand against a bound on the tenants' super allocations (the lemma the
  first version had here took the best free-GPU row as that capacity, which a super allocation,
  holding the tenant's GPUs too, can exceed: removed); axes whose groups must cross racks pay the
  cross-rack rows.

The bound is the min over status assignments of ``compute + sum_a bytes_a / bw_a``. Finer count
constraints (imbalance, the free GPUs per host of a whole placement, tenants' super allocations)
are ignored, so the bound is loose where they bind (busy states with large jobs); checked against
every rank map of small states in ``tests/test_shape_bound.py``.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass

import numpy as np

from bandpilot.dispatch.search.shape import group_ranks
from bandpilot.dispatch.shape import Shape
from bandpilot.topology.cluster import popcount
from benchmarks.shape_lemmas import (IN, MIX, SPAN, cross_sets, exposed_sets, tenant_bound,
                                     tenant_hosts)


@dataclass
class FabricBounds:
    """Per-cluster-state bandwidth bounds (GB/s) by group size."""

    b_in: dict[int, float]  # best in-unit group of g free GPUs (0: no unit has room)
    span: "_Span"  # best spanning group / set (standalone), see :class:`_Span`
    unit_free: np.ndarray  # free GPUs per unit
    host_units: bool  # units are hosts (the sibling lemmas count per host, as the truth does)
    clean_free: int = 0  # free GPUs on hosts no contending tenant touches
    exposure: float = 0.0  # least tenant demand on a host with free GPUs that one touches (GB/s)
    rack: np.ndarray | None = None  # the network's rack per unit (None: no rack lemma)
    #: per exposed host with free GPUs: (free GPUs, summed tenant demand, least tenant capacity
    #: bound): see :func:`benchmarks.shape_lemmas.tenant_hosts`; None: no tenant lemma
    tenant: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None


def _s1max(fab) -> np.ndarray:
    """Best stage-1 value per GPU count over every host and subset (``(max_gpus + 1,)``)."""
    tab = fab.stage1
    pop = popcount(np.arange(tab.shape[1], dtype=np.int64))
    return np.array([tab[:, pop == c].max() if (pop == c).any() else 0.0 for c in range(int(pop.max()) + 1)])


class Bounder:
    """Bandwidth bounds of one emulated cluster (``fab``: an :class:`EmulatorFabric`)."""

    def __init__(self, fab) -> None:
        self.fab, self.spec = fab, fab.spec
        self.unit = self.spec.units[0]
        self.U = int(self.unit.max()) + 1
        self.hosts_of = [np.flatnonzero(self.unit == u) for u in range(self.U)]
        self.per_host = int(self.spec.gpus_per_host.max())
        self.s1 = _s1max(fab)
        self.multi = bool(self.spec.nvlink_domains)
        self._net: dict[tuple[tuple[int, ...], tuple[int, ...]], float] = {}
        racks = {d: i for i, d in enumerate(dict.fromkeys(h.domain or h.name for h in self.spec.hosts))}
        self.rack_of_unit = np.array([racks[self.spec.hosts[int(hs[0])].domain or self.spec.hosts[int(hs[0])].name]
                                      for hs in self.hosts_of])
        # the NVLink term of a domain spanned over >= 2 trays, by rank count (counts-only in the
        # emulator's network): below it, a network value is the pure scale-out term
        self.nvl = {c: self._nvl_term(c) for c in range(2, self._unit_cap() + 1)} if self.multi else {}
        self.nvl_min = min(self.nvl.values()) if self.nvl else np.inf
        # the racks the emulator's network sees (its cross-domain factor), per unit; the rack lemma
        # needs units = hosts, >= 2 racks and hosts alike (a cross-rack row's value then depends
        # only on its counts: see :meth:`_Span.best_cross`)
        dom = np.asarray(getattr(fab, "_domain", np.zeros(self.spec.n_hosts, dtype=np.int64)))
        alike = (len(set(self.spec.gpus_per_host.tolist())) == 1 and len(fab.spec.gpu_types) == 1
                 and np.unique(getattr(fab, "_rails", [0])).size == 1)
        self.rack = dom[[int(hs[0]) for hs in self.hosts_of]] if not self.multi else None
        self.rack_lemma = bool(self.rack is not None and np.unique(self.rack).size > 1 and alike)

    def _nvl_term(self, c: int) -> float:
        """The NVLink term of ``c`` GPUs of domain 0 spread over its trays (one per tray first)."""
        hs = self.hosts_of[0]
        row = np.zeros(self.spec.n_hosts, dtype=np.int64)
        np.add.at(row, hs[np.arange(c) % hs.size], 1)
        return float(self.fab.network(row[None, :])[0])

    def _unit_cap(self) -> int:
        return int(self.spec.gpus_per_host[self.hosts_of[0]].sum())

    def _network_units(self, counts: list[int], units: list[int] | None = None) -> float:
        """Network value of per-unit counts placed on ``units`` (default 0..: the fewest racks),
        each unit's GPUs packed onto its hosts in order."""
        units = list(range(len(counts))) if units is None else units
        key = (tuple(counts), tuple(units))
        if key not in self._net:
            row = np.zeros(self.spec.n_hosts, dtype=np.int64)
            for u, c in zip(units, counts):
                for h in self.hosts_of[u]:
                    take = min(c, int(self.spec.gpus_per_host[h]))
                    row[h], c = take, c - take
            self._net[key] = float(self.fab.network(row[None, :])[0])
        return self._net[key]

    def _unit_best(self, c: int) -> float:
        """Best internal value of ``c`` GPUs of one unit (upper bound over every split)."""
        if c < 2:
            return np.inf
        single = self.s1[c] if c <= self.per_host else 0.0
        return max(single, self.nvl.get(c, 0.0))

    def _span_row(self, counts: list[int], units: list[int] | None = None) -> float:
        """Upper bound on a spanning set with these unit counts: its network term, and the internal
        value of its smallest unit. A network value at or above the smallest NVLink term may be that
        term (set by this row's tray split): then the bound falls back to the scale-out cap."""
        net = self._network_units(counts, units)
        if self.multi and net >= self.nvl_min * (1 - 1e-12):
            net = np.inf
        return min(net, self._unit_best(min(counts)))

    def state(self, free: np.ndarray, exposure: np.ndarray | None = None, truth=None) -> FabricBounds:
        """Bounds for the free GPUs ``free``; ``exposure``: per host, the summed demand of the
        contending (cross-unit, demand > 0) tenants touching it (``ContentionPredictor.host_exposure``);
        ``truth`` (that ContentionPredictor): the tenants themselves, for the per-host tenant lemma."""
        free_u = np.bincount(self.unit, weights=popcount(free), minlength=self.U).astype(np.int64)
        F = int(free_u.max())
        b_in = {g: self._b_in(free, g) for g in range(2, F + 1)}
        pf = popcount(free)
        e = np.zeros(self.spec.n_hosts) if exposure is None else np.asarray(exposure, dtype=float)
        clean = int(pf[e <= 0].sum())
        hit = (e > 0) & (pf > 0)
        return FabricBounds(b_in, _Span(self, F, free_u), free_u, not self.multi, clean,
                            float(e[hit].min()) if hit.any() else 0.0,
                            self.rack if self.rack_lemma else None,
                            tenant_hosts(self, free, truth) if truth is not None and not self.multi else None)

    def _b_in(self, free: np.ndarray, g: int) -> float:
        tab = self.fab.stage1
        pop = popcount(np.arange(tab.shape[1], dtype=np.int64))
        best = 0.0
        cand = np.flatnonzero(pop == g)
        for h in np.flatnonzero(popcount(free) >= g):
            ok = cand[(cand & ~int(free[h])) == 0]
            best = max(best, float(tab[h, ok].max()))
        if self.multi and g in self.nvl:
            fu = np.bincount(self.unit, weights=popcount(free), minlength=self.U)
            if (fu >= g).any():
                best = max(best, self.nvl[g])
        return best


class _Span:
    """Spanning bounds of one state: ``best(g, m_min, c_hi)``, the best spanning group of ``g``
    GPUs over at least ``m_min`` units with at most ``c_hi`` on each (max over the units ``m`` and
    the smallest count ``c``, mean ``g / m``); ``cap(m_min)``, the best spanning set of any size
    over at least ``m_min`` units (balanced rows: the imbalance term only lowers a row)."""

    def __init__(self, b: Bounder, F: int, free_u: np.ndarray) -> None:
        self.b, self.F, self.units = b, F, int((free_u > 0).sum())
        self._best: dict[tuple[int, int, int, int], float] = {}
        self._cap: dict[int, float] = {}
        self._rows: dict[tuple[int, ...], float] = {}
        # units by free GPUs, most first: all of them, and per rack
        order = np.lexsort((np.arange(free_u.size), -free_u))
        self.order, self.free_u = order[free_u[order] > 0], free_u
        self.by_rack = [self.order[b.rack_of_unit[self.order] == r] for r in np.unique(b.rack_of_unit)]

    def _row(self, counts: list[int]) -> float:
        """The bound of a spanning set with these per-unit counts on the free GPUs: on one rack's
        units if one rack has units with room for every count (the network only sees how many
        units, their counts and whether racks are crossed), else across racks, else 0 (no room)."""
        key = tuple(sorted(counts, reverse=True))
        if key not in self._rows:
            need = np.array(key)
            m, out = need.size, 0.0
            for units in [u for u in self.by_rack if u.size >= m] + [self.order]:
                if units.size >= m and bool((self.free_u[units[:m]] >= need).all()):
                    out = self.b._span_row(list(key), units[:m].tolist())
                    break
            self._rows[key] = out
        return self._rows[key]

    def _spreads(self, g: int, m_min: int, c_hi: int, c_lo: int):
        """Each ``(m, counts)``: ``g`` GPUs on ``m`` hosts, the smallest count ``c <= c_lo`` first, the
        rest balanced with none above ``c_hi`` (the rows :meth:`best` and :meth:`best_cross` bound by)."""
        for m in range(max(2, m_min), min(g, self.units) + 1):
            for c in range(1, min(c_lo, g // m) + 1):
                rest = g - c
                if rest > (m - 1) * c_hi or rest < (m - 1) * c:
                    continue
                q, r = divmod(rest, m - 1)
                yield m, [c] + [q + 1] * r + [q] * (m - 1 - r)

    def best(self, g: int, m_min: int = 2, c_hi: int | None = None, c_lo: int | None = None) -> float:
        """... and with ``c_lo``, the smallest count at most ``c_lo``."""
        c_hi = self.F if c_hi is None else min(c_hi, self.F)
        c_lo = c_hi if c_lo is None else min(c_lo, c_hi)
        key = (g, m_min, c_hi, c_lo)
        if key not in self._best:
            self._best[key] = max([0.0, *(self._row(counts) for _, counts in self._spreads(g, m_min, c_hi, c_lo))])
        return self._best[key]

    def best_cross(self, g: int, m_min: int = 2, c_hi: int | None = None) -> float:
        """:meth:`best` over rows that cross racks: each ``(m, c)`` row on the hosts in rack order,
        its last on the second rack if the first has room for the others (room ignored: an upper bound). Hosts are alike (``Bounder.rack_lemma``), so the
        network sees only the counts, the host count and that racks are crossed; racks 0 and 1 share
        a pod whenever pods hold >= 2 racks, so no pod penalty is added that a row could avoid."""
        c_hi = self.F if c_hi is None else min(c_hi, self.F)
        key = (g, m_min, c_hi, -1)
        if key not in self._best:
            self._best[key] = max([0.0, *(self.b._span_row(counts, self._cross_units(m))
                                          for m, counts in self._spreads(g, m_min, c_hi, c_hi))])
        return self._best[key]

    def cap_cross(self, m_min: int = 2) -> float:
        """:meth:`cap` over rows that cross racks (balanced rows placed as :meth:`best_cross`)."""
        key = -max(2, m_min)
        if key not in self._cap:
            self._cap[key] = max((self.b._span_row([c] * m, self._cross_units(m))
                                  for m in range(max(2, m_min), self.units + 1) for c in range(1, self.F + 1)),
                                 default=0.0)
        return self._cap[key]

    def _cross_units(self, m: int) -> list[int]:
        """``m`` hosts in rack order (the fewest racks and pods), the last on the second rack when
        the first has room for the others: a row crossing racks as cheaply as any can."""
        rk = self.b.rack
        order = np.argsort(rk, kind="stable")
        first = int((rk == rk.min()).sum())
        return order[:m - 1].tolist() + [int(order[first])] if m - 1 < first else order[:m].tolist()

    def cap(self, m_min: int = 2) -> float:
        if m_min not in self._cap:
            self._cap[m_min] = max((self._row([c] * m) for m in range(max(2, m_min), self.units + 1)
                                    for c in range(1, self.F + 1)), default=0.0)
        return self._cap[m_min]


def _components(k: int, groups: list[np.ndarray]) -> np.ndarray:
    """Component label per rank under the union of these axes' groups (label propagation)."""
    lab = np.arange(k)
    while True:
        old = lab.copy()
        for g in groups:  # PP groups overlap (a stage's TP group is in two): minimum.at, not assignment
            np.minimum.at(lab, g, np.broadcast_to(lab[g].min(axis=1)[:, None], g.shape))
        lab = lab[lab]  # pointer jumping
        if np.array_equal(lab, old):
            return lab


def _incidence(k: int, g: np.ndarray) -> np.ndarray:
    """``(n_groups, k)`` bool: rank r is in group i."""
    out = np.zeros((g.shape[0], k), dtype=bool)
    out[np.repeat(np.arange(g.shape[0]), g.shape[1]), g.ravel()] = True
    return out


class _Structure:
    """What one choice of ``S`` (the axes whose groups ALL lie in one unit) forces on the others."""

    def __init__(self, k: int, groups: dict[str, np.ndarray], S: tuple[str, ...], F: int) -> None:
        self.lab = _components(k, [groups[a] for a in S])
        comps, lab = np.unique(self.lab, return_inverse=True)
        self.size = np.bincount(lab).astype(np.int64)  # per component
        self.comp_inc = np.zeros((comps.size, k), dtype=bool)
        self.comp_inc[lab, np.arange(k)] = True
        self.F = F
        self.inc = {a: _incidence(k, g) for a, g in groups.items()}
        # components each group meets, and its S-closure (the ranks an in-unit group drags in)
        self.meets = {a: (i.astype(np.int32) @ self.comp_inc.T.astype(np.int32)) > 0 for a, i in self.inc.items()}
        self.closure = {a: m @ self.size for a, m in self.meets.items()}

    def packs(self, unit_free: np.ndarray, k: int) -> bool:
        c = int(self.size.max())
        return int((unit_free // c).sum()) >= k // c

    def per_group(self, a: str) -> tuple[int, int, int]:
        """For an axis outside ``S``: siblings some unit surely carries (``n``: when no ``a``-group
        fits a unit with its closure, every one meeting a component spans, and a unit holds whole
        components), and per group the fewest units ``m_min`` / most GPUs per unit ``c_hi``."""
        meet = int((self.inc[a].astype(np.int32) @ self.comp_inc.T.astype(np.int32)).max())
        c_hi = max(1, self.F // int(self.size.max())) * meet
        m_min = -(-int(self.inc[a][0].sum()) // c_hi)
        n = 1
        if int(self.closure[a].min()) > self.F:
            n = max(1, int(self.meets[a].sum(axis=0).min()))
        return n, m_min, c_hi

    def in_group(self, a: str, b: str, spans: bool = False) -> int:
        """Siblings of axis ``a`` on the unit of an in-unit ``b``-group ``K``: every ``a``-group
        meeting ``K`` whose closure with ``K`` exceeds ``F`` spans (with ``spans``, every ``a``-group
        spans: all that meet ``K``); the least over the ``K``."""
        meet = (self.inc[a].astype(np.int32) @ self.inc[b].T.astype(np.int32)) > 0  # (n_a, n_b)
        if spans:
            return max(1, int(meet.sum(axis=0).min()))
        union = self.meets[a][:, None, :] | self.meets[b][None, :, :]
        over = (union @ self.size) > self.F  # (n_a, n_b)
        forced = np.where((~meet | over).all(axis=0), meet.sum(axis=0), 1)
        return max(1, int(forced.min()))

    def same_hosts(self, a: str) -> int:
        """Fewest ``a``-groups meeting exactly the same ``in``-components as one another: such
        groups lie on exactly the same hosts (a component is whole in one host, a group has a rank
        in each it meets), so they share every host and their unions there are one row."""
        return int(np.unique(self.meets[a], axis=0, return_counts=True)[1].min())

    def orthogonal(self, a: str, b: str) -> bool:
        return bool(((self.inc[a].astype(np.int32) @ self.inc[b].T.astype(np.int32)) <= 1).all())




def lower_bound(b: Bounder, fb: FabricBounds, shape: Shape) -> tuple[float, str]:
    """The certified lower bound on the true step time (ms) and the axis statuses attaining it
    (``in``: every group in one unit, ``mix``: some, ``span``: none)."""
    vol, compute = shape.volumes()
    groups = {a: g for a, g in group_ranks(shape).items() if a in vol}
    axes = list(groups)
    F = int(fb.unit_free.max())
    best, arg = np.inf, ""
    structs: dict[tuple[str, ...], _Structure] = {}
    comps: dict[tuple[str, ...], np.ndarray] = {}
    for status in itertools.product((IN, MIX, SPAN), repeat=len(axes)):
        st = dict(zip(axes, status))
        S = tuple(a for a in axes if st[a] == IN)
        if S not in structs:
            structs[S] = _Structure(shape.k, groups, S, F)
        x = structs[S]
        if S and not x.packs(fb.unit_free, shape.k):
            continue
        if any(fb.b_in.get(groups[a].shape[1], 0.0) <= 0 or x.closure[a].min() > F for a in axes if st[a] != SPAN):
            continue
        for cross in cross_sets(fb, x, st, groups, shape.k, comps, _components):
            for ex, split in exposed_sets(fb, st, shape.k):
                t = _status_time(fb, x, st, groups, vol, cross, ex, split)
                if compute + t < best:
                    best, arg = compute + t, ",".join(
                        f"{a}:{st[a]}" + ("+x" if a in cross else "") + ("+e" if a in ex else "") for a in axes)
    return best, arg


def _status_time(fb: FabricBounds, x: _Structure, st: dict[str, str], groups: dict[str, np.ndarray],
                 vol: dict[str, float], cross: frozenset[str] = frozenset(), ex: frozenset[str] = frozenset(),
                 split: tuple[int, int] | None = None) -> float:
    """Least communication time (ms) of one status assignment: fixed bounds per axis, then (units
    = hosts), for the all-spanning axes, a min over ``X_a``, the most ``a``-groups any host
    carries: the slowest ``a``-group gets at most ``cap / X_a`` (the sibling lemma on that host),
    and for an orthogonal all-spanning axis ``b`` (a b-group meets an a-group in <= 1 rank) a
    b-group's ranks on a host sit in distinct a-groups, so <= ``X_a`` per host: it spans at least
    ``size / X_a`` hosts with at most ``X_a`` GPUs on each."""
    t, span = 0.0, []
    cap_of, fixed, shape_of, n_of = {}, {}, {}, {}
    for a in groups:
        size = groups[a].shape[1]
        if st[a] == IN:
            t += vol[a] / (fb.b_in[size] * 1e9) * 1e3
            continue
        n, m_min, c_hi = x.per_group(a)
        if st[a] == MIX and n > 1:  # every group spans: not a mix
            return np.inf
        for b in groups:
            if b != a and st[b] != SPAN:  # some b-group lies in one unit
                n = max(n, x.in_group(a, b, st[a] == SPAN))
        if not fb.host_units:  # siblings share a HOST (tray) in the truth, a unit has many: no lemma
            n = 1
        cap_of[a] = fb.span.cap(m_min)
        solo = fb.span.best(size, m_min, c_hi)  # every spanning a-group's standalone value <= solo
        fixed[a] = min(solo, cap_of[a] / n)
        if a in cross:  # a group crosses racks (rack lemma): so do the ``same_hosts`` groups on its
            # hosts, whose capacity is one cross-rack row of the siblings' union: the slowest of
            # them gets at most that row / their number (min <= mean, as the sibling lemma)
            fixed[a] = min(fixed[a], fb.span.best_cross(size, m_min, c_hi),
                           fb.span.cap_cross(m_min) / (x.same_hosts(a) if fb.host_units else 1))
        # the tenant lemmas take a bound on the standalone value (they increase with it), not fixed[a]
        fixed[a] = min(fixed[a], tenant_bound(fb, x, st, groups, a, solo, cap_of[a], ex, split))
        if fixed[a] <= 0:
            return np.inf
        shape_of[a], n_of[a] = (size, m_min, c_hi), n
        if st[a] == SPAN:
            span.append(a)
        else:
            t += vol[a] / (fixed[a] * 1e9) * 1e3
    if not span or not fb.host_units:
        return t + sum(vol[a] / (fixed[a] * 1e9) * 1e3 for a in span)
    orth = {a: [b for b in span if b != a and x.orthogonal(a, b)] for a in span}
    best = np.inf
    for X in itertools.product(range(1, x.F + 1), repeat=len(span)):
        cnt = dict(zip(span, X))
        if any(cnt[a] < n_of[a] for a in span):
            continue
        comm = 0.0
        for a in span:
            size, m_min, c_hi = shape_of[a]
            c = min([c_hi] + [cnt[b] for b in orth[a]])
            m = max(m_min, -(-size // c))
            bw = min(fixed[a], fb.span.best(size, m, c), fb.span.cap(m) / cnt[a])
            comm += vol[a] / (bw * 1e9) * 1e3 if bw > 0 else np.inf
        best = min(best, comm)
    return t + best
