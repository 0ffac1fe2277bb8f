"""Model-guided search over ``C(A, k)``: EHA, PTS, count-vector search, the ``bandpilot`` hybrid, Exact.

Everything here rests on the hierarchy of the bandwidth model (paper Sec. IV-B): a cross-host
allocation's bandwidth depends on the per-host GPU counts and - monotonically, through ``min`` -
on each host's stage-1 (intra-host) value. So for a given per-host count vector ``c`` the best
allocation takes, on every host, the free subset of size ``c_h`` with the best stage-1 value,
which is computed once per request from ``model.stage1`` and the free mask
(:attr:`SearchContext.best_mask`). The search space collapses from ``C(|A|, k)`` subsets to the
count vectors ``{c : Σc = k, 0 <= c_h <= free_h}``, and further: hosts with identical free
best-tables (and GPU type, domain, and no contention exposure) are interchangeable, so only sorted
count multisets per equivalence class need evaluating (:meth:`SearchContext.count_vectors`).

Algorithms (each returns a :class:`Found`):

* :func:`eha` - Equilibrium-driven Heuristic Algorithm (Sec. IV-D2): best single-host subset if a
  host fits ``k``, else balanced splits of ``k`` over combinations of the minimum number of hosts.
* :func:`pts` - Pruned Tree Search (Sec. IV-D3): from the free set remove the weakest GPU step by
  step; each step's removals are de-duplicated (same host class, count and stage-1 before/after)
  and evaluated in ONE batched prediction. Single-host prioritisation adds the best
  single-host subsets as candidates.
* :func:`count_search` - exhaustive batched search over count vectors (symmetry-reduced).
* :func:`bandpilot` - the product algorithm: :func:`count_search` whenever the number of count
  vectors after symmetry reduction is <= :data:`COUNT_SEARCH_LIMIT` (with the Pareto subsets of
  exposed hosts too when that still fits). It subsumes EHA's candidates and dominates PTS under a
  monotone model - the paper's EHA+PTS guided by the *true* bandwidth only reaches ~89 % of the
  optimum on heterogeneous hosts. Beyond the limit: EHA + :func:`coarse_count_search` (count
  vectors over host classes that ignore contention exposure, counts placed on the least-contended
  hosts, over the best-ranked hosts that keep it <= :data:`COARSE_SEARCH_LIMIT`) + PTS from a
  truncated start set, then a batched local search over count vectors (move 1, 2 or all GPUs of
  one host to another host).
* :func:`exact` - the true optimum of ``B(S, τ)`` under a fabric: count vectors with, on hosts
  exposed to contending jobs, every Pareto-optimal subset (stage-1 of the subset and of its
  union with each job's GPUs there), so it equals brute force over all subsets. Raises
  :class:`IntractableError` above :data:`EXACT_LIMIT` candidates. Where that bites: a 4×8
  cluster is always fine (at most a few thousand candidates); a 64×8 cluster is fine when idle
  or nearly so (few host classes) but not for mid-range ``k`` once ~10+ hosts are touched by
  contending cross-host jobs (e.g. 2.7e6 candidates at k=6, 4e8 at k=10 in the benchmark states).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

import numpy as np

from bandpilot.topology.cluster import popcount
from bandpilot.dispatch.contention import ContentionPredictor, Prediction
from bandpilot.errors import PlacementError
from bandpilot.dispatch.state import State

#: Count vectors (after symmetry reduction) the ``bandpilot`` algorithm evaluates exhaustively.
COUNT_SEARCH_LIMIT = 20_000
#: Coarse count vectors (exposure ignored) the fallback evaluates (host prefix shrunk to fit).
COARSE_SEARCH_LIMIT = 4_096
#: Candidates (count vectors x Pareto subset options) beyond which :func:`exact` refuses.
EXACT_LIMIT = 2_000_000
#: Host combinations EHA considers at most (class multisets, best-ranked first) and candidates
#: it evaluates at most (balanced splits of k over them).
EHA_MAX_COMBOS = 512
EHA_MAX_CANDIDATES = 1_024
#: Local-search iterations (each one batched prediction).
LOCAL_SEARCH_ITERS = 64

_REL_TIE = 1e-9


class IntractableError(PlacementError):
    """Exact search refused: the candidate space is too large (reason ``invalid_request``)."""

    def __init__(self, message: str) -> None:
        super().__init__("invalid_request", message)


@dataclass
class Found:
    """A search result: one allocation with its predicted contention-aware and standalone value."""

    mask: np.ndarray
    value: float
    standalone: float
    evaluated: int = 0  # candidates considered (informational)


# ------------------------------------------------------------------------------------------
# combinatorics helpers
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


# ------------------------------------------------------------------------------------------
@dataclass
class _Class:
    hosts: np.ndarray  # member hosts (index order)
    f: int  # free GPUs of each member
    exposed: bool


class SearchContext:
    """Per-request precomputation shared by every algorithm.

    ``free`` is the (constraint-filtered) free mask; allocations never leave it.
    """

    def __init__(self, model: Any, state: State, free: np.ndarray, k: int,
                 predictor: ContentionPredictor | None = None) -> None:
        self.model = model
        self.state = state
        self.spec = state.spec
        self.k = int(k)
        self.free = np.asarray(free, dtype=np.int64).copy()
        self.H = self.spec.n_hosts
        self.G = int(self.spec.gpus_per_host.max())
        self.pred = predictor if predictor is not None else ContentionPredictor(model, state)
        stage1 = np.asarray(model.stage1, dtype=float)
        if stage1.ndim != 2 or stage1.shape[0] != self.H or stage1.shape[1] < (1 << self.G):
            raise ValueError(f"model.stage1 has shape {stage1.shape}, expected ({self.H}, {1 << self.G})")
        self.stage1 = stage1
        self.fcount = popcount(self.free)
        self.n_free = int(self.fcount.sum())
        self._options: dict[tuple[int, int], np.ndarray] = {}
        self._exposed_subs: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}
        self._build_tables()
        self._build_classes()

    # -- per-host best subsets ------------------------------------------------------------
    def _build_tables(self) -> None:
        H, G = self.H, self.G
        allm = np.arange(1 << G, dtype=np.int64)
        pc = popcount(allm)
        valid = (allm[None, :] & ~self.free[:, None]) == 0
        score = np.where(valid, self.stage1[:, : 1 << G], -np.inf)
        self.best_mask = np.full((H, G + 1), -1, dtype=np.int64)
        self.best_val = np.full((H, G + 1), -np.inf)
        rows = np.arange(H)
        for c in range(G + 1):
            sel = np.flatnonzero(pc == c)
            sub = score[:, sel]
            i = sub.argmax(axis=1)
            self.best_mask[:, c] = sel[i]
            self.best_val[:, c] = sub[rows, i]
        bad = ~np.isfinite(self.best_val)
        self.best_mask[bad] = -1
        self.exposed = self.pred.exposed & (self.fcount > 0)
        # Hosts a contending job touches: the subset also sets the stage-1 of the super
        # allocations there, so among the best stage-1 subsets of each size prefer the best
        # union stage-1s (worst, then sum); Exact uses the whole Pareto set (see options()).
        for h in np.flatnonzero(self.exposed):
            subs = allm[valid[h]]
            pcs = pc[subs]
            jm = np.unique(self.pred.job_masks[:, h])
            jm = jm[jm != 0]
            feats = np.round(np.column_stack([self.stage1[h, subs], self.stage1[h, subs[:, None] | jm[None, :]]]), 9)
            order = np.lexsort((subs, -feats[:, 1:].sum(axis=1), -feats[:, 1:].min(axis=1), -feats[:, 0], pcs))
            subs, pcs, feats = subs[order], pcs[order], feats[order]
            first = np.flatnonzero(np.r_[True, np.diff(pcs) != 0])
            self.best_mask[h, pcs[first]] = subs[first]
            self._exposed_subs[int(h)] = (subs, pcs, feats)

    def options(self, h: int, c: int) -> np.ndarray:
        """Subsets of size ``c`` worth trying on host ``h``: the best one, or on exposed hosts the
        Pareto set over (stage-1, stage-1 of the union with each contending job's GPUs there)."""
        got = self._options.get((h, c))
        if got is not None:
            return got
        if h not in self._exposed_subs:
            return self.best_mask[h, c : c + 1]
        subs, pcs, feats = self._exposed_subs[h]
        for cc, opts in pareto_options(feats, subs, pcs).items():
            self._options[(h, cc)] = opts
        return self._options.get((h, c), np.zeros(0, dtype=np.int64))

    def _build_classes(self) -> None:
        keys: dict[Any, int] = {}
        ckeys: dict[Any, int] = {}
        cls = np.full(self.H, -1, dtype=np.int64)
        ccls = np.full(self.H, -1, dtype=np.int64)
        for h in np.flatnonzero(self.fcount > 0):
            f = int(self.fcount[h])
            host = self.spec.hosts[h]
            coarse = (host.gpu, host.domain, f, tuple(np.round(self.best_val[h, : f + 1], 9).tolist()))
            key: Any = ("exposed", int(h)) if self.exposed[h] else coarse
            cls[h] = keys.setdefault(key, len(keys))
            ccls[h] = ckeys.setdefault(coarse, len(ckeys))
        self.cls = cls  # interchangeable hosts (exact symmetry)
        self.n_classes = len(keys)
        self.ccls = ccls  # same standalone behaviour, contention exposure ignored
        self.n_cclasses = len(ckeys)
        pr = self.pred
        if pr.n_jobs:
            #: total demand of the contending jobs touching each host (0: unexposed)
            self.exposure = (pr.job_used * pr.job_demand[:, None]).sum(axis=0)
        else:
            self.exposure = np.zeros(self.H)

    def classes(self, allowed: np.ndarray | None = None, coarse: bool = False) -> list[_Class]:
        """Host classes with free GPUs. ``coarse``: classes ignore contention exposure (members
        ordered least-exposed first, so enumerated counts land on the least-contended hosts)."""
        out = []
        lab = self.ccls if coarse else self.cls
        ok = lab >= 0 if allowed is None else (lab >= 0) & allowed
        for c in range(self.n_cclasses if coarse else self.n_classes):
            members = np.flatnonzero(ok & (lab == c))
            if members.size:
                if coarse:
                    members = members[np.lexsort((members, self.exposure[members]))]
                    out.append(_Class(members, int(self.fcount[members[0]]), False))
                else:
                    out.append(_Class(members, int(self.fcount[members[0]]), bool(self.exposed[members[0]])))
        return out

    # -- evaluation -----------------------------------------------------------------------
    def evaluate(self, masks: np.ndarray) -> Prediction:
        """Contention-aware values of candidates (pruned by the standalone bound in big
        batches: candidates that cannot win come back as ``-inf``)."""
        return self.pred.predict_best(masks)

    def masks_from_counts(self, counts: np.ndarray) -> np.ndarray:
        counts = np.atleast_2d(counts)
        return self.best_mask[np.arange(self.H)[None, :], counts]

    def choose(self, masks: np.ndarray, value: np.ndarray) -> int:
        """Index of the best candidate; near-ties prefer fewer hosts, then the tightest fit
        (fewest free GPUs on the hosts used, keeping big free blocks intact), then order."""
        vmax = float(value.max())
        near = np.flatnonzero(value >= vmax - _REL_TIE * max(1.0, abs(vmax)))
        if near.size == 1:
            return int(near[0])
        used = masks[near] != 0
        nh = used.sum(axis=1)
        fit = (used * self.fcount[None, :]).sum(axis=1)
        return int(near[np.lexsort((near, fit, nh))[0]])

    def best_of(self, masks: np.ndarray) -> Found | None:
        masks = np.atleast_2d(np.asarray(masks, dtype=np.int64))
        if masks.shape[0] == 0:
            return None
        p = self.evaluate(masks)
        i = self.choose(masks, p.value)
        return Found(masks[i].copy(), float(p.value[i]), float(p.standalone[i]), masks.shape[0])

    def pick(self, found: list[Found | None]) -> Found:
        found = [f for f in found if f is not None]
        masks = np.array([f.mask for f in found])
        vals = np.array([f.value for f in found])
        best = found[self.choose(masks, vals)]
        best.evaluated = sum(f.evaluated for f in found)
        return best

    def canonical_unique(self, counts: np.ndarray) -> np.ndarray:
        """Indices of count-vector rows that are distinct up to swapping interchangeable hosts."""
        counts = np.atleast_2d(counts)
        if counts.shape[0] <= 1:
            return np.arange(counts.shape[0])
        code = np.where(counts > 0, self.cls[None, :] * (self.G + 1) + counts, -1)
        code = np.sort(code, axis=1)
        void = np.ascontiguousarray(code).view(np.dtype((np.void, 8 * code.shape[1]))).ravel()
        _, idx = np.unique(void, return_index=True)
        return np.sort(idx)

    # -- count vectors --------------------------------------------------------------------
    def _class_poly(self, cl: _Class, pareto: bool) -> np.ndarray:
        k = self.k
        if cl.exposed:
            h = int(cl.hosts[0])
            q = np.zeros(k + 1)
            for c in range(min(cl.f, k) + 1):
                q[c] = len(self.options(h, c)) if pareto else 1.0
            return q
        return np.asarray(partition_counts(len(cl.hosts), cl.f, k))

    def count_vectors(self, allowed: np.ndarray | None = None, pareto: bool = False, coarse: bool = False) -> float:
        """Number of candidates :meth:`enumerate` would produce (after symmetry reduction)."""
        poly = np.zeros(self.k + 1)
        poly[0] = 1.0
        for cl in self.classes(allowed, coarse):
            poly = np.convolve(poly, self._class_poly(cl, pareto))[: self.k + 1]
        return float(poly[self.k])

    def enumerate(self, allowed: np.ndarray | None = None, pareto: bool = False, coarse: bool = False) -> np.ndarray:
        """All symmetry-reduced count vectors with ``Σc = k`` as mask rows ``(N, n_hosts)``.

        Dynamic programming over host classes on small integer codes (a count, or on exposed
        hosts an index into that host's option list); partial vectors that cannot reach ``k``
        are pruned, so no intermediate table is larger than the result.
        """
        k = self.k
        classes = self.classes(allowed, coarse)
        if not classes:
            return np.zeros((0, self.H), dtype=np.int64)
        menus: dict[int, np.ndarray] = {}
        offsets: dict[int, np.ndarray] = {}
        for cl in classes:
            if cl.exposed and pareto:
                h = int(cl.hosts[0])
                opts = [self.options(h, c) for c in range(cl.f + 1)]
                menus[h] = np.concatenate(opts)
                offsets[h] = np.r_[0, np.cumsum([len(o) for o in opts])]
        caps = [min(len(cl.hosts) * cl.f, k) for cl in classes]
        rest = np.r_[np.cumsum(caps[::-1])[::-1][1:], 0]
        code_t = np.int16 if self.G <= 8 else np.int32
        acc: dict[int, np.ndarray] = {0: np.zeros((1, 0), dtype=code_t)}
        for i, cl in enumerate(classes):
            new: dict[int, list[np.ndarray]] = {}
            for s_, A in acc.items():
                for t in range(caps[i] + 1):
                    s2 = s_ + t
                    if s2 > k:
                        break
                    if s2 + rest[i] < k:
                        continue
                    if cl.exposed:
                        h = int(cl.hosts[0])
                        if pareto:
                            R = np.arange(offsets[h][t], offsets[h][t + 1], dtype=code_t)[:, None]
                        else:
                            R = np.array([[t]], dtype=code_t)
                    else:
                        R = partitions(t, len(cl.hosts), cl.f).astype(code_t)
                    if R.shape[0] == 0:
                        continue
                    if A.shape[0] == 1:
                        block = np.concatenate([np.repeat(A, R.shape[0], axis=0), R], axis=1)
                    else:
                        block = np.concatenate([np.repeat(A, R.shape[0], axis=0), np.tile(R, (A.shape[0], 1))], axis=1)
                    new.setdefault(s2, []).append(block)
            acc = {s_: (v[0] if len(v) == 1 else np.concatenate(v)) for s_, v in new.items()}
        codes = acc.get(k)
        out = np.zeros((0 if codes is None else codes.shape[0], self.H), dtype=np.int64)
        if codes is None:
            return out
        col = 0
        for cl in classes:
            for h in cl.hosts:
                h = int(h)
                menu = menus.get(h)
                if menu is None:
                    menu = self.best_mask[h]
                out[:, h] = menu[codes[:, col]]
                col += 1
        return out

    # -- misc -----------------------------------------------------------------------------
    def single_host_rows(self) -> np.ndarray:
        """Best ``k``-subset of every host that fits ``k`` (one per host class)."""
        fit = np.flatnonzero(self.fcount >= self.k)
        if fit.size == 0:
            return np.zeros((0, self.H), dtype=np.int64)
        _, first = np.unique(self.cls[fit], return_index=True)
        hosts = fit[np.sort(first)]
        rows = np.zeros((hosts.size, self.H), dtype=np.int64)
        rows[np.arange(hosts.size), hosts] = self.best_mask[hosts, self.k]
        return rows

    def host_rank(self) -> np.ndarray:
        """Hosts with free GPUs, most promising first: unexposed, most free, best stage-1."""
        hosts = np.flatnonzero(self.fcount > 0)
        f = self.fcount[hosts]
        top = self.best_val[hosts, f]
        return hosts[np.lexsort((hosts, -top, -f, self.exposed[hosts]))]


# ------------------------------------------------------------------------------------------
# algorithms
def single_host(ctx: SearchContext) -> Found:
    """Best single-host allocation (the ``single_host`` constraint)."""
    got = ctx.best_of(ctx.single_host_rows())
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
    rows = ctx.single_host_rows()
    if rows.shape[0]:
        return ctx.best_of(rows)
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
    return ctx.best_of(ctx.masks_from_counts(counts))


def pts(ctx: SearchContext, start: np.ndarray | None = None, single_host_first: bool = True) -> Found:
    """Pruned Tree Search (paper Sec. IV-D3): greedy elimination of the weakest GPU.

    Starts from ``start`` (default: every free GPU). Each step's removal candidates are
    de-duplicated - on unexposed hosts a removal is characterised by (host class, count, stage-1
    before, stage-1 after) - and evaluated in one batch.
    """
    H, G, k = ctx.H, ctx.G, ctx.k
    found: list[Found | None] = []
    if single_host_first:
        found.append(ctx.best_of(ctx.single_host_rows()))
    S = (ctx.free if start is None else np.asarray(start, dtype=np.int64)).copy()
    if int(popcount(S).sum()) < k:
        raise ValueError("PTS start set smaller than k")
    bit = np.int64(1) << np.arange(G, dtype=np.int64)
    cur: Found | None = None
    evaluated = 0
    while int(popcount(S).sum()) > k:
        has = (S[:, None] & bit[None, :]) != 0
        h_idx, g_idx = np.nonzero(has)
        new = S[h_idx] & ~bit[g_idx]
        nv = ctx.stage1[h_idx, new]
        cnt = popcount(S)[h_idx]
        before = ctx.stage1[h_idx, S[h_idx]]
        exp = ctx.exposed[h_idx]
        key = np.column_stack([
            np.where(exp, H + h_idx, ctx.cls[h_idx]),
            cnt,
            np.round(before * 1e6).astype(np.int64),
            np.round(nv * 1e6).astype(np.int64),
            np.where(exp, new, -1),
        ])
        _, first = np.unique(np.ascontiguousarray(key).view(np.dtype((np.void, 8 * key.shape[1]))).ravel(),
                             return_index=True)
        first = np.sort(first)
        rows = np.repeat(S[None, :], first.size, axis=0)
        rows[np.arange(first.size), h_idx[first]] = new[first]
        p = ctx.evaluate(rows)
        evaluated += rows.shape[0]
        i = ctx.choose(rows, p.value)
        S = rows[i]
        cur = Found(S.copy(), float(p.value[i]), float(p.standalone[i]))
    if cur is None:
        p = ctx.evaluate(S[None, :])
        cur = Found(S.copy(), float(p.value[0]), float(p.standalone[0]))
        evaluated += 1
    cur.evaluated = evaluated
    found.append(cur)
    return ctx.pick(found)


def count_search(ctx: SearchContext, allowed: np.ndarray | None = None, pareto: bool = False) -> Found | None:
    """Exhaustive batched evaluation of the symmetry-reduced count vectors."""
    masks = ctx.enumerate(allowed, pareto=pareto)
    return ctx.best_of(masks)


def _counts_of(mask: np.ndarray) -> np.ndarray:
    return popcount(np.asarray(mask, dtype=np.int64))


def local_search(ctx: SearchContext, start: Found, iters: int = LOCAL_SEARCH_ITERS) -> Found:
    """Hill-climb over count vectors: move 1, 2 or all GPUs of one host to another, batched."""
    best = start
    c = _counts_of(start.mask)
    # Re-map to the best per-host subsets (never worse under a monotone model).
    remap = ctx.best_of(ctx.masks_from_counts(c))
    if remap is not None and remap.value > best.value:
        best = remap
    f = ctx.fcount
    for _ in range(iters):
        c = _counts_of(best.mask)
        src = np.flatnonzero(c > 0)
        if src.size == 0:
            break
        # one representative source per (class, count); up to two targets per (class, count)
        _, si = np.unique(np.column_stack([ctx.cls[src], c[src]]), axis=0, return_index=True)
        src = src[np.sort(si)]
        tgt_all = np.flatnonzero((f > c) & (ctx.cls >= 0))
        if tgt_all.size == 0:
            break
        tkey = ctx.cls[tgt_all] * (ctx.G + 2) + c[tgt_all]
        order = np.lexsort((tgt_all, tkey))
        tk = tkey[order]
        rank = np.arange(tk.size) - np.searchsorted(tk, tk)
        tgt = np.sort(tgt_all[order][rank < 2])
        moves = []
        for a in src:
            for t in sorted({1, 2, int(c[a])}):
                if t > c[a]:
                    continue
                ok = (tgt != a) & (c[tgt] + t <= f[tgt])
                if not ok.any():
                    continue
                b = tgt[ok]
                rows = np.repeat(c[None, :], b.size, axis=0)
                rows[:, a] -= t
                rows[np.arange(b.size), b] += t
                moves.append(rows)
        if not moves:
            break
        rows = np.concatenate(moves)
        rows = rows[ctx.canonical_unique(rows)]
        got = ctx.best_of(ctx.masks_from_counts(rows))
        if got is None or got.value <= best.value * (1 + 1e-12) + 1e-12:
            break
        got.evaluated += best.evaluated
        best = got
    return best


def coarse_count_search(ctx: SearchContext, limit: int) -> Found | None:
    """Count-vector search over *coarse* host classes (exposure ignored, counts placed on the
    least-contended hosts of each class), restricted to the longest prefix of
    :meth:`SearchContext.host_rank` whose space stays within ``limit``. Evaluated with the
    standalone bound, so only candidates that can still win get super allocations."""
    rank = ctx.host_rank()
    cum = np.cumsum(ctx.fcount[rank])
    lo = int(np.searchsorted(cum, ctx.k)) + 1  # fewest hosts that can hold k
    if lo > rank.size:
        return None

    def allowed(p: int) -> np.ndarray:
        a = np.zeros(ctx.H, dtype=bool)
        a[rank[:p]] = True
        return a

    if ctx.count_vectors(allowed(rank.size), coarse=True) <= limit:
        lo = rank.size
    elif ctx.count_vectors(allowed(lo), coarse=True) > limit:
        return None
    else:
        hi = rank.size
        while lo < hi:  # largest p with count <= limit
            mid = (lo + hi + 1) // 2
            if ctx.count_vectors(allowed(mid), coarse=True) <= limit:
                lo = mid
            else:
                hi = mid - 1
    return ctx.best_of(ctx.enumerate(allowed(lo), coarse=True))


def bandpilot(ctx: SearchContext) -> Found:
    """The product search: exhaustive count-vector search when tractable, else the hybrid."""
    if ctx.count_vectors() <= COUNT_SEARCH_LIMIT:
        # On hosts exposed to contending jobs also try the Pareto subsets (stage-1 of the subset
        # vs. of its unions with the jobs' GPUs) when that keeps the space within the limit.
        pareto = ctx.count_vectors(pareto=True) <= COUNT_SEARCH_LIMIT
        got = count_search(ctx, pareto=pareto)
        if got is not None:
            return got
    found: list[Found | None] = [eha(ctx), coarse_count_search(ctx, COARSE_SEARCH_LIMIT)]
    # PTS from a truncated start: the best-ranked hosts holding k + 8..16 GPUs.
    rank = ctx.host_rank()
    cum = np.cumsum(ctx.fcount[rank])
    p = int(np.searchsorted(cum, ctx.k + min(16, max(8, ctx.k // 4)))) + 1
    start = np.zeros(ctx.H, dtype=np.int64)
    start[rank[:p]] = ctx.free[rank[:p]]
    found.append(pts(ctx, start=start, single_host_first=False))
    return local_search(ctx, ctx.pick(found))


def exact(ctx: SearchContext) -> Found:
    """True optimum of ``B(S, τ)`` when ``ctx`` is built on a fabric (see module docstring)."""
    n = ctx.count_vectors(pareto=True)
    if n > EXACT_LIMIT or n * ctx.H > 64 * EXACT_LIMIT:
        raise IntractableError(
            f"exact search is intractable here: {n:.3g} candidates for k={ctx.k} after symmetry "
            f"reduction exceed the limit of {EXACT_LIMIT:,} (4x8-GPU clusters are always fine; "
            f"busy 64x8 clusters are not for mid-range k)"
        )
    masks = ctx.enumerate(pareto=True)
    got = ctx.best_of(masks)
    assert got is not None
    return got


ALGORITHMS = {"bandpilot": bandpilot, "eha": eha, "pts": pts}
