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

from bandpilot.dispatch.contention import WorkSpent
from bandpilot.dispatch.search.context import SearchContext
from bandpilot.model.unit_grid import Changed, changed_parts

#: Candidates of a batch the model prices first when it offers a screening model (then twice as
#: many at a time). Tuned on one set of states, checked on a held-out set (``python -m benchmarks scale``).
SCREEN_TOP = 64

#: Candidates of one batch a screened search prices at most (its stand-in's best-ranked: the first
#: three chunks, 64 + 128 + 256; 0: every candidate until an improvement, the exact screen,
#: `bench_scale --screen-max 0`). Not certified: a batch with no improvement among them ends the
#: search there, though a lower-ranked move might have improved (the stand-in ranks without the
#: model's residual). The default because it kept the picks: same mask and value on 359 of 360
#: selects of a trained 10,008-GPU model (4 tuning and 2 held-out state sets; the other one the
#: same true bandwidth) and on 180 of 180 of 3 more held-out sets, with CPU p99 down by a quarter to
#: a third (``python -m benchmarks scale``) - as ``FABRIC_FIRST`` below. Why it pays: the slowest selects are
#: their last round, ~2,000 candidates priced to confirm that none improves.
SCREEN_MAX = 448

#: For a model without a stand-in (a fabric): its batches priced in their own order, this many
#: candidates first (then twice as many at a time), until a chunk holds an improvement; 0: every batch
#: whole (the exact path, `bench_scale --fabric-first 0`). Not certified (a later chunk may hold a
#: better move), but the same picks (mask and value) as whole batches on 540 of 540 selects
#: (10,008 GPUs, idle and 30-70 % busy, k = 1..4,096; 5 tuning, then 4 held-out state sets) with CPU p99
#: lower on every set, hence the default. Where it pays: a 4,096-GPU select on a 50 %-busy
#: state, 5,077 moves of which 4,166 keep the start's value (capped by one contending job on a used
#: domain) and all 25 improving ones (4 GPUs off that domain) tie; whole 10,136 evaluations / 0.89 s
#: CPU, 64-first 3,963 / 87 ms. A batch with no improvement is priced to the end either way.
FABRIC_FIRST = 64

#: ``screen(D, price, bar) -> (best Found or None, evaluations)``: the batch ``D`` of per-unit count
#: rows priced by ``price`` (rows -> the best of them) until one beats ``bar``.
Screen = Callable[[np.ndarray, Callable[[np.ndarray], Any], float], tuple[Any, int]]


def _whole(D: np.ndarray, price: Callable[[np.ndarray], Any], bar: float) -> tuple[Any, int]:
    try:
        got = price(D)
    except WorkSpent:  # the decision's work budget cannot price this batch: nothing from it
        return None, 0
    return got, 0 if got is None else got.evaluated


