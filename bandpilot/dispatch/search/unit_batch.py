"""One model call for the domains whose in-domain search has a single candidate.

On an asymmetric model (a surrogate's stage 1 differs by which GPUs of a tray are free) a gang that
fits a domain is searched in every domain of its own kind: on 10,008 GPUs 107-139 searches, most
of them one candidate (the greedy fill: the domain's count vectors are too many to enumerate),
each a full pass through the contention predictor and the model - ~0.3 ms of overhead apiece, most
of a median select. Inside a domain nothing contends, so a candidate's value is its own standalone
value whichever rows share the call: the single candidates are priced together (each on its own
trays, up to :data:`BATCH_CELLS` row x tray cells per call). A domain with several candidates is
searched as before (batching those was slower: block-diagonal rows, 16,042 x ~600 cells instead
of x 18), except that a few consecutive ones share a call while the block rows stay within
:data:`SEVERAL_CELLS` (the per-call overhead is the larger cost there: tuning states, k = 1-72, CPU
753-786 -> 627-650 ms over 32 selects, the same picks).
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from bandpilot.dispatch.contention import ContentionPredictor, Prediction
from bandpilot.dispatch.search.context import Found, SearchContext

#: Row x column cells of one batched call. The block rows' cells grow with the square of the
#: domains in a call (139 lone rows x 2,502 trays at 2,000,000); tuning states, k = 1-72 on the
#: bench's 4 states: CPU 551-579 ms at 2,000,000, 499-543 at 40,000; held-out states: 472-518 ->
#: 454-468. Values are the same at any size (in-domain rows never contend).
BATCH_CELLS = 40_000
#: Row x column cells of a call shared by domains with several candidates each.
SEVERAL_CELLS = 20_000


def best_each(ctx: SearchContext, groups: list[tuple[np.ndarray, np.ndarray]],
              best: Callable[[np.ndarray, np.ndarray], Found | None]) -> list[Found | None]:
    """Per group ``(masks, cols)`` - one domain's candidate rows on its own sorted trays, groups
    disjoint - the best: ``best(masks, cols)``, or for a lone candidate its value from one shared
    call (``best`` of one row is that row)."""
    out: list[Found | None] = [None] * len(groups)
    single = [i for i, (m, _) in enumerate(groups) if m.shape[0] == 1]
    if len(single) < 2:
        single = []
    _several(ctx, groups, [i for i, (m, _) in enumerate(groups) if m.shape[0] > 1 or (m.shape[0] == 1 and not single)],
             best, out)
    if not single:
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


def _several(ctx: SearchContext, groups: list[tuple[np.ndarray, np.ndarray]], todo: list[int],
             best: Callable[..., Found | None], out: list[Found | None]) -> None:
    """Groups ``todo`` priced a few at a time: consecutive groups share one call while rows x
    columns stay within :data:`SEVERAL_CELLS` (block rows: each on its own domain's trays, so
    the same standalone values), then each group's best is chosen on its own rows."""
    start = 0
    while start < len(todo):
        stop = start + 1
        n, w = groups[todo[start]][0].shape[0], groups[todo[start]][1].size
        while stop < len(todo):
            m, c = groups[todo[stop]]
            if (n + m.shape[0]) * (w + c.size) > SEVERAL_CELLS:
                break
            n, w, stop = n + m.shape[0], w + c.size, stop + 1
        part = todo[start:stop]
        start = stop
        if len(part) == 1:
            out[part[0]] = best(*groups[part[0]])
            continue
        cols = np.sort(np.concatenate([groups[i][1] for i in part]))
        rows = np.zeros((n, cols.size), dtype=np.int64)
        r0 = np.cumsum([0] + [groups[i][0].shape[0] for i in part])
        for j, i in enumerate(part):
            rows[r0[j] : r0[j + 1], np.searchsorted(cols, groups[i][1])] = groups[i][0]
        p = ctx.evaluate(rows, cols)
        for j, i in enumerate(part):
            sl = slice(r0[j], r0[j + 1])
            out[i] = best(groups[i][0], groups[i][1], Prediction(p.value[sl], p.standalone[sl]))


def unit_bounds(ctx: SearchContext, units: Any, us: list[int]) -> np.ndarray | None:
    """Per unit of ``us`` an upper bound on the value of any ``k``-GPU candidate inside it, when the
    model certifies one (``inside_bound``: rows over >= 2 of its trays) and prices single-tray rows
    by stage 1 (<= ``ctx.best_val``); None otherwise, or for gangs larger than a tray (the bound's
    patterns grow with ``k``; the many-domain searches are those of k = 1-4)."""
    hook = getattr(ctx.model, "inside_bound", None)
    if hook is None or type(ctx.pred) is not ContentionPredictor or ctx.k > ctx.G:
        return None
    multi = hook(np.asarray(us, dtype=np.int64), ctx.k)
    if multi is None:
        return None
    single = np.array([ctx.best_val[units.members[u], ctx.k].max() for u in us])  # -inf: no tray fits k
    return np.maximum(multi, single)


def best_each_bounded(ctx: SearchContext, units: Any, us: list[int], make: Callable[[int], tuple[np.ndarray, np.ndarray]],
                      best: Callable[..., Found | None], margin: float) -> list[Found | None]:
    """:func:`best_each` of the groups ``make(u)`` of the units ``us``, skipping the units whose
    bound (:func:`unit_bounds`) is below the best found in the unit of the highest bound, less the
    chooser's near-tie margin: none of their candidates could be chosen (near-ties are within
    ``margin`` of the best), so the result is the same; skipped units give None.
    On the 10,008-GPU trained model (tuning states, k = 2 / 4) 1-3 of 78-139 domains are within 0.5 % of
    the best."""
    bound = unit_bounds(ctx, units, us)
    if bound is None or len(us) < 2:
        return best_each(ctx, [make(u) for u in us], best)
    top = int(np.argmax(bound))
    out: list[Found | None] = [None] * len(us)
    out[top] = best(*make(us[top]))
    keep = [i for i in range(len(us)) if i != top]
    if out[top] is not None:
        v = out[top].value
        keep = [i for i in keep if bound[i] >= v - max(margin * abs(v), 1e-9)]
    for i, got in zip(keep, best_each(ctx, [make(us[i]) for i in keep], best)):
        out[i] = got
    return out
