"""Which count vector is best, by enumeration? Exhaustive, coarse and exact count-vector search.

* :func:`count_search` - exhaustive batched search over count vectors (symmetry-reduced).
* :func:`coarse_count_search` - the same over coarse host classes on a best-ranked host prefix
  (the ``bandpilot`` fallback).
* :func:`exact` - the true optimum of ``B(S, τ)`` under a fabric: count vectors with, on hosts
  exposed to contending jobs, every Pareto-optimal subset (stage-1 of the subset and of its
  union with each job's GPUs there), so it equals brute force over all subsets. Raises
  :class:`IntractableError` above :data:`EXACT_LIMIT` candidates. Where that bites: a 4×8
  cluster is always fine (at most a few thousand candidates); a 64×8 cluster is fine when idle
  or nearly so (few host classes) but not for mid-range ``k`` once ~10+ hosts are touched by
  contending cross-host jobs (e.g. 2.7e6 candidates at k=6, 4e8 at k=10 in the benchmark states).
"""

from __future__ import annotations

import numpy as np

from bandpilot.dispatch.contention import unique_rows
from bandpilot.dispatch.search.context import PRUNE_PAIRS, Found, IntractableError, SearchContext
from bandpilot.topology.cluster import popcount

#: Candidates (count vectors x Pareto subset options) beyond which :func:`exact` refuses.
EXACT_LIMIT = 2_000_000


#: Pareto candidates above which they are scored count vector by count vector (:func:`_pareto_pruned`).
PRUNE_PARETO = 256


def count_search(ctx: SearchContext, allowed: np.ndarray | None = None, pareto: bool = False) -> Found | None:
    """Exhaustive batched evaluation of the symmetry-reduced count vectors. The best candidate
    and its near-ties are found exactly as by scoring all of them, but candidates that provably
    cannot win are never sent to the model (the decision's evaluations stay in the hundreds)."""
    masks = ctx.enumerate(allowed, pareto=pareto)
    if pareto and masks.shape[0] > PRUNE_PARETO:
        return _pareto_pruned(ctx, masks)
    return ctx.best_of(masks, max_pairs=PRUNE_PAIRS)


def _pareto_pruned(ctx: SearchContext, masks: np.ndarray, first: int = 8) -> Found | None:
    """Best of Pareto candidates, count vector by count vector in descending standalone bound.

    ``B̂`` is monotone in each host's stage-1 value (the hierarchy the whole count-vector search
    rests on), so the count vector's best-subset row bounds the standalone value of all its Pareto
    variants (``B̂(S, τ) <= B̂(S)``); count vectors below the best value found are never scored
    (``-inf``), those within the tie margin always are - the choice among the scored ones is the
    one :meth:`SearchContext.best_of` makes over all rows. A count vector with several variants is
    first bounded with contention too (:func:`_value_bounds`: one row per contending job instead
    of every variant's super allocations) and skipped when that bound is below the best."""
    counts = popcount(masks)
    reps, grp = unique_rows(counts)
    rep_masks = ctx.masks_from_counts(reps)
    bound = ctx.pred.raw(rep_masks)
    multi = np.bincount(grp, minlength=reps.shape[0]) >= 2
    # the best-subset row of each count vector is one of its candidates: its value is known
    known = np.where((masks == rep_masks[grp]).all(axis=1), bound[grp], np.nan)
    value = np.full(masks.shape[0], -np.inf)
    solo = np.full(masks.shape[0], -np.inf)
    order = np.argsort(-bound, kind="stable")
    best, pos, step = -np.inf, 0, first
    while pos < order.size:
        cut = best - ctx.tie_margin * max(1.0, abs(best))
        if bound[order[pos]] < cut:
            break
        gs = order[pos : pos + step]
        gs = gs[bound[gs] >= cut]
        pos += step
        step *= 2
        if best > -np.inf and multi[gs].any():
            m = gs[multi[gs]]
            vb = _value_bounds(ctx, reps[m], rep_masks[m], bound[m])
            gs = np.concatenate([gs[~multi[gs]], m[vb >= cut]])
            if gs.size == 0:
                continue
        rows = np.flatnonzero(np.isin(grp, gs))
        p = ctx.pred.predict_best(masks[rows], known=known[rows], margin=ctx.tie_margin)
        value[rows], solo[rows] = p.value, p.standalone
        best = max(best, float(p.value.max()))
    i = ctx.choose(masks, value)
    return Found(masks[i].copy(), float(value[i]), float(solo[i]), masks.shape[0])


def _value_bounds(ctx: SearchContext, reps: np.ndarray, rep_masks: np.ndarray, solo_bound: np.ndarray) -> np.ndarray:
    """Upper bound of ``B̂(S, τ)`` over the Pareto variants of each count vector: per contending
    job (the same for every variant: contenders depend on the hosts used) a row taking on every
    host the option whose union with the job's GPUs there has the best stage-1 value bounds every
    variant's super-allocation capacity, and the contention formula grows with both bounds."""
    pred = ctx.pred
    cont = pred.contenders(rep_masks)
    ci, ji = np.nonzero(cont)
    if ci.size == 0:
        return solo_bound  # nobody contends: the value is the standalone value
    jobs = pred.job_masks
    rows = rep_masks[ci] | jobs[ji]
    r, h = np.nonzero(ctx.exposed[None, :] & (reps[ci] > 0) & (jobs[ji] != 0))
    if r.size:
        keys = np.column_stack([h, reps[ci[r], h], jobs[ji[r], h]])
        uk, inv = unique_rows(keys)
        best = np.empty(uk.shape[0], dtype=np.int64)
        for u, (hh, c, jm) in enumerate(uk.tolist()):
            opts = ctx.options(hh, c)
            best[u] = int(opts[np.argmax(ctx.stage1[hh, opts | jm])]) | jm
        rows[r, h] = best[inv]
    return pred.share(solo_bound, cont, ci, pred.raw(rows))


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
    # standalone bound first, super allocations only for candidates that can still win (the
    # same choice: up to 4,096 candidates x their contenders were otherwise all sent to the model)
    return ctx.best_of(ctx.enumerate(allowed(lo), coarse=True), max_pairs=PRUNE_PAIRS)


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
