"""Which candidates of a big local-search batch does the model see first? A screen.

The unit-level local search (:func:`bandpilot.dispatch.search.domains.cross_unit`) moves GPUs from
each of the ~30-57 domains a 2,048-4,096-GPU gang uses to every other one: ~1,000-4,500 candidates
per batch, 2,000-10,000 rows of ~1,000-2,000 trays with the contending jobs' super allocations. A
fabric prices them in milliseconds; a trained domain surrogate paid 0.4-7 s per select (10,008
GPUs; the eval budget was checked only between batches). A model that offers a cheap stand-in of
itself (``screening_model()``: the domain surrogate's own physics prior on per-unit count rows,
:class:`~bandpilot.model.prior_proxy.PriorProxy`) has every candidate ranked by the stand-in -
standalone: no super allocations, no tray rows - and the model prices the candidates best-ranked
first, :data:`SCREEN_TOP` at a time (then twice as many each time), until a chunk holds an
improvement or the eval budget is spent. The stand-in knows no contention: sending only its top
candidates stopped a 4,096-GPU search on a 50 %-busy state at 83 % of the exact path's pick (the
improving moves ranked lower), so a chunk without one is never the end of the batch. A batch of at
most :data:`SCREEN_TOP` candidates - and every batch of a model without a stand-in (a fabric) - is
priced whole, in one call: the exact path.
"""

from __future__ import annotations

from typing import Any, Callable

import numpy as np

from bandpilot.dispatch.search.context import SearchContext
from bandpilot.topology.cluster import dense_unique

#: Candidates of a batch the model prices first when it offers a screening model (then twice as
#: many at a time). Tuned on seed 0's states, checked on seed 1's (README, issue 24).
SCREEN_TOP = 64

#: ``screen(D, price, bar) -> (best Found or None, evaluations)``: the batch ``D`` of per-unit count
#: rows priced by ``price`` (rows -> the best of them) until one beats ``bar``.
Screen = Callable[[np.ndarray, Callable[[np.ndarray], Any], float], tuple[Any, int]]


def _whole(D: np.ndarray, price: Callable[[np.ndarray], Any], bar: float) -> tuple[Any, int]:
    got = price(D)
    return got, 0 if got is None else got.evaluated


def screen_for(ctx: SearchContext, units: Any, budget: int, top: int | None = None) -> Screen:
    """The screen of one unit-level search: with the model's ``screening_model()``, a batch of more
    than ``top`` candidates (default :data:`SCREEN_TOP`) is priced in the stand-in's order, chunk
    by chunk, until an improvement or ``budget`` model evaluations; else every batch at once.
    ``units``: the search's :class:`~bandpilot.dispatch.search.domains.Units` (where a unit's share
    of ``t`` GPUs goes)."""
    make = getattr(ctx.model, "screening_model", None)
    proxy = make() if callable(make) else None
    if proxy is None:
        return _whole
    first = SCREEN_TOP if top is None else int(top)

    def part(u: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        hosts, counts = units.part_hosts(u, t)
        return hosts, ctx.best_mask[hosts, counts]

    feats: dict = {}  # part features, shared by the search's batches

    def screen(D: np.ndarray, price: Callable[[np.ndarray], Any], bar: float) -> tuple[Any, int]:
        if D.shape[0] <= first:
            return _whole(D, price, bar)
        solo = proxy.predict_units(D, part, feats)
        order = np.argsort(-_shared(ctx.pred, D, solo, units), kind="stable")
        got, evaluated, pos, step = None, 0, 0, first
        while pos < order.size:
            # each chunk in the batch's own order (ties among its candidates decided as before)
            cand = price(D[np.sort(order[pos : pos + step])])
            pos, step = pos + step, 2 * step
            if cand is not None:
                evaluated += cand.evaluated
                if got is None or cand.value > got.value:
                    got = cand
            if (got is not None and got.value > bar) or ctx.pred.evaluations > budget:
                break
        return got, evaluated

    return screen


def _shared(pred: Any, D: np.ndarray, solo: np.ndarray, units: Any) -> np.ndarray:
    """The stand-in's values with a rough share under contention: a candidate whose trays hold
    contending jobs (the predictor's contenders: jobs on the exposed trays it uses) gets
    ``solo * solo / (solo + their demand)`` - the model's share with the capacity taken as the
    standalone value. Without it the stand-in ranked contended moves first on busy states."""
    if pred.n_jobs == 0:
        return solo
    r, u = np.nonzero(D)  # row-major: each row's parts together
    width = int(D.max(initial=0)) + 1
    code = u * width + D[r, u]
    keys, inv = dense_unique(code, D.shape[1] * width)
    words = (pred.n_jobs + 63) // 64
    bits = np.zeros((keys.size, words * 64), dtype=bool)
    for i, key in enumerate(keys.tolist()):
        hosts = np.sort(units.part_hosts(key // width, key % width)[0])
        if pred.exposed[hosts].any():
            bits[i, : pred.n_jobs] = pred.jobs_on(hosts).any(axis=1)
    packed = np.packbits(bits, axis=1).view(np.uint64)  # (parts, words)
    starts = np.flatnonzero(np.r_[True, r[1:] != r[:-1]])
    rows = np.zeros((D.shape[0], words), dtype=np.uint64)
    rows[r[starts]] = np.bitwise_or.reduceat(packed[inv], starts, axis=0)
    cont = np.unpackbits(rows.view(np.uint8), axis=1)[:, : pred.n_jobs].astype(bool)
    demand = cont.astype(float) @ pred.job_demand
    return np.where(demand > 0, solo * solo / (solo + demand), solo)
