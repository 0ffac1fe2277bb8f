"""Which search answers a request? The ``bandpilot`` product algorithm: count-vector search when
tractable, else EHA + coarse count-vector search + PTS, then local search.

:func:`bandpilot` runs :func:`count_search` whenever the number of count
vectors after symmetry reduction is <= :data:`COUNT_SEARCH_LIMIT` (with the Pareto subsets of
exposed hosts too when that still fits). It subsumes EHA's candidates and dominates PTS under a
monotone model - the paper's EHA+PTS guided by the *true* bandwidth only reaches ~89 % of the
optimum on heterogeneous hosts. Beyond the limit: EHA + :func:`coarse_count_search` (count
vectors over host classes that ignore contention exposure, counts placed on the least-contended
hosts, over the best-ranked hosts that keep it <= :data:`COARSE_SEARCH_LIMIT`) + PTS from a
truncated start set, then a batched local search over count vectors (move 1, 2 or all GPUs of
one host to another host).
"""

from __future__ import annotations

import numpy as np

from bandpilot.dispatch.search.context import Found, SearchContext
from bandpilot.dispatch.search.count_vector import coarse_count_search, count_search
from bandpilot.dispatch.search.domains import domain_search
from bandpilot.dispatch.search.eha import eha
from bandpilot.dispatch.search.local import local_search
from bandpilot.dispatch.search.pts import pts

#: Count vectors (after symmetry reduction) the ``bandpilot`` algorithm evaluates exhaustively.
COUNT_SEARCH_LIMIT = 20_000
#: Coarse count vectors (exposure ignored) the fallback evaluates (host prefix shrunk to fit).
COARSE_SEARCH_LIMIT = 4_096


def bandpilot(ctx: SearchContext) -> Found:
    """The product search: exhaustive count-vector search when tractable, else the hybrid; on
    clusters with NVLink domains the hierarchical :func:`domain_search`."""
    if ctx.spec.nvlink_domains:
        return domain_search(ctx, segment=ctx.segment, **({} if ctx.tie is None else {"tie": ctx.tie}))
    if ctx.count_bound() <= COUNT_SEARCH_LIMIT or ctx.count_vectors() <= COUNT_SEARCH_LIMIT:
        # On hosts exposed to contending jobs also try the Pareto subsets (stage-1 of the subset
        # vs. of its unions with the jobs' GPUs) when that keeps the space within the limit.
        pareto = (ctx.count_bound(pareto=True) <= COUNT_SEARCH_LIMIT
                  or ctx.count_vectors(pareto=True) <= COUNT_SEARCH_LIMIT)
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

