"""Local refinement of the shape search's pick: swap moves, scored in batches under a row budget.

The unit orders of :mod:`bandpilot.dispatch.search.shape_units` choose *how many* TP groups each unit
takes and cut them in GPU-id order; they never try which GPUs of a host pair up in a TP group, which
leftover GPUs a spanning group takes, or which TP groups are DP / PP partners. Measured tables price
all three (a measured intra table is per GPU subset, the inter table per count pattern), so the pick
is refined by first-improvement rounds over three kinds of move, all scored by the same model:

* **swap**: two ranks of different TP groups trade GPUs (changes TP, DP and PP membership);
* **replace**: a rank moves to a free GPU the job does not use (changes the GPU set);
* **regroup**: two TP groups trade places (changes which groups are DP / PP partners).

With the TP rule in force (the pick keeps every TP group inside a unit) only moves that keep it are
tried. When there are more moves than :data:`ROWS` allows, a seeded sample is scored.
"""

from __future__ import annotations

import numpy as np

from bandpilot.dispatch.contention import ContentionPredictor
from bandpilot.dispatch.search.shape import Placement, group_ranks, score
from bandpilot.dispatch.search.shape_delta import MoveScorer
from bandpilot.dispatch.shape import Shape
from bandpilot.topology.cluster import popcount

#: Model rows per refinement round (each neighbour costs about two rows per multi-host group).
#: Measured (``python -m benchmarks shape``, 3 state sets of the h100-16m tables; CPU time per select on
#: nvl72x16): no refinement 19.9 % below blind (true), p50 8.9 ms; 1,500 rows x 1 round 21.6 %,
#: p50 14.6 ms; x 2 rounds 22.1 %, p50 19.9 ms, p99 2.5x; 3,000 x 3 rounds 22.3 %, p50 37.5 ms.
ROWS = 1500
#: Rounds at most (each keeps the best neighbour if it is predicted faster).
ROUNDS = 1
#: Smallest share of the moves a round scores; below it (large jobs on large clusters) there is no
#: refinement: on nvl72x16 (1,152 GPUs, k 64-256) the sampled rounds gained nothing true and cost
#: p50 +6 ms CPU per select.
COVER = 0.05