def _room(pred: Any, step: int, per: float) -> int:
    """``step`` clipped to the candidates the predictor's cell limit still has room for, at ``per``
    cells a candidate (the last chunk's; 0: not known yet); 0 when none fits."""
    limit = getattr(pred, "cell_limit", None)
    if limit is None:
        return step
    left = limit - pred.cells
    if left <= 0:
        return 0
    return step if per <= 0 else max(1, min(step, int(left // per)))


def in_order(first: int, pred: Any = None) -> Screen:
    """Batches priced in their own order, ``first`` candidates then twice as many at a time, until a
    chunk holds a candidate above the bar (else to the end, or until ``pred``'s cell limit: a
    chunk is clipped to the room left, and one the limit refuses ends the batch); the best priced
    and the evaluations."""

    def screen(D: np.ndarray, price: Callable[[np.ndarray], Any], bar: float) -> tuple[Any, int]:
        got, evaluated, pos, step, per = None, 0, 0, max(int(first), 1), 0.0
        while pos < D.shape[0]:
            take = step if pred is None else _room(pred, step, per)
            if take == 0:
                break
            before = 0 if pred is None else pred.cells
            try:
                cand = price(D[pos : pos + take])
            except WorkSpent:
                break
            if pred is not None:
                per = max(per, (pred.cells - before) / min(take, D.shape[0] - pos))
            pos, step = pos + take, 2 * step
            if cand is not None:
                evaluated += cand.evaluated
                if got is None or cand.value > got.value:
                    got = cand
            if got is not None and got.value > bar:
                break
        return got, evaluated

    return screen


def screen_for(ctx: SearchContext, units: Any, budget: int, top: int | None = None) -> Screen:
    """The screen of one unit-level search: with the model's ``screening_model()``, a batch of more
    than ``top`` candidates (default :data:`SCREEN_TOP`) is priced in the stand-in's order, chunk
    by chunk, until an improvement or ``budget`` model evaluations; else every batch at once.
    ``units``: the search's :class:`~bandpilot.dispatch.search.domains.Units` (where a unit's share
    of ``t`` GPUs goes)."""
    make = getattr(ctx.model, "screening_model", None)
    proxy = make() if callable(make) else None
    if proxy is None:
        return _whole if FABRIC_FIRST <= 0 else in_order(FABRIC_FIRST, ctx.pred)
    first = SCREEN_TOP if top is None else int(top)

    def part(u: int, t: int) -> tuple[np.ndarray, np.ndarray]:
        hosts, counts = units.part_hosts(u, t)
        return hosts, ctx.best_mask[hosts, counts]

    def parts(us: np.ndarray, ts: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        ptr, hosts, counts = units.parts(us, ts)  # part_hosts of every pair at once (the same trays)
        return ptr, hosts, ctx.best_mask[hosts, counts]

    feats: dict = {}  # part features, shared by the search's batches

    def screen(D: np.ndarray, price: Callable[[np.ndarray], Any], bar: float) -> tuple[Any, int]:
        if D.shape[0] <= first:
            return _whole(D, price, bar)
        ch = changed_parts(D)  # the cells the moves changed: one pass for the stand-in and the contenders
        solo = proxy.predict_units(D, part, feats, parts=parts, changed=ch)
        order = np.argsort(-_shared(ctx.pred, D, solo, units, ch), kind="stable")
        got, evaluated, pos, step, per = None, 0, 0, first, 0.0
        while pos < order.size:
            take = _room(ctx.pred, step, per)
            if take == 0:
                break
            before = ctx.pred.cells
            try:
                # each chunk in the batch's own order (ties among its candidates decided as before)
                cand = price(D[np.sort(order[pos : pos + take])])
            except WorkSpent:
                break
            per = max(per, (ctx.pred.cells - before) / order[pos : pos + take].size)
            pos, step = pos + take, 2 * step
            if cand is not None:
                evaluated += cand.evaluated
                if got is None or cand.value > got.value:
                    got = cand
            if (got is not None and got.value > bar) or ctx.pred.evaluations > budget or 0 < SCREEN_MAX <= pos:
                break
        return got, evaluated

    return screen


def _shared(pred: Any, D: np.ndarray, solo: np.ndarray, units: Any, changed: Changed | None = None) -> np.ndarray:
    """The stand-in's values with a rough share under contention: a candidate whose trays hold
    contending jobs (the predictor's contenders: jobs on the exposed trays it uses) gets
    ``solo * solo / (solo + their demand)`` - the model's share with the capacity taken as the
    standalone value. Without it the stand-in ranked contended moves first on busy states."""
    if pred.n_jobs == 0:
        return solo
    demand = _contended(pred, D, units, changed).astype(float) @ pred.job_demand
    return np.where(demand > 0, solo * solo / (solo + demand), solo)


def _part_jobs(pred: Any, units: Any, u: np.ndarray, t: np.ndarray) -> np.ndarray:
    """(parts, n_jobs) bool: the contending jobs on the trays of each part (unit ``u``, ``t`` GPUs;
    ``t`` = 0, a unit a move emptied: no part, no jobs) - all parts at once, not one
    ``part_hosts`` + ``jobs_on`` call per part (~200 per batch)."""
    ptr, hosts, _ = units.parts(u, t)
    return pred.jobs_of_parts(ptr, hosts)


def _contended(pred: Any, D: np.ndarray, units: Any, changed: Changed | None = None) -> np.ndarray:
    """(rows, n_jobs) bool: the jobs some part of each row touches. A local-search batch's rows
    equal its first row but in the one or two units a move changed, so each row's count of parts
    per job is the first row's, less the changed units' old parts, plus their new ones - no pass
    over every nonzero cell (the same booleans as OR-ing every nonzero cell's part). ``changed``:
    :func:`changed_parts` of ``D`` (the stand-in's, computed once per batch)."""
    if D.shape[0] == 0:
        return np.zeros((0, pred.n_jobs), dtype=bool)
    ch = changed_parts(D) if changed is None else changed
    ref, r, c, ru, width, inv = ch.ref, ch.r, ch.c, ch.ru, ch.width, ch.inv
    bits = _part_jobs(pred, units, ch.keys // width, ch.keys % width).astype(np.int32)
    at = np.zeros(D.shape[1], dtype=np.int64)
    at[ru] = inv[: ru.size]
    cnt = np.tile(bits[inv[: ru.size]].sum(axis=0), (D.shape[0], 1))
    if r.size:
        # old part out, new part in, per changed cell (a cell emptied holds no part: no jobs)
        new = np.zeros((r.size, pred.n_jobs), dtype=np.int32)
        new[ch.live] = bits[inv[ru.size :]]
        delta = new - np.where((ref[c] > 0)[:, None], bits[at[c]], 0)
        # r ascends (row-major): the i-th change of every row at once, a row at most once
        # per pass (a row changes <= 4 cells; np.add.reduceat over ~8,000 x jobs cost ~3 ms a batch)
        pos = np.arange(r.size) - np.r_[0, np.cumsum(np.bincount(r, minlength=D.shape[0]))[:-1]][r]
        for i in range(int(pos.max()) + 1):
            sel = pos == i
            cnt[r[sel]] += delta[sel]
    return cnt > 0

