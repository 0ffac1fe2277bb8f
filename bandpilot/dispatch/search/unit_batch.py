"""One model call for the domains whose in-domain search has a single candidate.

On an asymmetric model (a surrogate's stage 1 differs by which GPUs of a tray are free) a gang that
fits a domain is searched in every domain of its own kind: on 10,008 GPUs 107-139 searches, most
of them one candidate (the greedy fill: the domain's count vectors are too many to enumerate),
each a full pass through the contention predictor and the model - ~0.3 ms of overhead apiece, most
of a median select. Inside a domain nothing contends, so a candidate's value is its own standalone
value whichever rows share the call: the single candidates are priced together (each on its own
trays, up to :data:`BATCH_CELLS` row x tray cells per call). A domain with several candidates is
searched as before (batching those was slower: block-diagonal rows, 16,042 x ~600 cells instead
of x 18).
"""

from __future__ import annotations

from typing import Callable

import numpy as np

from bandpilot.dispatch.search.context import Found, SearchContext

#: Row x column cells of one batched call (int64: 16 MB).
BATCH_CELLS = 2_000_000


def best_each(ctx: SearchContext, groups: list[tuple[np.ndarray, np.ndarray]],
              best: Callable[[np.ndarray, np.ndarray], Found | None]) -> list[Found | None]:
    """Per group ``(masks, cols)`` - one domain's candidate rows on its own sorted trays, groups
    disjoint - the best: ``best(masks, cols)``, or for a lone candidate its value from one shared
    call (``best`` of one row is that row)."""
    out: list[Found | None] = [None] * len(groups)
    single = [i for i, (m, _) in enumerate(groups) if m.shape[0] == 1]
    for i, (m, c) in enumerate(groups):
        if m.shape[0] != 1 or len(single) < 2:
            out[i] = best(m, c) if m.shape[0] else None
    if len(single) < 2:
        return out
    start = 0
    while start < len(single):
        stop, width = start + 1, groups[single[start]][1].size
        while stop < len(single) and (stop + 1 - start) * (width + groups[single[stop]][1].size) <= BATCH_CELLS:
            width += groups[single[stop]][1].size
            stop += 1
        part = single[start:stop]
        cols = np.sort(np.concatenate([groups[i][1] for i in part]))
        rows = np.zeros((len(part), cols.size), dtype=np.int64)
        for r, i in enumerate(part):
            rows[r, np.searchsorted(cols, groups[i][1])] = groups[i][0][0]
        p = ctx.evaluate(rows, cols)
        for r, i in enumerate(part):
            mask = np.zeros(ctx.H, dtype=np.int64)
            mask[groups[i][1]] = groups[i][0][0]
            out[i] = Found(mask, float(p.value[r]), float(p.standalone[r]), 1)
        start = stop
    return out