def _moves(p: Placement, free: np.ndarray, shape: Shape, unit: np.ndarray, bits: int, cap: int,
           rng: np.random.Generator, cover: float = COVER) -> tuple[np.ndarray, np.ndarray]:
    """Neighbours' ``(hosts, idx)``, ``(M, k)`` each, ``M <= cap`` (a seeded sample when there are
    more moves; none when ``cap`` is under :data:`COVER` of them): swaps, replacements, regroupings. Moves are listed as index pairs and only the
    sampled ones are built (k = 256 has 32,640 swaps)."""
    k, tp = shape.k, shape.tp
    h0, i0 = p.hosts, p.idx
    used = np.zeros_like(free)
    np.bitwise_or.at(used, h0, np.int64(1) << i0)
    spare = free & ~used
    rule = bool(tp_aligned(h0[None, :], unit, tp)[0])  # the TP rule: keep every TP group inside its unit
    if cap < cover * _n_moves(h0, spare, unit, tp, rule):  # too thin a sample of a big job's moves
        return np.zeros((0, k), dtype=np.int64), np.zeros((0, k), dtype=np.int64)
    g = np.arange(k) // tp
    a, b = np.triu_indices(k, 1)
    a, b = a[g[a] != g[b]], b[g[a] != g[b]]
    fh, fi = np.nonzero((spare[:, None] >> np.arange(bits)) & 1)
    r, s = np.repeat(np.arange(k), fh.size), np.tile(np.arange(fh.size), k)
    x, y = np.triu_indices(k // tp, 1)
    if rule:
        a, b = a[unit[h0[a]] == unit[h0[b]]], b[unit[h0[a]] == unit[h0[b]]]
        r, s = r[unit[h0[r]] == unit[fh[s]]], s[unit[h0[r]] == unit[fh[s]]]
    kind = np.concatenate([np.zeros(a.size, int), np.ones(r.size, int), np.full(x.size, 2)])
    u = np.concatenate([a, r, x])
    v = np.concatenate([b, s, y])
    if kind.size > cap:
        pick = np.sort(rng.choice(kind.size, size=cap, replace=False))
        kind, u, v = kind[pick], u[pick], v[pick]
    M = kind.size
    perm = np.tile(np.arange(k), (M, 1))
    rows = np.arange(M)
    sw = kind == 0  # swap ranks u, v
    perm[rows[sw], u[sw]], perm[rows[sw], v[sw]] = v[sw], u[sw]
    rg = np.flatnonzero(kind == 2)  # regroup: TP groups u, v trade places
    for t in range(tp):
        perm[rg, u[rg] * tp + t], perm[rg, v[rg] * tp + t] = v[rg] * tp + t, u[rg] * tp + t
    H, Ix = h0[perm], i0[perm]
    rp = np.flatnonzero(kind == 1)  # replace rank u by spare GPU v
    H[rp, u[rp]], Ix[rp, u[rp]] = fh[v[rp]], fi[v[rp]]
    return H, Ix


def _n_moves(h0: np.ndarray, spare: np.ndarray, unit: np.ndarray, tp: int, rule: bool) -> int:
    """How many moves :func:`_moves` lists, counted without listing them."""
    k, G = h0.size, h0.size // tp
    pairs = G * (G - 1) // 2 * tp * tp  # rank pairs in different TP groups
    n_spare = popcount(spare)
    if not rule:
        return pairs + k * int(n_spare.sum()) + G * (G - 1) // 2
    U = int(unit.max()) + 1
    per_u = np.bincount(unit[h0], minlength=U)  # ranks per unit (whole TP groups, by the rule)
    same = int((per_u * (per_u - 1) // 2).sum()) - G * tp * (tp - 1) // 2
    spare_u = np.bincount(unit, weights=n_spare, minlength=U).astype(np.int64)
    return same + int((per_u * spare_u).sum()) + G * (G - 1) // 2


def tp_aligned(H: np.ndarray, unit: np.ndarray, tp: int) -> np.ndarray:
    """Per placement row: does every TP group sit inside one unit (host or NVLink domain)?"""
    u = unit[H].reshape(H.shape[0], -1, tp)
    return (u == u[:, :, :1]).all(axis=(1, 2))


def best_move(pred: ContentionPredictor, shape: Shape, best: Placement, H: np.ndarray, Ix: np.ndarray,
              label: str | None = None) -> Placement | None:
    """The fastest of the moved placements (H, Ix), scored, if predicted faster than ``best``; None at a
    local optimum. Every refinement pass (local, non-local, the gap benchmark's climb) ends its round here."""
    cands = [Placement(H[j], Ix[j], label=best.label if label is None else label) for j in range(H.shape[0])]
    score(pred, shape, cands)
    top = min(cands, key=lambda c: c.step_ms)
    return top if top.step_ms < best.step_ms * (1 - 1e-9) else None


def refine(pred: ContentionPredictor, shape: Shape, best: Placement, free: np.ndarray, seed: int = 0) -> Placement:
    """``best`` or a neighbour predicted faster, after at most :data:`ROUNDS` rounds (``best`` is scored)."""
    unit = pred.spec.units[0]
    rows_each = 2 * sum(gr.shape[0] for gr in group_ranks(shape).values())
    cap = max(ROWS // max(rows_each, 1), 1)
    rng = np.random.default_rng(seed)
    bits = int(pred.spec.gpus_per_host.max())
    scorer: MoveScorer | None = None
    for _ in range(ROUNDS):
        H, Ix = _moves(best, free, shape, unit, bits, cap, rng)
        if not H.shape[0]:
            break
        # scored by the groups a move touches (the full re-score's figures, see shape_delta); the
        # winner's scorer is the next round's base
        scorer = scorer if scorer is not None else MoveScorer(pred, shape, best)
        scorer = scorer.best_move(H, Ix, best.label.split("+refined")[0] + "+refined")
        if scorer is None:
            break
        best = scorer.placement
    return best
