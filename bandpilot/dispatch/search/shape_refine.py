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
from bandpilot.dispatch.shape import Shape

#: Model rows per refinement round (each neighbour costs about two rows per multi-host group).
#: Measured (``python -m benchmarks shape``, 3 seeds of the h100-16m tables; CPU time per select on
#: nvl72x16): no refinement 19.9 % below blind (true), p50 8.9 ms; 1,500 rows x 1 round 21.6 %,
#: p50 14.6 ms; x 2 rounds 22.1 %, p50 19.9 ms, p99 2.5x; 3,000 x 3 rounds 22.3 %, p50 37.5 ms.
ROWS = 1500
#: Rounds at most (each keeps the best neighbour if it is predicted faster).
ROUNDS = 1


def _moves(p: Placement, free: np.ndarray, shape: Shape, unit: np.ndarray, bits: int, cap: int,
           rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Neighbours' ``(hosts, idx)``, ``(M, k)`` each, ``M <= cap`` (a seeded sample when there are
    more moves): swaps, replacements, regroupings. Moves are listed as index pairs and only the
    sampled ones are built (k = 256 has 32,640 swaps)."""
    k, tp = shape.k, shape.tp
    h0, i0 = p.hosts, p.idx
    g = np.arange(k) // tp
    a, b = np.triu_indices(k, 1)
    a, b = a[g[a] != g[b]], b[g[a] != g[b]]
    used = np.zeros_like(free)
    np.bitwise_or.at(used, h0, np.int64(1) << i0)
    fh, fi = np.nonzero(((free & ~used)[:, None] >> np.arange(bits)) & 1)
    r, s = np.repeat(np.arange(k), fh.size), np.tile(np.arange(fh.size), k)
    x, y = np.triu_indices(k // tp, 1)
    if _aligned(h0[None, :], unit, tp)[0]:  # the TP rule: keep every TP group inside its unit
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


def _aligned(H: np.ndarray, unit: np.ndarray, tp: int) -> np.ndarray:
    u = unit[H].reshape(H.shape[0], -1, tp)
    return (u == u[:, :, :1]).all(axis=(1, 2))


def refine(pred: ContentionPredictor, shape: Shape, best: Placement, free: np.ndarray, seed: int = 0) -> Placement:
    """``best`` or a neighbour predicted faster, after at most :data:`ROUNDS` rounds (``best`` is scored)."""
    unit = pred.spec.units[0]
    rows_each = 2 * sum(gr.shape[0] for gr in group_ranks(shape).values())
    cap = max(ROWS // max(rows_each, 1), 1)
    rng = np.random.default_rng(seed)
    bits = int(pred.spec.gpus_per_host.max())
    for _ in range(ROUNDS):
        H, Ix = _moves(best, free, shape, unit, bits, cap, rng)
        if not H.shape[0]:
            break
        cands = [Placement(H[j], Ix[j], label=best.label.split("+refined")[0] + "+refined") for j in range(H.shape[0])]
        score(pred, shape, cands)
        top = min(cands, key=lambda c: c.step_ms)
        if not top.step_ms < best.step_ms * (1 - 1e-9):
            break
        best = top
    return best
