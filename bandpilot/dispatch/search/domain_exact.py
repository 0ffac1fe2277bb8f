"""The exact oracle on NVLink-domain clusters: every in-unit count vector of every unit that can hold
the gang, certified against an upper bound on any allocation spanning several units (kept apart
from :mod:`bandpilot.dispatch.search.domains`, the search it scores)."""

from __future__ import annotations

import numpy as np

from bandpilot.dispatch.search.context import Found, IntractableError, SearchContext
from bandpilot.dispatch.search.count_vector import EXACT_LIMIT, exact
from bandpilot.dispatch.search.domains import Units, balanced, in_unit


def cross_domain_bound(model, spec, k: int) -> float:
    """Upper bound on the standalone bandwidth of any allocation of ``k`` GPUs spanning several
    units, for fabrics with the emulator's ``network`` (its scale-out term is maximised, for a given
    number of units, by a balanced split; the in-domain and stage-1 terms only lower it)."""
    unit, _ = spec.units
    U = int(unit.max()) + 1
    size = np.bincount(unit, weights=spec.gpus_per_host, minlength=U).astype(np.int64)
    best = 0.0
    for m in range(2, min(U, k) + 1):
        share = balanced(np.sort(size)[::-1][:m], k, 1)
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
            found = [f for f in (ctx.best_of(in_unit(ctx, units, int(u), exact=True)) for u in fits) if f is not None]
            best = ctx.pick(found)
            bound = cross_domain_bound(ctx.model, ctx.spec, ctx.k) if units.U > 1 else -np.inf
            if bound <= best.value:
                return best
            why = f"cross-domain allocations cannot be ruled out for k={ctx.k} ({bound:.1f} > {best.value:.1f} GB/s)"
    n = ctx.count_vectors(pareto=True)
    if n <= EXACT_LIMIT and n * ctx.H <= 64 * EXACT_LIMIT:  # small clusters: every count vector
        return exact(ctx)
    raise IntractableError(f"exact search is intractable here: {why}, and {n:.3g} count vectors over the cluster")
