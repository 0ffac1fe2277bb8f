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

from bandpilot.dispatch.search.context import Found, IntractableError, SearchContext

#: Candidates (count vectors x Pareto subset options) beyond which :func:`exact` refuses.
EXACT_LIMIT = 2_000_000


def count_search(ctx: SearchContext, allowed: np.ndarray | None = None, pareto: bool = False) -> Found | None:
    """Exhaustive batched evaluation of the symmetry-reduced count vectors."""
    masks = ctx.enumerate(allowed, pareto=pareto)
    return ctx.best_of(masks)


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
