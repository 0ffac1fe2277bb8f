"""Where does a gang go on a cluster of multi-node NVLink domains? Hierarchical count-vector search
(domain -> tray -> GPUs), its exact oracle, and the fragmentation-aware choice among near-ties.

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

from bandpilot.dispatch.search.context import Found, IntractableError, SearchContext, host_ids
from bandpilot.dispatch.search.count_vector import EXACT_LIMIT, exact
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
        self._sigs: dict[tuple[int, bool], tuple] = {}
        self.ctx = ctx

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
            sig = (bool(self.is_nvl[u]), int(self.size[u]), tuple(sorted(int(ctx.ccls[h]) for h in hs)))
        self._sigs[(u, coarse)] = sig
        return sig

    def part(self, u: int, t: int) -> np.ndarray:
        """Per-host counts putting ``t`` GPUs in unit ``u``: unexposed trays first, whole trays
        first, the remainder on the best-fitting tray (fewest GPUs stranded)."""
        key = (u, t)
        got = self._parts.get(key)
        if got is not None:
            return got
        ctx = self.ctx
        hs = self.members[u]
        hs = hs[ctx.fcount[hs] > 0]
        f = ctx.fcount[hs]
        top = ctx.best_val[hs, f]
        order = hs[np.lexsort((hs, -top, -f, ctx.exposed[hs]))]
        counts = np.zeros(ctx.H, dtype=np.int64)
        left = t
        used: set[int] = set()
        for h in order:
            if left == 0:
                break
            fits = [x for x in order if int(x) not in used and ctx.fcount[x] >= left]
            if fits:
                best = min(fits, key=lambda x: (bool(ctx.exposed[x]), int(ctx.fcount[x]), -float(ctx.best_val[x, left])))
                counts[best] = left
                left = 0
                break
            if int(h) in used:
                continue
            counts[h] = ctx.fcount[h]
            left -= int(ctx.fcount[h])
            used.add(int(h))
        if left:
            raise ValueError(f"unit {u} cannot hold {t} GPUs")
        self._parts[key] = counts
        return counts

    def rows(self, D: np.ndarray) -> np.ndarray:
        """Per-unit count rows ``(n, U)`` -> per-host count rows ``(n, H)``."""
        r, h, c = self._scatter(D)
        out = np.zeros((D.shape[0], self.ctx.H), dtype=np.int64)
        out[r, h] = c
        return out

    def mask_rows(self, D: np.ndarray) -> np.ndarray:
        """Per-unit count rows ``(n, U)`` -> the best mask rows for them (``masks_from_counts(rows(D))``)."""
        r, h, c = self._scatter(D)
        out = np.zeros((D.shape[0], self.ctx.H), dtype=np.int64)
        out[r, h] = self.ctx.best_mask.ravel()[h * (self.ctx.G + 1) + c]
        return out

    def _scatter(self, D: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row, host, count) of every nonzero per-host count of the rows of ``D``."""
        ri, ui = np.nonzero(D)
        width = int(D.max(initial=0)) + 1
        keys = ui * width + D[ri, ui]
        uniq, inv = np.unique(keys, return_inverse=True)
        # units hold disjoint hosts: scatter each unit's (sparse) part into its rows
        hs, cs, owner = [], [], []
        for j, key in enumerate(uniq.tolist()):
            part = self.part(key // width, key % width)
            h = self.members[key // width]
            h = h[part[h] > 0]
            hs.append(h)
            cs.append(part[h])
            owner.append(np.full(h.size, j))
        h_of, c_of, own = np.concatenate(hs), np.concatenate(cs), np.concatenate(owner)
        by_key = np.argsort(own, kind="stable")
        ptr = np.r_[0, np.cumsum(np.bincount(own, minlength=uniq.size))]
        inv = inv.ravel()
        lens = ptr[inv + 1] - ptr[inv]
        idx = np.repeat(ptr[inv] - np.cumsum(np.r_[0, lens[:-1]]), lens) + np.arange(int(lens.sum()))
        return np.repeat(ri, lens), h_of[by_key][idx], c_of[by_key][idx]


def choose(ctx: SearchContext, units: Units, masks: np.ndarray, value: np.ndarray, tie: float = DOMAIN_TIE) -> int:
    """Best candidate; within ``tie`` of it, the least fragmenting one (see module docstring)."""
    vmax = float(np.max(value))
    near = np.flatnonzero(value >= vmax - max(tie * abs(vmax), 1e-9))
    if near.size == 1:
        return int(near[0])
    c = popcount(masks[near])
    used = c > 0
    ucount = units.index.sum(c)
    uused = ucount > 0
    n_units = uused.sum(axis=1)
    unit_left = (uused * units.free[None, :]).sum(axis=1) - ucount.sum(axis=1)
    tray_left = (used * ctx.fcount[None, :]).sum(axis=1) - c.sum(axis=1)
    n_trays = used.sum(axis=1)
    # keep the largest placeable gang: avoid the unit(s) with the most free GPUs when others do
    top = units.free == units.free.max()
    hits_top = (uused & top[None, :]).sum(axis=1) >= top.sum()
    return int(near[np.lexsort((near, -value[near], n_trays, tray_left, unit_left, hits_top, n_units))[0]])


def _best(ctx: SearchContext, units: Units, masks: np.ndarray, tie: float) -> Found | None:
    masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
    if masks.shape[0] == 0:
        return None
    p = ctx.evaluate(masks)
    i = choose(ctx, units, masks, p.value, tie)
    return Found(masks[i].copy(), float(p.value[i]), float(p.standalone[i]), masks.shape[0])


def _in_unit(ctx: SearchContext, units: Units, u: int, exact: bool = False, coarse: bool = False) -> np.ndarray:
    """Candidate masks for the whole gang inside unit ``u``."""
    allowed = units.allowed(u)
    if exact:
        return ctx.enumerate(allowed, coarse=True)
    greedy = ctx.masks_from_counts(units.part(u, ctx.k))
    if coarse:
        if ctx.count_vectors(allowed, coarse=True) <= PER_DOMAIN_LIMIT:
            return np.concatenate([greedy, ctx.enumerate(allowed, coarse=True)])
        return greedy
    if ctx.count_vectors(allowed) <= PER_DOMAIN_LIMIT:
        pareto = ctx.count_vectors(allowed, pareto=True) <= PER_DOMAIN_LIMIT
        return ctx.enumerate(allowed, pareto=pareto)
    if ctx.count_vectors(allowed, coarse=True) <= PER_DOMAIN_LIMIT:
        return np.concatenate([greedy, ctx.enumerate(allowed, coarse=True)])
    return greedy


def symmetric_trays(ctx: SearchContext, hosts: np.ndarray) -> bool:
    """True when, per GPU type, a tray's best ``c``-subset value depends only on ``c`` (not on which
    GPUs of it are free): then trays differ only in free count and count patterns are exact."""
    if hosts.size == 0:
        return True
    gpu_id, _ = host_ids(ctx.spec)
    if np.unique(gpu_id[hosts]).size > 1:
        return False
    vals = np.round(ctx.best_val[hosts, 1:], 9)
    have = np.arange(1, ctx.G + 1)[None, :] <= ctx.fcount[hosts][:, None]
    hi = np.where(have, vals, -np.inf).max(axis=0)
    lo = np.where(have, vals, np.inf).min(axis=0)
    seen = have.any(axis=0)
    return bool(np.all(hi[seen] == lo[seen]))


def patterns(ctx: SearchContext, units: Units, cand: np.ndarray, with_exposed: bool,
             per_unit: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """In-domain candidates as *count patterns* (stage 1.5: the multiset of per-tray counts, shared
    by every domain with trays for it): partitions of ``k`` into at most ``trays`` parts of at most
    ``G``. Each pattern is placed on the best-fit unit of ``cand`` that can hold it (or, with
    ``per_unit``, on every unit of ``cand``), parts largest first on the best-fitting free tray
    (trays touched by contending jobs last, and only ``with_exposed``). Returns ``(masks, unit of
    each mask)``, or None when trays are not symmetric (see :func:`symmetric_trays`)."""
    k, G = ctx.k, ctx.G
    hosts = np.flatnonzero((ctx.fcount > 0) & np.isin(units.unit, cand) & (with_exposed | ~ctx.exposed))
    empty = np.zeros((0, ctx.H), dtype=np.int64), np.zeros(0, dtype=np.int64)
    if hosts.size == 0:
        return empty
    if not symmetric_trays(ctx, hosts):
        return None
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
    ok = (ge[None, :, 1:] >= need[:, None, 1:]).all(axis=2) & np.isin(np.arange(units.U), cand)[None, :]
    order = np.lexsort((np.arange(units.U), units.free))  # best fit first
    rows, where = [], []
    trays_of = {int(u): hosts[u_of == u] for u in np.unique(u_of)}
    for i in range(pats.shape[0]):
        us = [int(u) for u in order if ok[i, u]]
        for u in (us if per_unit else us[:1]):
            hs = trays_of[u]
            hs = hs[np.lexsort((hs, ctx.exposure[hs], ctx.fcount[hs], ctx.exposed[hs]))]
            taken = np.zeros(hs.size, dtype=bool)
            counts = np.zeros(ctx.H, dtype=np.int64)
            for c in pats[i][pats[i] > 0]:
                j = int(np.flatnonzero(~taken & (ctx.fcount[hs] >= c))[0])
                taken[j] = True
                counts[hs[j]] = c
            rows.append(counts)
            where.append(u)
    if not rows:
        return empty
    return ctx.masks_from_counts(np.array(rows)), np.array(where)


def _balanced(cap: np.ndarray, k: int, seg: int) -> np.ndarray:
    """Water-filling split of ``k`` (in multiples of ``seg``) over units with capacities ``cap``."""
    c = cap // seg
    q = 0
    for cand in range(int(c.max()) + 1):
        if np.minimum(c, cand).sum() <= k // seg:
            q = cand
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
            d[top] = _balanced(cap[top], k, seg)
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
    rows = []
    src = np.flatnonzero(d > 0)
    room = cap - d
    clean = units.free - units.exposed_free
    unused = np.flatnonzero((d == 0) & (cap > 0))
    unused = unused[np.lexsort((unused, -cap[unused], -clean[unused]))][:UNIT_TARGETS]
    targets = np.concatenate([src, unused])
    for a in src:
        for t in sorted({seg, 4 * seg, int(d[a])}):
            if t > d[a] or t % seg:
                continue
            for b in targets[room[targets] >= t]:
                if b == a:
                    continue
                r = d.copy()
                r[a] -= t
                r[b] += t
                rows.append(r)
    if not rows:
        return np.zeros((0, units.U), dtype=np.int64)
    rows_a = np.unique(np.array(rows), axis=0)
    # interchangeable unused targets: keep one per signature and count
    sig = [tuple((units.signature(int(u)), int(r[u])) for u in np.flatnonzero(r)) for r in rows_a]
    _, first = np.unique(np.array([hash(s) for s in sig]), return_index=True)
    return rows_a[np.sort(first)]


def cross_unit(ctx: SearchContext, units: Units, seg: int, eligible: np.ndarray, tie: float) -> Found | None:
    """Near-exact search over per-unit counts for a gang larger than any unit's free GPUs."""
    k = ctx.k
    cap = np.where(eligible, units.free // seg * seg, 0)
    starts = _unit_starts(units, k, seg, eligible)
    if not starts:
        return None
    D = np.unique(np.array(starts), axis=0)
    best = _best(ctx, units, units.mask_rows(D), tie)
    if best is None:
        return None
    evaluated = best.evaluated
    for _ in range(UNIT_LOCAL_ITERS):
        if ctx.pred.evaluations > UNIT_EVAL_BUDGET:
            break
        d = units.index.sum(popcount(best.mask))[0]
        moves = _unit_moves(units, d, seg, cap)
        if moves.shape[0] == 0:
            break
        got = _best(ctx, units, units.mask_rows(moves), 0.0)
        evaluated += 0 if got is None else got.evaluated
        if got is None or got.value <= best.value * (1 + 1e-9) + 1e-12:
            break
        best = got
    best.evaluated = evaluated
    return best


def domain_search(ctx: SearchContext, segment: int | None = None, tie: float = DOMAIN_TIE) -> Found:
    """The ``bandpilot`` search on clusters with NVLink domains (see the module docstring)."""
    units = Units(ctx)
    k = ctx.k
    fits = np.flatnonzero(units.free >= k)
    if fits.size:
        found = _fitting(ctx, units, fits, tie)
        masks = np.array([f.mask for f in found])
        i = choose(ctx, units, masks, np.array([f.value for f in found]), tie)
        out = found[i]
        out.evaluated = sum(f.evaluated for f in found)
        return out
    seg = int(segment or 1)
    got = cross_unit(ctx, units, seg, np.ones(units.U, dtype=bool), tie)
    if got is None:
        what = f" in segments of {seg}" if seg > 1 else ""
        raise PlacementError("constraint_unmet", f"{k} GPUs cannot be placed{what}: the domains' free GPUs do not add up")
    return got


def _fitting(ctx: SearchContext, units: Units, fits: np.ndarray, tie: float) -> list[Found]:
    """Candidates for a gang that fits a unit. Inside a unit nothing contends (NVLink switches, or
    one host), so the value is the standalone one and the count patterns over every free tray are
    exact; asymmetric trays fall back to per-unit coarse count vectors (units alike searched once)."""
    pats = patterns(ctx, units, fits, with_exposed=True)
    if pats is not None:
        got = _best(ctx, units, pats[0], tie)
        return [] if got is None else [got]
    found: list[Found] = []
    seen: set[tuple] = set()
    for u in fits[np.lexsort((fits, units.free[fits]))]:
        sig = units.signature(int(u), coarse=True)
        if sig not in seen:
            seen.add(sig)
            got = _best(ctx, units, _in_unit(ctx, units, int(u), coarse=True), tie)
            if got is not None:
                found.append(got)
    return found


def cross_domain_bound(model, spec, k: int) -> float:
    """Upper bound on the standalone bandwidth of any allocation of ``k`` GPUs spanning several
    units, for fabrics with the emulator's ``network`` (its scale-out term is maximised, for a given
    number of units, by a balanced split; the in-domain and stage-1 terms only lower it)."""
    unit, _ = spec.units
    U = int(unit.max()) + 1
    size = np.bincount(unit, weights=spec.gpus_per_host, minlength=U).astype(np.int64)
    best = 0.0
    for m in range(2, min(U, k) + 1):
        share = _balanced(np.sort(size)[::-1][:m], k, 1)
        if share.sum() != k:
            continue
        top = np.argsort(-size, kind="stable")[:m]
        counts = np.zeros(spec.n_hosts, dtype=np.int64)
        for u, t in zip(top, share):
            for h in np.flatnonzero(unit == u):
                c = min(int(spec.gpus_per_host[h]), int(t))
                counts[h] = c
                t -= c
        best = max(best, float(model.network(counts[None, :])[0]))
    return best


def domain_exact(ctx: SearchContext) -> Found:
    """True optimum over count vectors for a gang that fits a unit: every unit that can hold it,
    every in-unit count vector with the Pareto subsets of exposed trays, certified against the
    cross-unit bound (or, on small clusters, every count vector of the cluster: :func:`exact`).
    Raises :class:`IntractableError` when it can neither enumerate nor certify."""
    units = Units(ctx)
    fits = np.flatnonzero(units.free >= ctx.k)
    why = f"k={ctx.k} exceeds every domain's free GPUs"
    if fits.size:
        total = sum(ctx.count_vectors(units.allowed(int(u)), coarse=True) for u in fits)
        why = f"{total:.3g} in-domain count vectors for k={ctx.k}"
        if total <= EXACT_LIMIT and hasattr(ctx.model, "network"):
            # in-unit values are standalone (nothing contends inside a unit): coarse classes are exact
            found = [f for f in (ctx.best_of(_in_unit(ctx, units, int(u), exact=True)) for u in fits) if f is not None]
            best = ctx.pick(found)
            bound = cross_domain_bound(ctx.model, ctx.spec, ctx.k) if units.U > 1 else -np.inf
            if bound <= best.value:
                return best
            why = f"cross-domain allocations cannot be ruled out for k={ctx.k} ({bound:.1f} > {best.value:.1f} GB/s)"
    n = ctx.count_vectors(pareto=True)
    if n <= EXACT_LIMIT and n * ctx.H <= 64 * EXACT_LIMIT:  # small clusters: every count vector
        return exact(ctx)
    raise IntractableError(f"exact search is intractable here: {why}, and {n:.3g} count vectors over the cluster")
