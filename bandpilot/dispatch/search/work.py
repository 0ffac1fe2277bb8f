"""How much model work may one decision spend? The bound on a search's cost that holds for every
``k`` and cluster state.

Work is counted in *model cells* (:attr:`~bandpilot.dispatch.contention.ContentionPredictor.cells`:
rows x host columns of every model call, super allocations included): what the model's time is
proportional to, whatever the cluster's width. The unit-level local search of a gang spanning
NVLink domains (:func:`bandpilot.dispatch.search.domains.cross_unit`) is the one part of a decision
whose batches grow with the state: on a half-busy 10,008-GPU cluster with its free GPUs scattered
over every domain, k = 4,096 spans 106 domains, a batch is ~35,000 moves of ~2,000 trays each, and
one decision spent 16 million cells (1.3 s CPU) for a pick 5 % above the Slurm-block-like
baseline's. Under :func:`work_limit` the predictor refuses any call that would pass the budget
(:class:`~bandpilot.dispatch.contention.WorkSpent`), so the cells spent after the seed batch (the
starts and the baseline's pick, priced in one call) never exceed :data:`WORK_CELLS`; the local
search keeps the best it priced.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np

from bandpilot.dispatch.baselines import block_select
from bandpilot.dispatch.search.context import Found, SearchContext
from bandpilot.topology.cluster import popcount

#: Model cells the unit-level local search of one decision may spend per cell of the baseline's own
#: scan (:func:`budget`); 0: no bound.
WORK_CELLS = 6
#: Cells of the local search's move sequences (moves x (used units + 1): what finds alike moves,
#: a round's largest cost), over every round of a decision, per cell of the baseline's scan; a
#: round past it builds the first moves in the screen's order (:func:`round_moves`). 0: no bound.
MOVE_CELLS = 6
#: Least budget (cells) of either kind: a small gang on a small cluster still gets a search.
MIN_CELLS = 100_000


def budget(ctx: Any, per: int) -> int:
    """Cells a decision may spend at ``per`` cells per cell of the Slurm-block-like baseline's own
    work on the same request - one scan of every host per block it fills (``ceil(k / largest
    domain)`` blocks): the bound grows with the gang and the cluster's width as the baseline's cost
    does, so the search stays within a fixed multiple of it. 0 when ``per`` <= 0 (no bound)."""
    if per <= 0:
        return 0
    size = int(np.bincount(ctx.spec.units[0], weights=ctx.spec.gpus_per_host).max())
    return max(MIN_CELLS, per * -(-ctx.k // size) * ctx.H)


def note(ctx: Any, **figures: float) -> None:
    """Record figures of this decision's work on the search context (:attr:`work`)."""
    got = getattr(ctx, "work", None)
    if got is None:
        got = ctx.work = {}
    got.update(figures)


@contextmanager
def work_limit(ctx: Any, cells: int) -> Iterator[None]:
    """The predictor of ``ctx`` refuses calls past ``cells`` more model cells inside the block (a
    tighter limit already set stays); ``cells`` <= 0: no bound. The cells spent inside are noted
    as ``search_cells``."""
    pred = ctx.pred
    if not hasattr(pred, "cell_limit"):  # a predictor that does not count cells
        yield
        return
    saved, start = pred.cell_limit, pred.cells
    if cells > 0:
        mine = start + int(cells)
        pred.cell_limit = mine if saved is None else min(saved, mine)
    try:
        yield
    finally:
        pred.cell_limit = saved
        note(ctx, search_cells=pred.cells - start)


def round_moves(ctx: Any, n: int, width: int) -> int:
    """How many of a round's ``n`` moves (in the order the screen prices them) it builds, at
    ``width`` cells each (the used units + 1: a move's sequence, which finds alike moves): all of
    them while the decision's move budget (:data:`MOVE_CELLS`, over every round) lasts, else as
    many as it has room for (none once spent: the local search ends). The moves cut are the ones
    the screen would have priced last."""
    cells = budget(ctx, MOVE_CELLS)
    if cells <= 0:
        return n
    left = cells - (getattr(ctx, "work", None) or {}).get("move_cells", 0)
    return min(n, max(0, left // max(width, 1)))


def charge_moves(ctx: Any, cells: int) -> None:
    """Count one round's ``cells`` of move rows (noted: their total and the largest round)."""
    got = getattr(ctx, "work", None) or {}
    note(ctx, move_cells=got.get("move_cells", 0) + int(cells), round_cells=max(got.get("round_cells", 0), int(cells)))


def spent(pred: Any) -> bool:
    """True when ``pred``'s cell limit leaves no room for another call."""
    limit = getattr(pred, "cell_limit", None)
    return limit is not None and pred.cells >= limit


def baseline_pick(ctx: SearchContext, index: Any, seg: int) -> np.ndarray | None:
    """The Slurm-block-like baseline's pick on this request (a full mask row), or None when it is
    not a valid answer here (a share of some domain not a multiple of the segment)."""
    mask = block_select(ctx.spec, ctx.free, ctx.k, None if seg <= 1 else seg)
    if int(popcount(mask).sum()) != ctx.k or np.any(mask & ~ctx.free):
        return None
    if seg > 1 and np.any(index.sum(popcount(mask)[None, :])[0] % seg):
        return None
    return mask


def floor(ctx: SearchContext, got: Found, base: np.ndarray | None) -> Found:
    """``got``, or the baseline's pick where that is predicted higher: the fragmentation and
    locality near-ties (:func:`bandpilot.dispatch.search.domains.choose`) and a local search cut
    short by :data:`WORK_CELLS` may land below it; a decision never does. Its value is the one
    the seed batch priced (noted ``base_value``), else one row (inside a domain: no contention)."""
    if base is None or np.array_equal(base, got.mask):
        return got
    seen = getattr(ctx, "work", None) or {}
    if "base_value" in seen:
        value, solo = seen["base_value"], seen["base_standalone"]
    else:
        cols = np.flatnonzero(base)
        p = ctx.pred.predict(base[cols][None, :], cols)
        value, solo = float(p.value[0]), float(p.standalone[0])
    if value <= got.value:
        return got
    return Found(base.copy(), value, solo, got.evaluated + 1)


def with_row(masks: np.ndarray, cols: np.ndarray, row: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Rows on ``cols`` plus one full row, all on the union of their columns."""
    new = np.union1d(cols, np.flatnonzero(row))
    out = np.zeros((masks.shape[0] + 1, new.size), dtype=np.int64)
    out[:-1, np.searchsorted(new, cols)] = masks
    out[-1] = row[new]
    return out, new
