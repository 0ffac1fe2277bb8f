"""Where does a gang go on a cluster of multi-node NVLink domains? Hierarchical count-vector search
(domain -> tray -> GPUs) and the fragmentation-aware choice among near-ties (its exact oracle:
:mod:`bandpilot.dispatch.search.domain_exact`).

The bandwidth model is hierarchical one level further than on plain clusters: inside a domain
trays talk over the non-blocking NVLink switches, so an in-domain allocation's value depends only
on its per-tray counts and each tray's stage-1 value - and nothing contends there (see
:mod:`bandpilot.dispatch.contention`). The search works on *units* (an NVLink domain, or a host
outside any):

* **a gang that fits a unit stays in one**. Its candidates are *count patterns* - the multiset of
  per-tray counts, a partition of ``k`` into parts of at most a tray's size - shared by every unit
  with the trays for it (stage 1.5: identical domains share patterns). Each pattern is placed once,
  on the best-fit unit that can hold it, largest parts on the best-fitting trays: exact over the
  model when trays of a GPU type are symmetric (their best ``c``-subset value depends only on ``c``),
  else a per-unit coarse count-vector search;
* **a larger gang** gets per-unit counts ``D`` (balanced and fullest-first splits over the fewest
  units, by free GPUs and by free GPUs clear of contending jobs, then a batched local search moving
  GPUs between units), each unit's part filled whole-trays-first with the remainder on the
  best-fitting tray, trays touched by contending jobs last - near-exact: the scale-out value
  depends on ``D`` and on contention, the in-domain parts only cap it from far above.

Among candidates within :data:`DOMAIN_TIE` of the best value the choice keeps the cluster
unfragmented: fewest units, keeping the largest placeable gang (not taking from every unit with the
most free GPUs), best-fit units (fewest free GPUs left in them), fewest GPUs stranded on partly
used trays, fewest trays. ``segment`` (Slurm's ``--segment``, in GPUs) makes every
unit's share a multiple of it, so each segment lies inside one domain.
"""

from __future__ import annotations

import numpy as np

from bandpilot.dispatch.search.context import Found, SearchContext
from bandpilot.dispatch.search import move_classes, unit_rows, work
from bandpilot.dispatch.search.screen import screen_for
from bandpilot.dispatch.search.unit_batch import best_each_bounded
from bandpilot.dispatch.search.unit_rows import mixed_types, symmetric_trays
from bandpilot.dispatch.search.unit_setup import coarse_counts, enumerate_coarse, greedy_on_cols
from bandpilot.dispatch.search.partitions import partitions
from bandpilot.errors import PlacementError
from bandpilot.fabric.units import unit_index
from bandpilot.topology.cluster import popcount

#: In-domain count vectors enumerated per unit before falling back to coarse classes.
PER_DOMAIN_LIMIT = 2_000
#: Relative value margin within which fragmentation decides (0.5 % of the model's bandwidth).
DOMAIN_TIE = 0.005
#: Unit-level local-search iterations (each one batched prediction).
UNIT_LOCAL_ITERS = 8
#: Model evaluations (rows incl. super allocations) after which the local search stops.
UNIT_EVAL_BUDGET = 2_000
#: Unused units a local-search move may target (most free GPUs clear of contending jobs first).
UNIT_TARGETS = 6
#: Asymmetric trays (a surrogate's stage-1 differs by which GPUs of a tray are free: 9-14 % on the
#: 10,008-GPU domain model; an emulated spec with NVLink faults). ``"per_unit"`` (default) - a coarse
#: count-vector search per unit: exact over units, but 107 unit searches / 16,042 evaluations for
#: k = 2 on the 10,008-GPU model (select p50 130 ms, p99 5.4 s). ``"best_fit"`` - count patterns on
#: the best-fit unit only, each part on the best-fitting tray with the best model value: p50 12 ms
#: there, but another unit with cleaner trays is never tried (worse than per_unit in 84 of 400
#: faulty-spec cases, min 0.60 of exact: tests/test_domain_asymmetric.py), so not the default.
#: ``"patterns"`` - the same on every fitting unit: near-exact on the faulty spec (6 of 200 worse)
#: but more rows than per_unit at 10,008 GPUs (max 31,692). Mixed GPU types always take per_unit.
ASYMMETRIC = "per_unit"


