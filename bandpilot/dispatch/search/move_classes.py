"""One unit move per class of interchangeable moves: a no-improvement round of the unit-level local
search (:func:`bandpilot.dispatch.search.domains.cross_unit`) no longer prices thousands of moves.

On 10,008 GPUs a 4,096-GPU gang's round held 5,077 moves (a 50 %-busy state; 10,123 rows with the
super allocations) and rounds of 2,048-GPU gangs 900-3,300, most of them keeping the start's value:
a round without an improvement was priced to the end (the "~1,000 evaluations" target missed on
8 of 9 states, ``python -m benchmarks scale``). Most of those moves are the same move on alike domains.

Why one move per class is exact. A move changes two units of the count row ``d``: ``a`` gives
``t`` GPUs to ``b``. Every unit's part is a function of the unit's fill table only (its free trays
in fill order, :func:`bandpilot.dispatch.search.unit_rows.part_table`), and a row's value is a
function of its mask, its contending jobs and their masks (:mod:`bandpilot.dispatch.contention`).
Call two units *alike* when their free trays, in fill order, have the same tray class (GPU type,
free count, best stage-1 values: ``SearchContext.scls``), exposure and best masks per count - their
parts for any count are then the same masks on relabelled trays - and neither holds a GPU of a job
that contends with any row of the round (then no row's contender set or super allocation sees which
of the two a part is in). Moves whose changed units are pairwise alike with the same old and new
counts are the same row up to swapping alike units (the other units are unchanged and equal), so a
model symmetric under that swap - the emulator: domains of one spec on a flat rail-optimised
fabric - gives them the same value, and :func:`~bandpilot.dispatch.search.domains.choose` the
same fragmentation keys (free GPUs, units, trays); it picks the lowest index among equals, which is
the class's first move, the one kept. Units holding a possible contender's GPUs keep a class of
their own, so the reduction never merges moves whose contention could differ.

The assumption is the search's own (:meth:`Units.signature`: alike units are interchangeable), made
stricter here (best masks, contenders). A model with a cheap stand-in (a trained surrogate, whose
per-tray tokens may tell trays apart) keeps every move: :data:`MOVE_CLASSES` applies to models
without one (the fabric path of :func:`~bandpilot.dispatch.search.screen.screen_for`).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from bandpilot.dispatch.search import unit_rows

#: Price one unit move per class of interchangeable moves (see the module docstring) for models
#: without a screening stand-in; False: every move (``bench_scale --move-classes 0``).
MOVE_CLASSES = True


def applies(ctx: Any) -> bool:
    """Whether the reduction is on for this search's model (a stand-in's model keeps every move)."""
    make = getattr(ctx.model, "screening_model", None)
    return MOVE_CLASSES and not (callable(make) and make() is not None)


def unit_classes(units: Any, d: np.ndarray, u: np.ndarray, new: np.ndarray) -> np.ndarray:
    """(U,) int: equal ids for alike units (module docstring) among the units the moves change
    (-1 elsewhere: never compared). The moves from ``d`` as their changed cells: unit ``u`` gets
    ``new`` GPUs. Units holding a GPU of a job that some part of the round touches get an id of
    their own."""
    ctx, pred = units.ctx, units.ctx.pred
    order, _, _, _, n = unit_rows.fill_table(units)
    hot = np.zeros(units.U, dtype=bool)
    if pred.n_jobs:
        # every (unit, count) part of the round - ``d``'s and the changed cells' (a row equals ``d``
        # elsewhere) - and the jobs they touch: every row's possible contenders (a superset)
        du = np.flatnonzero(d)
        w = int(max(d.max(initial=0), new.max(initial=0))) + 1
        pairs = np.unique(np.concatenate([du * w + d[du], u * w + new]))  # new = 0: no part (pair t = 0)
        ptr, hosts, _ = units.parts(pairs // w, pairs % w)
        jobs = pred.jobs_of_parts(ptr, hosts).any(axis=0)
        # their units, from the predictor's sparse host -> job incidence (every host of a contending-
        # capable job is in it), not a dense job x host matrix (25,002 hosts at 100,008 GPUs)
        hot[units.unit[pred.hosts_of_jobs(jobs)]] = True
    ids: dict[tuple, int] = {}
    out = np.full(units.U, -1, dtype=np.int64)
    # only the changed units: a Python key per unit (1,389 units per round at 100,008 GPUs otherwise)
    for x in np.unique(u).tolist():
        hs = order[x, : n[x]]
        if hot[x]:
            key: tuple = ("hot", x)
        else:
            key = (bool(units.is_nvl[x]), int(units.size[x]), ctx.scls[hs].tobytes(), ctx.exposed[hs].tobytes(),
                   ctx.best_mask[hs].tobytes())
        out[x] = ids.setdefault(key, len(ids))
    return out


def one_per_class(units: Any, D: np.ndarray, d: np.ndarray) -> np.ndarray:
    """Indices (ascending) of the first move of each class of ``D`` (rows of moves from ``d``): a
    move's class is the multiset of (unit class, old count, new count) over the units it changes."""
    if D.shape[0] <= 1:
        return np.arange(D.shape[0])
    # the columns a move can change (a row is ``d`` elsewhere): 1,389 columns at 100,008 GPUs, ~70 used
    cols = np.flatnonzero(D.any(axis=0) | (d > 0))
    r, c = np.nonzero(D[:, cols] != d[cols][None, :])
    u, new = cols[c], D[r, cols[c]]
    cls = unit_classes(units, d, u, new)
    w = int(max(new.max(initial=0), d.max(initial=0))) + 1
    code = (cls[u] * w + d[u]) * w + new + 1  # > 0: 0 pads rows with fewer changed units
    width = int(np.bincount(r, minlength=D.shape[0]).max(initial=0))
    seq = np.zeros((D.shape[0], max(width, 1)), dtype=np.int64)
    pos = np.arange(r.size) - np.searchsorted(r, r)  # r ascends (row-major nonzero)
    seq[r, pos] = code
    return unit_rows.first_rows(np.sort(seq, axis=1))
