"""Re-pairing of spanning TP groups: two spanning groups trade their parts on two hosts.

When aligned room runs short the search cuts spanning TP groups from leftovers (4 + 4, 6 + 2, ...),
and which halves pair up sets the TP and PP figures (a 4 + 4 group in a rack runs at 3.5x a 7 + 1
one on the H100 fabric; a half beside a tenant drags its partner). No move of the other passes
re-pairs them in one step: a swap changes one rank (a 3 + 5 group on the way), a relocation needs a
unit with ``tp`` spare GPUs. Here the move is: spanning groups ``a`` and ``b``, hosts ``x`` (one of
``a``'s) and ``y`` (one of ``b``'s, ``y != x``) holding as many ranks of their group - ``a``'s ranks
on ``x`` and ``b``'s ranks on ``y`` trade GPUs, in order. Found on a busy tp=8,pp=4,dp=8 case,
where the gap benchmark's oracle re-paired 4 + 4 halves (TP 23.4 -> 24.9 GB/s, PP 6.8 -> 8.8).

Best-improvement rounds scored incrementally (:class:`shape_delta.MoveScorer`), under a budget of
model rows sent.
"""

from __future__ import annotations

import numpy as np

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.search.shape import Placement
from bandpilot.dispatch.search.shape_delta import MoveScorer
from bandpilot.dispatch.shape import Shape

#: Rounds at most, model rows sent in all (no round started past it), moves per round at most.
ROUNDS = 2
ROWS = 1500
MOVES = 32


def repair_moves(p: Placement, tp: int, cap: int = MOVES, slow: np.ndarray | None = None
                 ) -> tuple[np.ndarray, np.ndarray]:
    """Neighbours ``(hosts, idx)``, ``(M, k)`` each, ``M <= cap``: trades of equal-sized parts (a
    spanning TP group's ranks on one host) of two spanning groups on two different hosts; with
    ``slow`` (a figure per TP group, lower = slower), pairs holding the slowest group first."""
    k = p.hosts.size
    gh = p.hosts.reshape(-1, tp)
    span = np.flatnonzero(~(gh == gh[:, :1]).all(axis=1))
    if span.size < 2:
        return np.zeros((0, k), dtype=np.int64), np.zeros((0, k), dtype=np.int64)
    ranks = (span[:, None] * tp + np.arange(tp)).ravel()
    key = ranks // tp * (int(p.hosts.max()) + 1) + p.hosts[ranks]  # (group, host) of each rank
    parts, inv, size = np.unique(key, return_inverse=True, return_counts=True)
    group, host = parts // (int(p.hosts.max()) + 1), parts % (int(p.hosts.max()) + 1)
    members = [ranks[inv == j] for j in range(parts.size)]  # (ascending rank order within a part)
    a, b = np.triu_indices(parts.size, 1)
    ok = (group[a] != group[b]) & (host[a] != host[b]) & (size[a] == size[b])
    a, b = a[ok], b[ok]
    if slow is not None:
        o = np.lexsort((np.maximum(slow[group[a]], slow[group[b]]), np.minimum(slow[group[a]], slow[group[b]])))
        a, b = a[o], b[o]
    a, b = a[:cap], b[:cap]
    H, Ix = np.tile(p.hosts, (a.size, 1)), np.tile(p.idx, (a.size, 1))
    for m, (u, v) in enumerate(zip(a.tolist(), b.tolist())):
        ru, rv = members[u], members[v]
        H[m, ru], H[m, rv] = p.hosts[rv], p.hosts[ru]
        Ix[m, ru], Ix[m, rv] = p.idx[rv], p.idx[ru]
    return H, Ix


def refine_repair(pred: ContentionPredictor, shape: Shape, best: Placement, free: np.ndarray) -> Placement:
    """Best-improvement climbing over re-pairings (``best`` is scored; ``free`` unused: the GPU set
    does not change); at most :data:`ROUNDS` rounds, none started past :data:`ROWS` rows sent."""
    scorer: MoveScorer | None = None
    rows = 0
    for _ in range(ROUNDS):
        if rows >= ROWS:
            break
        base = scorer if scorer is not None else MoveScorer(pred, shape, best)
        H, Ix = repair_moves(best, shape.tp, MOVES, base.base["tp"]["value"] if "tp" in base.base else None)
        if not H.shape[0]:
            break
        scorer = base.best_move(H, Ix, best.label.split("+repaired")[0] + "+repaired")
        rows += base.rows_sent
        if scorer is None:
            break
        best = scorer.placement
    return best