class Units:
    """Per-request view of the units: members, free GPUs, exposure."""

    def __init__(self, ctx: SearchContext) -> None:
        self.index = unit_index(ctx.spec)
        self.unit, self.is_nvl = self.index.unit, self.index.is_nvl
        self.U = self.is_nvl.size
        self.members = self.index.members
        self.free = np.bincount(self.unit, weights=ctx.fcount, minlength=self.U).astype(np.int64)
        self.size = np.bincount(self.unit, weights=ctx.spec.gpus_per_host, minlength=self.U).astype(np.int64)
        self.exposed_free = np.bincount(self.unit, weights=ctx.fcount * ctx.exposed, minlength=self.U).astype(np.int64)
        self._parts: dict[tuple[int, int], np.ndarray] = {}
        self._sparse: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}
        self._orders: dict = {}  # per unit its fill order; per (unit, count) the remainder's
        self._sigs: dict[tuple[int, bool], tuple] = {}
        self.setup: dict = {}  # per-request tables shared by every unit (unit_setup)
        self.ctx = ctx
        self.parts = lambda u, t: unit_rows.part_table(self, u, t)  # part_hosts of many pairs: (ptr, hosts, counts)

    def allowed(self, u: int) -> np.ndarray:
        a = np.zeros(self.ctx.H, dtype=bool)
        a[self.members[u]] = True
        return a

    def signature(self, u: int, coarse: bool = False) -> tuple:
        """Units with equal signatures are interchangeable (same free trays, no exposure; ``coarse``:
        exposure ignored)."""
        got = self._sigs.get((u, coarse))
        if got is not None:
            return got
        ctx = self.ctx
        if self.exposed_free[u] and not coarse:
            sig: tuple = ("exposed", u)
        else:
            hs = self.members[u]
            hs = hs[ctx.fcount[hs] > 0]
            # tray classes without the domain label: alike units of different domains match
            sig = (bool(self.is_nvl[u]), int(self.size[u]), tuple(sorted(ctx.scls[hs].tolist())))
        self._sigs[(u, coarse)] = sig
        return sig

    def part(self, u: int, t: int) -> np.ndarray:
        """Per-host counts putting ``t`` GPUs in unit ``u``: unexposed trays first, whole trays
        first, the remainder on the best-fitting tray (fewest GPUs stranded)."""
        key = (u, t)
        got = self._parts.get(key)
        if got is None:
            hosts, counts = self.part_hosts(u, t)
            got = np.zeros(self.ctx.H, dtype=np.int64)
            got[hosts] = counts
            self._parts[key] = got
        return got

    def part_hosts(self, u: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        """:meth:`part` as ``(hosts, counts)`` (fill order): no row over every host (the local search
        builds thousands of parts per request on 2,502-25,002 trays)."""
        key = (u, t)
        got = self._sparse.get(key)
        if got is not None:
            return got
        order, f_ord, cum, fits_after = self._tray_order(u)
        # whole trays in order until some tray left fits the remainder: the first step i where the
        # GPUs still needed are 0 or fit one of trays i.. (prefix sums / suffix maxima; plain Python
        # over a domain's <= 18 trays - numpy's per-call cost dominated at this size)
        m = len(cum) - 1
        i = next((s for s in range(m) if t == cum[s] or fits_after[s] >= t - cum[s]), m)
        left = t - cum[i]
        if i == m and left:
            raise ValueError(f"unit {u} cannot hold {t} GPUs")
        if left:
            # the remainder on the best-fitting tray at or after step i
            p = next(p for p in self._remainder_order(u, left) if p >= i)
            hosts, counts = np.empty(i + 1, dtype=np.int64), np.empty(i + 1, dtype=np.int64)
            hosts[:i], counts[:i], hosts[i], counts[i] = order[:i], f_ord[:i], order[p], left
        else:
            hosts, counts = order[:i], f_ord[:i]
        got = (hosts, counts)
        self._sparse[key] = got
        return got

    def _tray_order(self, u: int) -> tuple[np.ndarray, np.ndarray, list[int], list[int]]:
        """Unit ``u``'s free trays in fill order (unexposed, fullest, best stage-1 value, host) with
        their free counts, prefix sums and suffix maxima - shared by every count ``t``."""
        got = self._orders.get(u)
        if got is None:
            ctx = self.ctx
            hs = self.members[u]
            hs = hs[ctx.fcount[hs] > 0]
            f = ctx.fcount[hs]
            order = hs[np.lexsort((hs, -ctx.best_val[hs, f], -f, ctx.exposed[hs]))]
            f_ord = ctx.fcount[order]
            got = (order, f_ord, [0, *np.cumsum(f_ord).tolist()],
                   [*np.maximum.accumulate(f_ord[::-1])[::-1].tolist(), 0])
            self._orders[u] = got
        return got

    def _remainder_order(self, u: int, left: int) -> list[int]:
        """Steps of unit ``u``'s fill order whose tray can take ``left`` GPUs, best fit first:
        unexposed, fewest free, best stage-1 value for ``left`` GPUs, then the step."""
        got = self._orders.get((u, left))
        if got is None:
            ctx = self.ctx
            order, f_ord = self._tray_order(u)[:2]
            p = np.flatnonzero(f_ord >= left)
            cand = order[p]
            got = p[np.lexsort((p, -ctx.best_val[cand, left], ctx.fcount[cand], ctx.exposed[cand]))].tolist()
            self._orders[(u, left)] = got
        return got

    def mask_rows(self, D: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per-unit count rows ``(n, U)`` -> ``(masks (n, len(cols)), cols)``: their parts' best masks."""
        return unit_rows.mask_rows(self, D)


def choose(ctx: SearchContext, units: Units, masks: np.ndarray, value: np.ndarray, tie: float = DOMAIN_TIE,
           cols: np.ndarray | None = None) -> int:
    """Best candidate; within ``tie`` of it, the least fragmenting one (see module docstring).
    With a lifetime locality margin (``ctx.locality`` > 0, the queue's default) the candidates
    within that margin of the best are near-equal and the fewest units, then the fewest trays win
    before fragmentation decides - the margin's meaning on plain clusters ("fewer hosts win unless
    spreading gains more"), which this search used to drop: it spread 2-GPU gangs over two trays'
    single free GPUs for the same predicted bandwidth, and trays shared by several multi-tray jobs
    is where the simulator's truth charges contention (``python -m benchmarks jct``, Helios shape).
    ``cols``: the rows are given on those host columns only."""
    vmax = float(np.max(value))
    margin = max(tie, ctx.locality)
    near = np.flatnonzero(value >= vmax - max(margin * abs(vmax), 1e-9))
    if near.size == 1:
        return int(near[0])
    c = popcount(masks[near])
    used = c > 0
    if cols is None:
        ucount = units.index.sum(c)
        ufree = units.free
        fcount = ctx.fcount
    else:  # per-unit sums over the columns' units only (the others are 0 in every row)
        seg_u, seg = np.unique(units.unit[cols], return_inverse=True)
        seg = seg.ravel()
        if seg.size and np.all(seg[1:] >= seg[:-1]):  # columns grouped by unit (host order): segmented sums
            ucount = np.add.reduceat(c, np.flatnonzero(np.r_[True, seg[1:] != seg[:-1]]), axis=1)
        else:
            ucount = np.zeros((c.shape[0], seg_u.size), dtype=np.int64)
            np.add.at(ucount.T, seg, c.T)
        ufree = units.free[seg_u]
        fcount = ctx.fcount[cols]
    uused = ucount > 0
    n_units = uused.sum(axis=1)
    unit_left = (uused * ufree[None, :]).sum(axis=1) - ucount.sum(axis=1)
    tray_left = (used * fcount[None, :]).sum(axis=1) - c.sum(axis=1)
    n_trays = used.sum(axis=1)
    # keep the largest placeable gang: avoid the unit(s) with the most free GPUs when others do
    top = units.free == units.free.max()
    top_here = top if cols is None else top[seg_u]
    hits_top = (uused & top_here[None, :]).sum(axis=1) >= top.sum()
    if ctx.locality > 0:  # fewer units, then fewer trays, then the fragmentation order
        return int(near[np.lexsort((near, -value[near], tray_left, unit_left, hits_top, n_trays, n_units))[0]])
    return int(near[np.lexsort((near, -value[near], n_trays, tray_left, unit_left, hits_top, n_units))[0]])


def _best(ctx: SearchContext, units: Units, masks: np.ndarray, tie: float, cols: np.ndarray | None = None, p=None) -> Found | None:
    """Best of candidate rows (``cols``: given on those host columns; the result is a full row; ``p``: their prediction)."""
    masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
    if masks.shape[0] == 0:
        return None
    p = ctx.evaluate(masks, cols) if p is None else p
    i = choose(ctx, units, masks, p.value, tie, cols)
    if cols is None:
        mask = masks[i].copy()
    else:
        mask = np.zeros(ctx.H, dtype=np.int64)
        mask[cols] = masks[i]
    return Found(mask, float(p.value[i]), float(p.standalone[i]), masks.shape[0])


def in_unit(ctx: SearchContext, units: Units, u: int, exact: bool = False, coarse: bool = False) -> np.ndarray:
    """Candidate masks for the whole gang inside unit ``u`` (``coarse``: on its trays' columns only)."""
    if coarse and not exact:  # the per-unit tables of all units at once (unit_setup)
        cols = units.members[u]
        greedy = greedy_on_cols(units, u, cols)
        if coarse_counts(units)[u] <= PER_DOMAIN_LIMIT:
            return np.concatenate([greedy, enumerate_coarse(units, u, cols)])
        return greedy
    allowed = units.allowed(u)
    if exact:
        return ctx.enumerate(allowed, coarse=True)
    greedy = ctx.masks_from_counts(units.part(u, ctx.k))
    if ctx.count_vectors(allowed) <= PER_DOMAIN_LIMIT:
        pareto = ctx.count_vectors(allowed, pareto=True) <= PER_DOMAIN_LIMIT
        return ctx.enumerate(allowed, pareto=pareto)
    if ctx.count_vectors(allowed, coarse=True) <= PER_DOMAIN_LIMIT:
        return np.concatenate([greedy, ctx.enumerate(allowed, coarse=True)])
    return greedy


def patterns(ctx: SearchContext, units: Units, cand: np.ndarray, with_exposed: bool,
             per_unit: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """In-domain candidates as *count patterns* (stage 1.5: the multiset of per-tray counts, shared
    by every domain with trays for it): partitions of ``k`` into at most ``trays`` parts of at most
    ``G``. Each pattern is placed on the best-fit unit of ``cand`` that can hold it (or, with
    ``per_unit``, on every unit of ``cand``), parts largest first on the best-fitting free tray
    (trays touched by contending jobs last, and only ``with_exposed``). Returns ``(masks, unit of
    each mask, cols)`` with the masks given on the host columns ``cols`` they touch, or None when
    trays are not symmetric (see :func:`symmetric_trays`)."""
    k, G = ctx.k, ctx.G
    hosts = np.flatnonzero((ctx.fcount > 0) & np.isin(units.unit, cand) & (with_exposed | ~ctx.exposed))
    empty = np.zeros((0, 0), dtype=np.int64), np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.int64)
    if hosts.size == 0:
        return empty
    if not symmetric_trays(ctx, hosts):
        if ASYMMETRIC not in ("patterns", "best_fit") or mixed_types(ctx, hosts):
            return None  # mixed GPU types: a pattern's value depends on the types, not only on counts
        # a pattern's value depends on which unit's trays hold it: try it on every unit that can
        per_unit = per_unit or ASYMMETRIC == "patterns"
    f = ctx.fcount[hosts]
    u_of = units.unit[hosts]
    # trays with >= c free GPUs, per unit (feasibility of nested thresholds: Hall's condition)
    ge = np.zeros((units.U, G + 1), dtype=np.int64)
    for c in range(1, G + 1):
        ge[:, c] = np.bincount(u_of, weights=f >= c, minlength=units.U)
    max_trays = int(ge[:, 1].max())
    pats = partitions(k, min(max_trays, k), G)
    if pats.shape[0] == 0:
        return empty
    need = np.stack([(pats >= c).sum(axis=1) for c in range(G + 1)], axis=1)  # (P, G+1)
    in_cand = np.isin(np.arange(units.U), cand)
    order = np.lexsort((np.arange(units.U), units.free))  # best fit first
    r_of, h_of, c_of, where = [], [], [], []
    by_unit = np.argsort(u_of, kind="stable")  # hosts grouped by unit, host order kept inside
    trays_of = unit_rows.UnitSlices(hosts[by_unit], u_of[by_unit])  # a unit's trays when a pattern goes there
    fill = unit_rows.pattern_fill(ctx, trays_of)
    last: dict = {}  # per unit the previous pattern placed there (unit_rows.place_parts)
    if per_unit:
        ok_ordered = ((ge[None, :, 1:] >= need[:, None, 1:]).all(axis=2) & in_cand[None, :])[:, order]
    else:
        best_fit = unit_rows.best_fit_units(ge, need, in_cand, order)
    for i, row in enumerate(pats.tolist()):
        if per_unit:
            us = order[ok_ordered[i]].tolist()
        else:
            us = [best_fit[i]] if best_fit[i] >= 0 else []
        parts = [c for c in row if c > 0]
        for u in us:
            hosts = unit_rows.place_parts(fill, u, parts, last)
            r_of.extend([len(where)] * len(parts))
            h_of.extend(hosts)
            c_of.extend(parts)
            where.append(u)
    if not where:
        return empty
    h = np.array(h_of, dtype=np.int64)
    cols = np.unique(h)
    masks = np.zeros((len(where), cols.size), dtype=np.int64)
    masks[np.array(r_of), np.searchsorted(cols, h)] = ctx.best_mask[h, np.array(c_of)]
    return masks, np.array(where), cols


def balanced(cap: np.ndarray, k: int, seg: int) -> np.ndarray:
    """Water-filling split of ``k`` (in multiples of ``seg``) over units with capacities ``cap``."""
    c = cap // seg
    # the largest level q whose capped sum fits (the sums grow with q): all levels in one pass
    sums = np.minimum(c[None, :], np.arange(int(c.max()) + 1)[:, None]).sum(axis=1)
    q = int(np.flatnonzero(sums <= k // seg).max(initial=0))
    base = np.minimum(c, q)
    extra = k // seg - int(base.sum())
    elig = np.flatnonzero(c > q)
    base[elig[:extra]] += 1
    return base * seg


def _unit_starts(units: Units, k: int, seg: int, eligible: np.ndarray) -> list[np.ndarray]:
    cap = np.where(eligible, units.free // seg * seg, 0)
    if cap.sum() < k:
        return []
    clean = np.where(eligible, units.free - units.exposed_free, 0)
    out = []
    # the fewest units by free GPUs, and by free GPUs clear of contending jobs
    for order in (np.lexsort((np.arange(units.U), units.exposed_free, -cap)), np.lexsort((np.arange(units.U), -cap, -clean))):
        order = order[cap[order] > 0]
        cum = np.cumsum(cap[order])
        m0 = int(np.searchsorted(cum, k)) + 1
        for m in range(m0, min(m0 + 2, order.size) + 1):
            top = order[:m]
            d = np.zeros(units.U, dtype=np.int64)
            d[top] = balanced(cap[top], k, seg)
            if d.sum() == k:
                out.append(d)
    # the fewest units by free GPUs clear of contending jobs, taking only those: no contender at all
    # (a scattered half-busy state: the other starts touch a few exposed trays, 15 vs 61 GB/s)
    ccap = clean // seg * seg
    if ccap.sum() >= k:
        order = np.lexsort((np.arange(units.U), -ccap))
        order = order[ccap[order] > 0]
        m = int(np.searchsorted(np.cumsum(ccap[order]), k)) + 1
        d = np.zeros(units.U, dtype=np.int64)
        d[order[:m]] = balanced(ccap[order[:m]], k, seg)
        if d.sum() == k:
            out.append(d)
    order = np.lexsort((np.arange(units.U), units.exposed_free, -cap))
    order = order[cap[order] > 0]
    # fullest first, the remainder on the best-fitting other unit
    d = np.zeros(units.U, dtype=np.int64)
    left = k
    for i, u in enumerate(order):
        rest = [x for x in order[i:] if cap[x] >= left]
        if rest:
            d[min(rest, key=lambda x: (cap[x], units.exposed_free[x], x))] = left
            break
        d[u] = cap[u]
        left -= int(cap[u])
    out.append(d)
    return out


def _unit_moves(units: Units, d: np.ndarray, seg: int, cap: np.ndarray) -> np.ndarray:
    """Rows moving ``t`` GPUs from a used unit to another used or a promising unused unit, in the
    lexicographic order of the rows, one per signature sequence (interchangeable targets).
    Vectorised on the few units a move can touch: every other column equals ``d`` in every row."""
    src, unused, targets, room = unit_rows.move_targets(units, d, cap, UNIT_TARGETS)
    # per used unit a, the sizes {seg, 4 seg, d[a]} ascending (each once), then every target with
    # room: (a, t) pairs row-major, targets in their order - one mask, no loop over units
    ts = np.sort(np.stack([np.full(src.size, seg), np.full(src.size, 4 * seg), d[src]], axis=1), axis=1)
    ok = (ts <= d[src][:, None]) & (ts % seg == 0) & np.c_[np.ones(src.size, bool), ts[:, 1:] != ts[:, :-1]]
    a_p, t_p = np.repeat(src, 3)[ok.ravel()], ts.ravel()[ok.ravel()]
    pi, ti = np.nonzero((room[targets][None, :] >= t_p[:, None]) & (targets[None, :] != a_p[:, None]))
    if pi.size == 0:
        return np.zeros((0, units.U), dtype=np.int64)
    return _move_rows(units, d, np.union1d(src, unused), a_p[pi], targets[ti], t_p[pi])


def _move_rows(units: Units, d: np.ndarray, cols: np.ndarray, a_: np.ndarray, b_: np.ndarray, t_: np.ndarray) -> np.ndarray:
    """Rows of the moves ``t_`` GPUs ``a_`` -> ``b_`` on ``d`` (``cols``: every unit nonzero in some row), sorted, one per signature sequence."""
    # distinct moves in np.unique's order of their rows (other columns are equal)
    pa, pb = np.searchsorted(cols, a_), np.searchsorted(cols, b_)
    o = unit_rows.moves_order(cols.size, pa, pb, t_)
    # a round builds the first moves in the order the screen prices them, within the work bound
    width = int(np.count_nonzero(d[cols])) + 1
    o = o[: work.round_moves(units.ctx, o.size, width)]
    work.charge_moves(units.ctx, o.size * width)
    pa, pb, t_ = pa[o], pb[o], np.asarray(t_, dtype=np.int64)[o]
    # interchangeable unused targets: keep one per sequence of (unit signature, count)
    sig_id: dict[tuple, int] = {}
    sid = np.array([sig_id.setdefault(units.signature(int(u)), len(sig_id) + 1) for u in cols], dtype=np.int64)
    if len(sig_id) == cols.size:  # no two units alike (a trained model's trays all differ): distinct moves, distinct sequences
        first = np.arange(pa.size)
    else:
        first = unit_rows.first_rows(unit_rows.move_sequences(d[cols], sid, pa, pb, t_))
    out = np.tile(d, (first.size, 1))
    at = np.arange(first.size)
    out[at, cols[pa[first]]] -= t_[first]
    out[at, cols[pb[first]]] += t_[first]
    return out


def cross_unit(ctx: SearchContext, units: Units, seg: int, eligible: np.ndarray, tie: float,
               base: np.ndarray | None = None) -> Found | None:
    """Near-exact search over per-unit counts for a gang larger than any unit's free GPUs: the
    starts (and ``base``, a full mask row: the baseline's pick) priced together, then a unit-level
    local search within :data:`~bandpilot.dispatch.search.work.WORK_CELLS` model cells."""
    k = ctx.k
    cap = np.where(eligible, units.free // seg * seg, 0)
    starts = _unit_starts(units, k, seg, eligible)
    if not starts:
        return None
    D = np.unique(np.array(starts), axis=0)
    masks, cols = units.mask_rows(D)
    if base is not None:  # the baseline's pick priced with the starts (one call): the search's floor
        masks, cols = work.with_row(masks, cols, base)
    before = ctx.pred.cells
    p = ctx.evaluate(masks, cols)
    work.note(ctx, seed_rows=masks.shape[0], seed_cells=ctx.pred.cells - before)
    if base is not None:  # -inf: provably below the best start
        work.note(ctx, base_value=float(p.value[-1]), base_standalone=float(p.standalone[-1]))
    best = _best(ctx, units, masks, tie, cols, p)
    if best is None:
        return None
    evaluated = best.evaluated
    screen = screen_for(ctx, units, UNIT_EVAL_BUDGET)  # the whole batch at once for a fabric
    by_class = move_classes.applies(ctx)  # one move per class of interchangeable moves
    def price(D: np.ndarray) -> Found | None:
        masks, cols = units.mask_rows(D)
        return _best(ctx, units, masks, 0.0, cols)

    with work.work_limit(ctx, work.budget(ctx, work.WORK_CELLS)):
        for _ in range(UNIT_LOCAL_ITERS):
            if ctx.pred.evaluations > UNIT_EVAL_BUDGET or work.spent(ctx.pred):
                break
            d = units.index.sum(popcount(best.mask))[0]
            moves = _unit_moves(units, d, seg, cap)
            if by_class:
                moves = moves[move_classes.one_per_class(units, moves, d)]
            if moves.shape[0] == 0:
                break
            got, n = screen(moves, price, best.value * (1 + 1e-9) + 1e-12)
            evaluated += n
            if got is None or got.value <= best.value * (1 + 1e-9) + 1e-12:
                break
            best = got
    best.evaluated = evaluated
    return best



def domain_search(ctx: SearchContext, segment: int | None = None, tie: float = DOMAIN_TIE) -> Found:
    """The ``bandpilot`` search on clusters with NVLink domains (see the module docstring); never
    predicted below the Slurm-block-like baseline's pick on the same request (:func:`~bandpilot.dispatch.search.work.floor`)."""
    units = Units(ctx)
    k = ctx.k
    seg = int(segment or 1)
    base = work.baseline_pick(ctx, units.index, seg)
    fits = np.flatnonzero(units.free >= k)
    if fits.size:
        found = _fitting(ctx, units, fits, tie)
        masks = np.array([f.mask for f in found])
        i = choose(ctx, units, masks, np.array([f.value for f in found]), tie)
        out = found[i]
        out.evaluated = sum(f.evaluated for f in found)
        return work.floor(ctx, out, base)
    got = cross_unit(ctx, units, seg, np.ones(units.U, dtype=bool), tie, base)
    if got is None:
        what = f" in segments of {seg}" if seg > 1 else ""
        raise PlacementError("constraint_unmet", f"{k} GPUs cannot be placed{what}: the domains' free GPUs do not add up")
    return work.floor(ctx, got, base)


def _fitting(ctx: SearchContext, units: Units, fits: np.ndarray, tie: float) -> list[Found]:
    """Candidates for a gang that fits a unit. Inside a unit nothing contends (NVLink switches, or
    one host), so the value is the standalone one and the count patterns over every free tray are
    exact; asymmetric trays fall back to per-unit coarse count vectors (units alike searched once)."""
    pats = patterns(ctx, units, fits, with_exposed=True)
    if pats is not None:
        got = _best(ctx, units, pats[0], tie, pats[2])
        return [] if got is None else [got]
    us, seen = [], set()
    for u in fits[np.lexsort((fits, units.free[fits]))].tolist():
        if (sig := units.signature(u, coarse=True)) not in seen:
            seen.add(sig)
            us.append(u)
    got = best_each_bounded(ctx, units, us, lambda u: (in_unit(ctx, units, u, coarse=True), units.members[u]),
                            lambda m, c, p=None: _best(ctx, units, m, tie, c, p), max(tie, ctx.locality))
    return [f for f in got if f is not None]
